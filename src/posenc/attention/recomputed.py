"""The ``recomputed`` route: a bias that trains, on the CPU, with a fused forward and a
memory-light backward that rebuilds the mask a block of query rows at a time."""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings.base import PositionalScheme, is_contiguous
from .base import AttentionPlan, Route, drops, shared_masks
from .blocks import (block_probabilities, causal_mask, diagonal_sums, masked_attention, merge, position_block,
                     position_blocks, position_parts, row_blocks, with_causal)
from .masked import layer_mask

RECOMPUTED = "recomputed"


def block_mask(scheme: PositionalScheme, q: Tensor, k: Tensor, pos: Tensor, r0: int, r1: int, c1: int,
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
        p = block_probabilities(block_mask(scheme, qb, kb, pos, r0, r1, c1, causal)[1], qb, kb, scale)
        y[..., r0:r1, :] = (p @ vb).add_(scheme.value_term(p, pos[r0:r1], pos[:c1]))
    return y


class _PositionGrads:
    """The bias of a position-only scheme in the recomputing backward: each block's float
    mask (the plan's shared mask, or the layer's own rebuilt from the relative part on the
    2T - 1 distances and the block's absolute part), and its parameters' gradients: dS summed
    over the batch, its diagonal sums to ``relative_bias`` (evaluated once), the blocks
    themselves to ``absolute_block`` of the shared ``absolute_parts``, whose gradients autograd
    carries on to the parameters at the end."""

    def __init__(self, scheme, pos, shared, params, causal, dtype):
        self.scheme, self.pos, self.shared, self.params = scheme, pos, shared, params
        self.causal, self.dtype = causal, dtype
        with torch.enable_grad():
            self.rel_vals, self.parts = position_parts(scheme, pos)
        self.leaves = tuple(p.detach().requires_grad_() for p in self.parts)
        self.wrt = [*params, *self.leaves]
        self.grads: list[Tensor | None] = [None] * len(self.wrt)
        self.d_rel = None if self.rel_vals is None else torch.zeros_like(self.rel_vals)

    def mask(self, qb: Tensor, kb: Tensor, r0: int, r1: int, c1: int) -> Tensor | None:
        with torch.enable_grad():  # the block's absolute part, with its graph to the shared parts
            self.b = self.scheme.absolute_block(self.leaves, self.pos, self.pos, slice(r0, r1), slice(0, c1))
        if self.shared is not None:
            return self.shared[..., r0:r1, :c1]
        return position_block(self.scheme, self.rel_vals, self.b, self.pos, r0, r1, c1, self.causal).to(self.dtype)

    def add(self, ds: Tensor, dq: Tensor, dk: Tensor, r0: int, r1: int, c1: int) -> None:
        if not self.params:
            return
        db = ds.sum(0)  # (H, rows, c1): the bias is shared by the batch
        if self.d_rel is not None:
            sums, start = diagonal_sums(db, r0, self.pos.shape[0], dk.shape[-2])
            self.d_rel[:, start : start + sums.shape[1]] += sums
        if self.b is not None:
            self.grads = merge(self.grads, torch.autograd.grad(self.b, self.wrt, db[None], allow_unused=True))

    def result(self) -> list[Tensor | None]:
        grads, params = self.grads, self.params
        if self.d_rel is not None and params:
            grads = merge(grads, torch.autograd.grad(self.rel_vals, params, self.d_rel, allow_unused=True))
        trained = [(p, g) for p, g in zip(self.parts, grads[len(params) :]) if p.requires_grad and g is not None]
        if trained and params:
            outs, part_grads = zip(*trained)
            grads = merge(grads, torch.autograd.grad(outs, params, part_grads, allow_unused=True))
        return grads[: len(params)]


class _ContentGrads:
    """A bias rebuilt from ``scheme.bias`` a block at a time in the recomputing backward (it
    reads q and k, or the scheme has a value term): each block's float mask, and autograd
    carrying dS through the block's bias to q, k and the parameters."""

    def __init__(self, scheme, pos, params, causal):
        self.scheme, self.pos, self.params, self.causal = scheme, pos, params, causal
        self.grads: list[Tensor | None] = [None] * len(params)

    def mask(self, qb: Tensor, kb: Tensor, r0: int, r1: int, c1: int) -> Tensor | None:
        with torch.enable_grad():  # the block's bias, with its graph; it may read q and k
            self.q_, self.k_ = qb.detach().requires_grad_(), kb.detach().requires_grad_()
            self.b, mb = block_mask(self.scheme, self.q_, self.k_, self.pos, r0, r1, c1, self.causal)
        return mb

    def add(self, ds: Tensor, dq: Tensor, dk: Tensor, r0: int, r1: int, c1: int) -> None:
        b = self.b
        if b is None or not b.requires_grad:
            return
        # a bias broadcast over the batch or the query rows (B, H, 1, Tk) takes dS summed over them
        g = torch.autograd.grad(b, [self.q_, self.k_, *self.params], ds.sum_to_size(b.shape), allow_unused=True)
        dq[..., r0:r1, :] += g[0] if g[0] is not None else 0
        if g[1] is not None:
            dk[..., :c1, :] += g[1]
        self.grads = merge(self.grads, g[2:])

    def result(self) -> list[Tensor | None]:
        return self.grads


class _RecomputedBiasAttention(torch.autograd.Function):
    """Attention with a bias that needs gradients: fused forward, memory-light backward.

    ``F.scaled_dot_product_attention`` given a float mask that requires grad
    leaves its fused CPU kernel for the unfused one, which keeps (B, H, T, T)
    logits and probabilities per layer for the backward. Here the forward runs
    the fused kernel on a mask without a graph (the bias plus the causal mask: a
    position-only one that several layers share, T5's and TUPE's, built once per
    forward by the plan and kept, one for all of them; one of a layer
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
    gradient of a position-only bias (``_PositionGrads``); a content bias is rebuilt block by
    block from the block's queries and the keys, and autograd carries dS to q, k and the
    parameters (``_ContentGrads``). A value term adds its share to dP
    (autograd through ``value_term`` of the block's P, which also gives its
    parameters' gradients); rowsum(dY Y) is still rowsum(dP P), since Y is linear
    in P. Nothing of size T^2 is kept between
    forward and backward but a mask shared by several layers. Positions are
    contiguous (``RecomputedRoute.applies``), so with causal attention a block
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
        scheme, causal, scale = ctx.scheme, ctx.causal, ctx.scale
        B, H, T, _ = q.shape
        dy = dy.contiguous()
        delta = (dy * y).sum(-1, keepdim=True)  # rowsum(dY * Y) = rowsum(dP * P), a value term included
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        bias = (_ContentGrads(scheme, pos, params, causal) if ctx.rebuilt
                else _PositionGrads(scheme, pos, shared, params, causal, q.dtype))
        for r0, r1, c1 in row_blocks(B, H, T, k.shape[-2], causal):
            qb, kb, vb, dyb = q[..., r0:r1, :], k[..., :c1, :], v[..., :c1, :], dy[..., r0:r1, :]
            p = block_probabilities(bias.mask(qb, kb, r0, r1, c1), qb, kb, scale)
            dv[..., :c1, :] += p.transpose(-1, -2) @ dyb
            dp = dyb @ vb.transpose(-1, -2)
            if scheme.uses_value_term:  # Y += value_term(P): its share of dP, and its parameters' gradients
                with torch.enable_grad():
                    p_ = p.detach().requires_grad_()
                    g = torch.autograd.grad(scheme.value_term(p_, pos[r0:r1], pos[:c1]), [p_, *params], dyb,
                                            allow_unused=True)
                if g[0] is not None:
                    dp += g[0]
                bias.grads = merge(bias.grads, g[1:])
            ds = p.mul_(dp.sub_(delta[..., r0:r1, :]))  # dS, in place of P
            dq[..., r0:r1, :] = (ds @ kb) * scale
            dk[..., :c1, :] += (ds.transpose(-1, -2) @ qb) * scale
            bias.add(ds, dq, dk, r0, r1, c1)
        return (dq, dk, dv, None, None, None, None, None, *bias.result())


class RecomputedRoute(Route):
    """A bias that trains, or a value term, on the CPU: ``_RecomputedBiasAttention`` (the fused
    forward on a mask without a graph, the backward rebuilding it a block of query rows at a
    time; with a value term the forward too, ``value_term_attention``). It needs contiguous
    positions and no attention dropout, and CUDA's fused kernels take a mask that requires
    grad themselves. A fixed position-only bias (ALiBi) keeps the fused kernel in the backward
    on the ``masked`` route instead."""

    name = RECOMPUTED

    def serves(self, scheme):
        return scheme.has_bias or scheme.uses_value_term

    def applies(self, attn, x, pos):
        sch = attn.scheme
        trains = torch.is_grad_enabled() and (
            not sch.position_only_bias or any(p.requires_grad for p in sch.parameters()))
        return (self.serves(sch) and x.device.type == "cpu" and (sch.uses_value_term or trains)
                and not drops(attn) and is_contiguous(pos))

    def trains_on(self, device_type):
        return device_type == "cpu"  # CUDA's fused kernels keep a mask that requires grad themselves

    def plan(self, layers, x, pos):
        return AttentionPlan(self, shared_masks(layers, x, pos, whole=False, graph=False))

    def attend(self, attn, q, k, v, pos, plan):
        sch = attn.scheme
        q, k = sch.rotate(q, k, pos, pos)
        if sch.uses_value_term:  # built a block at a time, forward and backward
            mask = None
        elif sch.position_only_bias:  # the plan's shared mask, or None: a layer's own, a block at a time
            mask = plan.mask(sch)
            mask = None if mask is None else mask.to(q.dtype)
        else:  # a content bias: this layer's, without a graph
            mask = layer_mask(attn, q, k, pos, plan, graph=False)
        params = [p for p in sch.parameters() if p.requires_grad]
        return _RecomputedBiasAttention.apply(q, k, v, None if mask is None else mask.detach(), pos, sch, attn.causal,
                                              sch.logit_scale(), *params)
