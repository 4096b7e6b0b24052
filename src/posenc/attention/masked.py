"""The ``masked`` route: the bias plus the causal mask as a float mask."""

from __future__ import annotations

import torch
from torch import Tensor

from ..encodings.base import is_contiguous
from .base import AttentionPlan, Route, shared_masks
from .blocks import MaskBlocks, masked_attention, position_blocks, with_causal

MASKED = "masked"


def layer_mask(attn, q: Tensor, k: Tensor, pos: Tensor, plan: AttentionPlan, graph: bool) -> Tensor | MaskBlocks:
    """The float mask of a layer's call: the plan's mask of its position-only bias; one the
    plan did not build (a layer's own, without gradients, at contiguous positions) a block
    at a time; or its content bias (which reads this layer's q and k) plus the causal mask,
    with its graph where ``graph`` and grad mode are on."""
    shared = plan.mask(attn.scheme)
    if shared is not None:
        return shared.to(q.dtype)
    if attn.scheme.position_only_bias:
        return position_blocks(attn.scheme, pos, attn.causal, q.dtype)
    with torch.set_grad_enabled(torch.is_grad_enabled() and graph):
        return with_causal(attn.scheme.bias(q, k, pos, pos).to(q.dtype), pos, pos, attn.causal)


class MaskedRoute(Route):
    """Any bias without a value term: ``scaled_dot_product_attention`` with the bias plus the
    causal mask as a float mask (``masked_attention``: a causal one a block of query rows at
    a time against the keys up to the block's last row). With gradients on, or at positions
    that are not contiguous, the plan builds every position-only mask whole, with its graph;
    otherwise a layer's own is built a block at a time. The route of last resort: a call that
    no other route takes."""

    name = MASKED

    def serves(self, scheme):
        return scheme.has_bias and not scheme.uses_value_term

    def plan(self, layers, x, pos):
        whole = torch.is_grad_enabled() or not is_contiguous(pos)
        return AttentionPlan(self, shared_masks(layers, x, pos, whole, graph=True))

    def attend(self, attn, q, k, v, pos, plan):
        q, k = attn.scheme.rotate(q, k, pos, pos)
        drop = attn.dropout if attn.training else 0.0
        increasing = attn.causal and bool((pos[1:] > pos[:-1]).all())
        mask = layer_mask(attn, q, k, pos, plan, graph=True)
        return masked_attention(q, k, v, mask, attn.scheme.logit_scale(), increasing, drop)
