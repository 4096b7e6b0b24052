"""The whole study at once (``python -m pipelines.fanout``): jobs of several stages share the
executor's workers, and a reduced study through the fan-out gives what ``dvc repro`` gives,
stage by stage, with ``dvc status`` clean for its study stages afterwards."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from pipelines import executors, study

from .test_dvc import REDUCED, _copy_project, _dvc
from .test_executors import _settings, record


class Sleepers:
    """A stand-in for a study stage (what ``pipelines.study.Queue`` asks of one): jobs that
    sleep and say where and when they ran; each, when it is in, leaves a follow-up of
    ``follow`` seconds (as a retrieval run leaves its grid) if ``follow``."""

    def __init__(self, name: str, seconds: list[float], follow: float = 0.0):
        self.name, self.seconds, self.follow, self.out = name, seconds, follow, []

    def start(self, queue: study.Queue) -> None:
        for s in self.seconds:
            queue.put(self, record, (s,), self.name, ("run", s))

    def take(self, fut, tag: tuple, queue: study.Queue) -> None:
        self.out.append((self.name, tag[0], *fut.result()))
        if tag[0] == "run" and self.follow:
            queue.put(self, record, (self.follow,), f"{self.name}-grid", ("follow-up", self.follow), first=True)


@pytest.mark.slow
def test_four_devices_stay_busy_with_the_jobs_of_three_stages(tmp_path, monkeypatch):
    """A pool of 4 (fake) devices and the jobs of three stages, of 0.1 to 0.7 s, those of the
    first leaving a follow-up each: a job starts on a device as soon as one is free, whichever
    stage it is of, so no device waits while a job waits; follow-ups go ahead of the runs
    still waiting, so the first stage ends first; each stage ends (its ``on_end``) once, when
    its last job is in."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    ended = []
    with executors.build(_settings(tmp_path, "kind: pool\ngpus: 4\n"), workers=1, threads=1, preload=["torch"]) as ex:
        for _ in range(20):  # every worker started first: a pool spawns its workers as jobs come, seconds apart
            if len({pid for _, pid, *_ in [f.result() for f in [ex.submit(record, 0.5) for _ in range(4)]]}) == 4:
                break
        stages = [Sleepers("a", [0.6, 0.6, 0.6, 0.6], follow=0.1), Sleepers("b", [0.1, 0.7, 0.1, 0.7]),
                  Sleepers("c", [0.2, 0.6, 0.2, 0.6])]
        queue = study.Queue(ex)
        for stage in stages:
            stage.start(queue)
        queue.run(on_end=lambda s: ended.append((s.name, len(s.out))))
    jobs = [j for s in stages for j in s.out]
    assert ended == [("a", 8), ("b", 4), ("c", 4)] and len(jobs) == 16
    last_start = max(start for *_, start, _ in jobs)
    for device in "0123":
        spans = sorted((start, end) for *_, d, _, start, end in jobs if d == device)
        assert spans, f"device {device} ran nothing"
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert end <= start < end + 0.25, (device, spans)  # one at a time, the next at once
        assert spans[-1][1] >= last_start - 0.25  # busy until the last job was started
    moments = sorted(t for *_, start, end in jobs for t in (start, end))
    assert max(sum(a <= t < b for *_, a, b in jobs) for t in moments) == 4
    # a's grids started as a's runs ended, ahead of b's runs that waited (behind them, a would end last)
    grids = [start for _, kind, *_, start, _ in jobs if kind == "follow-up"]
    assert max(grids) < min(start for name, *_, start, _ in jobs if name == "b")


#: two schemes, a causal-LM and a masked-LM run each: the study stages of a small pipeline
FANNED = {**REDUCED, "tasks": {k: {**REDUCED["tasks"][k], "seeds": "0"} for k in ("lm", "mlm", "retrieval")},
          "schemes": {s: {"tasks": "lm mlm", "overrides": "", "extensions": ""} for s in ("none", "alibi")}}
FANNED["tasks"]["lm"]["evaluate"] = {**FANNED["tasks"]["lm"]["evaluate"], "multipliers": "1 2", "extensions": ""}


def _results(root) -> dict:
    """What the study stages wrote, less what differs between two runs of the same code: MLflow
    ids, checkpoints' paths, seconds, the machine's load."""
    out = {}
    for scheme in FANNED["schemes"]:
        runs = json.loads((root / f"results/runs/{scheme}.json").read_text())
        out[scheme] = {"provenance": runs["provenance"],
                       "runs": [{k: v for k, v in r.items() if k not in ("train_s", "eval_s")} for r in runs["runs"]]}
        for folder in ("extrapolation", "mlm"):
            path = root / "results" / folder / f"{scheme}.csv"
            if path.exists():
                frame = pd.read_csv(path, keep_default_na=False)
                out[scheme][folder] = frame.drop(columns=[c for c in ("run_id", "checkpoint") if c in frame])
    return out


def _locked_deps(root) -> dict:
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {name: (entry["deps"], entry.get("params")) for name, entry in lock.items() if name.startswith("study@")}


@pytest.mark.slow
def test_a_reduced_study_through_the_fan_out_is_the_stage_by_stage_repro(tmp_path, data_root):
    """The study stages of a two-scheme pipeline, by ``dvc repro`` (a stage at a time, on the
    pool) and by the fan-out (every job at once, as submitit's local jobs): the same results
    bit for bit but for ids and seconds, the same dependencies in dvc.lock; afterwards
    ``dvc status`` lists no study stage and the fan-out finds none stale."""
    by_stage, fanned = tmp_path / "by-stage", tmp_path / "fanned"
    by_stage.mkdir()
    _copy_project(by_stage)
    (by_stage / "params.yaml").write_text(yaml.safe_dump(FANNED))
    shutil.copytree(by_stage, fanned)
    first = _dvc(by_stage, "repro", *[f"study@{s}" for s in FANNED["schemes"]])
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    env = dict(os.environ, PYTHONPATH=str(fanned / "src"), PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{os.environ['PATH']}", OMP_NUM_THREADS="1")
    env.pop("MLFLOW_TRACKING_URI", None)
    fan = lambda *args: subprocess.run([sys.executable, "-m", "pipelines.fanout", *args], cwd=fanned, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=1800)
    dry = fan("--dry-run")
    assert dry.returncode == 0 and "2 stale study stage(s), 4 runs: study@alibi (2), study@none (2)" in dry.stdout, (
        dry.stdout + dry.stderr[-3000:])
    out = fan("--executor", "local")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "study@none: written and recorded in its dvc.lock" in out.stdout
    assert "submitit jobs on local" in out.stdout

    ours, theirs = _results(fanned), _results(by_stage)
    for scheme in FANNED["schemes"]:
        assert ours[scheme]["provenance"] == theirs[scheme]["provenance"]
        strip = lambda runs: [{k: v for k, v in r.items() if k != "run_dir"} for r in runs]  # noqa: E731
        assert strip(ours[scheme]["runs"]) == strip(theirs[scheme]["runs"])
        for folder in ("extrapolation", "mlm"):
            if folder in theirs[scheme]:
                pd.testing.assert_frame_equal(ours[scheme][folder], theirs[scheme][folder], check_exact=True)
    assert len(ours["none"]["extrapolation"]) == 2  # the causal-LM run at 1L and 2L
    assert _locked_deps(fanned) == _locked_deps(by_stage)
    # each stage's time from its turn (its first job's submission) to its end: alibi's runs took both
    # job slots first, none's began as they freed
    times = {s: json.loads((fanned / f"results/times/study@{s}.json").read_text()) for s in ("alibi", "none")}
    assert times["alibi"]["stage"] == "study@alibi" and times["none"]["started"] > times["alibi"]["started"]
    for scheme, t in times.items():
        timing = json.loads((fanned / f"results/runs/{scheme}.json").read_text())["timing"]
        assert 0 <= timing["startup_s"] < timing["wall_s"] <= t["seconds"] + 1, (scheme, timing, t)

    status = _dvc(fanned, "status", "--json", "dvc.yaml")
    assert status.returncode == 0, status.stderr[-2000:]
    assert not [s for s in json.loads(status.stdout or "{}") if s.startswith(("study@", "prepare", "fingerprint"))]
    again = fan("--dry-run")
    assert again.returncode == 0 and "no study stage is stale" in again.stdout, again.stdout + again.stderr[-2000:]
