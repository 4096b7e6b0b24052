"""Shared fixtures: real data from POSENC_DATA_DIR, configs through Hydra's compose API."""

from __future__ import annotations

import os
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


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"may_skip(reason): a test whose skip is right even where {NO_SKIPS} is set (say why)"
    )


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


@pytest.fixture
def make_cfg(tmp_path, data_root, cache_dir):
    """compose(overrides) with the project root in tmp_path and the shared cache."""

    def make(*overrides: str):
        base = [f"paths.root={tmp_path}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}"]
        return compose(base + FAST + list(overrides))

    return make


def cli_env(tmp_path: Path, data_root: Path, cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(POSENC_ROOT=str(tmp_path), POSENC_DATA_DIR=str(data_root), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def cli_overrides(cache_dir: Path) -> list[str]:
    return [f"paths.cache_dir={cache_dir}"] + FAST
