"""The study in MLflow: one run holds every figure and table, and every training
run of the study links to it.

    python -m pipelines.publish --params params.yaml --runs runs --out results/mlflow_study.json \\
        figures/extrapolation.png figures/correlations results/lm_table.json ...

The run is named ``study-<first 8 hex digits of sha256(params.yaml)>`` in the
experiment ``--experiment`` (the DVC stage: ``posenc-study``, where the study's training
runs are too) of the project's store (the one training logs to:
``$MLFLOW_TRACKING_URI`` or ``sqlite:///<POSENC_ROOT or .>/mlflow.db``, artifacts
in ``mlartifacts/`` beside it). Its tags: ``kind=study``, ``params_sha256``, the
git commit and dirty flag of the checkout, and a description
(``mlflow.note.content``). Its params: params.yaml flattened. Its artifacts: every
path given, at its place in the project (``figures/...``, ``results/...``), plus
params.yaml itself. A run with the same params hash and commit is reused, its
listed artifacts replaced, rather than a second one made.

Every training run of the study (``<runs>/<scheme>/<task>-s<seed>/run.json``
names its MLflow run) gets the tags ``study_run_id`` and ``study_run_name``; runs
with extrapolation metrics also get ``extrapolation.step`` (their step is the
evaluation length in tokens) where they lack it. A run that pointed at the
study run but is no longer in ``<runs>`` (its scheme was re-run) loses those
tags. The artifact ``training_runs.json`` maps each run folder to its run id.
Training runs missing from the store (a ``runs/`` folder restored without its
``mlflow.db``) are named in a warning and counted, not fatal.

Writes ``--out`` (run id, experiment id, run name, tracking URI relative to the
project root, counts) and prints how to open the run. A listed path that does
not exist is an error: the stage lists exactly what it publishes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("pipelines.publish")

EXPERIMENT = "posenc"
#: tag that tells study runs from training runs
KIND_TAG = ("kind", "study")


def project_root() -> Path:
    return Path(os.environ.get("POSENC_ROOT", ".")).expanduser().resolve()


def default_tracking_uri(root: Path) -> str:
    """The store training logs to (``posenc.evaluate.default_tracking_uri``, without importing torch)."""
    from posenc.tracking import sqlite_uri

    return os.environ.get("MLFLOW_TRACKING_URI") or sqlite_uri(root / "mlflow.db")


def portable_uri(uri: str, root: Path) -> str:
    """``sqlite:///<root>/mlflow.db`` -> ``sqlite:///mlflow.db`` (relative to the project root)."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return uri
    path = Path(uri[len(prefix):])
    if not path.is_absolute():
        return uri
    return prefix + Path(os.path.relpath(path, root)).as_posix()


def artifact_dir(path: Path, root: Path) -> str:
    """Where ``path`` goes among the run's artifacts: its place in the project."""
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.name


def describe(params: dict, params_sha: str, git: dict, run_name: str) -> str:
    """The study run's note (Markdown): what the study is and how to rebuild it."""
    schemes = params.get("schemes")
    what = "Positional-encoding study"
    if isinstance(schemes, dict):
        what += f" of {len(schemes)} schemes ({', '.join(map(str, schemes))})"
    bits = [f"{k} {params[k]}" for k in ("data", "model", "seeds") if k in params]
    if bits:
        what += ": " + ", ".join(bits)
    commit = git.get("git_commit", "unknown")
    dirty = " (with uncommitted changes)" if git.get("git_dirty") == "true" else ""
    return (
        f"{what}.\n\n"
        f"Every figure and table of `dvc repro` (artifacts `figures/`, `results/`) for params.yaml "
        f"sha256 `{params_sha[:12]}…` at commit `{commit}`{dirty}.\n\n"
        f"Reproduce: `git checkout {commit[:12]} && dvc repro` (params.yaml is an artifact of this run).\n\n"
        f"The study's training runs carry the tag `study_run_name = {run_name}`: "
        f"filter the run list with `tags.study_run_name = '{run_name}'`. Their "
        f"`extrapolation/ppl_*` metrics use step = evaluation length in tokens."
    )


def find_study_run(client, experiment_id: str, params_sha: str, commit: str):
    """The newest study run with this params hash and commit, or None."""
    runs = client.search_runs(
        [experiment_id],
        filter_string=(f"tags.{KIND_TAG[0]} = '{KIND_TAG[1]}' AND tags.params_sha256 = '{params_sha}' "
                       f"AND tags.git_commit = '{commit}'"),
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    return runs[0] if runs else None


def log_params(client, run_id: str, params: dict) -> None:
    """params.yaml flattened as MLflow params (same hash, same values: re-logging is allowed)."""
    from mlflow.entities import Param

    from posenc.tracking import flatten

    flat = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
    for i in range(0, len(flat), 100):  # log_batch takes at most 100 params at once
        client.log_batch(run_id, params=flat[i:i + 100])


def publish_artifacts(client, run_id: str, paths: list[Path], root: Path, replace: bool) -> list[str]:
    """Log files and folders at their project paths; with ``replace``, drop what a
    previous publication put there first (a folder may have lost files)."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(client.get_run(run_id).info.artifact_uri) if replace else None
    done = []
    for p in paths:
        dest = artifact_dir(p, root)
        if repo is not None:
            try:
                repo.delete_artifacts(dest)
            except (NotImplementedError, OSError) as e:  # some stores cannot delete
                log.warning("could not replace the artifact %s of run %s (%s): logging over it", dest, run_id, e)
        if p.is_dir():
            client.log_artifacts(run_id, str(p), artifact_path=dest)
        else:
            parent = str(Path(dest).parent.as_posix())
            client.log_artifact(run_id, str(p), artifact_path=None if parent == "." else parent)
        done.append(dest)
    return done


def link_training_runs(client, runs_dir: Path, run_id: str, run_name: str) -> tuple[dict[str, str], list[str]]:
    """Tag every training run under ``runs_dir`` with the study run, and untag runs
    that pointed at it but are no longer the study's (a re-run scheme); returns
    ({run folder: run id} linked, [run folders whose run is not in the store])."""
    import mlflow

    from posenc.evaluate import STEP_TAG

    linked, missing = {}, []
    for meta in sorted(runs_dir.glob("*/*/run.json")):
        folder = meta.parent.as_posix()
        rid = json.loads(meta.read_text()).get("mlflow_run_id")
        try:
            run = client.get_run(rid) if rid else None
        except mlflow.exceptions.MlflowException:
            run = None
        if run is None:
            missing.append(folder)
            continue
        client.set_tag(rid, "study_run_id", run_id)
        client.set_tag(rid, "study_run_name", run_name)
        has_extrapolation = any(k.startswith("extrapolation/") for k in run.data.metrics)
        if has_extrapolation and STEP_TAG[0] not in run.data.tags:
            client.set_tag(rid, *STEP_TAG)
        linked[folder] = rid
    stale = client.search_runs([client.get_run(run_id).info.experiment_id],
                               filter_string=f"tags.study_run_id = '{run_id}'", max_results=50000)
    for run in stale:
        if run.info.run_id not in linked.values():
            client.delete_tag(run.info.run_id, "study_run_id")
            client.delete_tag(run.info.run_id, "study_run_name")
    return linked, missing


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.publish", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="files and folders to log as artifacts of the study run")
    p.add_argument("--params", default="params.yaml", help="the study's settings (hashed for the run name)")
    p.add_argument("--runs", default="runs", help="training run folders: <runs>/<scheme>/<task>-s<seed>/run.json")
    p.add_argument("--out", required=True, help="JSON file: run id, experiment id, run name, store")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI or sqlite:///<project root>/mlflow.db")
    p.add_argument("--experiment", default=EXPERIMENT)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    a = parse_args(argv)
    root = project_root()
    paths = [Path(x) for x in a.paths]
    absent = [str(x) for x in [Path(a.params), *paths] if not x.exists()]
    if absent:
        raise SystemExit(f"publish: missing {', '.join(absent)} (build it first: dvc repro)")
    runs_dir = Path(a.runs)
    if not runs_dir.is_dir():
        raise SystemExit(f"publish: no run folder {runs_dir} (build it first: dvc repro)")

    import mlflow
    import yaml

    from posenc.files import write_json
    from posenc.tracking import ensure_experiment, git_state, ui_url

    raw = Path(a.params).read_bytes()
    params_sha = hashlib.sha256(raw).hexdigest()
    params = yaml.safe_load(raw) or {}
    run_name = f"study-{params_sha[:8]}"
    git = git_state(root)
    uri = a.tracking_uri or default_tracking_uri(root)
    exp_id = ensure_experiment(uri, a.experiment, str(root / "mlartifacts"))
    client = mlflow.MlflowClient(uri)

    existing = find_study_run(client, exp_id, params_sha, git["git_commit"])
    if existing is not None:
        run_id = existing.info.run_id
        client.update_run(run_id, status="RUNNING")
        log.info("reusing study run %s (%s): same params.yaml and commit", run_name, run_id)
    else:
        run = client.create_run(exp_id, run_name=run_name, tags={KIND_TAG[0]: KIND_TAG[1]})
        run_id = run.info.run_id
    try:
        for k, v in {"params_sha256": params_sha, **git,
                     "mlflow.note.content": describe(params, params_sha, git, run_name)}.items():
            client.set_tag(run_id, k, v)
        log_params(client, run_id, params)
        artifacts = publish_artifacts(client, run_id, [Path(a.params), *paths], root, replace=existing is not None)
        linked, missing = link_training_runs(client, runs_dir, run_id, run_name)
        client.log_dict(run_id, {"linked": linked, "not_in_store": missing}, "training_runs.json")
        client.set_tag(run_id, "linked_runs", str(len(linked)))
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    client.set_terminated(run_id, "FINISHED")
    if missing:
        log.warning("%d training run(s) of %s are not in %s, not linked: %s", len(missing), runs_dir, uri,
                    ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))

    portable = portable_uri(uri, root)
    write_json(a.out, {"run_id": run_id, "experiment_id": exp_id, "experiment": a.experiment, "run_name": run_name,
                       "tracking_uri": portable, "params_sha256": params_sha, "git_commit": git["git_commit"],
                       "artifacts": artifacts, "linked_runs": len(linked), "missing_runs": len(missing)})
    server = (f"mlflow ui --backend-store-uri {portable} --host 127.0.0.1" if portable.startswith("sqlite:")
              else f"the MLflow server at {portable}")
    print(f"study run {run_name} ({len(artifacts)} artifacts, {len(linked)} training runs linked): start "
          f"{server}, then open {ui_url(exp_id)} (the study's runs) or {ui_url(exp_id, run_id)} (this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
