"""The attention layer and the planner that picks its route, a loop over the declared routes."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encodings.base import PositionalScheme
from .base import AttentionPlan, Route, RouteGaveUp
from .blocks import with_causal
from .flex import FlexRoute
from .fused import FusedRoute
from .masked import MaskedRoute
from .probabilities import ProbabilitiesRoute
from .recomputed import RecomputedRoute

#: the routes, in the order a call tries them: the first that applies computes it. No scheme is
#: named here: each route says which schemes it serves from the parts they define
FLEX_ROUTE = FlexRoute()
ROUTES: tuple[Route, ...] = (FusedRoute(), FLEX_ROUTE, RecomputedRoute(), ProbabilitiesRoute(), MaskedRoute())


#: the route every plan takes while ``forced_route`` holds one
_FORCED: list[Route] = []


@contextmanager
def forced_route(route: Route):
    """Every plan made inside takes ``route``, whether it applies or not (a route that cannot
    compute a call raises): for the checks that train a scheme on each of its routes in turn
    (the GPU check)."""
    _FORCED.append(route)
    try:
        yield route
    finally:
        _FORCED.pop()


def plan_attention(layers: Sequence[Attention], x: Tensor, pos: Tensor,
                   routes: Sequence[Route] = ROUTES) -> AttentionPlan:
    """The plan of a forward through ``layers`` (every layer has the same kind of scheme) with
    input ``x`` at positions ``pos``: the first of ``routes`` that applies to the first layer's
    call (or the one ``forced_route`` holds), and what the layers share on it (``Route.plan``)."""
    if _FORCED:
        return _FORCED[-1].plan(layers, x, pos)
    for route in routes:
        if route.applies(layers[0], x, pos):
            return route.plan(layers, x, pos)
    raise ValueError(f"no attention route of {[r.name for r in routes]} applies to {type(layers[0].scheme).__name__}")


class Attention(nn.Module):
    """Pre-projection multi-head attention; positions enter only through ``scheme``.

    How a call computes attention is its route (``ROUTES``: fused, flex, recomputed,
    probabilities, masked; each in its own module), decided once per forward for all layers
    (``plan_attention``) and handed down in the plan. A layer called alone plans for itself,
    with the same planner; a route that gives up on a call (``RouteGaveUp``) has the layer plan
    again with the routes left.
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

    def route(self, x: Tensor, pos: Tensor) -> str:
        """The name of the route a call with input ``x`` at positions ``pos`` takes: the first
        of ``ROUTES`` that applies (``Route.applies`` of each says when), or the forced one."""
        if _FORCED:
            return _FORCED[-1].name
        return next(r.name for r in ROUTES if r.applies(self, x, pos))

    def position_mask(self, pos: Tensor, dtype: torch.dtype) -> Tensor:
        """Float attention mask of a position-only bias scheme, causal mask included
        (a plan builds it once per forward and scheme instance, ``shared_masks``)."""
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
        try:
            y = plan.route.attend(self, q, k, v, pos, plan)
        except RouteGaveUp:  # the route refuses itself from now on: the next one that applies
            own = plan_attention([self], h, pos)
            plan.instead.append(own.name)
            y = own.route.attend(self, q, k, v, pos, own)
        return self.out(y.transpose(1, 2).reshape(B, T, D))

    def probabilities(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The attention probabilities (B, H, Tq, Tk) of the reference path: ``logits``, the
        causal mask, the softmax (before attention dropout). Every route computes these
        (to float rounding; ``tests/test_attention.py``), and analysis reads them here."""
        att = self.logits(q, k, q_pos, k_pos)
        if self.causal:  # in place: the same values as adding causal_mask, without a (Tq, Tk) mask
            att = att.masked_fill_(k_pos[None, :] > q_pos[:, None], float("-inf"))
        return att.softmax(-1)

    def attend_explicitly(self, q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The reference path's output: ``probabilities`` with attention dropout, times v, plus
        the value term (the ``probabilities`` route, and ``last_rows``)."""
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
        y = self.attend_explicitly(q[:, :, T - last :], k, v, pos[T - last :], pos)
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
