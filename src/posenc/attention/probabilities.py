"""The ``probabilities`` route: the attention probabilities themselves, (B, H, T, T)."""

from __future__ import annotations

from .base import Route

PROBABILITIES = "probabilities"


class ProbabilitiesRoute(Route):
    """The reference path, ``Attention.attend_explicitly``: the logits, the causal mask, the
    softmax and attention dropout written out, then P V plus the value term. It computes any
    scheme; a call takes it for a value term (Shaw's relative values, which read P) where the
    blockwise ``recomputed`` route does not apply (attention dropout, positions that are not
    contiguous, CUDA)."""

    name = PROBABILITIES

    def serves(self, scheme):
        return True

    def applies(self, attn, x, pos):
        return attn.scheme.uses_value_term

    def attend(self, attn, q, k, v, pos, plan):
        return attn.attend_explicitly(q, k, v, pos, pos)
