"""When the ``flex`` route may be taken: the setting ``attention.route``, the gates of
``auto`` (torch, the GPU, the head dims, Triton, dynamo) and the probe that runs once per
kind of call before the route is trusted with it."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import Tensor

from ..encodings.base import PositionalScheme
from .blocks import masked_attention, with_causal

#: ``attention.route``: ``auto`` takes FlexAttention where the gates and the probe allow it,
#: ``flex`` wherever a scheme's bias has its form (no gate, no probe; a failure raises),
#: ``masked`` never (the float-mask routes). The default comes from POSENC_ATTENTION_ROUTE (a
#: process without a config: the benchmark's), else ``auto``; a run's config sets it.
ROUTE_SETTINGS = ("auto", "flex", "masked")
ENV = "POSENC_ATTENTION_ROUTE"
_setting: list[str] = []

#: the first torch whose compiled FlexAttention gives a tensor read in score_mod its gradient
FLEX_SINCE = "2.6"
#: before it, FlexAttention needs power-of-two head dims (q/k and v)
ANY_HEAD_DIM_SINCE = "2.8"
#: Triton's least head dim
MIN_HEAD_DIM = 16
#: Ampere on; below it FlexAttention runs ~10x slower than SDPA (V100) or not at all (RTX 2080 Ti)
MIN_CAPABILITY = (8, 0)


def check_route_setting(setting: str) -> str:
    """``setting`` if it is one of ``ROUTE_SETTINGS``; else a ValueError naming them."""
    if setting not in ROUTE_SETTINGS:
        raise ValueError(f"attention.route={setting} must be one of {', '.join(ROUTE_SETTINGS)} (auto: FlexAttention "
                         "where it is gated and probed; masked: never); e.g. attention.route=auto")
    return setting


def route_setting() -> str:
    """The process's ``attention.route`` (``use_route``, else POSENC_ATTENTION_ROUTE, else auto)."""
    return _setting[-1] if _setting else check_route_setting(os.environ.get(ENV) or "auto")


def use_route(setting: str) -> None:
    """Set the process's ``attention.route`` (a run does it from its config)."""
    _setting[:] = [check_route_setting(setting)]


def gate(version: str, capability: tuple[int, int] | None, qk_dim: int, v_dim: int, triton: bool,
         dynamo: bool) -> str | None:
    """Why ``auto`` keeps FlexAttention out of a call, from what it depends on here: the torch
    version string, the GPU's compute capability (None: not a CUDA device), the head dims of
    q and k (with the factors the route appends) and of v, whether Triton and dynamo work;
    None where nothing does. A pure function, tested on stated values (tests/test_flex.py)."""
    from torch.torch_version import TorchVersion

    v = TorchVersion(version)
    if v < FLEX_SINCE:
        return (f"torch {version} is older than {FLEX_SINCE}, whose compiled FlexAttention gives score_mod's "
                "tensors their gradient")
    if capability is None:
        return "not a CUDA device: FlexAttention has no backward for q, k, v on the CPU, and an unfused forward"
    if tuple(capability) < MIN_CAPABILITY:
        return (f"compute capability {capability[0]}.{capability[1]} is below {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                "(FlexAttention runs ~10x slower than SDPA on a V100 and not at all on an RTX 2080 Ti)")
    if not triton:
        return "Triton is not available: the compiled FlexAttention is a Triton kernel"
    if not dynamo:
        return "torch.compile (dynamo) does not support this Python"
    for name, d in (("q/k", qk_dim), ("v", v_dim)):
        if d < MIN_HEAD_DIM:
            return f"a {name} head dim of {d} is below {MIN_HEAD_DIM}, Triton's least"
        if v < ANY_HEAD_DIM_SINCE and d & (d - 1):
            return (f"a {name} head dim of {d} is not a power of two, which torch {version} needs "
                    f"({ANY_HEAD_DIM_SINCE} does not)")
    return None


def device_gate(device: torch.device, qk_dim: int, v_dim: int) -> str | None:
    """``gate`` with this process's torch, ``device``'s capability, Triton and dynamo."""
    from torch.utils._triton import has_triton

    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return gate(str(torch.__version__), capability, qk_dim, v_dim, has_triton(), torch._dynamo.is_dynamo_supported())


def call_dtype(x: Tensor) -> torch.dtype:
    """The dtype q, k and v take in a call with input ``x``: autocast's where it is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def appended_width(scheme: PositionalScheme, parts, dtype: torch.dtype, device: torch.device) -> int:
    """How many dimensions the flex route appends to q and k for ``scheme`` (its absolute
    factors in ``parts``, and its content factors), from a call at one position."""
    width = parts.factors[0].shape[-1] if parts.factors is not None else 0
    if scheme.factors_content():
        zero = torch.zeros(1, scheme.n_heads, 1, scheme.head_dim, dtype=dtype, device=device)
        pos = torch.zeros(1, dtype=torch.long, device=device)
        width += scheme.content_factors(zero, zero, pos, pos)[0].shape[-1]
    return width


#: the probe's calls (batch, length): 200 positions are one full 128-token block and one in part
#: (where bf16 with a block mask has given NaN in the backward); a second call of another batch
#: and length has torch compile the graph with dynamic sizes, the one later calls reuse, so its
#: compilation (forward and backward) is probed too. And the relative error (of the norm) allowed
#: against the float-mask route in float32, for the output and every gradient
PROBE_SHAPES = ((2, 200), (3, 136))
PROBE_TOL = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def relative_error(a: Tensor, b: Tensor, floor: float = 0.0) -> float:
    """||a - b|| / max(||b||, floor) in float64 (the norm of a - b where both are 0)."""
    a, b = a.double(), b.double()
    den = max(float(b.norm()), floor)
    return float((a - b).norm()) / den if den > 0 else float((a - b).norm())


def gradient_errors(have: dict, want: dict) -> dict:
    """The relative error of each gradient of ``have`` against ``want`` (name -> tensor; those
    missing on either side left out), each over the larger of its own norm and the norm it would
    have were all of ``want`` spread evenly over every entry: a gradient that is zero in exact
    arithmetic (a per-head constant added to every logit of a row, FIRE's last bias, which
    softmax ignores) is rounding noise on both routes, and its own norm is no scale for it."""
    ref = [g.double() for g in want.values() if g is not None]
    total = float(torch.sqrt(sum(g.pow(2).sum() for g in ref))) if ref else 0.0
    count = sum(g.numel() for g in ref)
    return {n: relative_error(a, want[n], total * (want[n].numel() / count) ** 0.5 if count else 0.0)
            for n, a in have.items() if a is not None and want.get(n) is not None}


def probe(attn, flex: Callable[..., Tensor], dtype: torch.dtype, device: torch.device) -> str | None:
    """Small forwards of ``attn``'s scheme (and, with gradients on, backwards) through the flex
    route (``flex(q, k, v, pos)``, the route's own attend) in ``dtype`` and through the
    float-mask route in float32, from the same random q, k, v, at each of ``PROBE_SHAPES``:
    None where the outputs agree (``PROBE_TOL``) and every parameter of the scheme that the
    float-mask route trains gets a gradient that is present, finite and close; else the reason,
    in a few words. Its inputs come from a generator of its own, and its gradients go nowhere:
    the run is not touched."""
    g = torch.Generator(device=device).manual_seed(0)
    for batch, length in PROBE_SHAPES:
        reason = probe_call(attn, flex, dtype, device, g, batch, length)
        if reason is not None:
            return reason
    return None


def probe_call(attn, flex, dtype, device, g: torch.Generator, batch: int, length: int) -> str | None:
    """One call of ``probe`` at ``batch`` x ``length``."""
    sch = attn.scheme
    q, k, v = (torch.randn((batch, sch.n_heads, length, sch.head_dim), generator=g, device=device) for _ in range(3))
    pos = torch.arange(length, device=device)
    tol = PROBE_TOL.get(dtype, 3e-2)
    with torch.autocast(device.type, enabled=False):
        try:
            got = flex(q.to(dtype), k.to(dtype), v.to(dtype), pos).float()
        except Exception as e:  # noqa: BLE001 -- the probe's verdict, not an error of the run
            return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        qr, kr = sch.rotate(q, k, pos, pos)
        mask = with_causal(sch.bias(qr, kr, pos, pos).float(), pos, pos, attn.causal)
        want = masked_attention(qr, kr, v, mask, sch.logit_scale(), False)
    err = relative_error(got, want)
    if not bool(torch.isfinite(got).all()) or not err <= tol:
        return f"its output differs from the float-mask route's by {err:.1e} (relative; {tol:g} allowed in {dtype})"
    return probe_gradients(sch, got, want, tol, g) if torch.is_grad_enabled() else None


def probe_gradients(sch: PositionalScheme, got: Tensor, want: Tensor, tol: float, g: torch.Generator) -> str | None:
    """The probe's gradients: every parameter of ``sch`` that ``want`` (the float-mask route)
    reaches must get a present, finite gradient through ``got`` (the flex route), close to it."""
    named = [(n, p) for n, p in sch.named_parameters() if p.requires_grad]
    if not named:
        return None
    up = torch.randn(got.shape, generator=g, device=got.device)
    try:
        have = torch.autograd.grad(got, [p for _, p in named], up, allow_unused=True)
    except Exception as e:  # noqa: BLE001
        return f"its backward failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    ref = torch.autograd.grad(want, [p for _, p in named], up, allow_unused=True)
    errors = gradient_errors({n: a for (n, _), a in zip(named, have)}, {n: b for (n, _), b in zip(named, ref)})
    for (name, _), a, b in zip(named, have, ref):
        if b is None:
            continue
        if a is None:
            return f"parameter {name} gets no gradient"
        if not bool(torch.isfinite(a).all()):
            return f"parameter {name} gets a gradient that is not finite"
        if not errors[name] <= tol:
            return (f"the gradient of parameter {name} differs from the float-mask route's by {errors[name]:.1e} "
                    "(relative)")
    return None
