"""``dvc status``, explained: one line a stage, grouped by what running it takes.

    python -m pipelines.status                  # every pipeline: the default one and each profile's
    python -m pipelines.status dvc.yaml head64  # some: a dvc.yaml, or a profile's name

``dvc status`` lists every dependency of every stale stage (a new scheme's study stage lists
the whole shared core as "modified": it has no entry in ``dvc.lock`` yet). This command reads
the same answer (``dvc status --json``) and says, for each stage, what it is and why it would
run, in three groups:

* **re-trains**: a study stage, the runs of one scheme (minutes each, on a CPU);
* **reads the trained runs**: a scheme's heatmaps and the ``publish`` stage, which need the
  run folders (``runs/``, not committed: a clone has none; ``publish`` then keeps the
  committed record, a heatmaps stage cannot run);
* **summaries and bookkeeping**: the data, the fingerprints, the tables, figures, benchmark and
  report, which read committed results and train nothing.

Frozen profiles (``pipelines.profile``: kept as the record of the code that made them), which
``dvc status`` does not check, are listed last with why each was frozen.

Each line names its pipeline (``default``, or ``profile <name>``). Where the ``fingerprint``
stage is listed, the study stages its run would make stale (a scheme's own code edited: ``dvc
status`` cannot see that until the fingerprint stage has run) are listed too, from
``pipelines.fingerprint.plan``. Nothing is written and no stage runs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from pipelines import profile

ROOT = Path(__file__).resolve().parents[1]

TRAINS, RUNS, SUMMARY = "re-trains", "reads the trained runs", "summaries and bookkeeping"
GROUPS = {TRAINS: "each a scheme's runs: minutes per run on a CPU",
          RUNS: "runs/ is not committed: a clone has none",
          SUMMARY: "read the committed results; no training"}
#: what each kind of stage is, in a few words
WHAT = {"prepare": "prepares the data", "fingerprint": "recomputes the schemes' fingerprints",
        "study": "trains {scheme}'s runs", "heatmaps": "draws {scheme}'s heatmaps from its runs",
        "correlations": "gathers the heatmaps", "pretrained_correlations": "analyses MiniLM",
        "tables": "the LM, MLM and task tables", "buckets": "T5's trained buckets",
        "figures": "the extrapolation figure", "retrieval": "the retrieval tables and figures",
        "bench": "the benchmark (every scheme)", "publish": "the study run in MLflow",
        "report": "docs/results.md and the README's blocks"}


@dataclass
class Line:
    """One stale stage: its pipeline (``default`` or ``profile <name>``), its name, its group and why."""

    pipeline: str
    stage: str
    group: str
    why: str

    def __str__(self) -> str:
        return f"  {self.stage:<26} {self.pipeline:<24} {self.why}"


def dvc_status(targets: list[str], root: Path = ROOT) -> dict:
    """``dvc status --json`` of ``targets`` (every pipeline of the project when empty)."""
    out = subprocess.run([sys.executable, "-m", "dvc", "status", "--json", *targets], cwd=root, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"status: dvc status failed: {out.stderr.strip()[-1500:]}")
    return json.loads(out.stdout or "{}")


def pipelines_of(names: list[str], root: Path = ROOT) -> list[Path]:
    """The dvc.yaml files of ``names`` (a path, or a profile's name); every committed one when empty."""
    if not names:
        return [root / "dvc.yaml", *sorted(p for p in (root / "profiles").glob("*/dvc.yaml"))]
    out = []
    for n in names:
        path = root / "profiles" / n / "dvc.yaml" if n in profile.profiles(root) else root / n
        if not path.is_file():
            raise SystemExit(f"status: no pipeline {n!r}: give dvc.yaml, a profile ({', '.join(profile.profiles(root))}) "
                             "or the path of a dvc.yaml")
        out.append(path)
    return out


def _shown(paths: list[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def reasons(changes: list, new: bool) -> str:
    """Why ``dvc status`` lists a stage, in a few words, from its ``--json`` entry."""
    if new:
        return "new: no entry in dvc.lock yet"
    code, inputs, settings, other = [], [], [], []
    for change in changes:
        if not isinstance(change, dict):
            other.append(str(change))  # "changed command", "always changed"
            continue
        for kind, paths in change.items():
            for path, what in (paths or {}).items():
                if isinstance(what, dict):  # a params file: {key: modified}
                    settings += [f"{key}" for key in what]
                elif kind == "changed outs":
                    other.append(f"output {what}: {path}")
                elif path.endswith("params.yaml"):
                    settings.append(path)
                elif Path(path).name == "runs" and Path(path).parent.name != "results":  # runs/, profiles/x/runs
                    other.append(f"the trained runs ({path}: {what})")
                elif path.startswith(("results/", "figures/", "profiles/")) or "/results/" in path:
                    inputs.append(f"{path} ({what})")
                else:
                    code.append(path)
    parts = [f"its code changed: {_shown(code)}" if code else "", f"its inputs changed: {_shown(inputs)}" if inputs
             else "", f"its settings changed: {_shown(settings)}" if settings else "", _shown(other) if other else ""]
    return "; ".join(p for p in parts if p)


def locked(pipeline: Path) -> set[str]:
    """The stages ``dvc.lock`` beside ``pipeline`` records."""
    lock = pipeline.with_name("dvc.lock")
    return set((yaml.safe_load(lock.read_text()) or {}).get("stages", {})) if lock.is_file() else set()


def runs_here(pipeline: Path, scheme: str | None, root: Path = ROOT) -> bool:
    """Whether the trained runs a stage reads are here (``runs/<scheme>``, or any, for publish)."""
    from posenc.runs import RunFolder

    base = root / "runs" if pipeline.parent == root else pipeline.parent / "runs"
    return bool(RunFolder.under(base / scheme if scheme else base))


def fingerprint_plan(pipeline: Path, root: Path = ROOT) -> dict[str, str]:
    """{scheme: what changes in its fingerprint} for the schemes whose fingerprint the pipeline's
    fingerprint stage would write anew (``pipelines.fingerprint.plan``), read from its command."""
    from pipelines.fingerprint import plan
    from pipelines.gather import study_schemes

    cmd = shlex.split(yaml.safe_load(pipeline.read_text())["stages"]["fingerprint"]["cmd"])
    params, out = cmd[cmd.index("--params") + 1], cmd[cmd.index("--out-dir") + 1]
    planned = plan(study_schemes(str(root / params)), root / out)
    return {s: what for s, (what, doc) in planned.items() if what != "unchanged" and doc is not None}


def explain(pipeline: Path, entries: dict, root: Path = ROOT) -> list[Line]:
    """One ``Line`` per stale stage of ``pipeline`` (``entries``: its part of ``dvc status --json``,
    stage names without the file prefix), and one per study stage its fingerprints would make stale."""
    name = "default" if pipeline.parent == root else f"profile {pipeline.parent.name}"
    have, out = locked(pipeline), []
    for stage, changes in entries.items():
        kind, _, scheme = stage.partition("@")
        what = WHAT.get(kind, kind).format(scheme=scheme)
        why = reasons(changes, stage not in have)
        if kind == "study":
            out.append(Line(name, stage, TRAINS, f"{what}; {why}"))
        elif kind in ("heatmaps", "publish"):
            if runs_here(pipeline, scheme or None, root):
                where = "its runs are here"
            elif f"study@{scheme}" in entries:
                where = f"from the runs study@{scheme} makes first"
            elif kind == "publish":
                where = "the runs are not here: it keeps the committed record"
            else:
                where = f"its runs are not here: it cannot run (dvc repro --force study@{scheme} trains them again)"
            out.append(Line(name, stage, RUNS, f"{what}, {where}; {why}"))
        else:
            out.append(Line(name, stage, SUMMARY, f"{what}; {why}"))
    if "fingerprint" in entries:
        for scheme, change in fingerprint_plan(pipeline, root).items():
            if f"study@{scheme}" not in entries:
                out.append(Line(name, f"study@{scheme}", TRAINS, f"trains {scheme}'s runs; its fingerprint {change}: "
                                "listed by dvc status once the fingerprint stage has run"))
    return out


def collect(pipelines: list[Path], root: Path = ROOT) -> list[Line]:
    """Every stale stage of ``pipelines``, explained (``explain``)."""
    status = dvc_status([str(p.relative_to(root)) for p in pipelines], root)
    lines = []
    for p in pipelines:
        prefix = f"{p.relative_to(root).as_posix()}:"
        mine = {k.removeprefix(prefix): v for k, v in status.items()
                if k.startswith(prefix) or (p.parent == root and ":" not in k)}
        lines += explain(p, mine, root)
    return lines


def render(lines: list[Line]) -> str:
    """The grouped report: a count, then each group with its lines, then how to run them."""
    if not lines:
        return "dvc status: every stage of these pipelines is up to date (dvc repro would run nothing)"
    counts = ", ".join(f"{sum(line.group == g for line in lines)} {g}" for g in GROUPS)
    out = [f"dvc status, a stage a line ({len(lines)} stages: {counts}; nothing was run)"]
    for group, note in GROUPS.items():
        mine = [line for line in lines if line.group == group]
        if mine:
            out += ["", f"{group} ({note}):", *map(str, mine)]
    out += ["", "run them: dvc repro (the default pipeline), python -m pipelines.profile <name> (a profile's); "
            "python -m pipelines.fanout --dry-run lists the runs a training stage makes"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.status", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pipelines", nargs="*", help="dvc.yaml or a profile's name (default: every pipeline)")
    a = p.parse_args(argv)
    root = Path.cwd().resolve()  # the project dvc runs in
    chosen = pipelines_of(a.pipelines, root)
    print(render(collect(chosen, root)))
    kept = [(p.parent.name, why) for p in chosen if p.parent != root and (why := profile.frozen(p.parent.name, root))]
    if kept:
        print("\nfrozen, not checked (each the record of the code that made it; python -m pipelines.profile <name> "
              "--thaw to make it again):", *(f"  profile {n}: {why}" for n, why in kept), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
