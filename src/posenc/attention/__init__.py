"""Multi-head self-attention that consults a positional scheme, and the routes that compute it.

A call's route is the first of ``layer.ROUTES`` that applies to it, each in its own module:

* ``fused`` (``fused.py``): no bias, no value term; PyTorch's fused kernel, ``is_causal``.
* ``flex`` (``flex.py``, with ``flex_kernel.py`` and ``flex_gates.py``): FlexAttention reads a
  position-only bias (or a low-rank content bias) inside the kernel; CUDA by default, gated,
  probed once per kind of call, and left for the float-mask routes where anything fails.
* ``recomputed`` (``recomputed.py``): a bias that trains, or a value term, on the CPU: a fused
  forward on a mask without a graph and a backward that rebuilds it a block at a time.
* ``probabilities`` (``probabilities.py``): the probabilities written out (a value term).
* ``masked`` (``masked.py``): the bias plus the causal mask as a float mask.

``attention.route=auto|flex|masked`` (``flex_gates.use_route``) chooses whether the flex route
may be taken. The float masks and the blockwise machinery the float-mask routes share are in
``blocks.py``; the route interface, the plan and the one decision of which masks a plan builds
whole in ``base.py``.
"""

from .base import AttentionPlan, Route, RouteGaveUp, shared_masks
from .blocks import causal_mask, diagonal_sums, masked_attention, position_block, position_parts, with_causal
from .flex import FLEX, SCORE_TRAINS, FlexFallback
from .flex_gates import ROUTE_SETTINGS, check_route_setting, route_setting, use_route
from .flex_kernel import FlexParts, bias_score_mod, causal_block_mask, flex_attend, flex_parts
from .fused import FUSED
from .layer import FLEX_ROUTE, ROUTES, Attention, forced_route, plan_attention
from .masked import MASKED
from .probabilities import PROBABILITIES
from .recomputed import RECOMPUTED

__all__ = ["FLEX", "FLEX_ROUTE", "FUSED", "MASKED", "PROBABILITIES", "RECOMPUTED", "ROUTES", "ROUTE_SETTINGS",
           "SCORE_TRAINS", "Attention", "AttentionPlan", "FlexFallback", "FlexParts", "Route", "RouteGaveUp",
           "bias_score_mod", "causal_block_mask", "causal_mask", "check_route_setting", "diagonal_sums",
           "flex_attend", "flex_parts", "forced_route", "masked_attention", "plan_attention", "position_block",
           "position_parts",
           "route_setting", "shared_masks", "use_route", "with_causal"]
