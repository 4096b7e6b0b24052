"""The positional-scheme interface shared by every encoding.

A scheme may act at three points of a transformer; each hook defaults to
"no effect", so a scheme overrides only what it needs:

* ``embed(x, pos)``: returns what is added to the token embeddings
  (sinusoidal, learned, CAPE). Called once, at the input.
* ``rotate(q, k, q_pos, k_pos)``: transforms queries and keys (RoPE, xPos).
* ``bias(q, k, q_pos, k_pos)``: an additive term on the attention logits of
  shape (B or 1, H, Tq, Tk), already on the scale of the final logits
  (ALiBi, T5, Shaw, Transformer-XL, TUPE, KERPLE, FIRE).

A scheme that needs the attention probabilities (Shaw's relative values)
sets ``uses_value_term`` and implements ``value_term``.

Positions are explicit int64 tensors of shape (T,), so a model can be
evaluated at any offset and length.

Every scheme also names its logit terms (``terms``), used by the Ke et al.
analysis. Their sum equals the logits the attention really uses; a test
checks it for every scheme.
"""

from __future__ import annotations

import math

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
    #: the scheme needs attention probabilities (``value_term``)
    uses_value_term: bool = False
    #: the scheme changes the attention logits (bias) or not
    has_bias: bool = False
    #: the bias depends on positions alone (not on q, k): the model computes it,
    #: with the causal mask folded in, once per forward and scheme instance
    position_only_bias: bool = False
    #: the logits depend on positions only through the distance j - i, so shifting
    #: every position by the same amount changes nothing. A claim about the math, so
    #: it is declared; the tests check it both ways (unchanged under a shift when
    #: True, changed when False)
    relative: bool = False

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
        if cls.rotate is not PositionalScheme.rotate:
            return "rotary"
        if cls.embed is not PositionalScheme.embed:
            return "absolute"
        return "none"

    # ------------------------------------------------------------------ hooks
    def embed(self, x: Tensor, pos: Tensor) -> Tensor | None:
        """What is added to token embeddings x (B, T, D) at positions pos (T,)."""
        return None

    def rotate(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        """Transform q (B, H, Tq, Dh) and k (B, H, Tk, Dh)."""
        return q, k

    def bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """Additive logit term, (B or 1, H, Tq, Tk), on the final logit scale."""
        return None

    def value_term(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """Added to the attention output, from probabilities (B, H, Tq, Tk)."""
        raise NotImplementedError

    # A position-only bias is also available in two parts, which attention's
    # memory-light backward (``posenc.attention``) uses for contiguous positions:
    #   bias = bias_block(...) + toeplitz(relative_bias(j - i)),
    # a part that depends on j - i alone (``relative_bias``, evaluated on the
    # 2T - 1 distinct distances; None if there is none) and the rest
    # (``bias_block``, built a block of query rows at a time from
    # ``bias_parts``, what every block shares; None if there is none). The
    # defaults put everything in ``bias_block``.
    def relative_bias(self, rel: Tensor) -> Tensor | None:
        """The part of a position-only bias that depends on j - i alone: (H, R)
        for relative positions ``rel`` (R,), or None."""
        return None

    def bias_parts(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, ...]:
        """Tensors shared by every block of ``bias_block``."""
        return ()

    def bias_block(
        self, parts: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor, rows: slice, cols: slice
    ) -> Tensor | None:
        """The part of the bias outside ``relative_bias`` for query rows ``rows`` and
        key columns ``cols``, (1, H, rows, cols), or None."""
        return self.bias(None, None, q_pos[rows], k_pos[cols])

    def position_bias(self, pos: Tensor) -> Tensor:
        """``bias(None, None, pos, pos)`` of a position-only scheme, built from the
        two parts when ``pos`` is contiguous (the relative part on 2T - 1 distances)."""
        if not is_contiguous(pos):
            return self.bias(None, None, pos, pos)
        T, every = pos.shape[0], slice(None)
        b = self.bias_block(self.bias_parts(pos, pos), pos, pos, every, every)
        vals = self.relative_bias(torch.arange(1 - T, T, device=pos.device))
        if vals is not None:
            rel = toeplitz(vals, T, T)[None]
            b = rel if b is None else b + rel
        return b

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


def check_positions(pos: Tensor) -> None:
    if pos.dim() != 1 or pos.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"positions must be a 1-D integer tensor, got {tuple(pos.shape)} {pos.dtype}")


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


def relative_positions(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Tq, Tk) matrix of key position minus query position (j - i)."""
    return k_pos[None, :] - q_pos[:, None]
