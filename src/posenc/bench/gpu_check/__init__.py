"""The GPU check: what posenc does on a CUDA GPU, measured in one run of a few minutes.

    python -m posenc.gpu_check                 # writes docs/gpu.md and docs/gpu.json

It needs a CUDA GPU, the corpora (``POSENC_DATA_DIR``, Tiny Shakespeare) and nothing else of the
project's services: no MLflow (``~logger``), no DVC. Before it starts it prints its estimate of
its own time (``estimate``: the work of each part times its cost on an H200, measured or, for
compilation, assumed), which with the defaults fits in 8 minutes. Its parts, in the order they
run, each recorded even where another fails (a failure is written into the report with its
error, and the exit status is 1); with ``--budget-s``, a part not started in time is reported
as not run:

1. **A step on every route** (``steps``). Every scheme (``conf/encoding``), one training step of
   ``--model`` in bf16 autocast at T = 256 and T = 1000 (4,096 tokens) on each route that can
   train it here (on CUDA: fused, flex, probabilities, masked, as each serves it), from the same
   weights and batch: the loss, and every parameter's gradient present, finite and close to the
   float-mask route's (``STEP_TOL``); and the graphs torch.compile made (FlexAttention's, the
   rotation's), per step and in the process.
2. **Benchmark** (``measures.run_bench``). ``python -m posenc.bench`` on the GPU at T = 1024 and
   4096 (``--model``, 8,192 tokens per batch, bf16 autocast), on the routes ``attention.route=auto``
   gives: each scheme's training-step time and peak memory against NoPE (``none``) and its FLOP
   share. Then the schemes that trained on the flex route in part 1, with ``none``, again on the
   float-mask routes (``--attention-route masked``): the route before and after, side by side.
   Then NoPE compiled (``--compile``, as ``compile=true`` trains) against its eager step.
3. **Long evaluation** (``measures.long_evaluation``). Every scheme's forward without gradients
   (bf16 autocast on CUDA) at ``--long-tokens`` tokens (16,384: the paper profile's longest
   evaluation, 32L at L = 512), batch 1, with the paper profile's model (``model=base``) and
   random weights: whether it fits, its route, its seconds and its peak memory against ``none``'s.
4. **Training, numerics, evaluation** (``training.check_scheme``). Every scheme trains
   ``--steps`` (40) steps of ``--model`` (``small``: d 256, 4 layers of 4 heads) at L =
   ``--seq-len`` (512) on byte-level Tiny Shakespeare (V = 260), causal LM, with ``trainer=gpu``
   (bf16-mixed), on its default route (recorded: training and validation). Checked: the first
   loss within 10% of ln V, no NaN, the last below the first; the first block's output in bf16
   and float32 against float64 on the CPU (``BF16_TOL``, ``FP32_TOL``); perplexity at L and 4L.
5. **The paper profile's model** (``--paper-bench``, off by default: its study's GPU-hours from
   the step times of ``profiles/paper/params.yaml``'s model, ``paper.paper_estimate``).

``--device cpu`` runs the same code on the CPU with a small model (``--model``, ``--steps``): a
smoke test of the script (tests/test_gpu_check.py), not a GPU check; its report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from ...files import project_root, write_json, write_text
from .common import BF16_TOL, FP32_TOL, VOCAB, environment, failure, recorded_path
from .estimate import BUDGET_S, estimate, estimate_lines
from .measures import long_evaluation, run_bench
from .paper import PAPER_PARAMS, makespan, paper_bench_settings, paper_estimate, paper_jobs, study_tasks
from .report import markdown
from .steps import STEP_TOL, route_steps
from .training import RecordLosses, check_scheme

__all__ = ["BF16_TOL", "BUDGET_S", "FP32_TOL", "PAPER_PARAMS", "STEP_TOL", "VOCAB", "RecordLosses", "check_scheme",
           "estimate", "long_evaluation", "main", "makespan", "markdown", "paper_estimate", "paper_jobs",
           "parse_args", "route_steps", "run_bench", "study_tasks"]

#: tokens per batch of the check's benchmark: 8 sequences at 1024, 2 at 4096 (no batch of 1,
#: which torch would compile anew)
BENCH_TOKENS = 8192


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m posenc.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda (the check); cpu: a smoke test of the script with a small model")
    p.add_argument("--schemes", nargs="+", help="default: every conf/encoding/*.yaml")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--model", default="small")
    p.add_argument("--no-route-steps", dest="route_steps", action="store_false",
                   help="skip part 1, the step of every scheme on every route")
    p.add_argument("--bench-lengths", type=int, nargs="*", default=[1024, 4096], help="none: no benchmark")
    p.add_argument("--bench-repeats", type=int, default=2)
    p.add_argument("--long-tokens", type=int, default=16384,
                   help="part 3, the long evaluation: tokens of one forward (0: skip; --device cpu: a tiny model)")
    p.add_argument("--long-model", default="base", help="part 3's conf/model (default base, the paper profile's)")
    p.add_argument("--no-compiled", dest="compiled", action="store_false",
                   help="skip NoPE compiled against eager in part 2")
    p.add_argument("--no-training", dest="training", action="store_false", help="skip part 4, the training runs")
    p.add_argument("--budget-s", type=float, help="seconds the whole check may take: parts and schemes not started by "
                   "then are reported as not run, and a benchmark gets what is left (default: no limit)")
    p.add_argument("--cache-dir", help="prepared corpora (paths.cache_dir; default: the project's)")
    p.add_argument("--out", default=str(project_root() / "docs" / "gpu.md"), help="the report (a .json twin beside it)")
    p.add_argument("--paper-bench", action="store_true",
                   help="part 5: the paper profile's model timed at its lengths, and its study's GPU-hours")
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


class Check:
    """One run of the check: its settings, its record (``res``), saved after every part, and
    its clock against ``--budget-s``."""

    def __init__(self, a: argparse.Namespace, schemes: list[str], est: dict):
        self.a, self.schemes, self.started = a, schemes, time.perf_counter()
        self.work = Path(tempfile.mkdtemp(prefix="posenc-gpu-check-"))
        self.out = Path(a.out)
        paths = {k: recorded_path(getattr(a, k)) for k in ("cache_dir", "out")}  # no path of this machine
        self.res: dict = {"environment": environment(a.device), "settings": vars(a) | paths | {"schemes": schemes},
                          "estimate": est, "schemes": [], "failures": [], "part_seconds": {}}  # fmt: skip

    def save(self) -> None:
        """After every part: a check stopped from outside keeps what it measured."""
        self.res["seconds"] = round(time.perf_counter() - self.started, 1)
        write_text(self.out, markdown(self.res))
        write_json(self.out.with_suffix(".json"), self.res, indent=1, default=str)

    def left(self) -> float | None:
        return None if self.a.budget_s is None else self.a.budget_s - (time.perf_counter() - self.started)

    def spent(self, what: str) -> bool:
        """Whether the budget is spent; if so ``what`` is recorded as not run."""
        if self.left() is None or self.left() > 0:
            return False
        self.res["failures"].append(f"{what}: not run: the check's budget of {self.a.budget_s:g} s was spent")
        return True

    def part(self, key: str, label: str, measure: Callable[[], dict]) -> bool:
        """res[key] = measure(), or its error, recorded as a failure (the other parts go on); saved."""
        if self.spent(label):
            return False
        t = time.perf_counter()
        try:
            self.res[key] = measure()
        except Exception as e:  # noqa: BLE001 -- recorded, the other parts go on
            self.res[key] = {"error": failure(e, 1500)}
            self.res["failures"].append(f"{label}: {self.res[key]['error']}")
        self.res["part_seconds"][key] = round(time.perf_counter() - t, 1)
        self.save()
        return "error" not in self.res[key]


def training_part(check: Check) -> None:
    """Part 4: every scheme's run (``check_scheme``), one row each."""
    a, res = check.a, check.res
    t = time.perf_counter()
    for i, scheme in enumerate(check.schemes, 1):
        if check.spent(scheme):
            res["schemes"].append({"scheme": scheme, "error": "not run: the check's budget was spent"})
            continue
        try:
            row = check_scheme(scheme, a, check.work)
            bad = [k for k in ("loss_ok", "numerics_ok") if not row[k]]
            if bad:
                res["failures"].append(f"{scheme}: {' and '.join(bad)} false")
        except Exception as e:  # noqa: BLE001 -- recorded, the other schemes go on
            row = {"scheme": scheme, "error": failure(e)}
            res["failures"].append(f"{scheme}: {row['error']}")
            traceback.print_exc()
        res["schemes"].append(row)
        check.save()
        shown = (f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items() if k != "scheme")
        print(f"[{i}/{len(check.schemes)}] {scheme}: " + ", ".join(shown), flush=True)
    res["part_seconds"]["training"] = round(time.perf_counter() - t, 1)


def bench_parts(check: Check) -> None:
    """Part 2: the benchmark; the flex schemes again on the float-mask routes; NoPE compiled."""
    a, work, res = check.a, check.work, check.res
    tokens = () if a.device == "cpu" else ("--tokens-per-batch", str(BENCH_TOKENS))
    check.part("bench", "benchmark", lambda: run_bench(a, work, check.left(), extra=tokens))
    steps = res.get("steps", {}).get("rows", [])
    flex = sorted({r["scheme"] for r in steps if r.get("route") == "flex" and r.get("ok")})
    if flex:
        masked = (*tokens, "--schemes", "none", *flex, "--attention-route", "masked")
        check.part("bench_masked", "benchmark on the float-mask routes", lambda: run_bench(
            a, work, check.left(), "bench-masked", extra=masked))
    if a.compiled:
        check.part("compiled", "NoPE compiled", lambda: run_bench(
            a, work, check.left(), "compiled", extra=(*tokens, "--schemes", "none", "--compile")))


def paper_part(check: Check) -> None:
    """Part 5: the paper profile's model at its settings, and its study's GPU-hours."""
    def paper_bench() -> dict:
        params, settings = paper_bench_settings(check.a)
        return run_bench(check.a, check.work, check.left(), "paper", **settings) | {
            "params": str(PAPER_PARAMS.relative_to(project_root())), "values": params}

    check.part("paper", "paper profile's model", paper_bench)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.from_json:
        write_text(a.out, markdown(json.loads(Path(a.from_json).read_text())))
        print(f"wrote {a.out}")
        return 0
    from ..config import discover_schemes

    schemes = a.schemes or discover_schemes()
    est = estimate(a, schemes)
    print("\n".join(estimate_lines(est, a.budget_s)), flush=True)
    check = Check(a, schemes, est)
    if a.route_steps:
        check.part("steps", "a step on every route", lambda: route_steps(a, schemes))
        check.res["failures"] += [f"{r['scheme']} at T = {r.get('T')} on {r.get('route')}: "
                                  + (r.get("error") or "gradients or loss not as the float-mask route's")
                                  for r in check.res["steps"].get("rows", []) if not r.get("ok")]
    if a.bench_lengths:
        bench_parts(check)
    if a.long_tokens and check.part("long", "long evaluation", lambda: long_evaluation(a, schemes, a.long_model,
                                                                                          a.long_tokens)):
        check.res["failures"] += [f"{r['scheme']} at {a.long_tokens} tokens: {r['error']}"
                                  for r in check.res["long"]["rows"] if "error" in r]
    if a.training:
        training_part(check)
    if a.paper_bench:
        paper_part(check)
    check.save()
    res = check.res
    print(f"wrote {check.out} and {check.out.with_suffix('.json')} in {res['seconds']:.0f} s (estimated "
          f"{est['total_s']:.0f} s); {len(res['failures'])} failure(s)" + "".join(f"\n  {f}" for f in res["failures"]))
    return 1 if res["failures"] else 0
