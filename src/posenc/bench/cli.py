"""``python -m posenc.bench``: arguments, settings, writing the outputs, re-rendering a ``bench.json``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..attention.flex_gates import ENV as ROUTE_ENV
from ..attention.flex_gates import use_route
from .config import CONF_DIR, POSENC, XT, BenchSettings, compose_configs, discover_schemes
from .figure import plot
from .memory import default_memory_budget_gb, memory_probe
from ..files import write_json, write_text
from .report import evaluate_targets, markdown, summarize
from .timing import run_benchmark


def write_outputs(res: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(res)
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md"}
    write_json(paths["json"], res, indent=1, default=str)
    write_text(paths["md"], md)
    try:
        for p in plot(res, out_dir):
            paths[p.suffix[1:]] = p
    except Exception as e:  # noqa: BLE001 - the numbers are written already
        print(f"note: plotting failed: {type(e).__name__}: {e}", file=sys.stderr)
    return paths


# -------------------------------------------------------------------- CLI


def parse_per_length(flag: str, items: Iterable[str]) -> dict[int, int]:
    out = {}
    for it in items:
        try:
            t, n = it.split("=")
            out[int(t)] = int(n)
        except ValueError:
            raise SystemExit(f"{flag} expects LENGTH=N, got {it!r}") from None
    return out


def settings_from_args(a: argparse.Namespace) -> BenchSettings:
    schemes = a.schemes or discover_schemes()
    unknown = [s for s in schemes if not (CONF_DIR / "encoding" / f"{s}.yaml").exists()]
    if unknown:
        raise SystemExit(f"unknown scheme(s) {unknown}; available: {', '.join(discover_schemes())}")
    lengths = a.lengths or ([32, 64] if a.tiny else [256, 1024, 4096])
    if any(t < 1 for t in lengths):
        raise SystemExit("--lengths must be positive")
    repeats = a.repeats if a.repeats is not None else (1 if a.tiny else 3)
    rep = {t: repeats for t in lengths}
    rep.update({t: n for t, n in parse_per_length("--repeats-at", a.repeats_at).items() if t in rep})
    if any(n < 1 for n in rep.values()):
        raise SystemExit("repeats must be at least 1")
    warm = {t: 1 if a.warmup is None else a.warmup for t in lengths}
    warm.update({t: n for t, n in parse_per_length("--warmup-at", a.warmup_at).items() if t in warm})
    if any(n < 0 for n in warm.values()):
        raise SystemExit("warm-up must be at least 0")
    model, encodings = compose_configs(a.model, list(dict.fromkeys(schemes)), max(lengths), a.tiny)
    device = (
        "cuda" if (a.device == "auto" and torch.cuda.is_available()) else ("cpu" if a.device == "auto" else a.device)
    )
    return BenchSettings(
        schemes=list(dict.fromkeys(schemes)),
        lengths=list(dict.fromkeys(lengths)),
        repeats=rep,
        warmup=warm,
        tokens_per_batch=a.tokens_per_batch or (128 if a.tiny else 4096),
        vocab_size=a.vocab_size or (256 if a.tiny else 4096),
        model_name=a.model,
        model=model,
        encodings=encodings,
        out_dir=a.out_dir or "results/bench",
        memory=not a.no_memory,
        memory_lengths=[t for t in lengths if t in a.memory_lengths] if a.memory_lengths else None,
        xtransformers=not a.no_xtransformers,
        tiny=a.tiny,
        seed=a.seed,
        device=device,
        threads=a.threads,
        max_memory_gb=a.max_memory_gb if a.max_memory_gb is not None else default_memory_budget_gb(),
        progress=not a.no_progress,
        compile=a.compile,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m posenc.bench",
        description="Training/evaluation throughput, peak memory and FLOP/s of every positional scheme, "
        "relative to 'none' and to x-transformers. See the module docstring for the method.",
    )
    p.add_argument("--schemes", nargs="+", help="conf/encoding names (default: every conf/encoding/*.yaml)")
    p.add_argument("--lengths", nargs="+", type=int, help="sequence lengths (default 256 1024 4096)")
    p.add_argument("--repeats", type=int, help="timed rounds per length (default 3; tiny 1)")
    p.add_argument("--repeats-at", nargs="+", default=[], metavar="T=N", help="rounds for one length, e.g. 4096=2")
    p.add_argument("--warmup", type=int, help="untimed iterations per model and length before the rounds (default 1)")
    p.add_argument("--warmup-at", nargs="+", default=[], metavar="T=N", help="warm-up for one length, e.g. 4096=0")
    p.add_argument("--tokens-per-batch", type=int, help="batch = max(1, this // T) (default 4096; tiny 128)")
    p.add_argument("--vocab-size", type=int, help="vocabulary (default 4096; tiny 256)")
    p.add_argument("--model", default="small", help="conf/model/<name>.yaml (default small)")
    p.add_argument("--out-dir", help="where bench.{json,md,png,svg} go (default results/bench)")
    p.add_argument("--from-json", metavar="BENCH_JSON", help="re-render summary, tables and figures from a bench.json")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    p.add_argument("--memory-lengths", nargs="+", type=int, help="probe memory at these of the lengths only")
    p.add_argument("--no-xtransformers", action="store_true", help="skip the x-transformers comparison")
    p.add_argument("--tiny", action="store_true", help="seconds-long CI configuration (d_model 32, T 32 and 64)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's); 1 is steadier on a machine shared with others",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--attention-route", choices=["auto", "flex", "masked"],
                   help="attention.route for every model (default: POSENC_ATTENTION_ROUTE, else auto); masked keeps "
                   "FlexAttention out, to time the float-mask routes")
    p.add_argument("--compile", action="store_true",
                   help="time each model compiled (torch.compile, in place, as the setting compile=true trains it); "
                   "the warm-up pays the compilation")
    p.add_argument(
        "--max-memory-gb",
        type=float,
        help="CPU: extra address space a process may take for the steps (default: half of MemAvailable; 0: no cap); "
        "a (scheme, T) that needs more is reported as failed",
    )
    p.add_argument("--memory-probe", nargs=2, metavar=("SCHEME", "T"), help="run one CPU memory probe, print JSON")
    p.add_argument("--impl", choices=[POSENC, XT], default=POSENC, help="model family of --memory-probe")
    return p


def rerender(path: Path, out_dir: Path | None) -> dict[str, Path]:
    """Summary, targets, tables and figures again from a ``bench.json`` (no measuring)."""
    res = json.loads(path.read_text())
    st = dict(res["meta"]["settings"])
    for key in ("repeats", "warmup"):
        st[key] = {int(t): n for t, n in st[key].items()}
    s = BenchSettings(**st)
    res["meta"]["settings"] = asdict(s)
    res["summary"] = summarize(res, s)
    res["targets"] = evaluate_targets(res["summary"], s)
    paths = write_outputs(res, out_dir or path.parent)
    print(markdown(res))
    return paths


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.attention_route:  # this process, and the memory probes it starts
        use_route(a.attention_route)
        os.environ[ROUTE_ENV] = a.attention_route
    if a.from_json:
        rerender(Path(a.from_json), Path(a.out_dir) if a.out_dir else None)
        return 0
    if a.memory_probe:
        scheme, T = a.memory_probe[0], int(a.memory_probe[1])
        a.schemes, a.lengths = [scheme], [T]
        s = settings_from_args(a)
        res = memory_probe(
            a.impl,
            scheme,
            T,
            s.batch(T),
            s.encodings[scheme],
            s.model,
            s.vocab_size,
            s.seed,
            s.threads,
            s.max_memory_gb,
        )
        print(json.dumps(res))
        return 0
    s = settings_from_args(a)
    t0 = time.perf_counter()
    res = run_benchmark(s)
    res["meta"]["wall_s"] = time.perf_counter() - t0
    paths = write_outputs(res, Path(s.out_dir))
    print(markdown(res))
    print("wrote " + ", ".join(str(p) for p in paths.values()), file=sys.stderr)
    return 0
