"""The edges of a run: Ctrl-C with its standard output a pipe whose reader has gone, streams
that such a pipe cannot break, a warm-up as long as the run, the project root whatever the
working folder, the run's closing line, the known third-party warnings and a sweep's MLflow
compare link."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from posenc import tracking
from posenc.callbacks import KNOWN_WARNINGS, CompareSweep, quiet_known_warnings
from posenc.config import check_config, compose
from posenc.files import project_root
from posenc.streams import PipeSafe, pipe_safe
from posenc.train import closing_line

from .conftest import REPO, cli_env, cli_overrides
from .test_train import runs_of


def _closed_pipe() -> tuple[io.TextIOWrapper, int]:
    """A text stream on the writing end of a pipe whose reading end is closed (its reader gone),
    on a file descriptor of its own (never this process's 1 or 2)."""
    read, write = os.pipe()
    os.close(read)
    return io.TextIOWrapper(os.fdopen(write, "wb", buffering=0), write_through=True), write


def test_a_closed_pipe_is_found_and_silenced_for_every_later_writer():
    """A write to a pipe whose reader is gone raises ``BrokenPipeError``; through ``PipeSafe`` it
    does not, and it points the descriptor at /dev/null, so that the next write of any writer to
    that descriptor (here ``os.write``, as native code writes) succeeds. ``reader_gone`` tells such
    a pipe from one with a reader, writing nothing."""
    stream, fd = _closed_pipe()
    try:
        try:
            os.write(fd, b"x")
            raise AssertionError("a write to a pipe without a reader succeeded")
        except BrokenPipeError:
            pass
        safe = PipeSafe(stream)
        assert safe.reader_gone()
        assert safe.write("step 5/20\n") == len("step 5/20\n")
        safe.flush()
        assert os.write(fd, b"native bytes") == len(b"native bytes")  # now /dev/null
        assert not safe.reader_gone() and os.path.realpath(f"/proc/self/fd/{fd}") == os.devnull
    finally:
        stream.close()
    read, write = os.pipe()
    try:
        assert not PipeSafe(os.fdopen(write, "w", closefd=False)).reader_gone()  # a reader is there
    finally:
        os.close(read)
        os.close(write)


def test_pipe_safe_covers_the_standard_streams_and_their_log_handlers(monkeypatch):
    """Inside ``pipe_safe``, ``sys.stdout`` and a logging handler that wrote to it write through
    ``PipeSafe`` (a closed pipe raises nothing); after it, both are as they were."""
    stream, _ = _closed_pipe()
    monkeypatch.setattr(sys, "stdout", stream)
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("posenc.test_streams")
    log.addHandler(handler)
    try:
        with pipe_safe():
            assert isinstance(sys.stdout, PipeSafe) and isinstance(handler.stream, PipeSafe)
            print("a progress bar's line")
            log.error("a log line")
        assert sys.stdout is stream and handler.stream is stream
    finally:
        log.removeHandler(handler)
        monkeypatch.undo()
        stream.close()


@pytest.mark.slow
def test_ctrl_c_with_stdout_piped_to_head_saves_and_resumes_to_the_uninterrupted_end(tmp_path, data_root, cache_dir):
    """``python train.py ... | head -c 100``, then Ctrl-C: standard output is a real pipe to a real
    ``head``, which exits after 100 bytes (Hydra's first log line), so the progress bar, the model
    summary and the log write to a pipe nobody reads; the run sends itself SIGINT at step 5
    (``tests.helpers.SignalAt``, a real signal) once ``head`` has gone. The run saves
    ``last.ckpt``, its MLflow run is KILLED and it exits 130; ``ckpt_path=last`` then ends where
    a run that was never interrupted ends, to the bit (its final validation loss)."""
    quiet = ("trainer.enable_progress_bar", "trainer.enable_model_summary")
    common = [*(o for o in cli_overrides(cache_dir) if not o.startswith(quiet)), "encoding=alibi",
              "trainer.max_steps=12", "trainer.val_check_interval=6"]  # the bar and the summary on, as by default
    stop = "+callbacks.stop={_target_: tests.helpers.SignalWhenReaderGone, step: 5}"
    run_root = tmp_path / "interrupted"
    run_root.mkdir()
    env = cli_env(run_root, data_root, cache_dir)
    train = subprocess.Popen([sys.executable, str(REPO / "train.py"), *common, stop], cwd=run_root, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = subprocess.Popen(["head", "-c", "100"], stdin=train.stdout, stdout=subprocess.DEVNULL)
    train.stdout.close()  # head alone reads the pipe: when it exits, the pipe has no reader
    _, err = train.communicate(timeout=900)
    assert head.wait(timeout=60) == 0
    err = err.decode()
    assert train.returncode == 130, err[-3000:]
    assert "interrupted at step 5: saved" in err and "BrokenPipeError" not in err, err[-3000:]
    (last,) = run_root.glob("outputs/runs/*/checkpoints/last.ckpt")
    (run,) = runs_of(run_root)
    assert run.info.status == "KILLED"

    resumed = subprocess.run([sys.executable, str(REPO / "train.py"), *common, "ckpt_path=last"], cwd=run_root,
                             env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole_root = tmp_path / "whole"
    whole_root.mkdir()
    whole = subprocess.run([sys.executable, str(REPO / "train.py"), *common], cwd=whole_root,
                           env=cli_env(whole_root, data_root, cache_dir), capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    (ours,) = run_root.glob("outputs/runs/*/metrics.json")
    (theirs,) = whole_root.glob("outputs/runs/*/metrics.json")
    ours, theirs = json.loads(ours.read_text()), json.loads(theirs.read_text())
    assert ours["global_step"] == theirs["global_step"] == 12
    assert ours["val/loss"] == theirs["val/loss"]
    assert last.exists() and runs_of(run_root)[0].info.status == "FINISHED"


def test_a_warm_up_as_long_as_the_run_is_warned(data_root):
    """``optim.warmup_steps`` 50 and ``trainer.max_steps`` 20: the run ends at 20/50 of its
    learning rate (``warmup_cosine``'s (s + 1) / warmup at the last step, s = 19), and says so."""
    from posenc.module import warmup_cosine

    said = check_config(compose(["trainer.max_steps=20", "optim.warmup_steps=50", f"paths.data_dir={data_root}"]))
    (line,) = [w for w in said if "warmup" in w]
    assert line.startswith("optim.warmup_steps=50 is not below trainer.max_steps=20") and "40% of optim.lr" in line
    assert warmup_cosine(19, 50, 20, 0.1) == 0.4
    longer = check_config(compose(["trainer.max_steps=51", "optim.warmup_steps=50", f"paths.data_dir={data_root}"]))
    assert not [w for w in longer if "warmup" in w]


def test_the_project_root_holds_runs_store_and_cache_whatever_the_working_folder(tmp_path, monkeypatch):
    """From another folder, with ``POSENC_ROOT`` unset, a run's folders, its MLflow store and its
    cache are at the project root (the folder that holds ``conf/``), as the README says;
    ``POSENC_ROOT`` still moves them."""
    monkeypatch.delenv("POSENC_ROOT", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = compose([])
    assert Path(cfg.paths.root) == REPO == project_root()
    assert cfg.paths.output_dir == f"{REPO}/outputs" and cfg.paths.cache_dir == f"{REPO}/.cache/posenc"
    assert cfg.logger.tracking_uri == f"sqlite:///{REPO}/mlflow.db" == tracking.default_tracking_uri()
    monkeypatch.setenv("POSENC_ROOT", str(tmp_path))
    assert compose([]).paths.root == str(tmp_path) and project_root() == tmp_path


def test_the_closing_line_is_short_and_names_the_run_its_scores_and_folder():
    metrics = {"val/loss": 1.93, "val/ppl": 6.9087, "train/loss": 2.0, "train/lr": 1e-4, "global_step": 600.0}
    line = closing_line("rope-lm-tinyshakespeare-s0", metrics, 46.2, Path.cwd() / "outputs" / "runs" / "x")
    assert line == "finished rope-lm-tinyshakespeare-s0: val ppl 6.909, step 600, 46 s -> outputs/runs/x"
    exact = closing_line("alibi-retrieval-s0", {"val/exact": 0.925, "global_step": 300}, 13, "/elsewhere/run")
    assert exact == "finished alibi-retrieval-s0: val exact 92.5%, step 300, 13 s -> /elsewhere/run"


def test_known_third_party_warnings_are_filtered_by_name_and_no_other():
    """Lightning's ``_pytree`` builds a ``LeafSpec``, which torch deprecates: the warning every run
    printed. Filtered (``KNOWN_WARNINGS``: its module, category and message), it is gone; the same
    category from elsewhere is not."""
    from lightning.pytorch.utilities._pytree import _tree_flatten

    def caught(quiet: bool) -> list[str]:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if quiet:
                quiet_known_warnings()
            _tree_flatten(1)
            warnings.warn("another future change", FutureWarning)
        return [str(w.message) for w in seen]

    assert any("LeafSpec" in m for m in caught(False)), "the warning is no longer raised: drop it from KNOWN_WARNINGS"
    assert caught(True) == ["another future change"]
    assert [category for _, category, _ in KNOWN_WARNINGS] == [FutureWarning]


def test_a_sweep_ends_with_the_mlflow_compare_link_of_its_runs(tmp_path, capsys):
    """``CompareSweep`` (a Hydra callback, ``conf/hydra/default.yaml``) reads the ``run.json`` of
    every run under the sweep's folder and prints MLflow's compare view of their runs: the route
    MLflow's own UI builds (``#/compare-runs?runs=[...]&experiments=[...]``, JSON lists)."""
    from urllib.parse import unquote

    for n, run_id in enumerate(["aaa", "bbb"]):
        folder = tmp_path / f"{n}_rope-lm-s{n}"
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({"mlflow_run_id": run_id, "mlflow_experiment_id": "3"}))
    CompareSweep().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"sweep: 2 runs in {tmp_path}; compare them in MLflow: http://127.0.0.1:5000/#/compare-runs?")
    assert unquote(line.split("?", 1)[1]) == 'runs=["aaa","bbb"]&experiments=["3"]'
    hydra = OmegaConf.load(REPO / "conf/hydra/default.yaml")
    assert hydra.callbacks.compare_link._target_ == "posenc.callbacks.CompareSweep"
