"""Relative schemes whose logit term depends on the query content.

Shaw et al. (learned relative key and value vectors), the Music Transformer
skew (Shaw-style keys computed in O(T·D) memory), Transformer-XL (fixed
sinusoidal R_{i-j}, learned W_R, global u and v) and a fixed two-sided
sinusoidal scheme built from left/right shifts.

The index tricks are public functions with exact contracts:

* :func:`skew` -- (…, T, 2T-1) relative logits -> (…, T, T), one pad, two
  reshapes and two slices (Huang et al. 2018, section 3.4.1, generalised to
  both time directions).
* :func:`relative_shift` -- the Transformer-XL "right" shift for keys at or
  before the query (Dai et al. 2019, appendix B), query no longer than key.
* :func:`relative_shift_future` -- its mirror image ("left" shift) for keys
  at or after the query.
* :func:`relative_shift_two_sided` -- both shifts joined with the two
  triangular masks, so every query-key pair gets its signed distance
  (the construction Kernes describes in "Master Positional Encoding: Part II").

Notation: queries sit at the *last* Tq of Tk key positions, so query i is at
key index p_i = i + Tk - Tq (for self-attention Tq = Tk and p_i = i). A
"distance" in the shift functions is d = p_i - j (query minus key), the index
Transformer-XL uses for R_{i-j}; ``relative_positions`` and Shaw use j - i.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .absolute import sinusoid
from .base import PositionalScheme, distance_range, is_contiguous, relative_positions

# ----------------------------------------------------------------- index tricks


def skew(rel_logits: Tensor, Tk: int | None = None) -> Tensor:
    """Music Transformer skew: (…, Tq, Tq+Tk-1) relative logits -> (…, Tq, Tk) logits.

    Column m of ``rel_logits`` holds relative distance j - i = m - (Tq - 1)
    (column 0: the key Tq-1 steps before the query, column Tq-1: the query
    itself, the last column: Tk-1 steps after it). The result satisfies
    ``out[..., i, j] == rel_logits[..., i, j - i + Tq - 1]`` for every i, j.
    ``Tk`` defaults to Tq (the square case, width 2T-1).

    Only pad / reshape / slice: append one zero column (row length Tq+Tk),
    flatten, drop the first Tq-1 entries so that reading rows of length
    Tq+Tk-1 moves one column left per row, and keep the first Tk columns. The
    padded zeros never reach the output. Memory is O(Tq·Tk) per head, never
    O(T^2·D): callers form ``rel_logits`` as q @ E^T with E the distance table.

    Huang et al. 2018 ("Music Transformer", section 3.4.1) skew only the causal
    half, (T, T) -> (T, T); this is the same trick for both time directions.
    Checked against a direct gather ``rel_logits[i, j - i + Tq - 1]`` in the tests.
    """
    *lead, Tq, W = rel_logits.shape
    Tk = Tq if Tk is None else Tk
    if W != Tq + Tk - 1:
        raise ValueError(f"skew expects (..., Tq, Tq+Tk-1) relative logits (2T-1 when square), got (..., {Tq}, {W})")
    x = F.pad(rel_logits, (0, 1))  # (..., Tq, W+1)
    x = x.reshape(*lead, Tq * (W + 1))
    x = x[..., Tq - 1 : Tq - 1 + Tq * W]  # drop Tq-1 in front
    return x.reshape(*lead, Tq, W)[..., :Tk]


def relative_shift(x: Tensor) -> Tensor:
    """Transformer-XL relative shift for keys at or before the query.

    Input (…, Tq, Tk), Tq <= Tk, columns ordered from distance Tk-1 down to 0:
    ``x[..., i, c]`` is the score of query i for distance d = Tk - 1 - c, where
    d = p_i - j and query i sits at key position p_i = i + Tk - Tq (queries are
    the last Tq of the keys, as with a Transformer-XL memory). Output (…, Tq, Tk)
    with, for every j <= p_i (the visible, lower triangle incl. the diagonal),

        out[..., i, j] == x[..., i, Tq - 1 - i + j]     (the score for d = p_i - j).

    Upper triangle (j > p_i, keys after the query, which the causal mask
    removes): ``out[..., i, p_i + 1] == 0`` (the padding column) and, for
    j > p_i + 1, ``out[..., i, j] == x[..., i + 1, j - p_i - 2]``, a score of the
    *next* query, i.e. garbage for query i. Callers must mask it (the schemes here
    set it to 0).

    Construction (Dai et al. 2019, appendix B; the reference code's
    ``_rel_shift``): pad one zero column on the left, flatten, drop the first Tq
    entries, read rows of length Tk. O(Tq·Tk) memory; checked against an explicit
    R_{i-j} construction in the tests.
    """
    *lead, Tq, Tk = x.shape
    if Tq > Tk:
        raise ValueError(f"relative_shift needs Tq <= Tk, got Tq={Tq}, Tk={Tk}")
    xp = F.pad(x, (1, 0))  # (..., Tq, Tk+1)
    flat = xp.reshape(*lead, Tq * (Tk + 1))
    return flat[..., Tq : Tq + Tq * Tk].reshape(*lead, Tq, Tk)


def relative_shift_future(x: Tensor) -> Tensor:
    """The mirror of :func:`relative_shift`, for keys at or after the query.

    Input (…, Tq, Tk), Tq <= Tk, columns ordered by forward offset: ``x[..., i, c]``
    is the score of query i for the key c steps after it, j = p_i + c (distance
    d = p_i - j = -c), with p_i = i + Tk - Tq as in :func:`relative_shift`.
    Output (…, Tq, Tk) with, for every j >= p_i (upper triangle incl. diagonal),

        out[..., i, j] == x[..., i, j - p_i].

    Lower triangle (j < p_i): ``out[..., i, p_i - 1] == 0`` (the padding column);
    for j < p_i - 1 and i >= 1, ``out[..., i, j] == x[..., i - 1, Tk + 1 + j - p_i]``
    (a score of the previous query: garbage); row 0 left of p_0 is 0.

    Construction: pad one zero column on the right, flatten, prepend Tk - Tq
    zeros, read rows of length Tk. Checked against an explicit R_{i-j}
    construction in the tests.
    """
    *lead, Tq, Tk = x.shape
    if Tq > Tk:
        raise ValueError(f"relative_shift_future needs Tq <= Tk, got Tq={Tq}, Tk={Tk}")
    xp = F.pad(x, (0, 1))  # (..., Tq, Tk+1)
    flat = F.pad(xp.reshape(*lead, Tq * (Tk + 1)), (Tk - Tq, 0))
    return flat[..., : Tq * Tk].reshape(*lead, Tq, Tk)


def relative_shift_two_sided(past: Tensor, future: Tensor) -> Tensor:
    """Join a right and a left shift with the two triangular masks.

    ``past`` is laid out as for :func:`relative_shift` (columns: distance Tk-1
    down to 0) and ``future`` as for :func:`relative_shift_future` (columns:
    forward offset 0 .. Tk-1). The result holds, for every query i and key j,
    the score for signed distance d = p_i - j:

        out[..., i, j] = past[..., i, Tq - 1 - i + j]   if j <= p_i  (tril, diagonal Tk - Tq)
                         future[..., i, j - p_i]        if j >  p_i  (strict triu)

    Each half costs O(Tq·Tk); no (Tq, Tk, D) tensor is formed. This is the
    bidirectional construction of Kernes, "Master Positional Encoding: Part II":
    one shift per time direction, the garbage of each removed by the other's
    triangle. Checked against an explicit R_{i-j} construction in the tests.
    """
    if past.shape[-2:] != future.shape[-2:]:
        raise ValueError(f"past {tuple(past.shape)} and future {tuple(future.shape)} differ in (Tq, Tk)")
    Tq, Tk = past.shape[-2:]
    lower = torch.ones(Tq, Tk, dtype=torch.bool, device=past.device).tril(Tk - Tq)
    return torch.where(lower, relative_shift(past), relative_shift_future(future))


# ------------------------------------------------------------------ helpers


def aligned_positions(q_pos: Tensor, k_pos: Tensor) -> bool:
    """True if keys are consecutive and queries are the last Tq of them.

    The shift / skew constructions assume this layout (it always holds in
    self-attention with positions ``offset + arange(T)``); schemes fall back to
    a gather over the distance range otherwise.
    """
    Tq, Tk = q_pos.shape[0], k_pos.shape[0]
    if Tq > Tk or Tk == 0:
        return False
    consecutive = torch.arange(Tk, device=k_pos.device, dtype=k_pos.dtype) + k_pos[0]
    return bool(torch.equal(k_pos, consecutive) and torch.equal(q_pos, k_pos[Tk - Tq :]))


def relative_logits(
    a: Tensor, table: Callable[[Tensor], Tensor], q_pos: Tensor, k_pos: Tensor, causal: bool
) -> Tensor:
    """out[..., i, j] = a[..., i, :] · E(q_pos[i] - k_pos[j]) for query vectors a (…, Tq, Dh).

    ``table(d)`` maps a 1-D tensor of distances d (query minus key) to vectors
    (…, n, Dh) that broadcast against ``a`` (e.g. (H, n, Dh) or (n, Dh)).
    Aligned positions use :func:`relative_shift` (causal: only distances >= 0
    are computed) or :func:`relative_shift_two_sided` (bidirectional); other
    positions gather from the scores of every distance in their range. In causal
    mode entries with key after query are 0 on both paths (they are masked).
    """
    Tq, Tk = q_pos.shape[0], k_pos.shape[0]
    dev = a.device
    if aligned_positions(q_pos, k_pos):
        past = a @ table(torch.arange(Tk - 1, -1, -1, device=dev)).to(a.dtype).mT  # (..., Tq, Tk)
        if causal:
            visible = torch.ones(Tq, Tk, dtype=torch.bool, device=dev).tril(Tk - Tq)
            return relative_shift(past).masked_fill(~visible, 0.0)
        future = a @ table(-torch.arange(Tk, device=dev)).to(a.dtype).mT  # (..., Tq, Tk)
        return relative_shift_two_sided(past, future)
    dist = q_pos[:, None] - k_pos[None, :]  # (Tq, Tk), i - j
    lo, hi = int(dist.min()), int(dist.max())
    scores = a @ table(torch.arange(lo, hi + 1, device=dev)).to(a.dtype).mT  # (..., Tq, n)
    out = scores.gather(-1, (dist - lo).expand(*scores.shape[:-1], Tk))
    return out.masked_fill(dist < 0, 0.0) if causal else out


class ContentBiasTerms:
    """``terms`` for a scheme whose bias reads the queries or keys and that adds nothing
    to the input (Shaw, skew, the fixed bidirectional encoding, or one of your own: mix it
    in before ``PositionalScheme``): word-word is q · k of the word parts, word-position
    the bias evaluated on the word queries and keys."""

    def terms(self, q_word, k_word, q_posn, k_posn, q_pos, k_pos):
        if q_posn is not None:
            raise ValueError(f"{type(self).__name__} adds nothing to the input; got a position part")
        ww = q_word @ k_word.transpose(-1, -2) * self.logit_scale()
        return {"word-word": ww, "word-position": self.bias(q_word, k_word, q_pos, k_pos).expand(ww.shape)}


# ------------------------------------------------------------------ schemes


class Shaw(ContentBiasTerms, PositionalScheme):
    """Learned relative key and value vectors (Shaw, Uszkoreit & Vaswani 2018).

    e_ij = q_i · (k_j + a^K_ij) / sqrt(d), z_i = sum_j alpha_ij (v_j + a^V_ij),
    with a^K_ij = w^K_{clip(j - i, -k, k)} and a^V likewise (eqs. 3-5). As in
    the paper the 2k+1 vectors are shared by the heads of a layer and each layer
    has its own (``shared_across_layers = False``).

    Computed without a (T, T, D) tensor: key part q @ (w^K)^T, (B, H, Tq, 2k+1),
    gathered by clipped distance (its gradient summed per distance,
    ``_ByClippedDistance``); value part sums the probabilities of each clipped
    distance (``per_distance``) and multiplies by w^V. Checked against the naive
    O(T^2·D) gather of a^K_ij and a^V_ij, both parts, and the key part's gradients,
    in test_shaw_vs_naive_gather.

    Args:
        max_relative_position: the clipping distance k (16 in the paper's
            base model; they report no gain beyond k = 2 for translation).
        init_std: standard deviation of the initial vectors.
    """

    relative = True
    shared_across_layers = False

    def __init__(self, *, max_relative_position: int = 16, init_std: float = 0.02, **kw):
        super().__init__(**kw)
        if max_relative_position < 0:
            raise ValueError(f"encoding.scheme.max_relative_position={max_relative_position} must be >= 0")
        self.max_relative_position = max_relative_position
        n = 2 * max_relative_position + 1
        self.rel_key = nn.Parameter(torch.randn(n, self.head_dim) * init_std)
        self.rel_value = nn.Parameter(torch.randn(n, self.head_dim) * init_std)

    def index(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(Tq, Tk) row of the tables for each pair: clip(j - i, -k, k) + k."""
        k = self.max_relative_position
        return relative_positions(q_pos, k_pos).clamp(-k, k) + k

    def content_bias(self, q, k, q_pos, k_pos):
        scores = q @ (self.rel_key.to(q.dtype).T * self.logit_scale())  # (B, H, Tq, 2k+1), scaled before the gather
        return _ByClippedDistance.apply(scores, self, q_pos, k_pos)

    def value_term(self, probs, q_pos, k_pos):
        return self.per_distance(probs, q_pos, k_pos, self.causal) @ self.rel_value.to(probs.dtype)  # (B, H, Tq, Dh)

    def per_distance(self, probs: Tensor, q_pos: Tensor, k_pos: Tensor, later_zero: bool = False) -> Tensor:
        """The sums of each row of ``probs`` (..., Tq, Tk) over each clipped distance, (..., Tq, 2k+1):
        the probability mass on each, or the gradient of the key scores from that of the logits.

        For consecutive positions, without a scatter of every pair: the 2k - 1
        unclipped distances are single entries (one gather of Tq x (2k - 1)); the
        sum at j - i >= k is the row sum of an upper triangle over the keys where one
        can start (none with ``later_zero``: causal attention's probabilities, which the
        mask makes 0 at every later key), and the sum at j - i <= -k the rest of the
        row. Otherwise a scatter of every pair. The same sums in another order
        (checked against the naive gather in test_shaw_vs_naive_gather)."""
        k = self.max_relative_position
        Tq, Tk = probs.shape[-2:]
        if not (is_contiguous(q_pos) and is_contiguous(k_pos)) or Tq == 0 or Tk == 0:
            idx = self.index(q_pos, k_pos).expand_as(probs)
            return probs.new_zeros(*probs.shape[:-1], 2 * k + 1).scatter_add(-1, idx, probs)
        total = probs.sum(-1, keepdim=True)
        if k == 0:
            return total
        shift = int(q_pos[0] - k_pos[0])  # the column of distance d in row i is i + d + shift
        col = torch.arange(Tq, device=probs.device)[:, None] + shift + torch.arange(1 - k, k, device=probs.device)
        inside = ((col >= 0) & (col < Tk)).to(probs.dtype)
        middle = probs.gather(-1, col.clamp(0, Tk - 1).expand(*probs.shape[:-1], 2 * k - 1)) * inside
        first = min(Tk, max(0, k + shift))  # the first key at distance k or more from some row
        if later_zero or first == Tk:
            right = torch.zeros_like(total)
        else:
            right = probs[..., first:].triu(k + shift - first).sum(-1, keepdim=True)
        left = total - middle.sum(-1, keepdim=True) - right
        return torch.cat([left, middle, right], -1)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_relative_position={self.max_relative_position}"


class _ByClippedDistance(torch.autograd.Function):
    """Shaw's key scores (..., Tq, 2k+1) laid out by clipped distance, (..., Tq, Tk): a gather
    forward; backward, each score's gradient is the sum of the logits' gradients over the
    pairs at its distance, ``per_distance`` (a gather of the 2k - 1 unclipped distances and
    row sums for consecutive positions), not the scatter of every pair that autograd's
    gather backward is. Checked against autograd through the gather in
    test_shaw_vs_naive_gather."""

    @staticmethod
    def forward(ctx, scores, scheme, q_pos, k_pos):
        ctx.scheme = scheme
        ctx.save_for_backward(q_pos, k_pos)
        idx = scheme.index(q_pos, k_pos)
        return scores.gather(-1, idx.expand(*scores.shape[:-1], idx.shape[-1]))

    @staticmethod
    def backward(ctx, g):
        q_pos, k_pos = ctx.saved_tensors
        return ctx.scheme.per_distance(g, q_pos, k_pos), None, None, None


class SkewRelative(ContentBiasTerms, PositionalScheme):
    """Shaw-style relative keys computed with the Music Transformer skew
    (Huang et al. 2018, "Music Transformer", section 3.4.1).

    logits_ij += q_i · E_{clip(j - i)} / sqrt(d): the (2T-1, D) table of the
    distances present is gathered once, multiplied by q to (B, H, T, 2T-1) and
    rearranged with :func:`skew` -- O(T·D) memory for the table, never a
    (T, T, D) tensor. Unlike :class:`Shaw` there is no value term and, as in the
    Music Transformer, no clipping below the model length by default. One table
    per layer, shared by its heads. Positions that are not ``offset + arange(T)``
    fall back to a gather over the distance range (same values). Checked against
    the naive gather of E_{j-i} into (T, T, D), at consecutive, offset and gapped
    positions, in test_skew_scheme_vs_naive_gather, and the skew itself in
    test_skew_matches_gather.

    Args:
        max_relative_position: clipping distance; None = ``max_len - 1``
            (longer sequences clip to it).
        init_std: standard deviation of the initial vectors.
    """

    relative = True
    shared_across_layers = False

    def __init__(self, *, max_relative_position: int | None = None, init_std: float = 0.02, **kw):
        super().__init__(**kw)
        k = self.max_len - 1 if max_relative_position is None else max_relative_position
        if k < 0:
            raise ValueError(f"encoding.scheme.max_relative_position={k} must be >= 0")
        self.max_relative_position = k
        self.rel_key = nn.Parameter(torch.randn(2 * k + 1, self.head_dim) * init_std)

    def _table(self, dist_ji: Tensor) -> Tensor:
        k = self.max_relative_position
        return self.rel_key[dist_ji.clamp(-k, k) + k]  # (n, Dh)

    def content_bias(self, q, k, q_pos, k_pos):
        s = self.logit_scale()
        if is_contiguous(q_pos) and is_contiguous(k_pos):  # the distances j - i present, in increasing order
            table = self._table(distance_range(q_pos, k_pos).to(q.device)).to(q.dtype)
            return skew(q @ table.T, k_pos.shape[0]) * s  # (B, H, Tq, Tq+Tk-1) -> (B, H, Tq, Tk)
        # relative_logits uses i - j; the table is indexed by j - i
        return relative_logits(q, lambda d: self._table(-d), q_pos, k_pos, causal=False) * s

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_relative_position={self.max_relative_position}"


class TransformerXL(PositionalScheme):
    """Transformer-XL relative attention (Dai et al. 2019, section 3.3):

        A_ij = (q_i + u) · k_j + (q_i + v) · W_R R_{i-j}      (times 1/sqrt(d))

    i.e. the terms (a) q·k, (b) q·W_R R, (c) u·k, (d) v·W_R R of eq. 3 with
    E W_q -> q, U_j W_k -> k. R is the fixed sinusoid of the distance i - j
    (width d_model), W_R a learned d_model x d_model map split into heads, u and
    v learned per head and independent of the query position ("global"). Each
    layer has its own W_R, u and v (the reference code's ``untie_r=True``).

    Computed with :func:`relative_shift` (causal: distances >= 0 only; future
    entries set to 0, they are masked) or :func:`relative_shift_two_sided`
    (bidirectional, R of negative distances), so the query may be shorter
    than the key (a memory; see ``relative_logits``). Checked against an
    explicit R_{i-j} construction, including Tq < Tk, in
    test_transformer_xl_vs_explicit_R, and the shifts themselves in
    test_relative_shift_exact_contents.
    """

    relative = True
    shared_across_layers = False

    def __init__(self, *, base: float = 10000.0, init_std: float = 0.02, **kw):
        super().__init__(**kw)
        self.base = base
        self.u = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * init_std)
        self.v = nn.Parameter(torch.randn(self.n_heads, self.head_dim) * init_std)
        self.w_r = nn.Linear(self.d_model, self.d_model, bias=False)

    def r(self, dist: Tensor) -> Tensor:
        """W_R R_d for distances d (n,) -> (H, n, Dh)."""
        R = sinusoid(dist, self.d_model, self.base).to(self.w_r.weight.dtype)  # (n, D)
        return self.w_r(R).view(-1, self.n_heads, self.head_dim).transpose(0, 1)

    def _parts(self, q, k, q_pos, k_pos):
        Tq = q.shape[-2]
        rel_q = relative_logits(q, self.r, q_pos, k_pos, self.causal)  # (b) word-position
        v = self.v.to(q.dtype)[None, :, None, :].expand(1, self.n_heads, Tq, self.head_dim)
        rel_v = relative_logits(v, self.r, q_pos, k_pos, self.causal)  # (d) position-position
        uk = self.u.to(k.dtype)[None, :, None, :] @ k.transpose(-1, -2)  # (c) (B, H, 1, Tk)
        return rel_q, uk, rel_v

    def content_bias(self, q, k, q_pos, k_pos):
        a = q + self.v.to(q.dtype)[None, :, None, :]  # (B, H, Tq, Dh)
        rel = relative_logits(a, self.r, q_pos, k_pos, self.causal)  # (B, H, Tq, Tk)
        uk = self.u.to(k.dtype)[None, :, None, :] @ k.transpose(-1, -2)  # (B, H, 1, Tk)
        return (rel + uk) * self.logit_scale()

    def terms(self, q_word, k_word, q_posn, k_posn, q_pos, k_pos):
        if q_posn is not None:
            raise ValueError("TransformerXL adds nothing to the input; got a position part")
        s = self.logit_scale()
        ww = q_word @ k_word.transpose(-1, -2) * s
        rel_q, uk, rel_v = self._parts(q_word, k_word, q_pos, k_pos)
        return {
            "word-word": ww,
            "word-position": rel_q * s,
            "position-word": (uk * s).expand(ww.shape),
            "position-position": (rel_v * s).expand(ww.shape),
        }


class FixedBidirectional(ContentBiasTerms, PositionalScheme):
    """Fixed sinusoidal relative logits in both time directions:
    logits_ij += q_i · R_{i-j} / sqrt(d), R the sinusoid (width head_dim) of the
    signed distance i - j, so earlier and later keys differ (sin is odd). This is
    the word-position term of Transformer-XL (Dai et al. 2019) without W_R, u
    and v, extended to keys after the query.

    No parameters. Built from one right shift (keys at or before the query) and
    one left shift (keys after it) joined by the two triangular masks
    (:func:`relative_shift_two_sided`), O(T·D) for the tables and O(T^2) for
    the logits, as J. Kernes describes in "Master Positional Encoding: Part II"
    (Towards Data Science, 2021); causal attention computes only the right
    shift. Checked against an explicit R_{i-j} construction in
    test_fixed_bidirectional_vs_explicit_R, and the shifts themselves in
    test_relative_shift_exact_contents.
    """

    relative = True

    def __init__(self, *, base: float = 10000.0, **kw):
        super().__init__(**kw)
        self.base = base

    def r(self, dist: Tensor) -> Tensor:
        return sinusoid(dist, self.head_dim, self.base)  # (n, Dh)

    def content_bias(self, q, k, q_pos, k_pos):
        return relative_logits(q, self.r, q_pos, k_pos, self.causal) * self.logit_scale()

    def content_factors(self, q, k, q_pos, k_pos):
        """q_i · R_{i-j} by angle addition, for every pair (both directions, any positions):
        with w the frequency of a sin slot s and its cos slot c,
        q_s sin((i - j)w) + q_c cos((i - j)w) = cos(jw) (q_s sin(iw) + q_c cos(iw))
        + sin(jw) (q_c sin(iw) - q_s cos(iw)), so a = those two brackets and b = (cos jw, sin jw),
        one extra dimension per slot. Angles in float64, as ``sinusoid`` takes them. Checked
        against ``content_bias`` in tests/test_flex.py."""
        half = (self.head_dim + 1) // 2
        inv_freq = self.base ** (-torch.arange(half, dtype=torch.float64, device=q.device) * 2 / self.head_dim)
        a_q, a_k = q_pos.to(torch.float64)[:, None] * inv_freq, k_pos.to(torch.float64)[:, None] * inv_freq
        sin_i, cos_i = a_q.sin().to(q.dtype), a_q.cos().to(q.dtype)
        q_s, q_c = q[..., 0::2], q[..., 1::2]
        if q_c.shape[-1] < half:  # an odd head_dim has no last cos slot
            q_c = F.pad(q_c, (0, 1))
        a = torch.cat([q_s * sin_i + q_c * cos_i, q_c * sin_i - q_s * cos_i], -1)
        b = torch.cat([a_k.cos(), a_k.sin()], -1).to(k.dtype)
        return a, b[None, None].expand(1, self.n_heads, -1, -1)
