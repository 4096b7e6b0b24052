"""The study's tables (pipelines.tables) and the study stage's failure handling."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import stats

from pipelines import study, tables
from posenc.evaluate import write_results


@pytest.mark.parametrize("a,b", [([0.48, 0.47, 0.50], [0.24, 0.25, 0.23]), ([1.0, 2.0, 4.0, 3.5], [2.0, 2.1])])
def test_welch_matches_scipy(a, b):
    got = tables.welch(a, b)
    ref = stats.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic) and got["p"] == pytest.approx(ref.pvalue)
    assert got["df"] == pytest.approx(ref.df)
    lo, hi = ref.confidence_interval(0.95)
    assert got["ci"] == pytest.approx([lo, hi])
    assert got["diff"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b))


def test_welch_needs_two_seeds_a_side():
    assert tables.welch([0.5], [0.2, 0.3])["p"] is None


def test_mean_sd_is_the_sample_sd():
    assert tables.mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert tables.mean_sd([5.0]) == (5.0, 0.0)


def _rows(scheme, seed, ppl_by_len, train_len=4):
    return [{"scheme": scheme, "seed": seed, "train_len": train_len, "eval_len": t, "method": "nonoverlapping",
             "ppl": p, "note": "" if math.isfinite(p) else "not applicable"} for t, p in ppl_by_len.items()]


def test_lm_table_ratio_per_seed_and_not_applicable(tmp_path):
    write_results(_rows("sin", 0, {4: 2.0, 8: 4.0}) + _rows("sin", 1, {4: 4.0, 8: 6.0}), tmp_path / "sin.csv")
    write_results(_rows("learned", 0, {4: 3.0, 8: math.nan}), tmp_path / "learned.csv")
    t = tables.lm_table([tmp_path / "sin.csv", tmp_path / "learned.csv"])
    # per-seed ratios 2.0 and 1.5: mean 1.75 (the ratio of the means would be 1.67)
    assert t["sin"]["ratio_longest"]["mean"] == pytest.approx(1.75)
    assert t["sin"]["lengths"][4] == {"mean": 3.0, "sd": pytest.approx(math.sqrt(2)), "n": 2}
    assert t["learned"]["ratio_longest"]["mean"] is None and t["learned"]["lengths"][8]["n"] == 0
    md = tables.lm_markdown(t)
    assert "| `sin` | 3.00 ± 1.41 | 5.00 ± 1.41 | 1.75 ± 0.35 | 2 |" in md and "n/a" in md
    # the headline numbers `dvc metrics show` prints: seed means at L and the longest length
    mlm = {"summary": {"sin": {"acc_mean": 0.25}}}
    head = tables.headline(t, mlm)
    assert head["sin"] == {"ppl_L": 3.0, "ppl_2L": 5.0, "ratio": 1.75, "mlm_acc": 0.25}
    assert head["learned"] == {"ppl_L": 3.0, "ppl_2L": None, "ratio": None}


def test_mlm_table_tests_the_question_against_the_list_and_the_best(tmp_path):
    runs = {"none": [0.24, 0.25, 0.23], "sinusoidal": [0.30, 0.31, 0.29], "fixed": [0.45, 0.46, 0.44],
            "rope": [0.50, 0.49, 0.51]}
    f = tmp_path / "runs.json"
    f.write_text(json.dumps({"scheme": "x", "timing": {}, "runs": [
        {"scheme": s, "task": "mlm", "seed": i, "val/acc": v, "val/ppl": 1 / v} for s, vs in runs.items()
        for i, v in enumerate(vs)]}))
    t = tables.mlm_table(tables.mlm_runs([f]), "fixed", ["none", "sinusoidal"])
    assert list(t["tests"]) == ["none", "sinusoidal", "rope"] and t["tests"]["rope"]["best"]
    assert t["tests"]["none"]["diff"] == pytest.approx(0.21) and t["tests"]["none"]["p"] < 0.001
    assert t["summary"]["sinusoidal"]["vs_none"]["diff"] == pytest.approx(0.06)
    assert "vs_none" not in t["summary"]["none"]
    md = tables.mlm_markdown(t)
    assert md.index("| `rope`") < md.index("| `fixed`") < md.index("| `none`")  # best accuracy first
    assert "(best other scheme)" in md


def test_a_failed_run_fails_the_stage_and_writes_no_results(tmp_path, data_root, cache_dir):
    """One job refuses its config: the other still finishes, the stage exits 1, no results file."""
    results = tmp_path / "results.json"
    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=1 "
              "log_checkpoint=false")
    rc = study.main(["none", "--tasks", "lm", "mlm", "--seeds", "0", "--runs-dir", str(tmp_path / "runs"),
                     "--results", str(results), "--extrapolation", str(tmp_path / "x.csv"), "--multipliers", "1",
                     "--max-tokens", "64", "--common", common, "--lm", "data.seq_len=16",
                     "--mlm", "data.seq_len=-5"])
    assert rc == 1
    assert not results.exists() and not (tmp_path / "x.csv").exists()
    assert (tmp_path / "runs" / "lm-s0" / "metrics.json").exists()  # the other job finished


def test_an_interrupted_run_stops_the_stage_with_exit_130(tmp_path, data_root, cache_dir):
    """A run stopped by a signal (here SIGINT at step 3) makes the study stage exit
    130 as shells expect of Ctrl-C, never 0, writing no results; the run keeps its last.ckpt."""
    results = tmp_path / "results.json"
    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=8 trainer.val_check_interval=8 trainer.limit_val_batches=1 "
              "log_checkpoint=false '+callbacks.stop={_target_: tests.helpers.SignalAt, step: 3, signum: SIGINT}'")
    rc = study.main(["none", "--tasks", "mlm", "--seeds", "0", "--workers", "1", "--runs-dir", str(tmp_path / "runs"),
                     "--results", str(results), "--common", common, "--mlm", "data.seq_len=16"])
    assert rc == 130
    assert not results.exists()
    state = torch.load(tmp_path / "runs" / "mlm-s0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 3
