"""pipelines.publish: the study's figures and tables as artifacts of one MLflow
run, linked from every training run; reused, not duplicated, on a second call."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import mlflow
import pytest

from pipelines import publish
from posenc.evaluate import STEP_TAG, log_to_mlflow
from posenc.tracking import ensure_experiment, sqlite_uri

PARAMS = "data: tinyshakespeare\nmodel: micro\nseeds: \"0 1\"\nlm: {train_len: 64, overrides: \"\"}\n" \
         "schemes:\n  none: {tasks: lm mlm, overrides: \"\", extensions: \"\"}\n"
PATHS = ["figures/extrapolation.png", "figures/lm_table.md", "figures/correlations", "results/lm_table.json"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _store(root: Path, empty_store: Path) -> tuple[str, mlflow.MlflowClient, str]:
    shutil.copy(empty_store, root / "mlflow.db")
    uri = sqlite_uri(root / "mlflow.db")
    return uri, mlflow.MlflowClient(uri), ensure_experiment(uri, "posenc", str(root / "mlartifacts"))


@pytest.fixture
def project(tmp_path, monkeypatch, empty_store):
    """A project root with a few figures and results, and two training runs in its store
    (one causal LM with extrapolation metrics, one masked LM) plus a run folder whose
    MLflow run is not in the store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSENC_ROOT", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _write(tmp_path / "params.yaml", PARAMS)
    _write(tmp_path / "figures/extrapolation.png", "png")
    _write(tmp_path / "figures/lm_table.md", "| scheme |")
    _write(tmp_path / "figures/correlations/none-mlm-s0.png", "png")
    _write(tmp_path / "figures/correlations/overview.png", "png")
    _write(tmp_path / "results/lm_table.json", "{}")
    _, client, exp = _store(tmp_path, empty_store)
    ids = {}
    for task in ("lm", "mlm"):
        run = client.create_run(exp, run_name=f"none-{task}-s0")
        ids[task] = run.info.run_id
        if task == "lm":
            client.log_metric(run.info.run_id, "extrapolation/ppl_nonoverlapping", 9.5, step=128)
        client.set_terminated(run.info.run_id)
        _write(tmp_path / f"runs/none/{task}-s0/run.json", json.dumps({"mlflow_run_id": run.info.run_id}))
    _write(tmp_path / "runs/alibi/lm-s0/run.json", json.dumps({"mlflow_run_id": "0" * 32}))
    return tmp_path, client, exp, ids


def _publish(out: str = "results/mlflow_study.json") -> dict:
    assert publish.main(["--params", "params.yaml", "--runs", "runs", "--out", out, *PATHS]) == 0
    return json.loads(Path(out).read_text())


def _study_runs(client, exp) -> list:
    return client.search_runs([exp], filter_string="tags.kind = 'study'")


def test_publish_logs_artifacts_links_runs_and_reuses_the_run(project, capsys):
    root, client, exp, ids = project
    info = _publish()
    sha = hashlib.sha256((root / "params.yaml").read_bytes()).hexdigest()

    # results/mlflow_study.json: portable, and what the run is
    text = (root / "results/mlflow_study.json").read_text()
    assert str(root) not in text
    assert info["tracking_uri"] == "sqlite:///mlflow.db" and info["experiment_id"] == exp
    assert info["run_name"] == f"study-{sha[:8]}" and info["params_sha256"] == sha
    assert info["linked_runs"] == 2 and info["missing_runs"] == 1
    printed = capsys.readouterr().out
    assert "mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1" in printed
    assert f"http://127.0.0.1:5000/#/experiments/{exp}/runs/{info['run_id']}" in printed
    assert f"http://127.0.0.1:5000/#/experiments/{exp}?workflowType=machine_learning" in printed

    # the study run: tags, params, artifacts at their project paths
    run = client.get_run(info["run_id"])
    assert run.info.run_name == info["run_name"] and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["kind"] == "study" and tags["params_sha256"] == sha and "git_commit" in tags
    assert "dvc repro" in tags["mlflow.note.content"] and info["run_name"] in tags["mlflow.note.content"]
    assert run.data.params["lm.train_len"] == "64" and run.data.params["schemes.none.tasks"] == "lm mlm"
    top = {a.path: a.is_dir for a in client.list_artifacts(info["run_id"])}
    assert top == {"figures": True, "results": True, "params.yaml": False, "training_runs.json": False}
    listing = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/training_runs.json")
    assert listing == {"linked": {"runs/none/lm-s0": ids["lm"], "runs/none/mlm-s0": ids["mlm"]},
                       "not_in_store": ["runs/alibi/lm-s0"]}
    figures = {a.path: a.is_dir for a in client.list_artifacts(info["run_id"], "figures")}
    assert figures == {"figures/extrapolation.png": False, "figures/lm_table.md": False, "figures/correlations": True}
    heatmaps = {a.path for a in client.list_artifacts(info["run_id"], "figures/correlations")}
    assert heatmaps == {"figures/correlations/none-mlm-s0.png", "figures/correlations/overview.png"}
    assert [a.path for a in client.list_artifacts(info["run_id"], "results")] == ["results/lm_table.json"]

    # training runs link to it; the extrapolation step is stated where there are such metrics
    for task, rid in ids.items():
        t = client.get_run(rid).data.tags
        assert t["study_run_id"] == info["run_id"] and t["study_run_name"] == info["run_name"]
        assert (STEP_TAG[0] in t) == (task == "lm")

    # a second publication (same params.yaml, same commit) reuses the run and replaces
    # a folder's content: a heatmap that is gone is gone from MLflow too; a re-run
    # training run replaces the old one among the linked runs
    (root / "figures/correlations/none-mlm-s0.png").unlink()
    _write(root / "figures/correlations/alibi-mlm-s0.png", "png")
    rerun = client.create_run(exp, run_name="none-mlm-s0").info.run_id
    _write(root / "runs/none/mlm-s0/run.json", json.dumps({"mlflow_run_id": rerun}))
    again = _publish()
    assert again["run_id"] == info["run_id"] and again["linked_runs"] == 2
    assert client.get_run(rerun).data.tags["study_run_id"] == info["run_id"]
    assert "study_run_id" not in client.get_run(ids["mlm"]).data.tags
    assert len(_study_runs(client, exp)) == 1
    heatmaps = {a.path for a in client.list_artifacts(info["run_id"], "figures/correlations")}
    assert heatmaps == {"figures/correlations/alibi-mlm-s0.png", "figures/correlations/overview.png"}
    assert client.get_run(info["run_id"]).info.status == "FINISHED"

    # other settings: another study run, and the training runs point at it
    (root / "params.yaml").write_text(PARAMS + "workers: 1\n")
    other = _publish()
    assert other["run_id"] != info["run_id"] and other["run_name"] != info["run_name"]
    assert len(_study_runs(client, exp)) == 2
    assert client.get_run(ids["lm"]).data.tags["study_run_id"] == other["run_id"]


def test_a_missing_path_fails_before_any_run(project):
    root, client, exp, _ = project
    (root / "figures/lm_table.md").unlink()
    with pytest.raises(SystemExit, match="missing figures/lm_table.md"):
        publish.main(["--out", "results/mlflow_study.json", *PATHS])
    assert _study_runs(client, exp) == [] and not (root / "results/mlflow_study.json").exists()


def test_portable_uri(tmp_path):
    assert publish.portable_uri(sqlite_uri(tmp_path / "mlflow.db"), tmp_path.resolve()) == "sqlite:///mlflow.db"
    assert publish.portable_uri("http://127.0.0.1:5000", tmp_path) == "http://127.0.0.1:5000"


def test_extrapolation_metrics_state_their_step(tmp_path, empty_store):
    uri, client, exp = _store(tmp_path, empty_store)
    rid = client.create_run(exp).info.run_id
    log_to_mlflow([{"method": "nonoverlapping", "eval_len": 128, "ppl": 9.5}], rid, uri)
    run = client.get_run(rid)
    assert run.data.tags[STEP_TAG[0]] == STEP_TAG[1]
    assert [m.step for m in client.get_metric_history(rid, "extrapolation/ppl_nonoverlapping")] == [128]
