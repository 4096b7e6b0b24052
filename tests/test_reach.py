"""How far a model attends (analysis.reach): the statistics of hand-built attention
patterns, whose values are known in closed form, and the probabilities of real
models against the dense reference of tests/references.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from analysis import reach
from posenc.config import build_model, compose
from tests.references import dense_first_layer_logits

T = 9
POS = torch.arange(T)


def causal_rows(weights: torch.Tensor) -> torch.Tensor:
    """Rows normalised over the keys j <= i."""
    w = weights * torch.ones(T, T).tril()
    return w / w.sum(-1, keepdim=True)


def test_attending_to_itself_is_distance_0_and_entropy_0():
    d, e = reach.row_stats(torch.eye(T), POS, POS)
    assert torch.equal(d, torch.zeros(T)) and torch.allclose(e, torch.zeros(T))


def test_attending_to_the_first_token_is_distance_i_and_entropy_0():
    p = torch.zeros(T, T)
    p[:, 0] = 1
    d, e = reach.row_stats(p, POS, POS)
    assert torch.equal(d, POS.float()) and torch.allclose(e, torch.zeros(T))
    assert d.mean() == pytest.approx((T - 1) / 2)


def test_uniform_causal_attention_against_its_closed_form():
    d, e = reach.row_stats(causal_rows(torch.ones(T, T)), POS, POS)
    # row i spreads over i + 1 keys at distances 0..i: mean i / 2, entropy ln(i + 1)
    assert torch.allclose(d, POS / 2) and torch.allclose(e, torch.log(POS + 1.0))
    dist, ent = reach.uniform_causal(T)
    assert d.mean() == pytest.approx(dist) and e.mean() == pytest.approx(ent)
    assert dist == (T - 1) / 4 and ent == pytest.approx(math.lgamma(T + 1) / T)  # mean ln(i+1) = ln(T!) / T


def test_two_keys_half_and_half():
    p = torch.zeros(T, T)
    p[4, 0] = p[4, 4] = 0.5
    d, e = reach.row_stats(p, POS, POS)
    assert d[4] == pytest.approx(2.0) and e[4] == pytest.approx(math.log(2))


@pytest.mark.parametrize("scheme", ["alibi", "rope", "shaw", "t5_bias", "fire", "tupe"])
def test_first_layer_probabilities_match_the_dense_reference(scheme):
    torch.manual_seed(0)
    model = build_model(compose([f"encoding={scheme}", "model=micro", "task=lm"]), 260).eval()
    idx = torch.randint(4, 260, (2, 24))
    probs = reach.attention_probabilities(model, idx)
    assert len(probs) == model.cfg.n_layers and probs[0].shape == (2, 4, 24, 24)
    ref = dense_first_layer_logits(model, idx, torch.arange(24))
    ref = ref.masked_fill(~torch.ones(24, 24, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    torch.testing.assert_close(probs[0], ref, rtol=1e-5, atol=1e-6)
    for p in probs:  # rows are distributions over the keys a causal query sees
        torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:-1]))
        assert (p.triu(1) == 0).all()


def test_the_probabilities_walk_the_model_layer_by_layer():
    """The second layer's probabilities come from the model's own first-layer output:
    changing the first block's output weights changes them, and only them."""
    torch.manual_seed(0)
    model = build_model(compose(["encoding=alibi", "model=micro", "task=lm"]), 260).eval()
    idx = torch.randint(4, 260, (1, 16))
    before = reach.attention_probabilities(model, idx)
    with torch.no_grad():
        model.blocks[0].attn.out.weight.mul_(3.0)
    after = reach.attention_probabilities(model, idx)
    assert torch.equal(before[0], after[0]) and not torch.allclose(before[1], after[1])


def test_reach_rows_average_windows_and_skip_lengths_a_model_cannot_represent():
    torch.manual_seed(0)
    model = build_model(compose(["encoding=learned", "model=micro", "task=lm", "model.max_len=32"]), 260)
    tokens = np.random.default_rng(0).integers(4, 260, size=400)
    rows = reach.reach_rows(model, tokens, [16, 32, 64], windows=3)
    assert sorted({r["length"] for r in rows}) == [16, 32]  # 64 is past the learned table
    assert len(rows) == 2 * model.cfg.n_layers * model.cfg.n_heads
    idx = torch.from_numpy(tokens[:48].reshape(3, 16))
    probs = reach.attention_probabilities(model.eval(), idx)
    d, e = reach.row_stats(probs[1][:, 2], torch.arange(16), torch.arange(16))
    (row,) = [r for r in rows if r["length"] == 16 and r["layer"] == 1 and r["head"] == 2]
    assert row["distance"] == pytest.approx(float(d.mean()), rel=1e-6)
    assert row["entropy"] == pytest.approx(float(e.mean()), rel=1e-6)
    assert row["uniform_distance"] == 15 / 4
    with pytest.raises(ValueError, match="fewer than 3 windows"):
        reach.reach_rows(model, tokens[:40], [16], windows=3)


def test_summary_means_over_heads_layers_and_seeds():
    rows = [{"scheme": "a", "length": 8, "multiple": 1, "seed": s, "layer": l, "head": h,
             "distance": float(s + l + h), "entropy": 1.0, "uniform_distance": 1.75, "uniform_entropy": 1.3}
            for s in (0, 1) for l in (0, 1) for h in (0, 1)]
    out = reach.summary(rows)
    assert len(out) == 1
    assert out.loc[0, "distance"] == pytest.approx(1.5)  # mean of s + l + h
    assert out.loc[0, "distance_sd"] == pytest.approx(np.std([1.0, 2.0], ddof=1))  # per-seed means 1 and 2
    assert out.loc[0, "seeds"] == 2
