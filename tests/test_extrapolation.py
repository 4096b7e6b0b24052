"""Length extrapolation (Press et al. 2022): evaluation at any length, results, MLflow, figure."""

from __future__ import annotations

import json
import math

import mlflow
import numpy as np
import pytest
import torch
from posenc.config import compose

from posenc import evaluate as ev
from posenc.config import build_model
from posenc.train import train

from .conftest import FAST

TRAIN_LEN, EVAL_BATCH, VAL_BATCHES = 32, 8, 3


def compose_cfg(root, data_root, cache_dir, *overrides):
    base = [f"paths.root={root}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}"]
    return compose(base + FAST + list(overrides))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_root, cache_dir):
    """A tiny rope model trained 4 steps, validated on the first 3 batches of 8 windows of 32."""
    root = tmp_path_factory.mktemp("extrap")
    cfg = compose_cfg(
        root, data_root, cache_dir,
        "trainer.max_steps=4", "trainer.val_check_interval=2", f"trainer.limit_val_batches={VAL_BATCHES}",
        f"data.seq_len={TRAIN_LEN}", "data.batch_size=8", f"data.eval_batch_size={EVAL_BATCH}",
        "log_checkpoint=true",
    )  # fmt: skip
    metrics = train(cfg)
    (run_dir,) = (root / "outputs" / "runs").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    return {"root": root, "metrics": metrics, "run_dir": run_dir, "run_id": meta["mlflow_run_id"],
            "uri": f"sqlite:///{root}/mlflow.db", "cfg": cfg}  # fmt: skip


def tiny_model(root, data_root, cache_dir, *overrides):
    """An untrained model and the validation tokens of its data config."""
    from hydra.utils import instantiate

    cfg = compose_cfg(root, data_root, cache_dir, f"data.seq_len={TRAIN_LEN}", *overrides)
    dm = instantiate(cfg.data)
    dm.prepare_data()
    torch.manual_seed(0)
    return build_model(cfg, dm.tokenizer_vocab_size).eval(), dm.tokens("validation")


def test_evaluation_at_train_length_equals_training_validation(trained, tmp_path):
    n_val = VAL_BATCHES * EVAL_BATCH * TRAIN_LEN  # the windows the last validation loop scored
    settings = ev.Settings(lengths=[TRAIN_LEN], methods=["nonoverlapping", "sliding"], stride=TRAIN_LEN,
                           max_tokens=n_val, progress=False)  # fmt: skip
    client = mlflow.MlflowClient(trained["uri"])
    keys = ("extrapolation/ppl_nonoverlapping", "extrapolation/ppl_sliding")
    # the run is shared with the other tests of this module: compare with what it held before
    before = {k: [(h.step, h.value) for h in client.get_metric_history(trained["run_id"], k)] for k in keys}
    rows, files = ev.evaluate_checkpoint(trained["run_dir"], settings, out=tmp_path / "res.csv")
    assert [r["method"] for r in rows] == ["nonoverlapping", "sliding"]
    for r in rows:
        assert r["n_tokens"] == n_val and r["note"] == ""
        assert r["ppl"] == pytest.approx(trained["metrics"]["val/ppl"], rel=1e-4)
        assert math.log(r["ppl"]) == pytest.approx(trained["metrics"]["val/loss"], rel=1e-4)
        assert (r["scheme"], r["seed"], r["train_len"], r["eval_len"]) == ("rope", 0, TRAIN_LEN, TRAIN_LEN)
        assert r["run_id"] == trained["run_id"]
    assert [f.name for f in files] == ["res.csv", "res.json"] and all(f.is_file() for f in files)
    # logged to the model's MLflow run: one new point per method, step = evaluation length
    for key, row in zip(keys, rows):
        after = [(h.step, h.value) for h in client.get_metric_history(trained["run_id"], key)]
        added = list(after)
        for point in before[key]:
            added.remove(point)
        assert [(step, round(v, 6)) for step, v in added] == [(TRAIN_LEN, round(row["ppl"], 6))], (key, before[key])
    arts = {a.path for a in client.list_artifacts(trained["run_id"], "extrapolation")}
    assert arts == {"extrapolation/res.csv", "extrapolation/res.json"}


def test_context_extension_rules_from_the_same_checkpoint(trained):
    """rope+pi / +ntk / +yarn: the same weights, labelled rows, exact plain RoPE at L,
    their own MLflow metric; a scheme without the rule is refused in one line."""
    from posenc.errors import ConfigError

    # the plain reference is not logged: the run is shared with the other tests of this module
    plain_settings = ev.Settings(multipliers=(1, 4), methods=("nonoverlapping",), max_tokens=1024, progress=False,
                                 log_mlflow=False)  # fmt: skip
    plain, _ = ev.evaluate_checkpoint(trained["run_dir"], plain_settings)
    client = mlflow.MlflowClient(trained["uri"])
    for rule in ("pi", "ntk", "yarn"):
        settings = ev.Settings(multipliers=(1, 4), methods=("nonoverlapping",), max_tokens=1024, progress=False,
                               extension=rule)  # fmt: skip
        rows, _ = ev.evaluate_checkpoint(trained["run_dir"], settings)
        assert [(r["scheme"], r["extension"], r["eval_len"]) for r in rows] == [
            (f"rope+{rule}", rule, TRAIN_LEN), (f"rope+{rule}", rule, 4 * TRAIN_LEN)]
        assert rows[0]["ppl"] == plain[0]["ppl"]  # at L every rule is plain RoPE
        assert rows[1]["ppl"] != plain[1]["ppl"] and math.isfinite(rows[1]["ppl"])
        hist = client.get_metric_history(trained["run_id"], f"extrapolation/ppl_nonoverlapping_{rule}")
        assert sorted(h.step for h in hist) == [TRAIN_LEN, 4 * TRAIN_LEN]
    with pytest.raises(ConfigError, match="does not take the settings"):
        from posenc.runs import load_module

        load_module(trained["run_dir"] / "checkpoints" / "last.ckpt", scheme_settings={"no_such_setting": 1})


def test_fine_tune_from_a_checkpoint_with_a_scaling_rule(trained, tmp_path, data_root, cache_dir):
    """init_from starts a run from the weights of another (here: RoPE fine-tuned with PI
    at 2L, as the study's pi@2x<steps> does); weights of another model are refused."""
    from pipelines.study import finetune_overrides, parse_extension
    from posenc.errors import ConfigError
    from posenc.runs import RECORD, load_module, load_state

    assert parse_extension("yarn") == ("yarn", 0, 0) and parse_extension("pi@4x200") == ("pi", 4, 200)
    for bad in ("pi@4", "pi@0x10", "pi@4xten"):
        with pytest.raises(ValueError, match="extension"):
            parse_extension(bad)
    ckpt = trained["run_dir"] / "checkpoints" / "last.ckpt"
    tune = finetune_overrides(trained["cfg"], "pi", 2, 2, str(ckpt))
    assert f"data.seq_len={2 * TRAIN_LEN}" in tune and f"encoding.scheme.original_len={TRAIN_LEN}" in tune
    assert "encoding.scheme.factor=2" in tune  # Chen et al.'s fixed factor, kept at every length
    assert not any("factor" in o for o in finetune_overrides(trained["cfg"], "pi_dynamic", 2, 2, str(ckpt)))
    assert not any("factor" in o for o in finetune_overrides(trained["cfg"], "yarn", 2, 2, str(ckpt)))
    # at learning rate 0 the tuned weights are the checkpoint's: the run started from them
    cfg = compose_cfg(tmp_path, data_root, cache_dir, f"data.seq_len={TRAIN_LEN}", "data.batch_size=8",
                      *tune, "log_checkpoint=false", "optim.lr=0.0")  # fmt: skip
    metrics = train(cfg, out_dir=tmp_path / "tuned")
    assert metrics["global_step"] == 2
    # its validation is the PI-scaled model at 2L: the same as evaluating the tuned checkpoint
    # at 2L on the windows the validation loop scored (trainer.limit_val_batches of them)
    n_val = cfg.trainer.limit_val_batches * cfg.data.eval_batch_size * 2 * TRAIN_LEN
    (row,) = ev.evaluate_checkpoint(tmp_path / "tuned", ev.Settings(
        lengths=[2 * TRAIN_LEN], methods=["nonoverlapping"], max_tokens=n_val, progress=False, log_mlflow=False))[0]
    assert row["n_tokens"] == n_val and row["scheme"] == "rope"
    # (after 4 steps the model is near uniform: PI against plain RoPE moves the loss by ~1e-5)
    assert math.log(row["ppl"]) == pytest.approx(metrics["val/loss"], rel=1e-6)
    tuned = load_module(tmp_path / "tuned" / "checkpoints" / "last.ckpt")
    assert tuned.model.blocks[0].attn.scheme.scaling == "pi" and tuned.model.blocks[0].attn.scheme.factor == 2
    tuned_ckpt = tmp_path / "tuned" / "checkpoints" / "last.ckpt"
    record = load_state(tuned_ckpt)[RECORD]  # the run's record: its config, vocabulary size and identity
    assert record["cfg"]["init_from"] == str(ckpt) and record["vocab_size"] == tuned.model.cfg.vocab_size
    start = load_module(ckpt).model.state_dict()
    assert all(torch.equal(v, start[k]) for k, v in tuned.model.state_dict().items())
    wider = compose_cfg(tmp_path, data_root, cache_dir, "model.d_model=64", f"init_from={ckpt}")
    with pytest.raises(ConfigError, match="do not fit"):
        train(wider, out_dir=tmp_path / "wider")
    assert not (tmp_path / "wider" / "run.json").exists()


def test_run_id_resolves_through_run_folder_mlflow_artifacts_and_cli(trained, tmp_path):
    from pipelines.extrapolate import main

    by_folder = ev.resolve_checkpoint(trained["run_id"], runs_dir=trained["root"] / "outputs")
    assert by_folder.path == (trained["run_dir"] / "checkpoints" / "last.ckpt").resolve()
    by_artifact = ev.resolve_checkpoint(
        trained["run_id"], runs_dir=tmp_path / "none", tracking_uri=trained["uri"], download_dir=tmp_path / "dl"
    )
    assert by_artifact.path == (tmp_path / "dl" / "last.ckpt").resolve()
    assert by_artifact.run_id == trained["run_id"]
    a = torch.load(by_folder.path, map_location="cpu", weights_only=False)["state_dict"]
    b = torch.load(by_artifact.path, map_location="cpu", weights_only=False)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(FileNotFoundError, match="neither"):
        ev.resolve_checkpoint("0" * 32, runs_dir=tmp_path / "none", tracking_uri=trained["uri"])

    rows = main([trained["run_id"], "--runs-dir", str(trained["root"] / "outputs"), "--multipliers", "1", "2",
                 "--methods", "nonoverlapping", "--max-tokens", "1024", "--no-progress", "--no-mlflow",
                 "--out", str(tmp_path / "cli.csv")])  # fmt: skip
    assert [(r["eval_len"], r["n_tokens"]) for r in rows] == [(32, 1024), (64, 1024)]
    assert len(ev.read_results([tmp_path / "cli.csv"])) == 2
    two = main([trained["run_id"], "--runs-dir", str(trained["root"] / "outputs"), "--multipliers", "1", "2",
                "--methods", "nonoverlapping", "--max-tokens", "1024", "--passages", "2", "--split", "test",
                "--no-progress", "--no-mlflow"])  # fmt: skip
    starts = [int(s) for s in two[0]["passages"].split()]
    assert [r["n_tokens"] for r in two] == [1024, 1024] and len(starts) == 2 and all(s % 512 == 0 for s in starts)
    assert {r["split"] for r in two} == {"test"} and two[0]["passages"] == two[1]["passages"]


def test_windows_partition_the_same_tokens():
    for n, T, s in [(96, 32, 32), (96, 32, 7), (96, 32, 1), (64, 64, 5), (100, 30, 16)]:
        scored = []
        for start, first in ev.windows(n, T, "sliding", s):
            assert start >= 0 and start + T <= n and 0 <= first < T
            scored += range(start + first, start + T)
        assert scored == list(range(n)), (n, T, s)  # each target exactly once, in order
    assert ev.windows(96, 32, "sliding", 32) == ev.windows(96, 32, "nonoverlapping")
    assert ev.span_length(5000, [64, 128, 256, 512, 1024], 4000) == 3072
    assert ev.span_length(10_000, [64, 128, 256, 512, 1024], None) == 9216
    with pytest.raises(ValueError, match="multiple of 1024"):
        ev.span_length(900, [64, 1024], None)


def test_sliding_full_stride_equals_nonoverlapping_and_batches_stay_bounded(tmp_path, data_root, cache_dir):
    model, tokens = tiny_model(tmp_path, data_root, cache_dir, "encoding=alibi")
    shapes = []

    class Spy(torch.nn.Module):  # records the batch shapes the evaluation feeds
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def check_length(self, T):
            self.inner.check_length(T)

        def forward(self, idx, pos):
            shapes.append(tuple(idx.shape))
            assert not torch.is_grad_enabled()
            assert not self.training
            return self.inner(idx, pos)

    lengths = [32, 64, 256]
    full = ev.evaluate_model(Spy(model), tokens, lengths, ["nonoverlapping", "sliding"], stride=10_000,
                             max_tokens=1024, token_budget=256, progress=False)  # fmt: skip
    assert all(b * t <= 256 or b == 1 for b, t in shapes)
    assert max(b for b, t in shapes if t == 32) == 8
    by = {(r["eval_len"], r["method"]): r for r in full}
    for T in lengths:
        a, b = by[T, "nonoverlapping"], by[T, "sliding"]
        assert b["stride"] == T and a["n_tokens"] == b["n_tokens"] == 1024
        assert b["ppl"] == pytest.approx(a["ppl"], rel=1e-6)
    for T in lengths:  # each window computed alone
        ppl, _ = reference_ppl(model, tokens, [(s, 0, T) for s in range(0, 1024, T)])
        assert by[T, "nonoverlapping"]["ppl"] == pytest.approx(ppl, rel=1e-5), T
    half = ev.evaluate_model(model, tokens, [64], ["sliding"], stride=16, max_tokens=1024, progress=False)
    assert half[0]["n_tokens"] == 1024 and half[0]["stride"] == 16
    # by hand: the first window [0, 64) scores all 64 targets, each later one ends 16 tokens
    # further on and scores only its last 16
    plan = [(0, 0, 64)] + [(end - 64, 64 - 16, 64) for end in range(80, 1025, 16)]
    ppl, count = reference_ppl(model, tokens, plan)
    assert count == 1024 and half[0]["ppl"] == pytest.approx(ppl, rel=1e-5)
    assert half[0]["ppl"] != pytest.approx(by[64, "nonoverlapping"]["ppl"], rel=1e-9)


def reference_ppl(model, tokens, windows):
    """Perplexity of ``model`` over (start, first scored index, T) windows of ``tokens``,
    each fed alone at positions 0..T-1, computed directly: one forward per window."""
    total, count = 0.0, 0
    with torch.no_grad():
        for start, first, T in windows:
            w = torch.from_numpy(tokens[start : start + T + 1].astype(np.int64))
            logits = model(w[None, :-1]).double()[0]
            nll = torch.nn.functional.cross_entropy(logits, w[1:], reduction="none")
            total += nll[first:].sum().item()
            count += T - first
    return math.exp(total / count), count


def test_nope_at_sixteen_times_train_length(tmp_path, data_root, cache_dir):
    """NoPE has no length limit: at 1, 4 and 16 times the training length the perplexity
    is that of the model on the same 1024 tokens cut into windows of that length, each
    computed here window by window; an untrained model is close to uniform (ppl ~ V)."""
    model, tokens = tiny_model(tmp_path, data_root, cache_dir, "encoding=none")
    vocab = model.cfg.vocab_size
    rows = ev.evaluate_model(model, tokens, [TRAIN_LEN * m for m in (1, 4, 16)], max_tokens=1024, progress=False)
    assert [r["eval_len"] for r in rows] == [32, 128, 512]
    for r in rows:
        T = r["eval_len"]
        ppl, count = reference_ppl(model, tokens, [(s, 0, T) for s in range(0, 1024, T)])
        assert (r["n_tokens"], r["note"]) == (count, "") == (1024, "")
        assert r["ppl"] == pytest.approx(ppl, rel=1e-5), T
        assert r["nll"] == pytest.approx(math.log(ppl), rel=1e-5), T
        assert 0.9 * vocab < r["ppl"] < 1.1 * vocab, (T, r["ppl"])


def test_learned_not_applicable_past_its_table(tmp_path, data_root, cache_dir):
    model, tokens = tiny_model(tmp_path, data_root, cache_dir, "encoding=learned", "model.max_len=64")
    rows = ev.evaluate_model(model, tokens, [32, 64, 128, 512], ["nonoverlapping", "sliding"], max_tokens=1024,
                             progress=False)  # fmt: skip
    ok = [r for r in rows if r["eval_len"] <= 64]
    na = [r for r in rows if r["eval_len"] > 64]
    assert len(ok) == len(na) == 4
    assert all(math.isfinite(r["ppl"]) and r["note"] == "" for r in ok)
    for r in na:
        assert math.isnan(r["ppl"]) and r["n_tokens"] == 0
        assert "not applicable" in r["note"] and "max_len=64" in r["note"]
    csv_path, json_path = ev.write_results(rows, tmp_path / "learned")
    records = json.loads(json_path.read_text())
    assert [r["ppl"] is None for r in records] == [r["eval_len"] > 64 for r in rows]
    assert np.isnan(ev.read_results([csv_path])["ppl"]).sum() == 4


@pytest.mark.slow
def test_figure_has_a_panel_per_family_and_one_line_per_scheme(tmp_path):
    import matplotlib.pyplot as plt

    from analysis.extrapolation import line_schemes, plot, scheme_lines
    from pipelines.extrapolation_figure import main

    rng = np.random.default_rng(0)
    files = []
    for scheme, slope in [("alibi", 0.0), ("rope", 0.4), ("sinusoidal", 1.0), ("learned", None)]:
        rows = []
        for seed in (0, 1):
            for L in (32, 64):
                for m in (1, 2, 4, 8, 16):
                    ppl = math.nan if slope is None and m > 1 else 80 * (1 + (slope or 0) * math.log2(m))
                    rows.append({"scheme": scheme, "seed": seed, "train_len": L, "eval_len": L * m,
                                 "method": "nonoverlapping", "stride": L * m, "corpus": "wikitext2",
                                 "split": "validation", "ppl": ppl + rng.normal() if ppl == ppl else ppl,
                                 "n_tokens": 2048, "note": "" if ppl == ppl else "not applicable: table"})
        files += ev.write_results(rows, tmp_path / "results" / f"{scheme}")[:1]
    fig, out = plot(files, tmp_path / "fig" / "extrapolation")
    assert [p.suffix for p in out] == [".png", ".svg"] and all(p.stat().st_size > 1000 for p in out)
    panels = [ax for ax in fig.axes if ax.get_title()]  # the perplexity panels: a family per column, a row per L
    assert [ax.get_title() for ax in panels] == [f"{f}\ntrained at L = {L}" for L in (32, 64)
                                                 for f in ("absolute", "rotary and its extensions", "position bias")]
    for L, row in ((32, panels[:3]), (64, panels[3:])):
        assert sorted(s for ax in row for s in line_schemes(ax)) == ["alibi", "learned", "rope", "sinusoidal"]
        for ax in row:
            assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
        learned = next(ln for ln in scheme_lines(row[0]) if ln.get_gid() == "scheme:learned")
        assert list(learned.get_xdata()) == [L]  # learned keeps its single applicable point
    legend = sorted(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
    assert legend == ["alibi", "learned", "rope", "sinusoidal"]
    plt.close(fig)
    assert main([str(f) for f in files] + ["--out", str(tmp_path / "cli" / "fig")])[0].is_file()


def test_checkpoint_of_another_model_layout_is_refused_clearly(trained, tmp_path):
    """A checkpoint whose weights do not fit the model that this version builds
    from its config (here: the output layer of an older, tied layout removed)
    is refused with a ConfigError naming the file, not a load_state_dict traceback."""
    from posenc.errors import ConfigError
    from posenc.runs import load_module, load_state

    state = load_state(trained["run_dir"] / "checkpoints" / "last.ckpt")
    state["state_dict"] = {k: v for k, v in state["state_dict"].items() if "lm_head" not in k}
    old = tmp_path / "old.ckpt"
    torch.save(state, old)
    with pytest.raises(ConfigError, match=r"old\.ckpt does not fit the model .*lm_head"):
        load_module(old)


def test_evaluating_twice_logs_each_length_once(trained, tmp_path):
    """`pipelines.extrapolate` run twice on the same run: MLflow holds one point per
    evaluation length, not two (the second evaluation gives the same values)."""
    from pipelines.extrapolate import main

    root = tmp_path / "own"
    cfg = compose_cfg(root, trained["cfg"].paths.data_dir, trained["cfg"].paths.cache_dir,
                      "trainer.max_steps=2", "trainer.val_check_interval=2", f"data.seq_len={TRAIN_LEN}")
    train(cfg)
    (run_dir,) = (root / "outputs" / "runs").iterdir()
    args = [str(run_dir), "--multipliers", "1", "2", "--methods", "nonoverlapping", "--max-tokens", "512",
            "--no-progress", "--out", str(tmp_path / "x.csv")]
    main(args)
    main(args)
    run_id = json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    client = mlflow.MlflowClient(f"sqlite:///{root}/mlflow.db")
    steps = [m.step for m in client.get_metric_history(run_id, "extrapolation/ppl_nonoverlapping")]
    assert sorted(steps) == [TRAIN_LEN, 2 * TRAIN_LEN]
