"""The ``flex`` route: FlexAttention reads a position-only bias (or a content bias in low-rank
form) inside the kernel, with nothing of size T^2 built; gated, probed once per kind of call,
and left for the float-mask routes, with one warning, where anything fails."""

from __future__ import annotations

import itertools
import logging
import warnings
import weakref

import torch

from ..compiling import RecompileLimitHit
from ..encodings.base import PositionalScheme, is_contiguous
from .base import AttentionPlan, Route, RouteGaveUp, drops
from .flex_gates import appended_width, call_dtype, device_gate, probe, route_setting
from .flex_kernel import flex_attend, flex_parts

log = logging.getLogger(__name__)

FLEX = "flex"

#: whether a score function (an absolute part FlexAttention evaluates a pair at a time, FIRE's)
#: takes the flex route with gradients on. Not yet: its backward has not been measured on a GPU
#: (Inductor's backward of FlexAttention refuses a tensor that requires a gradient and is indexed
#: more than once; FIRE's score now indexes each such tensor once, which Inductor's check accepts
#: on the CPU, tests/test_flex.py, but no GPU has run it). Until one has, such a scheme trains
#: on a float-mask route and evaluates on the flex route; a GPU measurement lifts it here.
SCORE_TRAINS = False


class FlexFallback(UserWarning):
    """The flex route failed for a kind of call; those calls take a float-mask route."""


class FlexRoute(Route):
    """FlexAttention (``flex_kernel.flex_attend``): the relative table and an absolute score read
    in ``score_mod``, exactly low-rank absolute and content parts appended to q and k, causality
    a block mask. It serves a position-only bias, or a content bias with ``content_factors``,
    without a value term, whose absolute part has a form (``flex_parts``; TUPE with [CLS]
    untied has none), and a score function only without gradients (``SCORE_TRAINS``); a call
    needs contiguous positions and no attention dropout (FlexAttention has none).

    ``attention.route`` decides the rest (``flex_gates``): ``masked`` never takes the route,
    ``flex`` always where it serves, ``auto`` where the gates pass (torch, a CUDA GPU of compute
    capability 8.0 or more, head dims, Triton, dynamo) and then the probe, run once per (scheme
    class, dtype, head dims, causal, grad mode, device): a small forward and backward against
    the float-mask route. A probe that fails warns once, naming the scheme and the reason, and
    those calls take a float-mask route for the rest of the process; so does a kind of call
    whose kernel fails later, at a size the probe did not try (under ``flex`` such a failure
    raises). A call that reaches the compiled kernel's recompilation limit warns once and sends
    every later call to the float-mask routes (``RouteGaveUp``: the layer plans again), never
    to the unfused kernel."""

    name = FLEX

    def __init__(self):
        self.verdicts: dict = {}  # kind of call -> None (flex) or the reason it is not taken
        self.refused: str | None = None  # why no call takes the route any more (the recompile limit)
        self._forms: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheme -> its form
        self._widths: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # scheme -> appended width

    def reset(self) -> None:
        """Forget every verdict and refusal (a new process's state; for tests)."""
        self.verdicts.clear()
        self.refused = None

    def form(self, scheme: PositionalScheme) -> str | None:
        """The form of the scheme's bias on the route: None (it has none), "score" (its absolute part
        is a score function) or "parts" (a relative table and low-rank factors alone)."""
        if scheme not in self._forms:
            held = next(itertools.chain(scheme.parameters(), scheme.buffers()), None)
            pos = torch.arange(2, device=None if held is None else held.device)
            with torch.no_grad():
                parts = flex_parts(scheme, pos)
            self._forms[scheme] = None if parts is None else "score" if parts.score is not None else "parts"
        return self._forms[scheme]

    def serves(self, scheme):
        kind = (scheme.position_only_bias or scheme.factors_content()) and not scheme.uses_value_term
        form = self.form(scheme) if kind else None
        return form is not None and (form != "score" or SCORE_TRAINS or not torch.is_grad_enabled())

    def trains_on(self, device_type):
        return device_type == "cuda"  # no backward for q, k, v elsewhere

    def applies(self, attn, x, pos):
        setting = route_setting()
        if setting == "masked" or self.refused or drops(attn) or not is_contiguous(pos) or not self.serves(attn.scheme):
            return False
        return setting == FLEX or self.verdict(attn, x) is None

    def plan(self, layers, x, pos):
        flex: dict = {}  # one set of parts per scheme instance, shared by the layers that share it
        for attn in layers:
            if attn.scheme not in flex:
                flex[attn.scheme] = flex_parts(attn.scheme, pos)
        return AttentionPlan(self, flex=flex)

    def attend(self, attn, q, k, v, pos, plan):
        if self.refused:
            raise RouteGaveUp(self.refused)
        key = self.key(attn, q.dtype, q.device)
        if self.verdicts.get(key):  # an earlier layer of this forward failed such a call
            raise RouteGaveUp(self.verdicts[key])
        try:
            return self.attend_parts(attn, q, k, v, pos, plan.flex[attn.scheme])
        except RecompileLimitHit as e:  # every call would need a new graph too: the route is done
            self.refused = str(e)
            warnings.warn(f"{type(attn.scheme).__name__} and every scheme after it take the float-mask routes from "
                          f"here on, not FlexAttention: {e}", FlexFallback, stacklevel=2)
            raise RouteGaveUp(self.refused) from e
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # a kernel that fails at a size the probe did not try
            if route_setting() == FLEX:
                raise
            self.verdicts[key] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            self.warn(attn.scheme, key, self.verdicts[key])
            raise RouteGaveUp(self.verdicts[key]) from e

    def attend_parts(self, attn, q, k, v, pos, parts):
        """Rotation, the content factors, then ``flex_attend`` with ``parts``."""
        sch = attn.scheme
        q, k = sch.rotate(q, k, pos, pos)
        content = sch.content_factors(q, k, pos, pos) if sch.factors_content() else None
        return flex_attend(q, k, v, parts, attn.causal, sch.logit_scale(), content)

    def key(self, attn, dtype: torch.dtype, device: torch.device) -> tuple:
        """The kind of call a verdict holds for: (scheme class, dtype, q/k head dim with the
        appended factors, v head dim, causal, grad mode, device)."""
        sch = attn.scheme
        if sch not in self._widths:
            with torch.no_grad():
                parts = flex_parts(sch, torch.arange(1, device=device))
                self._widths[sch] = appended_width(sch, parts, dtype, device)
        return (type(sch), dtype, sch.head_dim + self._widths[sch], sch.head_dim, attn.causal,
                torch.is_grad_enabled(), str(device))

    @torch.compiler.disable
    def verdict(self, attn, x) -> str | None:
        """None where ``auto`` takes the route for such a call, else the reason: the gates, then
        the probe, once per kind of call (a failed probe warns, once)."""
        key = self.key(attn, call_dtype(x), x.device)
        if key not in self.verdicts:
            _, _, qk, v, *_ = key
            reason = device_gate(x.device, qk, v)
            if reason is None:
                reason = self.probe(attn, x, torch.arange(1, device=x.device))
                if reason is not None:
                    self.warn(attn.scheme, key, reason)
            elif x.device.type == "cuda":
                log.info("%s keeps to the float-mask routes on %s: %s", type(attn.scheme).__name__, x.device, reason)
            self.verdicts[key] = reason
        return self.verdicts[key]

    @staticmethod
    def warn(scheme: PositionalScheme, key: tuple, reason: str) -> None:
        """The one warning of a kind of call that leaves the route: the scheme and the reason."""
        _, dtype, qk, v, causal, grad, device = key
        warnings.warn(f"{type(scheme).__name__} takes a float-mask route, not FlexAttention, on {device} ({dtype}, "
                      f"q/k dim {qk}, v dim {v}, {'causal' if causal else 'bidirectional'}, gradients "
                      f"{'on' if grad else 'off'}): {reason}", FlexFallback, stacklevel=4)

    def probe(self, attn, x, pos):
        def flex(q, k, v, pos):
            return self.attend_parts(attn, q, k, v, pos, flex_parts(attn.scheme, pos))

        return probe(attn, flex, call_dtype(x), x.device)
