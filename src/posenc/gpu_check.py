"""The GPU check: what posenc does on a CUDA GPU, measured in one run of a few minutes.

    python -m posenc.gpu_check                 # writes docs/gpu.md and docs/gpu.json

It needs a CUDA GPU, the corpora (``POSENC_DATA_DIR``, Tiny Shakespeare) and nothing else of the
project's services: no MLflow (``~logger``), no DVC. Five parts, each recorded even where
another fails (a failure is written into the report with its error, and the exit status is 1):

1. **Training.** Every scheme (``conf/encoding``) trains ``--steps`` (50) steps of ``model=small``
   (d 256, 4 layers of 4 heads) at L = ``--seq-len`` (512) on byte-level Tiny Shakespeare
   (V = 260), causal LM, with ``trainer=gpu`` (bf16-mixed autocast). Checked: the first training
   loss is within 10% of ln V (at initialisation the output layer's weights have std 0.02, so
   the logits are near zero and the prediction near uniform: its cross-entropy is ln V), no
   loss is NaN, and the last is below the first.
2. **Numerics.** The trained run's weights, their first transformer block's output on one
   batch of L tokens: on the GPU under bf16 autocast and in float32, each against the same
   model in float64 on the CPU (the reference: the same code at double precision). Reported as
   the relative error ||y - y_ref|| / ||y_ref||; tolerances ``BF16_TOL`` (bf16 keeps 8 bits of
   mantissa: unit roundoff 2^-8 = 3.9e-3, and a layer rounds its inputs and products several
   times) and ``FP32_TOL`` (float32 agrees to about 1e-6 here; TF32 matmuls, with 10 bits of
   mantissa, would give some 1e-3 and fail it).
3. **Evaluation.** The run's checkpoint scored by ``posenc.evaluate`` (float32) at L and 4L on
   the GPU (non-overlapping windows).
4. **Benchmark.** ``python -m posenc.bench`` on the GPU at T = 1024 and 4096 (``model=small``,
   4096 tokens per batch, bf16 autocast): each scheme's training-step time and peak memory
   against NoPE (``none``) and its FLOP share (its counted FLOPs over NoPE's). A scheme whose
   step takes over 1.3x NoPE's is named with its attention route, the reason it is slower
   (``route_reason``). The schemes whose training took the ``flex`` route (FlexAttention) are
   timed again, with ``none``, on the float-mask route (``POSENC_FLEX_DEVICES=``): the route
   before and after, side by side in one check.

5. **The paper profile's model.** ``posenc.bench`` with the model, vocabulary, lengths and tokens
   per step of ``profiles/paper/params.yaml`` (``model=base``, V = 16384, L = 512, masked LM at
   128), and from its step times what that study's training would take on this GPU, and on N
   of them with one job per GPU (``paper_estimate``). Then NoPE again, compiled (``--compile``,
   as ``compile=true`` trains): its step and its share of the matmul peak against eager's.

6. **Long evaluation.** Every scheme's forward without gradients (bf16 autocast on CUDA) at
   ``--long-tokens`` tokens (16,384: the paper profile's longest evaluation, 32L at L = 512),
   batch 1, with the paper profile's model (``model=base``) and random weights: whether it
   fits on the card, its seconds (a second call, after any compilation) and its peak memory
   against ``none``'s.

``--device cpu`` runs the same code on the CPU with a small model (``--model``, ``--steps``): a
smoke test of the script (tests/test_gpu_check.py), not a GPU check; its report says so.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import lightning as L
import torch

from .files import project_root, write_json, write_text

#: relative error of the first block's output allowed against float64 on the CPU
BF16_TOL = 2e-2
FP32_TOL = 1e-4
#: a step over this many times NoPE's is explained in the report
SLOW_STEP = 1.3
#: byte-level Tiny Shakespeare: 256 bytes and 4 special tokens
VOCAB = 260

ROUTE_REASONS = {
    "masked": "a T x T float bias per head (per sequence too, where it reads the content) is built and passed to "
    "scaled_dot_product_attention as its mask; PyTorch's FlashAttention kernel takes no mask, so the step runs on "
    "the memory-efficient kernel, which reads the mask at every logit, and a trainable bias adds the backward "
    "of its T x T gradient",
    "probabilities": "a value term (relative values) needs the attention probabilities themselves: "
    "the (B, H, T, T) matrix is materialised, no fused kernel applies",
    "recomputed": "the bias is rebuilt block by block in the backward (CPU route)",
    "flex": "FlexAttention, compiled: the relative bias read inside the kernel (score_mod), an exactly low-rank "
    "absolute part appended to q and k, causality a block mask; what it still costs over the fused kernel is "
    "FlexAttention's own (compare the float-mask route below)",
}
#: a scheme on the fused route that is still slower: what it adds outside the kernel (not profiled)
FUSED_EXTRA = {
    "rope": "the rotation of q and k, elementwise kernels outside the attention kernel",
    "xpos": "the rotation and scaling of q and k, elementwise kernels outside the attention kernel",
}


class RecordLosses(L.Callback):
    """A Lightning callback (``callbacks.<name>._target_``) that keeps every training loss of the run."""

    losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        RecordLosses.losses.append(float(loss.detach().float().cpu()))


def overrides(scheme: str, a: argparse.Namespace, work: Path) -> list[str]:
    """The Hydra overrides of one scheme's run in the check."""
    return [
        f"encoding={scheme}", f"model={a.model}", f"trainer={'gpu' if a.device == 'cuda' else 'cpu'}",
        "data=tinyshakespeare", f"data.vocab_size={VOCAB}", f"data.seq_len={a.seq_len}", f"data.batch_size={a.batch_size}",
        f"model.max_len={max(4 * a.seq_len, 2048)}", f"trainer.max_steps={a.steps}",
        f"trainer.val_check_interval={a.steps}", f"optim.warmup_steps={max(1, a.steps // 5)}", "trainer.limit_val_batches=4", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "trainer.log_every_n_steps=10", "~logger", "log_checkpoint=false",
        f"paths.output_dir={work / 'outputs'}", *([f"paths.cache_dir={a.cache_dir}"] if a.cache_dir else []),
        "+callbacks.losses._target_=posenc.gpu_check.RecordLosses",
    ]  # fmt: skip


def first_block_errors(model: torch.nn.Module, idx: torch.Tensor, device: str) -> dict[str, float]:
    """Relative error of the first block's output (bf16 autocast, float32) against float64 on the CPU."""
    captured: list[torch.Tensor] = []

    def run(m: torch.nn.Module, x: torch.Tensor, autocast: bool) -> torch.Tensor:
        captured.clear()
        hook = m.blocks[0].register_forward_hook(lambda mod, args, out: captured.append(out.detach()))
        try:
            with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
                m(x)
        finally:
            hook.remove()
        return captured[0].double().cpu()

    ref_model = copy.deepcopy(model).double().cpu().eval()
    ref = run(ref_model, idx.cpu(), False)
    model = model.float().to(device).eval()
    out = {}
    for name, autocast in (("bf16", True), ("fp32", False)):
        y = run(model, idx.to(device), autocast)
        out[name] = float((y - ref).norm() / ref.norm())
    return out


def check_scheme(scheme: str, a: argparse.Namespace, work: Path) -> dict:
    """Train, compare and evaluate one scheme (parts 1-3)."""
    from . import evaluate as ev
    from .config import compose
    from .runs import RunFolder, load_state, module_from_state
    from .train import train

    # the class the run's config names (under ``python -m`` this module is also ``__main__``)
    from posenc.gpu_check import RecordLosses as recorder

    row: dict = {"scheme": scheme}
    run_dir = work / "runs" / scheme
    recorder.losses = []
    t = time.perf_counter()
    cfg = compose(overrides(scheme, a, work))
    metrics = train(cfg, out_dir=run_dir)
    if a.device == "cuda":
        torch.cuda.synchronize()
    row["train_s"] = round(time.perf_counter() - t, 2)
    losses, ln_v = recorder.losses, math.log(VOCAB)
    row.update(steps=len(losses), first_loss=losses[0], last_loss=losses[-1], ln_v=ln_v,
               val_loss=float(metrics["val/loss"]))  # fmt: skip
    row["loss_ok"] = (abs(losses[0] - ln_v) <= 0.1 * ln_v
                      and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0])  # fmt: skip

    ckpt = RunFolder(run_dir).last
    module = module_from_state(load_state(ckpt), ckpt, "cpu")
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (2, a.seq_len), generator=g)
    with torch.enable_grad():  # the route of a training step on the run's device
        row["route"] = module.model.train().blocks[0].attn.route(
            torch.zeros(1, a.seq_len, 1, device=a.device), torch.arange(a.seq_len, device=a.device))
    row.update(first_block_errors(module.model, idx, a.device))
    row["numerics_ok"] = row["bf16"] <= BF16_TOL and row["fp32"] <= FP32_TOL

    t = time.perf_counter()
    rows, _ = ev.evaluate_checkpoint(run_dir, ev.Settings(
        lengths=[a.seq_len, 4 * a.seq_len], methods=("nonoverlapping",), max_tokens=8 * 4 * a.seq_len, device=a.device,
        log_mlflow=False, progress=False, cache_dir=a.cache_dir))  # fmt: skip
    row["eval_s"] = round(time.perf_counter() - t, 2)
    row["ppl_L"] = rows[0]["ppl"]
    row["ppl_4L"] = rows[1]["ppl"]
    row["eval_note"] = rows[1].get("note") or ""
    return row


def run_bench(a: argparse.Namespace, work: Path, timeout: float | None, name: str = "bench", model: str | None = None,
              lengths: list[int] | None = None, extra: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """Parts 4 and 5: ``posenc.bench`` in its own process (with ``env`` added to this
    process's environment), its summary read back."""
    out = work / name
    cmd = [sys.executable, "-m", "posenc.bench", "--device", a.device, "--no-xtransformers", "--no-progress",
           "--out-dir", str(out), "--repeats", str(a.bench_repeats), "--model", model or a.model, "--lengths",
           *map(str, lengths or a.bench_lengths), *extra]  # fmt: skip
    if a.device == "cpu":
        cmd += ["--tiny", "--max-memory-gb", "0"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else os.environ | env)
    if proc.returncode != 0:
        raise RuntimeError(f"posenc.bench exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    res = json.loads((out / "bench.json").read_text())
    keep = ("scheme", "class", "T", "batch", "train_s_min", "train_tok_s", "step_ratio", "mem_train_bytes",
            "mem_ratio", "flop_share", "train_peak_fraction")  # fmt: skip
    rows = [{k: r.get(k) for k in keep} for r in res["summary"] if r["impl"] == "posenc"]
    return {"seconds": round(time.perf_counter() - t, 1), "rows": rows,
            "command": " ".join(cmd[1:]).replace(str(work), "<tmp>"),  # no path of this machine in the record
            "peak_flops_per_s": res["peak"]["flops_per_s"], "model": res["meta"].get("model")}


def long_evaluation(a: argparse.Namespace, schemes: list[str], model: str, tokens: int) -> dict:
    """Part 6: each scheme's forward at ``tokens`` tokens, batch 1, no gradients, random weights."""
    from .bench.config import compose_configs
    from .bench.models import autocast, build_posenc, sync

    cuda = a.device == "cuda"
    model_cfg, encodings = compose_configs(model, schemes, tokens, tiny=not cuda)
    rows = []
    for scheme in schemes:
        row: dict = {"scheme": scheme, "tokens": tokens}
        net = None
        try:
            net = build_posenc(scheme, encodings[scheme], model_cfg, VOCAB).to(a.device).eval()
            idx = torch.randint(0, VOCAB, (1, tokens), device=a.device)
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated() if cuda else 0
            for _ in range(2):  # the second call is timed: the first may compile
                t = time.perf_counter()
                with torch.no_grad(), autocast(a.device):
                    logits = net(idx)
                sync(a.device)
            row["seconds"] = round(time.perf_counter() - t, 3)
            row["peak_bytes"] = torch.cuda.max_memory_allocated() - before if cuda else None
            row["finite"] = bool(torch.isfinite(logits.float()).all())
        except Exception as e:  # noqa: BLE001 -- out of memory is a result; the other schemes go on
            row["error"] = failure(e)
        finally:
            del net
            if cuda:
                torch.cuda.empty_cache()
        rows.append(row)
    return {"model": model, "tokens": tokens, "rows": rows}


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
        "(the second call, after any compilation). Memory: the peak above the model's weights.", "",
        "| scheme | seconds | peak memory MiB | memory vs none | logits finite |",
        "|---|---:|---:|---:|:-:|",
    ]
    for r in e["rows"]:
        if "error" in r:
            lines.append(f"| {r['scheme']} | failed: {r['error']} | | | |")
            continue
        mem = r.get("peak_bytes")
        ratio = mem / none["peak_bytes"] if mem and none else None
        lines.append(f"| {r['scheme']} | {r['seconds']:.2f} | {_fmt(mem and mem / 2**20, ',.0f')} | {_fmt(ratio, '.2f')} "
                     f"| {'yes' if r['finite'] else '**no**'} |")
    return lines


#: the study the estimate is of
PAPER_PARAMS = project_root() / "profiles" / "paper" / "params.yaml"


def study_tasks(params: dict) -> dict:
    """The ``tasks:`` entries of a study's params, also from the params a run recorded before
    tasks had one shape (``lm``, ``mlm``, ``retrieval`` keys of their own, top-level ``seeds``)."""
    if "tasks" in params:
        return params["tasks"]
    lm, mlm, ret = params["lm"], params["mlm"], params["retrieval"]
    return {"lm": {"seeds": params["seeds"], "steps": lm["steps"], "seq_len": lm["train_len"], "batch_size": lm["batch_size"]},
            "mlm": {"seeds": mlm.get("seeds", params["seeds"]), "steps": mlm["steps"], "seq_len": mlm["seq_len"],
                    "batch_size": mlm["batch_size"]},
            "retrieval": {"seeds": ret["seeds"], "steps": ret["cap"], "seq_len": lm["train_len"],
                          "batch_size": ret["batch_size"]}}  # fmt: skip


def paper_jobs(params: dict) -> list[dict]:
    """Every training run of a study's params.yaml: scheme, task, seeds, steps, length and batch (tokens a step).
    Retrieval runs count at their cap (they stop earlier, at the criterion)."""
    kinds = {
        name: (len(str(t["seeds"]).split()), t["steps"], t["seq_len"], t["batch_size"])
        for name, t in study_tasks(params).items()
    }  # fmt: skip
    return [{"scheme": scheme, "task": task, "runs": kinds[task][0], "steps": kinds[task][1], "T": kinds[task][2],
             "batch": kinds[task][3]}
            for scheme, item in params["schemes"].items() for task in item["tasks"].split()]  # fmt: skip


def makespan(durations: list[float], n: int) -> float:
    """Seconds until the last of ``durations`` ends with ``n`` workers, each job to the first free
    worker, the longest first (as a stage's pool takes its jobs when a device frees)."""
    free = [0.0] * min(n, len(durations) or 1)
    for d in sorted(durations, reverse=True):
        free[free.index(min(free))] += d
    return max(free)


def paper_estimate(bench: dict, params: dict, gpus: tuple[int, ...] = (1, 8, 9, 32)) -> dict:
    """GPU-hours of the study's training steps from the measured step times: a run's step at the
    benchmark's T, scaled by the run's tokens per step over the benchmark's (the step's cost is
    close to linear in the batch at a fixed T; evaluation, validation and the retrieval grids are
    not counted). Per task and in all, and the wall time on N GPUs as ``dvc repro`` runs the
    study (``wall_h``): one scheme's stage at a time, its runs (a run per seed and task) spread
    over the GPUs, one per GPU, so a stage lasts at least its longest run and uses at most as
    many GPUs as it has runs; and as the fan-out runs it (``fanout_h``, ``pipelines.fanout``):
    every run of every stage on the GPUs at once, the longest first, so the study lasts at
    least its longest run."""
    step = {(r["scheme"], r["T"]): (r["train_s_min"], r["batch"]) for r in bench["rows"]}
    hours: dict[str, float] = {}
    stages: dict[str, list[float]] = {}
    missing = []
    for j in paper_jobs(params):
        if (j["scheme"], j["T"]) not in step:
            missing.append(f"{j['scheme']} at T = {j['T']}")
            continue
        s, b = step[j["scheme"], j["T"]]
        run_s = j["steps"] * s * j["batch"] / b
        hours[j["task"]] = hours.get(j["task"], 0.0) + j["runs"] * run_s / 3600
        stages.setdefault(j["scheme"], []).extend([run_s] * j["runs"])
    runs = max((len(d) for d in stages.values()), default=0)
    return {"hours": hours, "total_h": sum(hours.values()), "missing": missing, "runs_per_stage": runs,
            "longest_h": max((max(d) for d in stages.values()), default=0.0) / 3600,
            "wall_h": {n: sum(makespan(d, n) for d in stages.values()) / 3600 for n in gpus},
            "fanout_h": {n: makespan([x for d in stages.values() for x in d], n) / 3600 for n in gpus}}


def recorded_path(path: str | None) -> str | None:
    """A path as the report records it: relative to the project when inside it, else its name alone."""
    if path is None:
        return None
    p = Path(path).expanduser().absolute()
    try:
        return p.relative_to(project_root()).as_posix()
    except ValueError:
        return p.name


def environment(device: str) -> dict:
    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
           "torch": torch.__version__, "lightning": L.__version__, "device": device}  # fmt: skip
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, memory_gib=round(p.total_memory / 2**30, 1),
                   capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)  # fmt: skip
    else:
        from .machine import machine

        env["cpu"] = machine().get("cpu", platform.processor())
    return env


def failure(e: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters of its message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def _fmt(x, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(res: dict) -> str:
    env, a = res["environment"], res["settings"]
    where = env.get("gpu") or f"CPU ({env.get('cpu')}), a smoke test of the script, not a GPU check"
    lines = [
        "# The GPU check", "",
        f"`python -m posenc.gpu_check` on **{where}**"
        + (f" ({env['memory_gib']} GiB, compute capability {env['capability']}, CUDA {env['cuda']})" if env.get("gpu") else "")
        + f", torch {env['torch']}, Lightning {env['lightning']}, {env['date']}. Total {res['seconds']:.0f} s.", "",
        "What it does and the tolerances: the docstring of `src/posenc/gpu_check.py`. "
        f"Every scheme trains {a['steps']} steps of `model={a['model']}` at L = {a['seq_len']} "
        f"(batch {a['batch_size']}, byte-level Tiny Shakespeare, V = {VOCAB}, ln V = {math.log(VOCAB):.3f})"
        + (" in bf16-mixed on CUDA" if a["device"] == "cuda" else " on the CPU") + ".", "",
        "## Training, numerics, evaluation", "",
        f"First block's output against float64 on the CPU (relative error; tolerance {BF16_TOL:g} in bf16 autocast, "
        f"{FP32_TOL:g} in float32). Perplexity by `posenc.evaluate` at L and 4L. "
        "Loss ok: the first loss within 10% of ln V, none NaN, the last below the first.", "",
        "| scheme | train s | first loss | last loss | val loss | loss ok | bf16 err | fp32 err | numerics ok "
        "| ppl at L | ppl at 4L | eval s |",
        "|---|---:|---:|---:|---:|:-:|---:|---:|:-:|---:|---:|---:|",
    ]  # fmt: skip
    for r in res["schemes"]:
        if "error" in r:
            lines.append(f"| {r['scheme']} | failed: {r['error']} |" + " |" * 10)
            continue
        lines.append(
            f"| {r['scheme']} | {r['train_s']:.1f} | {r['first_loss']:.3f} | {r['last_loss']:.3f} | {r['val_loss']:.3f} "
            f"| {'yes' if r['loss_ok'] else '**no**'} | {r['bf16']:.1e} | {r['fp32']:.1e} "
            f"| {'yes' if r['numerics_ok'] else '**no**'} | {_fmt(r['ppl_L'], '.2f')} | {_fmt(r['ppl_4L'], '.2f')} "
            f"| {r['eval_s']:.1f} |")  # fmt: skip
    notes = [f"- {r['scheme']} at 4L: {r['eval_note']}" for r in res["schemes"] if r.get("eval_note")]
    if notes:
        lines += ["", *notes]
    b = res.get("bench")
    lines += ["", "## Benchmark", ""]
    if not b:
        lines.append("Not run.")
    elif "error" in b:
        lines.append(f"Failed: {b['error']}")
    else:
        routes = {r["scheme"]: r.get("route") for r in res["schemes"]}
        lines += [
            f"`python {b['command']}` ({b['seconds']:.0f} s): training step (forward, "
            "backward, AdamW) of the whole model, best of the rounds; ratios against `none` at the same T in the same "
            "run; FLOP share: the scheme's counted training FLOPs over none's; peak fraction: FLOP/s over the matmul "
            f"peak measured in the run ({b['peak_flops_per_s'] / 1e12:.3g} TFLOP/s).", "",
            "| scheme | T | batch | tokens/s | step vs none | peak memory MiB | memory vs none | FLOP share "
            "| of peak | route |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]  # fmt: skip
        for r in b["rows"]:
            mem = r.get("mem_train_bytes")
            lines.append(
                f"| {r['scheme']} | {r['T']} | {r['batch']} | {_fmt(r['train_tok_s'], ',.0f')} "
                f"| {_fmt(r.get('step_ratio'), '.2f')} | {_fmt(mem and mem / 2**20, ',.0f')} "
                f"| {_fmt(r.get('mem_ratio'), '.2f')} | {_fmt(r.get('flop_share'), '.2f')} "
                f"| {_fmt(r.get('train_peak_fraction'), '.1%')} | {routes.get(r['scheme']) or '—'} |")  # fmt: skip
        slow = sorted({r["scheme"] for r in b["rows"] if (r.get("step_ratio") or 0) > SLOW_STEP})
        if slow:
            lines += ["", f"Steps over {SLOW_STEP}x NoPE's (the worst T), grouped by the scheme's attention route in a "
                      "training step on this device (`Attention.route`), and why:", ""]
            by_route: dict[str, list[str]] = {}
            for s in slow:
                worst = max((r for r in b["rows"] if r["scheme"] == s), key=lambda r: r["step_ratio"])
                share = worst.get("flop_share")
                extra = f" ({share:.2f}x the FLOPs)" if share and share > 1.05 else ""
                by_route.setdefault(routes.get(s) or "", []).append(
                    f"{s} {worst['step_ratio']:.2f}x at T = {worst['T']}{extra}")
            for route, items in by_route.items():
                if route == "fused":
                    why = ("no bias, the fused kernel; what they add runs outside it ("
                           + "; ".join(f"{k}: {v}" for k, v in FUSED_EXTRA.items() if any(i.startswith(k + " ") for i in items))
                           + "), and weighs at this size, where a step runs at a few percent of the matmul peak (not profiled)")
                else:
                    why = ROUTE_REASONS.get(route, "route not recorded")
                lines.append(f"- **{route or '?'}** ({'; '.join(items)}): {why}.")
    lines += routes_markdown(res)
    lines += long_markdown(res)
    lines += paper_markdown(res)
    if res.get("failures"):
        lines += ["", "## Failures", "", *[f"- {f}" for f in res["failures"]]]
    return "\n".join(lines) + "\n"


def routes_markdown(res: dict) -> list[str]:
    """The schemes on the flex route against themselves on the float-mask route
    (``POSENC_FLEX_DEVICES=``), each against ``none`` of its own run."""
    m, b = res.get("bench_masked"), res.get("bench")
    if not m:
        return []
    lines = ["", "## The flex route against the float-mask route", ""]
    if "error" in m or not b or "error" in b:
        return lines + [f"Failed: {m.get('error') or 'the benchmark on the flex route failed'}"]
    masked = {(r["scheme"], r["T"]): r for r in m["rows"]}
    lines += [
        f"The schemes whose training took the flex route, timed again with `POSENC_FLEX_DEVICES=` (the float-mask "
        f"routes) in the same check: `python {m['command']}` ({m['seconds']:.0f} s). Each ratio is against `none` of "
        "its own benchmark run.", "",
        "| scheme | T | step vs none, flex | step vs none, float mask | memory vs none, flex "
        "| memory vs none, float mask |",
        "|---|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in b["rows"]:
        old = masked.get((r["scheme"], r["T"]))
        if old is None or r["scheme"] == "none":
            continue
        lines.append(f"| {r['scheme']} | {r['T']} | {_fmt(r.get('step_ratio'), '.2f')} | {_fmt(old.get('step_ratio'), '.2f')} "
                     f"| {_fmt(r.get('mem_ratio'), '.2f')} | {_fmt(old.get('mem_ratio'), '.2f')} |")  # fmt: skip
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
        *[f"| {r['scheme']} | {r['T']} | {r['batch']} | {1000 * r['train_s_min']:.1f} | {_fmt(r.get('step_ratio'), '.2f')} |"
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
    return lines + compiled_markdown(res)


def compiled_markdown(res: dict) -> list[str]:
    """NoPE at the paper profile's settings compiled against eager (part 5)."""
    c, p = res.get("compiled"), res.get("paper")
    if not c or not p or "error" in p:
        return []
    if "error" in c:
        return ["", f"Compiled: failed: {c['error']}"]
    eager = {r["T"]: r for r in p["rows"] if r["scheme"] == "none"}
    lines = ["", f"NoPE compiled (`python {c['command']}`, {c['seconds']:.0f} s with the compilation) against eager, "
             "each against the matmul peak measured in its own run:", "",
             "| T | eager ms | compiled ms | compiled / eager | eager of peak | compiled of peak |",
             "|---:|---:|---:|---:|---:|---:|"]
    for r in c["rows"]:
        e = eager.get(r["T"])
        if e is None:
            continue
        lines.append(f"| {r['T']} | {1000 * e['train_s_min']:.1f} | {1000 * r['train_s_min']:.1f} "
                     f"| {r['train_s_min'] / e['train_s_min']:.2f} | {_fmt(e.get('train_peak_fraction'), '.1%')} "
                     f"| {_fmt(r.get('train_peak_fraction'), '.1%')} |")
    return lines


def paper_bench_settings(a: argparse.Namespace) -> tuple[dict, dict]:
    """The paper profile's params, and ``run_bench``'s model, lengths and extra arguments for its
    model at its lengths, vocabulary and tokens per step (on the CPU smoke test: the small
    model, without memory probes)."""
    import yaml

    params = yaml.safe_load(PAPER_PARAMS.read_text())
    lengths = sorted({j["T"] for j in paper_jobs(params)})
    if a.device != "cuda":
        return params, {"model": None, "lengths": lengths, "extra": ("--no-memory",)}
    lm = study_tasks(params)["lm"]
    extra = ("--vocab-size", str(params["vocab_size"]), "--no-memory",
             "--tokens-per-batch", str(lm["seq_len"] * lm["batch_size"]))
    return params, {"model": params["model"], "lengths": lengths, "extra": extra}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m posenc.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (the check); cpu: a smoke test of the script with a small model")
    p.add_argument("--schemes", nargs="+", help="default: every conf/encoding/*.yaml")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="small")
    p.add_argument("--bench-lengths", type=int, nargs="*", default=[1024, 4096], help="none: no benchmark")
    p.add_argument("--bench-repeats", type=int, default=3)
    p.add_argument("--long-tokens", type=int, default=16384,
                   help="part 6, the long evaluation: tokens of one forward (0: skip; --device cpu: a tiny model)")
    p.add_argument("--long-model", default="base", help="part 6's conf/model (default base, the paper profile's)")
    p.add_argument("--budget-s", type=float, help="seconds the whole check may take: schemes not started by then "
                   "are reported as not run, and the benchmark gets what is left (default: no limit)")
    p.add_argument("--cache-dir", help="prepared corpora (paths.cache_dir; default: the project's)")
    p.add_argument("--out", default=str(project_root() / "docs" / "gpu.md"), help="the report (a .json twin beside it)")
    p.add_argument("--no-paper-bench", dest="paper_bench", action="store_false",
                   help="skip part 5: the paper profile's model timed at its lengths, and its study's GPU-hours")
    p.add_argument("--from-json", metavar="GPU_JSON", help="only write the report again from a gpu.json")
    a = p.parse_args(argv)
    if a.from_json:
        return a
    if a.steps < 2 or a.seq_len < 2 or a.batch_size < 1:
        p.error("--steps and --seq-len must be at least 2, --batch-size at least 1")
    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA GPU is visible to torch here: the GPU check needs one (--device cpu runs the smoke test)")
    if not os.environ.get("POSENC_DATA_DIR"):
        p.error("set POSENC_DATA_DIR to the folder that holds tinyshakespeare/input.txt")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.from_json:
        write_text(a.out, markdown(json.loads(Path(a.from_json).read_text())))
        print(f"wrote {a.out}")
        return 0
    from .bench.config import discover_schemes

    schemes = a.schemes or discover_schemes()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="posenc-gpu-check-"))
    paths = {k: recorded_path(getattr(a, k)) for k in ("cache_dir", "out")}  # no path of this machine
    res: dict = {"environment": environment(a.device), "settings": vars(a) | paths | {"schemes": schemes},
                 "schemes": [], "failures": []}  # fmt: skip
    out = Path(a.out)

    def save() -> None:  # after every part: a check stopped from outside keeps what it measured
        res["seconds"] = round(time.perf_counter() - started, 1)
        write_text(out, markdown(res))
        write_json(out.with_suffix(".json"), res, indent=1, default=str)

    def left() -> float | None:
        return None if a.budget_s is None else a.budget_s - (time.perf_counter() - started)

    for i, scheme in enumerate(schemes, 1):
        if left() is not None and left() <= 0:
            row = {"scheme": scheme, "error": f"not run: the check's budget of {a.budget_s:g} s was spent"}
            res["failures"].append(f"{scheme}: {row['error']}")
            res["schemes"].append(row)
            continue
        try:
            row = check_scheme(scheme, a, work)
            bad = [k for k in ("loss_ok", "numerics_ok") if not row[k]]
            if bad:
                res["failures"].append(f"{scheme}: {' and '.join(bad)} false")
        except Exception as e:  # noqa: BLE001 -- recorded, the other schemes go on
            row = {"scheme": scheme, "error": failure(e)}
            res["failures"].append(f"{scheme}: {row['error']}")
            traceback.print_exc()
        res["schemes"].append(row)
        save()
        print(f"[{i}/{len(schemes)}] {scheme}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                           for k, v in row.items() if k != "scheme"), flush=True)
    def part(key: str, label: str, measure: Callable[[], dict]) -> bool:
        """res[key] = measure(), or its error, recorded as a failure (the other parts go on); saved."""
        try:
            res[key] = measure()
        except Exception as e:  # noqa: BLE001 -- recorded, the other parts go on
            res[key] = {"error": failure(e, 1500)}
            res["failures"].append(f"{label}: {res[key]['error']}")
        save()
        return "error" not in res[key]

    if a.bench_lengths:
        part("bench", "benchmark", lambda: run_bench(a, work, left()))
    flex = [r["scheme"] for r in res["schemes"] if r.get("route") == "flex"]
    if a.bench_lengths and flex:  # the same schemes on the float-mask route: before and after, in one run
        part("bench_masked", "benchmark on the float-mask route", lambda: run_bench(
            a, work, left(), "bench-masked", extra=("--schemes", "none", *flex), env={"POSENC_FLEX_DEVICES": ""}))
    if a.long_tokens and part("long", "long evaluation", lambda: long_evaluation(a, schemes, a.long_model, a.long_tokens)):
        res["failures"] += [f"{r['scheme']} at {a.long_tokens} tokens: {r['error']}"
                            for r in res["long"]["rows"] if "error" in r]
    if a.paper_bench:
        paper: dict = {}  # the paper profile's bench settings, for its run and the compiled one

        def paper_bench() -> dict:
            params, settings = paper_bench_settings(a)
            paper.update(settings)
            return run_bench(a, work, left(), "paper", **settings) | {
                "params": str(PAPER_PARAMS.relative_to(project_root())), "values": params}

        if part("paper", "paper profile's model", paper_bench):
            part("compiled", "paper profile's model, compiled", lambda: run_bench(
                a, work, left(), "paper-compiled", paper["model"], paper["lengths"],
                (*paper["extra"], "--schemes", "none", "--compile")))
    save()
    print(f"wrote {out} and {out.with_suffix('.json')} in {res['seconds']:.0f} s; "
          f"{len(res['failures'])} failure(s)" + "".join(f"\n  {f}" for f in res["failures"]))
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
