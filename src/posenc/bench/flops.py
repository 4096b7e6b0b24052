"""Counted and analytic FLOPs of a step, and this machine's matmul peak.

FLOPs. Model FLOPs of one training step (forward + backward; the AdamW update
is elementwise and not counted) and one evaluation forward, counted with
``torch.utils.flop_counter.FlopCounterMode``. PyTorch's counter has no formula
for the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu`` and
its backward); they are added here. Fused-attention backwards are counted
without the recomputation of q k^T that flash kernels do (PyTorch's formula
includes it), so fused and unfused attention count the same work; T^2 terms
are counted in full (no causal halving). Matmul FLOPs of one sequence are a
polynomial of degree <= 2 in T for every scheme here, and batch-linear, so they
are counted at T = 16, 32, 48, checked at T = 64 against the quadratic through
those, and evaluated at the benchmarked T (times the batch): no step at T=4096
runs under the counter. For ``none`` the count equals the analytic model FLOPs
of PaLM (Chowdhery et al. 2022, appendix B), per token 6 N + 12 L T d with N
the matmul weights of the blocks plus the output layer (V d), L layers, d
the width (a test checks this); the JSON holds both. "FLOP/s % peak" is counted
training FLOPs / best step time / peak, where the peak is the best FLOP/s of a
2048x2048 fp32 matmul (8192x8192 bf16 on CUDA), timed in the same run, with
the same threads, before each length's rounds and once at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from .models import Runner, batch_for, sync


def palm_flops_per_token(model_cfg: dict[str, Any], vocab_size: int, T: int) -> float:
    """PaLM appendix B, training: 6 N + 12 L T d per token, N = block matmuls + output layer."""
    d, L, ff = model_cfg["d_model"], model_cfg["n_layers"], model_cfg["d_ff"]
    n = L * (4 * d * d + 2 * d * ff) + vocab_size * d
    return 6.0 * n + 12.0 * L * T * d


# ------------------------------------------------------------------- FLOPs


def _sdpa_fwd_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """q k^T and p v: 2 b h Tq Tk (Dq + Dv)."""
    b, h, tq, dq = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 2 * b * h * tq * tk * (dq + dv)


def _sdpa_bwd_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """dP = dO v^T, dV = P^T dO, dQ = dS k, dK = dS^T q: 4 b h Tq Tk (Dq + Dv) / 2 * 2.

    Model FLOPs: the recomputation of q k^T that flash kernels do in the
    backward (which PyTorch's own formula counts) is left out, so a fused and
    an unfused attention count the same work.
    """
    b, h, tq, dq = query_shape
    tk, dv = key_shape[-2], value_shape[-1]
    return 4 * b * h * tq * tk * (dq + dv)


def _flop_mapping() -> dict:
    """FlopCounterMode formulas: the CPU flash kernel (PyTorch has none) and
    model-FLOP backward formulas for the fused kernels (see ``_sdpa_bwd_flops``)."""
    aten = torch.ops.aten
    out = {}
    for name, fn in (
        ("_scaled_dot_product_flash_attention_for_cpu", _sdpa_fwd_flops),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_bwd_flops),
        ("_scaled_dot_product_flash_attention_backward", _sdpa_bwd_flops),
        ("_scaled_dot_product_efficient_attention_backward", _sdpa_bwd_flops),
        ("_scaled_dot_product_cudnn_attention_backward", _sdpa_bwd_flops),
    ):
        op = getattr(aten, name, None)
        if op is not None:
            out[op] = fn
    return out


def count_flops(fn: Callable[[], None]) -> int:
    """Matmul FLOPs of ``fn()`` (FlopCounterMode, with the CPU flash formulas added).

    Model FLOPs: every attention is counted in full, as the PaLM formula counts
    none's causal one (its fused kernel skips the upper triangle, the count does
    not); so the count runs posenc's causal float-mask forward and its recomputing
    backward without their skipping of later keys (``posenc.attention.blocks.SKIP_LATER_KEYS``;
    the same values), which the timed steps do skip."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..attention import blocks

    skip, blocks.SKIP_LATER_KEYS = blocks.SKIP_LATER_KEYS, False
    try:
        with FlopCounterMode(display=False, custom_mapping=_flop_mapping()) as counter:
            fn()
    finally:
        blocks.SKIP_LATER_KEYS = skip
    return int(counter.get_total_flops())


FLOP_FIT_LENGTHS = (16, 32, 48)
FLOP_CHECK_LENGTH = 64
#: benchmarked lengths up to this are also counted directly (a scheme whose work is not one
#: quadratic in T, FIRE's past its threshold, is counted right there)
FLOP_DIRECT_MAX = 1024


def quadratic_fit(points: list[tuple[int, int]]) -> Callable[[int], float]:
    """The quadratic through three (T, flops) points (Lagrange form)."""
    (a, fa), (b, fb), (c, fc) = points

    def f(t: int) -> float:
        return (
            fa * (t - b) * (t - c) / ((a - b) * (a - c))
            + fb * (t - a) * (t - c) / ((b - a) * (b - c))
            + fc * (t - a) * (t - b) / ((c - a) * (c - b))
        )

    return f


def flop_model(r: Runner, vocab_size: int, seed: int, direct: tuple[int, ...] = ()) -> dict[str, Any]:
    """Per-sequence training and evaluation FLOPs as a function of T.

    Matmul FLOPs of one sequence are a polynomial of degree <= 2 in T for every
    scheme here (projections and MLPs: T; q k^T, p v, T x T biases and relative
    logits: T^2), and batch-linear. So they are counted exactly at three short
    lengths, the quadratic through them is checked against an exact count at a
    fourth length, and evaluated at the benchmarked T (times the batch). This
    avoids a full step at T=4096 under the counter. ``exact`` is False, and the
    FLOP columns stay empty, if the check fails. Lengths in ``direct`` are also
    counted at that length (``counted``), which is what is reported for them: a
    scheme whose work changes form past some length (FIRE's MLP runs on the
    distances below its threshold and on every pair past it) is counted right.
    """
    out: dict[str, Any] = {}
    for mode in ("train", "eval"):

        def count(T: int, mode=mode) -> int:
            x, y = batch_for(T, 1, vocab_size, r.device, seed)
            return count_flops(lambda: r.train_step(x, y) if mode == "train" else r.eval_step(x))

        pts = [(t, count(t)) for t in FLOP_FIT_LENGTHS]
        f = quadratic_fit(pts)
        check = count(FLOP_CHECK_LENGTH)
        out[mode] = {"points": pts + [(FLOP_CHECK_LENGTH, check)], "exact": abs(f(FLOP_CHECK_LENGTH) - check) < 0.5}
        out[mode]["fn"] = f
        out[mode]["counted"] = {T: count(T) for T in direct}
    return out


def matmul_peak(device: str, min_time: float = 0.25, trials: int = 3) -> float:
    """Best FLOP/s of a large square matmul (2048 fp32 on CPU, 8192 bf16 on CUDA)."""
    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (2048, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    sync(device)
    best = 0.0
    for _ in range(trials):
        reps, elapsed = 0, 0.0
        t0 = time.perf_counter()
        while elapsed < min_time:
            a @ b
            reps += 1
            sync(device)
            elapsed = time.perf_counter() - t0
        best = max(best, 2.0 * n**3 * reps / elapsed)
    return best
