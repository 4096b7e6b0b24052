"""What every attention route is (``Route``: whether it serves a scheme, whether a call takes
it, its plan, attend, its probe), the plan a forward hands down to its layers, and the one
decision of which float masks a plan builds whole (``shared_masks``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
import torch
from torch import Tensor, nn

from ..encodings.base import PositionalScheme

#: a layer as a route sees it (``layer.Attention``: its scheme, heads, causality, dropout)
Attention = nn.Module


class Route:
    """One way of computing a layer's attention. A route says which schemes it can compute
    at all (``serves``: the test of every route trains each scheme on each route that serves
    it), whether a call takes it (``applies``: ``Attention.route`` takes the first route of
    ``ROUTES`` that applies), what the layers of one forward share (``plan``, made once per
    forward), how a layer attends (``attend``, given its projected, unrotated q, k, v), and
    whether it works here at all (``probe``: None where it does, else the reason; the
    float-mask routes are plain torch and always do).

    A route that gives up on a call it planned (the flex route at torch's recompilation
    limit) raises ``RouteGaveUp`` after refusing itself; the layer plans again, with the
    routes that are left."""

    #: the route's name: what a run records and the reports print
    name: str = ""

    def serves(self, scheme: PositionalScheme) -> bool:
        """Whether the route can compute attention with ``scheme`` at contiguous positions."""
        raise NotImplementedError

    def applies(self, attn: Attention, x: Tensor, pos: Tensor) -> bool:
        """Whether a call of ``attn`` with input ``x`` at positions ``pos`` takes the route
        (the routes before it in ``ROUTES`` having declined)."""
        return self.serves(attn.scheme)

    def plan(self, layers: Sequence[Attention], x: Tensor, pos: Tensor) -> AttentionPlan:
        """What the layers of one forward share on this route."""
        return AttentionPlan(self)

    def attend(self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, pos: Tensor, plan: AttentionPlan) -> Tensor:
        """The attention output (B, H, T, Dh) of q, k, v (B, H, T, Dh), before rotation."""
        raise NotImplementedError

    def probe(self, attn: Attention, x: Tensor, pos: Tensor) -> str | None:
        """None where the route works for such a call on this machine, else the reason."""
        return None

    def trains_on(self, device_type: str) -> bool:
        """Whether the route can train (forward and backward) on a device of this type."""
        return True

    def __repr__(self) -> str:
        return f"<route {self.name}>"


class RouteGaveUp(RuntimeError):
    """A route could not compute a call it had planned and has refused itself since."""


@dataclass(frozen=True)
class AttentionPlan:
    """How the layers of one forward compute attention, decided once, at the top
    (``plan_attention``), and handed down to every layer: the route, and the float
    masks of position-only biases (bias plus causal mask), one per scheme instance, so
    layers that share a scheme (T5, TUPE) share its mask (``shared_masks`` decides which
    are built), or, on the flex route, each scheme instance's ``FlexParts``."""

    route: Route
    masks: dict = field(default_factory=dict)  # PositionalScheme -> (1, H, T, T) mask
    flex: dict = field(default_factory=dict)  # PositionalScheme -> FlexParts, on the flex route
    #: the routes layers took instead where the route gave up on their call (``RouteGaveUp``)
    instead: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.route.name

    def mask(self, scheme: PositionalScheme) -> Tensor | None:
        """The shared mask of ``scheme``'s position-only bias, or None (none built whole: no
        bias, one that reads q and k, or a layer's own built a block at a time)."""
        return self.masks.get(scheme)


def shared_masks(layers: Sequence[Attention], x: Tensor, pos: Tensor, whole: bool, graph: bool) -> dict:
    """The float masks a plan builds whole, the one place that decides it: the mask (bias
    plus causal mask, ``Attention.position_mask``) of every position-only scheme instance
    without a value term that several of ``layers`` share (T5's, TUPE's), and, with
    ``whole``, of every such instance (a layer's own, KERPLE's or FIRE's, is otherwise built
    a block at a time where it is used, and never whole). ``graph``: whether the masks keep
    their graph (the masked route with gradients on) or not (the recomputed route trains
    the bias in its backward)."""
    users = Counter(a.scheme for a in layers if a.scheme.position_only_bias and not a.scheme.uses_value_term)
    masks: dict = {}
    with torch.set_grad_enabled(torch.is_grad_enabled() and graph):
        for attn in layers:
            sch = attn.scheme
            if sch in users and sch not in masks and (whole or users[sch] > 1):
                masks[sch] = attn.position_mask(pos, x.dtype)
    return masks


def drops(attn: Attention) -> bool:
    """Whether the call applies attention dropout (a layer with dropout, in training)."""
    return attn.training and attn.dropout > 0
