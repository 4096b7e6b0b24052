"""The benchmarked models: posenc's causal Transformer (or its x-transformers twin),
its AdamW and its training / evaluation steps, and the random batches they run on
(the workload is described in ``posenc.bench.config``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import POSENC, VALUE_TERM, BenchSettings
from .xtransformers import build_xt

# ------------------------------------------------------------------ models


def build_posenc(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    """The causal Transformer with scheme node ``enc`` (``_target_``, ``_partial_``) at
    ``model_cfg``, built as training builds it (``posenc.config.build_model``, which does
    not import Lightning, so the memory probes do not pay for it)."""
    from ..config import build_model

    return build_model({"model": model_cfg, "encoding": {"scheme": enc}, "task": {"causal": True}}, vocab_size)


def build_unit(impl: str, scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    return (build_posenc if impl == POSENC else build_xt)(scheme, enc, model_cfg, vocab_size)


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


def _error(impl: str, scheme: str, T: int | None, e: BaseException) -> dict[str, Any]:
    return {"impl": impl, "scheme": scheme, "T": T, "error": f"{type(e).__name__}: {e}"[:500]}


def _classes(s: BenchSettings) -> dict[str, str]:
    """'absolute/rotary' (changes the embeddings or q, k only), 'bias' (adds to the
    logits) or 'bias + value term' (also to the output, from the probabilities), from
    the parts the scheme defines."""
    from hydra.utils import instantiate

    out = {}
    for sch in s.schemes:
        try:
            d, h = s.model["d_model"], s.model["n_heads"]
            scheme = instantiate(s.encodings[sch])(d_model=d, n_heads=h, max_len=8, causal=True)
            out[sch] = VALUE_TERM if scheme.uses_value_term else "bias" if scheme.has_bias else "absolute/rotary"
        except Exception:  # noqa: BLE001 - the failure shows up where the scheme is built for real
            out[sch] = "?"
    return out
