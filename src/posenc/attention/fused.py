"""The ``fused`` route: no bias and no value term, PyTorch's fused kernel."""

from __future__ import annotations

import torch.nn.functional as F

from .base import Route

FUSED = "fused"


class FusedRoute(Route):
    """A scheme without a bias or a value term (NoPE, the absolute and rotary schemes):
    ``scaled_dot_product_attention`` with ``is_causal``, which skips the keys after each
    query; attention dropout in training."""

    name = FUSED

    def serves(self, scheme):
        return not (scheme.has_bias or scheme.uses_value_term)

    def attend(self, attn, q, k, v, pos, plan):
        q, k = attn.scheme.rotate(q, k, pos, pos)
        drop = attn.dropout if attn.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, dropout_p=drop, scale=attn.scheme.logit_scale(),
                                              is_causal=attn.causal)
