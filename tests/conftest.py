"""Shared fixtures: real data from POSENC_DATA_DIR, configs through Hydra's compose API."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from posenc.config import compose


REPO = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    d = Path(os.environ.get("POSENC_DATA_DIR", REPO.parent / "shared" / "data"))
    if not (d / "wikitext-2" / "train.txt").exists():
        pytest.fail(f"the tests need the local corpora: set POSENC_DATA_DIR (looked in {d})")
    return d


NO_SKIPS = "POSENC_NO_SKIPS"  # set by .ci/run: a skipped test is a failure there


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="the full suite (what CI runs): the tests marked slow too; plain pytest leaves them out")


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core for the fast tier (its tests compute in their own process),
    two per core for the full suite, whose slow tests spend about half their time waiting on the
    processes they start (``dvc repro`` runs one stage at a time; a stage's interpreter starts and
    imports). Measured on 2 cores: the full suite took 2,168 s at a worker per core and 1,224 s at
    two per core, where the cores were 99% busy (2,440 CPU-seconds). No more workers than the
    memory holds at about 2 GiB each (that run peaked at 8.3 GiB in use with 4). The cores are
    counted as pytest-xdist counts them for the fast tier, and its ``PYTEST_XDIST_AUTO_NUM_WORKERS``
    still sets the count of both."""
    if not config.getoption("--full") or os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own count: a worker per core, or the variable's
    from xdist.plugin import pytest_xdist_auto_num_workers as per_core

    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(2 * per_core(config), int(memory_gib // 2)))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"may_skip(reason): a test whose skip is right even where {NO_SKIPS} is set (say why)"
    )


#: how many slow tests the fast tier left out
SLOW_LEFT_OUT = pytest.StashKey[int]()


def pytest_collection_modifyitems(config, items):
    """Two tiers: plain ``pytest`` runs the fast one, every test not marked ``slow``; ``pytest
    --full`` (CI) runs them all. A slow test trains more than a few steps or starts a process
    (``no_process_unless_slow`` fails an unmarked test that does)."""
    if config.getoption("--full"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    config.stash[SLOW_LEFT_OUT] = len(slow)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_terminal_summary(terminalreporter, config):
    left = config.stash.get(SLOW_LEFT_OUT, 0)
    if left:
        terminalreporter.write_line(f"the fast tier: {left} slow tests left out; `pytest --full` runs the full suite")


#: the programs a fast test may start: git (it answers in milliseconds: the history checks ask
#: it), and what torch's extension builder runs for FIRE's kernel (ninja, and the C++ compiler it
#: asks for its version even where the kernel is built already; the build itself, once a machine)
QUICK_PROGRAMS = {"git", "ninja", "c++", "g++", "gcc", "cc", "clang", "clang++"}


@pytest.fixture(autouse=True)
def no_process_unless_slow(request, monkeypatch):
    """A test not marked ``slow`` that starts a process (``subprocess``, ``multiprocessing``, a
    fork, ``posix_spawn``) fails, naming the program: the fast tier stays fast because what makes
    a test slow is checked, not remembered. ``QUICK_PROGRAMS`` are allowed."""
    if request.node.get_closest_marker("slow"):
        yield
        return
    import _posixsubprocess
    import subprocess

    started: list[str] = []

    def refuse(program: str):
        started.append(program)
        pytest.fail(f"{request.node.nodeid} starts a process ({program}): mark it @pytest.mark.slow", pytrace=False)

    real = _posixsubprocess.fork_exec

    def guarded(args, *rest, **kw):
        program = os.path.basename(os.fsdecode(args[0])) if args else "?"
        if program not in QUICK_PROGRAMS:
            refuse(program)
        return real(args, *rest, **kw)

    monkeypatch.setattr(_posixsubprocess, "fork_exec", guarded)
    monkeypatch.setattr(subprocess, "_fork_exec", guarded, raising=False)
    monkeypatch.setattr(os, "fork", lambda *a, **kw: refuse("a fork"))
    monkeypatch.setattr(os, "posix_spawn", lambda path, *a, **kw: refuse(os.path.basename(os.fsdecode(path))))
    yield
    if started:  # refused even where the code under test caught the failure
        pytest.fail(f"{request.node.nodeid} starts processes ({', '.join(started)}): mark it @pytest.mark.slow",
                    pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With POSENC_NO_SKIPS set (CI), a skipped test fails, naming the reason it gave, unless
    it is marked ``may_skip``: a check that quietly did not run is not a passed check."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(NO_SKIPS) and not item.get_closest_marker("may_skip"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = (
            f"skipped ({reason}), and {NO_SKIPS} is set: install what the test needs (.ci/run installs "
            "posenc[dev]), or mark it @pytest.mark.may_skip(reason=...) if not running it is right"
        )


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Test models are tiny: a second intra-op thread only adds waiting."""
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def no_tracking_uri_left_behind():
    """Lightning's MLflow logger writes MLFLOW_TRACKING_URI into this process's environment when
    a run opens its store, and the logger config reads the variable: a later run in this process
    (a test's, or a fixture's before it) or a subprocess (a submitit job, ``python train.py``)
    would log into that store. Each test starts, and ends, with the variable as the session
    began with it (a module's fixture, set up before this, may have trained a run)."""
    _session_tracking_uri()
    yield
    _session_tracking_uri()


#: MLFLOW_TRACKING_URI as the test session began (before any run wrote it)
SESSION_TRACKING_URI = os.environ.get("MLFLOW_TRACKING_URI")


def _session_tracking_uri() -> None:
    if SESSION_TRACKING_URI is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = SESSION_TRACKING_URI


@pytest.fixture(scope="session")
def data_root() -> Path:
    return data_dir()


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    """One tokenizer/token cache for the whole test session (and across sessions)."""
    d = REPO / ".cache" / "posenc"
    d.mkdir(parents=True, exist_ok=True)
    return d


FAST = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "data.seq_len=32",
    "data.batch_size=8",
    "data.eval_batch_size=16",
    "trainer.max_steps=20",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=4",
    "trainer.log_every_n_steps=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "log_checkpoint=false",
]


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """An SQLite store with MLflow's schema and nothing in it, made once per session (per
    worker): MLflow builds the schema in seconds (its migrations, one by one), and opens a
    copy of it in a tenth of one. What a run makes in it is what it makes in a store it
    creates itself: the same MLflow makes the same schema."""
    import mlflow

    from posenc.tracking import sqlite_uri

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    mlflow.MlflowClient(sqlite_uri(db)).search_experiments()
    return db


@pytest.fixture
def make_cfg(tmp_path, data_root, cache_dir, empty_store):
    """compose(overrides) with the project root in tmp_path and the shared cache; the project's
    default MLflow store (``<root>/mlflow.db``) starts as a copy of ``empty_store``."""

    def make(*overrides: str):
        base = [f"paths.root={tmp_path}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}"]
        if not (tmp_path / "mlflow.db").exists():
            shutil.copy(empty_store, tmp_path / "mlflow.db")
        return compose(base + FAST + list(overrides))

    return make


def cli_env(tmp_path: Path, data_root: Path, cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(POSENC_ROOT=str(tmp_path), POSENC_DATA_DIR=str(data_root), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def cli_overrides(cache_dir: Path) -> list[str]:
    return [f"paths.cache_dir={cache_dir}"] + FAST
