"""Rotary schemes: queries and keys are rotated by their positions."""

from __future__ import annotations

import torch
from torch import Tensor

from .base import PositionalScheme


def rotate_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the last dim by angles (..., Dr/2).

    Only the first 2 * angles.shape[-1] features are rotated; the rest pass through.
    """
    dr = angles.shape[-1] * 2
    xr, rest = x[..., :dr], x[..., dr:]
    x1, x2 = xr[..., 0::2], xr[..., 1::2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1)


class RoPE(PositionalScheme):
    """Rotary position embedding (Su et al. 2021, RoFormer, eq. 34).

    Pair i of a head's first ``rotary_dim`` features is rotated by angle
    m * base^(-2i / rotary_dim) at position m, so q_m . k_n depends only on
    m - n (checked in the tests by shifting both positions).

    Args:
        base: the wavelength base (10000 in the paper).
        fraction: the share of each head's features that rotate (1.0 = all,
            0.25 as in GPT-NeoX); the rotated count must be even.
    """

    def __init__(self, *, base: float = 10000.0, fraction: float = 1.0, **kw):
        super().__init__(**kw)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"encoding.scheme.fraction={fraction} must be in (0, 1]")
        rotary_dim = int(round(self.head_dim * fraction))
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"rotary dim {rotary_dim} (head_dim={self.head_dim} x fraction={fraction}) must be "
                "even and positive; change encoding.scheme.fraction or model.d_model / model.n_heads"
            )
        self.base = base
        self.rotary_dim = rotary_dim
        inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def angles(self, pos: Tensor) -> Tensor:
        return pos.to(torch.float32)[:, None] * self.inv_freq  # (T, Dr/2)

    def rotate(self, q, k, q_pos, k_pos):
        return rotate_pairs(q, self.angles(q_pos)), rotate_pairs(k, self.angles(k_pos))
