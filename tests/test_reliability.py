"""Faults injected on purpose: bad settings, bad files, a live MLflow server, 8 runs writing to
one SQLite store at once (two at once: the local launcher preset's sweep in tests/test_launchers.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from posenc import tracking
from posenc.train import ConfigError, train

from .conftest import REPO, cli_env, cli_overrides
from .test_train import _cli, runs_of


@pytest.mark.slow
def test_wrong_type_names_the_key(tmp_path, data_root, cache_dir):
    r = _cli(tmp_path, data_root, cache_dir, "model.d_model=abc")
    assert r.returncode != 0
    assert "model.d_model" in r.stderr and "Integer" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_odd_rotary_dim(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="encoding.scheme.fraction"):
        train(make_cfg("encoding=rope", "encoding.scheme.fraction=0.3"))  # 16 x 0.3 -> 5 features
    assert runs_of(tmp_path) == []


def test_causal_only_scheme_refuses_mlm(make_cfg, tmp_path):
    with pytest.raises(ValueError, match="causal attention only"):
        train(make_cfg("encoding=xpos", "task=mlm"))
    assert runs_of(tmp_path) == []


def test_resume_refuses_checkpoint_of_another_scheme_or_size(make_cfg, tmp_path):
    train(make_cfg("trainer.max_steps=4", "trainer.val_check_interval=2", "run_name=shared"))
    (ckpt,) = tmp_path.glob("outputs/runs/*/checkpoints/last.ckpt")
    with pytest.raises(ConfigError, match=r"does not fit this run: encoding.name: rope in the checkpoint, alibi now; no"):
        train(make_cfg("encoding=alibi", f"ckpt_path={ckpt}"))
    with pytest.raises(ConfigError, match="model"):
        train(make_cfg("model.d_model=64", f"ckpt_path={ckpt}"))
    (run,) = runs_of(tmp_path)  # no new run was opened
    assert run.info.status == "FINISHED"


def test_truncated_checkpoint(make_cfg, tmp_path):
    train(make_cfg("trainer.max_steps=4", "trainer.val_check_interval=2"))
    (ckpt,) = tmp_path.glob("outputs/runs/*/checkpoints/last.ckpt")
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated, corrupt"):
        train(make_cfg("ckpt_path=last"))
    assert len(runs_of(tmp_path)) == 1


def test_provenance_tags(make_cfg, tmp_path):
    train(make_cfg("trainer.max_steps=2", "trainer.val_check_interval=2"))
    (run,) = runs_of(tmp_path)
    tags = run.data.tags
    assert tags["data_source"] == "local" and len(tags["data_tokens_sha256"]) == 64
    assert tags["version.torch"].startswith("2.") and tags["version.lightning"].startswith("2.")
    assert tags["git_dirty"] in {"true", "false", "unknown"}
    for key, value in run.data.params.items():  # no environment leaks into params
        assert "SECRET" not in key.upper() and "TOKEN=" not in value.upper()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _mlflow_server(folder, workers: int = 1):
    """A real ``mlflow server`` of ``workers`` processes on a free local port over the SQLite
    database ``folder/mlflow.db``, started in ``folder`` and answering (its ``/health``) before
    the block starts; stopped after it. Yields its URI."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers)],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=5).read()
                break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode()[-2000:]
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not answer within 60 s")
        yield uri
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_mlflow_server_lists_finished_run(make_cfg, tmp_path):
    train(make_cfg("trainer.max_steps=4", "trainer.val_check_interval=2"))

    with _mlflow_server(tmp_path) as uri:
        def call(path, body=None):
            req = urllib.request.Request(f"{uri}/api/2.0/mlflow{path}", data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())

        exp = call("/experiments/get-by-name?experiment_name=posenc")["experiment"]
        (run,) = call("/runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]
        assert run["info"]["status"] == "FINISHED"
        params = {p["key"]: p["value"] for p in run["data"]["params"]}
        metrics = {m["key"] for m in run["data"]["metrics"]}
        assert params["encoding.name"] == "rope" and {"val/loss", "train/loss"} <= metrics
        files = call(f"/artifacts/list?run_id={run['info']['run_id']}")["files"]
        assert {"config.yaml", "tokenizer.json"} <= {f["path"] for f in files}


@pytest.mark.slow
def test_evaluation_length_below_one_is_refused(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pipelines.extrapolate", str(tmp_path / "missing.ckpt"),
                        "--lengths", "0", "--no-mlflow", "--out", str(tmp_path / "r.csv")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "at least 1" in r.stderr
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.slow
def test_ctrl_c_then_resume_leaves_one_folder_with_the_final_last_ckpt(tmp_path, data_root, cache_dir):
    """Ctrl-C at step 5 exits 130 naming the checkpoint it saved; `ckpt_path=last`
    then finishes the run in the same folder: one run folder (the resume's Hydra
    config under .hydra/resume-*, its log appended to train.log), and last.ckpt
    holds the final weights (no last-v1.ckpt beside a stale one)."""
    common = [*cli_overrides(cache_dir), "encoding=sinusoidal", "trainer.max_steps=12", "trainer.val_check_interval=6"]
    stop = "+callbacks.stop={_target_: tests.helpers.SignalAt, step: 5, signum: SIGINT}"
    r = _cli(tmp_path, data_root, cache_dir, *common, stop)
    assert r.returncode == 130, r.stderr[-3000:]
    assert "interrupted at step 5: saved" in r.stderr and "ckpt_path=last" in r.stderr
    r = _cli(tmp_path, data_root, cache_dir, *common, "ckpt_path=last")
    assert r.returncode == 0, r.stderr[-3000:]
    (run_dir,) = (tmp_path / "outputs" / "runs").iterdir()
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["best-step=12.ckpt", "last.ckpt"], ckpts
    import torch

    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12
    assert len(list((run_dir / ".hydra").glob("resume-*/overrides.yaml"))) == 1
    log = (run_dir / "train.log").read_text()
    assert "stopped at step 5" in log and "finished sinusoidal-lm-tinyshakespeare-s0" in log
    (run,) = runs_of(tmp_path)
    assert run.info.status == "FINISHED"


def test_extending_a_run_keeps_its_schedule_and_says_so(make_cfg, tmp_path):
    """A finished 10-step run resumed to 20 steps keeps its 10-step schedule: the LR
    stays at the schedule's floor (lr x min_ratio) instead of warming up again, and
    the run's description and run.json say so."""
    import mlflow

    common = ["encoding=kerple", "optim.warmup_steps=2", "trainer.log_every_n_steps=1"]
    train(make_cfg(*common, "trainer.max_steps=10"))
    train(make_cfg(*common, "trainer.max_steps=20", "ckpt_path=last"))
    (run,) = runs_of(tmp_path)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    lrs = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "train/lr")}
    floor = 1e-3 * 0.1
    assert [lrs[s] for s in range(10, 20)] == pytest.approx([floor] * 10), lrs
    assert "extended by a resume: a 10-step schedule" in run.data.tags["mlflow.note.content"]
    (meta,) = tmp_path.glob("outputs/runs/*/run.json")
    assert json.loads(meta.read_text())["schedule_steps"] == 10


#: short runs started at once against one store (a cluster's study writes from many jobs)
AT_ONCE = 8


def _runs_at_once(tmp_path, data_root, cache_dir, *extra: str, env: dict | None = None) -> None:
    """``AT_ONCE`` short causal-LM runs (seeds 0 to 7), each ``python train.py`` in its own
    process of one torch thread (and the environment ``env`` over the test's), all started
    before any ends."""
    args = [*cli_overrides(cache_dir), "trainer.max_steps=4", "trainer.val_check_interval=2", *extra]
    procs = [subprocess.Popen([sys.executable, str(REPO / "train.py"), *args, f"seed={s}"], cwd=tmp_path,
                              env=cli_env(tmp_path, data_root, cache_dir) | (env or {}), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for s in range(AT_ONCE)]
    errors = [p.communicate(timeout=1200)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * AT_ONCE, [e[-1500:] for p, e in zip(procs, errors) if p.returncode]


def _nothing_lost(uri: str) -> None:
    """Every run of ``_runs_at_once`` is in the store, FINISHED, with the same metrics (each
    with its whole history), params, tags and logged files as the others."""
    client = tracking.client(uri)
    runs = tracking.runs_of(uri, "posenc")
    assert sorted(r.info.run_name for r in runs) == [f"rope-lm-s{s}" for s in range(AT_ONCE)]
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {"train/loss", "train/lr", "val/loss", "val/ppl"} <= set(runs[0].data.metrics)
    shape = lambda r: ({k: len(client.get_metric_history(r.info.run_id, k)) for k in r.data.metrics},  # noqa: E731
                       sorted(r.data.params), sorted(k for k in r.data.tags if not k.startswith("mlflow.")),
                       sorted(f.path for f in client.list_artifacts(r.info.run_id)))
    first = shape(runs[0])
    assert first[0]["train/loss"] >= 2 and "data_tokens_sha256" in first[2] and "config.yaml" in first[3]
    assert all(shape(r) == first for r in runs[1:])
    assert sorted(r.data.params["seed"] for r in runs) == [str(s) for s in range(AT_ONCE)]


@pytest.mark.slow
def test_runs_at_once_into_the_default_sqlite_store_lose_nothing(tmp_path, data_root, cache_dir):
    _runs_at_once(tmp_path, data_root, cache_dir, "log_checkpoint=false")
    _nothing_lost(f"sqlite:///{tmp_path}/mlflow.db")


@pytest.mark.slow
def test_runs_at_once_through_an_mlflow_server_lose_nothing(tmp_path, data_root, cache_dir):
    """The cluster's way (docs/gpus.md): ``MLFLOW_TRACKING_URI`` names a tracking server (two
    workers over one database), and 8 runs that start together on a new store all log
    through it: none fails (two jobs tagging the new experiment together once failed one of
    them) and nothing is lost. Nothing is written to the default SQLite store."""
    (tmp_path / "server").mkdir()
    with _mlflow_server(tmp_path / "server", workers=2) as uri:
        _runs_at_once(tmp_path, data_root, cache_dir, env={"MLFLOW_TRACKING_URI": uri})
        _nothing_lost(uri)
    assert not (tmp_path / "mlflow.db").exists()  # the default store, unused
