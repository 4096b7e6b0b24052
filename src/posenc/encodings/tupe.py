"""TUPE: untied positional encoding (Ke, He & Liu 2020)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import PositionalScheme
from .position_bias import t5_relative_bucket


class TUPE(PositionalScheme):
    """Transformer with Untied Positional Encoding (Ke, He & Liu 2020, "Rethinking
    Positional Encoding in Language Pre-training"), TUPE-R when ``relative_bias``.

    Nothing is added to the input. The logits are (section 3.1, eq. 7, and 3.2)

        alpha_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d)
                   + reset_theta((p_i U^Q)(p_j U^K)^T / sqrt(2d), i, j) + b_{j-i}

    with p a learned absolute table of its own, U^Q, U^K learned d_model x
    d_model maps split into heads, d the head width, and b_{j-i} a T5 bucketed
    relative bias (``t5_relative_bucket``; bidirectional buckets unless causal).
    The content scale is 1/sqrt(2d) (``logit_scale``). p, U^Q, U^K and b are
    one instance shared by every layer, so the positional correlation is the
    same in each layer.

    [CLS] untying (``untie_cls``, section 3.2): position 0 is [CLS]; the
    positional correlation of row 0 is replaced by a learned scalar theta_1
    per head (from [CLS] to the others, including itself) and that of column
    0 in the other rows by theta_2 (from the others to [CLS]):

        reset_theta(v, i, j) = v_ij if i != 0 and j != 0; theta_1 if i = 0; theta_2 if i != 0, j = 0.

    The relative bias is added after the reset. Checked against a direct
    evaluation of these equations (per head, per pair, with and without [CLS]
    untying) in test_tupe_vs_paper_equations.

    Args:
        untie_cls: untie [CLS] at position 0 with learned theta_1, theta_2.
        relative_bias: add the T5 relative bias (TUPE-R); False = TUPE-A.
        num_buckets, max_distance: T5 bucketing of the relative bias.
        init_std: standard deviation of the initial position table.
    """

    shared_across_layers = True

    def __init__(
        self,
        *,
        untie_cls: bool = False,
        relative_bias: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        init_std: float = 0.02,
        **kw,
    ):
        super().__init__(**kw)
        self.untie_cls = untie_cls
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * init_std)  # p
        self.u_q = nn.Linear(self.d_model, self.d_model, bias=False)  # U^Q
        self.u_k = nn.Linear(self.d_model, self.d_model, bias=False)  # U^K
        self.rel = nn.Embedding(num_buckets, self.n_heads) if relative_bias else None
        if self.rel is not None:
            nn.init.zeros_(self.rel.weight)
        self.theta = nn.Parameter(torch.zeros(2, self.n_heads)) if untie_cls else None

    def logit_scale(self) -> float:
        return 1.0 / math.sqrt(2 * self.head_dim)

    def check_length(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(
                f"encoding=tupe has a position table of model.max_len={self.max_len} positions and "
                f"cannot represent a sequence of {length}; raise model.max_len (and retrain)"
            )

    def _project(self, lin: nn.Linear, pos: Tensor) -> Tensor:
        p = self.table[pos]  # (T, D)
        return lin(p).view(pos.shape[0], self.n_heads, self.head_dim).transpose(0, 1)  # (H, T, Dh)

    def absolute_parts(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, ...]:
        """Projected position tables p_i U^Q and p_j U^K, (H, T, Dh) each."""
        lo = int(torch.minimum(q_pos.min(), k_pos.min()))
        self.check_length(int(torch.maximum(q_pos.max(), k_pos.max())) + 1)
        if lo < 0:
            raise ValueError("encoding=tupe got a negative position")
        return self._project(self.u_q, q_pos), self._project(self.u_k, k_pos)

    def absolute_block(self, parts, q_pos, k_pos, rows, cols):
        pq, pk = parts
        qp, kp = q_pos[rows], k_pos[cols]
        corr = pq[:, rows] @ pk[:, cols].transpose(-1, -2) * self.logit_scale()
        if self.theta is not None:  # untie [CLS]
            theta = self.theta.to(corr.dtype)
            corr = torch.where((kp == 0)[None, None, :], theta[1][:, None, None], corr)  # [CLS] as the key
            corr = torch.where((qp == 0)[None, :, None], theta[0][:, None, None], corr)  # [CLS] as the query
        return corr[None]  # (1, H, rows, cols), without the relative bias

    def absolute_factors(self, q_pos, k_pos):
        """p_i U^Q and p_j U^K: the untied correlation is their product at the logit scale,
        exactly, unless [CLS] is untied (theta replaces a row and a column)."""
        return None if self.theta is not None else self.absolute_parts(q_pos, k_pos)

    def relative_bias(self, rel):
        if self.rel is None:
            return None
        return self.rel(t5_relative_bucket(rel, not self.causal, self.num_buckets, self.max_distance)).T  # (H, R)

    def absolute_bias(self, q_pos, k_pos):
        every = slice(None)
        return self.absolute_block(self.absolute_parts(q_pos, k_pos), q_pos, k_pos, every, every)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", untie_cls={self.untie_cls}, relative_bias={self.rel is not None}"
