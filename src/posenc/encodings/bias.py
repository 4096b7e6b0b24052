"""Bias schemes: an additive term on the attention logits from positions alone."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .base import PositionalScheme, relative_positions


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes of ALiBi (Press et al. 2022, section 3 and their footnote).

    For n a power of two the slopes are the geometric sequence starting at
    2^(-8/n) with that ratio (n=8: 1/2, 1/4, ..., 1/256). Otherwise take the
    slopes of the closest power of two m below n, then every other slope of
    the sequence for 2m until n are chosen. Checked against the values the
    paper lists (n=8) and its rule for n=12 in the tests.
    """
    if num_heads < 1:
        raise ValueError("num_heads must be positive")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    m = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(m)
    if m < num_heads:
        slopes += power_of_two(2 * m)[0::2][: num_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


def t5_relative_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (key position minus query position).

    Raffel et al. 2020 / the T5 reference code: half the buckets (per
    direction when bidirectional) hold exact distances 0..max_exact-1, the rest
    grow logarithmically up to ``max_distance``; farther distances share the
    last bucket. Bidirectional: keys after the query get buckets offset by
    num_buckets / 2. Causal: keys after the query (future) all map to bucket 0.
    Checked against a direct transcription of that definition, element by
    element, in the tests.
    """
    n = -relative_position.long()
    ret = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    scaled = torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(is_small, n, large)


class ALiBi(PositionalScheme):
    """Attention with linear biases (Press et al. 2022): -slope_h * |i - j|.

    Causal: the paper's bias. Bidirectional: the symmetric form -slope*|i-j|.
    """

    has_bias = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)

    def bias(self, q, k, q_pos, k_pos):
        dist = relative_positions(q_pos, k_pos).abs().to(self.slopes.dtype)  # (Tq, Tk)
        return (-self.slopes[:, None, None] * dist)[None]  # (1, H, Tq, Tk)


class T5Bias(PositionalScheme):
    """T5 relative position bias (Raffel et al. 2020): a learned scalar per
    head and bucket, one table shared by every layer."""

    has_bias = True
    shared_across_layers = True

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128, **kw):
        super().__init__(**kw)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Embedding(num_buckets, self.n_heads)
        nn.init.zeros_(self.table.weight)

    def bias(self, q, k, q_pos, k_pos):
        buckets = t5_relative_bucket(
            relative_positions(q_pos, k_pos), not self.causal, self.num_buckets, self.max_distance
        )
        return self.table(buckets).permute(2, 0, 1)[None]  # (1, H, Tq, Tk)
