"""Provenance a clone cannot falsify: a study stage records the commit whose code made its runs,
the report credits that commit, ``report --check`` refuses a credit that cannot be true, and
``publish`` keeps the committed record where the trained runs are not. Also ``dvc status``
explained a stage a line (``pipelines.status``). Each test builds its own small git history."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pipelines import commits, publish, report, status
from pipelines.results import Study

from .conftest import REPO


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


def _commit(root: Path, files: dict[str, str], message: str) -> str:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", message)
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def history(tmp_path):
    """A project's history: ``code`` changes the study's code (a file the study stage depends on),
    ``results`` commits the study's records (made at ``code``), ``docs`` changes nothing of the
    study (HEAD)."""
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    _git(tmp_path, "init", "-q")
    base = _commit(tmp_path, {"params.yaml": yaml.safe_dump({"schemes": {"a": {}, "b": {}}}),
                              "src/posenc/model.py": "V = 1\n", "docs/x.md": "x\n"}, "base")
    code = _commit(tmp_path, {"src/posenc/model.py": "V = 2\n"}, "code")
    made = commits.made_at(tmp_path, "params.yaml")
    records = {f"results/runs/{s}.json": json.dumps({"scheme": s, "git": made, "runs": []}) for s in "ab"}
    published = {"git_commit": code, "linked_runs": 4, "code_changed": []}
    results = _commit(tmp_path, {**records, "results/mlflow_study.json": json.dumps(published)}, "results")
    docs = _commit(tmp_path, {"docs/x.md": "y\n"}, "docs")
    return {"root": tmp_path, "base": base, "code": code, "results": results, "docs": docs, "made": made}


def test_a_study_stage_records_the_last_commit_that_changed_the_studys_code(history):
    """``made_at`` at HEAD ``docs``: the commit is ``code`` (the last to change the study's code or
    settings: dvc.yaml's study and fingerprint dependencies and the params file), HEAD is kept
    beside it, and an uncommitted edit of the study's code is named."""
    root = history["root"]
    assert history["made"] == {"commit": history["code"], "head": history["code"], "changed": []}
    made = commits.made_at(root, "params.yaml")
    assert made["commit"] == history["code"] and made["head"] == history["docs"] and made["changed"] == []
    (root / "src/posenc/model.py").write_text("V = 3\n")
    (root / "conf/task").mkdir(parents=True)
    (root / "conf/task/new.yaml").write_text("name: new\n")
    assert commits.made_at(root, "params.yaml")["changed"] == ["conf/task/new.yaml", "src/posenc/model.py"]
    assert commits.made_at(Path("/"), "params.yaml")["commit"] is None  # no checkout: nothing recorded


def test_the_report_credits_the_recorded_commit_never_head(history):
    root = history["root"]
    credit = Study(root).credit
    assert credit.commits == {history["code"]: ["a", "b"]} and credit.shown == f"`{history['code'][:10]}`"
    assert credit.source == "recorded by the study stages, `results/runs/<scheme>.json`" and credit.recorded(history["code"])
    assert commits.credit_problems(root, Study(root), "params.yaml") == []


def test_check_refuses_a_credit_that_cannot_have_made_the_results(history):
    """What a clone's ``dvc repro`` did before (``results/mlflow_study.json`` rewritten to credit
    the clone's HEAD and link no run, the study records untouched), a commit that is not in HEAD's
    history, and a recorded commit that changed none of the study's code: each is a line of
    ``credit_problems``; the committed state before them passes."""
    root = history["root"]
    legacy = {"scheme": "a", "runs": []}  # records older than the `git` field: the publish record's commit counts
    records = {f"results/runs/{s}.json": json.dumps({**legacy, "scheme": s}) for s in "ab"}
    committed = _commit(root, records, "records without their commit")
    head = _commit(root, {"docs/x.md": "later\n"}, "later docs")
    assert commits.credit_problems(root, Study(root), "params.yaml") == []  # publish's record: `code`
    record = root / "results/mlflow_study.json"
    record.write_text(json.dumps({"git_commit": head, "linked_runs": 0}))  # the clone's publish, not committed
    said = commits.credit_problems(root, Study(root), "params.yaml")
    assert len(said) == 2 and "links no training run (linked_runs 0)" in said[0]
    assert f"the credited commit {head[:10]} (a, b) came after {committed[:10]}, the commit of its records" in said[1]

    record.write_text(json.dumps({"git_commit": "0" * 40, "linked_runs": 3}))
    (said,) = commits.credit_problems(root, Study(root), "params.yaml")
    assert "is not an ancestor of HEAD" in said

    docs = _commit(root, {"docs/x.md": "docs only\n", "results/mlflow_study.json": json.dumps(
        {"git_commit": history["code"], "linked_runs": 3})}, "docs only")
    made = {"commit": docs, "head": docs, "changed": []}
    _commit(root, {f"results/runs/{s}.json": json.dumps({"scheme": s, "git": made}) for s in "ab"}, "records")
    (said,) = commits.credit_problems(root, Study(root), "params.yaml")
    assert f"{docs[:10]} (a, b) changed none of the study's code" in said


def test_a_merge_that_brings_the_study_code_is_a_credit_that_can_have_made_the_results(history):
    """A merge commit whose side branch changed the study's code is what ``made_at`` records (git
    lists the merge: its tree differs from each parent's), and ``credit_problems`` accepts it
    (git's diff of a merge is empty without ``-m``: the check read it as a commit that changed
    nothing)."""
    root = history["root"]
    _git(root, "checkout", "-qb", "side")
    _commit(root, {"src/posenc/model.py": "V = 4\n"}, "side: code")
    _git(root, "checkout", "-q", "-")
    _commit(root, {"params.yaml": yaml.safe_dump({"schemes": {"a": {}, "b": {}}, "x": 1})}, "main: settings")
    _git(root, "-c", "user.email=t@t", "-c", "user.name=t", "merge", "-q", "--no-ff", "side", "-m", "merge")
    made = commits.made_at(root, "params.yaml")
    assert made["commit"] == _git(root, "rev-parse", "HEAD")  # the merge itself
    _commit(root, {f"results/runs/{s}.json": json.dumps({"scheme": s, "git": made}) for s in "ab"}, "records")
    assert commits.credit_problems(root, Study(root), "params.yaml") == []


def test_report_check_asks_git_only_where_the_project_is_a_checkout(tmp_path, capsys):
    """A copy of the results (no git) is checked on its rendering alone, and says that the credited
    commits were not checked."""
    assert report.credits(tmp_path) == []
    assert "not the top of a git checkout: the credited commits are not checked" in capsys.readouterr().err


def test_the_committed_studies_credit_commits_that_made_them():
    """What CI checks of the committed results: every study's credited commit is in HEAD's
    history, no later than its records, and its study record links its runs."""
    if commits.git(REPO, "rev-parse", "--show-toplevel") != str(REPO):
        pytest.skip("not a git checkout")
    assert report.credits(REPO) == []


def _publish_project(root: Path, run_there: bool) -> list[str]:
    (root / "params.yaml").write_text("schemes: {a: {}}\n")
    (root / "figures").mkdir()
    (root / "figures/t.md").write_text("| t |\n")
    (root / "results/runs").mkdir(parents=True)
    (root / "results/runs/a.json").write_text(json.dumps({"runs": [{"run_dir": "runs/a/lm-s0"}, {"run_dir": "runs/a/lm-s1"}]}))
    if run_there:
        (root / "runs/a/lm-s0").mkdir(parents=True)
        (root / "runs/a/lm-s0/run.json").write_text("{}")
    return ["--params", "params.yaml", "--runs", "runs", "--records", "results/runs", "--out", "results/mlflow_study.json",
            "figures/t.md"]


def test_publish_keeps_the_committed_record_where_the_runs_are_not(tmp_path, monkeypatch, capsys):
    """A clone has the study's records but not its runs (one of two here): ``publish`` makes no
    MLflow run (no store is created), leaves the committed record byte for byte, and says why;
    with no record to keep, it fails."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSENC_ROOT", str(tmp_path))
    args = _publish_project(tmp_path, run_there=True)
    record = tmp_path / "results/mlflow_study.json"
    record.write_text('{"run_name": "study-1234", "git_commit": "a32a7670a1c6", "linked_runs": 147}\n')
    before = record.read_bytes()
    assert publish.main(args) == 0
    assert record.read_bytes() == before and not (tmp_path / "mlflow.db").exists()
    said = capsys.readouterr().out
    assert "1 of the 2 training runs the study's records name are not here (runs/a/lm-s1, ...)" in said
    assert "Kept results/mlflow_study.json (study run study-1234 of commit a32a7670a1, 147 runs linked" in said
    record.unlink()
    with pytest.raises(SystemExit, match="there is no results/mlflow_study.json to keep"):
        publish.main(args)


def test_publish_depends_on_the_study_records_not_on_the_uncommitted_runs():
    """The stage's dependencies name no uncommitted folder (runs/ is not committed: a clone
    would list the stage, and re-run it), and the record it keeps is ``persist``."""
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["publish"]
    assert "runs" not in stage["deps"] and "results/runs" in stage["deps"] and "--records results/runs" in stage["cmd"]
    (record,) = [o for o in stage["outs"] if isinstance(o, dict) and "results/mlflow_study.json" in o]
    assert record["results/mlflow_study.json"]["persist"] is True
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/x/run.json"], cwd=REPO).returncode == 0
    assert ignored, "runs/ is expected to be left out of git"


def test_status_explains_each_stage_in_its_group(tmp_path):
    """``dvc status``'s entries, explained: a new scheme's study stage is new (not in dvc.lock),
    its heatmaps come from the runs that stage makes, ``publish`` keeps the committed record where
    the runs are not, and a summary's reason names what changed (code, inputs, settings)."""
    pipeline = tmp_path / "dvc.yaml"
    shutil.copy(REPO / "dvc.yaml", pipeline)
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"study@a": {}, "tables": {}}}))
    entries = {"study@b": [{"changed deps": {"src/posenc/model.py": "modified"}}],
               "heatmaps@b": [{"changed deps": {"results/runs/b.json": "deleted"}}],
               "publish": [{"changed deps": {"results/runs": "modified", "params.yaml": "modified"}}],
               "tables": [{"changed deps": {"results/runs": "modified", "pipelines/tables.py": "modified",
                                            "params.yaml": {"schemes": "modified"}}}]}
    lines = {line.stage: line for line in status.explain(pipeline, entries, tmp_path)}
    assert lines["study@b"].group == status.TRAINS and lines["study@b"].why.endswith("new: no entry in dvc.lock yet")
    assert lines["heatmaps@b"].group == status.RUNS and "from the runs study@b makes first" in lines["heatmaps@b"].why
    assert "the runs are not here: it keeps the committed record" in lines["publish"].why
    assert lines["tables"].group == status.SUMMARY and lines["tables"].why == (
        "the LM, MLM and task tables; its code changed: pipelines/tables.py; its inputs changed: results/runs "
        "(modified); its settings changed: schemes")
    assert all(line.pipeline == "default" for line in lines.values())
    text = status.render(list(lines.values()))
    assert text.splitlines()[0] == ("dvc status, a stage a line (4 stages: 1 re-trains, 2 reads the trained runs, "
                                    "1 summaries and bookkeeping; nothing was run)")
    assert status.render([]).startswith("dvc status: every stage of these pipelines is up to date")
