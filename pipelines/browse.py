"""Look at the MLflow UI as a new user sees it, in headless Chromium.

    python -m pipelines.browse --store mlflow.db --experiment posenc --out-dir docs/screenshots

Starts ``mlflow ui`` on 127.0.0.1 over the SQLite store, opens the links that posenc
prints after a run (``posenc.tracking.ui_url``): the runs table and one run's page, in
Chromium (``apt-get install chromium``), saves a screenshot of each, and checks the
rendered page: the runs table (not MLflow 3's GenAI view) lists every run of the
experiment by its name, and the run page shows the run's validation loss. Exits 1
naming what is missing, 0 when everything is there. Not part of the test suite,
which runs where no browser is installed; the URL itself is tested there.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float = 60.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"the MLflow UI did not answer at {url} within {seconds:.0f} s")


def chromium(*args: str, size: str = "1600,900", timeout: int = 120) -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        raise FileNotFoundError("no Chromium found: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--user-data-dir={profile}", f"--window-size={size}", "--virtual-time-budget=20000",
                            *args], capture_output=True, text=True, timeout=timeout)
    return r.stdout


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.browse", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", type=Path, default=Path("mlflow.db"), help="the SQLite store (default: mlflow.db here)")
    p.add_argument("--experiment", default="posenc", help="the experiment whose runs table and newest run are shown")
    p.add_argument("--out-dir", type=Path, default=Path("docs/screenshots"),
                   help="where mlflow-runs.png and mlflow-run.png go")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    from posenc.tracking import runs_of, sqlite_uri, ui_url

    uri = sqlite_uri(a.store)
    runs = runs_of(uri, a.experiment)
    if not runs:
        print(f"error: no experiment {a.experiment!r} with runs in {a.store}", file=sys.stderr)
        return 1
    exp_id = runs[0].info.experiment_id
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    problems = []
    try:
        wait_for(base + "/")
        table = ui_url(exp_id, base=base)
        dom = chromium("--dump-dom", table)
        chromium(f"--screenshot={out / 'mlflow-runs.png'}", table)
        if "Run Name" not in dom or "Evaluation runs" in dom:
            problems.append(f"{table} shows no runs table, or the GenAI view")
        problems += [f"run {r.info.run_name!r} is not in the runs table" for r in runs if r.info.run_name not in dom]
        run = runs[0]
        page = ui_url(exp_id, run.info.run_id, base)
        dom = chromium("--dump-dom", page)
        chromium(f"--screenshot={out / 'mlflow-run.png'}", page, size="1600,1300")  # down to its metrics
        if "val/loss" not in dom or "Evaluation runs" in dom:
            problems.append(f"the page of run {run.info.run_name!r} shows no val/loss or opens in the GenAI view")
    finally:
        server.terminate()
        server.wait(timeout=30)
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    print(f"screenshots: {out / 'mlflow-runs.png'}, {out / 'mlflow-run.png'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
