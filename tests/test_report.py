"""The results report (pipelines.report): rendered from the committed results, it quotes
them (a changed value changes the sentence and the table that quote it), a result a
template names that does not exist fails it, and ``--check`` names the first line that
differs from what the results give."""

from __future__ import annotations

import json
import shutil

import pytest
from scipy import stats

from pipelines import report

from .conftest import REPO

#: what the report reads, relative to the project root
INPUTS = ("params.yaml", "README.md", "docs/templates", "docs/results.md", "results", "figures", "profiles")


def _skipped(folder, names):
    """Left out of the copy: a profile's training runs (profiles/<name>/runs) and images."""
    from pathlib import Path

    in_profile = Path(folder).parent.name == "profiles"
    return [n for n in names if (n == "runs" and in_profile) or n.endswith((".npz", ".png", ".svg"))]


def project_copy(tmp_path):
    """The report's inputs and outputs as committed, in a folder of their own."""
    for rel in INPUTS:
        src, dst = REPO / rel, tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=_skipped)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return tmp_path


def test_the_committed_report_and_readme_blocks_are_what_the_results_give():
    """What CI runs: the committed docs/results.md and README.md blocks equal a fresh rendering."""
    assert report.main(["--check"]) == 0


def test_a_changed_result_changes_the_sentence_and_the_table_that_quote_it(tmp_path):
    root = project_copy(tmp_path)
    before = report.render(root)[report.REPORT]
    minilm = root / "results" / "pretrained_minilm.json"
    doc = json.loads(minilm.read_text())
    terms = doc["models"]["minilm_l6_v2"]["terms"]
    old = terms["position-position"]["band_score"]
    terms["position-position"]["band_score"] = 9.87
    minilm.write_text(json.dumps(doc))
    after = report.render(root)[report.REPORT]
    row = next(line for line in after.splitlines() if line.startswith("| position-position |"))
    assert row.endswith("| +9.87 |")
    assert "the position-position band (+9.87)" in after and f"the position-position band ({old:+.2f})" in before
    changed = [a for a, b in zip(after.splitlines(), before.splitlines()) if a != b]
    assert len(changed) == 2  # the table row and the sentence, nothing else


def test_a_changed_retrieval_steps_change_the_words_of_the_comparison(tmp_path):
    """The words come from the test: make the fastest scheme's seeds as slow as the slowest's,
    and "behind" or "ahead of" turns into what the new numbers support."""
    root = project_copy(tmp_path)
    # the report reads retrieval from the seeds profile when it has results, else from the default study
    path = root / "profiles" / "retrieval-seeds" / "results" / "retrieval_table.json"
    path = path if path.exists() else root / "results" / "retrieval_table.json"
    doc = json.loads(path.read_text())
    ranked = report.rank_by_steps([(s, e) for s, e in doc["schemes"].items() if "+" not in s])
    fast, slow = ranked[0][0], ranked[-1][0]
    before = report.render(root)[report.REPORT]
    assert f"`{fast}` is ahead of `{slow}`" in before
    doc["schemes"][fast]["steps"] = {k: (v and v + 1) for k, v in doc["schemes"][slow]["steps"].items()}
    doc["schemes"][fast]["reached"] = doc["schemes"][slow]["reached"]
    path.write_text(json.dumps(doc))
    after = report.render(root)[report.REPORT]
    assert f"`{fast}` is ahead of `{slow}`" not in after


def test_a_missing_result_fails_the_report_naming_it(tmp_path, capsys):
    root = project_copy(tmp_path)
    (root / "results" / "lm_table.json").unlink()
    assert report.main(["--root", str(root)]) == 1
    assert "results/lm_table.json: no such results file" in capsys.readouterr().err
    root = project_copy(tmp_path / "again")
    template = root / "docs" / "templates" / "results.md.j2"
    template.write_text(template.read_text() + "\n{{ study.lm.alibi.no_such_number }}\n")
    assert report.main(["--root", str(root)]) == 1
    assert "no_such_number" in capsys.readouterr().err


def test_check_names_the_first_difference_and_rendering_mends_it(tmp_path, capsys):
    root = project_copy(tmp_path)
    path = root / report.REPORT
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("| day |"))
    lines[n] = "| day | 1999-01-01 |"
    path.write_text("\n".join(lines) + "\n")
    assert report.main(["--root", str(root), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"docs/results.md:{n + 1}: committed '| day | 1999-01-01 |'" in err
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("<!-- end generated -->", "a hand-typed 99%\n<!-- end generated -->", 1))
    assert report.main(["--root", str(root)]) == 0
    assert report.main(["--root", str(root), "--check"]) == 0
    assert "hand-typed" not in readme.read_text()


def test_every_generated_file_and_block_starts_with_the_stamp():
    rendered = report.render(REPO)
    assert rendered[report.REPORT].startswith(report.STAMP)
    block = rendered[report.README].split("<!-- generated: summary -->\n", 1)[1]
    assert block.startswith(report.STAMP)


def test_every_committed_profile_pipeline_is_made_from_the_current_dvc_yaml():
    from pipelines import profile

    assert profile.main(["--check"]) == 0


def test_a_profile_pipeline_writes_under_its_folder_and_leaves_out_what_it_does_not_change():
    """The profile's pipeline, made from the project's: every stage at the project root with the
    profile's params, every output (results, figures, stage records, runs) under its folder, its
    MLflow runs in an experiment of its own, no benchmark, MiniLM or report stage."""
    import yaml

    from pipelines import profile

    made = yaml.safe_load(profile.render("demo"))
    stages = made["stages"]
    assert set(stages) == set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]) - set(profile.LEFT_OUT)
    for name, spec in stages.items():
        body = spec.get("do", spec)
        assert body["wdir"] == "../.."
        for out in body.get("outs", []) + body.get("metrics", []):
            path = next(iter(out)) if isinstance(out, dict) else out
            assert path.startswith("profiles/demo/"), (name, path)
        for p in body.get("params", []):
            assert set(p) == {"profiles/demo/params.yaml"}, (name, p)
        assert " results/" not in body["cmd"] and " figures/" not in body["cmd"] and "figures/bench" not in body["cmd"]
    study = stages["study"]["do"]["cmd"]
    assert "--runs-dir profiles/demo/runs/${key}" in study and "logger.experiment_name=posenc-study-demo" in study
    assert "--params profiles/demo/params.yaml" in stages["tables"]["cmd"]
    assert "pretrained" not in stages["publish"]["cmd"] and "--experiment posenc-study-demo" in stages["publish"]["cmd"]
    assert all(p.startswith("profiles/demo/figures/") for p in made["plots"])


def test_holm_by_hand():
    """Holm's step-down adjustment, computed by hand: sorted 0.01, 0.03, 0.04 times 3, 2, 1
    gives 0.03, 0.06, 0.04, and the last is raised to the 0.06 before it; None stays None and
    does not count among the tests; the result is capped at 1."""
    from pipelines.report import holm

    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.02, "x": None, "b": 0.5}) == {"a": pytest.approx(0.04), "x": None, "b": 0.5}
    assert holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert holm({}) == {}


def test_flat_schemes_are_compared_with_the_best_of_them_after_holm():
    """``flat_retrieval``: only schemes whose perplexity ratio is flat (upper 95% bound at most
    1.05) and that have a retrieval row at the length take part; the best by mean is the
    reference; each other one gets Welch's test with its p multiplied as Holm's rule says, so a
    raw p below 0.05 can still be "level" once adjusted."""
    from pipelines.report import flat_retrieval

    flat_ratio = {"ratio_longest": {"values": [1.0, 1.01, 0.99]}}
    lm = {"a": flat_ratio, "b": flat_ratio, "c": flat_ratio, "steep": {"ratio_longest": {"values": [2.0, 2.5, 3.0]}},
          "no_row": flat_ratio}

    def row(v):
        return {"lengths": {"16": {"values": v}}}

    t = {"a": row([0.9, 0.85, 0.95]), "b": row([0.5, 0.55, 0.45]), "c": row([0.8, 0.7, 0.9]),
         "steep": row([0.0, 0.0, 0.1])}
    f = flat_retrieval(lm, t, 16)
    assert f["flats"] == ["a", "b", "c"] and f["best"] == "a" and f["differ"]["word"] == "differ"
    raw_b = stats.ttest_ind([0.5, 0.55, 0.45], [0.9, 0.85, 0.95], equal_var=False).pvalue
    raw_c = stats.ttest_ind([0.8, 0.7, 0.9], [0.9, 0.85, 0.95], equal_var=False).pvalue
    assert raw_b < raw_c and raw_c > 0.05
    vs = f["vs_best"]
    assert vs["b"]["p"] == pytest.approx(2 * raw_b) and vs["b"].word == "behind"
    assert vs["c"]["p"] == pytest.approx(max(2 * raw_b, raw_c)) and vs["c"].word == "level with"
    assert vs["b"]["p_raw"] == pytest.approx(raw_b)
    assert flat_retrieval(lm, {"a": row([0.9, 0.8])}, 16)["vs_best"] == {}  # one flat scheme: nothing to compare
