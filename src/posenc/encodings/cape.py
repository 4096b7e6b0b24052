"""CAPE: continuous augmented positional embeddings (Likhomanenko et al. 2021)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .absolute import sinusoid
from .base import PositionalScheme


class CAPE(PositionalScheme):
    """Continuous Augmented Positional Embeddings (Likhomanenko et al. 2021,
    "CAPE: Encoding Relative Positions with Continuous Augmented Positional
    Embeddings", section 3): sinusoids of float positions that are randomly
    perturbed in training, so the model cannot memorise absolute positions.

    In training (``self.training``), per sequence of the batch:

        x'_t = lambda * (x_t + Delta + eps_t)

    with a global shift Delta ~ U(-max_global_shift, max_global_shift), a local
    shift eps_t ~ U(-max_local_shift, max_local_shift) per position (at most 0.5,
    so the order is kept) and a global scaling log(lambda) ~
    U(-log max_global_scaling, log max_global_scaling). Each augmentation is off
    when its setting is 0 (scaling: 1). In evaluation the positions are used as
    they are, so CAPE equals ``Sinusoidal`` exactly. Checked against
    ``Sinusoidal`` in evaluation and against the documented range of each
    augmentation in test_cape_eval_equals_sinusoidal_and_train_augments, and
    ``Sinusoidal`` against the formula in test_sinusoidal_embed_vs_formula.

    Args:
        max_global_shift: largest |Delta|, in positions.
        max_local_shift: largest |eps_t|, in positions (<= 0.5).
        max_global_scaling: largest lambda (>= 1; 1 = no scaling).
        base: the sinusoid wavelength base.
    """

    def __init__(
        self,
        *,
        max_global_shift: float = 5.0,
        max_local_shift: float = 0.5,
        max_global_scaling: float = 1.03,
        base: float = 10000.0,
        **kw,
    ):
        super().__init__(**kw)
        if max_global_shift < 0:
            raise ValueError(f"encoding.scheme.max_global_shift={max_global_shift} must be >= 0")
        if not 0 <= max_local_shift <= 0.5:
            raise ValueError(
                f"encoding.scheme.max_local_shift={max_local_shift} must be in [0, 0.5] so positions keep their order"
            )
        if max_global_scaling < 1:
            raise ValueError(f"encoding.scheme.max_global_scaling={max_global_scaling} must be >= 1")
        self.max_global_shift, self.max_local_shift = max_global_shift, max_local_shift
        self.max_global_scaling, self.base = max_global_scaling, base

    def augment(self, pos: Tensor, batch: int) -> Tensor:
        """Float positions (batch, T) with the three training augmentations."""
        p = pos.to(torch.float64)[None].expand(batch, -1)
        dev = pos.device

        def uniform(shape, half_width):
            return (torch.rand(shape, dtype=torch.float64, device=dev) * 2 - 1) * half_width

        if self.max_global_shift > 0:
            p = p + uniform((batch, 1), self.max_global_shift)
        if self.max_local_shift > 0:
            p = p + uniform(p.shape, self.max_local_shift)
        if self.max_global_scaling > 1:
            p = p * torch.exp(uniform((batch, 1), math.log(self.max_global_scaling)))
        return p

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if not self.training:
            return sinusoid(pos, self.d_model, self.base).to(x.dtype)  # (T, D)
        return sinusoid(self.augment(pos, x.shape[0]), self.d_model, self.base).to(x.dtype)  # (B, T, D)

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            f", max_global_shift={self.max_global_shift}, max_local_shift={self.max_local_shift}, "
            f"max_global_scaling={self.max_global_scaling}"
        )
