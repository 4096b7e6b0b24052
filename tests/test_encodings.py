"""Tests of the positional-encoding library: every scheme, built from its
``encoding/<name>.yaml`` with Hydra, against independent references.

The schemes are discovered, not listed: every ``conf/encoding/*.yaml``, plus every
``encoding/*.yaml`` under the config roots named in ``POSENC_SCHEME_PATH``
(``tests/schemes.py``). Which property tests apply to a scheme is read from the
scheme itself: ``causal_only``, ``relative``, ``position_only_bias``, the hooks
it overrides, and the route ``Attention.route`` gives its training call. Where a
test needs the logits a scheme should give, it takes them from the dense references
of ``tests/references.py`` (the papers' formulas, written without the scheme's
methods); ``tests/test_attention.py`` checks every route of every scheme against them.

Run: ``pytest -q tests/test_encodings.py`` (about 5 s of tests on 2 CPU cores, after
imports).
The training smoke test reads Tiny Shakespeare from ``$POSENC_DATA_DIR``
(default ``../shared/data`` beside the repository) and fails if it is absent.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from posenc import native
from posenc.attention import RECOMPUTED, diagonal_sums
from posenc.encodings import (
    TERM_NAMES,
    ALiBi,
    Kerple,
    PositionalScheme,
    RoPE,
    Sinusoidal,
    alibi_slopes,
    distance_range,
    relative_logits,
    relative_positions,
    relative_shift,
    relative_shift_future,
    relative_shift_two_sided,
    sinusoid,
    sinusoidal_table,
    skew,
    t5_relative_bucket,
    toeplitz,
)
from posenc.model import ModelConfig, Transformer

from .helpers import lm_loss
from .references import dense_first_layer_logits, dense_model
from .references import t5_bucket as t5_bucket_reference
from .schemes import TEST_NAME, YEAR, checked_against, config_roots, defined_tests, discover, factory, scheme_class

ROOT = Path(__file__).resolve().parents[1]

# Every scheme there is: each encoding/<name>.yaml of conf/ and of the folders in
# POSENC_SCHEME_PATH (tests/schemes.py). Which property tests apply to a scheme is
# read from the scheme itself (its class attributes and hooks), never from its name.
CONFIGS, DISCOVERY_PROBLEMS = discover()
SCHEMES = list(CONFIGS)
WW, WP, PW, PP = TERM_NAMES


def cls_of(name: str) -> type[PositionalScheme] | None:
    """The scheme's class; None if its _target_ does not import (then every test that
    applies to all schemes fails for it, with the reason)."""
    return CONFIGS[name].cls


def modes_of(name: str) -> list[bool]:
    cls = cls_of(name)
    return [True] if cls is not None and cls.causal_only else [True, False]


def mode_id(name: str, causal: bool, overrides: dict | None = None) -> str:
    return f"{name}-{'causal' if causal else 'bidir'}{'-' + ','.join(overrides) if overrides else ''}"


MODES = [(n, c) for n in SCHEMES for c in modes_of(n)]
MODE_IDS = [mode_id(n, c) for n, c in MODES]
CAUSAL_ONLY = [n for n in SCHEMES if cls_of(n) is not None and cls_of(n).causal_only]
# extra settings of one scheme that exercise more of it, on top of its config's defaults:
# FIRE with L < T (distances spread out), TUPE with [CLS] untied (theta_1, theta_2)
EXTRA_SETTINGS = {"fire": [{"init_threshold": 4.0}], "tupe": [{"untie_cls": True}]}
VARIANTS = [(n, c, o) for n, c in MODES for o in [{}] + EXTRA_SETTINGS.get(n, [])]


def variant_params(keep) -> list:
    return [pytest.param(n, c, o, id=mode_id(n, c, o)) for n, c, o in VARIANTS if keep(n, c, o)]


D, H, L = 32, 4, 64  # d_model, heads, max_len for the small tests
DH = D // H
TOL = dict(atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ helpers
@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The shapes here are tiny: extra intra-op threads only wait on each other
    (100x slower on a loaded 2-core machine), so use one and restore it after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build(name: str, causal: bool = True, **overrides) -> PositionalScheme:
    return factory(name, **overrides)(d_model=D, n_heads=H, max_len=L, causal=causal)


def perturb(params, scale: float = 0.3) -> None:
    """Move tensors away from their (often zero) initial values, so that every
    term is non-trivial; scalar settings (FIRE's c and L) are left alone."""
    with torch.no_grad():
        for p in params:
            if p.dim() > 0:
                p.add_(torch.randn_like(p) * scale)


def tiny_model(name: str, causal: bool = True, vocab: int = 256, **overrides) -> Transformer:
    cfg = ModelConfig(vocab_size=vocab, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=L, causal=causal)
    return Transformer(cfg, factory(name, **overrides))


def qk(B=2, Tq=6, Tk=6, heads=H, dh=DH, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, heads, Tq, dh, generator=g), torch.randn(B, heads, Tk, dh, generator=g)


# -------------------------------------------------------------- index tricks
@pytest.mark.parametrize("Tq,Tk", [(1, None), (2, None), (7, None), (3, 7), (7, 3), (1, 5), (4, 1)])
def test_skew_matches_gather(Tq, Tk):
    W = 2 * Tq - 1 if Tk is None else Tq + Tk - 1
    x = torch.randn(3, 2, Tq, W)
    out = skew(x) if Tk is None else skew(x, Tk)
    Tk = Tq if Tk is None else Tk
    assert out.shape == (3, 2, Tq, Tk)
    i = torch.arange(Tq)[:, None]
    j = torch.arange(Tk)[None, :]
    ref = x.gather(-1, (j - i + Tq - 1).expand(3, 2, Tq, Tk))
    assert torch.equal(out, ref)
    # and one element at a time
    for a in range(Tq):
        for b in range(Tk):
            assert torch.equal(out[..., a, b], x[..., a, b - a + Tq - 1])


def test_skew_rejects_wrong_width():
    with pytest.raises(ValueError, match="2T-1"):
        skew(torch.zeros(4, 6))


@pytest.mark.parametrize("Tq,Tk", [(1, 1), (5, 5), (3, 7), (1, 6)])
def test_relative_shift_exact_contents(Tq, Tk):
    x = torch.randn(2, 3, Tq, Tk)
    y = torch.randn(2, 3, Tq, Tk)
    out, fut, both = relative_shift(x), relative_shift_future(y), relative_shift_two_sided(x, y)
    for i in range(Tq):
        p = i + Tk - Tq  # key position of query i
        for j in range(Tk):
            if j <= p:  # visible: the score for distance p - j, column Tk-1-(p-j)
                assert torch.equal(out[..., i, j], x[..., i, Tk - 1 - (p - j)])
                assert torch.equal(both[..., i, j], x[..., i, Tk - 1 - (p - j)])
            elif j == p + 1:  # documented upper triangle: the padding ...
                assert (out[..., i, j] == 0).all()
            else:  # ... then scores of the next query
                assert torch.equal(out[..., i, j], x[..., i + 1, j - p - 2])
            if j >= p:  # forward offset j - p
                assert torch.equal(fut[..., i, j], y[..., i, j - p])
                if j > p:
                    assert torch.equal(both[..., i, j], y[..., i, j - p])
            elif j == p - 1 or i == 0:
                assert (fut[..., i, j] == 0).all()
            else:
                assert torch.equal(fut[..., i, j], y[..., i - 1, Tk + 1 + j - p])


def test_relative_shift_rejects_long_query():
    with pytest.raises(ValueError, match="Tq <= Tk"):
        relative_shift(torch.zeros(5, 3))


def explicit_relative(a, table, q_pos, k_pos):
    """a_i . E(q_pos[i] - k_pos[j]) with the full (Tq, Tk, Dh) tensor of E_{i-j}."""
    dist = q_pos[:, None] - k_pos[None, :]
    E = table(dist.flatten()).reshape(*dist.shape, -1)  # (Tq, Tk, Dh)
    return torch.einsum("bhid,ijd->bhij", a, E)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "q_pos,k_pos",
    [
        (torch.arange(6), torch.arange(6)),
        (torch.arange(3, 8) + 10, torch.arange(8) + 10),  # query shorter than key (memory)
        (torch.tensor([0, 2, 3, 7]), torch.tensor([0, 2, 3, 7])),  # not consecutive: gather path
        (torch.tensor([5, 6]), torch.tensor([0, 1, 2, 3])),  # queries after every key
    ],
)
def test_relative_logits_vs_explicit(causal, q_pos, k_pos):
    a = torch.randn(2, 3, q_pos.shape[0], 16, dtype=torch.float64)

    def table(d):
        return sinusoid(d, 16).to(torch.float64)

    out = relative_logits(a, table, q_pos, k_pos, causal)
    ref = explicit_relative(a, table, q_pos, k_pos)
    if causal:
        future = (k_pos[None, :] > q_pos[:, None]).expand_as(ref)
        assert (out[future] == 0).all()
        ref = ref.masked_fill(future, 0.0)
    torch.testing.assert_close(out, ref)


# ------------------------------------------------------ tables and formulas
def test_sinusoidal_table_formula_and_translation():
    n, dim = 50, 12
    tab = sinusoidal_table(n, dim)
    for p in range(n):
        for c in range(dim):
            w = 1.0 / 10000 ** (2 * (c // 2) / dim)
            ref = math.sin(p * w) if c % 2 == 0 else math.cos(p * w)
            assert abs(tab[p, c].item() - ref) < 1e-6
    for k in (1, 3, 17):
        T = torch.zeros(dim, dim)
        for i in range(dim // 2):
            w = 1.0 / 10000 ** (2 * i / dim)
            c, s = math.cos(w * k), math.sin(w * k)
            T[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
        torch.testing.assert_close(tab[: n - k] @ T.T, tab[k:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
def test_t5_relative_bucket_vs_reference(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-400, 401)
    got = t5_relative_bucket(rel, bidirectional, num_buckets, max_distance).tolist()
    ref = [t5_bucket_reference(r, bidirectional, num_buckets, max_distance) for r in rel.tolist()]
    assert got == ref


def test_alibi_slopes():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    ref12 = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(ref12))
    assert alibi_slopes(1).tolist() == [2.0**-8]  # one head: the rule with n = 1
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_t5_bucket_defaults_are_t5s():
    """``t5_relative_bucket`` defaults to T5's own settings: bidirectional, 32 buckets, max
    distance 128 (Raffel et al. 2020's reference code)."""
    rel = torch.arange(-300, 301)
    torch.testing.assert_close(t5_relative_bucket(rel), t5_relative_bucket(rel, True, 32, 128))
    assert [t5_bucket_reference(int(r), True, 32, 128) for r in rel] == t5_relative_bucket(rel).tolist()


def test_is_contiguous():
    """Consecutive integers only (one or no position counts as consecutive)."""
    from posenc.encodings.base import is_contiguous

    assert is_contiguous(torch.arange(5) + 3) and is_contiguous(torch.tensor([7])) and is_contiguous(torch.arange(0))
    assert not is_contiguous(torch.tensor([0, 5])) and not is_contiguous(torch.tensor([1, 0]))
    assert not is_contiguous(torch.tensor([0, 1, 3]))


def test_base_defaults():
    """The documented defaults of every scheme: max_len 1024, causal attention."""
    sch = PositionalScheme(d_model=8, n_heads=2)
    assert (sch.max_len, sch.causal, sch.head_dim) == (1024, True, 4)


@pytest.mark.parametrize(
    "parts,has_bias,position_only,value_term",
    [
        ((), False, False, False),
        (("relative_bias",), True, True, False),
        (("absolute_bias",), True, True, False),
        (("content_bias",), True, False, False),
        (("relative_bias", "content_bias"), True, False, False),
        (("absolute_bias", "value_term"), True, True, True),
        (("value_term",), False, False, True),
        (("rotate", "embed"), False, False, False),
    ],
)
def test_the_derived_flags_follow_the_parts_a_new_class_defines(parts, has_bias, position_only, value_term):
    """The flags are set when a class is made (``__init_subclass__``), so a class made here, not at
    import, is the one that checks them; the table is the base module's definition: a bias part
    (relative, absolute or content) adds a bias, which is position-only without a content part, and
    a value term needs the probabilities."""
    cls = type("Made", (PositionalScheme,), {part: lambda self, *a: None for part in parts})
    assert (cls.has_bias, cls.position_only_bias, cls.uses_value_term) == (has_bias, position_only, value_term)
    assert all(cls.defines(p) == (p in parts) for p in PositionalScheme.PARTS)


def test_a_scheme_of_ones_own_whose_bias_reads_the_keys_gets_its_terms_from_the_mixin():
    """``ContentBiasTerms`` is offered for a scheme of one's own (its docstring): the word-position
    term is the bias of the word queries *and keys*, so a bias that reads k (here k_j · w, a
    content score of the key alone) is split as the attention uses it; and a position part given
    to it is refused."""
    from posenc.encodings.content_bias import ContentBiasTerms

    class KeyScore(ContentBiasTerms, PositionalScheme):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.w = torch.nn.Parameter(torch.randn(self.head_dim))

        def content_bias(self, q, k, q_pos, k_pos):
            return (k @ self.w)[..., None, :] * self.logit_scale()  # (B, H, 1, Tk)

    sch = KeyScore(d_model=D, n_heads=H)
    q, k = qk(Tq=5, Tk=5)
    pos = torch.arange(5)
    terms = sch.terms(q, k, None, None, pos, pos)
    s = sch.logit_scale()
    torch.testing.assert_close(terms["word-word"], torch.einsum("bhid,bhjd->bhij", q, k) * s, **TOL)
    torch.testing.assert_close(terms["word-position"], (k @ sch.w)[..., None, :].expand(2, H, 5, 5) * s, **TOL)
    torch.testing.assert_close(sum(terms.values()), sch.bias(q, k, pos, pos) + q @ k.transpose(-1, -2) * s, **TOL)
    with pytest.raises(ValueError, match="adds nothing to the input"):
        sch.terms(q, k, q, k, pos, pos)
    # without the mixin, the default terms still sum to the logits (the bias, of the keys it is
    # given, under position-position)
    class KeyScorePlain(PositionalScheme):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.w = sch.w

        content_bias = KeyScore.content_bias

    plain = KeyScorePlain(d_model=D, n_heads=H)
    terms = plain.terms(q, k, None, None, pos, pos)
    torch.testing.assert_close(sum(terms.values()), plain.bias(q, k, pos, pos) + q @ k.transpose(-1, -2) * s, **TOL)


@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn"])
def test_a_scaled_rotation_keeps_the_activations_dtype(scaling):
    """Past L every rule rescales the angles, and YaRN multiplies q and k by a float32 factor: in
    bfloat16 activations q and k stay bfloat16 and equal the float32 rotation rounded."""
    sch = build("rope", scaling=scaling, original_len=4)
    q, k = qk(Tq=9, Tk=9)
    pos = torch.arange(9)
    qb, kb = sch.rotate(q.bfloat16(), k.bfloat16(), pos, pos)
    assert (qb.dtype, kb.dtype) == (torch.bfloat16, torch.bfloat16)
    q32, k32 = sch.rotate(q.bfloat16().float(), k.bfloat16().float(), pos, pos)
    torch.testing.assert_close((qb.float(), kb.float()), (q32, k32), atol=0.05, rtol=0.02)


# ------------------------------------------------------ per-scheme references
def shaw_tables(sch, q_pos, k_pos):
    k = sch.max_relative_position
    idx = (k_pos[None, :] - q_pos[:, None]).clamp(-k, k) + k
    return sch.rel_key[idx], sch.rel_value[idx]  # naive (Tq, Tk, Dh) each


@pytest.mark.parametrize("k", [0, 1, 2, 5])
@pytest.mark.parametrize("Tq,Tk,q0,k0", [(1, 1, 0, 0), (1, 6, 5, 0), (6, 6, 0, 0), (4, 9, 5, 0), (9, 4, 0, 0),
                                         (3, 5, 10, 0), (5, 3, 0, 10), (6, 6, 3, 3), (0, 5, 0, 0), (5, 0, 0, 0)])
@pytest.mark.parametrize("later_zero", [False, True])
def test_shaw_sums_per_clipped_distance_are_a_scatter_of_every_pair(k, Tq, Tk, q0, k0, later_zero):
    """``Shaw.per_distance`` (its gather, triangle and remainder for consecutive positions) against
    the definition, a loop over every pair adding probs[i, j] at clip(k_pos[j] - q_pos[i], -k, k):
    clipping widths 0 to 5, one query or one key, either sequence shorter or empty, the queries
    before, after or level with the keys, and later keys zero (causal probabilities) or not."""
    sch = build("shaw", True, max_relative_position=k)
    q_pos, k_pos = torch.arange(Tq) + q0, torch.arange(Tk) + k0
    probs = torch.rand(2, H, Tq, Tk, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    if later_zero:
        probs = probs * (k_pos[None, :] <= q_pos[:, None])
    want = _per_distance_by_pairs(sch, probs, q_pos, k_pos)
    torch.testing.assert_close(sch.per_distance(probs, q_pos, k_pos, later_zero), want, rtol=1e-12, atol=1e-12)


def _per_distance_by_pairs(sch, probs, q_pos, k_pos):
    """probs[..., i, j] added at clip(k_pos[j] - q_pos[i], -k, k), a pair at a time."""
    k = sch.max_relative_position
    ref = torch.zeros(*probs.shape[:-1], 2 * k + 1, dtype=probs.dtype)
    for i in range(len(q_pos)):
        for j in range(len(k_pos)):
            ref[..., i, int((k_pos[j] - q_pos[i]).clamp(-k, k)) + k] += probs[..., i, j]
    return ref


@pytest.mark.parametrize("gapped", ["queries", "keys", "both"])
def test_shaw_sums_per_clipped_distance_where_positions_are_not_consecutive(gapped):
    """The scatter ``Shaw.per_distance`` takes where the queries, the keys or both skip
    positions (every second one), against the loop over every pair: one side consecutive is
    not enough for the gather."""
    sch = build("shaw", True, max_relative_position=2)
    q_pos, k_pos = torch.arange(6), torch.arange(6)
    if gapped in ("queries", "both"):
        q_pos = q_pos * 2
    if gapped in ("keys", "both"):
        k_pos = k_pos * 2
    probs = torch.rand(2, H, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(sch.per_distance(probs, q_pos, k_pos), _per_distance_by_pairs(sch, probs, q_pos, k_pos),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq,Tk,gapped", [(9, 9, False), (4, 9, False), (9, 9, True)])
def test_shaw_vs_naive_gather(causal, Tq, Tk, gapped):
    sch = build("shaw", causal, max_relative_position=3)
    perturb(sch.parameters())
    q, k = qk(Tq=Tq, Tk=Tk)
    k_pos = torch.tensor([0, 1, 4, 5, 6, 9, 13, 14, 20]) if gapped else torch.arange(Tk) + 5
    q_pos = k_pos[Tk - Tq :]
    aK, aV = shaw_tables(sch, q_pos, k_pos)
    ref = torch.einsum("bhid,ijd->bhij", q, aK) / math.sqrt(DH)
    torch.testing.assert_close(sch.bias(q, k, q_pos, k_pos), ref, **TOL)
    # gradients of q and the key table, for an upstream gradient at every pair (later keys too)
    q_ = q.clone().requires_grad_()
    upstream = torch.randn(ref.shape)
    got = torch.autograd.grad(sch.bias(q_, k, q_pos, k_pos), [q_, sch.rel_key], upstream)
    aK, _ = shaw_tables(sch, q_pos, k_pos)
    want = torch.autograd.grad(torch.einsum("bhid,ijd->bhij", q_, aK) / math.sqrt(DH), [q_, sch.rel_key], upstream)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)
    logits = torch.randn(2, H, Tq, Tk)
    if causal:  # what causal attention hands the value term: later keys at probability 0
        logits = logits.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))
    probs = logits.softmax(-1)
    torch.testing.assert_close(sch.value_term(probs, q_pos, k_pos), torch.einsum("bhij,ijd->bhid", probs, aV), **TOL)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("clip", [None, 3])
@pytest.mark.parametrize("positions", ["consecutive", "offset", "gapped"])
def test_skew_scheme_vs_naive_gather(causal, clip, positions):
    sch = build("skew", causal, max_relative_position=clip)
    perturb(sch.parameters())
    T = 7
    pos = {
        "consecutive": torch.arange(T),
        "offset": torch.arange(T) + 30,
        "gapped": torch.tensor([0, 1, 4, 5, 6, 9, 13]),
    }[positions]
    q, k = qk(Tq=T, Tk=T)
    kk = sch.max_relative_position
    E = sch.rel_key[(pos[None, :] - pos[:, None]).clamp(-kk, kk) + kk]  # (T, T, Dh)
    ref = torch.einsum("bhid,ijd->bhij", q, E) / math.sqrt(DH)
    torch.testing.assert_close(sch.bias(q, k, pos, pos), ref, **TOL)


def explicit_txl(sch, q, k, q_pos, k_pos):
    dist = q_pos[:, None] - k_pos[None, :]  # i - j
    R = sinusoid(dist, D)  # (Tq, Tk, D): every R_{i-j} materialised
    WR = (R @ sch.w_r.weight.T).view(*dist.shape, H, DH)  # (Tq, Tk, H, Dh)
    u, v = sch.u[None, :, None, :], sch.v[None, :, None, :]
    ac = (q + u) @ k.transpose(-1, -2)
    bd = torch.einsum("bhid,ijhd->bhij", q + v, WR)
    return (ac + bd) / math.sqrt(DH), q @ k.transpose(-1, -2) / math.sqrt(DH)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq,Tk,offset", [(6, 6, 0), (6, 6, 11), (3, 8, 4), (1, 5, 0)])
def test_transformer_xl_vs_explicit_R(causal, Tq, Tk, offset):
    sch = build("transformer_xl", causal)
    perturb(sch.parameters())
    q, k = qk(Tq=Tq, Tk=Tk)
    k_pos = torch.arange(Tk) + offset
    q_pos = k_pos[Tk - Tq :]
    full, content = explicit_txl(sch, q, k, q_pos, k_pos)
    ref = full - content  # the bias is everything but q.k
    got = sch.bias(q, k, q_pos, k_pos)
    if causal:  # keys after the query are masked; the scheme keeps the u.k part there
        visible = k_pos[None, :] <= q_pos[:, None]
        torch.testing.assert_close(got[..., visible], ref[..., visible], **TOL)
    else:
        torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("Tq,Tk,offset", [(6, 6, 0), (6, 6, 9), (2, 7, 3)])
def test_fixed_bidirectional_vs_explicit_R(causal, Tq, Tk, offset):
    sch = build("fixed_bidirectional", causal)
    q, k = qk(Tq=Tq, Tk=Tk)
    k_pos = torch.arange(Tk) + offset
    q_pos = k_pos[Tk - Tq :]
    dist = q_pos[:, None] - k_pos[None, :]
    R = sinusoid(dist, DH)  # (Tq, Tk, Dh), R of the signed distance i - j
    ref = torch.einsum("bhid,ijd->bhij", q, R) / math.sqrt(DH)
    if causal:
        ref = ref.masked_fill(dist < 0, 0.0)
    torch.testing.assert_close(sch.bias(q, k, q_pos, k_pos), ref, **TOL)
    if not causal and Tq == Tk:  # both time directions really differ
        assert not torch.allclose(ref, ref.transpose(-1, -2), atol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("untie_cls", [False, True])
def test_tupe_vs_paper_equations(causal, untie_cls):
    sch = build("tupe", causal, untie_cls=untie_cls)
    perturb(sch.parameters())
    assert sch.logit_scale() == pytest.approx(1 / math.sqrt(2 * DH))
    T = 6
    pos = torch.arange(T)
    q, k = qk(Tq=T, Tk=T)
    got = sch.bias(q, k, pos, pos)[0]
    pq = (sch.table @ sch.u_q.weight.T).view(L, H, DH)  # p_i U^Q per head
    pk = (sch.table @ sch.u_k.weight.T).view(L, H, DH)
    with torch.no_grad():
        for h in range(H):
            for i in range(T):
                for j in range(T):
                    corr = float(pq[i, h] @ pk[j, h]) / math.sqrt(2 * DH)
                    if untie_cls and i == 0:
                        corr = float(sch.theta[0, h])  # [CLS] to others
                    elif untie_cls and j == 0:
                        corr = float(sch.theta[1, h])  # others to [CLS]
                    b = t5_bucket_reference(j - i, not causal, sch.num_buckets, sch.max_distance)
                    ref = corr + float(sch.rel.weight[b, h])
                    assert abs(float(got[h, i, j]) - ref) < 1e-5, (h, i, j)


def test_tupe_refuses_long_sequences():
    sch = build("tupe")
    with pytest.raises(ValueError, match="max_len"):
        sch.check_length(L + 1)


def test_cape_eval_equals_sinusoidal_and_train_augments():
    cape, sin = build("cape"), build("sinusoidal")
    x = torch.zeros(3, 20, D)
    pos = torch.arange(20)
    cape.eval()
    assert torch.equal(cape.embed(x, pos), sin.embed(x, pos))
    assert torch.equal(build("cape", base=500.0).eval().embed(x, pos), build("sinusoidal", base=500.0).embed(x, pos))
    assert not torch.allclose(build("cape", base=500.0).eval().embed(x, pos), sin.embed(x, pos))
    cape.train()
    aug = cape.embed(x, pos)
    assert aug.shape == (3, 20, D) and torch.isfinite(aug).all()
    assert not torch.allclose(aug[0], aug[1])  # per-sequence augmentation
    # each augmentation alone stays inside its documented range
    only = dict(max_global_shift=0.0, max_local_shift=0.0, max_global_scaling=1.0)
    local = build("cape", **{**only, "max_local_shift": 0.4}).augment(pos, 4) - pos
    assert local.abs().max() <= 0.4 and local.std() > 0
    shift = build("cape", **{**only, "max_global_shift": 3.0}).augment(pos, 4) - pos
    assert shift.abs().max() <= 3.0 and torch.allclose(shift, shift[:, :1].expand_as(shift))
    ratio = build("cape", **{**only, "max_global_scaling": 1.5}).augment(pos + 1, 4) / (pos + 1)
    assert ratio.min() >= 1 / 1.5 and ratio.max() <= 1.5 and torch.allclose(ratio, ratio[:, :1].expand_as(ratio))


def test_cape_augmentations_follow_the_paper():
    """Likhomanenko et al. 2021, section 3: x'_t = lambda (x_t + Delta + eps_t), Delta ~ U(-a, a)
    per sequence, eps_t ~ U(-b, b) per position, log lambda ~ U(-log c, log c) per sequence.
    Exactly that, for the draws taken in that order in float64 from the global generator; and
    over 20,000 sequences each draw fills its range (the extremes within 1% of the bounds, the
    mean 0 within 4 standard errors). a = 0.7 < 1, so a shift below one position counts too."""
    a, b, c, B, T = 0.7, 0.3, 1.5, 20_000, 6
    pos = torch.arange(T) + 2
    cape = build("cape", max_global_shift=a, max_local_shift=b, max_global_scaling=c)
    torch.manual_seed(5)
    got = cape.augment(pos, B)
    torch.manual_seed(5)
    f64 = torch.float64
    delta = (torch.rand((B, 1), dtype=f64) * 2 - 1) * a
    eps = (torch.rand((B, T), dtype=f64) * 2 - 1) * b
    lam = torch.exp((torch.rand((B, 1), dtype=f64) * 2 - 1) * math.log(c))
    assert got.dtype == f64
    torch.testing.assert_close(got, (pos.double() + delta + eps) * lam, atol=1e-12, rtol=1e-12)
    only = dict(max_global_shift=0.0, max_local_shift=0.0, max_global_scaling=1.0)
    draws = {
        "global shift": ((build("cape", **{**only, "max_global_shift": a}).augment(pos, B) - pos)[:, 0], a),
        "local shift": ((build("cape", **{**only, "max_local_shift": b}).augment(pos, B) - pos).flatten(), b),
        "log scaling": ((build("cape", **{**only, "max_global_scaling": c}).augment(pos, B) / pos).log()[:, 0],
                        math.log(c)),
    }  # fmt: skip
    for what, (d, width) in draws.items():
        assert -width <= float(d.min()) < -0.99 * width and 0.99 * width < float(d.max()) <= width, what
        assert abs(float(d.mean())) < 4 * width / math.sqrt(3 * d.numel()), what
    assert torch.equal(build("cape", **only).augment(pos, 3), pos.double().expand(3, -1))


SHIPPED = sorted(n for n, c in CONFIGS.items() if c.cls is not None and c.cls.__module__.startswith("posenc."))
#: shipped configs that run a scheme's class with other settings: {config: (its scheme, the settings it changes)}
SETTING_VARIANTS = {"t5_bias_scaled": ("t5_bias", {"num_buckets", "max_distance"})}


def _yaml_settings(name: str) -> dict:
    from omegaconf import OmegaConf

    yaml = OmegaConf.to_container(OmegaConf.load(CONFIGS[name].path).scheme, resolve=False)
    return {k: v for k, v in yaml.items() if not k.startswith("_") and not str(v).startswith("${")}


@pytest.mark.parametrize("name", sorted(SETTING_VARIANTS))
def test_a_variant_is_its_schemes_class_with_the_settings_it_names(name):
    """A variant (``t5_bias_scaled``: T5 at Press et al.'s max_distance relative to L) builds the
    class of the scheme it varies and differs from that scheme's YAML in the settings it names,
    and in nothing else."""
    base, changed = SETTING_VARIANTS[name]
    assert CONFIGS[name].cls is CONFIGS[base].cls
    mine, theirs = _yaml_settings(name), _yaml_settings(base)
    assert set(mine) == set(theirs) and {k for k in mine if mine[k] != theirs[k]} == changed


@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in SETTING_VARIANTS])
def test_class_defaults_are_the_yaml_settings(name):
    """A shipped scheme's keyword defaults are the settings of its ``encoding/<name>.yaml``
    (the values the README and the docstrings give), so ``Scheme(d_model=..., ...)`` in a
    notebook builds the model ``encoding=<name>`` trains. Interpolated settings (``${...}``)
    are left out. A variant of a scheme (``SETTING_VARIANTS``) has its own test."""
    import inspect

    settings = _yaml_settings(name)
    params = inspect.signature(CONFIGS[name].cls.__init__).parameters
    defaults = {k: list(p.default) if isinstance(p.default, tuple) else p.default
                for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k in settings}  # fmt: skip
    assert defaults == settings, name
    # and the class built with its defaults behaves as the YAML's scheme: same parameters,
    # tables, printed settings and outputs (the YAML passes every setting explicitly)
    if name == "tupe":  # untie_cls follows the task in the YAML (${task.cls}); the class defaults to False
        return
    for causal in modes_of(name):
        models = []
        for make in (CONFIGS[name].cls, factory(name)):
            torch.manual_seed(11)
            models.append(make(d_model=D, n_heads=H, max_len=L, causal=causal).eval())
        plain, yaml_built = models
        assert plain.extra_repr() == yaml_built.extra_repr(), name
        a, b = dict(plain.named_parameters()), dict(yaml_built.named_parameters())
        a.update(plain.named_buffers())
        b.update(yaml_built.named_buffers())
        assert a.keys() == b.keys(), name
        for key in a:
            assert torch.equal(a[key], b[key]), (name, key)
        for model in models:  # the same random values in both (tables that start at zero would hide a difference)
            torch.manual_seed(15)
            for p in model.parameters():
                p.data.normal_()
        torch.manual_seed(12)
        q, k, x, pos = torch.randn(1, H, 7, D // H), torch.randn(1, H, 7, D // H), torch.randn(1, 7, D), torch.arange(7)
        with torch.no_grad():
            far = torch.arange(-300, 301)  # distances past T5's exact buckets
            rel_a, rel_b = plain.relative_bias(far), yaml_built.relative_bias(far)
            assert (rel_a is None and rel_b is None) or torch.equal(rel_a, rel_b), name
            for hook, args in (("rotate", (q, k, pos, pos)), ("embed", (x, pos)), ("bias", (q, k, pos, pos))):
                out_a, out_b = getattr(plain, hook)(*args), getattr(yaml_built, hook)(*args)
                if isinstance(out_a, tuple):
                    assert all(torch.equal(u, w) for u, w in zip(out_a, out_b)), (name, hook)
                else:
                    assert (out_a is None and out_b is None) or torch.equal(out_a, out_b), (name, hook)


def test_kerple_initial_values_fill_their_ranges():
    """r1 and r2 start uniform over their ranges (``init_r1``, ``init_r2``), per head: with
    2000 heads every value lies in [low, high] and the extremes come within 1% of the range
    of its ends; a range of one value gives that value; a low of 0 or above high is refused."""
    torch.manual_seed(9)
    sch = Kerple(d_model=2000, n_heads=2000, init_r1=(0.5, 2.0), init_r2=(0.1, 1.0))
    for values, (lo, hi) in ((sch.r1, (0.5, 2.0)), (sch.r2, (0.1, 1.0))):
        values = values.detach().double()
        assert values.shape == (2000,)
        assert lo - 1e-6 <= float(values.min()) < lo + 0.01 * (hi - lo), (lo, hi)
        assert hi - 0.01 * (hi - lo) < float(values.max()) <= hi + 1e-6, (lo, hi)
        assert abs(float(values.mean()) - (lo + hi) / 2) < 0.03 * (hi - lo)
    one = Kerple(d_model=D, n_heads=H, init_r1=(1.5, 1.5), init_r2=(0.25, 0.25))
    torch.testing.assert_close(one.r1.detach(), torch.full((H,), 1.5))
    torch.testing.assert_close(one.r2.detach(), torch.full((H,), 0.25))
    for bad in ((0.0, 1.0), (2.0, 1.0)):
        with pytest.raises(ValueError, match="0 < low <= high"):
            Kerple(d_model=D, n_heads=H, init_r1=bad)


def test_skew_clips_at_the_model_length_by_default():
    """The Music Transformer skew keeps one vector per distance a sequence of ``max_len``
    can hold (2 max_len - 1, clip max_len - 1) unless told otherwise; a clip of 0 is allowed
    (every pair gets the vector of distance 0), a negative one is refused."""
    sch = build("skew")
    assert sch.max_relative_position == L - 1 and tuple(sch.rel_key.shape) == (2 * L - 1, D // H)
    assert tuple(build("skew", max_relative_position=3).rel_key.shape) == (7, D // H)
    zero = build("skew", max_relative_position=0)
    q, pos = torch.randn(1, H, 5, D // H), torch.arange(5)
    expected = (q @ zero.rel_key[0] / math.sqrt(D // H))[..., None].expand(1, H, 5, 5)
    torch.testing.assert_close(zero.bias(q, q, pos, pos), expected)
    with pytest.raises(ValueError, match="must be >= 0"):
        build("skew", max_relative_position=-1)


def test_skew_with_one_side_contiguous_equals_the_gather():
    """Contiguous queries with gapped keys (and the other way round) take the gather path,
    which gives the reference values (tests/references.py)."""
    from .references import reference_logits

    torch.manual_seed(10)
    sch = build("skew", max_relative_position=4)
    perturb(sch.parameters())
    q, k = torch.randn(2, H, 6, D // H), torch.randn(2, H, 6, D // H)
    for q_pos, k_pos in ((torch.arange(6) + 2, torch.tensor([0, 1, 3, 6, 7, 9])),
                         (torch.tensor([0, 1, 3, 6, 7, 9]), torch.arange(6) + 2)):  # fmt: skip
        ref = reference_logits(sch, q, k, q_pos, k_pos) - q @ k.mT / math.sqrt(D // H)
        torch.testing.assert_close(sch.bias(q, k, q_pos, k_pos), ref, atol=1e-5, rtol=1e-5)


def test_xpos_scales_about_the_middle_of_the_keys():
    """xPos scales q at position m by zeta^((m - c) / scale_base) and k at n by
    zeta^(-(n - c) / scale_base) about c = k_0 + floor(T / 2), the middle of the keys, so no
    factor grows with the absolute position (Sun et al. 2022 use the same centring in their
    code). Checked on the norms of each rotated pair (a rotation keeps them), T odd."""
    sch = build("xpos", scale_base=8.0)
    T, k0 = 7, 100
    pos = torch.arange(T) + k0
    ones = torch.ones(1, H, T, D // H)
    qr, kr = sch.rotate(ones, ones, pos, pos)
    norm = lambda x: x.view(1, H, T, -1, 2).norm(dim=-1) / math.sqrt(2)  # noqa: E731  per pair
    c = k0 + T // 2
    expo = (pos - c).double()[:, None] / 8.0
    zeta = sch.zeta.double()
    torch.testing.assert_close(norm(qr)[0, 0].double(), zeta ** expo, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(norm(kr)[0, 0].double(), zeta ** (-expo), atol=1e-5, rtol=1e-5)


def test_aligned_positions_is_the_self_attention_layout():
    """``aligned_positions`` (which lets the shift and skew constructions run) holds exactly
    when the keys are consecutive integers and the queries are their last Tq: at any offset,
    for Tq <= Tk; not for gaps, other orders, queries elsewhere, Tq > Tk or no keys."""
    from posenc.encodings import aligned_positions

    ar = torch.arange
    assert aligned_positions(ar(5), ar(5)) and aligned_positions(ar(5) + 7, ar(5) + 7)
    assert aligned_positions(ar(3) + 9, ar(5) + 7)  # the last 3 of keys 7..11
    assert aligned_positions(torch.tensor([11]), ar(5) + 7)
    assert not aligned_positions(ar(3) + 7, ar(5) + 7)  # the first 3, not the last
    assert not aligned_positions(ar(3) + 8, ar(5) + 7)
    assert not aligned_positions(torch.tensor([7, 8, 10]), torch.tensor([7, 8, 10]))  # a gap
    assert not aligned_positions(torch.tensor([8, 9, 11]), torch.tensor([7, 8, 9, 11]))
    assert not aligned_positions(ar(5).flip(0), ar(5).flip(0))
    assert not aligned_positions(ar(6) + 6, ar(5) + 7)  # more queries than keys
    assert not aligned_positions(ar(0), ar(0))


@pytest.mark.parametrize("name", SCHEMES)
def test_checkpoints_hold_parameters_not_derived_tables(name):
    """A scheme's state (what a checkpoint stores) is its parameters only: tables computed
    from the settings (sinusoids, ALiBi's slopes, inverse frequencies) are rebuilt at load,
    so they never go stale in a checkpoint and do not inflate it."""
    for causal in modes_of(name):
        sch = build(name, causal)
        assert set(sch.state_dict()) == {n for n, _ in sch.named_parameters()}, name


FAMILIES_OF = {  # the panels of the extrapolation figure
    "none": "none", "sinusoidal": "absolute", "learned": "absolute", "cape": "absolute", "rope": "rotary",
    "xpos": "rotary", "alibi": "position bias", "t5_bias": "position bias", "t5_bias_scaled": "position bias",
    "kerple": "position bias",
    "fire": "position bias", "tupe": "position bias", "shaw": "content-relative", "skew": "content-relative",
    "transformer_xl": "content-relative", "fixed_bidirectional": "content-relative",
}  # fmt: skip


def test_family_of_every_shipped_scheme():
    """``family()`` reads a scheme's kind from what it defines; for the shipped schemes it gives
    the kinds the figures group them by."""
    assert {n: CONFIGS[n].cls.family() for n in SHIPPED} == {n: FAMILIES_OF[n] for n in SHIPPED}
    assert _Hybrid.family() == "position bias"  # the first that applies wins


def test_printed_settings():
    """``print(model)`` shows each scheme's width, heads, mode and the settings that change it."""
    base = "d_model=32, n_heads=4, causal=True"
    assert build("alibi").extra_repr() == base
    assert build("cape").extra_repr() == base + ", max_global_shift=5.0, max_local_shift=0.5, max_global_scaling=1.03"
    assert build("shaw").extra_repr() == base + ", max_relative_position=16"
    assert build("skew").extra_repr() == base + f", max_relative_position={L - 1}"
    assert build("tupe").extra_repr() == base + ", untie_cls=False, relative_bias=True"
    assert build("xpos").extra_repr() == base + ", gamma=0.4, scale_base=512.0"
    assert build("rope").extra_repr() == base
    assert build("rope", scaling="yarn", original_len=16).extra_repr() == base + ", scaling=yarn, original_len=16"
    assert build("rope", scaling="pi", original_len=16, factor=4.0).extra_repr() == (
        base + ", scaling=pi, original_len=16, factor=4.0")
    assert build("rope", causal=False).extra_repr() == "d_model=32, n_heads=4, causal=False"


# (scheme, settings, accepted): each validated setting just inside and just outside its range
EDGES = [
    ("rope", {"fraction": 1.0}, True), ("rope", {"fraction": 0.0}, False), ("rope", {"fraction": 1.01}, False),
    ("rope", {"fraction": 0.25}, True), ("rope", {"fraction": 0.1}, False),  # head width 8: 2 features; 0.8 -> 1
    ("rope", {"fraction": 0.05}, False),  # 0.4 rounds to no feature
    ("rope", {"scaling": "pi", "original_len": 1}, True), ("rope", {"scaling": "pi", "original_len": 0}, False),
    ("rope", {"scaling": "pi"}, False), ("rope", {"scaling": "linear", "original_len": 8}, False),
    ("rope", {"scaling": "ntk", "original_len": 8, "fraction": 0.5}, True),
    ("rope", {"scaling": "ntk", "original_len": 8, "fraction": 0.25}, False),  # rotary dim 2
    ("rope", {"scaling": "yarn", "original_len": 8, "yarn_alpha": 2.0, "yarn_beta": 2.0}, False),
    ("rope", {"scaling": "yarn", "original_len": 8, "yarn_alpha": 2.0, "yarn_beta": 2.5}, True),
    ("rope", {"scaling": "yarn", "original_len": 8, "yarn_alpha": 0.0, "yarn_beta": 2.0}, False),
    ("xpos", {"scale_base": 0.0}, False), ("xpos", {"scale_base": 0.5}, True),
    ("cape", {"max_global_shift": 0.0}, True), ("cape", {"max_global_shift": -0.1}, False),
    ("cape", {"max_local_shift": 0.0}, True), ("cape", {"max_local_shift": 0.5}, True),
    ("cape", {"max_local_shift": 0.51}, False), ("cape", {"max_local_shift": -0.1}, False),
    ("cape", {"max_global_scaling": 1.0}, True), ("cape", {"max_global_scaling": 1.5}, True),
    ("cape", {"max_global_scaling": 0.99}, False),
    ("shaw", {"max_relative_position": 0}, True), ("shaw", {"max_relative_position": -1}, False),
]  # fmt: skip


@pytest.mark.parametrize("name,settings,accepted", EDGES)
def test_settings_at_the_edges_of_their_range(name, settings, accepted):
    """Each validated setting is accepted just inside its documented range and refused with a
    ValueError just outside (RoPE's fraction also when the rotated width, rounded, is odd or 0)."""
    make = lambda: build(name, **settings)  # noqa: E731
    if accepted:
        make()
    else:
        with pytest.raises(ValueError):
            make()


def test_sinusoidal_table_and_formula_paths_agree():
    """Positions inside the precomputed table read it; others (past max_len, negative) use the
    formula; both give the same values, in the activations' dtype. A table of 8 rows with a
    width of 32: position 8 is the first past it, 20 lies below the width."""
    sch = Sinusoidal(d_model=32, n_heads=4, max_len=8)
    x = torch.zeros(1, 1, 32)
    for pos in (torch.arange(8), torch.arange(9), torch.arange(21), torch.arange(-3, 5)):
        e = sch.embed(x, pos)
        assert e.dtype == torch.float32
        torch.testing.assert_close(e, sinusoid(pos, 32, 10000.0).float(), atol=1e-6, rtol=1e-6)
    assert sch.embed(x.double(), torch.arange(20, 25)).dtype == torch.float64
    other = Sinusoidal(d_model=32, n_heads=4, max_len=8, base=500.0)
    torch.testing.assert_close(other.embed(x, torch.arange(12)), sinusoid(torch.arange(12), 32, 500.0).float())


def test_cape_training_path_without_augmentation_is_sinusoidal():
    """With every augmentation off, CAPE in training mode is the sinusoid of the integer
    positions, with its own base."""
    off = dict(max_global_shift=0.0, max_local_shift=0.0, max_global_scaling=1.0, base=500.0)
    cape = build("cape", **off).train()
    x, pos = torch.zeros(2, 6, D), torch.arange(6) + 3
    got = cape.embed(x, pos)
    assert got.shape == (2, 6, D) and got.dtype == torch.float32
    torch.testing.assert_close(got, sinusoid(pos, D, 500.0).float().expand(2, -1, -1))


def test_shaw_tables_hold_one_vector_per_clipped_distance():
    """Shaw et al.: 2k + 1 relative keys and values, for distances -k .. k."""
    sch = build("shaw", max_relative_position=3)
    assert tuple(sch.rel_key.shape) == tuple(sch.rel_value.shape) == (7, D // H)


def test_tupe_parts_and_defaults():
    """TUPE (Ke et al. 2020) by default: no [CLS] untie, a T5-style relative bias of 32 buckets
    up to distance 128 that starts at zero, a position table of std 0.02; with
    ``untie_cls`` two vectors theta (the [CLS] row and column); without the relative bias,
    no table for it. Positions 0 .. max_len - 1 are accepted, max_len is not."""
    from posenc.encodings import TUPE

    torch.manual_seed(13)
    sch = TUPE(d_model=64, n_heads=4, max_len=512)
    assert sch.theta is None and sch.rel is not None and sch.rel.num_embeddings == 32
    assert (sch.num_buckets, sch.max_distance) == (32, 128) and torch.equal(sch.rel.weight, torch.zeros(32, 4))
    assert 0.018 < float(sch.table.std()) < 0.022
    assert sch.u_q.bias is None and sch.u_k.bias is None
    assert tuple(build("tupe", untie_cls=True).theta.shape) == (2, H)
    assert build("tupe", relative_bias=False).rel is None
    small = build("tupe")
    small.absolute_parts(torch.arange(L), torch.arange(L))
    with pytest.raises(ValueError, match="cannot represent"):
        small.absolute_parts(torch.arange(L + 1), torch.arange(L + 1))


def test_learned_table_scale():
    """The learned table starts as N(0, init_std^2) entries."""
    torch.manual_seed(14)
    for std in (1.0, 0.1):
        table = build("learned", init_std=std).table.detach()
        assert abs(float(table.std()) - std) < 0.05 * std, std


def complex_pairs(x):
    return torch.complex(x[..., 0::2].double(), x[..., 1::2].double())


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_rotary_product_depends_only_on_difference(name):
    sch = build(name)
    q, k = qk(B=1, Tq=1, Tk=1, heads=1)
    theta = 10000.0 ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    zeta = (torch.arange(0, DH, 2, dtype=torch.float64) / DH + 0.4) / 1.4
    for m, n in [(0, 0), (5, 2), (40, 3), (7, 7), (3, 9)]:
        dots = []
        for shift in (0, 13, 250):
            qm, kn = sch.rotate(q, k, torch.tensor([m + shift]), torch.tensor([n + shift]))
            dots.append(float(qm.flatten().double() @ kn.flatten().double()))
        assert max(dots) - min(dots) < 1e-4, (m, n, dots)
        # the formula, with complex numbers: sum_i Re(q_i conj(k_i) e^{i (m-n) theta_i}) [zeta_i^((m-n)/512)]
        terms = complex_pairs(q.flatten()) * complex_pairs(k.flatten()).conj() * torch.exp(1j * (m - n) * theta)
        scale = zeta ** ((m - n) / 512.0) if name == "xpos" else torch.ones_like(zeta)
        assert abs(dots[0] - float((terms.real * scale).sum())) < 1e-4


def test_kerple_vs_formula():
    sch = build("kerple", causal=False)
    r1, r2 = sch.r1.detach(), sch.r2.detach()
    assert (r1 > 0).all() and (r2 > 0).all()
    pos = torch.arange(7) + 3
    got = sch.bias(*qk(Tq=7, Tk=7), pos, pos)[0].detach()
    for h in range(H):
        for i in range(7):
            for j in range(7):
                ref = -float(r1[h]) * math.log(1 + float(r2[h]) * abs(i - j))
                assert abs(float(got[h, i, j]) - ref) < 1e-5


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("threshold", [512.0, 4.0])
def test_fire_vs_formula(causal, threshold):
    sch = build("fire", causal, init_threshold=threshold)
    perturb(sch.mlp.parameters())
    T = 10
    pos = torch.arange(T)
    got = sch.bias(*qk(Tq=T, Tk=T), pos, pos)[0]
    c, Lt = abs(sch.c.item()), abs(sch.threshold.item())

    def psi(x):
        return math.log(c * x + 1)

    xs = []
    for i in range(T):
        for j in range(T):
            d = i - j
            norm = max(Lt, i) if j <= i else max(Lt, i, j)  # the paper's max(L, i) on causal entries
            xs.append(math.copysign(psi(abs(d)), d) / (psi(norm) + sch.eps) if d else 0.0)
    with torch.no_grad():
        ref = sch.mlp(torch.tensor(xs)[:, None]).T.reshape(H, T, T)
    torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize("rows_non_increasing", [False, True])
def test_fire_pieces_equal_the_mlp(rows_non_increasing):
    """FIRE's MLP evaluated as a piecewise-linear function (``mlp_of_pairs``, the pairs past
    the threshold) equals the MLP itself: values, and gradients of the input and of every MLP
    parameter, at random inputs, exactly at the breaks, beyond the outermost ones, with a
    unit of zero input weight (a constant) and with two units that break at one point. Both
    ways of finding the segments: entry by entry, and for rows that never increase (FIRE's
    blocks past the threshold) a row at a time."""
    from posenc.encodings.position_bias import _Pieces

    torch.manual_seed(0)
    sch = build("fire")
    perturb(sch.mlp.parameters(), scale=1.0)
    lin1 = sch.mlp[0]
    with torch.no_grad():
        lin1.weight[3, 0] = 0.0  # flat, active
        lin1.bias[3] = 0.7
        lin1.weight[4, 0] = 0.0  # flat, dead
        lin1.bias[4] = -0.2
        lin1.weight[6, 0], lin1.bias[6] = -2 * lin1.weight[5, 0], -2 * lin1.bias[5]  # one break, two units
    breaks = (-lin1.bias / lin1.weight[:, 0]).detach()
    breaks = breaks[torch.isfinite(breaks)]
    off = torch.cat([torch.randn(200) * 3, breaks.min()[None] - 5, breaks.max()[None] + 5]).view(2, -1)
    if rows_non_increasing:
        off = off.sort(dim=1, descending=True).values
    # entry by entry: the method FIRE's callers use; a row at a time: the blocks' route
    pieces = (lambda x: _Pieces.apply(x, *sch.pieces(), True)) if rows_non_increasing else sch.mlp_of_pairs
    # on a break a unit is at 0 either way (values agree) but which side's slope the gradient
    # takes is a choice, so gradients are compared off the breaks only
    with torch.no_grad():
        torch.testing.assert_close(sch.mlp_of_pairs(breaks[None]), sch.mlp(breaks[:, None]).T[:, None],
                                   atol=1e-5, rtol=1e-5)
    upstream = torch.randn(H, *off.shape)
    results = []
    for fn in (pieces, lambda x: sch.mlp(x[..., None]).permute(2, 0, 1)):
        x = off.clone().requires_grad_()
        y = fn(x)
        results.append((y, *torch.autograd.grad(y, [x, *sch.mlp.parameters()], upstream)))
    for name, a, b in zip(["value", "input", *[n for n, _ in sch.mlp.named_parameters()]], *results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def fire_by_formula(sch, qp: torch.Tensor, kp: torch.Tensor) -> torch.Tensor:
    """FIRE's bias (H, Tq, Tk) as the paper writes it (eq. 4, the normaliser psi(max(L, i)),
    max(L, i, j) past the query), autograd through every step: the reference of the kernel's
    gradients."""
    i, j = qp[:, None].to(sch.c.dtype), kp[None, :].to(sch.c.dtype)
    c, L = sch.c.abs(), sch.threshold.abs()
    norm = torch.where(j <= i, torch.maximum(L, i), torch.maximum(torch.maximum(L, i), j))
    x = torch.sign(i - j) * torch.log1p(c * (i - j).abs()) / (torch.log1p(c * norm) + sch.eps)
    return sch.mlp(x[..., None]).permute(2, 0, 1)


@pytest.fixture
def fire_ops():
    """``torch.ops.posenc`` with FIRE's kernel; the test is skipped where it cannot be built
    (a failure under ``POSENC_NO_SKIPS``, as in CI)."""
    ops = native.fire_block_ops()
    if ops is None:
        pytest.skip("FIRE's kernel could not be built here (see the warning)")
    return ops


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_fire_kernel_equals_pytorch_version(causal, dtype, fire_ops):
    """FIRE's compiled kernel (``_FireBlock``, ``native.py``) on blocks past the threshold
    gives the values and gradients (of c, L and the MLP's parameters) of its PyTorch version
    (``block_input`` and ``_Pieces``) and of the formula under autograd (``fire_by_formula``):
    for c from 0.1 to 10, thresholds below the positions and inside them (where a row's
    normaliser psi(L) ties a later key's psi(j), at j = L = 512), whole matrices and blocks."""
    from contextlib import nullcontext

    torch.manual_seed(0)
    T = 300
    for c, threshold, offset in [(0.1, 40.0, 0), (1.0, 512.0, 300), (10.0, 4.0, 7)]:
        sch = build("fire", causal, init_c=c, init_threshold=threshold).to(dtype)
        perturb(sch.mlp.parameters(), scale=0.5)
        params = list(sch.parameters())
        pos = torch.arange(T) + offset
        reference = fire_by_formula(sch, pos, pos)
        for rows, cols in [(slice(None), slice(None)), (slice(100, 228), slice(0, 228)), (slice(250, 300), slice(None))]:
            upstream = torch.randn(1, H, *reference[:, rows, cols].shape[1:], dtype=dtype)
            got = {}
            for route, ctx in [("_FireBlockBackward", nullcontext()), ("_PiecesBackward", native.disabled())]:
                with ctx:
                    b = sch.absolute_block(sch.absolute_parts(pos, pos), pos, pos, rows, cols)
                assert type(b.grad_fn.next_functions[0][0]).__name__ == route
                got[route] = (b, *torch.autograd.grad(b, params, upstream))
            ref = reference[None, :, rows, cols]
            got["formula"] = (ref, *torch.autograd.grad(ref, params, upstream, retain_graph=True))
            for other in ("_PiecesBackward", "formula"):
                for name, a, e in zip(["value", *[n for n, _ in sch.named_parameters()]], got["_FireBlockBackward"],
                                      got[other]):
                    tol = (1e-4 if dtype == torch.float32 else 1e-10) * float(e.detach().abs().max())
                    torch.testing.assert_close(a, e, atol=tol, rtol=0,
                                               msg=lambda m, n=f"c={c}, L={threshold}, {rows}: {name} ({other})": f"{n}: {m}")


def test_fire_kernel_finds_every_segment(fire_ops):
    """The kernel's segment of every entry is the number of break points below it, as
    ``searchsorted`` counts, for rows in any order (not only the never-increasing rows of
    FIRE's blocks), entries exactly on a break, beyond the outermost ones, and a flat unit's
    infinite break: with unrelated slopes and intercepts per segment, a wrong segment shows."""
    torch.manual_seed(0)
    dt = torch.float64
    order = torch.sort(torch.cat([torch.randn(9, dtype=dt), torch.tensor([0.5, 0.5, float("inf")], dtype=dt)])).values
    n, c, left = 7, 50, 3
    vals = torch.randn(n + c - 1, dtype=dt) * 2
    vals[::5] = order[torch.randint(0, 11, (vals[::5].shape[0],))]  # on a break
    vals[10:40] = (order[3] + order[4]) / 2  # a run long enough to be scanned 8 keys at a time,
    vals[25] = order[3]  # ending on the break below it
    rn, cn = torch.ones(n, dtype=dt), torch.rand(c, dtype=dt)  # every normaliser 1: x is the numerator exactly
    A, C = torch.randn(4, order.shape[0] + 1, dtype=dt), torch.randn(4, order.shape[0] + 1, dtype=dt)
    x = toeplitz(vals, n, c).contiguous()
    s = torch.searchsorted(order, x)
    torch.testing.assert_close(fire_ops.fire_block_forward(vals, rn, cn, order, A, C, left), A[:, s] * x + C[:, s],
                               atol=1e-12, rtol=0)


def test_fire_kernel_gradients_do_not_depend_on_threads(fire_ops):
    """The kernel's backward sums groups of rows into parts of their own and adds the parts
    in order, so one thread and two give the same bits (in float64, where the sums' own
    rounding shows: in float32 the double sums mostly round to the same floats either way)."""
    torch.manual_seed(0)
    sch, pos = build("fire", init_threshold=4.0).double(), torch.arange(300)
    perturb(sch.mlp.parameters(), scale=0.5)
    upstream = torch.randn(1, H, 300, 300, dtype=torch.float64)
    before = torch.get_num_threads()
    grads = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            b = sch.absolute_block(sch.absolute_parts(pos, pos), pos, pos, slice(None), slice(None))
            grads.append(torch.autograd.grad(b, list(sch.parameters()), upstream))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.slow
def test_fire_kernel_off_or_unbuildable_leaves_the_pytorch_version(tmp_path, monkeypatch):
    """With ``POSENC_NATIVE=0``, or a kernel that does not compile, FIRE runs its PyTorch
    version; a failed build says so in a warning and does not raise."""
    monkeypatch.setenv(native.ENV, "0")
    assert native.fire_block_ops() is None
    sch, pos = build("fire", init_threshold=4.0), torch.arange(20)
    b = sch.absolute_block(sch.absolute_parts(pos, pos), pos, pos, slice(None), slice(None))
    assert type(b.grad_fn.next_functions[0][0]).__name__ == "_PiecesBackward"
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    with pytest.warns(UserWarning, match="runs its PyTorch version"):
        assert native._build(broken, "posenc_broken_probe") is False


def test_pieces_segments_of_non_increasing_rows():
    """``_Pieces.segments`` of rows that never increase (a search per row and break point)
    gives the integers ``searchsorted`` gives entry by entry: with ties, entries on a break,
    beyond the outermost breaks, and a flat unit's infinite break."""
    from posenc.encodings.position_bias import _Pieces

    torch.manual_seed(0)
    order = torch.sort(torch.cat([torch.randn(12), torch.tensor([0.5, 0.5, float("inf")])])).values
    rows = torch.cat([torch.randn(6, 40) * 2, order[:3].repeat(6, 1), torch.full((6, 5), 0.5)], 1)
    x = torch.sort(rows.round(decimals=1), dim=1, descending=True).values
    x[:, 3] = x[:, 4]  # a tie
    got = _Pieces.segments(x, order, True)
    assert got.dtype == torch.int32
    assert torch.equal(got.long(), torch.searchsorted(order, x))
    assert torch.equal(_Pieces.segments(x, order, False).long(), torch.searchsorted(order, x))
    # every path gives int32: rows searched entry by entry, one row, a stack of rows, no entry at all
    for y, flag in ((x, False), (x[0], True), (x[None], True), (x[:, :0], True), (x[:1, :1], True)):
        got = _Pieces.segments(y, order, flag)
        assert got.dtype == torch.int32 and torch.equal(got.long(), torch.searchsorted(order, y)), (y.shape, flag)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.slow
def test_fire_block_input_never_increases_along_a_row(causal):
    """FIRE's input on a block of consecutive positions past its threshold never increases
    along a row (what ``_Pieces`` relies on to search a row at a time), but for float
    rounding where it changes by less than an ulp from key to key (far past the query, with
    a large c), for c from 0.01 to 10, thresholds below and inside the length, whole matrices
    and blocks at offsets. Its segments equal those of ``searchsorted`` but for entries
    within a few ulps of a break point, where either side's line gives the same value (the
    MLP is continuous)."""
    from posenc.encodings.position_bias import _Pieces

    T = 1200
    for c, threshold, offset in [(0.1, 512.0, 0), (0.01, 1.0, 3), (1.0, 40.0, 700), (10.0, 4.0, 0), (0.1, 1.0, 5000)]:
        sch = build("fire", causal, init_c=c, init_threshold=threshold)
        pos = torch.arange(T) + offset
        with torch.no_grad():
            parts = sch.absolute_parts(pos, pos)
            order = parts[0]
            for rows, cols in [(slice(None), slice(None)), (slice(600, 728), slice(0, 728)), (slice(1100, 1200), slice(None))]:
                x = sch.block_input(parts, pos, pos, rows, cols)
                ulp = torch.finfo(x.dtype).eps * x.abs()
                bad = (x[:, 1:] - x[:, :-1] > 2 * ulp[:, 1:]).nonzero()
                assert not len(bad), f"c={c}, L={threshold}, +{offset}: rises at {bad[:3].tolist()}"
                differ = _Pieces.segments(x, order, True).long() != torch.searchsorted(order, x)
                breaks = order[torch.isfinite(order)]
                near = ((x[..., None] - breaks).abs() <= 4 * torch.finfo(x.dtype).eps * (x.abs()[..., None] + breaks.abs())).any(-1)
                assert not (differ & ~near).any(), f"c={c}, L={threshold}, +{offset}: {int(differ.sum())} differ"


def test_sinusoidal_embed_vs_formula():
    """Sinusoidal.embed, inside its table and past it, against Vaswani et al.'s formula
    evaluated element by element: PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(...)."""
    sch = build("sinusoidal")
    x = torch.zeros(2, 5, D)
    for pos in (torch.tensor([0, 1, 7, 30, L - 1]), torch.tensor([L, L + 3, 200, 1000, 5])):
        got = torch.broadcast_to(sch.embed(x, pos), x.shape).tolist()  # what is added to x
        for t, p in enumerate(pos.tolist()):
            for c in range(D):
                w = 1.0 / 10000 ** (2 * (c // 2) / D)
                ref = math.sin(p * w) if c % 2 == 0 else math.cos(p * w)
                assert abs(got[0][t][c] - ref) < 1e-5 and got[1][t][c] == got[0][t][c], (p, c)


def test_learned_embed_is_table_row():
    """A learned absolute table (GPT, BERT): embed(x, pos)[b, t] is row pos[t] of the
    table, whatever the order of the positions, and different positions get different vectors."""
    torch.manual_seed(7)
    sch = build("learned")
    x = torch.randn(3, 6, D)
    pos = torch.tensor([0, 5, 1, L - 1, 17, 5])  # any order, a repeat
    got = torch.broadcast_to(sch.embed(x, pos), x.shape)  # what is added to x
    table = sch.table.detach()
    assert table.shape == (L, D)
    for b in range(3):
        for t, p in enumerate(pos.tolist()):
            assert torch.equal(got[b, t], table[p]), (b, t, p)
    first = {p: t for t, p in reversed(list(enumerate(pos.tolist())))}
    for a in first:
        for c in first:
            if a < c:
                assert not torch.allclose(got[0, first[a]], got[0, first[c]]), f"positions {a} and {c} share a vector"


@pytest.mark.parametrize("heads", [4, 8])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_bias_vs_formula(causal, heads):
    """ALiBi's bias (Press et al. 2022, section 3), entry by entry: -m_h |i - j| with
    m_h = 2^(-8 (h + 1) / H) for H a power of two, head h getting m_h; symmetric when
    bidirectional, the visible entries j <= i when causal. Both the bias and the
    position_bias the model uses."""
    sch = factory("alibi")(d_model=D, n_heads=heads, max_len=L, causal=causal)
    slopes = [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]
    for pos in (torch.arange(7), torch.arange(7) + 20, torch.tensor([0, 2, 3, 7, 8, 12, 13])):
        for got in (sch.bias(None, None, pos, pos), sch.position_bias(pos, pos)):
            assert got.shape == (1, heads, 7, 7)
            got = got[0].tolist()
            for h in range(heads):
                for i, pi in enumerate(pos.tolist()):
                    for j, pj in enumerate(pos.tolist()):
                        if causal and pj > pi:
                            continue  # masked
                        ref = -slopes[h] * abs(pi - pj)
                        assert abs(got[h][i][j] - ref) < 1e-6, (h, pi, pj, got[h][i][j], ref)


@pytest.mark.parametrize("causal", [True, False])
def test_t5_bias_vs_bucket_reference(causal):
    """T5's bias (Raffel et al. 2020), entry by entry: bias[0, h, i, j] is the learned
    table's entry for head h and the bucket of j - i (the plain-Python
    ``t5_bucket_reference``; bidirectional buckets unless causal), with a perturbed
    table, at distances past max_distance too. Both the bias and the position_bias
    the model uses."""
    torch.manual_seed(8)
    sch = build("t5_bias", causal)
    perturb(sch.parameters())
    weight = sch.table.weight.detach().tolist()  # (num_buckets, H)
    assert len(weight) == sch.num_buckets and len(set(map(tuple, weight))) == sch.num_buckets
    T = 40
    for pos in (torch.arange(T) + 3, torch.arange(0, 5 * T, 5)):  # distances up to 39 and 195
        for got in (sch.bias(None, None, pos, pos), sch.position_bias(pos, pos)):
            assert got.shape == (1, H, T, T)
            got = got[0].tolist()
            for i, pi in enumerate(pos.tolist()):
                for j, pj in enumerate(pos.tolist()):
                    b = t5_bucket_reference(pj - pi, not causal, sch.num_buckets, sch.max_distance)
                    for h in range(H):
                        assert abs(got[h][i][j] - weight[b][h]) < 1e-7, (h, pi, pj, b)


def test_nope_bidirectional_model_is_permutation_equivariant():
    """NoPE (Kazemnejad et al. 2023) gives a bidirectional model no position at all:
    permuting the input tokens permutes the outputs. The causal mask alone is
    positional, so the same check fails for a causal model."""
    torch.manual_seed(9)
    idx = torch.randint(0, 256, (2, 12))
    perm = torch.randperm(12)
    assert not torch.equal(perm, torch.arange(12))
    model = tiny_model("none", causal=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(idx[:, perm]), model(idx)[:, perm], **TOL)
        causal = tiny_model("none", causal=True).eval()
        assert not torch.allclose(causal(idx[:, perm]), causal(idx)[:, perm], atol=1e-3)


# ---------------------------------------------------------- every scheme
def first_layer_logits(model: Transformer, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The pre-mask logits the first layer really uses, from LN1 of the real input."""
    word, posn = model.embed(idx, pos)
    x = word if posn is None else word + posn
    attn = model.blocks[0].attn
    q, k, _ = attn.project(model.blocks[0].ln1(x))
    return attn.logits(q, k, pos, pos)


def expected_terms(cls: type[PositionalScheme]) -> tuple[set[str], set[str]]:
    """(terms a scheme must return, terms it may return), from its hooks: an input
    embedding gives all four; a rotation, or a bias from positions alone,
    position-position; a bias from content word-position, and perhaps the two
    position-* terms (Transformer-XL's u.k and v.W_R R)."""
    content_bias = cls.has_bias and not cls.position_only_bias
    least = {WW}
    if cls.defines("embed"):
        least |= {WP, PW, PP}
    if cls.defines("rotate") or cls.position_only_bias:
        least |= {PP}
    if content_bias:
        least |= {WP}
    return least, least | ({PW, PP} if content_bias else set())


def test_scheme_discovery():
    """Every encoding/<name>.yaml of every config root (conf/ and POSENC_SCHEME_PATH) is
    a scheme of these tests, found once."""
    assert not DISCOVERY_PROBLEMS, "\n".join(DISCOVERY_PROBLEMS)
    for root in config_roots():
        found = sorted(p.stem for p in (root / "encoding").glob("*.yaml"))
        assert found, f"no encoding/*.yaml in {root}"
        assert set(found) <= set(SCHEMES), sorted(set(found) - set(SCHEMES))


@pytest.mark.parametrize("name", SCHEMES)
def test_configs_build_and_flags(name):
    sch = build(name)
    assert isinstance(sch, PositionalScheme)
    assert type(sch) is scheme_class(name)
    model = tiny_model(name)
    shared = [b.attn.scheme for b in model.blocks]
    if sch.shared_across_layers:
        assert all(s is model.scheme for s in shared)
    else:
        assert len({id(s) for s in shared}) == len(shared)


@pytest.mark.parametrize("name", SCHEMES)
def test_docstring_cites_paper_and_names_its_check(name):
    """The class docstring cites the paper with its year and has a sentence starting
    "Checked against" that names the test functions comparing the scheme with an
    independent reference; each must be defined under tests/ or beside the scheme's module."""
    cls = scheme_class(name)
    doc = cls.__doc__ or ""
    where = f"{name}: the docstring of {cls.__module__}.{cls.__qualname__}"
    assert doc.strip(), f"{where} is missing"
    assert YEAR.search(doc), f"{where} should cite its paper with the year (e.g. 'Press et al. 2022')"
    sentence = checked_against(doc)
    assert sentence, (
        f"{where} should have a sentence starting 'Checked against' that names the test(s) "
        "comparing the scheme with an independent reference (test_...)"
    )
    named = TEST_NAME.findall(sentence)
    assert named, f"{where}: its 'Checked against' sentence names no test function (test_...): {sentence!r}"
    missing = sorted(set(named) - defined_tests(cls))
    assert not missing, (
        f"{where} names {missing}, which no .py file under tests/ or beside {cls.__module__} defines"
    )


@pytest.mark.parametrize("name,causal", MODES, ids=MODE_IDS)
def test_shift_invariance_matches_relative_flag(name, causal):
    """``relative = True``: shifting every position by the same amount changes neither
    the logits nor the model's output. ``relative = False``: it changes the logits.
    A wrong declaration fails either way."""
    torch.manual_seed(6)
    model = tiny_model(name, causal).eval()
    perturb(model.positional_parameters())
    idx = torch.randint(0, 256, (2, 9))
    pos = torch.arange(9)
    relative = type(model.scheme).relative
    with torch.no_grad():
        base, out = first_layer_logits(model, idx, pos), model(idx, pos)
        assert torch.equal(first_layer_logits(model, idx, pos), base), f"{name}: logits differ between two calls"
        for shift in (1, 37):
            shifted = first_layer_logits(model, idx, pos + shift)
            if relative:
                torch.testing.assert_close(
                    shifted, base, atol=1e-4, rtol=1e-4,
                    msg=lambda m, s=shift: f"{name} declares relative = True, but shifting every position "
                    f"by {s} changed its logits (is it absolute?): {m}",
                )  # fmt: skip
                torch.testing.assert_close(model(idx, pos + shift), out, atol=1e-4, rtol=1e-4)
            else:
                change = float((shifted - base).abs().max())
                assert change > 1e-3, (
                    f"{name}: shifting every position by {shift} changed the logits by at most {change:.1e}, "
                    f"yet {type(model.scheme).__name__} declares relative = False (the default). If the "
                    "scheme really is relative (its logits depend on positions only through j - i), "
                    "set `relative = True` on its class"
                )


@pytest.mark.parametrize("name,causal", MODES, ids=MODE_IDS)
def test_dtypes_follow_the_activations(name, causal):
    """With float32 parameters and float64 activations (as in mixed precision, where the
    parameters stay float32 and the activations are bf16): what a scheme adds to the input,
    its rotated q and k, a bias that depends on q or k, and the value term come out in the
    activations' dtype; a bias from positions alone in the parameters' (attention adds it to
    the logits, which promotes). Each equals the all-float32 computation."""
    torch.manual_seed(7)
    sch = build(name, causal).eval()  # evaluation: CAPE's random augmentation is off
    perturb(sch.parameters())
    T, f64 = 9, torch.float64
    pos = torch.arange(T)
    x = torch.randn(2, T, D, dtype=f64)
    q, k = torch.randn(2, H, T, D // H, dtype=f64), torch.randn(2, H, T, D // H, dtype=f64)
    probs = torch.rand(2, H, T, T, dtype=f64).softmax(-1)
    loose = dict(atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        e, e32 = sch.embed(x, pos), sch.embed(x.float(), pos)
        assert (e is None) == (e32 is None)
        if e is not None:
            assert e.dtype == f64, e.dtype
            torch.testing.assert_close(e.float(), e32, **loose)
            assert sch.train().embed(x, pos).dtype == f64  # in training too (CAPE augments)
            sch.eval()
        qr, kr = sch.rotate(q, k, pos, pos)
        qr32, kr32 = sch.rotate(q.float(), k.float(), pos, pos)
        assert (qr.dtype, kr.dtype) == (f64, f64)
        torch.testing.assert_close((qr.float(), kr.float()), (qr32, kr32), **loose)
        b, b32 = sch.bias(qr, kr, pos, pos), sch.bias(qr32, kr32, pos, pos)
        assert (b is None) == (b32 is None)
        if b is not None:
            assert b.dtype == (torch.float32 if sch.position_only_bias else f64), b.dtype
            torch.testing.assert_close(b.float(), b32, **loose)
        if e is None:  # the Ke et al. terms too: a content-dependent one in the activations' dtype
            t, t32 = sch.terms(q, k, None, None, pos, pos), sch.terms(q.float(), k.float(), None, None, pos, pos)
            assert t.keys() == t32.keys()
            for part, term in t.items():
                torch.testing.assert_close(term.float(), t32[part], **loose)
            if sch.has_bias and not sch.position_only_bias:
                assert {term.dtype for term in t.values()} == {f64}
        bf = torch.bfloat16  # and in bfloat16, which float32 parameters or angles would promote
        qb, kb = sch.rotate(q.to(bf), k.to(bf), pos, pos)
        assert (qb.dtype, kb.dtype) == (bf, bf)
        if sch.has_bias and not sch.position_only_bias:
            assert sch.bias(qb, kb, pos, pos).dtype == bf
        if sch.uses_value_term:
            v = sch.value_term(probs, pos, pos)
            assert v.dtype == f64
            torch.testing.assert_close(v.float(), sch.value_term(probs.float(), pos, pos), **loose)


class _Hybrid(PositionalScheme):
    """A sinusoidal input embedding, RoPE's rotation and ALiBi's bias in one scheme (no
    shipped scheme has all three, the default ``terms`` handles them together)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.sin, self.rope, self.alibi = Sinusoidal(**kw), RoPE(**kw), ALiBi(**kw)

    def embed(self, x, pos):
        return self.sin.embed(x, pos)

    def rotate(self, q, k, q_pos, k_pos):
        return self.rope.rotate(q, k, q_pos, k_pos)

    def relative_bias(self, rel):
        return self.alibi.relative_bias(rel)


@pytest.mark.parametrize("causal", [True, False])
def test_terms_of_a_scheme_with_embedding_rotation_and_bias(causal):
    """The default ``terms`` of a scheme that adds to the input, rotates and biases: the
    four terms sum to the logits attention uses and to the reference (sinusoids added to
    the word embedding, the rotation by complex numbers, ALiBi's -m|i - j|, computed in
    ``tests/references.py``); word-word is the product of the word parts alone."""
    from .references import _alibi, _rotary, content, dense_qkv, sinusoids

    torch.manual_seed(8)
    cfg = ModelConfig(vocab_size=256, d_model=D, n_layers=1, n_heads=H, d_ff=64, max_len=L, causal=causal)
    model = Transformer(cfg, _Hybrid).eval()
    idx, pos = torch.randint(0, 256, (2, 11)), torch.arange(11)
    terms = model.first_layer_terms(idx, pos)
    assert set(terms) == set(TERM_NAMES)
    with torch.no_grad():
        word = model.tok(idx) * math.sqrt(D)
        ln1, attn = model.blocks[0].ln1, model.blocks[0].attn
        q, k, _ = dense_qkv(attn, ln1(word + sinusoids(pos, D)))
        sch = model.scheme
        ref = _rotary(sch.rope, q, k, pos, pos) + _alibi(sch.alibi, q, k, pos, pos) - content(sch.alibi, q, k)
        used = first_layer_logits(model, idx, pos)
    torch.testing.assert_close(sum(terms.values()), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(used, ref, atol=1e-4, rtol=1e-4)
    assert float((terms[PP] - ref).abs().max()) > 1e-2  # the position terms carry something


@pytest.mark.parametrize("name,causal", MODES, ids=MODE_IDS)
def test_terms_sum_to_logits(name, causal):
    torch.manual_seed(0)
    model = tiny_model(name, causal)
    perturb(model.positional_parameters())
    model.eval()
    idx = torch.randint(0, 256, (3, 11))
    pos = torch.arange(11)
    terms = model.first_layer_terms(idx, pos)
    least, most = expected_terms(type(model.scheme))
    assert least <= set(terms) <= most, f"{name}: terms {sorted(terms)}, expected {sorted(least)} to {sorted(most)}"
    for tname, t in terms.items():
        assert t.shape == (3, H, 11, 11)
        assert float(t.abs().max()) > 1e-6, f"{name}: the {tname} term is identically zero"
    with torch.no_grad():
        ref = dense_first_layer_logits(model, idx, pos)  # the paper's formula (tests/references.py)
        used = first_layer_logits(model, idx, pos)  # the logits attention really uses
    torch.testing.assert_close(sum(terms.values()), used, atol=1e-4, rtol=1e-4)
    # entries a causal model masks may hold anything (the O(n) shift leaves other values there)
    seen = torch.ones(11, 11, dtype=torch.bool).tril() if causal else torch.ones(11, 11, dtype=torch.bool)
    torch.testing.assert_close(used[..., seen], ref[..., seen], atol=1e-4, rtol=1e-4)


def takes_recomputed_route(name: str, causal: bool, overrides: dict) -> bool:
    """Whether a training call of the scheme (a model in train mode, gradients on,
    contiguous positions) takes the ``recomputed`` route, as ``Attention.route`` decides."""
    if cls_of(name) is None:
        return False  # fails in every test that applies to all schemes
    try:
        with torch.random.fork_rng(devices=[]):
            model = tiny_model(name, causal, **overrides).train()
        with torch.enable_grad():
            return model.blocks[0].attn.route(torch.zeros(1, 8, D), torch.arange(8)) == RECOMPUTED
    except Exception:
        return True  # does not build: let the test fail on it


@pytest.mark.parametrize("name,causal,overrides", variant_params(takes_recomputed_route))
def test_recomputed_bias_backward_equals_autograd(name, causal, overrides, monkeypatch):
    """Every scheme whose training call takes the ``recomputed`` route (learned
    position-only biases and content biases without a value term, on CPU) trains
    through ``_RecomputedBiasAttention`` (fused forward, blockwise recomputed
    backward). Its gradients, for every parameter of the model, equal autograd through
    the dense reference layer by layer (``tests/references.py``, which calls none of
    the scheme's attention methods). Blocks of 3 query rows, so every layer crosses
    several blocks."""
    from posenc.attention import blocks, recomputed

    calls = []
    original = recomputed._RecomputedBiasAttention.apply

    def counting_apply(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(recomputed._RecomputedBiasAttention, "apply", counting_apply)
    B, T = 2, 12
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", B * H * T * 3)
    torch.manual_seed(4)
    model = tiny_model(name, causal, **overrides).train()
    perturb(model.positional_parameters())
    idx = torch.randint(0, 256, (B, T))
    target = torch.roll(idx, -1, 1)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    # contiguous positions take the recomputing backward, shuffled ones the plain path
    for pos, fast in ((torch.arange(T), True), (torch.arange(T) + 5, True), (torch.randperm(T), False)):
        calls.clear()
        loss = torch.nn.functional.cross_entropy(model(idx, pos).flatten(0, 1), target.flatten())
        got = torch.autograd.grad(loss, [p for _, p in named])
        assert len(calls) == (len(model.blocks) if fast else 0)
        ref_loss = torch.nn.functional.cross_entropy(dense_model(model, idx, pos).flatten(0, 1), target.flatten())
        ref = torch.autograd.grad(ref_loss, [p for _, p in named])
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
        for (pname, _), a, b in zip(named, got, ref):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4, msg=lambda m, n=pname: f"{n}: {m}")


def test_route_of_a_call():
    from posenc.attention import FUSED, MASKED, PROBABILITIES, RECOMPUTED

    model = tiny_model("t5_bias")
    attn, x, pos = model.blocks[0].attn, torch.randn(1, 4, D), torch.arange(4)
    assert attn.route(x, pos) == RECOMPUTED
    assert attn.route(x, torch.tensor([0, 1, 3, 4])) == MASKED
    with torch.no_grad():
        assert attn.route(x, pos) == MASKED
    attn.dropout = 0.1
    assert attn.train().route(x, pos) == MASKED
    assert attn.eval().route(x, pos) == RECOMPUTED
    assert tiny_model("alibi").blocks[0].attn.route(x, pos) == MASKED  # nothing to train
    assert tiny_model("transformer_xl").blocks[0].attn.route(x, pos) == RECOMPUTED  # a content bias
    assert tiny_model("rope").blocks[0].attn.route(x, pos) == FUSED
    shaw = tiny_model("shaw").blocks[0].attn  # a value term: a block at a time, with gradients off too
    assert shaw.route(x, pos) == RECOMPUTED
    with torch.no_grad():
        assert shaw.route(x, pos) == RECOMPUTED
    assert shaw.route(x, torch.tensor([0, 1, 3, 4])) == PROBABILITIES
    shaw.dropout = 0.1
    assert shaw.train().route(x, pos) == PROBABILITIES


@pytest.mark.parametrize("Tq,Tk", [(1, 1), (5, 5), (3, 7), (7, 3)])
def test_toeplitz_and_diagonal_sums_vs_indexing(Tq, Tk):
    vals = torch.randn(2, Tq + Tk - 1)
    rel = relative_positions(torch.arange(Tq), torch.arange(Tk))  # j - i
    torch.testing.assert_close(toeplitz(vals, Tq, Tk), vals[:, rel + Tq - 1])
    for q0, k0 in ((0, 0), (7, 3), (2, 9)):  # the distances laid out are every j - i, in increasing order
        q_pos, k_pos = torch.arange(Tq) + q0, torch.arange(Tk) + k0
        span = distance_range(q_pos, k_pos)
        assert span.tolist() == list(range(k0 - (q0 + Tq - 1), k0 + Tk - q0))
        torch.testing.assert_close(toeplitz(span, Tq, Tk), relative_positions(q_pos, k_pos), rtol=0, atol=0)
    x = torch.randn(2, Tq, Tk)
    for r0 in range(Tq):  # rows r0.. of the Tq x Tk matrix, first c columns
        for c in range(1, Tk + 1):
            block = x[:, r0:, :c]
            sums, start = diagonal_sums(block, r0, Tq, Tk)
            full = torch.zeros(2, Tq + Tk - 1)
            full[:, start : start + sums.shape[1]] = sums
            ref = torch.zeros(2, Tq + Tk - 1).index_add_(1, (rel[r0:, :c] + Tq - 1).flatten(), block.flatten(1))
            torch.testing.assert_close(full, ref)


@pytest.mark.parametrize(
    "name,causal,overrides", variant_params(lambda n, c, o: cls_of(n) is not None and cls_of(n).position_only_bias)
)
def test_position_bias_parts_sum_to_bias(name, causal, overrides):
    """position_bias (and bias, which the reference path uses) = absolute_bias +
    relative_bias read at every pair's j - i: for consecutive positions (the Toeplitz
    layout, square, offset, and with the queries the last rows of the keys) and gapped
    ones; and absolute_block, a block of rows at a time from absolute_parts (the
    recomputing backward's blocks), equals those rows of absolute_bias; for every
    scheme with a position-only bias."""
    torch.manual_seed(5)
    sch = build(name, causal, **overrides)
    perturb(sch.parameters())
    gapped = torch.tensor([0, 2, 3, 7, 8, 12])
    for q_pos, k_pos in ((torch.arange(9), torch.arange(9)), (torch.arange(9) + 4, torch.arange(9) + 4),
                         (torch.arange(6, 9), torch.arange(9)), (gapped, gapped)):
        rel = k_pos[None, :] - q_pos[:, None]
        vals, absolute = sch.relative_bias(rel.flatten()), sch.absolute_bias(q_pos, k_pos)
        parts = [p for p in (None if vals is None else vals.view(-1, *rel.shape)[None], absolute) if p is not None]
        want = parts[0] if len(parts) == 1 else parts[0] + parts[1]
        torch.testing.assert_close(sch.position_bias(q_pos, k_pos), want, **TOL)
        torch.testing.assert_close(sch.bias(None, None, q_pos, k_pos), want, **TOL)
    pos = torch.arange(9)
    shared, full = sch.absolute_parts(pos, pos), sch.absolute_bias(pos, pos)
    for rows, cols in ((slice(0, 4), slice(0, 4)), (slice(4, 8), slice(0, 8)), (slice(8, 9), slice(0, 9))):
        block = sch.absolute_block(shared, pos, pos, rows, cols)
        if full is None:
            assert block is None
        else:
            torch.testing.assert_close(block, full[..., rows, cols], **TOL)


@pytest.mark.parametrize("name", SCHEMES)
def test_causal_model_ignores_later_tokens(name):
    torch.manual_seed(2)
    model = tiny_model(name, causal=True)
    perturb(model.positional_parameters())
    model.eval()
    idx = torch.randint(0, 256, (2, 12))
    changed = idx.clone()
    changed[:, 8] = (changed[:, 8] + 1) % 256
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :8], b[:, :8], **TOL)
    assert not torch.allclose(a[:, 8:], b[:, 8:])
    if not type(model.scheme).causal_only:  # the same change does reach earlier outputs without the mask
        bi = tiny_model(name, causal=False).eval()
        with torch.no_grad():
            assert not torch.allclose(bi(idx)[:, :8], bi(changed)[:, :8])


@pytest.mark.parametrize("name,causal,overrides", variant_params(lambda n, c, o: True))
def test_gradients_reach_positional_parameters(name, causal, overrides):
    torch.manual_seed(3)
    model = tiny_model(name, causal, **overrides)
    model.train()
    idx = torch.randint(0, 256, (2, 12))
    lm_loss(model, idx, torch.roll(idx, -1, 1)).backward()
    params = dict(
        (n, p) for n, p in model.named_parameters() if any(p is q for q in model.positional_parameters())
    )
    assert len(params) == len(model.positional_parameters())
    for pname, p in params.items():
        assert p.grad is not None, f"{name}: no gradient for {pname}"
        assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{name}: zero gradient for {pname}"


@pytest.mark.parametrize("name", CAUSAL_ONLY)
def test_causal_only_schemes_refuse_bidirectional(name):
    with pytest.raises(ValueError, match="causal attention only"):
        build(name, causal=False)
    with pytest.raises(ValueError, match="causal attention only"):
        tiny_model(name, causal=False)


def test_learned_refuses_sequences_longer_than_max_len():
    model = tiny_model("learned")
    model.check_length(L)
    with pytest.raises(ValueError, match="max_len"):
        model.check_length(L + 1)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, L + 1, dtype=torch.long))


# ------------------------------------------------------------- training
@pytest.fixture(scope="module")
def shakespeare() -> torch.Tensor:
    root = Path(os.environ.get("POSENC_DATA_DIR", ROOT.parent / "shared" / "data"))
    path = root / "tinyshakespeare" / "input.txt"
    if not path.is_file():
        pytest.fail(
            f"Tiny Shakespeare not found at {path}. Set POSENC_DATA_DIR to the shared data folder "
            "(the one holding tinyshakespeare/input.txt).",
            pytrace=False,
        )
    data = path.read_bytes()[:100_000]
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


@pytest.mark.parametrize("name", SCHEMES)
@pytest.mark.slow
def test_tiny_model_trains_on_real_text(name, shakespeare):
    """100 steps on the first 90,000 bytes of Tiny Shakespeare teach the model, with any
    scheme, what a broken one does not show, measured on the next 10,000 bytes:

    * it learned: its loss there is at least 0.5 nats below that of a unigram model
      of the training bytes (3.33; the model starts at ln 256 = 5.55). A model whose
      loss is stuck stays far above. This alone does not show that attention works:
      the current byte reaches the output through the residual stream, so a model
      whose attention sees only the current position still gets to bigram level
      (measured: 2.45 after these steps).
    * it reads the bytes before the current one: over 4000 held-out windows of 32
      bytes, replacing the first 31 by those of another window raises the loss of
      the byte that follows the window by at least 0.05 nats. A model that cannot
      read other positions gains exactly 0; with attention that ignores content
      (q = k = 0, a uniform average over the prefix) `none` and `rope` gain 0.025
      (measured). The real schemes gain 0.07 (`learned`, `none`: absolute tables
      and no encoding are the slowest to learn) to 0.5 and more (relative ones).

    `none` passes: causal attention reads the earlier bytes without any positional
    encoding (Haviv et al. 2022; Kazemnejad et al. 2023)."""
    torch.manual_seed(4)
    model = tiny_model(name, causal=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train, held = shakespeare[:90_000], shakespeare[90_000:100_000]
    g = torch.Generator().manual_seed(0)
    T, B, steps = 32, 16, 100
    losses = []
    model.train()
    for _ in range(steps):
        start = torch.randint(0, train.numel() - T - 1, (B,), generator=g)
        batch = torch.stack([train[s : s + T + 1] for s in start.tolist()])
        loss = lm_loss(model, batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses), losses

    model.eval()
    F = torch.nn.functional
    counts = torch.bincount(train, minlength=256).double() + 1
    n = (held.numel() - 1) // T * T
    unigram = -(counts / counts.sum())[held[1 : n + 1]].log().mean().item()
    start = torch.randint(0, held.numel() - T - 1, (4000,), generator=torch.Generator().manual_seed(1))
    windows = torch.stack([held[s : s + T + 1] for s in start.tolist()])
    x, nxt = windows[:, :-1], windows[:, -1]
    other = x[torch.randperm(len(x), generator=torch.Generator().manual_seed(2))]
    replaced = torch.cat([other[:, :-1], x[:, -1:]], 1)  # the same last byte after another passage
    with torch.no_grad():
        held_loss = lm_loss(model, held[:n].view(-1, T), held[1 : n + 1].view(-1, T)).item()
        intact = F.cross_entropy(model(x)[:, -1].float(), nxt).item()
        gain = F.cross_entropy(model(replaced)[:, -1].float(), nxt).item() - intact
    assert held_loss < unigram - 0.5, f"{name}: held-out loss {held_loss:.3f}, unigram {unigram:.3f}"
    assert gain > 0.05, f"{name}: the earlier bytes lower the loss by {gain:.3f} nats only (held-out {held_loss:.3f})"


def test_the_rotation_takes_its_compiled_kernel_where_one_runs_and_turns_eager_once_past_the_limit(monkeypatch):
    """``rotate_pairs`` on a device whose rotation runs compiled (here the CPU, with a stand-in
    for the compiled kernel that records its call and rotates eagerly): the kernel gets x, cos
    and sin and its result is returned; a kernel past its recompilation limit warns once with
    the reason, which is kept, and every later rotation runs eagerly, the same values."""
    import warnings

    from posenc.compiling import RecompileLimitHit
    from posenc.encodings import rotary

    calls = []

    def kernel(x, cos, sin):
        calls.append((x, cos, sin))
        return rotary._rotate(x, cos, sin)

    def past_limit(x, cos, sin):
        raise RecompileLimitHit("a limit of 8 compiled graphs")

    monkeypatch.setattr(rotary, "COMPILED_ON", ("cpu",))
    monkeypatch.setattr(rotary, "_EAGER", [])
    monkeypatch.setattr(rotary, "_rotate_compiled", lambda: kernel)
    torch.manual_seed(0)
    x, angles = torch.randn(2, 3, 5, 10), torch.randn(5, 4)
    want = rotary._rotate(x, angles.cos(), angles.sin())
    assert torch.equal(rotary.rotate_pairs(x, angles), want)
    ((got_x, cos, sin),) = calls
    assert got_x is x and torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())
    monkeypatch.setattr(rotary, "_rotate_compiled", lambda: past_limit)
    with pytest.warns(UserWarning, match="^the compiled rotation runs eagerly from here on: a limit of 8 compiled graphs$"):
        assert torch.equal(rotary.rotate_pairs(x, angles), want)
    assert rotary._EAGER == ["a limit of 8 compiled graphs"]
    monkeypatch.setattr(rotary, "_rotate_compiled", lambda: kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(rotary.rotate_pairs(x, angles), want)
    assert len(calls) == 1
