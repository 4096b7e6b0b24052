"""The GPU check's report (``docs/gpu.md``), rendered from its record (``docs/gpu.json``) alone."""

from __future__ import annotations

import math
from pathlib import Path

from .common import BF16_TOL, FP32_TOL, FUSED_EXTRA, ROUTE_REASONS, SLOW_STEP, VOCAB, fmt
from .paper import paper_estimate
from .steps import STEP_TOL


def markdown(res: dict) -> str:
    """The whole report: each part's section, or its failure."""
    lines = header_markdown(res) + training_markdown(res) + steps_markdown(res) + bench_markdown(res)
    lines += routes_markdown(res) + long_markdown(res) + paper_markdown(res)
    if res.get("failures"):
        lines += ["", "## Failures", "", *[f"- {f}" for f in res["failures"]]]
    return "\n".join(lines) + "\n"


def header_markdown(res: dict) -> list[str]:
    env, a = res["environment"], res["settings"]
    where = env.get("gpu") or f"CPU ({env.get('cpu')}), a smoke test of the script, not a GPU check"
    lines = [
        "# The GPU check", "",
        f"`python -m posenc.gpu_check` on **{where}**"
        + (f" ({env['memory_gib']} GiB, compute capability {env['capability']}, CUDA {env['cuda']})" if env.get("gpu") else "")
        + f", torch {env['torch']}, Lightning {env['lightning']}, {env['date']}. Total {res['seconds']:.0f} s"
        + (f" (its estimate beforehand: {res['estimate']['total_s']:.0f} s)" if res.get("estimate") else "") + ".", "",
        "What it does and the tolerances: the docstring of `src/posenc/bench/gpu_check/__init__.py`. "
        f"Every scheme trains {a['steps']} steps of `model={a['model']}` at L = {a['seq_len']} "
        f"(batch {a['batch_size']}, byte-level Tiny Shakespeare, V = {VOCAB}, ln V = {math.log(VOCAB):.3f})"
        + (" in bf16-mixed on CUDA" if a["device"] == "cuda" else " on the CPU") + ".",
    ]  # fmt: skip
    return lines


def training_markdown(res: dict) -> list[str]:
    lines = [
        "", "## Training, numerics, evaluation", "",
        f"First block's output against float64 on the CPU (relative error; tolerance {BF16_TOL:g} in bf16 autocast, "
        f"{FP32_TOL:g} in float32). Perplexity by `posenc.evaluate` at L and 4L. "
        "Loss ok: the first loss within 10% of ln V, none NaN, the last below the first. Routes: those the run's "
        "training and validation took (`attention.route=auto`, its `run.json`).", "",
        "| scheme | route (training / validation) | train s | first loss | last loss | val loss | loss ok | bf16 err "
        "| fp32 err | numerics ok | ppl at L | ppl at 4L | eval s |",
        "|---|---|---:|---:|---:|---:|:-:|---:|---:|:-:|---:|---:|---:|",
    ]  # fmt: skip
    for r in res["schemes"]:
        if "error" in r:
            lines.append(f"| {r['scheme']} | failed: {r['error']} |" + " |" * 11)
            continue
        lines.append(
            f"| {r['scheme']} | {r.get('route') or '—'} / {r.get('eval_route') or '—'} | {r['train_s']:.1f} "
            f"| {r['first_loss']:.3f} | {r['last_loss']:.3f} | {r['val_loss']:.3f} "
            f"| {'yes' if r['loss_ok'] else '**no**'} | {r['bf16']:.1e} | {r['fp32']:.1e} "
            f"| {'yes' if r['numerics_ok'] else '**no**'} | {fmt(r['ppl_L'], '.2f')} | {fmt(r['ppl_4L'], '.2f')} "
            f"| {r['eval_s']:.1f} |")  # fmt: skip
    notes = [f"- {r['scheme']} at 4L: {r['eval_note']}" for r in res["schemes"] if r.get("eval_note")]
    return lines + (["", *notes] if notes else [])


def steps_markdown(res: dict) -> list[str]:
    """Part 2: one step on each route, the loss, the gradients, the graphs compiled."""
    s = res.get("steps")
    if not s:
        return []
    lines = ["", "## One training step on every route", ""]
    if "error" in s:
        return lines + [f"Failed: {s['error']}"]
    lines += [
        f"One training step of `model={s['model']}` ({s['tokens']} tokens; bf16 autocast on CUDA) at each length on "
        "each route that can train the scheme here, from the same weights and batch. Each route against the "
        f"float-mask route (`masked`, else the first): the loss (relative difference; {STEP_TOL['loss']:g} allowed) "
        f"and the largest relative difference of a parameter's gradient ({STEP_TOL['grad']:g} allowed); every "
        "parameter must get a finite gradient. Graphs: what torch.compile made during the step (FlexAttention's, "
        f"the rotation's); {s['graphs']} in this process by the end of the part.", "",
        "| scheme | T | route | loss | loss diff | worst gradient diff | no gradient | not finite | graphs | ok |",
        "|---|---:|---|---:|---:|---|---|---|---:|:-:|",
    ]  # fmt: skip
    for r in s["rows"]:
        if "loss" not in r:
            lines.append(f"| {r['scheme']} | {r.get('T', '—')} | {r.get('route', '—')} | failed: {r['error']} "
                         f"| | | | | {r.get('graphs', '—')} | **no** |")
            continue
        worst = f"{r['grad_diff']:.1e}" + (f" ({r['grad_diff_at']})" if r.get("grad_diff_at") else "")
        lines.append(f"| {r['scheme']} | {r['T']} | {r['route']} | {r['loss']:.4f} | {r['loss_diff']:.1e} | {worst} "
                     f"| {', '.join(r['missing']) or '—'} | {', '.join(r['nonfinite']) or '—'} | {r['graphs']} "
                     f"| {'yes' if r['ok'] else '**no**'} |")
    return lines


def bench_markdown(res: dict) -> list[str]:
    b = res.get("bench")
    lines = ["", "## Benchmark", ""]
    if not b:
        return lines + ["Not run."]
    if "error" in b:
        return lines + [f"Failed: {b['error']}"]
    routes = {r["scheme"]: r.get("route") for r in res["schemes"]}
    lines += [
        f"`python {b['command']}` ({b['seconds']:.0f} s): training step (forward, "
        "backward, AdamW) of the whole model, best of the rounds; ratios against `none` at the same T in the same "
        "run; FLOP share: the scheme's counted training FLOPs over none's; peak fraction: FLOP/s over the matmul "
        f"peak measured in the run ({b['peak_flops_per_s'] / 1e12:.3g} TFLOP/s). Route: the training route of "
        "part 1.", "",
        "| scheme | T | batch | tokens/s | step vs none | peak memory MiB | memory vs none | FLOP share "
        "| of peak | route |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in b["rows"]:
        mem = r.get("mem_train_bytes")
        lines.append(
            f"| {r['scheme']} | {r['T']} | {r['batch']} | {fmt(r['train_tok_s'], ',.0f')} "
            f"| {fmt(r.get('step_ratio'), '.2f')} | {fmt(mem and mem / 2**20, ',.0f')} "
            f"| {fmt(r.get('mem_ratio'), '.2f')} | {fmt(r.get('flop_share'), '.2f')} "
            f"| {fmt(r.get('train_peak_fraction'), '.1%')} | {routes.get(r['scheme']) or '—'} |")  # fmt: skip
    return lines + slow_markdown(b, routes) + compiled_markdown(res)


def slow_markdown(b: dict, routes: dict) -> list[str]:
    """The schemes whose step takes over ``SLOW_STEP`` times NoPE's, by route, and why."""
    slow = sorted({r["scheme"] for r in b["rows"] if (r.get("step_ratio") or 0) > SLOW_STEP})
    if not slow:
        return []
    lines = ["", f"Steps over {SLOW_STEP}x NoPE's (the worst T), grouped by the scheme's attention route in a "
             "training step on this device, and why:", ""]
    by_route: dict[str, list[str]] = {}
    for s in slow:
        worst = max((r for r in b["rows"] if r["scheme"] == s), key=lambda r: r["step_ratio"])
        share = worst.get("flop_share")
        extra = f" ({share:.2f}x the FLOPs)" if share and share > 1.05 else ""
        by_route.setdefault(routes.get(s) or "", []).append(f"{s} {worst['step_ratio']:.2f}x at T = {worst['T']}{extra}")
    for route, items in by_route.items():
        if route == "fused":
            why = ("no bias, the fused kernel; what they add runs outside it ("
                   + "; ".join(f"{k}: {v}" for k, v in FUSED_EXTRA.items() if any(i.startswith(k + " ") for i in items))
                   + "), and weighs at this size, where a step runs at a few percent of the matmul peak (not profiled)")
        else:
            why = ROUTE_REASONS.get(route, "route not recorded")
        lines.append(f"- **{route or '?'}** ({'; '.join(items)}): {why}.")
    return lines


def routes_markdown(res: dict) -> list[str]:
    """The schemes on the flex route against themselves on the float-mask route
    (``--attention-route masked``), each against ``none`` of its own run."""
    m, b = res.get("bench_masked"), res.get("bench")
    if not m:
        return []
    lines = ["", "## The flex route against the float-mask route", ""]
    if "error" in m or not b or "error" in b:
        return lines + [f"Failed: {m.get('error') or 'the benchmark on the flex route failed'}"]
    masked = {(r["scheme"], r["T"]): r for r in m["rows"]}
    lines += [
        f"The schemes whose training took the flex route, timed again on the float-mask routes in the same check: "
        f"`python {m['command']}` ({m['seconds']:.0f} s). Each ratio is against `none` of its own benchmark run.", "",
        "| scheme | T | step vs none, flex | step vs none, float mask | memory vs none, flex "
        "| memory vs none, float mask |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in b["rows"]:
        old = masked.get((r["scheme"], r["T"]))
        if old is None or r["scheme"] == "none":
            continue
        lines.append(f"| {r['scheme']} | {r['T']} | {fmt(r.get('step_ratio'), '.2f')} | {fmt(old.get('step_ratio'), '.2f')} "
                     f"| {fmt(r.get('mem_ratio'), '.2f')} | {fmt(old.get('mem_ratio'), '.2f')} |")  # fmt: skip
    return lines


def long_markdown(res: dict) -> list[str]:
    e = res.get("long")
    if not e:
        return []
    lines = ["", "## Long evaluation", ""]
    if "error" in e:
        return lines + [f"Failed: {e['error']}"]
    none = next((r for r in e["rows"] if r["scheme"] == "none" and r.get("peak_bytes")), None)
    lines += [
        f"A forward without gradients at {e['tokens']:,} tokens, batch 1, `model={e['model']}`, random weights "
        "(the second call, after any compilation), on the route `attention.route=auto` gives it. Memory: the peak "
        "above the model's weights.", "",
        "| scheme | route | seconds | peak memory MiB | memory vs none | logits finite |",
        "|---|---|---:|---:|---:|:-:|",
    ]
    for r in e["rows"]:
        if "error" in r:
            lines.append(f"| {r['scheme']} | | failed: {r['error']} | | | |")
            continue
        mem = r.get("peak_bytes")
        ratio = mem / none["peak_bytes"] if mem and none else None
        lines.append(f"| {r['scheme']} | {r.get('route') or '—'} | {r['seconds']:.2f} | {fmt(mem and mem / 2**20, ',.0f')} "
                     f"| {fmt(ratio, '.2f')} | {'yes' if r['finite'] else '**no**'} |")
    return lines


def paper_markdown(res: dict) -> list[str]:
    """Part 5 of the report: the paper profile's model timed, and what its study would take."""
    p = res.get("paper")
    if not p:
        return []
    lines = ["", "## The paper profile on this " + ("GPU" if res["environment"].get("gpu") else "device"), ""]
    if "error" in p:
        return lines + [f"Failed: {p['error']}"]
    e = paper_estimate(p, p["values"])
    lines += [
        f"`python {p['command']}` ({p['seconds']:.0f} s): a training step of the "
        f"model of `{p['params']}` at its lengths, vocabulary and tokens per step, best of the rounds.", "",
        "| scheme | T | batch | ms per step | step vs none |", "|---|---:|---:|---:|---:|",
        *[f"| {r['scheme']} | {r['T']} | {r['batch']} | {1000 * r['train_s_min']:.1f} | {fmt(r.get('step_ratio'), '.2f')} |"
          for r in p["rows"]],
        "", f"What the study of `{p['params']}` would take in training steps here (`paper_estimate`: each run's "
        "steps times the step above, scaled by its tokens per step; retrieval runs at their cap, an upper bound; "
        "evaluation, validation and the retrieval grids not counted): "
        + ", ".join(f"{t} {h:.1f} h" for t, h in e["hours"].items())
        + f", in all **{e['total_h']:.1f} GPU-hours**; the longest run {e['longest_h']:.2f} h. "
        f"As `dvc repro` runs it with one job per GPU (`POSENC_EXECUTOR=gpus`, or `slurm`): one scheme's stage at "
        f"a time, its {e['runs_per_stage']} runs spread over the GPUs: "
        + ", ".join(f"{n} GPU{'s' if int(n) > 1 else ''} {h:.1f} h" for n, h in e["wall_h"].items())
        + " (past the runs of a stage, more GPUs wait). With every stage's runs at once "
        f"(`python -m pipelines.fanout {Path(p['params']).parent.name} --executor gpus`, or `slurm`): "
        + ", ".join(f"{n} GPU{'s' if int(n) > 1 else ''} {h:.1f} h" for n, h in e["fanout_h"].items())
        + " (no shorter than the longest run).",
    ]  # fmt: skip
    if e["missing"]:
        lines.append(f"Not timed: {', '.join(e['missing'])}.")
    return lines


def compiled_markdown(res: dict) -> list[str]:
    """NoPE compiled against eager, at the benchmark's settings (part 2)."""
    c, b = res.get("compiled"), res.get("bench")
    if not c or not b or "error" in b:
        return []
    if "error" in c:
        return ["", f"NoPE compiled: failed: {c['error']}"]
    eager = {r["T"]: r for r in b["rows"] if r["scheme"] == "none"}
    lines = ["", f"NoPE compiled (`python {c['command']}`, {c['seconds']:.0f} s with the compilation) against eager, "
             "each against the matmul peak measured in its own run:", "",
             "| T | eager ms | compiled ms | compiled / eager | eager of peak | compiled of peak |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in c["rows"]:
        e = eager.get(r["T"])
        if e is None:
            continue
        lines.append(f"| {r['T']} | {1000 * e['train_s_min']:.1f} | {1000 * r['train_s_min']:.1f} "
                     f"| {r['train_s_min'] / e['train_s_min']:.2f} | {fmt(e.get('train_peak_fraction'), '.1%')} "
                     f"| {fmt(r.get('train_peak_fraction'), '.1%')} |")
    return lines
