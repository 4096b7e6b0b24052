"""Every MLflow read and write of posenc: the store, experiments, runs, params, tags,
metrics, artifacts, and the line that says how to open a run.

Runs go to an SQLite store (``sqlite:///<abs path>``), never the old
``./mlruns`` file store, with artifacts in a folder beside it. Lightning's
``MLFlowLogger`` logs the training curves; everything else goes through here.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from .files import project_root


def sqlite_uri(path: str | Path) -> str:
    """An absolute ``sqlite:///`` URI for a database file."""
    return "sqlite:///" + str(Path(path).expanduser().resolve())


def default_tracking_uri(root: str | Path | None = None) -> str:
    """``MLFLOW_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db`` (root: ``project_root()``),
    the store training logs to with the default ``logger`` config."""
    return os.environ.get("MLFLOW_TRACKING_URI") or sqlite_uri(Path(root or project_root()) / "mlflow.db")


def client(tracking_uri: str):
    """An ``MlflowClient`` of the store."""
    import mlflow

    return mlflow.MlflowClient(tracking_uri)


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


def compare_url(run_ids: Sequence[str], experiment_ids: Sequence[str], base: str = "http://127.0.0.1:5000") -> str:
    """MLflow's compare view of ``run_ids`` (their params and metrics side by side, and plots):
    the route MLflow 3.17's UI builds itself (``getCompareRunPageRoute``: JSON lists of run and
    experiment ids), quoted for a terminal."""
    import json
    from urllib.parse import quote

    lists = (json.dumps(list(run_ids), separators=(",", ":")), json.dumps(list(experiment_ids), separators=(",", ":")))
    return f"{base}/#/compare-runs?runs={quote(lists[0])}&experiments={quote(lists[1])}"


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """Create the experiment if needed; returns its id.

    Processes that start at the same time on a new SQLite store would race to
    create its schema ("duplicate column name"): for an ``sqlite:`` URI the
    first use is serialised by a lock file beside the database. Through a
    tracking server (``http://``), where no lock file is shared, two jobs may
    create or tag the experiment together: the loser of the creation reads what
    the winner made, and the tag is written again (``shared_write``).
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
        shared_write(client.set_experiment_tag, exp.experiment_id, *EXPERIMENT_KIND)
    return exp.experiment_id


def shared_write(call, *args, tries: int = 3, **kwargs):
    """``call(*args, **kwargs)``, a write of a row that many jobs may write at once: an
    experiment's tag, a dataset that every run of a corpus logs. Through a tracking server of
    several workers, two jobs that insert the same row together make the loser's request
    fail with an integrity error (seen with 8 runs at once: ``tests/test_reliability.py``);
    the row is there by then, so the call is made again, ``tries`` times in all."""
    import mlflow

    for attempt in range(tries):
        try:
            return call(*args, **kwargs)
        except mlflow.exceptions.MlflowException:
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def runs_of(tracking_uri: str, experiment: str, filter_string: str = "") -> list:
    """All runs of an experiment (any status), newest first; [] when there is no such experiment."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    return c.search_runs([exp.experiment_id], filter_string=filter_string, order_by=["attributes.start_time DESC"])


def newest_run(c, experiment_id: str, tags: Mapping[str, str]):
    """The newest run of an experiment with all these tags, or None (``c``: a ``client``)."""
    where = " AND ".join(f"tags.{k} = '{v}'" for k, v in tags.items())
    runs = c.search_runs([experiment_id], filter_string=where, order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def open_run(c, experiment_id: str, run_name: str, tags: Mapping[str, str]) -> tuple[str, bool]:
    """(run id, reused): the newest run of the experiment with all ``tags``, set running
    again, or a new run named ``run_name`` with those tags."""
    existing = newest_run(c, experiment_id, tags)
    if existing is not None:
        c.update_run(existing.info.run_id, status="RUNNING")
        return existing.info.run_id, True
    return c.create_run(experiment_id, run_name=run_name, tags=dict(tags)).info.run_id, False


def log_json(c, run_id: str, obj: Any, name: str) -> None:
    """``obj`` as the JSON artifact ``name``."""
    c.log_dict(run_id, obj, name)


def run_or_none(c, run_id: str | None):
    """The run, or None when the store does not hold it."""
    import mlflow

    if not run_id:
        return None
    try:
        return c.get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None


def log_params(c, run_id: str, params: Mapping) -> None:
    """A nested mapping flattened to MLflow params ("a.b.c"), values cut at 6000
    characters, 100 per call (what ``log_batch`` takes). Re-logging the same values is allowed."""
    from mlflow.entities import Param

    flat = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
    for i in range(0, len(flat), 100):
        c.log_batch(run_id, params=flat[i:i + 100])


def log_tags(c, run_id: str, tags: Mapping[str, Any]) -> None:
    """Tags (values as strings) in one transaction."""
    from mlflow.entities import RunTag

    c.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def set_tags(c, run_id: str, tags: Mapping[str, Any]) -> None:
    """Tags (values as strings) one by one, in order."""
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


def log_curves(c, run_id: str, curves: Mapping[str, Sequence[tuple[int, float]]]) -> None:
    """Metrics as curves of (step, value) points (step: an evaluation length), only the
    points the run does not hold yet: evaluating a run again gives the same values, and
    MLflow keeps every point it is given, so re-logging would draw each step twice."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    held = {key: {(m.step, m.value) for m in c.get_metric_history(run_id, key)} for key in curves}
    c.log_batch(run_id, metrics=[Metric(key, float(v), now, int(step)) for key, points in curves.items()
                                 for step, v in points if (int(step), float(v)) not in held[key]])


def log_files(c, run_id: str, files: Sequence[str | Path], artifact_path: str | None = None) -> None:
    """Files as artifacts of the run, under ``artifact_path``."""
    for f in files:
        c.log_artifact(run_id, str(f), artifact_path=artifact_path)


def log_at(c, run_id: str, files: Sequence[tuple[Path, str]], replace: bool = False) -> None:
    """Files or folders at the artifact paths given (a file's path names the file, a
    folder's the folder); with ``replace``, what an earlier logging put at each path is
    removed first (a folder may have lost files since), where the store can delete."""
    import logging

    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(c.get_run(run_id).info.artifact_uri) if replace else None
    for path, dest in files:
        if repo is not None:
            try:
                repo.delete_artifacts(dest)
            except (NotImplementedError, OSError) as e:  # some stores cannot delete
                logging.getLogger(__name__).warning(
                    "could not replace the artifact %s of run %s (%s): logging over it", dest, run_id, e)
        if Path(path).is_dir():
            c.log_artifacts(run_id, str(path), artifact_path=dest)
        else:
            parent = Path(dest).parent.as_posix()
            c.log_artifact(run_id, str(path), artifact_path=None if parent == "." else parent)


def link_runs(c, study_run_id: str, study_run_name: str, runs: Mapping[str, str | None],
              tags_if: Mapping[str, tuple[str, str]] = ()) -> tuple[dict[str, str], list[str]]:
    """Tag every run of ``runs`` ({folder: run id}) with the study run (``study_run_id``,
    ``study_run_name``), and a run that holds a metric starting with a key of
    ``tags_if`` with that entry's tag when it lacks it; untag runs that pointed at the
    study run but are no longer among ``runs`` (a scheme re-run). Returns ({folder: run
    id} linked, [folders whose run is not in the store])."""
    linked, missing = {}, []
    for folder, rid in runs.items():
        run = run_or_none(c, rid)
        if run is None:
            missing.append(folder)
            continue
        c.set_tag(rid, "study_run_id", study_run_id)
        c.set_tag(rid, "study_run_name", study_run_name)
        for prefix, (key, value) in dict(tags_if).items():
            if any(k.startswith(prefix) for k in run.data.metrics) and key not in run.data.tags:
                c.set_tag(rid, key, value)
        linked[folder] = rid
    stale = c.search_runs([c.get_run(study_run_id).info.experiment_id],
                          filter_string=f"tags.study_run_id = '{study_run_id}'", max_results=50000)
    for run in stale:
        if run.info.run_id not in linked.values():
            c.delete_tag(run.info.run_id, "study_run_id")
            c.delete_tag(run.info.run_id, "study_run_name")
    return linked, missing


def artifact_names(tracking_uri: str, run_id: str, folder: str) -> list[str]:
    """The names of the files a run logged under the artifact folder ``folder``; a run id the
    tracking server does not know raises FileNotFoundError."""
    import mlflow

    try:
        return [Path(a.path).name for a in client(tracking_uri).list_artifacts(run_id, folder)]
    except mlflow.exceptions.MlflowException as e:
        raise FileNotFoundError(
            f"{run_id!r} is neither a checkpoint file, a run folder, nor an MLflow run in {tracking_uri} ({e})"
        ) from e


def download_artifact(tracking_uri: str, run_id: str, path: str, dst: str | Path) -> Path:
    """The run's artifact ``path``, downloaded into the folder ``dst``."""
    Path(dst).mkdir(parents=True, exist_ok=True)
    return Path(client(tracking_uri).download_artifacts(run_id, path, str(dst)))


def end_run(tracking_uri: str, run_id: str, status: str = "FAILED") -> None:
    """Mark a run as ended with ``status`` (FINISHED, FAILED, KILLED)."""
    client(tracking_uri).set_terminated(run_id, status)


def log_dataset(c, run_id: str, name: str, meta: Mapping) -> None:
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
    shared_write(c.log_inputs, run_id, datasets=[DatasetInput(dataset, [InputTag("mlflow.data.context", "training")])])


def ui_url(experiment_id: str, run_id: str | None = None, base: str = "http://127.0.0.1:5000") -> str:
    """The experiment's runs table, or a run's page. MLflow 3.17 opens both in its GenAI
    view (traces, evaluations) whatever the experiment's ``mlflow.experimentKind`` tag
    says, unless the URL asks for the model-training view (checked in Chromium:
    ``pipelines/browse.py``)."""
    page = f"{experiment_id}/runs/{run_id}" if run_id else f"{experiment_id}"
    return f"{base}/#/experiments/{page}?workflowType=machine_learning"


def how_to_open(tracking_uri: str, experiment_id: str, run_id: str, table: str = "runs table") -> str:
    """Where to find a run in the MLflow UI: the server to start, the runs table and the run's own page."""
    server = f"mlflow ui --backend-store-uri {tracking_uri} --host 127.0.0.1"
    if not tracking_uri.startswith("sqlite:"):
        server = f"the MLflow server at {tracking_uri}"
    return f"start {server}, then open {ui_url(experiment_id)} ({table}) or {ui_url(experiment_id, run_id)} (this run)"
