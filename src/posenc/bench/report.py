"""Summary rows (times, ratios to ``none`` and to x-transformers, memory, FLOP/s),
the issue's targets, the Markdown tables and the environment of a run.

T^2 growth. "T² floats/pair" is, at the longest probed length, the memory a
scheme needs beyond ``none`` (which attends with the flash kernel and keeps no
T x T tensor) per layer, sequence and query-key pair, in fp32 values:
(mem - mem_none) / (4 bytes * n_layers * B * T^2). Each (B, H, T, T) tensor
alive at the peak adds about H; a (B, T, T, D) tensor would add about D. The
target "no memory growing like T^2 * D" is read as a value at most D/4.
(A (1, H, T, T) bias shared by the batch adds H / B; at the longest length B
is usually 1.)
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .. import native
from .config import (
    CHEAP_BIASES,
    POSENC,
    TARGET_FLOP_EFFICIENCY,
    TARGET_LENGTH,
    TARGET_MEM,
    TARGET_STEP_CHEAP,
    VALUE_TERM,
    XT,
    BenchSettings,
)
from ..machine import cpu_name
from .flops import palm_flops_per_token
from .xtransformers import XT_SHARED


def environment(s: BenchSettings, xt_version: str | None) -> dict[str, Any]:
    dev = torch.cuda.get_device_name() if s.device == "cuda" else cpu_name()
    return {
        "settings": asdict(s),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "x_transformers": xt_version,
        "device": s.device,
        "device_name": dev,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "dtype": "bf16 autocast" if s.device == "cuda" else "fp32",
        "fire_block": native.describe() if "fire" in s.schemes and s.device == "cpu" else None,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "command": " ".join([Path(sys.executable).name, "-m", "posenc.bench", *sys.argv[1:]]),
    }


# ---------------------------------------------------------------- summary


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _paired(a: dict[int, float], b: dict[int, float]) -> float | None:
    common = [a[r] / b[r] for r in a if r in b and b[r] > 0]
    return statistics.median(common) if common else None


def _times(res: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, dict[int, float]]]:
    """{(impl, scheme, T): {"train": {round: seconds}, "eval": {round: seconds}}} of the raw rounds."""
    times: dict[tuple[str, str, int], dict[str, dict[int, float]]] = {}
    for r in res["raw"]:
        t = times.setdefault((r["impl"], r["scheme"], r["T"]), {"train": {}, "eval": {}})
        t["train"][r["round"]] = r["train_s"]
        t["eval"][r["round"]] = r["eval_s"]
    return times


def _class(res: dict[str, Any], impl: str, sch: str) -> str:
    return res["classes"].get(f"{impl}:{sch}", "x-transformers" if impl == XT else "?")


def _timed_row(res: dict[str, Any], s: BenchSettings, key: tuple[str, str, int], t: dict) -> dict[str, Any]:
    """A measured (impl, scheme, T)'s times and throughput: the best and the median of its rounds."""
    impl, sch, T = key
    B = s.batch(T)
    tokens = B * T
    tr, ev = list(t["train"].values()), list(t["eval"].values())
    return {
        "impl": impl,
        "scheme": sch,
        "class": _class(res, impl, sch),
        "T": T,
        "batch": B,
        "tokens": tokens,
        "rounds": len(tr),
        "train_s_min": min(tr),
        "train_s_median": statistics.median(tr),
        "eval_s_min": min(ev),
        "eval_s_median": statistics.median(ev),
        "train_tok_s": tokens / min(tr),
        "eval_tok_s": tokens / min(ev),
    }


def _against_none(row: dict[str, Any], t: dict, base: dict | None, m: dict | None, m0: dict | None) -> None:
    """Step, evaluation and memory ratios of a row to ``none``'s at the same length (``base``
    its times, ``m`` and ``m0`` the memory of the row's scheme and of none)."""
    if base:
        row["step_ratio"] = _ratio(min(t["train"].values()), min(base["train"].values()))
        row["step_ratio_paired_median"] = _paired(t["train"], base["train"])
        row["eval_ratio"] = _ratio(min(t["eval"].values()), min(base["eval"].values()))
        row["eval_ratio_paired_median"] = _paired(t["eval"], base["eval"])
    if m:
        row["mem_train_bytes"] = m["train_peak"]
        if m0:
            row["mem_ratio"] = _ratio(m["train_peak"], m0["train_peak"])


def _flop_rates(row: dict[str, Any], s: BenchSettings, best: float, f: dict | None, f0: dict | None,
                peak: float) -> None:
    """Counted FLOPs (``f``; ``f0``: none's) and PaLM's estimate over a row's best step time
    ``best``, as rates and as fractions of the matmul ``peak``."""
    if f and f.get("train"):
        row["flops_train"] = f["train"]
        row["flops_eval"] = f["eval"]
        row["train_flops_per_s"] = f["train"] / best
        row["train_peak_fraction"] = f["train"] / best / peak
    if row.get("flops_train") and f0 and f0.get("train"):  # how much more work the scheme does than none
        row["flop_share"] = row["flops_train"] / f0["train"]
        if row.get("step_ratio") is not None:
            row["flop_efficiency"] = row["step_ratio"] / row["flop_share"]
    row["flops_train_palm"] = palm_flops_per_token(s.model, s.vocab_size, row["T"]) * row["tokens"]
    row["palm_peak_fraction"] = row["flops_train_palm"] / best / peak


def _against_xt(row: dict[str, Any], t: dict, xt: dict, m: dict | None, mx: dict | None) -> None:
    """posenc's step, evaluation and memory ratios to x-transformers' at the same scheme and length."""
    row["xt_step_ratio"] = _ratio(min(t["train"].values()), min(xt["train"].values()))
    row["xt_step_ratio_paired_median"] = _paired(t["train"], xt["train"])
    row["xt_eval_ratio"] = _ratio(min(t["eval"].values()), min(xt["eval"].values()))
    if m and mx:
        row["xt_mem_ratio"] = _ratio(m["train_peak"], mx["train_peak"])


def _failed_rows(res: dict[str, Any], s: BenchSettings, have: set) -> list[dict[str, Any]]:
    """Rows for what failed at a length (out of memory, an exception in a scheme) and was not measured."""
    rows = []
    for e in res["errors"]:
        key = (e["impl"], e["scheme"], e.get("T"))
        if key[2] is not None and key not in have:
            rows.append({"impl": key[0], "scheme": key[1], "class": _class(res, key[0], key[1]), "T": key[2],
                         "batch": s.batch(key[2]), "failed": e["error"]})
            have.add(key)
    return rows


def _t2_excess(rows: list[dict[str, Any]], mem: dict, s: BenchSettings) -> None:
    """Each scheme's memory in excess of none's per layer, sequence and query-key pair, at the
    longest length probed, on its row there (``t2_floats_per_pair``; the module's text says why)."""
    by_key = {(r["impl"], r["scheme"], r["T"]): r for r in rows}
    for impl, sch in {(k[0], k[1]) for k in mem}:
        T = max(t for (i, sc, t) in mem if (i, sc) == (impl, sch))
        base, row = mem.get((impl, "none", T)), by_key.get((impl, sch, T))
        if base and row:
            excess = mem[(impl, sch, T)]["train_peak"] - base["train_peak"]
            row["t2_floats_per_pair"] = excess / (4.0 * s.model["n_layers"] * s.batch(T) * T * T)


def summarize(res: dict[str, Any], s: BenchSettings) -> list[dict[str, Any]]:
    """A row per (impl, scheme, T) measured or failed: times, throughput, ratios to ``none`` and
    (posenc's) to x-transformers, memory and FLOP rates; posenc's first at each length, the
    schemes in their settings' order."""
    times = _times(res)
    mem = {(m["impl"], m["scheme"], m["T"]): m for m in res["memory"]}
    fl = {(f["impl"], f["scheme"], f["T"]): f for f in res["flops"]}
    rows = []
    for (impl, sch, T), t in times.items():
        row = _timed_row(res, s, (impl, sch, T), t)
        m = mem.get((impl, sch, T))
        _against_none(row, t, times.get((impl, "none", T)), m, mem.get((impl, "none", T)))
        _flop_rates(row, s, min(t["train"].values()), fl.get((impl, sch, T)), fl.get((impl, "none", T)),
                    res["peak"]["flops_per_s"])
        if impl == POSENC and (XT, sch, T) in times:
            _against_xt(row, t, times[(XT, sch, T)], m, mem.get((XT, sch, T)))
        rows.append(row)
    rows += _failed_rows(res, s, {(r["impl"], r["scheme"], r["T"]) for r in rows})
    _t2_excess(rows, mem, s)
    order = {sch: i for i, sch in enumerate(s.schemes)}
    rows.sort(key=lambda r: (r["T"], r["impl"] != POSENC, order.get(r["scheme"], 99)))
    return rows


def evaluate_targets(rows: list[dict[str, Any]], s: BenchSettings) -> list[dict[str, Any]]:
    """The targets at T=1024 (or the length closest to it), one entry per check.

    Every scheme: step time over none at most 1.15 x its FLOP share over none (counted
    training FLOPs over none's: what its own extra work accounts for); ALiBi, T5 and
    KERPLE: step time at most 1.10 x none's; every scheme without a value term: peak
    memory at most 1.5 x none's; every shared scheme: posenc step time <=
    x-transformers'; every scheme: memory growth not T^2 * D-like (fewer than D/4
    fp32 values kept per layer per query-key pair). A (scheme, T) that failed does
    not meet its targets.
    """
    if not rows:
        return []
    T = min(s.lengths, key=lambda t: abs(t - TARGET_LENGTH))
    D = s.model["d_model"]
    out = []
    for r in rows:
        if r["impl"] != POSENC:
            continue
        if r["T"] == T and r["scheme"] != "none":
            out.append(_target(r, T, "efficiency", r.get("flop_efficiency"), TARGET_FLOP_EFFICIENCY))
            if r["scheme"] in CHEAP_BIASES:
                out.append(_target(r, T, "step", r.get("step_ratio"), TARGET_STEP_CHEAP))
            if r["class"] != VALUE_TERM and s.memory and (r.get("mem_ratio") is not None or "failed" in r):
                out.append(_target(r, T, "memory", r.get("mem_ratio"), TARGET_MEM))
        if r["T"] == T and (r.get("xt_step_ratio") is not None or ("failed" in r and r["scheme"] in XT_SHARED)):
            out.append(_target(r, T, "x-transformers", r.get("xt_step_ratio"), 1.0))
        if r.get("t2_floats_per_pair") is not None:
            out.append(_target(r, r["T"], "T2", r["t2_floats_per_pair"], D / 4))
    return out


def _target(r: dict[str, Any], T: int, what: str, value: float | None, limit: float) -> dict[str, Any]:
    met = value is not None and value <= limit
    return {"scheme": r["scheme"], "T": T, "what": what, "value": value, "limit": limit, "met": met}


# ----------------------------------------------------------------- outputs


def _fmt(v: Any, spec: str = ".2f", missing: str = "–") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return missing
    return format(v, spec)


def _mib(v: Any) -> str:
    return _fmt(None if v is None else v / 2**20, ".1f")


def _ktok(v: Any) -> str:
    return _fmt(None if v is None else v / 1e3, ".1f")


TARGET_COLUMNS = {
    "efficiency": "step / none ÷ FLOP share (<= 1.15)",
    "step": "step / none (ALiBi, T5, KERPLE <= 1.10)",
    "memory": "mem / none (no value term: <= 1.5)",
    "x-transformers": "posenc / x-t step (<= 1)",
    "T2": "T² floats/pair (<= D/4)",
}


def targets_markdown(targets: list[dict[str, Any]], d_model: int) -> list[str]:
    T = next((t["T"] for t in targets if t["what"] != "T2"), None)
    cols = [c for c in TARGET_COLUMNS if any(t["what"] == c for t in targets)]
    cell: dict[tuple[str, str], str] = {}
    for t in targets:
        v = "failed" if t["value"] is None else f"{t['value']:.2f}"
        cell[(t["scheme"], t["what"])] = f"{v} {'yes' if t['met'] else '**no**'}"
    schemes = list(dict.fromkeys(t["scheme"] for t in targets))
    lines = [
        "",
        f"Targets at T={T} (reported, not asserted; T² floats/pair at the longest probed length, D = {d_model}):",
        "",
        "| scheme | " + " | ".join(TARGET_COLUMNS[c] for c in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for sch in schemes:
        lines.append(f"| {sch} | " + " | ".join(cell.get((sch, c), "") for c in cols) + " |")
    return lines


def _model_label(st: dict[str, Any]) -> str:
    return f"`{st['model_name']}`" + (" at --tiny sizes" if st["tiny"] else "")


def _short(error: str) -> str:
    if "can't allocate memory" in error or "MemoryError" in error:
        return "out of memory (over --max-memory-gb)"
    return error.replace("|", "/").replace("\n", " ")[:80]


def _header(res: dict[str, Any]) -> list[str]:
    """The section's title and what was measured: the command, the machine, the model, the
    rounds and the matmul peak, and how the tables read."""
    meta = res["meta"]
    st = meta["settings"]
    mc = st["model"]
    return [
        "## Speed and memory of the schemes",
        "",
        f"`{meta['command']}` on {meta['device_name']} ({meta['cpu_count']} CPUs, {meta['torch_threads']} torch "
        f"threads), torch {meta['torch']}, {meta['dtype']}, {meta['created']}. "
        + (f"FIRE's blocks past its threshold: {meta['fire_block']}. " if meta.get("fire_block") else "")
        + f"Model {_model_label(st)} "
        f"(d_model {mc['d_model']}, {mc['n_layers']} layers, {mc['n_heads']} heads, d_ff {mc['d_ff']}, vocab "
        f"{st['vocab_size']}), causal LM, {st['tokens_per_batch']} tokens per batch (batch = tokens // T), "
        "AdamW. Rounds (warm-up) per length: "
        + ", ".join(f"T={t}: {n} ({st['warmup'][t]})" for t, n in sorted(st["repeats"].items()))
        + f". Matmul peak {res['peak']['flops_per_s'] / 1e9:.1f} GFLOP/s (samples: "
        + ", ".join(f"{p['when']} {p['flops_per_s'] / 1e9:.1f}" for p in res["peak"]["samples"])
        + "; their spread shows how much the machine's load drifted).",
        "",
        (
            "Times are the best of the rounds; ratios are best / best and, in brackets, the median of the "
            "per-round ratios. Memory: peak above the state after a T=1 warm-up (weights, gradients, AdamW), "
            "training step. FLOP/s % peak: counted training FLOPs / step time / matmul peak. FLOP share: "
            "the scheme's counted training FLOPs over none's (its extra work); step ÷ share: the step ratio "
            "over the FLOP share (1: as fast as its FLOPs allow, at none's FLOP rate)."
        ),
        "",
    ]


def _posenc_table(rows: list[dict[str, Any]]) -> list[str]:
    """posenc's row per scheme and length: throughput, ratios to none, memory, FLOP rates and
    the ratio to x-transformers."""
    lines = [
        (
            "| scheme | class | T | batch | train ktok/s | eval ktok/s | step / none | eval / none | "
            "train mem MiB | mem / none | FLOP/s % peak | FLOP share | step ÷ share | posenc / x-t step |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["impl"] != POSENC:
            continue
        if "failed" in r:
            lines.append(f"| {r['scheme']} | {r['class']} | {r['T']} | {r['batch']} | failed: {_short(r['failed'])} |")
            continue
        lines.append(
            f"| {r['scheme']} | {r['class']} | {r['T']} | {r['batch']} | {_ktok(r['train_tok_s'])} | "
            f"{_ktok(r['eval_tok_s'])} | {_fmt(r.get('step_ratio'))} ({_fmt(r.get('step_ratio_paired_median'))}) | "
            f"{_fmt(r.get('eval_ratio'))} | {_mib(r.get('mem_train_bytes'))} | {_fmt(r.get('mem_ratio'))} | "
            f"{_fmt(None if r.get('train_peak_fraction') is None else 100 * r['train_peak_fraction'], '.1f')} | "
            f"{_fmt(r.get('flop_share'))} | {_fmt(r.get('flop_efficiency'))} | "
            f"{_fmt(r.get('xt_step_ratio'))} ({_fmt(r.get('xt_step_ratio_paired_median'))}) |"
        )
    return lines


def _xt_table(res: dict[str, Any]) -> list[str]:
    """x-transformers' rows beside posenc's at the same scheme and length (none when it was not run)."""
    rows = res["summary"]
    xt_rows = [r for r in rows if r["impl"] == XT]
    if not xt_rows:
        return []
    lines = [
        "",
        f"x-transformers {res['meta']['x_transformers']} at the same sizes (posenc / x-t below 1: posenc is faster):",
        "",
        (
            "| scheme | T | x-t train ktok/s | x-t eval ktok/s | x-t step / x-t none | x-t train mem MiB | "
            "posenc / x-t step | posenc / x-t eval | posenc / x-t mem |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_key = {(r["impl"], r["scheme"], r["T"]): r for r in rows}
    for r in xt_rows:
        if "failed" in r:
            lines.append(f"| {r['scheme']} | {r['T']} | failed: {_short(r['failed'])} |")
            continue
        p = by_key.get((POSENC, r["scheme"], r["T"]), {})
        lines.append(
            f"| {r['scheme']} | {r['T']} | {_ktok(r['train_tok_s'])} | {_ktok(r['eval_tok_s'])} | "
            f"{_fmt(r.get('step_ratio'))} | {_mib(r.get('mem_train_bytes'))} | "
            f"{_fmt(p.get('xt_step_ratio'))} ({_fmt(p.get('xt_step_ratio_paired_median'))}) | "
            f"{_fmt(p.get('xt_eval_ratio'))} | {_fmt(p.get('xt_mem_ratio'))} |"
        )
    return lines


def _slopes(res: dict[str, Any]) -> list[str]:
    """posenc's memory beyond none per layer, sequence and query-key pair (``t2_floats_per_pair``),
    in one sentence, the schemes in their settings' order."""
    mc = res["meta"]["settings"]["model"]
    slopes = [r for r in res["summary"] if r.get("t2_floats_per_pair") is not None and r["impl"] == POSENC]
    slopes.sort(key=lambda r: list(res["meta"]["settings"]["schemes"]).index(r["scheme"]))
    if not slopes:
        return []
    return [
        "",
        f"Memory beyond `none` at T={slopes[0]['T']}, in fp32 values per layer, sequence and query-key pair "
        f"(about H = {mc['n_heads']} per (B, H, T, T) tensor; a T²·D term would give about D = {mc['d_model']}): "
        + ", ".join(
            f"{r['scheme']} {r['t2_floats_per_pair']:.1f}" + (f" (T={r['T']})" if r["T"] != slopes[0]["T"] else "")
            for r in slopes
        )
        + ".",
    ]


def markdown(res: dict[str, Any]) -> str:
    """The benchmark's Markdown section (``bench.md``): what was measured, posenc's table,
    x-transformers', the memory slopes, the targets, the failures and the notes."""
    lines = _header(res) + _posenc_table(res["summary"]) + _xt_table(res) + _slopes(res)
    if res["targets"]:
        lines += targets_markdown(res["targets"], res["meta"]["settings"]["model"]["d_model"])
    if res["errors"]:
        lines += ["", "Failures:", ""]
        lines += [f"- {e['impl']} {e['scheme']} T={e.get('T')}: {e['error']}" for e in res["errors"]]
    for n in res["notes"]:
        lines += ["", f"Note: {n}"]
    return "\n".join(lines) + "\n"
