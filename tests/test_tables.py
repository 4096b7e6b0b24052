"""The study's tables (pipelines.tables) and the study stage's failure handling."""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import stats

from analysis.stats import format_p
from pipelines import study, tables
from posenc.evaluate import write_results


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


def test_lm_table_compares_every_ratio_with_the_question(tmp_path):
    """Each scheme's per-seed ratios against the question scheme's, Welch-tested as scipy does."""
    write_results(_rows("q", 0, {4: 2.0, 8: 2.0}) + _rows("q", 1, {4: 2.0, 8: 2.2}) + _rows("q", 2, {4: 2.0, 8: 2.1}),
                  tmp_path / "q.csv")
    write_results(_rows("a", 0, {4: 2.0, 8: 4.0}) + _rows("a", 1, {4: 2.0, 8: 5.0}) + _rows("a", 2, {4: 2.0, 8: 4.4}),
                  tmp_path / "a.csv")
    write_results(_rows("short", 0, {4: 2.0, 8: math.nan}), tmp_path / "short.csv")
    t = tables.compare_ratios(tables.lm_table([tmp_path / f"{s}.csv" for s in ("q", "a", "short")]), "q")
    w, ref = t["a"]["vs_question"], stats.ttest_ind([2.0, 2.5, 2.2], [1.0, 1.1, 1.05], equal_var=False)
    assert w["question"] == "q" and w["diff"] == pytest.approx(2.2333 - 1.05, abs=1e-3)
    assert w["p"] == pytest.approx(ref.pvalue) and w["t"] == pytest.approx(ref.statistic)
    assert "vs_question" not in t["q"] and "vs_question" not in t["short"]  # itself; no ratio
    md = tables.lm_markdown(t, "q")
    assert "ppl(2L) / ppl(L) − `q` (95% CI) | Welch p |" in md.splitlines()[0]
    assert "| `a` |" in md and f"| +1.18 ({w['ci'][0]:+.2f}, {w['ci'][1]:+.2f}) | {format_p(w['p'])} |" in md
    assert md.splitlines()[2].startswith("| `q` |") and md.splitlines()[2].endswith("| — | — |")
    assert "Welch" not in tables.lm_markdown(tables.compare_ratios(t, "absent"), "absent")


def _study_files(tmp_path, scheme, core="c1"):
    write_results(_rows(scheme, 0, {4: 2.0, 8: 3.0}) + _rows(scheme, 1, {4: 2.1, 8: 3.3}),
                  tmp_path / "extrapolation" / f"{scheme}.csv")
    runs = [{"scheme": scheme, "task": "mlm", "seed": i, "val/acc": 0.3 + i / 100, "val/ppl": 9.0} for i in (0, 1)]
    (tmp_path / "runs").mkdir(exist_ok=True)
    (tmp_path / "runs" / f"{scheme}.json").write_text(json.dumps({
        "scheme": scheme, "provenance": {"core": core, "scheme": scheme, "settings": "s"},
        "timing": {"wall_s": 1, "startup_s": 0, "train_s": 1, "eval_s": 0}, "runs": runs}))


def test_tables_stage_reads_the_study_schemes_and_refuses_mixed_code(tmp_path, capsys):
    for s in ("none", "alibi", "extra"):
        _study_files(tmp_path, s)
    params = tmp_path / "params.yaml"
    params.write_text("schemes:\n  none: {}\n  alibi: {}\n  sandwich: {}\n")
    args = [*map(str, sorted((tmp_path / "runs").glob("*.json"))), "--extrapolation",
            *map(str, sorted((tmp_path / "extrapolation").glob("*.csv"))), "--params", str(params),
            "--lm-question", "alibi", "--question", "alibi", "--against", "none",
            "--out-dir", str(tmp_path / "out"), "--md-dir", str(tmp_path / "md")]
    tables.main(args)
    err = capsys.readouterr().err
    assert "no runs for scheme sandwich" in err and "extra.json belongs to no scheme of the study" in err
    lm = json.loads((tmp_path / "out" / "lm_table.json").read_text())
    assert set(lm) == {"none", "alibi"} and lm["none"]["vs_question"]["question"] == "alibi"
    assert sorted(p.name for p in (tmp_path / "out" / "metrics").iterdir()) == ["alibi.json", "none.json"]
    # results of another version of the shared code: refused before anything is written
    _study_files(tmp_path, "alibi", core="c2")
    (tmp_path / "out" / "lm_table.json").unlink()
    with pytest.raises(SystemExit, match=r"(?s)different shared code.*: none\n.*: alibi"):
        tables.main(args)
    assert not (tmp_path / "out" / "lm_table.json").exists()


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
    causal = tables.mlm_table(tables.mlm_runs([f]), "xpos", ["none"])  # a causal-only scheme in the slot
    assert causal["tests"] == {} and "`xpos` has no masked-LM runs" in causal["note"]
    assert "Does `xpos` help? `xpos` has no masked-LM runs" in tables.mlm_markdown(causal)  # the section stays


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


def test_a_study_stage_empties_its_runs_folder_and_records_provenance(tmp_path, data_root, cache_dir):
    """The stage owns <runs-dir>: a run folder of an earlier version of the study does not stay
    beside the new ones; the results record the digests of the shared code, the scheme and
    the settings, and a scheme's own overrides are not part of the shared settings."""
    from posenc.fingerprint import files_digest, scheme_fingerprint

    runs = tmp_path / "runs"
    (runs / "lm-s9" / "checkpoints").mkdir(parents=True)
    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=1 "
              "log_checkpoint=false logger.experiment_name=provenance")

    def run(scheme_overrides: str, results: str) -> dict:
        rc = study.main(["none", "--tasks", "lm", "--seeds", "0", "--workers", "1", "--runs-dir", str(runs),
                         "--results", str(tmp_path / results), "--extrapolation", str(tmp_path / "x.csv"),
                         "--multipliers", "1", "--max-tokens", "64", "--common", common,
                         "--scheme-overrides", scheme_overrides, "--lm", "data.seq_len=16"])
        assert rc == 0
        return json.loads((tmp_path / results).read_text())

    first = run("", "a.json")
    assert sorted(p.name for p in runs.iterdir()) == ["lm-s0"]
    prov = first["provenance"]
    assert prov["core"] == files_digest() and prov["scheme"] == scheme_fingerprint("none")["digest"]
    second = run("optim.weight_decay=0.05", "b.json")
    assert second["provenance"] == prov  # the scheme's own overrides are not shared settings
    assert "weight_decay: 0.05" in (runs / "lm-s0" / "config.yaml").read_text()  # but they were applied
