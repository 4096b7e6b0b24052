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


class XPos(PositionalScheme):
    """Rotary embedding with an exponential scale, xPos (Sun et al. 2022, "A
    Length-Extrapolatable Transformer", section 3.2).

    Queries and keys are rotated as in RoPE (pair i, angle m * base^(-2i/d)) and
    pair i is scaled by zeta_i^(m / scale_base) for a query at position m and
    by zeta_i^(-n / scale_base) for a key at n, with
    zeta_i = (2i/d + gamma) / (1 + gamma) in (0, 1). The product then carries
    zeta_i^((m - n) / scale_base): it decays with distance for keys before the
    query and would grow without bound for keys after it, so xPos is defined
    for causal attention only (``causal_only``). Positions are centred on the
    middle key before scaling (the factors cancel exactly in q_m . k_n) to keep
    the factors near 1 at long lengths. Tested for q_m . k_n depending only on
    m - n and against a direct evaluation of the formula.

    Args:
        base: the rotation wavelength base (10000).
        gamma: zeta's offset (0.4 in the paper).
        scale_base: the exponent's divisor (512 in the paper).
    """

    causal_only = True

    def __init__(self, *, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0, **kw):
        super().__init__(**kw)
        if self.head_dim % 2:
            raise ValueError(f"xpos needs an even head_dim, got {self.head_dim}")
        if scale_base <= 0:
            raise ValueError(f"encoding.scheme.scale_base={scale_base} must be positive")
        self.base = base
        self.gamma = gamma
        self.scale_base = scale_base
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim  # 2i/d
        self.register_buffer("inv_freq", base ** (-half), persistent=False)
        self.register_buffer("zeta", (half + gamma) / (1 + gamma), persistent=False)

    def scale(self, pos: Tensor, center: Tensor, sign: float) -> Tensor:
        """(T, Dh) factor zeta^(sign * (pos - center) / scale_base), repeated per pair."""
        expo = sign * (pos - center).to(torch.float32)[:, None] / self.scale_base
        return (self.zeta**expo).repeat_interleave(2, dim=-1)

    def rotate(self, q, k, q_pos, k_pos):
        center = k_pos[0] + k_pos.shape[0] // 2
        q = rotate_pairs(q, q_pos.to(torch.float32)[:, None] * self.inv_freq)
        k = rotate_pairs(k, k_pos.to(torch.float32)[:, None] * self.inv_freq)
        return q * self.scale(q_pos, center, 1.0).to(q.dtype), k * self.scale(k_pos, center, -1.0).to(k.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gamma={self.gamma}, scale_base={self.scale_base}"
