"""Independent dense references of every scheme: what the papers write, entry by entry.

``reference_logits(scheme, q, k, q_pos, k_pos)`` returns the pre-mask attention
logits (B, H, Tq, Tk) of queries q and keys k (B, H, T, Dh, already projected) at
integer positions, and ``reference_value_term`` Shaw's value term. They read the
scheme's settings and parameters (its tables, weights, slopes) but call none of
its methods and none of posenc's helpers: every distance, bucket, sinusoid,
rotation and MLP is written out here from the formula, as dense (Tq, Tk) tensors,
and autograd runs through them, so gradients can be compared too.

``reference_embedding`` is the same for what a scheme adds to the input.

A scheme class with no entry here (a researcher's new scheme) gets ``None``: the
tests then fall back to the scheme's own ``bias`` and say so, which still tests
how attention uses the bias (every route against the dense formula) but not the
bias itself; its own reference test (named in its docstring) does that.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from posenc.encodings import (
    CAPE,
    FIRE,
    TUPE,
    ALiBi,
    FixedBidirectional,
    Kerple,
    Learned,
    NoPE,
    RoPE,
    Shaw,
    Sinusoidal,
    SkewRelative,
    T5Bias,
    TransformerXL,
    XPos,
)


# ------------------------------------------------------------------ building blocks
def distances(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Tq, Tk) key position minus query position, j - i, as Python ints would give it."""
    return torch.tensor([[int(j) - int(i) for j in k_pos] for i in q_pos], dtype=torch.long)


def sinusoids(p: Tensor, dim: int, base: float = 10000.0, dtype: torch.dtype = torch.float32) -> Tensor:
    """(..., dim) with [2c] = sin(p / base^(2c/dim)), [2c+1] = cos(...) (Vaswani et al. 2017, 3.5),
    computed in float64 and returned in ``dtype``."""
    p = p.to(torch.float64)[..., None]
    c = torch.arange(dim, dtype=torch.float64) // 2
    angle = p / base ** (2 * c / dim)
    even = (torch.arange(dim) % 2 == 0)
    return torch.where(even, angle.sin(), angle.cos()).to(dtype)


def t5_bucket(rel: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of a relative position j - i, transcribed from the reference code (Raffel et al. 2020)."""
    ret, n = 0, -rel
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


def alibi_slope(h: int, n_heads: int) -> float:
    """Head h's slope (Press et al. 2022, section 3): the geometric sequence 2^(-8/n), 2^(-16/n), ...
    for n a power of two; otherwise those of the nearest power of two below, then every other
    slope of the next power of two."""
    def power(n: int) -> list[float]:
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    m = 1 << (n_heads.bit_length() - 1)
    slopes = power(m) + power(2 * m)[0::2][: n_heads - m]
    return slopes[h]


def softplus(x: Tensor) -> Tensor:
    return torch.log1p(torch.exp(-x.abs())) + x.clamp(min=0)


def content(scheme, q: Tensor, k: Tensor, scale: float | None = None) -> Tensor:
    """q · k times 1/sqrt(head width) (or ``scale``)."""
    s = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.einsum("bhid,bhjd->bhij", q, k) * s


def complex_pairs(x: Tensor) -> Tensor:
    """Consecutive feature pairs as complex numbers: x[2i] + i x[2i+1]."""
    return torch.complex(x[..., 0::2].double(), x[..., 1::2].double())


# ------------------------------------------------------------------ logits per scheme
def _none(sch, q, k, q_pos, k_pos):
    return content(sch, q, k)


def _rotary(sch: RoPE, q, k, q_pos, k_pos):
    """RoPE (Su et al. 2021, eq. 34): pair c of the first d = rotary_dim features turns by
    angle m · base^(-2c/d) at position m; the other features pass unchanged. As complex
    numbers q_m · k_n = Re(sum_c z_c(q) conj(z_c(k)) e^{i (m - n) theta_c}) + rest · rest."""
    d = sch.rotary_dim
    theta = sch.base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    m = q_pos.double()[:, None, None] * theta  # (Tq, 1, d/2)
    n = k_pos.double()[None, :, None] * theta  # (1, Tk, d/2)
    zq, zk = complex_pairs(q[..., :d]), complex_pairs(k[..., :d])  # (B, H, T, d/2)
    turned = torch.einsum("bhic,bhjc,ijc->bhij", zq, zk.conj(), torch.exp(1j * (m - n)))
    rest = torch.einsum("bhid,bhjd->bhij", q[..., d:].double(), k[..., d:].double())
    return ((turned.real + rest) / math.sqrt(q.shape[-1])).to(q.dtype)


def _xpos(sch: XPos, q, k, q_pos, k_pos):
    """xPos (Sun et al. 2022, 3.2): RoPE on every pair, and pair c of q_m · k_n scaled by
    zeta_c^((m - n) / scale_base), zeta_c = (2c/d + gamma) / (1 + gamma)."""
    d = q.shape[-1]
    half = torch.arange(0, d, 2, dtype=torch.float64) / d
    theta = sch.base ** (-half)
    zeta = (half + sch.gamma) / (1 + sch.gamma)
    delta = (q_pos.double()[:, None] - k_pos.double()[None, :])[..., None]  # (Tq, Tk, 1)
    factor = torch.exp(1j * delta * theta) * zeta ** (delta / sch.scale_base)
    zq, zk = complex_pairs(q), complex_pairs(k)
    return (torch.einsum("bhic,bhjc,ijc->bhij", zq, zk.conj(), factor).real / math.sqrt(d)).to(q.dtype)


def _alibi(sch: ALiBi, q, k, q_pos, k_pos):
    """-m_h |i - j| (Press et al. 2022); the same symmetric form in both directions."""
    H = q.shape[1]
    slopes = torch.tensor([alibi_slope(h, H) for h in range(H)], dtype=q.dtype)
    bias = -slopes[:, None, None] * distances(q_pos, k_pos).abs().to(q.dtype)
    return content(sch, q, k) + bias[None]


def _t5(sch: T5Bias, q, k, q_pos, k_pos):
    """The learned table read at T5's bucket of j - i (bidirectional buckets unless causal)."""
    rel = distances(q_pos, k_pos)
    buckets = torch.tensor([[t5_bucket(int(r), not sch.causal, sch.num_buckets, sch.max_distance) for r in row]
                            for row in rel])
    return content(sch, q, k) + sch.table.weight[buckets].permute(2, 0, 1)[None]


def _kerple(sch: Kerple, q, k, q_pos, k_pos):
    """-r1_h log(1 + r2_h |i - j|) (Chi et al. 2022), r1 = softplus(raw_r1), r2 = softplus(raw_r2)."""
    r1, r2 = softplus(sch.raw_r1), softplus(sch.raw_r2)
    dist = distances(q_pos, k_pos).abs().to(r1.dtype)
    return content(sch, q, k) + (-r1[:, None, None] * torch.log(1 + r2[:, None, None] * dist))[None]


def _fire(sch: FIRE, q, k, q_pos, k_pos):
    """f(psi(i - j) / psi(max(L, i))) (Li et al. 2023, eq. 4), psi(x) = log(c x + 1), f an MLP
    1 -> width -> H with ReLU; signed and normalised by max(L, i, j) in both directions."""
    c, L = sch.c.abs(), sch.threshold.abs()
    i = q_pos.to(c.dtype)[:, None].expand(-1, len(k_pos))
    j = k_pos.to(c.dtype)[None, :].expand(len(q_pos), -1)
    d = i - j
    norm = torch.maximum(torch.maximum(i, j), L)
    x = torch.sign(d) * torch.log(c * d.abs() + 1) / (torch.log(c * norm + 1) + sch.eps)  # (Tq, Tk)
    lin1, lin2 = sch.mlp[0], sch.mlp[2]
    hidden = torch.relu(x[..., None] * lin1.weight[:, 0] + lin1.bias)  # (Tq, Tk, width)
    out = hidden @ lin2.weight.T + lin2.bias  # (Tq, Tk, H)
    return content(sch, q, k) + out.permute(2, 0, 1)[None]


def _clipped_rows(sch, q_pos, k_pos) -> Tensor:
    k = sch.max_relative_position
    return distances(q_pos, k_pos).clamp(-k, k) + k  # (Tq, Tk) row of a table of 2k + 1


def _shaw_like(sch, q, k, q_pos, k_pos):
    """Shaw et al. 2018, eq. 4: q_i · (k_j + a^K_ij) / sqrt(d), a^K_ij = w^K_{clip(j - i, -k, k)}
    (the skew scheme computes the same logits with its own table)."""
    aK = sch.rel_key[_clipped_rows(sch, q_pos, k_pos)]  # (Tq, Tk, Dh)
    return (torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,ijd->bhij", q, aK)) / math.sqrt(q.shape[-1])


def _txl(sch: TransformerXL, q, k, q_pos, k_pos):
    """Dai et al. 2019, eq. 3: ((q_i + u) · k_j + (q_i + v) · W_R R_{i-j}) / sqrt(d), R the
    sinusoid (width d_model) of i - j."""
    B, H, Tq, Dh = q.shape
    R = sinusoids(-distances(q_pos, k_pos), H * Dh, sch.base, sch.w_r.weight.dtype)  # (Tq, Tk, D): R_{i-j}
    WR = (R @ sch.w_r.weight.T).view(Tq, -1, H, Dh)  # (Tq, Tk, H, Dh)
    ac = torch.einsum("bhid,bhjd->bhij", q + sch.u[None, :, None, :], k)
    bd = torch.einsum("bhid,ijhd->bhij", q + sch.v[None, :, None, :], WR)
    return (ac + bd) / math.sqrt(Dh)


def _fixed_bidirectional(sch: FixedBidirectional, q, k, q_pos, k_pos):
    """q_i · (k_j + R_{i-j}) / sqrt(d), R the sinusoid (width d) of the signed distance i - j."""
    R = sinusoids(-distances(q_pos, k_pos), q.shape[-1], sch.base, q.dtype)  # (Tq, Tk, Dh)
    return (torch.einsum("bhid,bhjd->bhij", q, k) + torch.einsum("bhid,ijd->bhij", q, R)) / math.sqrt(q.shape[-1])


def _tupe(sch: TUPE, q, k, q_pos, k_pos):
    """Ke et al. 2020, eq. 7 and 3.2: (x_i W^Q)(x_j W^K) / sqrt(2d) + reset_theta((p_i U^Q)(p_j U^K)
    / sqrt(2d)) + b_{j-i}, with [CLS] at position 0 untied by theta_1 (its row) and theta_2
    (its column in the other rows) when ``untie_cls``."""
    B, H, Tq, Dh = q.shape
    s = 1 / math.sqrt(2 * Dh)
    pq = (sch.table[q_pos] @ sch.u_q.weight.T).view(Tq, H, Dh)
    pk = (sch.table[k_pos] @ sch.u_k.weight.T).view(len(k_pos), H, Dh)
    corr = torch.einsum("ihd,jhd->hij", pq, pk) * s
    if sch.theta is not None:
        row0 = (q_pos == 0)[None, :, None]
        col0 = (k_pos == 0)[None, None, :]
        corr = torch.where(col0, sch.theta[1][:, None, None], corr)
        corr = torch.where(row0, sch.theta[0][:, None, None], corr)
    if sch.rel is not None:
        rel = distances(q_pos, k_pos)
        buckets = torch.tensor([[t5_bucket(int(r), not sch.causal, sch.num_buckets, sch.max_distance) for r in row]
                                for row in rel])
        corr = corr + sch.rel.weight[buckets].permute(2, 0, 1)
    return content(sch, q, k, s) + corr[None]


#: the dense reference of each scheme class the project ships (exact classes: a subclass
#: may change the logits, so it has none until it registers its own)
LOGITS = {
    NoPE: _none, Sinusoidal: _none, Learned: _none, CAPE: _none, RoPE: _rotary, XPos: _xpos, ALiBi: _alibi,
    T5Bias: _t5, Kerple: _kerple, FIRE: _fire, Shaw: _shaw_like, SkewRelative: _shaw_like, TransformerXL: _txl,
    FixedBidirectional: _fixed_bidirectional, TUPE: _tupe,
}  # fmt: skip


def reference_logits(scheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """The scheme's pre-mask logits from its formula, or None for a class without a reference.
    RoPE's context-extension rules are evaluation settings with references of their own
    (``tests/test_rope_scaling.py``): a scaled RoPE has none here."""
    fn = LOGITS.get(type(scheme))
    if fn is None or getattr(scheme, "scaling", None) is not None:
        return None
    return fn(scheme, q, k, q_pos, k_pos)


def reference_value_term(scheme, probs: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
    """Shaw et al. 2018, eq. 3: sum_j alpha_ij a^V_ij, a^V_ij = w^V_{clip(j - i, -k, k)}; None when
    the scheme has no value term."""
    if type(scheme) is not Shaw:
        return None
    aV = scheme.rel_value[_clipped_rows(scheme, q_pos, k_pos)]  # (Tq, Tk, Dh)
    return torch.einsum("bhij,ijd->bhid", probs, aV)


def reference_embedding(scheme, x: Tensor, pos: Tensor) -> Tensor | None:
    """What the scheme adds to the token embeddings x (B, T, D) in evaluation, from the formula
    (zeros when it adds nothing); None for a class without a reference."""
    kind = type(scheme)
    if kind not in LOGITS:
        return None
    if kind in (Sinusoidal, CAPE):  # CAPE is sinusoidal in evaluation (Likhomanenko et al. 2021)
        return sinusoids(pos, x.shape[-1], scheme.base, x.dtype).expand_as(x)
    if kind is Learned:
        return scheme.table[pos].expand_as(x)
    return torch.zeros_like(x)



# ------------------------------------------------------------------ a layer and a model
def dense_logits(scheme, q: Tensor, k: Tensor, pos: Tensor) -> Tensor:
    """The reference logits; for a class without one, the scheme's own rotate and bias (which
    still tests how attention uses them; the scheme's own reference test checks the bias)."""
    ref = reference_logits(scheme, q, k, pos, pos)
    if ref is not None:
        return ref
    qr, kr = scheme.rotate(q, k, pos, pos)
    b = scheme.bias(qr, kr, pos, pos)
    att = qr @ kr.transpose(-1, -2) * scheme.logit_scale()
    return att if b is None else att + b


def dense_qkv(attn, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v (B, H, T, Dh) of the input h (B, T, D) through the layer's projection, by hand."""
    B, T, D = h.shape
    H = attn.n_heads
    qkv = (h @ attn.qkv.weight.T + attn.qkv.bias).view(B, T, 3, H, D // H)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    return q, k, v


def dense_input(model, idx: Tensor, pos: Tensor) -> Tensor:
    """The first layer's input: the token table times sqrt(d) (Vaswani et al.) plus what the
    scheme adds, from its reference (or its own ``embed`` for a class without one)."""
    word = model.tok(idx) * math.sqrt(model.cfg.d_model)
    extra = reference_embedding(model.scheme, word, pos)
    if extra is None:
        extra = model.scheme.embed(word, pos)
    return word if extra is None else word + extra


def dense_first_layer_logits(model, idx: Tensor, pos: Tensor) -> Tensor:
    """The first layer's pre-mask logits of a ``Transformer`` from the reference."""
    q, k, _ = dense_qkv(model.blocks[0].attn, model.blocks[0].ln1(dense_input(model, idx, pos)))
    return dense_logits(model.scheme, q, k, pos)


def dense_attention(attn, h: Tensor, pos: Tensor) -> Tensor:
    """One attention layer (a ``posenc.attention.Attention``, whose weights it reads) from the
    formula: projections by hand, reference logits, the causal mask as -inf, softmax, values
    (plus Shaw's value term), the output projection. None of Attention's methods is called."""
    B, T, D = h.shape
    q, k, v = dense_qkv(attn, h)
    logits = dense_logits(attn.scheme, q, k, pos)
    if attn.causal:
        future = pos[None, :] > pos[:, None]
        logits = logits.masked_fill(future, float("-inf"))
    probs = logits.softmax(-1)
    out = probs @ v
    term = reference_value_term(attn.scheme, probs, pos, pos)
    if term is None and attn.scheme.uses_value_term:
        term = attn.scheme.value_term(probs, pos, pos)
    if term is not None:
        out = out + term
    return out.transpose(1, 2).reshape(B, T, D) @ attn.out.weight.T + attn.out.bias


def dense_model(model, idx: Tensor, pos: Tensor) -> Tensor:
    """A ``posenc.model.Transformer``'s logits layer by layer with ``dense_attention`` and the
    reference embedding (``dense_input``)."""
    x = dense_input(model, idx, pos)
    for block in model.blocks:
        x = x + dense_attention(block.attn, block.ln1(x), pos)
        x = x + block.mlp(block.ln2(x))
    return model.ln_f(x) @ model.lm_head.weight.T
