"""The sweep launcher presets of ``conf/hydra/launcher/``: ``local`` runs a sweep's points in
parallel processes of this machine, one torch thread each, every run logged in one SQLite
store created fresh; ``slurm`` asks sbatch for one GPU run's resources (checked without a
cluster: the plugin's own code writes the sbatch script, and nothing submits it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from posenc import tracking

from .conftest import REPO, cli_env, cli_overrides

LAUNCHERS = "hydra_plugins.hydra_{}_launcher.{}_launcher.{}Launcher"
JOBLIB = LAUNCHERS.format("joblib", "joblib", "Joblib")
SLURM = LAUNCHERS.format("submitit", "submitit", "Slurm")
PROBE = "probe.json"


class JobProbe(Callback):
    """A Hydra callback the tests add (``+hydra.callbacks.probe._target_=...``): in each job's
    folder, the process that ran the job and the torch threads it had. The launching process and
    the workers import this module, so it imports nothing that composes a config on import."""

    def on_job_start(self, config, **kwargs) -> None:
        import torch

        record = {"pid": os.getpid(), "torch_threads": torch.get_num_threads()}
        Path(config.hydra.runtime.output_dir, PROBE).write_text(json.dumps(record))


@pytest.mark.slow
def test_local_preset_runs_the_points_in_parallel_processes_of_one_thread(tmp_path, data_root, cache_dir):
    """The joblib preset, its own n_jobs, no thread count in the environment: the points run in
    worker processes (not the launching one), one torch thread each, and two processes writing
    at once to a SQLite store created fresh lose no run."""
    env = cli_env(tmp_path, data_root, cache_dir)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)  # what the preset's workers get is the preset's doing
    args = ["-m", "encoding=none,alibi", "hydra/launcher=local", *cli_overrides(cache_dir),
            "trainer.max_steps=4", "trainer.val_check_interval=4",
            f"+hydra.callbacks.probe._target_={__name__}.JobProbe"]
    launching = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, stderr = launching.communicate(timeout=600)
    assert launching.returncode == 0, stderr[-3000:]

    runs = tracking.runs_of(f"sqlite:///{tmp_path}/mlflow.db", "posenc")
    assert sorted(x.info.run_name for x in runs) == ["alibi-lm-s0", "none-lm-s0"]
    assert {x.info.status for x in runs} == {"FINISHED"}
    assert all("val/loss" in x.data.metrics for x in runs)

    (sweep,) = (tmp_path / "outputs" / "multirun").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0_none-lm-tinyshakespeare-s0", "1_alibi-lm-tinyshakespeare-s0"]
    probes = []
    for job in jobs:
        hydra_cfg = OmegaConf.load(job / ".hydra" / "hydra.yaml").hydra
        assert hydra_cfg.runtime.choices["hydra/launcher"] == "local"
        assert hydra_cfg.launcher._target_ == JOBLIB and hydra_cfg.launcher.n_jobs == -1
        assert (job / "metrics.json").is_file()  # the run wrote its folder where Hydra put the job
        probes.append(json.loads((job / PROBE).read_text()))
    assert all(p["pid"] != launching.pid for p in probes), probes
    assert [p["torch_threads"] for p in probes] == [1, 1]
    if len(os.sched_getaffinity(0)) >= 2:  # one worker per core: the two points ran side by side
        assert probes[0]["pid"] != probes[1]["pid"], probes


@pytest.mark.slow
def test_slurm_preset_composes_one_gpu_job(tmp_path, data_root, cache_dir):
    """What ``hydra/launcher=slurm`` composes to through ``python train.py`` (no sweep started)."""
    # --cfg after the overrides: posenc's command line puts its hydra.job.name beside them, so the
    # order a user writes is the one Hydra's parser takes
    r = subprocess.run([sys.executable, str(REPO / "train.py"), "hydra/launcher=slurm", "hydra.launcher.partition=gpu",
                        "--cfg", "hydra"], check=False, cwd=tmp_path,
                       env=cli_env(tmp_path, data_root, cache_dir), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    launcher = yaml.safe_load(r.stdout)["hydra"]["launcher"]
    assert launcher["_target_"] == SLURM
    expected = {"partition": "gpu", "gpus_per_node": 1, "tasks_per_node": 1, "nodes": 1, "cpus_per_task": 8,
                "mem_gb": 64, "timeout_min": 720, "array_parallelism": 16, "max_num_timeout": 0,
                "submitit_folder": "${hydra.sweep.dir}/.submitit/%j"}
    assert {k: launcher[k] for k in expected} == expected
    assert list(tmp_path.iterdir()) == []  # printing the config starts nothing


def test_slurm_preset_sbatch_script(tmp_path, monkeypatch):
    """The plugin's own launch() turns the preset into an sbatch script; the submission itself
    (``sbatch``, which this machine lacks, as it lacks the ``srun`` submitit looks for) is
    stopped and the script kept."""
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from posenc import CONFIG_DIR

    monkeypatch.setenv("POSENC_ROOT", str(tmp_path))
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3", job_name="train"):
        cfg = compose("train", ["hydra/launcher=slurm", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=print, config=cfg)

    scripts = []

    class Submitted(Exception):
        pass

    def submit(executor, command):
        scripts.append(executor._make_submission_file_text(command, "uid"))
        raise Submitted

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # as if srun were here
    monkeypatch.setattr(submitit.SlurmExecutor, "_submit_command", submit)
    with pytest.raises(Submitted):
        launcher.launch([[f"seed={i}"] for i in range(20)], initial_job_idx=0)  # more points than run at once
    (script,) = scripts
    sbatch = {line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")}
    folder = Path(launcher.params["submitit_folder"])  # <sweep dir>/.submitit/%j
    assert folder.parent.parent.parent == tmp_path / "outputs" / "multirun" and folder.parts[-2:] == (".submitit", "%j")
    for line in ("--partition=gpu", "--gpus-per-node=1", "--ntasks-per-node=1", "--nodes=1", "--cpus-per-task=8",
                 "--mem=64GB", "--time=720", "--array=0-19%16", "--job-name=train",
                 f"--output={folder.parent}/%A_%a/%A_%a_0_log.out"):
        assert line in sbatch, (line, script)
