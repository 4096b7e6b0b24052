"""Where things live: one home for the run folder's layout, one for MLflow I/O, and a
config layer that does not need Lightning (the study's stage commands, the benchmark and
the tests compose configs and build models through it)."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import REPO

CODE = [p for d in ("src", "pipelines", "analysis") for p in sorted((REPO / d).rglob("*.py"))]


def test_the_config_layer_composes_checks_and_builds_a_model_without_lightning():
    script = (
        "import sys\n"
        "from posenc.config import build_model, check_config, compose\n"
        "cfg = compose(['encoding=t5_bias', 'model=micro'])\n"
        "check_config(cfg)\n"
        "model = build_model(cfg, 260)\n"
        "assert type(model).__name__ == 'Transformer' and model.cfg.d_model == 64\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_mlflow_is_read_and_written_in_tracking_alone():
    importers = [p.relative_to(REPO).as_posix() for p in CODE
                 if re.search(r"^\s*(import mlflow|from mlflow)", p.read_text(), re.M)]
    assert importers == ["src/posenc/tracking.py"]


def test_the_run_folder_layout_is_named_in_runs_alone():
    names = r"""["'](run\.json|config\.yaml|metrics\.json|last\.ckpt|checkpoints)["']"""
    spelt = [p.relative_to(REPO).as_posix() for p in CODE if re.search(names, p.read_text())]
    assert spelt == ["src/posenc/runs.py"]
