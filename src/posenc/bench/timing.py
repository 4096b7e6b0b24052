"""The measuring run: every model built up front, then interleaved timed rounds per length.

Timing. All models (posenc and x-transformers) are built up front and kept.
For each T, ``--warmup`` untimed iterations per model (``--warmup-at`` per
length) are followed by ``--repeats`` rounds (``--repeats-at`` per length). In
every round each model runs one timed training step and one timed evaluation
forward, one model after the other, the start of the order rotating from round
to round. So every model sees the same machine state (load from other jobs
drifts slowly compared with a round), and a ratio is taken between numbers
measured seconds apart. Reported per (model, T): the min and the median over
rounds; ratios to ``none`` as min / min and as the median of the per-round
ratios (paired, robust to drift). On a shared machine the min is the best
estimate of the undisturbed cost. ``--threads`` sets torch's CPU threads: on a
machine shared with other jobs one thread is steadier (OpenMP threads that
wait for each other at every op barrier lose their time slices).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable
from typing import Any

import torch

from .config import POSENC, XT, BenchSettings
from .flops import FLOP_DIRECT_MAX, flop_model, matmul_peak
from .memory import limit_memory, probe_memory_cpu, probe_memory_cuda, restore_memory_limit
from .models import Runner, _classes, _error, batch_for, build_unit
from .report import environment, evaluate_targets, summarize
from .xtransformers import xt_kwargs, xtransformers_version

# -------------------------------------------------------------------- run


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc="bench", file=sys.stderr, dynamic_ncols=True)


def run_benchmark(s: BenchSettings) -> dict[str, Any]:
    """Measure everything; returns the result dict (see ``write_outputs``).

    Torch's thread count and the address-space cap are restored afterwards,
    so the function can run inside another process (the tests)."""
    threads = torch.get_num_threads()
    if s.threads:
        torch.set_num_threads(s.threads)
    try:
        return _Bench(s).run()
    finally:
        torch.set_num_threads(threads)


class _Bench:
    def __init__(self, s: BenchSettings):
        self.s = s
        self.notes: list[str] = []
        self.errors: list[dict[str, Any]] = []
        self.failed: set[tuple[str, str, int]] = set()
        self.raw: list[dict[str, Any]] = []
        self.flops: list[dict[str, Any]] = []
        self.peaks: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.runners: dict[tuple[str, str], Runner] = {}

    def note(self, msg: str) -> None:
        print(f"note: {msg}", file=sys.stderr)
        self.notes.append(msg)

    def build(self, xt_version: str | None) -> None:
        s = self.s
        # each x-transformers twin right after its posenc model, so the pair is timed seconds apart
        units = []
        for sch in s.schemes:
            units.append((POSENC, sch))
            if xt_version is not None and xt_kwargs(sch, s.encodings[sch], s.model) is not None:
                units.append((XT, sch))
        for impl, sch in units:
            torch.manual_seed(s.seed)
            try:
                model = build_unit(impl, sch, s.encodings[sch], s.model, s.vocab_size)
                r = Runner(impl, sch, model, s.device)
            except Exception as e:  # noqa: BLE001 - one broken scheme must not stop the others
                self.errors.append(_error(impl, sch, None, e))
                print(f"note: cannot build {impl} {sch}: {e}", file=sys.stderr)
                continue
            self.runners[(impl, sch)] = r
            try:
                fm = flop_model(r, s.vocab_size, s.seed, tuple(T for T in s.lengths if T <= FLOP_DIRECT_MAX))
            except Exception as e:  # noqa: BLE001 - FLOPs are best effort
                self.note(f"cannot count FLOPs of {impl} {sch}: {type(e).__name__}: {e}")
                fm = None
            if s.compile:  # after the FLOPs are counted (on the eager model); the warm-up compiles
                r.model.compile()
            if fm is None:
                continue
            for T in s.lengths:
                row = {"impl": impl, "scheme": sch, "T": T, "batch": s.batch(T)}
                for mode in ("train", "eval"):
                    counted = fm[mode]["counted"].get(T)
                    ok = fm[mode]["exact"] or counted is not None
                    per_sequence = counted if counted is not None else fm[mode]["fn"](T)
                    row[mode] = round(s.batch(T) * per_sequence) if ok else None
                    row[f"{mode}_points"] = fm[mode]["points"] + sorted(fm[mode]["counted"].items())
                if not (fm["train"]["exact"] and fm["eval"]["exact"]) and T > FLOP_DIRECT_MAX:
                    self.note(f"FLOPs of {impl} {sch} are not quadratic in T: not reported")
                self.flops.append(row)

    def guarded(self, r: Runner, T: int, fn: Callable[[], Any]) -> Any:
        """fn(), or None once (r, T) has failed (e.g. out of memory): reported, the run goes on."""
        if (r.impl, r.scheme, T) in self.failed:
            return None
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            self.failed.add((r.impl, r.scheme, T))
            self.errors.append(_error(r.impl, r.scheme, T, e))
            print(f"note: {r.impl} {r.scheme} T={T} failed: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            gc.collect()
            return None

    def time_length(self, T: int, bar) -> None:
        s = self.s
        B = s.batch(T)
        x, y = batch_for(T, B, s.vocab_size, s.device, s.seed)
        self.peaks.append({"when": f"before T={T}", "flops_per_s": matmul_peak(s.device)})
        order = list(self.runners.values())
        for _ in range(s.warmup[T]):
            for r in order:
                bar.set_postfix_str(f"T={T} warm-up {r.impl}:{r.scheme}")
                self.guarded(r, T, lambda r=r: (r.train_step(x, y), r.eval_step(x)))
                bar.update()
        for rnd in range(s.repeats[T]):
            k = rnd % len(order) if order else 0
            for r in order[k:] + order[:k]:  # interleaved, the start rotating per round
                bar.set_postfix_str(f"T={T} round {rnd + 1}/{s.repeats[T]} {r.impl}:{r.scheme}")
                t_train = self.guarded(r, T, lambda r=r: r.timed(lambda: r.train_step(x, y)))
                t_eval = self.guarded(r, T, lambda r=r: r.timed(lambda: r.eval_step(x)))
                if t_train is not None and t_eval is not None:
                    self.raw.append(
                        {
                            "impl": r.impl,
                            "scheme": r.scheme,
                            "T": T,
                            "batch": B,
                            "round": rnd,
                            "train_s": t_train,
                            "eval_s": t_eval,
                        }
                    )
                bar.update()
        if s.memory and s.device == "cuda":
            for r in order:
                res = self.guarded(r, T, lambda r=r: probe_memory_cuda(r, x, y))
                if res is not None:
                    self.memory.append(res)
                bar.update()

    def run(self) -> dict[str, Any]:
        s = self.s
        xt_version = xtransformers_version() if s.xtransformers else None
        if s.xtransformers and xt_version is None:
            self.note("x-transformers is not installed (pip install 'posenc[bench]'): its comparison is skipped")
        if "none" not in s.schemes:
            self.note("'none' is not among the schemes: no ratios")
        self.build(xt_version)
        n = len(self.runners)
        n_iter = sum(s.warmup[T] + s.repeats[T] for T in s.lengths) * n
        n_mem = len(s.memory_lengths or s.lengths) if s.memory else 0
        bar = _progress(n_iter + n * n_mem, s.progress)

        old_limit = limit_memory(s.max_memory_gb) if s.device == "cpu" else None
        try:
            for T in s.lengths:
                self.time_length(T, bar)
        finally:
            restore_memory_limit(old_limit)
        self.peaks.append({"when": "end", "flops_per_s": matmul_peak(s.device)})

        if s.memory and s.device != "cuda":
            keys = list(self.runners)
            self.runners.clear()  # the probes run while this process holds no models
            gc.collect()
            jobs = [
                (impl, sch, T, s.batch(T), s.encodings[sch], s.model, s.vocab_size, s.seed, s.threads, s.max_memory_gb)
                for T in (s.memory_lengths or s.lengths)
                for impl, sch in keys
                if (impl, sch, T) not in self.failed
            ]
            bar.set_postfix_str("memory probes")
            for m in probe_memory_cpu(jobs, bar.update):
                (self.errors if "error" in m else self.memory).append(m)
        bar.close()

        result = {
            "meta": environment(s, xt_version),
            "notes": self.notes,
            "peak": {"samples": self.peaks, "flops_per_s": max(p["flops_per_s"] for p in self.peaks)},
            "raw": self.raw,
            "flops": self.flops,
            "memory": self.memory,
            "errors": self.errors,
            "classes": {f"{POSENC}:{sch}": c for sch, c in _classes(s).items()},
        }
        result["summary"] = summarize(result, s)
        result["targets"] = evaluate_targets(result["summary"], s)
        return result
