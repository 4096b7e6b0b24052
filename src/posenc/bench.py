"""Speed and memory of every positional scheme, against ``none`` and x-transformers.

``python -m posenc.bench`` measures, in ONE process, for every scheme in
``conf/encoding/*.yaml`` (discovered at run time) and every length T:

* training-step time (forward + backward + AdamW step) and evaluation time
  (``eval()`` mode, forward under ``no_grad``), as tokens/s;
* the ratio of each to the ``none`` scheme of the same model in the same run;
* peak memory of a training step, and its ratio to ``none``;
* FLOP/s as a fraction of this machine's matmul peak, measured in the same run;
* the same for x-transformers (optional ``[bench]`` extra) at identical sizes
  for the schemes it shares, and the posenc / x-transformers ratios.

Workload. ``model=small`` (``--model`` picks another ``conf/model`` file),
composed by Hydra from ``conf/train.yaml`` exactly as a training run is, causal
language modelling (``task=lm``), random token ids from a ``--vocab-size``
vocabulary, a fixed token budget per batch: ``batch = max(1, tokens_per_batch
// T)``, so every length does about the same dense work and T=4096 fits on a
CPU. ``model.max_len`` is raised to the longest benchmarked length so that the
table-based schemes (``learned``, ``tupe``) accept it. CPU: fp32. CUDA (when
present): bf16 autocast, fp32 weights and optimiser.

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

Memory, CPU. Each (model, T) is measured in a fresh process, forked from a fork
server that has only imported torch and posenc (so its heap holds no tensors
from the benchmark, and a probe costs no interpreter start): build the model
and AdamW, run one training step and one evaluation forward at T=1 (this
allocates the gradients, the AdamW state and any lazily built caches), record
the resident set size (``VmRSS``) as the baseline, reset the kernel's peak-RSS
counter (``echo 5 > /proc/self/clear_refs`` sets ``VmHWM`` to the current
RSS), run one training step at T and read ``VmHWM``. Reported: peak minus
baseline, i.e. what a training step at T needs on top of the weights,
gradients and optimiser state (activations, attention masks and biases,
autograd buffers, temporaries). Where ``clear_refs`` cannot be written the
peak comes from ``ru_maxrss`` (not resettable, so it also covers the T=1
warm-up, which is negligible) and the JSON says so. RSS counts pages, not
bytes requested: allocator caching and transparent huge pages make small
numbers (the tiny CI model) coarse; at T >= 256 on ``small`` the step's tensors
dominate. ``--memory-lengths`` limits the probes to some lengths.
``python -m posenc.bench --memory-probe SCHEME T`` runs one probe by hand and
prints its JSON. CUDA: in the benchmark process,
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
``memory_allocated`` before the step.

Memory cap. On CPU the benchmark process (during timing) and every probe cap
their address space at their size plus ``--max-memory-gb`` (default: half of
``MemAvailable``), so a scheme that needs more than the machine has fails with
an allocation error -- reported as that (scheme, T) "out of memory" -- instead
of waking the OOM killer, which may pick another user's job.

T^2 growth. "T² floats/pair" is, at the longest probed length, the memory a
scheme needs beyond ``none`` (which attends with the flash kernel and keeps no
T x T tensor) per layer, sequence and query-key pair, in fp32 values:
(mem - mem_none) / (4 bytes * n_layers * B * T^2). Each (B, H, T, T) tensor
alive at the peak adds about H; a (B, T, T, D) tensor would add about D. The
target "no memory growing like T^2 * D" is read as a value at most D/4.
(A (1, H, T, T) bias shared by the batch adds H / B; at the longest length B
is usually 1.)

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
the matmul weights of the blocks plus the tied output head (V d), L layers, d
the width (a test checks this); the JSON holds both. "FLOP/s % peak" is counted
training FLOPs / best step time / peak, where the peak is the best FLOP/s of a
2048x2048 fp32 matmul (8192x8192 bf16 on CUDA), timed in the same run, with
the same threads, before each length's rounds and once at the end.

x-transformers (``pip install x-transformers``; skipped with a note when
missing or with ``--no-xtransformers``). ``TransformerWrapper`` + ``Decoder``
with the same dim, depth, heads, head dim, ff inner width (``ff_mult = d_ff /
d_model``), vocabulary, causal attention and tied output embedding; PyTorch
SDPA (``attn_flash=True``) wherever x-transformers allows it (it refuses it
for the T5 bias). Shared schemes, by name: none (``use_abs_pos_emb=False``),
sinusoidal (``scaled_sinu_pos_emb=True``: x-transformers' only fixed sinusoid,
with one learned scale), learned (``use_abs_pos_emb=True``), rope
(``rotary_pos_emb``, ``rotary_emb_dim`` = the rotated width of posenc's rope),
xpos (``rotary_xpos``), alibi (``alibi_pos_bias``), t5_bias (``rel_pos_bias``
with the same buckets). Remaining differences: x-transformers projects q, k, v
separately, without biases, and its LayerNorm has no bias; posenc fuses qkv.

Outputs (``--out-dir``, default ``results/bench``; each file written to a
temporary file and moved into place): ``bench.json`` (settings, environment,
every raw timing, memory probe and FLOP count, the summary, the targets),
``bench.md`` (the tables, also printed), ``bench.png`` / ``bench.svg`` (step
time and peak memory relative to ``none``, one hue per T, with the per-round
ratios as dots).

``--tiny`` is a configuration for CI that runs in seconds of compute (d_model
32, 2 layers, 2 heads, d_ff 64, vocab 256, T in {32, 64}, 128 tokens per
batch, 1 round).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

#: the order of the tables; schemes found in conf/encoding but not listed here follow, sorted
DEFAULT_ORDER = (
    "none",
    "sinusoidal",
    "learned",
    "cape",
    "rope",
    "xpos",
    "alibi",
    "t5_bias",
    "kerple",
    "fire",
    "tupe",
    "shaw",
    "skew",
    "transformer_xl",
    "fixed_bidirectional",
)
POSENC, XT = "posenc", "x-transformers"
TINY_MODEL = {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64}

# targets of the performance issue (reported, never asserted)
TARGET_LENGTH = 1024
TARGET_STEP_ABS_ROT = 1.05
TARGET_STEP_BIAS = 1.25
TARGET_MEM_BIAS = 1.5


# ----------------------------------------------------------------- settings


@dataclass
class Settings:
    schemes: list[str]
    lengths: list[int]
    repeats: dict[int, int]
    warmup: dict[int, int]
    tokens_per_batch: int = 4096
    vocab_size: int = 4096
    model_name: str = "small"
    model: dict[str, Any] = field(default_factory=dict)
    encodings: dict[str, dict[str, Any]] = field(default_factory=dict)
    out_dir: str = "results/bench"
    memory: bool = True
    memory_lengths: list[int] | None = None
    xtransformers: bool = True
    tiny: bool = False
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None
    max_memory_gb: float | None = None
    progress: bool = True

    def batch(self, T: int) -> int:
        return max(1, self.tokens_per_batch // T)


def discover_schemes(conf_dir: Path = CONF_DIR) -> list[str]:
    """Every ``conf/encoding/*.yaml``, in ``DEFAULT_ORDER`` first, then sorted."""
    found = {p.stem for p in (conf_dir / "encoding").glob("*.yaml")}
    return [s for s in DEFAULT_ORDER if s in found] + sorted(found - set(DEFAULT_ORDER))


def compose_configs(model_name: str, schemes: list[str], max_length: int, tiny: bool) -> tuple[dict, dict]:
    """(model config, {scheme: its ``encoding.scheme`` node}) as plain dicts,
    composed by Hydra from ``conf/train.yaml`` with ``model=<name>`` and
    ``encoding=<scheme>`` exactly as a training run would (schemas and
    defaults lists included). ``model.max_len`` is raised to the longest
    benchmarked length; ``--tiny`` overrides the sizes. The memory probes get
    these dicts, so they never read config files."""
    from hydra import compose, initialize_config_dir

    from . import train  # noqa: F401 - registers the config schemas in Hydra's ConfigStore

    encodings: dict[str, dict] = {}
    model: dict[str, Any] = {}
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for sch in schemes:
            cfg = compose("train", overrides=[f"model={model_name}", f"encoding={sch}", "task=lm"])
            encodings[sch] = OmegaConf.to_container(cfg.encoding.scheme, resolve=True)
            model = OmegaConf.to_container(cfg.model, resolve=True)
    model = {k: v for k, v in model.items() if k != "_target_"}
    if tiny:
        model.update(TINY_MODEL)
    model["max_len"] = max(int(model.get("max_len", 0)), max_length)
    model["dropout"] = 0.0
    return model, encodings


# ------------------------------------------------------------------ models


def build_posenc(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    """The causal Transformer with scheme node ``enc`` (``_target_``, ``_partial_``) at ``model_cfg``.

    Same construction as ``posenc.module.build_model`` (ModelConfig + the
    instantiated partial scheme) without importing ``posenc.module``, so the
    memory probes do not pay for importing Lightning.
    """
    from hydra.utils import instantiate

    from .model import ModelConfig, Transformer

    factory = instantiate(enc)
    return Transformer(ModelConfig(vocab_size=vocab_size, causal=True, **model_cfg), factory)


def xtransformers_version() -> str | None:
    try:
        from importlib.metadata import version

        import x_transformers  # noqa: F401

        return version("x-transformers")
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return None


#: the x-transformers twins exist for these configs, when they still name these classes
XT_SHARED = {
    "none": "NoPE",
    "sinusoidal": "Sinusoidal",
    "learned": "Learned",
    "rope": "RoPE",
    "xpos": "XPos",
    "alibi": "ALiBi",
    "t5_bias": "T5Bias",
}


def xt_kwargs(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any]) -> tuple[dict, dict] | None:
    """(wrapper kwargs, decoder kwargs) of the x-transformers twin, None if not shared."""
    if scheme not in XT_SHARED or str(enc.get("_target_", "")).rsplit(".", 1)[-1] != XT_SHARED[scheme]:
        return None
    head_dim = model_cfg["d_model"] // model_cfg["n_heads"]
    wrap, layers = {"use_abs_pos_emb": False}, {"attn_flash": True}
    if scheme == "none":
        pass
    elif scheme == "sinusoidal":
        wrap = {"use_abs_pos_emb": True, "scaled_sinu_pos_emb": True}
    elif scheme == "learned":
        wrap = {"use_abs_pos_emb": True}
    elif scheme == "rope":
        rot = round(head_dim * float(enc.get("fraction", 1.0)))
        layers.update(rotary_pos_emb=True, rotary_emb_dim=rot)
    elif scheme == "xpos":
        layers.update(
            rotary_xpos=True, rotary_emb_dim=head_dim, rotary_xpos_scale_base=float(enc.get("scale_base", 512))
        )
    elif scheme == "alibi":
        layers.update(alibi_pos_bias=True)
    elif scheme == "t5_bias":
        layers.update(
            rel_pos_bias=True,
            rel_pos_num_buckets=int(enc.get("num_buckets", 32)),
            rel_pos_max_distance=int(enc.get("max_distance", 128)),
            attn_flash=False,  # x-transformers refuses flash with the T5 bias
        )
    else:
        return None
    return wrap, layers


def build_xt(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    kw = xt_kwargs(scheme, enc, model_cfg)
    if kw is None:
        raise ValueError(f"x-transformers has no counterpart of {scheme}")
    wrap, layers = kw
    d, ff = model_cfg["d_model"], model_cfg["d_ff"]
    dec = Decoder(
        dim=d,
        depth=model_cfg["n_layers"],
        heads=model_cfg["n_heads"],
        attn_dim_head=d // model_cfg["n_heads"],
        ff_mult=ff / d,
        verbose=False,
        **layers,
    )
    return TransformerWrapper(
        num_tokens=vocab_size, max_seq_len=model_cfg["max_len"], attn_layers=dec, tie_embedding=True, **wrap
    )


def build_unit(impl: str, scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    return (build_posenc if impl == POSENC else build_xt)(scheme, enc, model_cfg, vocab_size)


def palm_flops_per_token(model_cfg: dict[str, Any], vocab_size: int, T: int) -> float:
    """PaLM appendix B, training: 6 N + 12 L T d per token, N = block matmuls + tied head."""
    d, L, ff = model_cfg["d_model"], model_cfg["n_layers"], model_cfg["d_ff"]
    n = L * (4 * d * d + 2 * d * ff) + vocab_size * d
    return 6.0 * n + 12.0 * L * T * d


# --------------------------------------------------------------- the steps


def autocast(device: str):
    if device == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Runner:
    """One model, its AdamW, and its training / evaluation steps."""

    def __init__(self, impl: str, scheme: str, model: nn.Module, device: str):
        self.impl, self.scheme, self.device = impl, scheme, device
        self.model = model.to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, weight_decay=0.1)

    @property
    def key(self) -> tuple[str, str]:
        return self.impl, self.scheme

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with autocast(self.device):
            logits = self.model(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        self.opt.step()

    def eval_step(self, x: torch.Tensor) -> None:
        self.model.eval()
        with torch.no_grad(), autocast(self.device):
            self.model(x)
        self.model.train()

    def timed(self, fn: Callable[[], None]) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        fn()
        sync(self.device)
        return time.perf_counter() - t0


def batch_for(T: int, batch: int, vocab_size: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + T)
    x = torch.randint(vocab_size, (batch, T), generator=g)
    y = torch.randint(vocab_size, (batch, T), generator=g)
    return x.to(device), y.to(device)


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
    """Matmul FLOPs of ``fn()`` (FlopCounterMode, with the CPU flash formulas added)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_flop_mapping()) as counter:
        fn()
    return int(counter.get_total_flops())


FLOP_FIT_LENGTHS = (16, 32, 48)
FLOP_CHECK_LENGTH = 64


def _quadratic(points: list[tuple[int, int]]) -> Callable[[int], float]:
    """The quadratic through three (T, flops) points (Lagrange form)."""
    (a, fa), (b, fb), (c, fc) = points

    def f(t: int) -> float:
        return (
            fa * (t - b) * (t - c) / ((a - b) * (a - c))
            + fb * (t - a) * (t - c) / ((b - a) * (b - c))
            + fc * (t - a) * (t - b) / ((c - a) * (c - b))
        )

    return f


def flop_model(r: Runner, vocab_size: int, seed: int) -> dict[str, Any]:
    """Per-sequence training and evaluation FLOPs as a function of T.

    Matmul FLOPs of one sequence are a polynomial of degree <= 2 in T for every
    scheme here (projections and MLPs: T; q k^T, p v, T x T biases and relative
    logits: T^2), and batch-linear. So they are counted exactly at three short
    lengths, the quadratic through them is checked against an exact count at a
    fourth length, and evaluated at the benchmarked T (times the batch). This
    avoids a full step at T=4096 under the counter. ``exact`` is False, and the
    FLOP columns stay empty, if the check fails.
    """
    out: dict[str, Any] = {}
    for mode in ("train", "eval"):

        def count(T: int, mode=mode) -> int:
            x, y = batch_for(T, 1, vocab_size, r.device, seed)
            return count_flops(lambda: r.train_step(x, y) if mode == "train" else r.eval_step(x))

        pts = [(t, count(t)) for t in FLOP_FIT_LENGTHS]
        f = _quadratic(pts)
        check = count(FLOP_CHECK_LENGTH)
        out[mode] = {"points": pts + [(FLOP_CHECK_LENGTH, check)], "exact": abs(f(FLOP_CHECK_LENGTH) - check) < 0.5}
        out[mode]["fn"] = f
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


# ------------------------------------------------------------------ memory


def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss_bytes(resettable: bool) -> int:
    kb = _status_kb("VmHWM") if resettable else None
    if kb is None:  # ru_maxrss is in KiB on Linux, bytes on macOS
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r if sys.platform == "darwin" else r * 1024
    return kb * 1024


def default_memory_budget_gb() -> float:
    """Half of what the kernel reports as available now."""
    kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    kb = int(line.split()[1])
    except OSError:
        pass
    if kb is None:
        import psutil

        kb = psutil.virtual_memory().available // 1024
    return round(0.5 * kb / 2**20, 1)


def limit_memory(budget_gb: float | None) -> tuple[int, int] | None:
    """Cap this process's address space at its current size + ``budget_gb``.

    On a shared machine a scheme whose memory grows like T^2 * width can ask
    for more than the machine has; with the cap the allocation fails with a
    RuntimeError (reported as that scheme's failure at that length) instead of
    waking the kernel's OOM killer, which may pick someone else's job.
    Returns the previous limits for ``restore_memory_limit`` (None: unchanged).
    """
    if not budget_gb or sys.platform != "linux":
        return None
    vm = _status_kb("VmSize")
    if vm is None:
        return None
    old = resource.getrlimit(resource.RLIMIT_AS)
    new = vm * 1024 + int(budget_gb * 2**30)
    if old[1] != resource.RLIM_INFINITY:
        new = min(new, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (new, old[1]))
    return old


def restore_memory_limit(old: tuple[int, int] | None) -> None:
    if old is not None:
        resource.setrlimit(resource.RLIMIT_AS, old)


def memory_probe(
    impl: str,
    scheme: str,
    T: int,
    batch: int,
    enc: dict[str, Any],
    model_cfg: dict[str, Any],
    vocab_size: int,
    seed: int,
    threads: int | None = None,
    max_memory_gb: float | None = None,
) -> dict[str, Any]:
    """Peak memory of one training step at T above the state after a T=1
    warm-up (see the module docstring). Run it in a fresh process on CPU."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    runner = Runner(impl, scheme, build_unit(impl, scheme, enc, model_cfg, vocab_size), "cpu")
    limit_memory(max_memory_gb)
    x1, y1 = batch_for(1, 1, vocab_size, "cpu", seed)
    runner.train_step(x1, y1)
    runner.eval_step(x1)
    x, y = batch_for(T, batch, vocab_size, "cpu", seed)
    del x1, y1
    gc.collect()
    base = _rss_bytes()
    resettable = _reset_peak_rss()
    runner.train_step(x, y)
    train_peak = _peak_rss_bytes(resettable) - base
    return {
        "impl": impl,
        "scheme": scheme,
        "T": T,
        "batch": batch,
        "baseline_rss": base,
        "train_peak": max(0, train_peak),
        "method": "VmHWM after clear_refs" if resettable else "ru_maxrss (not reset; includes the T=1 warm-up)",
    }


def _probe_job(args: tuple) -> dict[str, Any]:
    try:
        return memory_probe(*args)
    except Exception as e:  # noqa: BLE001 - reported in the results, the run goes on
        return _error(args[0], args[1], args[2], e)


def probe_memory_cpu(jobs: list[tuple], on_done: Callable[[], None]) -> list[dict[str, Any]]:
    """Each job in a fresh process forked from a fork server that has imported
    torch and posenc only (cheap start, clean heap)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "posenc.model", "posenc.encodings", "posenc.bench", "x_transformers"])
    results = []
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1) as pool:
        for job in jobs:
            try:
                results.append(pool.submit(_probe_job, job).result())
            except Exception as e:  # noqa: BLE001 - e.g. the child was killed
                results.append(_error(job[0], job[1], job[2], e))
            on_done()
    return results


def probe_memory_cuda(runner: Runner, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    runner.train_step(x, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return {
        "impl": runner.impl,
        "scheme": runner.scheme,
        "T": x.shape[1],
        "batch": x.shape[0],
        "baseline_allocated": base,
        "train_peak": peak,
        "method": "cuda max_memory_allocated",
    }


# -------------------------------------------------------------------- run


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc="bench", file=sys.stderr, dynamic_ncols=True)


def _error(impl: str, scheme: str, T: int | None, e: BaseException) -> dict[str, Any]:
    return {"impl": impl, "scheme": scheme, "T": T, "error": f"{type(e).__name__}: {e}"[:500]}


def run_benchmark(s: Settings) -> dict[str, Any]:
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
    def __init__(self, s: Settings):
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
                fm = flop_model(r, s.vocab_size, s.seed)
            except Exception as e:  # noqa: BLE001 - FLOPs are best effort
                self.note(f"cannot count FLOPs of {impl} {sch}: {type(e).__name__}: {e}")
                continue
            for T in s.lengths:
                row = {"impl": impl, "scheme": sch, "T": T, "batch": s.batch(T)}
                for mode in ("train", "eval"):
                    ok = fm[mode]["exact"]
                    row[mode] = round(s.batch(T) * fm[mode]["fn"](T)) if ok else None
                    row[f"{mode}_points"] = fm[mode]["points"]
                if not (fm["train"]["exact"] and fm["eval"]["exact"]):
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


def _classes(s: Settings) -> dict[str, str]:
    """'absolute/rotary' (changes the embeddings or q, k only) or 'bias' (adds to
    the logits or the output), from the scheme's own flags."""
    from hydra.utils import instantiate

    out = {}
    for sch in s.schemes:
        try:
            d, h = s.model["d_model"], s.model["n_heads"]
            scheme = instantiate(s.encodings[sch])(d_model=d, n_heads=h, max_len=8, causal=True)
            out[sch] = "bias" if (scheme.has_bias or scheme.uses_value_term) else "absolute/rotary"
        except Exception:  # noqa: BLE001 - the failure shows up where the scheme is built for real
            out[sch] = "?"
    return out


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(s: Settings, xt_version: str | None) -> dict[str, Any]:
    dev = torch.cuda.get_device_name() if s.device == "cuda" else _cpu_name()
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
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "command": " ".join([Path(sys.executable).name, "-m", "posenc.bench", *sys.argv[1:]]),
    }


# ---------------------------------------------------------------- summary


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _paired(a: dict[int, float], b: dict[int, float]) -> float | None:
    common = [a[r] / b[r] for r in a if r in b and b[r] > 0]
    return statistics.median(common) if common else None


def summarize(res: dict[str, Any], s: Settings) -> list[dict[str, Any]]:
    model_cfg = s.model
    times: dict[tuple[str, str, int], dict[str, dict[int, float]]] = {}
    for r in res["raw"]:
        t = times.setdefault((r["impl"], r["scheme"], r["T"]), {"train": {}, "eval": {}})
        t["train"][r["round"]] = r["train_s"]
        t["eval"][r["round"]] = r["eval_s"]
    mem = {(m["impl"], m["scheme"], m["T"]): m for m in res["memory"]}
    fl = {(f["impl"], f["scheme"], f["T"]): f for f in res["flops"]}
    peak = res["peak"]["flops_per_s"]
    L = model_cfg["n_layers"]
    rows = []
    for (impl, sch, T), t in times.items():
        B = s.batch(T)
        tokens = B * T
        tr, ev = list(t["train"].values()), list(t["eval"].values())
        row: dict[str, Any] = {
            "impl": impl,
            "scheme": sch,
            "class": res["classes"].get(f"{impl}:{sch}", "x-transformers" if impl == XT else "?"),
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
        base = times.get((impl, "none", T))
        if base:
            row["step_ratio"] = _ratio(min(tr), min(base["train"].values()))
            row["step_ratio_paired_median"] = _paired(t["train"], base["train"])
            row["eval_ratio"] = _ratio(min(ev), min(base["eval"].values()))
            row["eval_ratio_paired_median"] = _paired(t["eval"], base["eval"])
        m, m0 = mem.get((impl, sch, T)), mem.get((impl, "none", T))
        if m:
            row["mem_train_bytes"] = m["train_peak"]
            if m0:
                row["mem_ratio"] = _ratio(m["train_peak"], m0["train_peak"])
        f = fl.get((impl, sch, T))
        if f and f.get("train"):
            row["flops_train"] = f["train"]
            row["flops_eval"] = f["eval"]
            row["train_flops_per_s"] = f["train"] / min(tr)
            row["train_peak_fraction"] = f["train"] / min(tr) / peak
        row["flops_train_palm"] = palm_flops_per_token(model_cfg, s.vocab_size, T) * tokens
        row["palm_peak_fraction"] = row["flops_train_palm"] / min(tr) / peak
        if impl == POSENC and (XT, sch, T) in times:
            xt = times[(XT, sch, T)]
            row["xt_step_ratio"] = _ratio(min(tr), min(xt["train"].values()))
            row["xt_step_ratio_paired_median"] = _paired(t["train"], xt["train"])
            row["xt_eval_ratio"] = _ratio(min(ev), min(xt["eval"].values()))
            mx = mem.get((XT, sch, T))
            if m and mx:
                row["xt_mem_ratio"] = _ratio(m["train_peak"], mx["train_peak"])
        rows.append(row)
    # rows for what failed (out of memory, an exception in a scheme)
    have = {(r["impl"], r["scheme"], r["T"]) for r in rows}
    for e in res["errors"]:
        key = (e["impl"], e["scheme"], e.get("T"))
        if key[2] is not None and key not in have:
            cls = res["classes"].get(f"{key[0]}:{key[1]}", "x-transformers" if key[0] == XT else "?")
            rows.append(
                {
                    "impl": key[0],
                    "scheme": key[1],
                    "class": cls,
                    "T": key[2],
                    "batch": s.batch(key[2]),
                    "failed": e["error"],
                }
            )
            have.add(key)
    # excess over none per layer, sequence and query-key pair at the longest probed length
    by_key = {(r["impl"], r["scheme"], r["T"]): r for r in rows}
    for impl, sch in {(k[0], k[1]) for k in mem}:
        T = max(t for (i, sc, t) in mem if (i, sc) == (impl, sch))
        base, row = mem.get((impl, "none", T)), by_key.get((impl, sch, T))
        if base and row:
            excess = mem[(impl, sch, T)]["train_peak"] - base["train_peak"]
            row["t2_floats_per_pair"] = excess / (4.0 * L * s.batch(T) * T * T)
    order = {sch: i for i, sch in enumerate(s.schemes)}
    rows.sort(key=lambda r: (r["T"], r["impl"] != POSENC, order.get(r["scheme"], 99)))
    return rows


def evaluate_targets(rows: list[dict[str, Any]], s: Settings) -> list[dict[str, Any]]:
    """The issue's targets at T=1024 (or the length closest to it), one entry per check.

    absolute/rotary: step time <= 1.05 x none; bias: step time <= 1.25 x none
    and peak memory <= 1.5 x none; every shared scheme: posenc step time <=
    x-transformers'; every scheme: memory growth not T^2 * D-like (fewer than
    D/4 fp32 values kept per layer per query-key pair). A (scheme, T) that
    failed does not meet its targets.
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
            limit = TARGET_STEP_ABS_ROT if r["class"] == "absolute/rotary" else TARGET_STEP_BIAS
            out.append(_target(r, T, "step", r.get("step_ratio"), limit))
            if r["class"] == "bias" and s.memory and (r.get("mem_ratio") is not None or "failed" in r):
                out.append(_target(r, T, "memory", r.get("mem_ratio"), TARGET_MEM_BIAS))
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
    "step": "step / none (abs/rot <= 1.05, bias <= 1.25)",
    "memory": "mem / none (bias <= 1.5)",
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


def markdown(res: dict[str, Any]) -> str:
    meta, rows = res["meta"], res["summary"]
    st = meta["settings"]
    mc = st["model"]
    lines = [
        "## Speed and memory of the schemes",
        "",
        f"`{meta['command']}` on {meta['device_name']} ({meta['cpu_count']} CPUs, {meta['torch_threads']} torch "
        f"threads), torch {meta['torch']}, {meta['dtype']}, {meta['created']}. Model {_model_label(st)} "
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
            "training step. FLOP/s % peak: counted training FLOPs / step time / matmul peak."
        ),
        "",
        (
            "| scheme | class | T | batch | train ktok/s | eval ktok/s | step / none | eval / none | "
            "train mem MiB | mem / none | FLOP/s % peak | posenc / x-t step |"
        ),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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
            f"{_fmt(r.get('xt_step_ratio'))} ({_fmt(r.get('xt_step_ratio_paired_median'))}) |"
        )
    xt_rows = [r for r in rows if r["impl"] == XT]
    if xt_rows:
        lines += [
            "",
            f"x-transformers {meta['x_transformers']} at the same sizes (posenc / x-t below 1: posenc is faster):",
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
    slopes = [r for r in rows if r.get("t2_floats_per_pair") is not None and r["impl"] == POSENC]
    slopes.sort(key=lambda r: list(res["meta"]["settings"]["schemes"]).index(r["scheme"]))
    if slopes:
        lines += [
            "",
            f"Memory beyond `none` at T={slopes[0]['T']}, in fp32 values per layer, sequence and query-key pair "
            f"(about H = {mc['n_heads']} per (B, H, T, T) tensor; a T²·D term would give about D = {mc['d_model']}): "
            + ", ".join(
                f"{r['scheme']} {r['t2_floats_per_pair']:.1f}" + (f" (T={r['T']})" if r["T"] != slopes[0]["T"] else "")
                for r in slopes
            )
            + ".",
        ]
    if res["targets"]:
        lines += targets_markdown(res["targets"], mc["d_model"])
    if res["errors"]:
        lines += ["", "Failures:", ""]
        lines += [f"- {e['impl']} {e['scheme']} T={e.get('T')}: {e['error']}" for e in res["errors"]]
    for n in res["notes"]:
        lines += ["", f"Note: {n}"]
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str) -> None:
    _atomic_write(path, lambda p: p.write_text(text))


def plot(res: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    rows = [r for r in res["summary"] if r["impl"] == POSENC and r.get("step_ratio") is not None]
    if not rows:
        return []
    df = pd.DataFrame(rows)
    order = list(dict.fromkeys(df["scheme"]))
    # per-round paired ratios as dots
    base = {(r["T"], r["round"]): r["train_s"] for r in res["raw"] if r["impl"] == POSENC and r["scheme"] == "none"}
    dots = pd.DataFrame(
        [
            {"scheme": r["scheme"], "T": r["T"], "ratio": r["train_s"] / base[(r["T"], r["round"])]}
            for r in res["raw"]
            if r["impl"] == POSENC and (r["T"], r["round"]) in base
        ]
    )
    panels = [("step_ratio", "training-step time / none")]
    if "mem_ratio" in df and df["mem_ratio"].notna().any():
        panels.append(("mem_ratio", "peak training memory / none"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(7, 0.75 * len(order) + 2), 3.6 * len(panels)), squeeze=False)
    for ax, (col, label) in zip(axes[:, 0], panels, strict=True):
        sns.barplot(data=df, x="scheme", y=col, hue="T", order=order, palette="viridis", ax=ax)
        if col == "step_ratio" and not dots.empty:
            sns.stripplot(
                data=dots,
                x="scheme",
                y="ratio",
                hue="T",
                order=order,
                dodge=True,
                palette="dark:k",
                size=3,
                ax=ax,
                legend=False,
            )
            ax.axhline(TARGET_STEP_ABS_ROT, ls=":", c="tab:green", lw=1, label=f"{TARGET_STEP_ABS_ROT}× (abs/rot)")
            ax.axhline(TARGET_STEP_BIAS, ls="--", c="tab:orange", lw=1, label=f"{TARGET_STEP_BIAS}× (bias)")
        if col == "mem_ratio":
            ax.axhline(TARGET_MEM_BIAS, ls="--", c="tab:orange", lw=1, label=f"{TARGET_MEM_BIAS}× (bias)")
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.axhline(1.0, c="k", lw=0.8)
        ax.set_ylabel(label)
        ax.set_xlabel("")
        ax.tick_params(axis="x", rotation=35)
        for t in ax.get_xticklabels():
            t.set_ha("right")
        ax.legend(title="T", fontsize=8, ncol=2)
    meta = res["meta"]
    axes[0, 0].set_title(
        f"posenc, model {_model_label(meta['settings']).replace('`', '')}, {meta['dtype']}, {meta['device_name']} "
        f"(bars: best/best, dots: per round)",
        fontsize=9,
    )
    fig.tight_layout()
    paths = []
    for ext in ("png", "svg"):
        p = out_dir / f"bench.{ext}"
        _atomic_write(p, lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=150))
        paths.append(p)
    plt.close(fig)
    return paths


def write_outputs(res: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md = markdown(res)
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md"}
    write_text(paths["json"], json.dumps(res, indent=1, default=str) + "\n")
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


def settings_from_args(a: argparse.Namespace) -> Settings:
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
    return Settings(
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
    s = Settings(**st)
    res["meta"]["settings"] = asdict(s)
    res["summary"] = summarize(res, s)
    res["targets"] = evaluate_targets(res["summary"], s)
    paths = write_outputs(res, out_dir or path.parent)
    print(markdown(res))
    return paths


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
