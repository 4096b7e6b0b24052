"""Entry-by-entry references for the paths that have no formula of their own elsewhere:
partial RoPE, attention dropout in evaluation, the masked-LM corruption and the
sliding-window evaluation. Each is written from its definition, without the code
under test's helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from posenc import evaluate as ev
from posenc.attention import FUSED, MASKED, PROBABILITIES, RECOMPUTED, Attention
from posenc.data import SPECIAL_TOKENS, MaskedWindows, Windows
from posenc.encodings import ALiBi, NoPE, RoPE, Shaw, T5Bias
from posenc.model import ModelConfig, Transformer


# ------------------------------------------------------------------ partial RoPE
@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_partial_rope_rotates_the_first_features_and_keeps_the_rest(fraction):
    """RoPE with ``fraction`` f (GPT-NeoX style, Su et al. 2021 eq. 34 on the first d = f·Dh
    features): pair c of the first d features, as the complex number x[2c] + i x[2c+1], is
    multiplied by e^{i m theta_c}, theta_c = base^(-2c/d), at position m; features d.. are
    returned unchanged and in place. Checked entry by entry, q and k."""
    Dh, base = 16, 10000.0
    sch = RoPE(d_model=4 * Dh, n_heads=4, max_len=64, causal=True, fraction=fraction, base=base)
    d = int(Dh * fraction)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 7, Dh, generator=g), torch.randn(2, 4, 7, Dh, generator=g)
    pos = torch.tensor([0, 1, 5, 9, 30, 31, 63])
    qr, kr = sch.rotate(q, k, pos, pos)
    for x, xr in ((q, qr), (k, kr)):
        for t, m in enumerate(pos.tolist()):
            for c in range(d // 2):
                z = complex(float(x[1, 2, t, 2 * c]), float(x[1, 2, t, 2 * c + 1]))
                want = z * complex(math.cos(m * base ** (-2 * c / d)), math.sin(m * base ** (-2 * c / d)))
                assert abs(float(xr[1, 2, t, 2 * c]) - want.real) < 1e-5, (fraction, t, c)
                assert abs(float(xr[1, 2, t, 2 * c + 1]) - want.imag) < 1e-5, (fraction, t, c)
        torch.testing.assert_close(xr[..., d:], x[..., d:], atol=0, rtol=0)  # untouched, in place


# ------------------------------------------------------------------ attention dropout
@pytest.mark.parametrize("scheme,gapped,route,dropping", [
    (NoPE, False, FUSED, FUSED), (ALiBi, False, MASKED, MASKED), (T5Bias, False, RECOMPUTED, MASKED),
    (Shaw, False, RECOMPUTED, PROBABILITIES), (Shaw, True, PROBABILITIES, PROBABILITIES)])
def test_attention_dropout_acts_in_training_only(scheme, gapped, route, dropping):
    """``Attention(dropout=0.5)`` in evaluation mode equals the same layer without dropout (on
    every route, gradients on); in training mode it drops probabilities, so two calls differ.
    The blockwise route has no dropout: a layer that drops takes the route that does. Gapped
    positions keep a value term on the ``probabilities`` route in evaluation too."""
    torch.manual_seed(0)
    sch = scheme(d_model=32, n_heads=4, max_len=64, causal=True)
    with_drop = Attention(32, 4, sch, causal=True, dropout=0.5)
    without = Attention(32, 4, sch, causal=True, dropout=0.0)
    without.load_state_dict(with_drop.state_dict())
    h, pos = torch.randn(2, 10, 32), torch.arange(10) * (2 if gapped else 1)
    with_drop.eval(), without.eval()
    assert with_drop.route(h, pos) == route
    torch.testing.assert_close(with_drop(h, pos), without(h, pos), atol=0, rtol=0)
    with_drop.train()
    assert with_drop.route(h, pos) == dropping
    assert not torch.allclose(with_drop(h, pos), with_drop(h, pos))


# ------------------------------------------------------------------ masked-LM corruption
def test_masked_lm_corruption_follows_devlin_and_never_draws_special_tokens():
    """Devlin et al. 2019: of the text tokens, ``mask_prob`` become targets; of those 80% are
    replaced by [MASK], 10% by a random token and 10% kept. A random token is any id of the
    vocabulary except the special ones (ids 0 .. len(SPECIAL_TOKENS) - 1 here, as the byte
    tokenizer numbers them), each about equally often. [CLS] leads every sample with target
    -100; non-targets have target -100; targets hold the original token. Counted over 4000
    samples of a 10-id vocabulary with fixed masks."""
    specials = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab = len(SPECIAL_TOKENS) + 10
    stream = np.random.default_rng(0).integers(len(SPECIAL_TOKENS), vocab, size=4000 * 32 + 1)
    ds = MaskedWindows(Windows(stream, 32), specials, vocab, mask_prob=0.15, fixed_seed=3)
    chosen = masked = kept = 0
    replaced = np.zeros(vocab, dtype=np.int64)
    for i in range(len(ds)):
        inp, target = ds[i]
        text = torch.from_numpy(stream[i * 32 : i * 32 + 31].astype(np.int64))
        assert inp[0] == specials["[CLS]"] and target[0] == -100 and inp.shape == (32,)
        t, x = target[1:], inp[1:]
        is_target = t != -100
        assert torch.equal(t[is_target], text[is_target])  # targets are the original tokens
        assert torch.equal(x[~is_target], text[~is_target])  # the rest is untouched
        chosen += int(is_target.sum())
        masked += int((x[is_target] == specials["[MASK]"]).sum())
        same = x[is_target] == text[is_target]
        kept += int(same.sum())
        other = x[is_target & ~(x == specials["[MASK]"]) & ~(x == text)]
        replaced += np.bincount(other.numpy(), minlength=vocab)
    n_text = len(ds) * 31
    assert abs(chosen / n_text - 0.15) < 0.005
    assert abs(masked / chosen - 0.8) < 0.01
    # kept: the 10% left as they are, plus random draws that hit the original (1 in 10 here)
    assert abs(kept / chosen - (0.1 + 0.1 / 10)) < 0.01
    assert replaced[: len(SPECIAL_TOKENS)].sum() == 0  # never a special token
    drawn = replaced[len(SPECIAL_TOKENS) :]
    assert abs(drawn.sum() / chosen - 0.1 * 9 / 10) < 0.01
    assert drawn.min() > 0.7 * drawn.mean() and drawn.max() < 1.3 * drawn.mean()  # every ordinary id alike


def test_masked_lm_masks_are_fixed_by_seed_and_index_and_never_empty():
    """With ``fixed_seed`` sample i's corruption depends on (fixed_seed, i) alone: built again,
    read in another order, with the global generator moved, it is the same; another seed or
    another i gives another. Without it, masks come from the global generator. Every sample
    has at least one target, even when ``mask_prob`` chooses none. ``mask_prob`` defaults to
    Devlin et al.'s 0.15."""
    specials = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    vocab = len(SPECIAL_TOKENS) + 50
    stream = np.random.default_rng(1).integers(len(SPECIAL_TOKENS), vocab, size=200 * 64 + 1)
    windows = Windows(stream, 64)
    ds = MaskedWindows(windows, specials, vocab, fixed_seed=3)
    first = [ds[i] for i in range(200)]
    torch.manual_seed(99)
    torch.rand(17)
    again = MaskedWindows(windows, specials, vocab, fixed_seed=3)
    for i in (150, 3, 0, 77):
        assert all(torch.equal(a, b) for a, b in zip(again[i], first[i])), i
    other = MaskedWindows(windows, specials, vocab, fixed_seed=4)
    assert sum(torch.equal(other[i][1], first[i][1]) for i in range(50)) == 0
    assert len({tuple(t.tolist()) for _, t in first}) == 200
    chosen = sum(int((t != -100).sum()) for _, t in first)
    assert abs(chosen / (200 * 63) - 0.15) < 0.02  # the default mask_prob
    free = MaskedWindows(windows, specials, vocab)
    torch.manual_seed(5)
    a = free[7]
    torch.manual_seed(5)
    assert all(torch.equal(x, y) for x, y in zip(free[7], a))  # the global generator decides
    assert not torch.equal(free[7][1], a[1])
    none_drawn = MaskedWindows(windows, specials, vocab, mask_prob=1e-12, fixed_seed=3)
    for i in range(20):
        inp, target = none_drawn[i]
        assert int((target != -100).sum()) == 1, i
        assert torch.equal(none_drawn[i][1], target)  # the one target is fixed too


# ------------------------------------------------------------------ sliding-window evaluation
def _model(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=23, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=64, causal=True)
    return Transformer(cfg, lambda **kw: ALiBi(**kw)).eval()


def per_token_nll(model, tokens: np.ndarray, T: int, stride: int, n: int) -> list[float]:
    """The definition, one target at a time: target t[p] (p = 1 .. n) is predicted by the first
    window that reaches it. The first window covers inputs t[0 : T] and scores targets 1 .. T;
    each later window ends ``stride`` further on (and the last at n), covers the T inputs
    before its end, and scores the targets the earlier windows did not. Each window is fed
    at positions 0 .. T-1."""
    ends = [T]
    while ends[-1] < n:
        ends.append(min(ends[-1] + stride, n))
    out = []
    for p in range(1, n + 1):
        end = next(e for e in ends if e >= p)  # the first window reaching target p
        start = end - T
        x = torch.from_numpy(tokens[start:end].astype(np.int64))[None]
        with torch.no_grad():
            logp = F.log_softmax(model(x, torch.arange(T)).float(), -1)[0]
        out.append(-float(logp[p - 1 - start, int(tokens[p])]))
    return out


@pytest.mark.parametrize("T,stride,n", [(8, 3, 30), (8, 8, 32), (8, 1, 12), (6, 4, 25)])
def test_sliding_window_scores_each_token_with_the_context_the_definition_gives(T, stride, n):
    """``posenc.evaluate.score`` against a per-token loop of its definition (the module
    docstring) on a small ALiBi model: the summed NLL, the count, and the perplexity of
    ``evaluate_model``."""
    model = _model()
    tokens = np.random.default_rng(1).integers(0, 23, size=n + 5)
    want = per_token_nll(model, tokens, T, stride, n)
    total, count = ev.score(model, tokens, T, "sliding", stride, n, token_budget=3 * T, progress=False)
    assert count == n
    assert total == pytest.approx(sum(want), rel=1e-5)
    if stride == T:  # the non-overlapping method scores the same windows
        assert ev.score(model, tokens, T, "nonoverlapping", None, n, progress=False)[0] == pytest.approx(total)


def test_evaluate_model_reports_the_mean_nll_of_the_same_tokens_at_every_length():
    """``evaluate_model`` scores N = lcm-tiled tokens (here 48: 3 windows of 16, 6 of 8) at every
    length: ppl = exp(mean NLL) of the per-token definition, n_tokens = N, for both methods."""
    model = _model(2)
    tokens = np.random.default_rng(3).integers(0, 23, size=60)
    rows = ev.evaluate_model(model, tokens, [8, 16], ("nonoverlapping", "sliding"), stride=4, max_tokens=50,
                             progress=False)
    by = {(r["eval_len"], r["method"]): r for r in rows}
    for (T, method), r in by.items():
        s = T if method == "nonoverlapping" else 4
        want = per_token_nll(model, tokens, T, s, 48)
        assert r["n_tokens"] == 48 and r["stride"] == s
        assert r["nll"] == pytest.approx(sum(want) / 48, rel=1e-5)
        assert r["ppl"] == pytest.approx(math.exp(sum(want) / 48), rel=1e-5)
