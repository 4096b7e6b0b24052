"""Multi-head self-attention that consults a positional scheme."""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encodings.base import PositionalScheme, distance_range, is_contiguous, toeplitz

#: a float mask built a block at a time: (r0, r1, c1) -> the mask of query rows r0:r1 and keys :c1
MaskBlocks = Callable[[int, int, int], Tensor]


def causal_mask(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """(Tq, Tk) float mask: 0 where key position <= query position, -inf elsewhere."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=q_pos.device).masked_fill(~allowed, float("-inf"))


#: elements of one (B, H, rows, keys) block in the recomputing backward (2 MiB in fp32)
BLOCK_ELEMENTS = 2**19
#: query rows per block of a causal forward with a float mask (``masked_attention``)
FORWARD_BLOCK_ROWS = 128
#: whether causal attention skips the keys after a block's last row (the blocked forward,
#: the recomputing backward); the same values either way. The benchmark's FLOP count turns
#: it off, to count every attention in full, as the fused causal kernel's FLOPs are counted
SKIP_LATER_KEYS = True


def masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | MaskBlocks, scale: float, prefix_causal: bool,
                     dropout_p: float = 0.0) -> Tensor:
    """``scaled_dot_product_attention`` with a float mask (bias plus causal mask): a tensor,
    or a function ``(r0, r1, c1) -> mask`` of query rows r0:r1 and keys :c1 that builds it
    a block at a time (the ``recomputed`` route's position biases, never (H, T, T) at once).
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


def _position_parts(scheme: PositionalScheme, pos: Tensor) -> tuple[Tensor | None, tuple[Tensor, ...]]:
    """What every block of ``position_block`` shares: the relative part on the 2T - 1
    distances and the scheme's ``absolute_parts``, with a graph where grad mode is on."""
    return scheme.relative_bias(distance_range(pos, pos)), scheme.absolute_parts(pos, pos)


def position_blocks(scheme: PositionalScheme, pos: Tensor, causal: bool, dtype: torch.dtype) -> MaskBlocks:
    """The float mask of a position-only bias as a function of a block, ``(r0, r1, c1) ->
    position_block(...)``, for ``masked_attention``: the parts every block shares are
    computed once, here, and no block keeps a graph."""
    rel_vals, parts = _position_parts(scheme, pos)

    def block(r0: int, r1: int, c1: int) -> Tensor:
        absolute = scheme.absolute_block(parts, pos, pos, slice(r0, r1), slice(0, c1))
        return position_block(scheme, rel_vals, absolute, pos, r0, r1, c1, causal).to(dtype)

    return block


def _merge(acc: list[Tensor | None], new: tuple[Tensor | None, ...]) -> list[Tensor | None]:
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


def _block_mask(scheme: PositionalScheme, q: Tensor, k: Tensor, pos: Tensor, r0: int, r1: int, c1: int,
                causal: bool) -> tuple[Tensor | None, Tensor | None]:
    """(bias, float mask) of query rows r0:r1 and keys :c1 for a bias rebuilt from
    ``scheme.bias`` a block at a time (it reads q and k, or the scheme has a value term);
    the bias keeps its graph where grad mode is on, the mask (bias plus causal mask) has none."""
    b = scheme.bias(q, k, pos[r0:r1], pos[:c1])
    if b is not None:
        return b, with_causal(b.detach(), pos[r0:r1], pos[:c1], causal)
    return None, causal_mask(pos[r0:r1], pos[:c1], q.dtype) if causal else None


def value_term_attention(q: Tensor, k: Tensor, v: Tensor, pos: Tensor, scheme: PositionalScheme, causal: bool,
                         scale: float) -> Tensor:
    """P V + ``scheme.value_term(P)`` computed a block of query rows at a time (``row_blocks``),
    with causal attention against the keys up to a block's last row only: the output of the
    ``probabilities`` route without its (B, H, T, T) probabilities, and without the logits
    above the diagonal. Positions are contiguous and increasing."""
    y = torch.empty_like(v)
    B, H, T, _ = q.shape
    for r0, r1, c1 in row_blocks(B, H, T, k.shape[-2], causal):
        qb, kb, vb = q[..., r0:r1, :], k[..., :c1, :], v[..., :c1, :]
        p = block_probabilities(_block_mask(scheme, qb, kb, pos, r0, r1, c1, causal)[1], qb, kb, scale)
        y[..., r0:r1, :] = (p @ vb).add_(scheme.value_term(p, pos[r0:r1], pos[:c1]))
    return y


class _RecomputedBiasAttention(torch.autograd.Function):
    """Attention with a bias that needs gradients: fused forward, memory-light backward.

    ``F.scaled_dot_product_attention`` given a float mask that requires grad
    leaves its fused CPU kernel for the unfused one, which keeps (B, H, T, T)
    logits and probabilities per layer for the backward. Here the forward runs
    the fused kernel on a mask without a graph (the bias plus the causal mask: a
    position-only one that several layers share, T5's and TUPE's, built once per
    forward by ``plan_attention`` and kept, one for all of them; one of a layer
    alone, KERPLE's and FIRE's, a block of query rows at a time, ``position_block``,
    from the relative part on the 2T - 1 distances and the block's absolute part; a
    content one -- Transformer-XL, skew, fixed bidirectional, whose bias depends on q
    and k -- built by the layer and dropped; with a value term, Shaw's, no fused
    kernel applies: ``value_term_attention`` computes P V + value_term(P) a block of
    rows at a time and keeps none of it), and the backward rebuilds any mask it
    did not keep and recomputes the logits a block of query rows at a time, FlashAttention style (Dao et al.
    2022, Algorithm 2 with the softmax normaliser recomputed): with
    P = softmax(S), dV = P^T dY, dP = dY V^T, dS = P (dP - rowsum(dY Y)),
    dQ = dS K scale, dK = dS^T Q scale. dS summed over the batch is the bias
    gradient: its diagonal sums go to the scheme's ``relative_bias`` (evaluated
    once, on the 2T - 1 distances), the blocks themselves to ``absolute_block``,
    and autograd carries both to the scheme's parameters. A content bias is
    rebuilt block by block from the block's queries and the keys, and autograd
    carries dS to q, k and the parameters. A value term adds its share to dP
    (autograd through ``value_term`` of the block's P, which also gives its
    parameters' gradients); rowsum(dY Y) is still rowsum(dP P), since Y is linear
    in P. Nothing of size T^2 is kept between
    forward and backward but a mask shared by several layers. Positions are
    contiguous (``Attention.route``), so with causal attention a block
    of rows reads only the keys up to its last row. Checked against autograd
    through the plain formula in ``tests/test_encodings.py``.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, pos, scheme, causal, scale, *params):
        rebuilt = scheme.uses_value_term or not scheme.position_only_bias  # from scheme.bias, a block at a time
        shared = None if rebuilt else mask  # the plan's mask of a scheme that several layers share
        if scheme.uses_value_term:
            y = value_term_attention(q, k, v, pos, scheme, causal, scale)
        else:  # the mask given (a shared or a content one), or a layer's own position bias a block at a time
            blocks = position_blocks(scheme, pos, causal, q.dtype) if mask is None else mask
            y = masked_attention(q, k, v, blocks, scale, causal)  # positions are contiguous on this route
        ctx.save_for_backward(q, k, v, pos, shared, y, *params)  # the backward rebuilds any other mask
        ctx.scheme, ctx.causal, ctx.scale, ctx.rebuilt = scheme, causal, scale, rebuilt
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, pos, shared, y, *params = ctx.saved_tensors
        scheme, causal, scale, rebuilt = ctx.scheme, ctx.causal, ctx.scale, ctx.rebuilt
        B, H, T, _ = q.shape
        Tk = k.shape[-2]
        dy = dy.contiguous()
        delta = (dy * y).sum(-1, keepdim=True)  # rowsum(dY * Y) = rowsum(dP * P), a value term included
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        parts, rel_vals = (), None
        if not rebuilt:
            with torch.enable_grad():
                rel_vals, parts = _position_parts(scheme, pos)
        leaves = tuple(p.detach().requires_grad_() for p in parts)
        wrt = [*params, *leaves]
        grads: list[Tensor | None] = [None] * len(wrt)
        d_rel = None if rel_vals is None else torch.zeros_like(rel_vals)
        for r0, r1, c1 in row_blocks(B, H, T, Tk, causal):
            qb, kb, vb, dyb = q[..., r0:r1, :], k[..., :c1, :], v[..., :c1, :], dy[..., r0:r1, :]
            with torch.enable_grad():  # the block's bias, with its graph
                if rebuilt:  # it may read q and k
                    q_, k_ = qb.detach().requires_grad_(), kb.detach().requires_grad_()
                    b, mb = _block_mask(scheme, q_, k_, pos, r0, r1, c1, causal)
                else:
                    b = scheme.absolute_block(leaves, pos, pos, slice(r0, r1), slice(0, c1))
            if not rebuilt:
                mb = shared[..., r0:r1, :c1] if shared is not None else \
                    position_block(scheme, rel_vals, b, pos, r0, r1, c1, causal).to(q.dtype)
            p = block_probabilities(mb, qb, kb, scale)
            dv[..., :c1, :] += p.transpose(-1, -2) @ dyb
            dp = dyb @ vb.transpose(-1, -2)
            if scheme.uses_value_term:  # Y += value_term(P): its share of dP, and its parameters' gradients
                with torch.enable_grad():
                    p_ = p.detach().requires_grad_()
                    g = torch.autograd.grad(scheme.value_term(p_, pos[r0:r1], pos[:c1]), [p_, *params], dyb,
                                            allow_unused=True)
                if g[0] is not None:
                    dp += g[0]
                grads = _merge(grads, g[1:])
            ds = p.mul_(dp.sub_(delta[..., r0:r1, :]))  # dS, in place of P
            dq[..., r0:r1, :] = (ds @ kb) * scale
            dk[..., :c1, :] += (ds.transpose(-1, -2) @ qb) * scale
            if rebuilt:
                if b is None or not b.requires_grad:
                    continue
                g = torch.autograd.grad(b, [q_, k_, *params], ds if b.shape[0] == B else ds.sum(0, keepdim=True),
                                        allow_unused=True)
                dq[..., r0:r1, :] += g[0] if g[0] is not None else 0
                if g[1] is not None:
                    dk[..., :c1, :] += g[1]
                grads = _merge(grads, g[2:])
                continue
            if not params:
                continue
            db = ds.sum(0)  # (H, rows, c1): the bias is shared by the batch
            if d_rel is not None:
                sums, start = diagonal_sums(db, r0, T, Tk)
                d_rel[:, start : start + sums.shape[1]] += sums
            if b is not None:
                grads = _merge(grads, torch.autograd.grad(b, wrt, db[None], allow_unused=True))
        if d_rel is not None and params:
            grads = _merge(grads, torch.autograd.grad(rel_vals, params, d_rel, allow_unused=True))
        trained = [(p, g) for p, g in zip(parts, grads[len(params) :]) if p.requires_grad and g is not None]
        if trained and params:
            outs, part_grads = zip(*trained)
            grads = _merge(grads, torch.autograd.grad(outs, params, part_grads, allow_unused=True))
        return (dq, dk, dv, None, None, None, None, None, *grads[: len(params)])


#: how a layer computes attention (``Attention.route``): the fused kernel with no
#: mask, the fused kernel with a float mask (bias + causal), the fused forward (or,
#: with a value term, a blockwise one) with the memory-light backward, explicit
#: (B, H, T, T) probabilities for a value term, or FlexAttention with the bias read
#: inside the kernel
FUSED, MASKED, RECOMPUTED, PROBABILITIES, FLEX = "fused", "masked", "recomputed", "probabilities", "flex"

#: the devices on which a position-only bias takes the ``flex`` route: CUDA, with a torch
#: whose FlexAttention gives a tensor read in ``score_mod`` its gradient (2.6 on). It has no
#: backward on CPU, so CPU keeps its float-mask routes; the tests add "cpu" with a dense
#: evaluation of the same score function in place of the kernel. The variable
#: POSENC_FLEX_DEVICES (comma-separated device types; empty: none) overrides it
FLEX_SINCE = "2.6"
FLEX_DEVICES = tuple(d for d in os.environ.get("POSENC_FLEX_DEVICES", "cuda" if torch.__version__ >= FLEX_SINCE else "")
                     .split(",") if d)


@dataclass(frozen=True)
class FlexParts:
    """A position-only bias in the form the ``flex`` route reads: ``table`` (H, 2T - 1),
    the relative part on the distances 1 - T .. T - 1, read inside the kernel at
    [h, j - i + T - 1]; the absolute part either as ``factors`` (a, b), (H, T, r) each,
    ``logit_scale * a @ b^T``, appended to the queries and keys, or as ``score``, a function
    of (h, i, j) evaluated inside the kernel (``bias_score_mod``). Any may be None. All
    carry their graph: the kernel's backward gives the tensors the table and the score read
    their gradients, and q and k theirs, and autograd takes them on to the scheme's parameters."""

    table: Tensor | None
    factors: tuple[Tensor, Tensor] | None
    score: Callable | None = None


def flex_parts(scheme: PositionalScheme, pos: Tensor) -> FlexParts | None:
    """The parts of ``scheme``'s position-only bias at contiguous positions ``pos`` for
    the ``flex`` route, or None where the scheme has an absolute part in neither form
    (TUPE with [CLS] untied): it then takes the masked route. A scheme gets the route by
    what it defines (``relative_bias``, ``absolute_factors``, ``absolute_score``), with no
    branch here."""
    factors = score = None
    if scheme.defines("absolute_bias"):
        factors = scheme.absolute_factors(pos, pos)
        score = scheme.absolute_score(pos, pos) if factors is None else None
        if factors is None and score is None:
            return None
    return FlexParts(scheme.relative_bias(distance_range(pos, pos)), factors, score)


def bias_score_mod(parts: FlexParts) -> Callable | None:
    """FlexAttention's ``score_mod``: the scaled logit of query i and key j plus
    ``table[h, j - i + T - 1]`` (the relative part laid out as ``toeplitz`` lays it out, T the
    length) and
    ``score(h, i, j)``, whichever the parts have; None without either."""
    table, score = parts.table, parts.score
    if table is None and score is None:
        return None

    def score_mod(s, b, h, q_idx, kv_idx):
        if table is not None:  # the offset T - 1 read from the table's shape: no constant to recompile for
            s = s + table[h, kv_idx - q_idx + (table.shape[-1] - 1) // 2]
        if score is not None:
            s = s + score(h, q_idx, kv_idx)
        return s

    return score_mod


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention's ``mask_mod`` of causal attention: key j is seen from query i when j <= i."""
    return kv_idx <= q_idx


@functools.lru_cache(maxsize=16)
def causal_block_mask(T: int, device: torch.device):
    """The causal ``BlockMask`` of T queries and keys: built once per length and device, shared
    by every layer and forward (the blocks above the diagonal are skipped, not masked)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal_mask_mod, None, None, T, T, device=device)


@functools.cache
def _compiled_flex_attention():
    """FlexAttention compiled once per process; a second length or batch makes the changed sizes
    dynamic (torch.compile's automatic dynamic shapes), so evaluating at many lengths does not
    run into the recompilation limit, past which torch would fall back to the unfused kernel."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_kernel(device: torch.device) -> Callable:
    """FlexAttention for ``device``: compiled on CUDA (it must be to be fast), eager
    elsewhere (CPU: the forward only, which the tests check against the dense reference)."""
    if device.type == "cuda":
        return _compiled_flex_attention()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def flex_route_attention(q: Tensor, k: Tensor, v: Tensor, parts: FlexParts, causal: bool, scale: float,
                         content: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Attention with a bias through FlexAttention: the absolute factors, and a layer's
    ``content`` factors (the fixed bidirectional encoding's), appended to q and k (one fused
    product gives the content logits and these parts, all at ``scale``), the relative
    table and an absolute score read in ``score_mod``, and causality as a ``BlockMask``. Nothing of size T^2 is
    built. Positions are contiguous (``Attention.route``)."""
    B, T = q.shape[0], q.shape[-2]
    for factors in (parts.factors, content):
        if factors is not None:
            a, b = (f.to(q.dtype).expand(B, -1, -1, -1) for f in factors)
            q, k = torch.cat([q, a], -1), torch.cat([k, b], -1)
    mask = causal_block_mask(T, q.device) if causal else None
    try:
        return flex_kernel(q.device)(q, k, v, score_mod=bias_score_mod(parts), block_mask=mask, scale=scale)
    except torch.OutOfMemoryError:
        raise
    except Exception as e:
        raise RuntimeError(f"the flex route (FlexAttention on {q.device.type}) failed: {type(e).__name__}: {e}; "
                           "POSENC_FLEX_DEVICES= (empty) sends these schemes to the float-mask routes") from e


def with_causal(bias: Tensor, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
    """The float mask attention takes: ``bias`` plus, for causal attention, the causal mask."""
    return bias + causal_mask(q_pos, k_pos, bias.dtype) if causal else bias


@dataclass(frozen=True)
class AttentionPlan:
    """How the layers of one forward compute attention, decided once, at the top
    (``plan_attention``), and handed down to every layer: the route, and the float
    masks of position-only biases (bias plus causal mask), one per scheme instance, so
    layers that share a scheme (T5, TUPE) share its mask. On the ``recomputed`` route,
    and on the ``masked`` one without gradients at contiguous positions, only a scheme
    that several layers share has one; a layer's own bias (KERPLE's, FIRE's) is built
    there a block of rows at a time, and never whole."""

    route: str
    masks: dict = field(default_factory=dict)  # PositionalScheme -> (1, H, T, T) mask
    flex: dict = field(default_factory=dict)  # PositionalScheme -> FlexParts, on the flex route

    def mask(self, scheme: PositionalScheme) -> Tensor | None:
        """The shared mask of ``scheme``'s position-only bias, or None (no bias, or one that reads q and k)."""
        return self.masks.get(scheme)


def plan_attention(layers: Sequence[Attention], x: Tensor, pos: Tensor) -> AttentionPlan:
    """The plan of a forward through ``layers`` (every layer has the same kind of
    scheme) with input ``x`` at positions ``pos``: the first layer's route and the mask
    of every position-only scheme instance among the layers that several layers share,
    and, on the ``masked`` route with gradients on or positions that are not contiguous,
    of every one (otherwise a layer's own is built a block at a time, ``position_blocks``)."""
    route = layers[0].route(x, pos)
    if route == FLEX:  # one set of parts per scheme instance, shared by the layers that share it
        flex: dict = {}
        for attn in layers:
            if attn.scheme not in flex:
                flex[attn.scheme] = flex_parts(attn.scheme, pos)
        if all(p is not None for p in flex.values()):
            return AttentionPlan(FLEX, flex=flex)
        route = layers[0].route(x, pos, flex=False)
    users = Counter(attn.scheme for attn in layers if attn.scheme.position_only_bias and not attn.scheme.uses_value_term)
    whole = route == MASKED and (torch.is_grad_enabled() or not is_contiguous(pos))
    masks: dict = {}
    with torch.set_grad_enabled(torch.is_grad_enabled() and route != RECOMPUTED):  # recomputed: trained in its backward
        for attn in layers:
            sch = attn.scheme
            if sch in users and sch not in masks and (whole or users[sch] > 1):
                masks[sch] = attn.position_mask(pos, x.dtype)
    return AttentionPlan(route, masks)


class Attention(nn.Module):
    """Pre-projection multi-head attention; positions enter only through ``scheme``.

    How a call computes attention is its route (``route``), decided once per
    forward for all layers (``plan_attention``): ``fused`` (no bias: the fused
    kernel, ``is_causal``), ``masked`` (the bias plus the causal mask as a float
    mask), ``recomputed`` (as masked, but the mask carries no graph and the
    backward recomputes it, ``_RecomputedBiasAttention``; with a value term the
    forward too runs a block of query rows at a time, ``value_term_attention``) and
    ``probabilities`` (a value term with all of the attention probabilities at once,
    where the blockwise route does not apply). A layer called alone plans for
    itself, with the same planner.
    """

    def __init__(self, d_model: int, n_heads: int, scheme: PositionalScheme, causal: bool, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.scheme = scheme

    def project(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v  # each (B, H, T, Dh)

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The pre-mask attention logits (B, H, Tq, Tk) the reference path uses."""
        q, k = self.scheme.rotate(q, k, q_pos, k_pos)
        att = (q * self.scheme.logit_scale()) @ k.transpose(-1, -2)  # the scale on q: Tq x Dh products, not Tq x Tk
        b = self.scheme.bias(q, k, q_pos, k_pos)
        return att if b is None else att.add_(b)

    def route(self, x: Tensor, pos: Tensor, flex: bool = True) -> str:
        """The route of a call with input ``x`` at positions ``pos``. ``flex`` (where
        ``flex`` is True) needs a device in ``FLEX_DEVICES``, a position-only bias or a content
        bias in low-rank form (``content_factors``), no value term, contiguous positions and
        no attention dropout; ``plan_attention`` sends
        a scheme whose absolute part has no low-rank form on to the next route. ``recomputed``
        needs contiguous positions, CPU (CUDA's fused kernels take a mask that
        requires grad themselves), no attention dropout, and either a value term
        (with gradients on or off: its blockwise forward keeps no (T, T)
        probabilities) or gradients on and a bias to train (a content one, or a
        position-only one with trainable parameters: a fixed one keeps the fused
        kernel in the backward too). Otherwise a value term takes ``probabilities``
        and a bias ``masked``."""
        sch = self.scheme
        if not (sch.has_bias or sch.uses_value_term):
            return FUSED
        dropping = self.training and self.dropout > 0
        if (flex and x.device.type in FLEX_DEVICES and (sch.position_only_bias or sch.factors_content())
                and not sch.uses_value_term and not dropping and is_contiguous(pos)):
            return FLEX
        trains = torch.is_grad_enabled() and (
            not sch.position_only_bias or any(p.requires_grad for p in sch.parameters()))
        recompute = (
            x.device.type == "cpu"
            and (sch.uses_value_term or trains)
            and not dropping
            and is_contiguous(pos)
        )
        return RECOMPUTED if recompute else PROBABILITIES if sch.uses_value_term else MASKED

    def position_mask(self, pos: Tensor, dtype: torch.dtype) -> Tensor:
        """Float attention mask of a position-only bias scheme, causal mask included
        (``plan_attention`` builds it once per forward and scheme instance)."""
        return with_causal(self.scheme.position_bias(pos, pos).to(dtype), pos, pos, self.causal)

    def forward(self, h: Tensor, pos: Tensor, plan: AttentionPlan | None = None,
                attention: list[Tensor] | None = None) -> Tensor:
        """h (B, T, D) at positions pos (T,), computed as ``plan`` says (the model's
        plan of this forward; a layer called alone plans for itself). With a list
        ``attention``, the layer appends its attention probabilities (B, H, T, T) of
        this call to it (``probabilities``, from the q and k of this call)."""
        B, T, D = h.shape
        plan = plan or plan_attention([self], h, pos)
        q, k, v = self.project(h)
        if attention is not None:
            attention.append(self.probabilities(q, k, pos, pos))
        if plan.route == PROBABILITIES:
            y = self._probabilities(q, k, v, pos, pos)
        else:
            q, k = self.scheme.rotate(q, k, pos, pos)
            if plan.route == FUSED:
                y = self._sdpa(q, k, v, is_causal=self.causal)
            elif plan.route == FLEX:
                content = self.scheme.content_factors(q, k, pos, pos) if self.scheme.factors_content() else None
                y = flex_route_attention(q, k, v, plan.flex[self.scheme], self.causal, self.scheme.logit_scale(), content)
            elif plan.route == MASKED:
                drop = self.dropout if self.training else 0.0
                increasing = self.causal and bool((pos[1:] > pos[:-1]).all())
                y = masked_attention(q, k, v, self._mask(q, k, pos, plan), self.scheme.logit_scale(), increasing, drop)
            else:  # a layer's own position-only bias, and any bias with a value term, are built a block at a time
                sch = self.scheme
                own = sch.uses_value_term or (sch.position_only_bias and plan.mask(sch) is None)
                y = self._recomputed(q, k, v, pos, None if own else self._mask(q, k, pos, plan))
        return self.out(y.transpose(1, 2).reshape(B, T, D))

    def _mask(self, q: Tensor, k: Tensor, pos: Tensor, plan: AttentionPlan) -> Tensor | MaskBlocks:
        """The plan's mask of this layer's position-only bias; one the plan did not build
        (a layer's own, without gradients, at contiguous positions) a block at a time; or its
        content bias (which reads this layer's q and k) plus the causal mask."""
        shared = plan.mask(self.scheme)
        if shared is not None:
            return shared.to(q.dtype)
        if self.scheme.position_only_bias:
            return position_blocks(self.scheme, pos, self.causal, q.dtype)
        with torch.set_grad_enabled(torch.is_grad_enabled() and plan.route != RECOMPUTED):
            return with_causal(self.scheme.bias(q, k, pos, pos).to(q.dtype), pos, pos, self.causal)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, **kw) -> Tensor:
        drop = self.dropout if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, scale=self.scheme.logit_scale(), **kw)

    def _recomputed(self, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, mask: Tensor | None) -> Tensor:
        params = [p for p in self.scheme.parameters() if p.requires_grad]
        return _RecomputedBiasAttention.apply(
            q, k, v, None if mask is None else mask.detach(), pos, self.scheme, self.causal, self.scheme.logit_scale(), *params
        )

    def probabilities(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The attention probabilities (B, H, Tq, Tk) of the reference path: ``logits``, the
        causal mask, the softmax (before attention dropout). Every route computes these
        (to float rounding; ``tests/test_attention.py``), and analysis reads them here."""
        att = self.logits(q, k, q_pos, k_pos)
        if self.causal:  # in place: the same values as adding causal_mask, without a (Tq, Tk) mask
            att = att.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
        return att.softmax(-1)

    def _probabilities(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        probs = F.dropout(self.probabilities(q, k, q_pos, k_pos), self.dropout if self.training else 0.0,
                          self.training)
        if not self.scheme.uses_value_term:
            return probs @ v
        return probs @ v + self.scheme.value_term(probs, q_pos, k_pos)

    def last_rows(self, h: Tensor, pos: Tensor, last: int, attention: list[Tensor] | None = None) -> Tensor:
        """The output at the last ``last`` positions alone, (B, last, D): their queries
        against every key and value of h (B, T, D), on the reference path (``logits``,
        the causal mask, the softmax), O(last * T) and not O(T^2). With a list
        ``attention``, appends those rows' probabilities (B, H, last, T) to it."""
        B, T, D = h.shape
        q, k, v = self.project(h)
        if attention is not None:
            attention.append(self.probabilities(q[:, :, T - last :], k, pos[T - last :], pos))
        y = self._probabilities(q[:, :, T - last :], k, v, pos[T - last :], pos)
        return self.out(y.transpose(1, 2).reshape(B, last, D))

    def terms(self, h_word: Tensor, h_posn: Tensor | None, pos: Tensor) -> dict[str, Tensor]:
        """Named logit terms for an input split as h = h_word + h_posn.

        The projection bias goes with the word part, so the terms sum to
        ``logits`` of the full input.
        """
        q_w, k_w, _ = self.project(h_word)
        if h_posn is None:
            return self.scheme.terms(q_w, k_w, None, None, pos, pos)
        w = self.qkv.weight
        B, T, _ = h_posn.shape
        qk_p = (h_posn @ w.T).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return self.scheme.terms(q_w, k_w, qk_p[0], qk_p[1], pos, pos)
