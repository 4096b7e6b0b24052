"""How far a model attends (analysis.reach): the statistics of hand-built attention
patterns, whose values are known in closed form, and the probabilities of real
models against the dense reference of tests/references.py."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from analysis import reach
from posenc.config import build_model, compose
from posenc.retrieval import needle_attention
from tests.references import dense_first_layer_logits

from .conftest import REPO

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


@pytest.mark.parametrize("scheme", ["alibi", "rope", "shaw", "t5_bias", "fire", "tupe", "sinusoidal", "learned"])
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


def test_row_stats_of_a_batch_of_heads():
    """(B, H, T, T) probabilities give (B, H, T) statistics, each row its own: head 0
    attends to itself (distance 0), head 1 to the first token (distance i), in both windows;
    head 0 of window 1 splits each row i >= 1 evenly between 0 and i (distance i / 2, entropy ln 2)."""
    p = torch.zeros(2, 2, T, T, dtype=torch.float64)
    p[:, 0] = torch.eye(T, dtype=torch.float64)
    p[:, 1, :, 0] = 1.0
    half = torch.zeros(T, T, dtype=torch.float64)
    half[0, 0] = 1.0
    for i in range(1, T):
        half[i, 0] = half[i, i] = 0.5
    p[1, 0] = half
    d, e = reach.row_stats(p, POS, POS)
    assert d.shape == e.shape == (2, 2, T)
    assert torch.equal(d[0, 0], torch.zeros(T, dtype=torch.float64)) and torch.equal(d[:, 1], POS.double().expand(2, T))
    assert torch.allclose(d[1, 0], POS.double() / 2) and torch.allclose(e[1, 0, 1:], torch.full((T - 1,), math.log(2),
                                                                                                 dtype=torch.float64))
    assert torch.allclose(e[:, 1], torch.zeros(2, T, dtype=torch.float64)) and e[1, 0, 0] == 0


def test_needle_attention_is_the_best_heads_mean_mass_on_the_needle():
    """``posenc.retrieval.needle_attention`` on top-layer probabilities written by hand (2
    windows, 2 heads, the last 3 query rows, 8 keys; the needle at keys 2 and 3): head 0 puts
    0.75 there in window 0 and 0.25 in window 1 (mean 0.5); head 1 puts its mass next to the
    needle (keys 1 and 4) but for 0.3 in one row (mean 0.05): the answer is head 0's 0.5.
    The model is asked for the last ``rows`` rows of its layers' probabilities, the top one
    used (a stand-in model that hands back the probabilities above)."""
    top = torch.zeros(2, 2, 3, 8)
    top[0, 0, :, 2], top[0, 0, :, 3], top[0, 0, :, 7] = 0.5, 0.25, 0.25
    top[1, 0, :, 3], top[1, 0, :, 0] = 0.25, 0.75
    top[:, 1, :, 1], top[:, 1, :, 4] = 0.4, 0.6
    top[0, 1, 0, 4], top[0, 1, 0, 3] = 0.3, 0.3
    asked = []

    def model(idx, last=None, attention=None):  # every layer's probabilities, the top one's last rows
        asked.append((idx, last))
        attention += [torch.full((2, 2, 8, 8), 1 / 8), top]

    idx = torch.zeros(2, 8, dtype=torch.long)
    assert needle_attention(model, idx, start=2, width=2, rows=3) == pytest.approx(0.5)
    assert asked == [(idx, 3)]


def test_needle_attention_and_the_last_rows_of_a_real_model():
    """On a 3-layer model: ``attention_probabilities(last=r)`` gives the full probabilities'
    last r query rows of every layer, and ``posenc.retrieval.needle_attention`` reads the top
    (third) layer's."""
    torch.manual_seed(0)
    model = build_model(compose(["encoding=alibi", "model=micro", "task=lm", "model.n_layers=3"]), 260).eval()
    idx = torch.randint(4, 260, (2, 16))
    full = reach.attention_probabilities(model, idx)
    last = reach.attention_probabilities(model, idx, last=5)
    assert len(full) == len(last) == 3
    for f, p in zip(full, last):
        assert p.shape == (2, model.cfg.n_heads, 5, 16)
        torch.testing.assert_close(p, f[:, :, -5:], rtol=1e-5, atol=1e-6)
    want = full[2][:, :, -5:, 4:7].sum(-1).mean((0, 2)).max()
    assert needle_attention(model, idx, start=4, width=3, rows=5) == pytest.approx(float(want), rel=1e-5)
    assert not math.isclose(float(full[1][:, :, -5:, 4:7].sum(-1).mean((0, 2)).max()), float(want), rel_tol=1e-3)


def test_reach_rows_skip_a_length_anywhere_and_read_corpus_tokens():
    """A length the model cannot represent is skipped wherever it is in the list; exactly
    ``windows`` x T tokens suffice; uint16 tokens (a prepared corpus's) are read as ids;
    the default is 4 windows; every row carries the uniform reference of its length."""
    torch.manual_seed(0)
    model = build_model(compose(["encoding=learned", "model=micro", "task=lm", "model.max_len=32"]), 260)
    tokens = np.random.default_rng(1).integers(4, 260, size=96).astype(np.uint16)
    rows = reach.reach_rows(model, tokens, [16, 64, 32], windows=3)
    assert [r["length"] for r in rows][:: model.cfg.n_layers * model.cfg.n_heads] == [16, 32]
    u = reach.uniform_causal(32)
    assert all((r["uniform_distance"], r["uniform_entropy"]) == u for r in rows if r["length"] == 32)
    by_default = reach.reach_rows(model, tokens[:64], [16])  # 4 windows of 16
    probs = reach.attention_probabilities(model.eval(), torch.from_numpy(tokens[:64].astype(np.int64).reshape(4, 16)))
    d, e = reach.row_stats(probs[0][:, 1], torch.arange(16), torch.arange(16))
    (row,) = [r for r in by_default if r["layer"] == 0 and r["head"] == 1]
    assert row == {"length": 16, "layer": 0, "head": 1, "distance": pytest.approx(float(d.mean()), rel=1e-6),
                   "entropy": pytest.approx(float(e.mean()), rel=1e-6), "uniform_distance": 15 / 4,
                   "uniform_entropy": reach.uniform_causal(16)[1]}
    with pytest.raises(ValueError, match="fewer than 4 windows"):
        reach.reach_rows(model, tokens[:63], [16])


def test_summary_of_one_seed_and_of_two_schemes():
    """``summary`` per (scheme, length): the mean over heads and layers of each seed, then
    over seeds, with the sd over seeds (0 for a single seed), the uniform reference and the
    count of seeds."""
    rows = [{"scheme": s, "length": 8 * m, "multiple": m, "seed": seed, "layer": lay, "head": h,
             "distance": float(m + seed + lay), "entropy": 0.5 * m + seed * h, "uniform_distance": (8 * m - 1) / 4,
             "uniform_entropy": 0.1 * m}
            for s, seeds in (("a", (0,)), ("b", (0, 2))) for m in (1, 2) for seed in seeds for lay in (0, 1)
            for h in (0, 1)]
    out = reach.summary(rows)
    got = {(r["scheme"], r["multiple"]): r for r in out.to_dict("records")}
    assert sorted(got) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert got[("a", 2)] == {"scheme": "a", "length": 16, "multiple": 2, "distance": 2.5, "distance_sd": 0.0,
                             "entropy": 1.0, "entropy_sd": 0.0, "uniform_distance": 15 / 4, "uniform_entropy": 0.2,
                             "seeds": 1}
    # b at L: per-seed distance means 1.5 and 3.5, entropy means 0.5 and 1.5
    b = got[("b", 1)]
    assert (b["distance"], b["entropy"], b["seeds"]) == (2.5, 1.0, 2)
    assert b["distance_sd"] == pytest.approx(2**0.5) and b["entropy_sd"] == pytest.approx(0.5**0.5)
    assert (b["uniform_distance"], b["uniform_entropy"]) == (7 / 4, 0.1)


def _checkpoint(make_cfg, path, vocab_extra=0, encoding="rope"):
    """A checkpoint as posenc training writes it (the run config, the vocabulary size, the
    weights), of an untrained micro RoPE model at L = 32 on the default corpus: no training
    needed to check what is read back."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from posenc.config import build_model

    cfg = OmegaConf.to_container(make_cfg("model=micro", f"encoding={encoding}", "seed=3"), resolve=True)
    dm = instantiate(OmegaConf.create(cfg["data"]))
    dm.prepare_data()
    vocab = dm.tokenizer_vocab_size + vocab_extra
    torch.manual_seed(0)
    model = build_model(cfg, vocab)
    # written as posenc wrote checkpoints before the run's record had a key of its own
    # (the module's Lightning hyper-parameters): posenc.runs.stored_run reads both
    torch.save({"hyper_parameters": {"cfg": cfg, "vocab_size": vocab, "identity": None},
                "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}}, path)
    return dm.tokens("validation")


def test_checkpoint_reach_reads_the_run_and_its_validation_split(make_cfg, tmp_path):
    """``checkpoint_reach``: the reach rows of the checkpoint's model on its validation
    split at multiples of its L, labelled with the scheme (``rope+yarn`` with a rule
    switched on, which the model then uses past L), seed, L and the multiple (an int);
    4 windows unless told; a scheme without such rules (ALiBi) is read as it is; a
    checkpoint whose vocabulary is not the corpus's is refused, and one that is no posenc
    run or does not fit its model is refused naming the file."""
    from posenc.errors import ConfigError
    from posenc.runs import load_state, module_from_state

    ckpt = tmp_path / "last.ckpt"
    tokens = _checkpoint(make_cfg, ckpt)
    got = reach.checkpoint_reach(ckpt, [1, 2], windows=2)
    plain = module_from_state(load_state(ckpt), ckpt).model
    want = reach.reach_rows(plain, tokens, [32, 64], 2)
    cells = plain.cfg.n_layers * plain.cfg.n_heads  # rows per length
    assert len(got) == len(want) == 2 * cells
    for g, w in zip(got, want):
        assert g == {"scheme": "rope", "seed": 3, "train_len": 32, "multiple": w["length"] // 32, **w}
        assert type(g["multiple"]) is int
    yarn = reach.checkpoint_reach(ckpt, [2], extension="yarn")  # 4 windows by default
    model = module_from_state(load_state(ckpt), ckpt, "cpu", {"scaling": "yarn", "original_len": 32}).model
    want = reach.reach_rows(model, tokens, [64], 4)
    assert [r["scheme"] for r in yarn] == ["rope+yarn"] * cells and {r["multiple"] for r in yarn} == {2}
    assert [(r["distance"], r["entropy"]) for r in yarn] == [(w["distance"], w["entropy"]) for w in want]
    without = reach.reach_rows(plain, tokens, [64], 4)
    assert [r["distance"] for r in yarn] != [r["distance"] for r in without]  # the rule is on past L
    bad = tmp_path / "bad.ckpt"
    _checkpoint(make_cfg, bad, vocab_extra=1)
    with pytest.raises(ConfigError, match="does not match the checkpoint"):
        reach.checkpoint_reach(bad, [1])
    alibi = tmp_path / "alibi.ckpt"
    tokens = _checkpoint(make_cfg, alibi, encoding="alibi")
    rows = reach.checkpoint_reach(alibi, [1], windows=2)
    want = reach.reach_rows(module_from_state(load_state(alibi), alibi).model, tokens, [32], 2)
    assert [r["scheme"] for r in rows] == ["alibi"] * cells and [r["distance"] for r in rows] == [
        w["distance"] for w in want]
    state = load_state(ckpt)
    torch.save({"state_dict": state["state_dict"]}, bad)
    with pytest.raises(ConfigError, match=f"checkpoint {re.escape(str(bad))} holds no posenc run config"):
        reach.checkpoint_reach(bad, [1])
    state["state_dict"].pop(next(iter(state["state_dict"])))
    torch.save(state, bad)
    with pytest.raises(ConfigError, match=f"checkpoint {re.escape(str(bad))} does not fit the model"):
        reach.checkpoint_reach(bad, [1])


def _reference_probabilities(model, idx):
    """Every layer's probabilities rebuilt outside the model, layer by layer: the reference
    path's logits (``Attention.logits``), the causal mask, the softmax, and each block called
    on its own to give the next layer its input."""
    from posenc.attention import causal_mask

    T = idx.shape[1]
    pos = torch.arange(T)
    word, posn = model.embed(idx, pos)
    x = word if posn is None else word + posn
    out = []
    for block in model.blocks:
        q, k, _ = block.attn.project(block.ln1(x))
        logits = block.attn.logits(q, k, pos, pos)
        if block.attn.causal:
            logits = logits + causal_mask(pos, pos, logits.dtype)
        out.append(logits.softmax(-1))
        x = block(x, pos)
    return out


def _every_scheme_and_task():
    """(scheme, task) for every scheme of conf/encoding and each of the causal and masked LM
    it takes (a causal-only scheme, xPos, takes no masked LM)."""
    from posenc.tasks import misfits

    schemes = sorted(p.stem for p in (REPO / "conf/encoding").glob("*.yaml"))
    return [(s, t) for s in schemes for t in ("lm", "mlm") if not misfits(s, [t])]


@pytest.mark.parametrize(("scheme", "task"), _every_scheme_and_task())
@torch.no_grad()
def test_the_analysis_reads_the_models_own_probabilities_for_every_scheme(scheme, task):
    """What ``analysis.reach`` reads comes from one forward of the model, equals the
    reference path rebuilt outside it in every layer, and recording it leaves the logits
    as they were."""
    torch.manual_seed(0)
    model = build_model(compose([f"encoding={scheme}", "model=micro", f"task={task}", "model.n_layers=3"]), 260).eval()
    idx = torch.randint(4, 260, (2, 20))
    probs = reach.attention_probabilities(model, idx)
    ref = _reference_probabilities(model, idx)
    assert len(probs) == 3
    for p, r in zip(probs, ref):
        torch.testing.assert_close(p, r, rtol=1e-5, atol=1e-6)
    recorded = []
    torch.testing.assert_close(model(idx, attention=recorded), model(idx), rtol=0, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(recorded, probs))
