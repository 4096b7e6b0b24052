"""MLflow set-up and queries.

Runs go to an SQLite store (``sqlite:///<abs path>``), never the old
``./mlruns`` file store, with artifacts in a folder beside it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


def sqlite_uri(path: str | Path) -> str:
    """An absolute ``sqlite:///`` URI for a database file."""
    return "sqlite:///" + str(Path(path).expanduser().resolve())


def flatten(d: Mapping, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested mapping -> {"a.b.c": value}; lists become their string form."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key, sep))
        else:
            out[key] = v
    return out


def git_state(root: str | Path) -> dict[str, str]:
    """Commit hash and dirty flag of the checkout at ``root`` ("unknown" outside git)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        return {"git_commit": commit, "git_dirty": str(bool(dirty)).lower()}
    except (OSError, subprocess.CalledProcessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}


def library_versions() -> dict[str, str]:
    """Versions of the libraries a result depends on, as ``version.<name>`` tags."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("posenc", "torch", "lightning", "torchmetrics", "hydra-core", "mlflow", "datasets", "tokenizers"):
        try:
            out[f"version.{name}"] = version(name)
        except PackageNotFoundError:
            out[f"version.{name}"] = "not installed"
    import platform

    out["version.python"] = platform.python_version()
    return out


class CreateExperimentBeforeSweep(Callback):
    """Hydra callback: create the SQLite store and the experiment once, in the
    launching process, before a sweep's jobs start (parallel jobs would
    otherwise race to create the schema and the experiment)."""

    def on_multirun_start(self, config, **kwargs) -> None:
        logger = config.get("logger")
        if logger and str(logger.get("tracking_uri", "")).startswith("sqlite:"):
            ensure_experiment(logger.tracking_uri, logger.experiment_name, logger.get("artifact_location"))


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """Create the experiment if needed; returns its id.

    Processes that start at the same time on a new SQLite store would race to
    create its schema ("duplicate column name"): for an ``sqlite:`` URI the
    first use is serialised by a lock file beside the database.
    """
    import mlflow

    if tracking_uri.startswith("sqlite:///"):
        from filelock import FileLock

        with FileLock(tracking_uri[len("sqlite:///"):] + ".lock"):
            return _ensure_experiment(mlflow.MlflowClient(tracking_uri), name, artifact_location)
    return _ensure_experiment(mlflow.MlflowClient(tracking_uri), name, artifact_location)


#: experiment tag that makes the MLflow 3 UI open the experiment as model training
#: (runs, metrics, artifacts) rather than its GenAI view (traces)
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def _ensure_experiment(client, name: str, artifact_location: str | None):
    import mlflow

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            exp_id = client.create_experiment(name, artifact_location=artifact_location)
        except mlflow.exceptions.MlflowException:  # created meanwhile by another process
            exp_id = client.get_experiment_by_name(name).experiment_id
        exp = client.get_experiment(exp_id)
    if EXPERIMENT_KIND[0] not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


def find_runs(tracking_uri: str, experiment: str, filter_string: str = "") -> list:
    """All runs of an experiment (any status), newest first."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"])


def end_run(tracking_uri: str, run_id: str, status: str = "FAILED") -> None:
    """Mark a run as ended with ``status`` (FAILED, KILLED) when training raises."""
    import mlflow

    mlflow.MlflowClient(tracking_uri).set_terminated(run_id, status)


def log_dataset(client, run_id: str, name: str, meta: Mapping) -> None:
    """Record the corpus as the run's MLflow dataset input (the run list's
    Dataset column): its name, the token checksum as digest, where it was read
    from and its token counts."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag

    source = meta.get("root") or "hub"
    dataset = Dataset(
        name=name, digest=str(meta["tokens_sha256"])[:12], source_type="local" if meta.get("root") else "hub",
        source=json.dumps({"uri": str(source)}),
        profile=json.dumps({"tokens": meta.get("tokens"), "vocab_size": meta.get("vocab_size_actual")}),
    )
    client.log_inputs(run_id, datasets=[DatasetInput(dataset, [InputTag("mlflow.data.context", "training")])])


def ui_url(experiment_id: str, run_id: str | None = None, base: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs table, or a run's page. MLflow 3.17 opens both in its GenAI
    view (traces, evaluations) whatever the experiment's ``mlflow.experimentKind`` tag
    says, unless the URL asks for the model-training view (checked in Chromium:
    ``pipelines/browse.py``)."""
    page = f"{experiment_id}/runs/{run_id}" if run_id else f"{experiment_id}"
    return f"{base}/#/experiments/{page}?workflowType=machine_learning"


def how_to_open(tracking_uri: str, experiment_id: str, run_id: str) -> str:
    """Where to find a run in the MLflow UI: the runs table and the run's own page."""
    server = f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1"
    if not tracking_uri.startswith("sqlite:"):
        server = f"the MLflow server at {tracking_uri}"
    return (f"MLflow run {run_id}: start {server}, then open {ui_url(experiment_id)} (runs table) "
            f"or {ui_url(experiment_id, run_id)} (this run)")
