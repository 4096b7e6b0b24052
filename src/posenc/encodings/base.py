"""The positional-scheme interface shared by every encoding.

A scheme is the parts it defines. Every part defaults to "no effect", so a
scheme defines only what it needs:

* ``embed(x, pos)``: what is added to the token embeddings (sinusoidal,
  learned, CAPE). Called once, at the input.
* ``rotate(q, k, q_pos, k_pos)``: transforms queries and keys (RoPE, xPos).
* ``relative_bias(rel)``: an additive logit term of the distance j - i alone,
  one value per head and distance, (H, R) (ALiBi, T5, KERPLE, TUPE-R's buckets).
* ``absolute_bias(q_pos, k_pos)``: any other additive logit term from positions
  alone, (1, H, Tq, Tk) (FIRE, TUPE's untied positional correlation).
* ``content_bias(q, k, q_pos, k_pos)``: an additive logit term that reads the
  queries or keys, (B or 1, H, Tq, Tk) (Shaw, skew, Transformer-XL, the fixed
  bidirectional encoding).
* ``value_term(probs, q_pos, k_pos)``: added to the attention output, from the
  attention probabilities (Shaw's relative values).

Every bias part is on the scale of the final logits. What kind of scheme a class
is follows from the parts it defines and from nothing else: ``has_bias``,
``position_only_bias`` and ``uses_value_term`` are derived when the class is
created (``__init_subclass__``), so the attention route, the logits and the Ke et
al. terms cannot disagree about a scheme. A class that sets one of them, or
defines the composite ``bias`` or ``position_bias`` itself, is refused with a
TypeError naming the parts to define instead. ``bias`` (every bias part, summed)
is what ``Attention.logits`` and ``terms`` use; attention's memory-light backward
reads the position parts directly (``relative_bias`` once on the 2T - 1
distances, ``absolute_block`` a block of query rows at a time).

Three settings are choices, not parts, and stay class attributes:
``shared_across_layers``, ``causal_only`` and ``relative`` (a claim about the math,
which the tests check both ways).

Positions are explicit int64 tensors of shape (T,), so a model can be
evaluated at any offset and length.

Every scheme also names its logit terms (``terms``), used by the Ke et al.
analysis. Their sum equals the logits the attention really uses; a test
checks it for every scheme.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

TERM_NAMES = ("word-word", "word-position", "position-word", "position-position")
#: the kinds of scheme (``PositionalScheme.family``), in the order figures show them
FAMILIES = ("none", "absolute", "rotary", "position bias", "content-relative")


class PositionalScheme(nn.Module):
    """Base class: no positional information at all (NoPE).

    Args:
        d_model: model width.
        n_heads: number of attention heads.
        max_len: the longest sequence the model is built for. Only schemes
            with a finite table (``learned``) refuse longer inputs.
        causal: whether attention is causal (decoder) or bidirectional.
    """

    #: one instance is handed to every layer (parameters shared across layers)
    shared_across_layers: bool = True
    #: the scheme only makes sense in causal attention
    causal_only: bool = False
    #: the logits depend on positions only through the distance j - i, so shifting
    #: every position by the same amount changes nothing. A claim about the math, so
    #: it is declared; the tests check it both ways (unchanged under a shift when
    #: True, changed when False)
    relative: bool = False

    # Derived from the parts a class defines (``__init_subclass__``), never set by hand.
    #: the scheme adds to the attention logits (a bias part)
    has_bias: bool = False
    #: its bias depends on positions alone (a relative or absolute part and no content
    #: part): the model computes it from positions, with the causal mask folded in, once
    #: per forward and scheme instance (or, for a layer's own in training, a block of
    #: query rows at a time: ``attention.position_block``)
    position_only_bias: bool = False
    #: the scheme needs the attention probabilities (``value_term``)
    uses_value_term: bool = False

    #: the parts a scheme may define, and what is derived from them
    PARTS = ("embed", "rotate", "relative_bias", "absolute_bias", "content_bias", "value_term")
    DERIVED = ("has_bias", "position_only_bias", "uses_value_term", "bias", "position_bias")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        own = [name for name in PositionalScheme.DERIVED if name in cls.__dict__]
        if own:
            raise TypeError(
                f"{cls.__name__} defines {', '.join(own)}, which follow from the parts a scheme defines: "
                "define relative_bias(rel) (a bias of j - i alone), absolute_bias(q_pos, k_pos) (any other bias "
                "from positions), content_bias(q, k, q_pos, k_pos) (a bias that reads q or k) or "
                "value_term(probs, q_pos, k_pos) instead"
            )
        content = cls.defines("content_bias")
        cls.has_bias = cls.defines("relative_bias") or cls.defines("absolute_bias") or content
        cls.position_only_bias = cls.has_bias and not content
        cls.uses_value_term = cls.defines("value_term")

    @classmethod
    def defines(cls, part: str) -> bool:
        """Whether the class defines (overrides) ``part``, one of ``PARTS``."""
        if part not in PositionalScheme.PARTS:
            raise ValueError(f"{part!r} is not a part of a scheme; the parts are {', '.join(PositionalScheme.PARTS)}")
        return getattr(cls, part) is not getattr(PositionalScheme, part)

    def __init__(self, *, d_model: int, n_heads: int, max_len: int = 1024, causal: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(
                f"model.d_model={d_model} is not divisible by model.n_heads={n_heads}; "
                "choose a head count that divides the width"
            )
        if self.causal_only and not causal:
            raise ValueError(
                f"encoding {type(self).__name__} is defined for causal attention only; "
                "use a causal task (task=lm) or another encoding"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.max_len = max_len
        self.causal = causal

    @classmethod
    def family(cls) -> str:
        """The kind of scheme, read from what it defines (one of ``FAMILIES``):
        ``content-relative`` (a bias that depends on q or k, or a value term),
        ``position bias`` (a bias from positions alone), ``rotary`` (``rotate``),
        ``absolute`` (``embed``) or ``none``. The first that applies wins, in that
        order. Figures group schemes by it."""
        if cls.uses_value_term or (cls.has_bias and not cls.position_only_bias):
            return "content-relative"
        if cls.has_bias:
            return "position bias"
        if cls.defines("rotate"):
            return "rotary"
        if cls.defines("embed"):
            return "absolute"
        return "none"

    # ------------------------------------------------------------------ parts
    def embed(self, x: Tensor, pos: Tensor) -> Tensor | None:
        """What is added to token embeddings x (B, T, D) at positions pos (T,)."""
        return None

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Transform q (B, H, Tq, Dh) and k (B, H, Tk, Dh)."""
        return q, k

    def relative_bias(self, rel: Tensor) -> Tensor | None:
        """A bias that depends on j - i alone: (H, R) for relative positions ``rel`` (R,)."""
        return None

    def absolute_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """A bias from positions that is not a function of j - i alone, (1, H, Tq, Tk)."""
        return None

    def content_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """A bias that reads the (rotated) queries q (B, H, Tq, Dh) or keys k (B, H, Tk, Dh),
        (B or 1, H, Tq, Tk)."""
        return None

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Added to the attention output, from probabilities (B, H, Tq, Tk)."""
        raise NotImplementedError

    # The absolute part a block of query rows at a time, for attention's memory-light
    # backward: ``absolute_parts`` are tensors every block shares (TUPE's projected
    # tables), ``absolute_block`` one block. The defaults evaluate ``absolute_bias``
    # on the block's positions; a scheme overrides them only to share work.
    def absolute_parts(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, ...]:
        """Tensors shared by every block of ``absolute_block``."""
        return ()

    def absolute_block(
        self, parts: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor, rows: slice, cols: slice
    ) -> Tensor | None:
        """``absolute_bias`` for query rows ``rows`` and key columns ``cols``, (1, H, rows, cols), or None."""
        return self.absolute_bias(q_pos[rows], k_pos[cols])

    def absolute_factors(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor] | None:
        """The absolute part in an exactly low-rank form, or None where it has none (the
        default): factors a (H, Tq, r) and b (H, Tk, r) with ``absolute_bias(q_pos, k_pos)
        = logit_scale() * a @ b^T``, so that attention can append them to the queries and
        keys and keep a fused kernel with no (Tq, Tk) mask (``attention.flex_parts``)."""
        return None

    def absolute_score(self, q_pos: Tensor, k_pos: Tensor) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
        """The absolute part at consecutive positions as an elementwise function of index
        tensors, or None where it has none (the default): ``f(h, i, j)``, with i and j
        indices into q_pos and k_pos, equal to ``absolute_bias(q_pos, k_pos)[0, h, i, j]``,
        built from tensors computed here once. Attention evaluates it inside the kernel, a
        pair at a time, where a scheme has no ``absolute_factors`` (FIRE's MLP)."""
        return None

    def content_factors(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor] | None:
        """The content part in an exactly low-rank form, or None where it has none (the
        default): factors a (B, H, Tq, r) and b (B or 1, H, Tk, r) with ``content_bias(q, k,
        q_pos, k_pos) = logit_scale() * a @ b^T``, appended to the queries and keys as
        ``absolute_factors`` are (``attention.flex_route_attention``)."""
        return None

    @classmethod
    def factors_content(cls) -> bool:
        """Whether the class gives its content part a low-rank form (defines ``content_factors``)."""
        return cls.content_factors is not PositionalScheme.content_factors

    # ------------------------------------------------ derived from the parts, final
    def position_bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """The bias from positions alone, (1, H, Tq, Tk): the absolute part plus the
        relative part laid out by distance (a Toeplitz matrix of the Tq + Tk - 1
        distances for consecutive positions, one value per pair otherwise); None
        without either."""
        out = self.absolute_bias(q_pos, k_pos)
        if not self.defines("relative_bias"):
            return out
        if is_contiguous(q_pos) and is_contiguous(k_pos):
            vals = self.relative_bias(distance_range(q_pos, k_pos))
            rel = None if vals is None else toeplitz(vals, q_pos.shape[0], k_pos.shape[0])[None]
        else:
            d = relative_positions(q_pos, k_pos)
            vals = self.relative_bias(d.flatten())
            rel = None if vals is None else vals.view(-1, *d.shape)[None]
        if rel is None:
            return out
        return rel if out is None else out + rel

    def bias(self, q: Tensor | None, k: Tensor | None, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Every bias part summed, (B or 1, H, Tq, Tk), or None: the additive logit term
        that ``Attention.logits`` and ``terms`` use (q and k may be None when the
        scheme's bias is position-only)."""
        out = self.position_bias(q_pos, k_pos)
        if not self.defines("content_bias"):
            return out
        c = self.content_bias(q, k, q_pos, k_pos)
        return c if out is None else out + c

    def logit_scale(self) -> float:
        """Factor on the content product q.k (1/sqrt(head_dim) by default)."""
        return 1.0 / math.sqrt(self.head_dim)

    def check_length(self, length: int) -> None:
        """Raise if the scheme cannot represent positions up to ``length - 1``."""

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"

    # --------------------------------------------------------------- analysis
    def terms(
        self,
        q_word: Tensor,
        k_word: Tensor,
        q_posn: Tensor | None,
        k_posn: Tensor | None,
        q_pos: Tensor,
        k_pos: Tensor,
    ) -> dict[str, Tensor]:
        """Split the pre-mask attention logits into named terms.

        ``q_word``/``k_word`` are the projections of the word part of the
        layer input, ``q_posn``/``k_posn`` those of the position part (None for
        schemes that add nothing to the input), all (B, H, T, Dh). The default
        covers additive embeddings, rotations (position terms = rotated minus
        unrotated products, all put in position-position) and biases that do
        not depend on content (position-position). Schemes whose bias depends on
        content override this.
        """
        s = self.logit_scale()
        out = {"word-word": q_word @ k_word.transpose(-1, -2) * s}
        if q_posn is not None:
            out["word-position"] = q_word @ k_posn.transpose(-1, -2) * s
            out["position-word"] = q_posn @ k_word.transpose(-1, -2) * s
            out["position-position"] = q_posn @ k_posn.transpose(-1, -2) * s
            q, k = q_word + q_posn, k_word + k_posn
        else:
            q, k = q_word, k_word
        qr, kr = self.rotate(q, k, q_pos, k_pos)
        if qr is not q or kr is not k:
            extra = (qr @ kr.transpose(-1, -2) - q @ k.transpose(-1, -2)) * s
            out["position-position"] = out.get("position-position", 0) + extra
        b = self.bias(qr, kr, q_pos, k_pos)
        if b is not None:
            pp = out.get("position-position", 0) + b
            out["position-position"] = pp.expand(out["word-word"].shape)
        return out


def is_contiguous(pos: Tensor) -> bool:
    """Whether positions are consecutive integers (pos[i] = pos[0] + i)."""
    return pos.numel() < 2 or bool((pos[1:] - pos[:-1] == 1).all())


def toeplitz(vals: Tensor, Tq: int, Tk: int) -> Tensor:
    """(..., Tq, Tk) matrix with [i, j] = vals[..., j - i + Tq - 1], from vals (..., Tq + Tk - 1)
    indexed by the relative position j - i from -(Tq - 1) to Tk - 1 (one copy, no gather).
    Checked against indexing with ``relative_positions`` in the tests."""
    if vals.shape[-1] != Tq + Tk - 1:
        raise ValueError(f"toeplitz needs {Tq + Tk - 1} values for {Tq}x{Tk}, got {vals.shape[-1]}")
    # window w of length Tk starts at vals[w]; row i is window Tq - 1 - i
    return vals.unfold(-1, Tk, 1).flip(-2)


def distance_range(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """The Tq + Tk - 1 distances j - i that consecutive query and key positions span, in
    increasing order (the order ``toeplitz`` reads): k_pos[0] - q_pos[-1] .. k_pos[-1] - q_pos[0]."""
    Tq, Tk = q_pos.shape[0], k_pos.shape[0]
    lo = int(k_pos[0] - q_pos[0]) - (Tq - 1)
    return torch.arange(lo, lo + Tq + Tk - 1, device=q_pos.device)


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Tq, Tk) matrix of key position minus query position (j - i)."""
    return k_pos[None, :] - q_pos[:, None]
