"""Where a study's jobs run (pipelines.executors, ``python -m pipelines.study --executor``):
the fork pool and submitit's local jobs give the same results; a pool with GPUs gives
each worker one device for its life; the SLURM preset asks sbatch for its resources;
a failed submitit job fails the stage by name; a bad setting is refused before the
runs folder is touched."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from pipelines import executors, study
from posenc.errors import ConfigError

from .conftest import REPO
from .helpers import study_params


def _common(tmp_path, data_root, cache_dir, experiment: str) -> str:
    return (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
            "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
            "data.batch_size=4 trainer.max_steps=3 trainer.val_check_interval=3 trainer.limit_val_batches=1 "
            f"log_checkpoint=false logger.experiment_name={experiment}")


@pytest.mark.slow
def test_a_study_gives_the_same_results_on_the_pool_and_as_submitit_local_jobs(tmp_path, data_root, cache_dir):
    """One scheme's causal-LM and retrieval runs, through the fork pool and through
    submitit's local jobs (each a fresh process running submitit's pickled call, as on
    SLURM; the grid one job instead of a job per cell): the same metrics, extrapolation
    rows and grid rows, bit for bit but for the MLflow ids, paths and seconds; the same
    provenance; the timing block says where the jobs ran."""
    common = _common(tmp_path, data_root, cache_dir, "executors")

    def run(executor: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
        out = tmp_path / executor
        out.mkdir()
        params = study_params(out, lm={"evaluate": {"multipliers": "1 2"}}, retrieval={"overrides": "model.max_len=64"})
        rc = study.main(["alibi", "--params", params, "--tasks", "lm", "retrieval", "--workers", "2",
                         "--runs-dir", str(out / "runs"), "--results-dir", str(out / "results"), "--common", common,
                         "--executor", executor])
        assert rc == 0
        ids = ["run_id", "checkpoint"]
        return (json.loads((out / "results" / "runs" / "alibi.json").read_text()),
                pd.read_csv(out / "results" / "extrapolation" / "alibi.csv", keep_default_na=False).drop(columns=ids),
                pd.read_csv(out / "results" / "retrieval" / "alibi.csv", keep_default_na=False).drop(columns="run_id"))

    pool, local = run("pool"), run("local")
    assert (tmp_path / "local" / ".submitit" / "runs").is_dir()  # beside the runs folder, not in it
    def keep(r: dict) -> dict:
        return {k: v for k, v in r.items() if k not in ("run_dir", "train_s", "eval_s")}

    assert [keep(r) for r in pool[0]["runs"]] == [keep(r) for r in local[0]["runs"]]
    assert [(r["task"], r["seed"]) for r in pool[0]["runs"]] == [("lm", 0), ("retrieval", 0)]
    assert pool[0]["provenance"] == local[0]["provenance"]  # where the jobs ran is no part of it
    pd.testing.assert_frame_equal(pool[1], local[1], check_exact=True)
    pd.testing.assert_frame_equal(pool[2], local[2], check_exact=True)
    assert len(pool[2]) == 10 and list(zip(pool[2]["length"], pool[2]["depth"])) == sorted(
        zip(pool[2]["length"], pool[2]["depth"]))
    assert pool[0]["timing"]["executor"] == "pool" and pool[0]["timing"]["workers"] == 2
    assert {k: local[0]["timing"][k] for k in ("executor", "cluster", "workers", "devices")} == {
        "executor": "submitit", "cluster": "local", "workers": 2, "devices": 0}


def record(seconds: float) -> tuple[str, int, float, float]:
    """A job that says which devices it saw, in which worker, from when to when."""
    start = time.time()
    time.sleep(seconds)
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.getpid(), start, time.time()


def _run_all(ex, jobs: int, seconds: float) -> list[tuple]:
    pending = {ex.submit(record, seconds) for _ in range(jobs)}
    out = []
    while pending:
        for h in ex.wait(pending):
            pending.discard(h)
            out.append(h.result())
    return out


def _settings(tmp_path, text: str) -> dict:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return executors.settings(str(path))


@pytest.mark.slow
def test_a_pool_with_gpus_gives_each_worker_one_device_and_each_device_one_job_at_a_time(tmp_path, monkeypatch):
    """gpus: 2 (no GPU needed: the pool only sets CUDA_VISIBLE_DEVICES): six jobs of 0.3 s on
    two workers, whatever --workers says; each job saw exactly one device, a worker kept its
    device, the jobs of one device never overlapped, both devices worked, and never more
    jobs ran than devices. gpus: all takes the devices CUDA_VISIBLE_DEVICES names."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    s = _settings(tmp_path, "kind: pool\ngpus: 2\n")
    assert s["devices"] == ["0", "1"]
    with executors.build(s, workers=5, threads=1, preload=["torch"]) as ex:
        assert ex.workers == 2 and ex.record() == {"executor": "pool", "workers": 2, "devices": 2}
        assert "--workers is ignored" in ex.banner()
        jobs = _run_all(ex, 6, 0.3)
    assert len(jobs) == 6 and {d for d, *_ in jobs} == {"0", "1"}
    assert len({(pid, d) for d, pid, *_ in jobs}) == len({pid for _, pid, *_ in jobs}) == 2  # a worker, a device
    for device in ("0", "1"):
        spans = sorted((a, b) for d, _, a, b in jobs if d == device)
        assert all(b <= a2 for (_, b), (a2, _) in itertools.pairwise(spans)), spans
    moments = sorted(t for *_, a, b in jobs for t in (a, b))
    assert max(sum(a <= t < b for *_, a, b in jobs) for t in moments) <= 2  # the others waited for a device

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    s = executors.settings("gpus")
    assert s["gpus"] == "all" and s["devices"] == ["3", "5"]
    with executors.build(s, workers=1, threads=1, preload=["torch"]) as ex:
        assert ex.workers == 2
        assert {d for d, *_ in _run_all(ex, 4, 0.2)} == {"3", "5"}


@pytest.mark.slow
def test_the_slurm_preset_asks_sbatch_for_its_resources(tmp_path, monkeypatch):
    """The sbatch script submitit submits for a job of the slurm preset (with a partition),
    read from a stand-in sbatch: GPUs per node, CPUs per task, memory, time, partition, the
    job's name, logs in the executor's folder. submitit wants srun on PATH to build a SLURM
    executor (its sign of a SLURM login node): without it, the setting is refused."""
    path = os.environ["PATH"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no srun: refused, with submitit's reason
    with pytest.raises(ConfigError, match='cluster slurm: Could not detect "srun"'):
        executors.build(executors.settings("slurm"), workers=2, threads=8, folder=tmp_path / "jobs")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_ / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {tmp_path / "submitted.sh"}\necho "Submitted batch job 4242"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{path}")
    preset = (REPO / "conf/executor/slurm.yaml").read_text()
    s = _settings(tmp_path, preset.replace("slurm_partition: null", "slurm_partition: gpu-long"))
    ex = executors.build(s, workers=2, threads=8, folder=tmp_path / "jobs")
    job = ex.submit(record, 0.0, name="rope-lm-s0")
    script = (tmp_path / "submitted.sh").read_text()
    flags = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {"#SBATCH --gpus-per-node=1", "#SBATCH --cpus-per-task=8", "#SBATCH --mem=64GB", "#SBATCH --time=720",
            "#SBATCH --partition=gpu-long", "#SBATCH --job-name=rope-lm-s0"} <= flags
    assert f"#SBATCH --error={tmp_path / 'jobs'}/%j/%j_0_log.err" in flags
    assert "submitit.core._submit" in script
    assert ex.describe(job) == f"job 4242, log {tmp_path / 'jobs' / '4242' / '4242_0_log.err'}"
    job.job.watcher.clear()  # submitit's watcher of SLURM jobs is shared: forget the stand-in's job


@pytest.mark.slow
def test_a_failed_submitit_job_fails_the_stage_by_its_name_and_job(tmp_path, data_root, cache_dir, capsys):
    """A run that raises in its submitit job (a window of -5 tokens): the stage exits 1,
    naming the run, the job's error, its id and its log; no results are written."""
    results = tmp_path / "runs" / "none.json"
    rc = study.main(["none", "--params", study_params(tmp_path, lm={"overrides": "data.seq_len=-5"}), "--tasks", "lm",
                     "--runs-dir", str(tmp_path / "runs" / "none"), "--results-dir", str(tmp_path),
                     "--common", _common(tmp_path, data_root, cache_dir, "failed"), "--executor", "local"])
    assert rc == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("none-lm-s0: ")]
    assert "ConfigError: data.seq_len=-5" in line and "(job " in line
    log = line.rsplit(", log ", 1)[1].rstrip(")")
    assert "data.seq_len=-5" in Path(log).read_text()
    assert not results.exists() and not (tmp_path / "extrapolation").exists()


@pytest.mark.slow
def test_a_cancelled_submitit_job_is_reported_and_an_interrupted_stage_cancels_its_jobs(tmp_path, monkeypatch):
    """A job that ends without a result (killed here; cancelled, timed out or preempted alike) raises
    submitit's UncompletedJobError, which the executor words with its job id; an exception in
    the stage (Ctrl-C) cancels the jobs still running, leaving none on its own."""
    import submitit

    monkeypatch.setattr(submitit.core.core.Job, "_results_timeout_s", 0)  # no wait for a slow file system
    s = executors.check({"kind": "submitit", "cluster": "local", "timeout_min": 5}, "test")
    with executors.build(s, workers=2, threads=1, folder=tmp_path / "jobs") as ex:
        h = ex.submit(record, 60.0, name="sleeper")
        # killed outright (as the out-of-memory killer would): the SIGINT that submitit's cancel
        # sends a local job once failed to stop it on a loaded machine, and the job ran to its end
        h.job._process.kill()
        assert ex.wait({h}) == {h}
        with pytest.raises(submitit.core.utils.UncompletedJobError) as e:
            h.result()
        assert re.match(rf"UncompletedJobError: Job {h.job.job_id} .* has not produced any output", ex.reason(e.value))
    with pytest.raises(KeyboardInterrupt), executors.build(s, workers=2, threads=1, folder=tmp_path / "jobs") as ex:
        h = ex.submit(record, 60.0)
        raise KeyboardInterrupt
    t0 = time.time()
    while not h.done() and time.time() - t0 < 20:
        time.sleep(0.1)
    assert h.done()


@pytest.mark.slow
def test_a_preempted_submitit_job_is_requeued_and_its_run_ends_as_an_uninterrupted_one(tmp_path, data_root,
                                                                                        cache_dir):
    """A causal-LM run of a study on submitit's local jobs, preempted once after step 12 of 20
    (the run sends itself submitit's signal, USR2, which is what SLURM sends before a time
    limit or a preemption and what submitit's own test hook sends a local job): its job is
    requeued, resumes the run from its step-10 last.ckpt, and the stage's metrics and rows are
    those of the same study run without a stop on the pool, bit for bit. One MLflow run,
    FINISHED."""
    import mlflow

    common = _common(tmp_path, data_root, cache_dir, "preempted")
    marker = tmp_path / "preempted-once"
    stop = f"+callbacks.stop={{_target_:tests.helpers.SignalAt,step:12,signum:SIGUSR2,once:'{marker}'}}"

    def run(executor: str, overrides: str) -> tuple[dict, pd.DataFrame]:
        out = tmp_path / executor
        out.mkdir()
        params = study_params(out, lm={"steps": 20, "validate_every": 5, "evaluate": {"multipliers": "1 2"}})
        rc = study.main(["none", "--params", params, "--tasks", "lm", "--workers", "1", "--runs-dir",
                         str(out / "runs"), "--results-dir", str(out / "results"), "--common", common,
                         "--scheme-overrides", overrides, "--executor", executor])
        assert rc == 0
        return (json.loads((out / "results" / "runs" / "none.json").read_text()),
                pd.read_csv(out / "results" / "extrapolation" / "none.csv", keep_default_na=False)
                .drop(columns=["run_id", "checkpoint"]))

    plain, stopped = run("pool", ""), run("local", stop)
    assert marker.exists()  # the signal was sent
    logs = "".join(p.read_text() for p in (tmp_path / "local" / ".submitit").rglob("*_log.err"))
    assert "this job is preempted" in logs and "none-lm-s0: started again after 1 stop(s)" in logs
    keep = lambda r: {k: v for k, v in r.items() if k not in ("run_dir", "train_s", "eval_s")}  # noqa: E731
    assert [keep(r) for r in stopped[0]["runs"]] == [keep(r) for r in plain[0]["runs"]]
    assert stopped[0]["runs"][0]["global_step"] == 20
    pd.testing.assert_frame_equal(stopped[1], plain[1], check_exact=True)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("preempted")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.mlflow.runName = 'none-lm-s0'")
    # the plain run and the stopped one, resumed (a restart from scratch would have left a third)
    assert sorted(r.info.status for r in runs) == ["FINISHED", "FINISHED"]
    assert sum("resume_overrides" in r.data.tags for r in runs) == 1


@pytest.mark.slow
def test_a_job_preempted_past_its_requeues_fails_by_its_name_and_count(tmp_path):
    """A job preempted each time it starts is requeued ``max_requeues`` times, then fails with
    a message naming it and the count of stops."""
    from tests.helpers import preempted_each_time

    s = executors.check({"kind": "submitit", "cluster": "local", "timeout_min": 5, "max_requeues": 1}, "test")
    with executors.build(s, workers=1, threads=1, folder=tmp_path / "jobs") as ex:
        h = ex.submit(preempted_each_time, name="rope-lm-s0")
        ex.wait({h})
        with pytest.raises(Exception) as e:
            h.result()
    assert ex.reason(e.value) == ("RuntimeError: job rope-lm-s0 was preempted or reached its time limit 2 times: "
                                  "not requeued again (max_requeues: 1)")
    assert "rope-lm-s0: started again after 1 stop(s)" in h.job.stderr()


@pytest.mark.parametrize("setting,env,match", [
    ("ray", {}, "unknown executor 'ray': the presets are gpus, local, pool, slurm"),
    (None, {executors.ENV: "ray"}, "unknown executor 'ray'"),  # the environment's choice, when no flag
    ("kind: ray\n", {}, "kind 'ray' is none of pool, submitit"),
    ("kind: pool\ngpus: 0\n", {}, "gpus: 0: give a number of devices"),
    ("kind: pool\ngpus: 3\n", {"CUDA_VISIBLE_DEVICES": "0"}, r"gpus: 3, but 1 CUDA device\(s\) are visible"),
    ("kind: pool\nworkers: 4\n", {}, "unknown key\\(s\\) workers for kind pool"),
    ("kind: submitit\ncluster: local\n", {}, "kind submitit needs timeout_min"),
    ("kind: submitit\ncluster: pbs\ntimeout_min: 5\n", {}, "cluster 'pbs' is none of local, slurm"),
], ids=["unknown-preset", "unknown-preset-from-env", "bad-kind", "no-gpus", "more-gpus-than-visible", "unknown-key",
        "no-timeout", "bad-cluster"])
def test_a_bad_executor_setting_is_refused_before_the_runs_folder_is_touched(tmp_path, monkeypatch, capsys, setting,
                                                                            env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "kept").write_text("an earlier run")
    flag = []
    if setting is not None:
        flag = ["--executor", setting]
        if setting.startswith("kind"):
            (tmp_path / "mine.yaml").write_text(setting)
            flag = ["--executor", str(tmp_path / "mine.yaml")]
    with pytest.raises(SystemExit) as stop:
        study.main(["none", "--params", study_params(tmp_path, lm={}), "--tasks", "lm", "--runs-dir", str(runs),
                    "--results-dir", str(tmp_path / "results"), *flag])
    assert stop.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert (runs / "kept").read_text() == "an earlier run" and not (tmp_path / "results").exists()


def test_submitit_missing_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setattr(executors.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"needs the package submitit: pip install -e '\.\[cluster\]'"):
        executors.check({"kind": "submitit", "cluster": "local", "timeout_min": 5})


@pytest.mark.slow
def test_the_default_path_imports_no_torch_lightning_or_submitit_in_the_parent():
    """The study's parent process on the default executor reads its settings and builds its
    pool without torch, Lightning or submitit (the fork server imports what the jobs need)."""
    script = ("import sys\n"
              "from pipelines import executors, study\n"
              "a = study.parse_args(['none', '--tasks', 'lm', 'mlm', 'retrieval', '--runs-dir', 'r', "
              "'--results-dir', 'results'])\n"
              "ex = executors.build(a.executor, workers=2, threads=1, preload=study.PRELOAD)\n"
              "print(type(ex).__name__, sorted(m for m in sys.modules if m.split('.')[0] in "
              "('torch', 'lightning', 'pytorch_lightning', 'submitit')))\n")
    env = {k: v for k, v in os.environ.items() if k != executors.ENV}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "Pool []"
