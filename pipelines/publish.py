"""The study in MLflow: one run holds every figure and table, and every training
run of the study links to it.

    python -m pipelines.publish --params params.yaml --runs runs --out results/mlflow_study.json \\
        figures/extrapolation.png figures/correlations results/lm_table.json ...

The run is named ``study-<first 8 hex digits of sha256(params.yaml)>`` in the
experiment ``--experiment`` (the DVC stage: ``posenc-study``, where the study's training
runs are too) of the project's store (the one training logs to:
``$MLFLOW_TRACKING_URI`` or ``sqlite:///<project root>/mlflow.db``, artifacts
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

The study run is made where the study's runs are. The trained runs (``runs/``) and the
store are not committed, so a clone has neither; what it has is the committed record
(``--out``) of the study run made where they were. Two rules keep a clone from rewriting it:

* The stage depends on the study stages' records (``results/runs/<scheme>.json``, committed:
  each names its runs and changes whenever they are trained again), not on the run folders.
  A dependency on ``runs/`` made every clone's ``dvc status`` list this stage (the folder
  missing) and its ``dvc repro`` re-run it and the report, crediting the clone's HEAD and
  linking no run, and rewrite ``dvc.lock``. Refusing to overwrite the record, the other way
  out, would still have run the stage and rewritten ``dvc.lock`` on every clone; with the
  records as the dependency, a clone's ``dvc repro`` runs nothing.
* When the stage does run without the runs (``--records`` names a run whose folder has no
  ``run.json`` here: a clone where a scheme was added, or ``dvc repro --force``), it says how
  many of the study's runs it cannot see, keeps the record it found (the output is
  ``persist``, so DVC leaves it in place) and makes no MLflow run; with no record to keep, it
  fails.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("pipelines.publish")

EXPERIMENT = "posenc"
#: tag that tells study runs from training runs
KIND_TAG = ("kind", "study")


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


def study_note(params: dict, params_sha: str, git: dict, run_name: str) -> str:
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


def training_runs(runs_dir: Path) -> dict[str, str | None]:
    """{run folder: its MLflow run id} of every training run of the study (``<runs>/<scheme>/<run>``)."""
    from posenc.runs import RunFolder

    return {run.path.as_posix(): run.info().get("mlflow_run_id") for run in RunFolder.under(runs_dir, "*/*")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.publish", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="files and folders to log as artifacts of the study run")
    p.add_argument("--params", default="params.yaml", help="the study's settings (hashed for the run name)")
    p.add_argument("--runs", default="runs", help="training run folders: <runs>/<scheme>/<task>-s<seed>/run.json")
    p.add_argument("--records", default="results/runs",
                   help="the study stages' records (<records>/<scheme>.json): the runs the study is made of")
    p.add_argument("--out", required=True, help="JSON file: run id, experiment id, run name, store")
    p.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI or sqlite:///<project root>/mlflow.db")
    p.add_argument("--experiment", default=EXPERIMENT)
    return p.parse_args(argv)


#: what makes the results besides the data: a change here, not committed, is worth saying
CODE = ("src", "pipelines", "analysis", "conf", "train.py", "params.yaml", "dvc.yaml", "pyproject.toml")


def code_changed(root: Path) -> list[str]:
    """The files of the code and settings (``CODE``) that differ from the commit, which a
    repro's own outputs (results, figures, the lock file, the report) never are."""
    r = subprocess.run(["git", "diff", "--name-only", "HEAD", "--", *CODE], cwd=root, capture_output=True, text=True)
    return r.stdout.split() if r.returncode == 0 else []


def listed(a: argparse.Namespace) -> list[Path]:
    """The paths to publish, each there: the stage lists exactly what it publishes."""
    paths = [Path(x) for x in a.paths]
    absent = [str(x) for x in [Path(a.params), *paths] if not x.exists()]
    if absent:
        raise SystemExit(f"publish: missing {', '.join(absent)} (build it first: dvc repro)")
    return paths


def unseen_runs(records: Path) -> tuple[list[str], int]:
    """(the run folders the study stages' records name that hold no run record here, how many
    they name in all)."""
    import json

    from posenc.runs import RunFolder

    named = [r["run_dir"] for f in sorted(records.glob("*.json")) for r in json.loads(f.read_text()).get("runs", [])]
    return [d for d in named if not RunFolder(d).run_json.is_file()], len(named)


def keep_record(out: Path, unseen: list[str], named: int) -> int:
    """The study's runs are not all here (a clone): keep the record of the study run made where
    they were, and say so; without one, fail."""
    what = f"{len(unseen)} of the {named} training runs the study's records name are not here ({unseen[0]}, ...)"
    if not out.is_file():
        raise SystemExit(f"publish: {what}, and there is no {out} to keep: publish where the study was trained")
    import json

    kept = json.loads(out.read_text())
    print(f"publish: {what}: the trained runs are not committed, so a clone has none. Kept {out} (study run "
          f"{kept.get('run_name')} of commit {str(kept.get('git_commit'))[:10]}, {kept.get('linked_runs')} runs "
          "linked, in the store where they were trained); no MLflow run was made")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    a = parse_args(argv)
    from posenc.files import project_root

    root = project_root()
    paths = listed(a)
    unseen, named = unseen_runs(Path(a.records))
    if unseen:
        return keep_record(Path(a.out), unseen, named)
    runs_dir = Path(a.runs)
    if not runs_dir.is_dir():
        raise SystemExit(f"publish: no run folder {runs_dir} (build it first: dvc repro)")

    import yaml

    from posenc import tracking
    from posenc.evaluate import STEP_TAG
    from posenc.files import write_json

    raw = Path(a.params).read_bytes()
    params_sha = hashlib.sha256(raw).hexdigest()
    params = yaml.safe_load(raw) or {}
    run_name = f"study-{params_sha[:8]}"
    git = tracking.git_state(root)
    uri = a.tracking_uri or tracking.default_tracking_uri(root)
    exp_id = tracking.ensure_experiment(uri, a.experiment, str(root / "mlartifacts"))
    c = tracking.client(uri)

    run_id, reused = tracking.open_run(c, exp_id, run_name, {KIND_TAG[0]: KIND_TAG[1], "params_sha256": params_sha,
                                                             "git_commit": git["git_commit"]})
    if reused:
        log.info("reusing study run %s (%s): same params.yaml and commit", run_name, run_id)
    try:
        tracking.set_tags(c, run_id, {"params_sha256": params_sha, **git,
                                      "mlflow.note.content": study_note(params, params_sha, git, run_name)})
        tracking.log_params(c, run_id, params)
        files = [(p, artifact_dir(p, root)) for p in [Path(a.params), *paths]]
        tracking.log_at(c, run_id, files, replace=reused)
        artifacts = [dest for _, dest in files]
        linked, missing = tracking.link_runs(c, run_id, run_name, training_runs(runs_dir),
                                             {"extrapolation/": STEP_TAG})
        tracking.log_json(c, run_id, {"linked": linked, "not_in_store": missing}, "training_runs.json")
        tracking.set_tags(c, run_id, {"linked_runs": len(linked)})
    except BaseException:
        tracking.end_run(uri, run_id, "FAILED")
        raise
    tracking.end_run(uri, run_id, "FINISHED")
    if missing:
        log.warning("%d training run(s) of %s are not in %s, not linked: %s", len(missing), runs_dir, uri,
                    ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))

    portable = portable_uri(uri, root)
    write_json(a.out, {"run_id": run_id, "experiment_id": exp_id, "experiment": a.experiment, "run_name": run_name,
                       "tracking_uri": portable, "params_sha256": params_sha, "git_commit": git["git_commit"],
                       "code_changed": code_changed(root), "artifacts": artifacts, "linked_runs": len(linked), "missing_runs": len(missing)})
    print(f"study run {run_name} ({len(artifacts)} artifacts, {len(linked)} training runs linked): "
          + tracking.how_to_open(portable, exp_id, run_id, "the study's runs"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
