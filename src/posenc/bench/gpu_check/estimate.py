"""How long the GPU check will take, estimated before it starts and printed: the work of each
part times what a unit of it costs on an H200.

Where a cost was measured it is the check of 2026-11-26 on an H200 (docs/gpu.json, torch 2.11,
every scheme on a float-mask route): a scheme's run of 50 steps with its evaluation, a
benchmark round of one scheme at one length. What no GPU run has measured yet is assumed, and
said so: the compilation of one FlexAttention graph (forward or backward; a scheme compiles one
per grad mode, dtype and kind of shape), cold and with Inductor's and Triton's on-disk caches
warm (a later process), the whole model's compilation (``--compile``), a step of the route
part, a forward of the long evaluation. Each part's real seconds, and the graphs compiled, are
recorded in ``gpu.json``, from which these numbers are to be corrected.
"""

from __future__ import annotations

import argparse

from .steps import STEP_LENGTHS

#: measured on an H200 (docs/gpu.json of 2026-11-26): seconds of a scheme's run (Lightning's start,
#: the evaluation at L and 4L and the numerics), of one training step at L = 512, batch 32 of
#: model=small, and of one benchmark round of one scheme at one length (its warm-up included)
MEASURED = {"run": 1.5, "step": 0.02, "bench_round": 0.85}
#: assumed until a GPU run measures them: a FlexAttention graph compiled cold, and with the
#: on-disk caches warm; the whole model compiled; one step of the route part; one long forward
ASSUMED = {"graph": 3.0, "cached_graph": 0.75, "model_compile": 40.0, "route_step": 0.3, "long_forward": 0.5}
#: the check's budget by default: 8 minutes
BUDGET_S = 480.0


def kinds(schemes: list[str]) -> dict[str, list[str]]:
    """The schemes by what the flex route does for them on a GPU with ``attention.route=auto``:
    ``trains`` (training and evaluation on the route), ``evaluates`` (evaluation only: a score
    function, ``SCORE_TRAINS``), ``rotates`` (the compiled rotation), and the rest."""
    import torch

    from ...attention import FLEX_ROUTE
    from ..config import compose_configs

    _, encodings = compose_configs("micro", schemes, 64, tiny=True)
    from hydra.utils import instantiate

    out: dict[str, list[str]] = {"trains": [], "evaluates": [], "rotates": [], "other": []}
    for s in schemes:
        sch = instantiate(encodings[s])(d_model=64, n_heads=4, max_len=64, causal=True)
        if FLEX_ROUTE.serves(sch):
            out["trains"].append(s)
        else:
            with torch.no_grad():
                served = FLEX_ROUTE.serves(sch)
            out["evaluates" if served else "rotates" if sch.defines("rotate") else "other"].append(s)
    return out


def estimate(a: argparse.Namespace, schemes: list[str]) -> dict:
    """Seconds of each part of the check with settings ``a`` for ``schemes``, and in all (on the
    CPU smoke test the GPU costs say nothing: the estimate is made for the GPU's settings)."""
    k = kinds(schemes)
    trains, evaluates, rotates = len(k["trains"]), len(k["evaluates"]), len(k["rotates"])
    n, g, cached = len(schemes), ASSUMED["graph"], ASSUMED["cached_graph"]
    routes = 2.5  # routes per scheme that can train it on CUDA, on average (fused or flex, masked, probabilities)
    parts = {}
    if a.route_steps:  # forced routes, no probe: a static and a dynamic graph, forward and backward
        parts["steps"] = n * len(STEP_LENGTHS) * routes * ASSUMED["route_step"] + (trains + rotates) * 4 * g
    if a.training:  # the steps' graphs serve training; the bf16 and float32 graphs without gradients are new
        parts["training"] = n * (MEASURED["run"] + a.steps * MEASURED["step"]) + (trains + evaluates) * 4 * g
    if a.bench_lengths:
        rounds = len(a.bench_lengths) * (a.bench_repeats + 1) * MEASURED["bench_round"]
        # a new process: the graphs again, from the caches (``BENCH_TOKENS``: no batch of 1 to compile anew)
        parts["bench"] = n * rounds + (trains + evaluates) * 6 * cached
        if trains:
            parts["bench, float-mask routes"] = (trains + 1) * rounds
        if a.compiled:
            parts["compiled"] = ASSUMED["model_compile"] + rounds
    if a.long_tokens:
        parts["long evaluation"] = n * 2 * ASSUMED["long_forward"] + (trains + evaluates + rotates) * g
    if a.paper_bench:
        paper_rounds = 2 * (a.bench_repeats + 1) * MEASURED["bench_round"]  # its two lengths
        parts["paper profile"] = n * paper_rounds + (trains + evaluates) * 3 * cached
    return {"parts": {p: round(s, 1) for p, s in parts.items()}, "total_s": round(sum(parts.values()), 1),
            "assumed": ASSUMED, "measured": MEASURED, "kinds": k}


def estimate_lines(e: dict, budget: float | None) -> list[str]:
    """The estimate as printed before the check starts."""
    parts = ", ".join(f"{p} {s:.0f} s" for p, s in e["parts"].items())
    flex = f"FlexAttention trains {len(e['kinds']['trains'])} schemes and evaluates {len(e['kinds']['evaluates'])} more"
    lines = [f"estimated time on one H200: {e['total_s']:.0f} s ({parts}); {flex}",
             f"  assumed until measured: {e['assumed']}"]
    if budget is not None:
        lines.append(f"  budget {budget:.0f} s: a part not started by then is reported as not run")
    return lines
