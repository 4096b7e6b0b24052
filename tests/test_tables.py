"""The study's tables (pipelines.tables) and the study stage's failure handling."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from analysis.stats import BEHIND, EQUIVALENT, against, compare, family, format_p
from pipelines import study, tables
from posenc.evaluate import write_results

from .helpers import study_params


def _rows(scheme, seed, ppl_by_len, train_len=4):
    return [{"scheme": scheme, "seed": seed, "train_len": train_len, "eval_len": t, "method": "nonoverlapping",
             "ppl": p, "note": "" if math.isfinite(p) else "not applicable"} for t, p in ppl_by_len.items()]


def test_lm_table_ratio_per_seed_and_not_applicable(tmp_path):
    write_results(_rows("sin", 0, {4: 2.0, 8: 4.0}) + _rows("sin", 1, {4: 4.0, 8: 6.0}), tmp_path / "sin.csv")
    write_results(_rows("learned", 0, {4: 3.0, 8: math.nan}), tmp_path / "learned.csv")
    t = tables.lm_table([tmp_path / "sin.csv", tmp_path / "learned.csv"])
    # per-seed ratios 2.0 and 1.5: mean 1.75 (the ratio of the means would be 1.67)
    assert t["sin"]["ratio_longest"]["mean"] == pytest.approx(1.75)
    assert t["sin"]["ratios"]["2"]["mean"] == pytest.approx(1.75) and t["sin"]["ratios"]["2"]["seeds"] == [0, 1]
    assert t["sin"]["lengths"][4] == {"mean": 3.0, "sd": pytest.approx(math.sqrt(2)), "n": 2, "values": [2.0, 4.0],
                                      "seeds": [0, 1]}
    assert t["learned"]["ratio_longest"]["mean"] is None and t["learned"]["lengths"][8]["n"] == 0
    md = tables.lm_markdown(t)
    assert "| `sin` | 3.00 ± 1.41 | 5.00 ± 1.41 | 2 |" in md and "n/a" in md
    # the headline numbers `dvc metrics show` prints: seed means at L and the longest length
    mlm = {"summary": {"sin": {"acc_mean": 0.25}}}
    head = tables.headline(t, mlm)
    assert head["sin"] == {"ppl_L": 3.0, "ppl_2L": 5.0, "ratio": 1.75, "mlm_acc": 0.25}
    assert head["learned"] == {"ppl_L": 3.0, "ppl_2L": None, "ratio": None}


def test_lm_table_compares_every_ratio_with_the_reference(tmp_path):
    """Each scheme's per-seed ratios against the reference scheme's, as one family: Welch's test
    of the logarithms as SciPy computes it, the factor of the geometric means, Holm over the
    table; the table prints the factor, its interval, both p-values and the verdict."""
    write_results(_rows("q", 0, {4: 2.0, 8: 2.0}) + _rows("q", 1, {4: 2.0, 8: 2.2}) + _rows("q", 2, {4: 2.0, 8: 2.1}),
                  tmp_path / "q.csv")
    write_results(_rows("a", 0, {4: 2.0, 8: 4.0}) + _rows("a", 1, {4: 2.0, 8: 5.0}) + _rows("a", 2, {4: 2.0, 8: 4.4}),
                  tmp_path / "a.csv")
    write_results(_rows("short", 0, {4: 2.0, 8: math.nan}), tmp_path / "short.csv")
    t = tables.compare_lm(tables.lm_table([tmp_path / f"{s}.csv" for s in ("q", "a", "short")]), "q", 0.05)
    w = t["a"]["tests"]["ratio"]["2"]
    ref = stats.ttest_ind(np.log([2.0, 2.5, 2.2]), np.log([1.0, 1.1, 1.05]), equal_var=False)
    assert w["against"] == "q" and w["scale"] == "log" and not w["paired"]
    assert w["diff"] == pytest.approx(math.exp(np.log([2.0, 2.5, 2.2]).mean() - np.log([1.0, 1.1, 1.05]).mean()))
    assert w["p"] == pytest.approx(ref.pvalue) and w["p_adj"] == pytest.approx(ref.pvalue) and w["m"] == 1
    assert w["verdict"] == BEHIND and not w["higher_is_better"]  # a higher ratio degrades more
    # the perplexity at 2L is tested too: a's [4.0, 5.0, 4.4] against q's [2.0, 2.2, 2.1], a family of its own
    at = t["a"]["tests"]["ppl"]["2"]
    assert at["p"] == pytest.approx(stats.ttest_ind(np.log([4.0, 5.0, 4.4]), np.log([2.0, 2.2, 2.1]),
                                                    equal_var=False).pvalue)
    assert "tests" not in t["q"] and "ratio" not in t["short"]["tests"]  # itself; no value past L
    assert t["short"]["tests"]["ppl"]["1"]["verdict"] == "untested"  # one seed at L: no test
    md = tables.lm_markdown(t, "q")
    assert "| scheme | against | at | ratio's factor (95% CI) | p | Holm p | verdict |" in md
    assert f"| `a` | `q` | 2L | ×{w['diff']:.3f} ({w['ci'][0]:.3f}, {w['ci'][1]:.3f}) | {format_p(w['p'])} | " in md
    assert "Holm" not in tables.lm_markdown(tables.compare_lm(t, "absent"), "absent")


def _study_files(tmp_path, scheme, core="c1"):
    write_results(_rows(scheme, 0, {4: 2.0, 8: 3.0}) + _rows(scheme, 1, {4: 2.1, 8: 3.3}),
                  tmp_path / "extrapolation" / f"{scheme}.csv")
    runs = [{"scheme": scheme, "task": "mlm", "seed": i, "val/acc": 0.3 + i / 100, "val/ppl": 9.0,
             "test/acc": 0.35 - i / 50, "test/ppl": 8.5} for i in (0, 1)]
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
            "--lm-reference", "alibi", "--question", "alibi", "--against", "none",
            "--out-dir", str(tmp_path / "out"), "--md-dir", str(tmp_path / "md")]
    tables.main(args)
    err = capsys.readouterr().err
    assert "no runs for scheme sandwich" in err and "extra.json belongs to no scheme of the study" in err
    lm = json.loads((tmp_path / "out" / "lm_table.json").read_text())
    assert set(lm) == {"none", "alibi"} and lm["none"]["tests"]["ratio"]["2"]["against"] == "alibi"
    assert sorted(p.name for p in (tmp_path / "out" / "metrics").iterdir()) == ["alibi.json", "none.json"]
    # results of another version of the shared code: refused before anything is written
    _study_files(tmp_path, "alibi", core="c2")
    (tmp_path / "out" / "lm_table.json").unlink()
    with pytest.raises(SystemExit, match=r"(?s)different shared code.*: none\n.*: alibi"):
        tables.main(args)
    assert not (tmp_path / "out" / "lm_table.json").exists()


def test_mlm_table_tests_the_question_against_the_schemes_named(tmp_path):
    """The question against the schemes named (a family of its own), never against one picked
    by the results; every scheme against the reference (another family)."""
    runs = {"none": [0.24, 0.25, 0.23], "sinusoidal": [0.30, 0.31, 0.29], "fixed": [0.45, 0.46, 0.44],
            "rope": [0.50, 0.49, 0.51]}
    f = tmp_path / "runs.json"
    f.write_text(json.dumps({"scheme": "x", "timing": {}, "runs": [
        {"scheme": s, "task": "mlm", "seed": i, "val/acc": v, "val/ppl": 1 / v} for s, vs in runs.items()
        for i, v in enumerate(vs)]}))
    t = tables.mlm_table(tables.mlm_runs([f]), "fixed", ["none", "sinusoidal"], margin=0.02)
    assert list(t["tests"]) == ["none", "sinusoidal"]  # rope is better, but was not named
    assert t["tests"]["none"]["diff"] == pytest.approx(0.21) and t["tests"]["none"]["p"] < 0.001
    assert t["tests"]["none"]["m"] == 2 and t["tests"]["none"]["verdict"] == "ahead"
    assert t["summary"]["sinusoidal"]["vs_reference"]["diff"] == pytest.approx(0.06)
    assert t["summary"]["sinusoidal"]["vs_reference"]["m"] == 3 and "vs_reference" not in t["summary"]["none"]
    md = tables.mlm_markdown(t)
    assert md.index("| `rope`") < md.index("| `fixed`") < md.index("| `none`")  # best accuracy first
    assert "each scheme params.yaml names" in md
    causal = tables.mlm_table(tables.mlm_runs([f]), "xpos", ["none"])  # a causal-only scheme in the slot
    assert causal["tests"] == {} and "`xpos` has no masked-LM runs" in causal["note"]
    assert "Does `xpos` help? `xpos` has no masked-LM runs" in tables.mlm_markdown(causal)  # the section stays
    empty = tables.mlm_table({}, "fixed", ["none"])  # a study without the masked LM
    assert empty["summary"] == {} and tables.mlm_markdown(empty) == "This study has no masked-LM runs.\n"


@pytest.mark.slow
def test_a_failed_run_fails_the_stage_and_writes_no_results(tmp_path, data_root, cache_dir):
    """One job refuses its config: the other still finishes, the stage exits 1, no results file."""
    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=2 trainer.val_check_interval=2 trainer.limit_val_batches=1 "
              "log_checkpoint=false")
    params = study_params(tmp_path, lm={"steps": 2, "validate_every": 2},
                          mlm={"steps": 2, "validate_every": 2, "overrides": "data.seq_len=-5"})
    rc = study.main(["none", "--params", params, "--tasks", "lm", "mlm", "--runs-dir", str(tmp_path / "runs"),
                     "--results-dir", str(tmp_path / "results"), "--common", common])
    assert rc == 1
    assert not (tmp_path / "results").exists()
    assert (tmp_path / "runs" / "lm-s0" / "metrics.json").exists()  # the other job finished


@pytest.mark.slow
def test_an_interrupted_run_stops_the_stage_with_exit_130(tmp_path, data_root, cache_dir):
    """A run stopped by a signal (here SIGINT at step 3) makes the study stage exit
    130 as shells expect of Ctrl-C, never 0, writing no results; the run keeps its last.ckpt."""
    results = tmp_path / "results"
    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=8 trainer.val_check_interval=8 trainer.limit_val_batches=1 "
              "log_checkpoint=false '+callbacks.stop={_target_: tests.helpers.SignalAt, step: 3, signum: SIGINT}'")
    params = study_params(tmp_path, mlm={"steps": 8, "validate_every": 8})
    rc = study.main(["none", "--params", params, "--tasks", "mlm", "--workers", "1", "--runs-dir",
                     str(tmp_path / "runs"), "--results-dir", str(results), "--common", common])
    assert rc == 130
    assert not results.exists()
    state = torch.load(tmp_path / "runs" / "mlm-s0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 3


@pytest.mark.slow
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

    params = study_params(tmp_path, lm={"steps": 2, "validate_every": 2})

    def run(scheme_overrides: str, results: str) -> dict:
        rc = study.main(["none", "--params", params, "--tasks", "lm", "--workers", "1", "--runs-dir", str(runs),
                         "--results-dir", str(tmp_path / results), "--common", common,
                         "--scheme-overrides", scheme_overrides])
        assert rc == 0
        return json.loads((tmp_path / results / "runs" / "none.json").read_text())

    first = run("", "a")
    assert sorted(p.name for p in runs.iterdir()) == ["lm-s0"]
    prov = first["provenance"]
    assert prov["core"] == files_digest() and prov["scheme"] == scheme_fingerprint("none")["digest"]
    second = run("optim.weight_decay=0.05", "b")
    assert second["provenance"] == prov  # the scheme's own overrides are not shared settings
    assert "weight_decay: 0.05" in (runs / "lm-s0" / "config.yaml").read_text()  # but they were applied


# ---------------------------------------------------------------- lm table, by hand
def test_lm_table_by_hand(tmp_path):
    """``lm_table``: per scheme its L, seeds, mean ± sd, count and per-seed values of finite
    perplexities at each length (the non-overlapping method only), the ratio ppl(kL) / ppl(L)
    per seed at every multiple k, and the ratio at the longest length; a seed without L or kL
    gives no ratio there; a scheme scored at L alone has its ratio 1."""
    rows = _rows("sin", 0, {4: 2.0, 6: 2.5, 16: 4.0}) + _rows("sin", 1, {4: 4.0, 6: 4.5, 16: 6.0})
    rows += [{**r, "method": "sliding", "ppl": 1.0} for r in rows]
    write_results(rows, tmp_path / "sin.csv")
    write_results(_rows("gap", 0, {4: 2.0, 16: 4.0}) + _rows("gap", 1, {4: 2.0}) + _rows("gap", 2, {16: 5.0}),
                  tmp_path / "gap.csv")
    write_results(_rows("short", 5, {8: 3.0}, train_len=8), tmp_path / "short.csv")
    t = tables.lm_table([tmp_path / f"{s}.csv" for s in ("sin", "gap", "short")])
    sd = pytest.approx(2**0.5)
    assert t["sin"] == {"train_len": 4, "seeds": [0, 1],
                        "lengths": {4: {"mean": 3.0, "sd": sd, "n": 2, "values": [2.0, 4.0], "seeds": [0, 1]},
                                    6: {"mean": 3.5, "sd": sd, "n": 2, "values": [2.5, 4.5], "seeds": [0, 1]},
                                    16: {"mean": 5.0, "sd": sd, "n": 2, "values": [4.0, 6.0], "seeds": [0, 1]}},
                        "ratios": {"4": {"mean": 1.75, "sd": pytest.approx(0.125**0.5), "n": 2, "values": [2.0, 1.5],
                                         "seeds": [0, 1]}},
                        "ratio_longest": {"mean": 1.75, "sd": pytest.approx(0.125**0.5), "n": 2, "longest": 16,
                                          "values": [2.0, 1.5]}}
    assert t["gap"]["ratio_longest"] == {"mean": 2.0, "sd": 0.0, "n": 1, "longest": 16, "values": [2.0]}
    assert t["gap"]["ratios"]["4"]["seeds"] == [0]
    assert t["gap"]["lengths"][16]["n"] == 2 and t["gap"]["seeds"] == [0, 1, 2]
    assert t["short"]["train_len"] == 8 and t["short"]["ratio_longest"]["values"] == [1.0]


def _lm_entry(L, seeds, lengths, ratio, longest, values=()):
    """A hand-made row of the LM table: its lengths' mean and sd, and the ratio at the longest."""
    return {"train_len": L, "seeds": seeds, "lengths": {t: {"mean": m, "sd": sd, "n": len(seeds)} for t, (m, sd) in
                                                        lengths.items()},
            "ratio_longest": {"mean": ratio[0], "sd": ratio[1], "n": len(values), "longest": longest,
                              "values": list(values)}}


def _lm_files(tmp_path, rows: dict) -> dict:
    """An LM table from {scheme: {seed: {length: ppl}}} at L = 4 (``lm_table`` of written results)."""
    files = []
    for s, seeds in rows.items():
        write_results([r for seed, by in seeds.items() for r in _rows(s, seed, by)], tmp_path / f"{s.replace('+', '_')}.csv")
        files.append(tmp_path / f"{s.replace('+', '_')}.csv")
    return tables.lm_table(files)


def test_compare_lm_tests_every_length_and_pairs_the_rule_rows(tmp_path):
    """``compare_lm``: every scheme proper of the reference's L against the reference, on the
    ratio at each multiple and on the perplexity at each multiple, each (quantity, multiple) a
    family (Holm over the schemes); not the reference itself, not a scheme of another L; a rule's
    row against its plain row seed by seed (SciPy's paired test on the logs), a family of its own;
    each scheme proper's place by its perplexity at the longest length; nothing against a
    reference without values."""
    t = _lm_files(tmp_path, {
        "q": {0: {4: 2.0, 8: 2.0, 16: 2.1}, 1: {4: 2.2, 8: 2.3, 16: 2.2}, 2: {4: 2.1, 8: 2.1, 16: 2.2}},
        "a": {0: {4: 2.0, 8: 4.0, 16: 6.0}, 1: {4: 2.4, 8: 5.0, 16: 7.0}, 2: {4: 2.2, 8: 4.4, 16: 6.6}},
        "b": {0: {4: 1.9, 8: 2.0, 16: 2.3}, 1: {4: 2.1, 8: 2.2, 16: 2.6}, 2: {4: 2.0, 8: 2.4, 16: 2.5}},
        "a+rule": {0: {4: 2.0, 8: 3.0, 16: 4.0}, 1: {4: 2.4, 8: 3.9, 16: 4.6}, 2: {4: 2.2, 8: 3.1, 16: 4.5}}})
    write_results(_rows("other_l", 0, {8: 2.0, 16: 2.0}, train_len=8) + _rows("other_l", 1, {8: 2.1, 16: 2.2}, train_len=8),
                  tmp_path / "other.csv")
    t |= tables.lm_table([tmp_path / "other.csv"])
    out = tables.compare_lm(t, "q", 0.05)
    assert sorted(s for s, e in out.items() if "tests" in e) == ["a", "b"]
    assert set(out["a"]["tests"]) == {"ratio", "ppl"} and set(out["a"]["tests"]["ratio"]) == {"2", "4"}
    assert set(out["a"]["tests"]["ppl"]) == {"1", "2", "4"}
    ratios = {s: out[s]["ratios"]["4"]["values"] for s in ("a", "b", "q")}
    assert out["a"]["tests"]["ratio"]["4"] == against(ratios, "q", "log", 0.05, higher_is_better=False)["a"]
    assert out["a"]["tests"]["ratio"]["4"]["m"] == 2
    rule = out["a+rule"]["rule"]["ratio"]["4"]
    mine, plain = out["a+rule"]["ratios"]["4"]["values"], out["a"]["ratios"]["4"]["values"]
    assert rule["paired"] and rule["against"] == "a" and rule["m"] == 1
    assert rule["p"] == pytest.approx(stats.ttest_rel(np.log(mine), np.log(plain)).pvalue)
    assert "ppl" in out["a+rule"]["rule"] and out["a+rule"]["rule"]["ppl"]["1"]["p"] is None  # equal at L: no spread
    assert {s: out[s]["place"]["place"] for s in ("q", "a", "b")} == {"q": 1, "b": 2, "a": 3}
    assert "place" not in out["a+rule"] and "place" not in out["other_l"]  # a place among the reference's L only
    for reference in (None, "", "absent"):
        assert not any("tests" in e for e in tables.compare_lm(out, reference).values())


def test_compare_pairs_tests_each_group_as_a_family(tmp_path):
    """``compare_pairs``: the pairs params.yaml names (``parse_pairs``), each group a family per
    quantity and multiple, Welch on the logs; a pair with a side the table lacks is left out; a
    malformed pair is refused naming the setting."""
    t = _lm_files(tmp_path, {
        "q": {0: {4: 2.0, 8: 2.0}, 1: {4: 2.2, 8: 2.3}, 2: {4: 2.1, 8: 2.1}},
        "a": {0: {4: 2.0, 8: 4.0}, 1: {4: 2.4, 8: 5.0}, 2: {4: 2.2, 8: 4.4}},
        "b": {0: {4: 1.9, 8: 2.0}, 1: {4: 2.1, 8: 2.2}, 2: {4: 2.0, 8: 2.4}}})
    groups = tables.parse_pairs({"g": "a:b q:b a:absent"})
    assert groups == {"g": [("a", "b"), ("q", "b"), ("a", "absent")]}
    out = tables.compare_pairs(t, groups, 0.05)
    assert set(out["g"]) == {"a:b", "q:b"}
    ab = out["g"]["a:b"]["ratio"]["2"]
    assert ab == family({k: compare(t[x]["ratios"]["2"]["values"], t[y]["ratios"]["2"]["values"], "log", 0.05)
                         | {"against": y} for k, (x, y) in {"a:b": ("a", "b"), "q:b": ("q", "b")}.items()},
                        higher_is_better=False)["a:b"]
    with pytest.raises(ValueError, match="lm_table.pairs.g: 'ab' is not a pair"):
        tables.parse_pairs({"g": "ab"})


def test_at_length_reads_int_and_json_keys(tmp_path):
    """A length's statistics whether the table was just built (int keys) or read back from
    JSON (string keys); {} for a length the scheme was not scored at."""
    e = _lm_files(tmp_path, {"s": {0: {4: 2.0, 8: 3.0}}})["s"]
    back = json.loads(json.dumps(e))
    for entry in (e, back):
        assert tables.at_length(entry, 8) == {"mean": 3.0, "sd": 0.0, "n": 1, "values": [3.0], "seeds": [0]}
        assert tables.at_length(entry, 16) == {}


def test_lm_markdown_by_hand(tmp_path):
    """``lm_markdown``: the perplexity at every length (labelled with its multiple of L) with the
    seeds and each scheme's place, rows by perplexity at the longest length ("n/a" where a scheme
    has none); with a reference, a grid per quantity of each verdict by length and every test in
    full (``analysis.stats.comparison_cells``); the rule rows against their plain rows; the pairs."""
    from analysis.stats import comparison_cells

    t = tables.compare_lm(_lm_files(tmp_path, {
        "q": {0: {4: 2.0, 8: 2.0}, 1: {4: 2.2, 8: 2.3}, 2: {4: 2.1, 8: 2.1}},
        "b": {0: {4: 2.0, 8: 4.0}, 1: {4: 2.4, 8: 5.0}, 2: {4: 2.2, 8: 4.4}},
        "b+r": {0: {4: 2.0, 8: 3.0}, 1: {4: 2.4, 8: 3.4}, 2: {4: 2.2, 8: 3.6}}}), "q", 0.05)
    pairs = tables.compare_pairs(t, {"g": [("b", "q")]}, 0.05)
    md = tables.lm_markdown(t, "q", pairs)
    lines = md.splitlines()
    assert lines[:5] == ["| scheme | 4 (L) | 8 (2L) | seeds | place by ppl(2L) (95% interval) |",
                         "| --- | ---: | ---: | ---: | ---: |",
                         "| `q` | 2.10 ± 0.10 | 2.13 ± 0.15 | 3 | 1 (1–1) |",
                         "| `b+r` | 2.20 ± 0.20 | 3.33 ± 0.31 | 3 | — |",
                         "| `b` | 2.20 ± 0.20 | 4.47 ± 0.50 | 3 | 2 (2–2) |"]
    ratio = t["b"]["tests"]["ratio"]["2"]
    assert f"| `b` | {t['b']['ratios']['2']['mean']:.2f}; ×{ratio['diff']:.2f} behind |" in md
    assert f"| `b` | `q` | 2L | {' | '.join(comparison_cells(ratio))} | " in md
    rule = t["b+r"]["rule"]["ratio"]["2"]
    assert "seed by seed (paired tests" in md and f"| `b+r` | `b` | 2L | {' | '.join(comparison_cells(rule))} | " in md
    assert "Pairs `g`" in md and md.rstrip().splitlines()[-1].startswith("| `b` | `q` | 2L |")
    assert "against `q`" not in tables.lm_markdown(t)  # no reference asked: no reference's grids or tests


def _mlm_file(tmp_path, runs):
    f = tmp_path / "mlm.json"
    f.write_text(json.dumps({"scheme": "x", "timing": {}, "runs": [
        {"scheme": s, "task": "mlm", "seed": seed, "val/acc": a, "val/ppl": p, "global_step": 300}
        for s, vals in runs.items() for seed, (a, p) in vals] + [
        {"scheme": "none", "task": "lm", "seed": 0, "val/acc": 0.9, "val/ppl": 1.0}]}))
    return f


MLM = {"none": [(0, (0.14, 4.0)), (1, (0.24, 4.2)), (2, (0.34, 4.4))],
       "fixed": [(0, (0.45, 2.0)), (1, (0.46, 2.0)), (2, (0.44, 2.0))],
       "rope": [(0, (0.50, 1.9)), (1, (0.49, 2.0)), (2, (0.51, 2.1))],
       "solo": [(7, (0.30, 3.0))]}


def test_mlm_table_by_hand(tmp_path):
    """``mlm_table``: per scheme its seeds, steps, accuracy and perplexity mean ± sd, and its
    accuracy against the reference's as one family; the question tested against each scheme
    asked for that has runs (once, in the order asked), another family; a single-seed scheme
    gets an untested comparison; the question alone tests nothing."""
    runs = tables.mlm_runs([_mlm_file(tmp_path, MLM)])
    assert sorted(runs) == ["fixed", "none", "rope", "solo"] and len(runs["none"]) == 3  # mlm runs only
    t = tables.mlm_table(runs, "fixed", ["none", "solo", "learned", "rope", "none"], margin=0.02)
    none_acc = [0.14, 0.24, 0.34]
    assert (t["metric"], t["reference"], t["question"], t["note"], t["margin"]) == (
        "masked-token accuracy on the validation split", "none", "fixed", None, 0.02)
    solo = t["summary"]["solo"]
    assert {k: v for k, v in solo.items() if k != "vs_reference"} == {
        "seeds": [7], "n": 1, "steps": 300, "acc_mean": 0.3, "acc_sd": 0.0, "ppl_mean": 3.0, "ppl_sd": 0.0,
        "acc": [0.3], "ppl": [3.0]}
    assert solo["vs_reference"]["verdict"] == "untested" and solo["vs_reference"]["diff"] == pytest.approx(0.06)
    assert list(t["tests"]) == ["none", "solo", "rope"]
    asked = family({o: compare([0.45, 0.46, 0.44], v, "points", 0.02) | {"against": o}
                    for o, v in (("none", none_acc), ("solo", [0.3]), ("rope", [0.50, 0.49, 0.51]))})
    assert t["tests"] == asked and t["tests"]["solo"]["p"] is None and t["tests"]["none"]["m"] == 2
    alone = tables.mlm_table({"fixed": runs["fixed"]}, "fixed", ["none"])
    assert alone["tests"] == {} and alone["note"] is None
    assert tables.mlm_runs([_mlm_file(tmp_path, {})]) == {}


def test_mlm_table_reads_the_split_its_study_names(tmp_path):
    """``split="test"``: every accuracy and perplexity is the run's ``test/`` metric, and the table
    says so; ``mlm_split`` finds the split in the masked-LM entry of the params' ``tasks``
    (validation when it names none, or the study has no masked LM)."""
    f = _mlm_file(tmp_path, MLM)
    data = json.loads(f.read_text())
    for r in data["runs"]:  # test metrics that differ from the validation ones
        r["test/acc"], r["test/ppl"] = r["val/acc"] / 2, r["val/ppl"] + 1
    f.write_text(json.dumps(data))
    runs = tables.mlm_runs([f])
    t = tables.mlm_table(runs, "fixed", ["none"], split="test")
    assert t["metric"] == "masked-token accuracy on the test split" and t["split"] == "test"
    assert t["summary"]["none"]["acc"] == [0.07, 0.12, 0.17] and t["summary"]["none"]["ppl"] == [5.0, 5.2, 5.4]
    assert tables.mlm_table(runs, "fixed", ["none"])["summary"]["none"]["acc"] == [0.14, 0.24, 0.34]
    assert tables.mlm_split({"tasks": {"lm": {"evaluate": {"split": "test"}}, "mlm": {"evaluate": {"split": "test"}}}}) \
        == "test"
    assert tables.mlm_split({"tasks": {"lm": {"evaluate": {"split": "test"}}, "mlm": {"evaluate": {}}}}) == "validation"
    assert tables.mlm_split({"tasks": {"lm": {"evaluate": {"split": "test"}}}}) == "validation"
    assert tables.mlm_split({}) == "validation"


def test_mlm_markdown_by_hand(tmp_path):
    """``mlm_markdown``: schemes by accuracy, each with its comparison cells against the
    reference (dashes for the reference itself); then the question's family with t and df;
    a question without runs gets its note instead."""
    from analysis.stats import comparison_cells

    runs = tables.mlm_runs([_mlm_file(tmp_path, MLM)])
    t = tables.mlm_table(runs, "fixed", ["none", "solo"])
    cells = lambda s: " | ".join(comparison_cells(t["summary"][s].get("vs_reference")))  # noqa: E731
    table = [
        "| scheme | accuracy | masked-token perplexity | seeds | accuracy − `none`'s (95% CI) | p | Holm p | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| `rope` | 50.0% ± 1.0 | 2.00 ± 0.10 | 3 | {cells('rope')} |",
        f"| `fixed` | 45.0% ± 1.0 | 2.00 ± 0.00 | 3 | {cells('fixed')} |",
        f"| `solo` | 30.0% ± 0.0 | 3.00 ± 0.00 | 1 | {cells('solo')} |",
        "| `none` | 24.0% ± 10.0 | 4.20 ± 0.20 | 3 | — | — | — | — |",
    ]
    w = t["tests"]["none"]
    diff, *rest = comparison_cells(w)
    assert tables.mlm_markdown(t) == "\n".join(table + [
        "", "Does `fixed` help? Its accuracy against each scheme params.yaml names (a family of its own):", "",
        "| against | difference (95% CI) | t | df | p | Holm p | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| `none` | {diff} | {w['t']:+.2f} | {w['df']:.1f} | {' | '.join(rest)} |",
        "| `solo` | +15.0 pt | — | — | — | — | — |"]) + "\n"
    causal = tables.mlm_markdown(tables.mlm_table(runs, "xpos", ["none"]))
    assert causal == "\n".join(table + [
        "", "Does `xpos` help? `xpos` has no masked-LM runs (causal only, or not in the study): the question cannot "
        "be asked of this table; put a scheme that allows bidirectional attention in mlm_table.question."]) + "\n"


def test_timing_sums_runs_per_task_and_stages(tmp_path):
    """``timing``: per stage its own timing, its count of runs and the seconds of its runs
    per task (training plus evaluation, a missing part 0; 2 decimals), and in total the sum
    of each over the stages (1 decimal)."""
    a = {"scheme": "a", "timing": {"wall_s": 10.04, "startup_s": 1.0, "train_s": 6.0, "eval_s": 2.0},
         "runs": [{"task": "lm", "train_s": 1.2345, "eval_s": 0.111}, {"task": "lm", "train_s": 2.0},
                  {"task": "mlm", "eval_s": 0.5}]}
    b = {"scheme": "b", "timing": {"wall_s": 5.03, "startup_s": 0.5, "train_s": 3.0, "eval_s": 1.0},
         "runs": [{"task": "lm", "train_s": 1.0, "eval_s": 1.02}]}
    files = []
    for d in (a, b):
        files.append(tmp_path / f"{d['scheme']}.json")
        files[-1].write_text(json.dumps(d))
    assert tables.timing(files) == {
        "stages": {"a": {**a["timing"], "runs": 3, "task_s": {"lm": 3.35, "mlm": 0.5}},
                   "b": {**b["timing"], "runs": 1, "task_s": {"lm": 2.02}}},
        "total": {"wall_s": 15.1, "startup_s": 1.5, "train_s": 9.0, "eval_s": 3.0, "runs": 4,
                  "task_s": {"lm": 5.4, "mlm": 0.5}}}


def test_headline_rounds_to_4_decimals():
    """The metrics ``dvc metrics show`` prints are rounded to 4 decimals (None stays None)."""
    lm = {"a": _lm_entry(4, [0], {4: (3.123456, 0.0), 16: (5.0, 0.0)}, (1.23456789, 0.0), 16, [1.23456789]),
          "b": _lm_entry(4, [0], {4: (2.0, 0.0)}, (None, None), 16)}
    assert tables.headline(lm, {"summary": {"a": {"acc_mean": 1 / 3}, "c": {"acc_mean": 0.5}}}) == {
        "a": {"ppl_L": 3.1235, "ppl_4L": 5.0, "ratio": 1.2346, "mlm_acc": 0.3333},
        "b": {"ppl_L": 2.0, "ppl_4L": None, "ratio": None}, "c": {"mlm_acc": 0.5}}


# ---------------------------------------------------------------- gathering the per-scheme files
def test_study_schemes_are_the_keys_of_the_schemes_section(tmp_path):
    """The study's schemes in the params file's order, as strings; a params file without a
    non-empty ``schemes:`` mapping is refused."""
    from pipelines.gather import study_schemes

    p = tmp_path / "params.yaml"
    p.write_text("schemes:\n  none: {}\n  1: {}\n  alibi: {lr: 1}\n")
    assert study_schemes(p) == ["none", "1", "alibi"]
    for text in ("", "other: 1\n", "schemes: [none, alibi]\n", "schemes: {}\n"):
        p.write_text(text)
        with pytest.raises(SystemExit, match="no schemes: section"):
            study_schemes(p)


def test_per_scheme_files_in_study_order_with_notes(tmp_path, capsys):
    """``per_scheme``: {scheme: file} by file name; without a study, every file, by name;
    with one, the study's schemes in its order, a missing one and a stranger noted on
    stderr; a folder is no file."""
    from pipelines.gather import per_scheme

    files = []
    for name in ("b/none.json", "a/alibi.json", "c/extra.json"):
        files.append(tmp_path / name)
        files[-1].parent.mkdir(exist_ok=True)
        files[-1].write_text("{}")
    (tmp_path / "rope.json").mkdir()
    files.append(tmp_path / "rope.json")
    every = per_scheme(files, None, "runs")
    assert list(every.items()) == [("alibi", files[1]), ("extra", files[2]), ("none", files[0])]
    assert capsys.readouterr().err == ""
    got = per_scheme(files, ["none", "rope", "alibi"], "runs")
    assert list(got.items()) == [("none", files[0]), ("alibi", files[1])]
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        "note: no runs for scheme rope of the study: left out of this summary (`dvc repro study@rope` makes them)\n"
        f"note: {files[2]} belongs to no scheme of the study: ignored\n")


def _run_file(path, prov):
    path.write_text(json.dumps({"scheme": path.stem, "runs": [], **({"provenance": prov} if prov else {})}))
    return path


def test_check_provenance_names_each_group_largest_first(tmp_path):
    """Results of one code and settings digest pass; otherwise the refusal lists each group
    (code and settings cut to 12 characters, its schemes), the largest first, and what to do.
    Settings alone differing is refused too; files without provenance form a group of their own."""
    from pipelines.gather import check_provenance

    c1, c2, s1 = "0123456789abcdef", "fedcba9876543210", "settings-digest-1"
    same = {s: _run_file(tmp_path / f"{s}.json", {"core": c1, "settings": s1}) for s in ("y", "z")}
    assert check_provenance(same) is None
    runs = {"x": _run_file(tmp_path / "x.json", {"core": c2, "settings": s1}), **same}
    with pytest.raises(SystemExit) as e:
        check_provenance(runs)
    assert str(e.value) == (
        "error: these results were made with different shared code or study settings and cannot share a table:\n"
        "  code 0123456789ab, settings settings-dig: y, z\n"
        "  code fedcba987654, settings settings-dig: x\n"
        "Re-run the stages of the schemes made with other code (`dvc repro --force study@<scheme>`), or return to "
        "the code and params.yaml the others were made with.")
    other = {**same, "w": _run_file(tmp_path / "w.json", {"core": c1, "settings": "s2"})}
    with pytest.raises(SystemExit, match="settings s2: w"):
        check_provenance(other)
    bare = {**same, "v": _run_file(tmp_path / "v.json", None)}
    with pytest.raises(SystemExit, match="code None, settings None: v"):
        check_provenance(bare)
    assert check_provenance({"v": bare["v"]}) is None


DEFAULT_AGAINST = ["none", "sinusoidal", "learned", "shaw", "transformer_xl"]


def _stage_inputs(tmp_path, monkeypatch) -> tuple[list[str], list[str]]:
    """The study files of the default question and comparisons, the working directory set where
    they are (as dvc runs the stage): (runs files, extrapolation files)."""
    for s in ("alibi", "fixed_bidirectional", *DEFAULT_AGAINST):
        _study_files(tmp_path, s)
    monkeypatch.chdir(tmp_path)
    runs = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "runs").glob("*.json"))
    ex = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "extrapolation").glob("*.csv"))
    return runs, ex


def test_tables_stage_defaults_and_what_it_writes(tmp_path, monkeypatch, capsys):
    """``pipelines.tables`` with its defaults, run where dvc runs it: the ratios are compared
    with ``alibi``, the masked-LM question is ``fixed_bidirectional`` against none,
    sinusoidal, learned, shaw and transformer_xl (no scheme picked by the results); it writes
    results/{lm_table,mlm_table,timing}.json, results/metrics/<scheme>.json and
    figures/{lm_table,mlm_table}.md, and prints both tables. A question or comparison
    scheme without results is noted on stderr; ``--against`` takes any number of schemes;
    the extrapolation files are required."""
    runs, ex = _stage_inputs(tmp_path, monkeypatch)
    tables.main([*runs, "--extrapolation", *ex])
    out = capsys.readouterr()
    assert _as_composed(tmp_path, runs, ex, "results", "figures", out.out, 0.05, "none", 0.02, None, ["mlm"]) == {}
    lm = json.loads((tmp_path / "results" / "lm_table.json").read_text())
    mlm = json.loads((tmp_path / "results" / "mlm_table.json").read_text())
    assert {e["tests"]["ratio"]["2"]["against"] for s, e in lm.items() if s != "alibi"} == {"alibi"}
    assert mlm["question"] == "fixed_bidirectional" and list(mlm["tests"]) == DEFAULT_AGAINST
    assert json.loads((tmp_path / "results" / "lm_pairs.json").read_text()) == {}  # no params: no pairs named
    assert (tmp_path / "figures" / "lm_table.md").read_text() == tables.lm_markdown(lm, "alibi", {})
    assert (tmp_path / "figures" / "mlm_table.md").read_text() == tables.mlm_markdown(mlm)
    assert out.out == tables.lm_markdown(lm, "alibi", {}) + "\n" + tables.mlm_markdown(mlm) + "\n" and out.err == ""
    assert json.loads((tmp_path / "results" / "timing.json").read_text())["total"]["runs"] == 2 * 7
    metrics = sorted(p.name for p in (tmp_path / "results" / "metrics").iterdir())
    assert metrics == sorted(f"{s}.json" for s in ("alibi", "fixed_bidirectional", *DEFAULT_AGAINST))
    assert json.loads((tmp_path / "results" / "metrics" / "none.json").read_text())["mlm_acc"] == pytest.approx(0.305)
    params = tmp_path / "params.yaml"
    params.write_text("schemes:\n  none: {}\n  alibi: {}\n  sandwich: {}\n")
    tables.main([*runs, "--extrapolation", *ex, "--params", str(params), "--lm-reference", "absent",
                 "--question", "xpos", "--out-dir", "o", "--md-dir", "m"])
    err = capsys.readouterr().err
    assert "note: no extrapolation results for scheme sandwich of the study" in err
    assert "note: --lm-reference absent has no extrapolation results: no comparison column\n" in err
    assert "note: --question `xpos` has no masked-LM runs" in err
    assert sorted(json.loads((tmp_path / "o" / "lm_table.json").read_text())) == ["alibi", "none"]
    assert (tmp_path / "m" / "mlm_table.md").exists()
    tables.main([*runs, "--extrapolation", *ex, "--against", "learned", "shaw", "--out-dir", "o2"])
    assert list(json.loads((tmp_path / "o2" / "mlm_table.json").read_text())["tests"]) == ["learned", "shaw"]
    with pytest.raises(SystemExit):
        tables.main([*runs])


def _as_composed(tmp_path, runs, ex, out, md, printed, lm_margin, mlm_reference, mlm_margin, pairs_text, tasks,
                 split="validation"):
    """Every file ``pipelines.tables`` wrote under ``out`` and ``md`` (and what it printed) is the
    library's table composed here with the settings it was given: the LM table against ``alibi``,
    the named pairs, the masked-LM table with its reference, margin and split, the tasks in order."""
    from analysis.lm import compare_lm, compare_pairs, lm_markdown, lm_table, parse_pairs

    def written(path, obj):
        assert (tmp_path / path).read_text() == json.dumps(obj, indent=2) + "\n", path

    lm = compare_lm(lm_table(ex), "alibi", lm_margin)
    pairs = compare_pairs(lm, parse_pairs(pairs_text), lm_margin)
    written(f"{out}/lm_table.json", lm)
    written(f"{out}/lm_pairs.json", pairs)
    assert (tmp_path / md / "lm_table.md").read_text() == lm_markdown(lm, "alibi", pairs)
    mlm = tables.mlm_table(tables.mlm_runs(runs), "fixed_bidirectional", DEFAULT_AGAINST, mlm_reference, mlm_margin,
                           split)
    written(f"{out}/mlm_table.json", mlm)
    assert mlm["split"] == split
    assert {t["margin"] for t in mlm["tests"].values()} == {mlm_margin}  # both families at that margin
    assert {e["vs_reference"]["margin"] for s, e in mlm["summary"].items() if s != mlm_reference} == {mlm_margin}
    assert {e["vs_reference"]["against"] for s, e in mlm["summary"].items() if s != mlm_reference} == {mlm_reference}
    task_table = tables.tasks_table(runs, tasks)
    assert task_table["mlm"]["schemes"]["none"]["seeds"] == [0, 1]  # the runs have no global_step:
    assert task_table["mlm"]["schemes"]["none"]["steps"] is None  # no step count to give
    written(f"{out}/tasks_table.json", task_table)
    assert (tmp_path / md / "tasks_table.md").read_text() == tables.tasks_markdown(task_table)
    assert printed == lm_markdown(lm, "alibi", pairs) + "\n" + tables.mlm_markdown(mlm) + "\n"
    assert lm["none"]["tests"]["ratio"]["2"]["margin"] == lm_margin
    return pairs


def test_the_tables_stage_gives_each_setting_to_the_table_it_belongs_to(tmp_path, monkeypatch, capsys):
    """With every setting changed from its default (the margins, the masked LM's reference,
    ``lm_table.pairs``, the tasks in their order and the masked LM's split, from the params
    file), each file of
    ``pipelines.tables`` is the library's table made with it (``_as_composed``; the defaults are
    checked the same way in ``test_tables_stage_defaults_and_what_it_writes``)."""
    runs, ex = _stage_inputs(tmp_path, monkeypatch)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({
        "schemes": {s: {} for s in ("alibi", "fixed_bidirectional", *DEFAULT_AGAINST)},
        "lm_table": {"pairs": {"relative": "shaw:none learned:sinusoidal"}},
        "tasks": {"lm": {}, "mlm": {"evaluate": {"split": "test"}}}}))
    tables.main([*runs, "--extrapolation", *ex, "--params", str(params), "--lm-margin", "0.1", "--mlm-margin", "0.05",
                 "--mlm-reference", "sinusoidal", "--out-dir", "o", "--md-dir", "m"])
    pairs = _as_composed(tmp_path, runs, ex, "o", "m", capsys.readouterr().out, 0.1, "sinusoidal", 0.05,
                         {"relative": "shaw:none learned:sinusoidal"}, ["lm", "mlm"], "test")
    assert len(pairs["relative"]) == 2


def test_the_every_task_table_in_markdown_written_out_by_hand():
    """``tasks_markdown`` against the tables typed out: shares in % with one decimal, other
    metrics with three, ± sd only over more than one seed, a dash for a missing metric or step
    count, the title only where it is not the task's name, and a task without runs as a bare head."""
    t = {"lm": {"title": "causal LM", "class": "posenc.tasks.LM", "metrics": ["val/ppl", "val/acc"],
                "schemes": {"alibi": {"seeds": [0, 1], "steps": 500.0,
                                      "metrics": {"val/ppl": {"mean": 5.5, "sd": 0.25},
                                                  "val/acc": {"mean": 0.4, "sd": 0.01}}},
                            "none": {"seeds": [3], "steps": None, "metrics": {"val/ppl": {"mean": 9.0, "sd": None}}}}},
         "mlm": {"title": "mlm", "class": "posenc.tasks.MLM", "metrics": ["val/acc"], "schemes": {}}}
    said = "validation at the end of training, mean ± sd over seeds (one seed: its value)"
    assert tables.tasks_markdown(t) == (
        f"**`lm`**, causal LM (`posenc.tasks.LM`): {said}\n"
        "\n"
        "| scheme | val/ppl | val/acc (%) | steps | seeds |\n"
        "| --- | ---: | ---: | ---: | ---: |\n"
        "| `alibi` | 5.500 ± 0.250 | 40.0 ± 1.0 | 500 | 2 |\n"
        "| `none` | 9.000 | — | — | 1 |\n"
        "\n"
        f"**`mlm`** (`posenc.tasks.MLM`): {said}\n"
        "\n"
        "| scheme | val/acc (%) | steps | seeds |\n"
        "| --- | ---: | ---: | ---: |\n")


def test_the_every_task_table_asks_each_task_what_it_logs(tmp_path):
    """``tasks_table``: per task of the study, per scheme, the mean ± sd over seeds of each
    metric its class validates (the masked LM: loss, perplexity, accuracy), by hand; a task
    with no runs has an empty table; the Markdown gives shares in %."""
    f = tmp_path / "none.json"
    f.write_text(json.dumps({"scheme": "none", "runs": [
        {"scheme": "none", "task": "mlm", "seed": i, "val/loss": 2.0 + i, "val/ppl": 7.0 + 2 * i, "val/acc": 0.3 + i / 10,
         "global_step": 100} for i in (0, 1)] + [
        {"scheme": "none", "task": "lm", "seed": 0, "val/loss": 1.5, "val/ppl": 4.5, "global_step": 50}]}))
    t = tables.tasks_table([f], ["mlm", "lm", "retrieval"])
    assert list(t) == ["mlm", "lm", "retrieval"] and t["mlm"]["class"] == "posenc.tasks.MaskedLM"
    cells = t["mlm"]["schemes"]["none"]["metrics"]
    assert cells["val/loss"] == {"mean": 2.5, "sd": pytest.approx(0.5 ** 0.5)}
    assert cells["val/acc"]["mean"] == pytest.approx(0.35) and set(cells) == {"val/loss", "val/ppl", "val/acc"}
    assert t["lm"]["schemes"]["none"]["metrics"]["val/ppl"] == {"mean": 4.5, "sd": 0.0}
    assert t["retrieval"]["schemes"] == {} and t["retrieval"]["metrics"][-1] == "val/exact"
    md = tables.tasks_markdown(t)
    assert "**`mlm`**, the masked LM (`posenc.tasks.MaskedLM`)" in md
    assert "| `none` | 2.500 ± 0.707 | 8.000 ± 1.414 | 35.0 ± 7.1 | 100 | 2 |" in md
    assert "| scheme | val/loss | val/ppl | val/acc (%) | val/exact (%) | steps | seeds |" in md


def test_the_every_task_table_gives_one_seed_its_value_alone(tmp_path):
    f = tmp_path / "none.json"
    f.write_text(json.dumps({"scheme": "none", "runs": [
        {"scheme": "none", "task": "retrieval", "seed": 0, "val/loss": 0.5, "val/ppl": 1.6, "val/acc": 0.9,
         "val/exact": 0.75, "global_step": 300}]}))
    md = tables.tasks_markdown(tables.tasks_table([f], ["retrieval"]))
    assert "| `none` | 0.500 | 1.600 | 90.0 | 75.0 | 300 | 1 |" in md
