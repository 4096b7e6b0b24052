"""Every stale study stage of a pipeline at once: all their jobs on one executor together.

    python -m pipelines.fanout                      # the default study (dvc.yaml)
    python -m pipelines.fanout head64 --executor slurm
    python -m pipelines.fanout --dry-run            # what would run, a stage a line; writes nothing
    dvc repro                                       # then: the summaries alone

``dvc repro`` runs one stage at a time, and a study stage holds one scheme's runs: on a
cluster, a study of 16 schemes waits for each scheme's slowest run in turn while most
GPUs idle. This command reads the pipeline (``dvc.yaml``, the path of one, or a profile's
name: its ``dvc.yaml``, written first as ``pipelines.profile`` writes it), brings the
stages the studies depend on up to date (``dvc repro`` of ``prepare`` and
``fingerprint``), asks ``dvc status`` which study stages are stale
(a scheme added or edited: that scheme's stage alone; the shared code edited: all of
them), and hands every job of every stale stage to one executor (``--executor``, as
for ``pipelines.study``): a job starts when a worker, a device or a job slot is free,
whichever stage it belongs to, a stage's follow-ups (retrieval grids) ahead of the runs
still waiting, so that stages end one after another (``pipelines.study.Queue``).

``--dry-run`` runs nothing and writes nothing (not the profile's pipeline, not ``dvc.lock``, not
a fingerprint): it asks ``dvc status`` and the fingerprints' plan (``pipelines.fingerprint.plan``,
for a scheme added or edited, which ``dvc status`` sees only once the fingerprint stage has run)
and prints a line for each stage it would run, as ``python -m pipelines.status`` explains them,
and the stages ``dvc repro`` would run after it.

Each stage is what its command in the pipeline says (its scheme, tasks, extensions,
overrides, runs folder and results folder are read from it, so nothing can differ
from ``dvc repro``), planned, checked and written by the same code as the stage run
alone (``pipelines.study``). As the last job of a stage is in, the stage writes its
results and its time record (``results/times/study@<scheme>.json``: from the submission
of its first job to its end; stages overlap a little, where one's first runs start beside
the last of the one before), and ``dvc commit`` records them in ``dvc.lock``, so
``dvc status`` lists it no more and a later ``dvc repro`` runs only the summaries. A
stage whose scheme refuses a task, or whose job fails, writes nothing and is recorded
nowhere (DVC keeps its committed results); the others go on, and this command exits
non-zero naming each failure. Ctrl-C stops every job; no stage unfinished by then is
written.

The results are those of ``dvc repro``, bit for bit but for the MLflow ids, paths and
seconds: ``tests/test_fanout.py`` runs a reduced study both ways.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipelines import executors, profile, study
from pipelines.timed import write_record
from posenc.errors import ConfigError

STUDY = ["python", "-m", "pipelines.study"]
TIMED = ["python", "-m", "pipelines.timed"]


def pipeline_file(spec: str, write: bool = True) -> Path:
    """``dvc.yaml``, the path of a dvc.yaml, or a profile's name: its ``profiles/<name>/dvc.yaml``,
    written first from the project's as ``python -m pipelines.profile <name>`` writes it (without
    ``write``, said and left as it is)."""
    path = Path(spec)
    if path.name != "dvc.yaml" and spec in profile.profiles():
        path = Path("profiles") / spec / "dvc.yaml"
        text = profile.render(spec)
        if not path.exists() or path.read_text() != text:
            if write:
                path.write_text(text)
                print(f"wrote {path}")
            elif path.exists():
                print(f"{path} is not the one dvc.yaml makes: the fan-out would write it first (planned here from "
                      "the one on disk)")
            else:
                raise ConfigError(f"{path} does not exist yet, and a dry run writes nothing: `python -m "
                                  f"pipelines.profile {spec} --write` writes it, then a dry run plans it")
    if not path.is_file():
        raise ConfigError(f"no pipeline {spec!r}: give dvc.yaml, a profile ({', '.join(profile.profiles())}) or the "
                          "path of a dvc.yaml")
    return path


def study_args(cmd: str) -> tuple[str, list[str]]:
    """(the time record's path, the study's arguments) of a study stage's command
    (``python -m pipelines.timed <record> python -m pipelines.study <args>``)."""
    words = shlex.split(cmd)
    if words[:3] != TIMED or words[4:7] != STUDY:
        raise ConfigError(f"not a study stage's command: {cmd[:120]}")
    return words[3], words[7:]


def dvc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dvc", *args], capture_output=True, text=True, check=False)


def study_stages(pipeline: Path) -> tuple[list, list[str]]:
    """The pipeline's study stages, and the addresses of the stages upstream of them
    (``prepare``, ``fingerprint``)."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(".") as repo:
        stages = [s for s in repo.stage.collect(str(pipeline)) if " ".join(STUDY) in (s.cmd or "")]
        upstream = sorted({u.addressing for s in stages for u in nx.descendants(repo.index.graph, s)} -
                          {s.addressing for s in stages})
    return stages, upstream


def stale_studies(pipeline: Path) -> list:
    """The pipeline's study stages that ``dvc status`` lists, after the stages upstream of them
    (``prepare``, ``fingerprint``) were brought up to date."""
    import json

    stages, upstream = study_stages(pipeline)
    if upstream:
        out = dvc("repro", *upstream)
        if out.returncode != 0:
            raise ConfigError(f"dvc repro {' '.join(upstream)} failed: {out.stderr.strip()[-1500:]}")
    out = dvc("status", "--json", *[s.addressing for s in stages])
    if out.returncode != 0:
        raise ConfigError(f"dvc status failed: {out.stderr.strip()[-1500:]}")
    listed = set(json.loads(out.stdout or "{}"))
    return [s for s in stages if s.addressing in listed]


class Fanned:
    """One stale study stage in the fan-out: its address, its time record, its parsed study
    arguments and, once started, its ``pipelines.study.Stage``."""

    def __init__(self, stage):
        self.address = stage.addressing
        self.record, args = study_args(stage.cmd)
        self.a = study.parse_args([*args, "--executor", "pool"])  # its executor is the fan-out's
        self.jobs = study.plan(self.a)
        self.stage: study.Stage | None = None


def run_together(fanned: list[Fanned], ex, failed: list[str]) -> None:
    """Every job of the stages ``fanned`` on ``ex`` through one queue; a stage that its scheme
    refuses is left out, and each stage is written and recorded as it ends (``record``).
    Failures are added to ``failed``, one line each."""
    queue = study.Queue(ex)
    with ex:
        ready = []
        for f in fanned:
            refused = study.admit(f.a, ex)
            if refused:
                failed.extend(f"{f.address}: {why}" for why in refused)
                continue
            shutil.rmtree(f.a.runs_dir, ignore_errors=True)  # the stage's own runs folder, as the stage does
            ready.append(f)
        ex.clear()
        for f in ready:
            f.stage = study.Stage(f.a, ex, len(f.jobs))
            f.stage.start(f.jobs, queue)
        queue.run(on_end=lambda stage: record(next(f for f in ready if f.stage is stage), queue, ex, failed))


def record(f: Fanned, queue: study.Queue, ex, failed: list[str]) -> None:
    """A stage whose last job is in: its results, its time record (from its turn in the queue to
    now) and its entry in dvc.lock (``dvc commit``); nothing when one of its jobs failed."""
    if f.stage.failed:
        failed.extend(f"{f.address}: {why}" for why in f.stage.failed)
        print(f"{f.address}: FAILED, nothing written", flush=True)
        return
    begun = queue.begun[f.stage]
    study.write(f.a, f.stage.done, ex.record(), t0=begun)
    write_record(Path(f.record), begun, time.time())  # after the runs file: its wall time falls within
    out = dvc("commit", "--force", f.address)
    if out.returncode != 0:
        failed.append(f"{f.address}: written, but dvc commit failed: {out.stderr.strip()[-500:]}")
    else:
        print(f"{f.address}: written and recorded in its dvc.lock", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.fanout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipeline", nargs="?", default="dvc.yaml", help="dvc.yaml (default), a profile's name, or a path")
    p.add_argument("--executor", default=None,
                   help=f"where the jobs run: a preset of conf/executor ({', '.join(executors.presets())}) or your "
                   f"own .yaml (default: ${executors.ENV}, else pool)")
    p.add_argument("--workers", type=int, default=None,
                   help="jobs at once on a pool (default: the stages' --workers); a GPU pool takes one per device")
    p.add_argument("--dry-run", action="store_true", help="say which stages are stale and their jobs; run nothing")
    a = p.parse_args(argv)
    if a.workers is not None and a.workers < 1:
        p.error("--workers must be at least 1")
    return a


def dry_run(pipeline: Path) -> int:
    """What the fan-out would run, and ``dvc repro`` after it, a stage a line; runs and writes
    nothing (``pipelines.status`` explains each stage)."""
    from pipelines import status

    stages, upstream = study_stages(pipeline)
    by_address = {s.addressing: s for s in stages}
    lines = status.collect([Path(pipeline).resolve()], Path.cwd().resolve())
    name = lambda line: line.stage if line.pipeline == "default" else f"{pipeline}:{line.stage}"  # noqa: E731
    order = list(by_address)
    training = sorted((line for line in lines if name(line) in by_address), key=lambda line: order.index(name(line)))
    first = [line for line in lines if line.stage in {u.rpartition(":")[2] for u in upstream}]
    fanned = [Fanned(by_address[name(line)]) for line in training]
    print(f"{pipeline}, a dry run: nothing is run or written")
    for line in first:
        print(f"{line}  [the fan-out runs it first]")
    for line, f in zip(training, fanned):
        print(f"{line}  [{len(f.jobs)} runs]")
    report(pipeline, fanned)
    after = [line.stage for line in lines if line not in training and line not in first]
    if after:
        print(f"then `dvc repro {pipeline}` runs {len(after)} stage(s): {', '.join(after)}")
    return 0


def report(pipeline: Path, fanned: list[Fanned]) -> None:
    """The stale study stages in one line: how many, and their runs."""
    if not fanned:
        print(f"{pipeline}: no study stage is stale: nothing to train")
        return
    jobs = sum(len(f.jobs) for f in fanned)
    print(f"{pipeline}: {len(fanned)} stale study stage(s), {jobs} runs: "
          + ", ".join(f"{f.address} ({len(f.jobs)})" for f in fanned), flush=True)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        pipeline = pipeline_file(a.pipeline, write=not a.dry_run)
        setting = executors.settings(a.executor)
        if a.dry_run:
            return dry_run(pipeline)
        fanned = [Fanned(s) for s in stale_studies(pipeline)]
    except ConfigError as e:
        print(f"fan-out refused, nothing was run: {e}", file=sys.stderr)
        return 2
    report(pipeline, fanned)
    if not fanned:
        print(f"`dvc repro {pipeline}` runs the other stale stages, if any (python -m pipelines.status lists them)")
        return 0
    jobs = sum(len(f.jobs) for f in fanned)
    threads = max(f.a.threads for f in fanned)
    workers = a.workers or max(f.a.workers for f in fanned)
    try:
        ex = executors.build(setting, workers=min(workers, jobs), threads=threads, preload=study.PRELOAD,
                             folder=Path(fanned[0].a.runs_dir).parent / ".submitit" / "fanout")
    except ConfigError as e:
        print(f"fan-out refused, nothing was run: {e}", file=sys.stderr)
        return 2
    print(f"on {ex.banner()}", flush=True)
    t0, failed = time.time(), []
    try:
        run_together(fanned, ex, failed)
    except (KeyboardInterrupt, SystemExit) as e:
        why = str(e) if str(e) and not isinstance(e, KeyboardInterrupt) else "Ctrl-C"
        print(f"fan-out interrupted ({why}): the stages written and recorded so far stay; no other was written",
              file=sys.stderr)
        return 130
    if failed:
        print("\n".join(["fan-out failed:"] + failed), file=sys.stderr)
        return 1
    print(f"{len(fanned)} study stage(s) in {time.time() - t0:.0f} s; `dvc repro {pipeline}` runs the summaries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
