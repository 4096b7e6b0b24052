"""Position-bias schemes: an additive term on the attention logits from positions alone
(ALiBi, T5, KERPLE, FIRE; TUPE in ``tupe``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .. import native
from .base import PositionalScheme, distance_range, is_contiguous, toeplitz


def alibi_slopes(num_heads: int) -> Tensor:
    """Head slopes of ALiBi (Press et al. 2022, section 3 and their footnote).

    For n a power of two the slopes are the geometric sequence starting at
    2^(-8/n) with that ratio (n=8: 1/2, 1/4, ..., 1/256). Otherwise take the
    slopes of the closest power of two m below n, then every other slope of
    the sequence for 2m until n are chosen. Checked against the values the
    paper lists (n=8) and its rule for n=12 in the tests.
    """
    if num_heads < 1:
        raise ValueError("num_heads must be positive")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    m = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(m)
    if m < num_heads:
        slopes += power_of_two(2 * m)[0::2][: num_heads - m]
    return torch.tensor(slopes, dtype=torch.float32)


def t5_relative_bucket(
    relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> Tensor:
    """T5's bucket of each relative position (key position minus query position).

    Raffel et al. 2020 / the T5 reference code: half the buckets (per
    direction when bidirectional) hold exact distances 0..max_exact-1, the rest
    grow logarithmically up to ``max_distance``; farther distances share the
    last bucket. Bidirectional: keys after the query get buckets offset by
    num_buckets / 2. Causal: keys after the query (future) all map to bucket 0.
    Checked against a direct transcription of that definition, element by
    element, in the tests.
    """
    n = -relative_position.long()
    ret = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).long() * num_buckets
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    scaled = torch.log(n.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return ret + torch.where(is_small, n, large)


class ALiBi(PositionalScheme):
    """Attention with linear biases (Press et al. 2022): -slope_h * |i - j|.

    Causal: the paper's bias. Bidirectional: the symmetric form -slope*|i-j|.
    Checked against the formula with the paper's slopes 2^(-8 (h + 1) / H),
    entry by entry in both modes, in test_alibi_bias_vs_formula, and the slope
    rule (also for H not a power of two) in test_alibi_slopes.
    """

    relative = True

    def __init__(self, **kw):
        super().__init__(**kw)
        self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)

    def relative_bias(self, rel):
        return -self.slopes[:, None] * rel.abs().to(self.slopes.dtype)  # (H, R)



class T5Bias(PositionalScheme):
    """T5 relative position bias (Raffel et al. 2020): a learned scalar per
    head and bucket, one table shared by every layer.

    Checked against the learned table read at T5's bucket of j - i (a
    plain-Python transcription of the bucket definition), entry by entry in both
    modes, in test_t5_bias_vs_bucket_reference, and the bucketing itself in
    test_t5_relative_bucket_vs_reference.
    """

    relative = True  # one table for all layers (shared_across_layers, the default)

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128, **kw):
        super().__init__(**kw)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.table = nn.Embedding(num_buckets, self.n_heads)
        nn.init.zeros_(self.table.weight)

    def relative_bias(self, rel):
        return self.table(t5_relative_bucket(rel, not self.causal, self.num_buckets, self.max_distance)).T



class Kerple(PositionalScheme):
    """KERPLE, logarithmic variant (Chi, Fan, Ramadge & Rudnicky 2022, "KERPLE:
    Kernelized Relative Positional Embedding for Length Extrapolation", eq. for
    the log kernel): bias_h(i, j) = -r1_h * log(1 + r2_h * |i - j|), r1, r2 > 0
    learned per head, one pair per layer.

    Positivity is kept with a softplus reparametrisation (the paper clamps the
    raw values instead). Bidirectional attention uses the same symmetric |i - j|.
    Checked against the formula evaluated directly, entry by entry (bidirectional),
    in test_kerple_vs_formula.

    Args:
        init_r1, init_r2: ranges (low, high) of the uniform initial values.
    """

    relative = True
    shared_across_layers = False

    def __init__(
        self, *, init_r1: tuple[float, float] = (0.5, 2.0), init_r2: tuple[float, float] = (0.1, 1.0), **kw
    ):
        super().__init__(**kw)

        def inv_softplus(lo_hi):
            lo, hi = float(lo_hi[0]), float(lo_hi[1])
            if not 0 < lo <= hi:
                raise ValueError(f"KERPLE initial range {lo_hi} must satisfy 0 < low <= high")
            x = lo + torch.rand(self.n_heads) * (hi - lo)
            return x + torch.log(-torch.expm1(-x))  # softplus^-1(x)

        self.raw_r1 = nn.Parameter(inv_softplus(init_r1))
        self.raw_r2 = nn.Parameter(inv_softplus(init_r2))

    @property
    def r1(self) -> Tensor:
        return nn.functional.softplus(self.raw_r1)

    @property
    def r2(self) -> Tensor:
        return nn.functional.softplus(self.raw_r2)

    def relative_bias(self, rel):
        dist = rel.abs().to(self.raw_r1.dtype)
        return -self.r1[:, None] * torch.log1p(self.r2[:, None] * dist)  # (H, R)



class FIRE(PositionalScheme):
    """Functional Interpolation for Relative Positions (Li et al. 2023, "Functional
    Interpolation for Relative Positions Improves Long Context Transformers",
    eq. 4 and section 3.3):

        bias(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),  psi(x) = log(c x + 1)

    f_theta an MLP (1 -> width -> n_heads, ReLU) giving one value per head, c > 0
    and the threshold L > 0 learned (used as |c|, |L|). One MLP per layer.
    Progressive interpolation: the normaliser grows with the query position
    once it passes L, so distances are mapped into [0, 1] at any length.

    Bidirectional attention (not in the paper) uses the signed
    sign(i - j) psi(|i - j|) / psi(max(L, i, j)); on the causal (visible)
    entries j <= i this is exactly the paper's formula, so one expression
    serves both modes. Checked against the formula evaluated directly, in both
    modes and with L below the length, in test_fire_vs_formula.

    Args:
        mlp_width: hidden width of f_theta (32 in the paper).
        init_c: initial c (0.1 in the paper).
        init_threshold: initial L (512 in the paper's code).
        eps: added to the normaliser.
    """

    relative = True
    shared_across_layers = False

    def __init__(
        self,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_threshold: float = 512.0,
        eps: float = 1e-6,
        **kw,
    ):
        super().__init__(**kw)
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, self.n_heads))
        self.c = nn.Parameter(torch.tensor(float(init_c)))
        self.threshold = nn.Parameter(torch.tensor(float(init_threshold)))
        self.eps = eps

    def psi(self, x: Tensor) -> Tensor:
        return torch.log1p(self.c.abs() * x)

    def numerator(self, d: Tensor) -> Tensor:
        """sign(d) psi(|d|) of distances d = i - j (float): the MLP's input before its normaliser."""
        return torch.sign(d) * self.psi(d.abs())

    def pieces(self) -> tuple[Tensor, Tensor, Tensor]:
        """The MLP as the piecewise-linear function it is: f(x) = W2 relu(w1 x + b1) + b2 is
        linear between the points t_k = -b1_k / w1_k where a hidden unit switches, so with
        the t_k sorted, on the segment s (s of them below x) f(x) = A_s x + C_s, A_s and C_s
        the sums of W2[:, k] w1_k and W2[:, k] b1_k over the units active there (a unit with
        w1_k = 0 is a constant, relu(b1_k)). Returns the sorted points (W,) and A, C (H, W + 1),
        with their graphs to the MLP's parameters. f is continuous, so a point on a break
        takes either side's value. Checked against the MLP itself, values and gradients,
        breaks and flat units included, in test_fire_pieces_equal_the_mlp."""
        lin1, lin2 = self.mlp[0], self.mlp[2]
        w1, b1 = lin1.weight[:, 0], lin1.bias
        flat = w1.detach() == 0
        t = torch.where(flat, torch.zeros_like(b1), -b1 / torch.where(flat, torch.ones_like(w1), w1)).detach()
        t = t.masked_fill(flat, float("inf"))  # a flat unit never switches
        order = torch.sort(t).values
        rank = torch.searchsorted(order, t)  # (W,): segments s > rank lie above t_k
        seg = torch.arange(w1.shape[0] + 1, device=w1.device)[:, None]  # (W + 1, 1)
        rising = w1.detach() > 0
        active = torch.where(flat, b1.detach() > 0, torch.where(rising, seg > rank, seg <= rank)).to(w1.dtype)
        A = active @ (w1[:, None] * lin2.weight.T)  # (W + 1, H)
        C = active @ (b1[:, None] * lin2.weight.T) + lin2.bias
        return order, A.T.contiguous(), C.T.contiguous()

    def mlp_of_pairs(self, x: Tensor) -> Tensor:
        """The MLP on every entry of x (Tq, Tk), (H, Tq, Tk), as ``pieces``: a sorted search, a
        gather and a multiply-add a pair instead of a (Tq, Tk, width) hidden layer."""
        return _Pieces.apply(x, *self.pieces(), False)

    def absolute_parts(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, ...]:
        """What every block of ``absolute_block`` shares: the MLP's ``pieces``; the row and
        column normalisers psi(max(i, L)) + eps and psi(j) + eps (psi is increasing, so a
        pair's psi(max(i, j, L)) + eps is the larger of its row's and its column's); and, for
        consecutive positions, the numerator sign(i - j) psi(|i - j|) on the Tq + Tk - 1
        distances and the MLP's values there below the threshold (every normaliser psi(L)),
        in the order of ``distance_range`` (empty otherwise)."""
        order, A, C = self.pieces()
        dt = self.c.dtype
        row_norm = self.psi(torch.maximum(q_pos.to(dt), self.threshold.abs())) + self.eps
        col_norm = self.psi(k_pos.to(dt)) + self.eps
        if not (is_contiguous(q_pos) and is_contiguous(k_pos)) or q_pos.numel() == 0 or k_pos.numel() == 0:
            return order, A, C, row_norm, col_norm, row_norm.new_empty(0), A.new_empty(A.shape[0], 0)
        numer = self.numerator(-distance_range(q_pos, k_pos).to(dt))  # i - j
        below = self.mlp((numer / (self.psi(self.threshold.abs()) + self.eps))[:, None]).T  # (H, Tq + Tk - 1)
        return order, A, C, row_norm, col_norm, numer, below

    def absolute_score(self, q_pos, k_pos):
        """f(x) with x = sign(i - j) psi(|i - j|) / max(psi(max(i, L)) + eps, psi(j) + eps), a pair
        at a time, as the piecewise-linear function the MLP is (``pieces``): the segment s of x
        is the number of break points below it, and f(x) = A[h, s] x + C[h, s]. Every tensor
        with a graph is indexed once (the numerator read on the distances, the normalisers on
        the rows and the columns, A and C), as the compiled FlexAttention's backward requires
        (Inductor refuses a tensor that requires a gradient and is indexed more than once, which
        the MLP unrolled over its units did 32 times); the break points, compared once per unit,
        have no graph; no index mixes a tensor with an int (torch 2.6 to 2.10 cannot trace one),
        and no tensor read is a view (the kernel's backward would give it no gradient). Nothing
        of the pairs' size is built. Checked, values and gradients through the kernel's own
        backward, against the dense reference, and through Inductor's check of the backward, in
        tests/test_flex.py."""
        dt = self.c.dtype
        numer = self.numerator(-distance_range(q_pos, k_pos).to(dt))  # at [j - i + Tq - 1]: i - j
        row = self.psi(torch.maximum(q_pos.to(dt), self.threshold.abs())) + self.eps
        col = self.psi(k_pos.to(dt)) + self.eps
        order, A, C = self.pieces()
        A, C = A.clone(), C.clone()  # fresh tensors: pieces() may hand back views where H = 1

        def score(h, i, j):  # Tq - 1 read from the shapes (no constant for torch.compile to specialise on)
            x = numer[j - i + row.shape[0] - 1] / torch.maximum(row[i], col[j])
            s = (x > order[0]).to(torch.int32)
            for unit in range(1, order.shape[0]):
                s = s + (x > order[unit]).to(torch.int32)
            return A[h, s] * x + C[h, s]

        return score

    def absolute_block(self, parts, q_pos, k_pos, rows, cols):
        """(1, H, rows, cols) from ``absolute_parts``. While no position of the block passes
        the threshold L, every pair's normaliser is psi(L) and the MLP's input depends on
        i - j alone: for consecutive positions the block is laid out by distance from the
        MLP's values on the distances (a Toeplitz matrix). Otherwise the MLP's input is the
        numerator over the larger normaliser, and the MLP is evaluated on every pair as the
        piecewise-linear function it is (``pieces``): on CPU by the compiled kernel where it is
        built (``_FireBlock``), otherwise by ``block_input`` and ``_Pieces``."""
        order, A, C, row_norm, col_norm, numer, below = parts
        qp, kp = q_pos[rows], k_pos[cols]
        n, m = qp.shape[0], kp.shape[0]
        if not numer.numel():  # positions not consecutive: every pair
            d = (qp[:, None] - kp[None, :]).to(row_norm.dtype)
            x = self.numerator(d) / torch.maximum(row_norm[rows, None], col_norm[None, cols])
            return _Pieces.apply(x, order, A, C, False)[None]
        if max(int(qp.max()), int(kp.max())) <= float(self.threshold.detach().abs()):
            return toeplitz(below[:, _window(q_pos, k_pos, qp, kp)], n, m)[None]
        ops = native.fire_block_ops() if numer.device.type == "cpu" and numer.dtype in _NATIVE_DTYPES else None
        if ops is not None:  # the same function in one pass, compiled (native.py)
            vals = numer[_window(q_pos, k_pos, qp, kp)]
            rn, cn = row_norm[rows].contiguous(), col_norm[cols].contiguous()
            return _FireBlock.apply(ops, vals.contiguous(), rn, cn, order, A, C, _row_norm_keys(qp, kp))[None]
        return _Pieces.apply(self.block_input(parts, q_pos, k_pos, rows, cols), order, A, C, True)[None]

    def block_input(self, parts, q_pos: Tensor, k_pos: Tensor, rows: slice, cols: slice) -> Tensor:
        """The MLP's input on a block of consecutive positions past the threshold, (rows, cols):
        the numerator laid out by distance over the larger of the row's and the column's
        normaliser. Along a row it never increases (j - i grows, and past the query, where
        the column's normaliser may take over, psi(j - i) / psi(j) grows with j as well),
        which ``_Pieces`` uses to find the segments a row at a time. In float32 it may rise by
        an ulp where it changes by less than that from key to key (far past the query, large
        c); that moves only entries within an ulp or so of a break point to the neighbouring
        segment, whose line gives the same value there. Checked in
        test_fire_block_input_never_increases_along_a_row."""
        _, _, _, row_norm, col_norm, numer, _ = parts
        qp, kp = q_pos[rows], k_pos[cols]
        n, m = qp.shape[0], kp.shape[0]
        row_norm, col_norm = row_norm[rows, None], col_norm[None, cols]
        num = toeplitz(numer[_window(q_pos, k_pos, qp, kp)], n, m)
        x = num * row_norm.reciprocal()  # a key at or before every query of the block: the row's normaliser
        left = _row_norm_keys(qp, kp)
        if left < m:
            x[:, left:] = num[:, left:] / torch.maximum(row_norm, col_norm[:, left:])
        return x

    def absolute_bias(self, q_pos, k_pos):
        """(1, H, Tq, Tk): ``absolute_block`` of every row and column."""
        every = slice(None)
        return self.absolute_block(self.absolute_parts(q_pos, k_pos), q_pos, k_pos, every, every)


def _row_norm_keys(qp: Tensor, kp: Tensor) -> int:
    """How many of a block's first keys kp sit at or before every query qp (consecutive
    positions): for them psi(j) <= psi(i) <= psi(max(i, L)), so the row's normaliser is the larger."""
    return min(kp.shape[0], max(0, int(qp.min() - kp[0]) + 1))


_NATIVE_DTYPES = (torch.float32, torch.float64)


class _FireBlock(torch.autograd.Function):
    """``_Pieces`` of ``FIRE.block_input`` in one pass over the block, forward and backward,
    in the compiled kernel (``fire_block.cpp``; ``ops`` is ``native.fire_block_ops()``): from the
    numerator on the block's distances ``vals``, the row and column normalisers ``rn`` and ``cn``,
    the first ``left`` keys taking the row's, and the MLP's ``pieces``. Nothing of the block's
    size is kept for the backward, which rebuilds the inputs a row at a time. Checked against
    the PyTorch version, values and gradients, in test_fire_kernel_equals_pytorch_version."""

    @staticmethod
    def forward(ctx, ops, vals, rn, cn, order, A, C, left):
        ctx.save_for_backward(vals, rn, cn, order, A, C)
        ctx.ops, ctx.left = ops, left
        return ops.fire_block_forward(vals, rn, cn, order, A, C, left)

    @staticmethod
    def backward(ctx, g):
        vals, rn, cn, order, A, C = ctx.saved_tensors
        d_vals, d_rn, d_cn, dA, dC = ctx.ops.fire_block_backward(g.contiguous(), vals, rn, cn, order, A, C, ctx.left)
        return None, d_vals, d_rn, d_cn, None, dA, dC, None


def _window(q_pos: Tensor, k_pos: Tensor, qp: Tensor, kp: Tensor) -> slice:
    """Where the distances of a block (queries qp, keys kp) sit among those of the whole
    (``distance_range(q_pos, k_pos)``), for consecutive positions."""
    first = int(kp[0] - qp[-1]) - int(k_pos[0] - q_pos[-1])  # the block's smallest j - i, from the whole's
    return slice(first, first + qp.shape[0] + kp.shape[0] - 1)


class _Pieces(torch.autograd.Function):
    """A piecewise-linear function of x: out[h] = A[h, s] x + C[h, s] with s the number of
    ``order`` below x (``FIRE.pieces``). The backward sums the gradients of A and C per
    segment with one ``index_add_`` for both (autograd's two index_select backwards cost
    several times more here)."""

    LANES = 8

    @staticmethod
    def segments(x: Tensor, order: Tensor, rows_non_increasing: bool) -> Tensor:
        """The segment of every entry of x, the number of ``order`` below it (int32). For x
        (n, m) whose rows never increase, one search per row and break point instead of one
        per entry: J[i, k] entries of row i lie above order[k], so along the row the segment
        starts at W and drops by one at each J[i, k], a cumulative sum. The same integers as
        ``searchsorted`` (test_pieces_segments_of_non_increasing_rows)."""
        if not rows_non_increasing or x.dim() != 2 or x.numel() == 0:
            return torch.searchsorted(order, x, out_int32=True)
        n, m = x.shape
        W = order.shape[0]
        J = torch.searchsorted(x.neg(), order.neg().expand(n, W).contiguous())  # (n, W)
        steps = torch.zeros(n, m + 1, dtype=torch.int32, device=x.device)
        steps[:, 0] = W
        steps.scatter_add_(1, J, torch.full((n, W), -1, dtype=torch.int32, device=x.device))
        return torch.cumsum(steps[:, :m], 1, dtype=torch.int32)

    @staticmethod
    def forward(ctx, x, order, A, C, rows_non_increasing):
        x = x.contiguous()
        s = _Pieces.segments(x, order, rows_non_increasing).flatten()
        H, S = A.shape
        slope = A.index_select(1, s).view(H, *x.shape)
        ctx.save_for_backward(x, s, slope)
        ctx.segments = S
        return C.index_select(1, s).view(H, *x.shape).addcmul_(slope, x)

    @staticmethod
    def backward(ctx, g):
        x, s, slope = ctx.saved_tensors
        H, S, L, n = slope.shape[0], ctx.segments, _Pieces.LANES, s.shape[0]
        g = g.reshape(H, -1)
        # neighbouring pairs mostly share a segment; adding them into L interleaved copies of
        # each sum keeps consecutive adds off one accumulator (5x faster than one copy here)
        lanes = torch.arange(L, device=s.device).repeat(-(-n // L))[:n]
        both = g.new_empty(2 * H, n)  # the gradients of the slopes (g x) and of the intercepts (g)
        torch.mul(g, x.reshape(1, -1), out=both[:H])
        both[H:] = g
        per_segment = g.new_zeros(2 * H, S * L).index_add_(1, lanes.add_(s, alpha=L), both).view(2 * H, S, L).sum(-1)
        return (g * slope.reshape(H, -1)).sum(0).view(x.shape), None, per_segment[:H], per_segment[H:], None
