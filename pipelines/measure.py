"""The times the README gives, measured on a fresh clone and kept as records that the report
renders, so that no time in the README is typed by hand.

    python -m pipelines.measure quickstart     # `python train.py`: its seconds and its final val ppl
    python -m pipelines.measure tests          # plain `pytest`, then the full suite (.ci/run's command)
    python -m pipelines.measure pytest         # one of them
    python -m pipelines.measure full --output full.log   # and keep what the command printed
    python -m pipelines.report                 # then: the README's blocks from the new records

Each measurement clones HEAD into a folder beside the project (so that ``../shared/data`` is
where it is for the project), runs the command there with this interpreter and the clone's own
code (``PYTHONPATH=<clone>/src:<clone>``) and this environment's ``OMP_NUM_THREADS`` (unset, as
in a new user's shell: torch's default, a thread per core; the record says which), writes its record to
``docs/measured/<name>.json`` and removes the clone. Compiled code starts cold, as on the new
machine CI runs on: Inductor's kernels and FIRE's extension are built into empty caches, not read
from this machine's (the full suite took 1070 s with Inductor's cache warm from earlier runs, against
1224 s with it cold). A record holds the command, its seconds,
what it printed last (the tests' count, the run's val ppl), the commit, the day, the CPU
(``posenc.machine``), the cores, ``OMP_NUM_THREADS`` and the load average before and after (the machine may have
been shared: that is the number that says so). ``python -m pipelines.report --check`` fails
when the README's blocks differ from what the records give; the default ``dvc repro``'s time
comes from the study's own stage records (``results/times``), not from here.

The full suite is the command ``.ci/run`` ends with (what CI runs), read from it, so that
measuring it again after the suite is reorganised needs no edit here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = "docs/measured"
#: what can be measured: a name, what it is, and its command (None: read from .ci/run)
WHAT = {"quickstart": ("the quick start's run, `python train.py`", ["python", "train.py"]),
        "pytest": ("plain `pytest`", ["python", "-m", "pytest", "-q"]),
        "full": ("the full suite (what CI runs, `.ci/run`)", None)}
GROUPS = {"tests": ["pytest", "full"]}


def ci_command(root: Path = ROOT) -> list[str]:
    """The test command ``.ci/run`` ends with, with ``python`` for its interpreter."""
    lines = [line for line in (root / ".ci/run").read_text().splitlines() if "pytest" in line and
             not line.lstrip().startswith("#")]
    words = shlex.split(lines[-1])
    return ["python", *words[1:]] if words[0].endswith("python") else words


def fresh_clone(root: Path) -> Path:
    """A clone of HEAD in a new folder beside ``root``."""
    dst = Path(tempfile.mkdtemp(prefix=f"{root.name}-measure-", dir=root.parent))
    subprocess.run(["git", "clone", "-q", str(root), str(dst)], check=True)
    return dst


def last_words(name: str, clone: Path, output: str) -> str:
    """What the measured command ended with: the tests' counts, or the run's val ppl."""
    if name == "quickstart":
        from posenc.runs import RunFolder

        (run,) = RunFolder.under(clone / "outputs")
        return f"val ppl {json.loads(run.metrics.read_text())['val/ppl']:.3f}"
    counts = re.findall(r"^=*\s*(\d+ passed.*?) in [\d.]+s", output, re.M)
    return counts[-1] if counts else output.strip().splitlines()[-1][:200]


def measure(name: str, root: Path = ROOT, output: Path | None = None) -> dict:
    """Run ``name``'s command on a fresh clone of HEAD and return its record; what the command
    printed (stdout, then stderr) goes to ``output`` too, when given."""
    from posenc.machine import machine

    what, command = WHAT[name]
    command = command or ci_command(root)
    clone = fresh_clone(root)
    # compiled code starts cold, as on the new machine CI runs on: Inductor's kernels and FIRE's
    # extension are built again, into empty caches, not read from this machine's
    caches = Path(tempfile.mkdtemp(prefix="posenc-measure-caches-"))
    env = dict(os.environ, PYTHONPATH=f"{clone / 'src'}{os.pathsep}{clone}",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"), TORCH_EXTENSIONS_DIR=str(caches / "torch_extensions"))
    env.pop("POSENC_ROOT", None)
    try:
        load, t0 = os.getloadavg(), time.time()
        out = subprocess.run([sys.executable if command[0] == "python" else command[0], *command[1:]], cwd=clone,
                             env=env, capture_output=True, text=True)
        seconds = time.time() - t0
        if output is not None:
            output.write_text(out.stdout + out.stderr)
        if out.returncode != 0:
            raise SystemExit(f"measure {name}: `{' '.join(command)}` exited {out.returncode}:\n{out.stdout[-2000:]}"
                             f"{out.stderr[-2000:]}")
        said = last_words(name, clone, out.stdout + out.stderr)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    finally:
        shutil.rmtree(clone, ignore_errors=True)
        shutil.rmtree(caches, ignore_errors=True)
    return {"what": what, "command": " ".join(command), "seconds": round(seconds, 1), "said": said, "commit": commit,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": machine()["cpu"],
            "cores": len(os.sched_getaffinity(0)), "threads": env.get("OMP_NUM_THREADS"),
            "load": [round(load[0], 2), round(os.getloadavg()[0], 2)],
            "source": f"python -m pipelines.measure {name}, on a fresh clone"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.measure", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=[*WHAT, *GROUPS], help="what to measure")
    p.add_argument("--output", type=Path, help="keep what each command printed: <output> for one, "
                   "<stem>-<name><suffix> for each of a group")
    a = p.parse_args(argv)
    from posenc.files import write_json

    names = GROUPS.get(a.what, [a.what])
    for name in names:
        output = a.output if a.output is None or len(names) == 1 else \
            a.output.with_name(f"{a.output.stem}-{name}{a.output.suffix}")
        record = measure(name, output=output)
        write_json(ROOT / RECORDS / f"{name}.json", record)
        print(f"{name}: {record['seconds']:.0f} s, {record['said']} ({record['cpu']}, {record['cores']} cores, load "
              f"{record['load'][0]} before) -> {RECORDS}/{name}.json; `python -m pipelines.report` puts it in the README")
    return 0


if __name__ == "__main__":
    sys.exit(main())
