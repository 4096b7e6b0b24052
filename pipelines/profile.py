"""Profiles: the study under other settings, each a DVC pipeline of its own.

    python -m pipelines.profile wikitext-bytes          # write its dvc.yaml, then dvc repro it
    python -m pipelines.profile wikitext-bytes --write  # write its dvc.yaml only
    python -m pipelines.profile --check                 # every committed profile pipeline is current

A profile is a folder ``profiles/<name>/`` with its own ``params.yaml`` (the same keys as
the default study's). Its ``dvc.yaml`` is made from the project's (``profile_pipeline``; the
project's is made from the stages ``pipelines.pipeline`` declares, and ``python -m
pipelines.pipeline`` writes both), so the two never drift apart: every stage runs at the project root (``wdir: ../..``)
with the profile's params, and writes its results, figures, stage records and runs under
``profiles/<name>/`` (``results/``, ``figures/``, ``runs/``), its MLflow runs to an
experiment of its own (``posenc-study-<name>``). Stages that do not depend on the study's
settings are left out: the benchmark and MiniLM's analysis (the default study has them),
the summaries across studies (papers, findings, scales, the chronology) and the report (which
renders a page for every profile that has results; after its repro a profile runs those
summaries and the report again, ``dvc repro --force --single-item``, so that they read it: their
dependencies do not name a profile's files, which a project without the profile lacks), except a
trial (``trial: true`` in its params.yaml: ``smoke``, every stage in minutes, to try a change),
which they leave out and whose outputs git ignores. ``dvc repro``
at the project root does not run a profile; ``dvc status`` lists the stages of a
profile's pipeline whose code or settings changed since its results were made. Its
``dvc.lock`` records which code made them.

A profile can be *frozen* (``python -m pipelines.profile <name> --freeze "<why>"``: its
params.yaml gains ``frozen: <why>``): its results stay the record of the code that made them
(an exploratory study kept beside a confirmatory one). Every stage of its pipeline is then
marked ``frozen: true``, which ``dvc status`` does not check and ``dvc repro`` does not run; its
``dvc.yaml`` keeps the stages that made the results (``--check`` asks only that each is frozen,
not that it follows the project's ``dvc.yaml``), and running it is refused: ``dvc repro
--force`` would record today's code in its ``dvc.lock`` without training anything.
``--thaw`` lifts this, writing the pipeline from the project's again, to run it anew.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
#: stages of the default study a profile leaves out (their results do not depend on its settings)
LEFT_OUT = ("bench", "pretrained_correlations", "papers", "findings", "scales", "chronology", "report")
#: the root stages that read the profiles' results, run again after a profile's repro
SUMMARIES = ("papers", "findings", "scales", "chronology", "report")
#: what a profile writes under its own folder
OWN = ("results", "figures", "runs")
EXPERIMENT = "posenc-study"
HEADER = ("# Made by `python -m pipelines.profile {name}` from the project's dvc.yaml (made from\n"
          "# pipelines/pipeline.py: edit the stages there, or this profile's params.yaml, then run\n"
          "# python -m pipelines.pipeline). Run: python -m pipelines.profile {name}\n")


def _paths(name: str):
    """A function that moves a path (or every path in a command) of the study's own
    outputs and params file under ``profiles/<name>/``."""
    base = f"profiles/{name}"
    token = re.compile(r"(?<![\w/.=${}-])((?:%s)(?=[/\s\"]|$)|params\.yaml(?=[\s\"]|$))" % "|".join(OWN))

    def move(text: str) -> str:
        text = token.sub(lambda m: f"{base}/{m.group(1)}", text)
        return re.sub(rf"\b{EXPERIMENT}\b(?!-)", f"{EXPERIMENT}-{name}", text)

    return move


def _entry(e, move):
    """A deps/outs/metrics entry (a path, or {path: options}) moved by ``move``."""
    if isinstance(e, dict):
        return {move(k): v for k, v in e.items()}
    return move(e)


def _path_of(e) -> str:
    return next(iter(e)) if isinstance(e, dict) else e


def _within(e, paths: set[str]) -> bool:
    """Whether an entry's path is one of ``paths`` or lies in one of them."""
    path = _path_of(e)
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths)


def profile_pipeline(name: str, pipeline: dict) -> dict:
    """The profile's pipeline from the project's (``dvc.yaml`` as loaded)."""
    move = _paths(name)
    params_file = f"profiles/{name}/params.yaml"
    stages = pipeline["stages"]
    dropped = {_path_of(o) for s in LEFT_OUT if s in stages
               for o in (stages[s].get("do", stages[s]).get("outs") or [])}
    out = {}
    for stage, spec in stages.items():
        if stage in LEFT_OUT:
            continue
        spec = dict(spec)
        body = dict(spec.get("do", spec))
        cmd = body["cmd"]
        for path in dropped:  # a stage that lists what a left-out stage makes (publish) leaves it out
            cmd = re.sub(rf"(?<=\s){re.escape(path)}(?=\s|$)", "", cmd)
        body["cmd"] = re.sub(r"[ \t]+", " ", move(cmd)).strip()
        for key in ("deps", "outs", "metrics", "plots"):
            if key in body:
                body[key] = [_entry(e, move) for e in body[key] if not _within(e, dropped)]
        keys = [p for p in body.get("params", []) if isinstance(p, str)]
        if keys:
            body["params"] = [{params_file: keys}]
        body = {"wdir": "../..", **body}
        if "do" in spec:
            spec["do"] = body
        else:
            spec = body
        out[stage] = spec
    result = {"stages": out}
    if "plots" in pipeline:
        result["plots"] = [_entry(e, move) for e in pipeline["plots"] if not _within(e, dropped)]
    return result


def frozen_pipeline(pipeline: dict) -> dict:
    """``pipeline`` (a dvc.yaml as loaded) with every stage marked ``frozen: true`` (in ``do``
    for a stage made per item)."""
    stages = {}
    for stage, spec in pipeline["stages"].items():
        spec = dict(spec)
        if "do" in spec:
            spec["do"] = {**spec["do"], "frozen": True}
        else:
            spec["frozen"] = True
        stages[stage] = spec
    return {**pipeline, "stages": stages}


def _dump(name: str, pipeline: dict) -> str:
    return HEADER.format(name=name) + yaml.safe_dump(pipeline, sort_keys=False, width=120, allow_unicode=True)


def render(name: str, root: Path = ROOT) -> str:
    pipeline = yaml.safe_load((root / "dvc.yaml").read_text())
    return _dump(name, profile_pipeline(name, pipeline))


def profiles(root: Path = ROOT) -> list[str]:
    return sorted(p.parent.name for p in (root / "profiles").glob("*/params.yaml"))


def params_of(name: str, root: Path = ROOT) -> dict:
    return yaml.safe_load((root / "profiles" / name / "params.yaml").read_text()) or {}


def frozen(name: str, root: Path = ROOT) -> str | None:
    """Why the profile is frozen (its params.yaml's ``frozen``), or None when it is not."""
    why = params_of(name, root).get("frozen")
    return str(why) if why else None


def is_current(name: str, root: Path = ROOT) -> bool:
    """Whether the profile's committed dvc.yaml is as it should be: made from the project's
    dvc.yaml, or, for a frozen profile, with every stage frozen."""
    text = (root / "profiles" / name / "dvc.yaml").read_text()
    if not frozen(name, root):
        return text == render(name, root)
    pipeline = yaml.safe_load(text)
    return pipeline == frozen_pipeline(pipeline)


def freeze(name: str, why: str, root: Path = ROOT) -> None:
    """Freeze the profile (the module's docstring): ``frozen: <why>`` appended to its params.yaml
    (its comments kept), every stage of its committed pipeline marked frozen."""
    target = root / "profiles" / name / "dvc.yaml"
    if not target.exists():
        raise SystemExit(f"profile {name}: no profiles/{name}/dvc.yaml: a profile that never ran has nothing to keep")
    params = root / "profiles" / name / "params.yaml"
    text = params.read_text()
    if not frozen(name, root):
        line = yaml.safe_dump({"frozen": why}, width=100, allow_unicode=True)
        params.write_text(text + ("" if text.endswith("\n") else "\n") + line)
    target.write_text(_dump(name, frozen_pipeline(yaml.safe_load(target.read_text()))))


def thaw(name: str, root: Path = ROOT) -> None:
    """Lift the freeze: the ``frozen`` key out of params.yaml, the pipeline made from the project's."""
    params = root / "profiles" / name / "params.yaml"
    lines = params.read_text().splitlines(keepends=True)
    kept, skipping = [], False
    for line in lines:  # the key and its continuation lines (a folded string is indented)
        skipping = line.startswith("frozen:") or (skipping and line.startswith((" ", "\t")))
        if not skipping:
            kept.append(line)
    params.write_text("".join(kept))
    (root / "profiles" / name / "dvc.yaml").write_text(render(name, root))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="a profile: a folder profiles/<name>/ with a params.yaml")
    p.add_argument("--write", action="store_true", help="write the profile's dvc.yaml, run nothing")
    p.add_argument("--check", action="store_true", help="fail when a committed profile dvc.yaml is not current")
    p.add_argument("--force", action="store_true", help="dvc repro --force: every stage of the profile")
    p.add_argument("--freeze", metavar="WHY", help="keep its results as the record of the code that made them")
    p.add_argument("--thaw", action="store_true", help="lift --freeze: its pipeline made from the project's again")
    a = p.parse_args(argv)
    if a.check:
        stale = [n for n in profiles(ROOT) if (ROOT / "profiles" / n / "dvc.yaml").exists() and not is_current(n, ROOT)]
        if stale:
            print(f"profile pipelines not made from the current dvc.yaml (or, frozen, with a stage not frozen): "
                  f"{', '.join(stale)}; run python -m pipelines.profile <name> --write", file=sys.stderr)
            return 1
        print("profile pipelines: current")
        return 0
    known = profiles(ROOT)
    if a.name not in known:
        p.error(f"profile {a.name!r}: no profiles/{a.name}/params.yaml; profiles: {', '.join(known) or 'none'}")
    if a.freeze or a.thaw:
        if a.freeze:
            freeze(a.name, a.freeze, ROOT)
        else:
            thaw(a.name, ROOT)
        print(f"profiles/{a.name}: {'frozen' if a.freeze else 'thawed'}; commit its params.yaml and dvc.yaml")
        return 0
    why = frozen(a.name, ROOT)
    if why:
        print(f"profiles/{a.name} is frozen ({why}): its results are the record of the code that made them, and "
              f"dvc repro runs none of its stages (--force would record today's code without training). To make "
              f"it again with today's code: python -m pipelines.profile {a.name} --thaw, then run it", file=sys.stderr)
        return 2
    target = ROOT / "profiles" / a.name / "dvc.yaml"
    text = render(a.name)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    print(f"wrote {target.relative_to(ROOT)}")
    if a.write:
        return 0
    rc = subprocess.call(["dvc", "repro", *(["--force"] if a.force else []), str(target.relative_to(ROOT))],
                         cwd=ROOT)
    if rc != 0:
        return rc
    if params_of(a.name, ROOT).get("trial"):
        print(f"profiles/{a.name} is a trial (trial: true): its results are under profiles/{a.name}/, "
              f"and the summaries and the report leave it out")
        return 0
    # the summaries across studies and the report read every profile that has results: run them
    # again (their declared dependencies do not name the profiles'), recorded in the root dvc.lock
    return subprocess.call(["dvc", "repro", "--force", "--single-item", *SUMMARIES], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
