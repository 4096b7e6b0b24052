"""Float masks and the blockwise machinery the float-mask routes share: the causal mask, a
position-only bias laid out a block of query rows at a time, the blocked causal forward, the
blocks the recomputing backward visits and their probabilities."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..encodings.base import PositionalScheme, distance_range, toeplitz

#: a float mask built a block at a time: (r0, r1, c1) -> the mask of query rows r0:r1 and keys :c1
MaskBlocks = Callable[[int, int, int], Tensor]

#: elements of one (B, H, rows, keys) block in the recomputing backward (2 MiB in fp32)
BLOCK_ELEMENTS = 2**19
#: query rows per block of a causal forward with a float mask (``masked_attention``)
FORWARD_BLOCK_ROWS = 128
#: whether causal attention skips the keys after a block's last row (the blocked forward,
#: the recomputing backward); the same values either way. The benchmark's FLOP count turns
#: it off, to count every attention in full, as the fused causal kernel's FLOPs are counted
SKIP_LATER_KEYS = True


def causal_mask(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """(Tq, Tk) float mask: 0 where key position <= query position, -inf elsewhere."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=q_pos.device).masked_fill(~allowed, float("-inf"))


def with_causal(bias: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """The float mask attention takes: ``bias`` plus, for causal attention, the causal mask."""
    return bias + causal_mask(q_pos, k_pos, bias.dtype) if causal else bias


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | MaskBlocks, scale: float, prefix_causal: bool,
                     dropout_p: float = 0.0) -> Tensor:
    """``scaled_dot_product_attention`` with a float mask (bias plus causal mask): a tensor,
    or a function ``(r0, r1, c1) -> mask`` of query rows r0:r1 and keys :c1 that builds it
    a block at a time (a layer's own position bias, never (H, T, T) at once).
    With ``prefix_causal`` (causal attention over increasing positions, queries = keys: a
    block of rows sees a prefix of the keys) it runs a block of ``FORWARD_BLOCK_ROWS`` query
    rows at a time against the keys up to the block's last row, so the blocks above the
    diagonal, -inf throughout, are never computed: the fused kernel skips them with
    ``is_causal``, but given a float mask it computes all T^2 logits. The same values to
    float rounding (every route against the dense reference in tests/test_attention.py)."""
    T, Tk = q.shape[-2], k.shape[-2]
    block = mask if callable(mask) else lambda r0, r1, c1: mask[..., r0:r1, :c1]
    if not (prefix_causal and SKIP_LATER_KEYS) or T <= FORWARD_BLOCK_ROWS:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=block(0, T, Tk), dropout_p=dropout_p, scale=scale)
    out = []
    for r0 in range(0, T, FORWARD_BLOCK_ROWS):
        r1 = min(T, r0 + FORWARD_BLOCK_ROWS)
        out.append(F.scaled_dot_product_attention(q[..., r0:r1, :], k[..., :r1, :], v[..., :r1, :],
                                                  attn_mask=block(r0, r1, r1), dropout_p=dropout_p, scale=scale))
    return torch.cat(out, dim=-2)


def position_block(scheme: PositionalScheme, rel_vals: Tensor | None, absolute: Tensor | None, pos: Tensor,
                   r0: int, r1: int, c1: int, causal: bool) -> Tensor:
    """The float mask of a position-only bias for query rows r0:r1 and keys :c1 of
    self-attention at contiguous positions ``pos`` (T,), (1, H, r1 - r0, c1), without a
    graph: the relative part laid out from ``rel_vals`` (H, 2T - 1, the values at
    distances 1 - T .. T - 1), plus ``absolute`` (the block's absolute part), plus, for
    causal attention, -inf at the keys after each row. Equal to the rows and keys of
    ``with_causal(scheme.position_bias(pos, pos), ...)`` (tests/test_attention.py)."""
    T = pos.shape[0]
    out = None
    if rel_vals is not None:  # [i, j] = rel_vals[j - i + T - 1]: the distances the block spans
        out = toeplitz(rel_vals.detach()[:, T - r1 : T - 1 - r0 + c1], r1 - r0, c1)[None]
    if absolute is not None:
        out = absolute.detach().clone() if out is None else out.add_(absolute.detach())
    if out is None:
        raise ValueError(f"{type(scheme).__name__} has no position bias to lay out")
    if causal and c1 > r0 + 1:  # keys r0 + 1 .. c1 - 1 are after some row of the block
        later = pos[r0 + 1 : c1][None, :] > pos[r0:r1, None]
        out[..., r0 + 1 : c1].masked_fill_(later, float("-inf"))
    return out


def position_parts(scheme: PositionalScheme, pos: Tensor) -> tuple[Tensor | None, tuple[Tensor, ...]]:
    """What every block of ``position_block`` shares: the relative part on the 2T - 1
    distances and the scheme's ``absolute_parts``, with a graph where grad mode is on."""
    return scheme.relative_bias(distance_range(pos, pos)), scheme.absolute_parts(pos, pos)


def position_blocks(scheme: PositionalScheme, pos: Tensor, causal: bool, dtype: torch.dtype) -> MaskBlocks:
    """The float mask of a position-only bias as a function of a block, ``(r0, r1, c1) ->
    position_block(...)``, for ``masked_attention``: the parts every block shares are
    computed once, here, and no block keeps a graph."""
    rel_vals, parts = position_parts(scheme, pos)

    def block(r0: int, r1: int, c1: int) -> Tensor:
        absolute = scheme.absolute_block(parts, pos, pos, slice(r0, r1), slice(0, c1))
        return position_block(scheme, rel_vals, absolute, pos, r0, r1, c1, causal).to(dtype)

    return block


def merge(acc: list[Tensor | None], new: tuple[Tensor | None, ...]) -> list[Tensor | None]:
    """acc + new elementwise (None = zero); new may cover a prefix of acc only."""
    merged = [a if g is None else g if a is None else a + g for a, g in zip(acc, new)]
    return merged + acc[len(new) :]


def diagonal_sums(x: Tensor, r0: int, T: int, Tk: int) -> tuple[Tensor, int]:
    """Sums of x (H, n, c) along its diagonals, for x the rows r0..r0+n-1 and the
    first c columns of a T x Tk matrix: returns (sums, start) with sums[:, m]
    the total of the entries with j - i = m + start - (T - 1). Each row is copied
    into a buffer shifted one place per row, so diagonals become columns."""
    H, n, c = x.shape
    buf = x.new_zeros(H, n, c + n)
    buf.as_strided((H, n, c), (n * (c + n), c + n - 1, 1), buf.storage_offset() + n - 1).copy_(x)
    return buf.sum(1)[:, : c + n - 1], T - n - r0


def row_blocks(B: int, H: int, T: int, Tk: int, causal: bool):
    """The blocks (r0, r1, c1) of query rows r0:r1 and keys :c1 that the blockwise
    forward of a value term and the recomputing backward visit: about ``BLOCK_ELEMENTS``
    logits each, and with causal attention only the keys up to a block's last row."""
    rows = max(1, BLOCK_ELEMENTS // (B * H * Tk))
    for r0 in range(0, T, rows):
        r1 = min(T, r0 + rows)
        yield r0, r1, r1 if causal and SKIP_LATER_KEYS else Tk


def block_probabilities(mask: Tensor | None, q: Tensor, k: Tensor, scale: float) -> Tensor:
    """softmax(scale q k^T + mask) of a block, (B, H, rows, keys), for the block's queries
    q (B, H, rows, Dh), keys k (B, H, keys, Dh) and float mask (broadcast to the block) or None."""
    B, H, n, _ = q.shape
    c = k.shape[-2]
    q2, k2 = q.reshape(B * H, n, -1), k.reshape(B * H, c, -1).transpose(1, 2)
    if mask is None:
        s = torch.bmm(q2, k2).mul_(scale)
    else:
        s = torch.baddbmm(mask.expand(B, H, n, c).reshape(B * H, n, c), q2, k2, alpha=scale)
    return s.softmax(-1).view(B, H, n, c)
