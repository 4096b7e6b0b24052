"""How a declared stage becomes ``dvc.yaml``: ``Stage`` and ``Out``, and the pipeline made of them.

A stage declares its command, dependencies, params and outputs (``Stage``), and each output
who reads it besides DVC (``Out``): the study's MLflow run (``publish``) and the report
(``report``, and ``name`` when its templates read it as ``study.<name>``). From that one
declaration come the stage in ``dvc.yaml``, the publish stage's artifacts (its command line
and dependencies), the report stage's dependencies and the report's table of results files
(``read_by_name``: ``pipelines.results.FILES``). A study stage's outputs are its time record,
its runs file and the files each task of the study writes (``posenc.tasks.Task.outputs``, for
the tasks of ``params.yaml``). The project's stages are declared in ``pipelines.pipeline``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

#: the first lines of dvc.yaml
HEADER = ("# Made by `python -m pipelines.pipeline` from the stages it declares: edit them there (or params.yaml),\n"
          "# then run the command again; tests/test_stages.py fails while this file is not what they make.\n#\n")


@dataclass(frozen=True)
class Out:
    """An output of a stage (never in DVC's cache: the results are committed), and who reads it.

    ``publish``: an artifact of the study's MLflow run; ``report``: a dependency of the report,
    which its templates read as ``study.<name>`` when ``name`` is given (``part``: the file of
    a folder output it reads); ``persist``: DVC does not delete it before the stage runs (a
    failed stage leaves it as it was); ``metric``: one of DVC's metrics (``dvc metrics show``)."""

    path: str
    publish: bool = False
    report: bool = False
    name: str | None = None
    part: str | None = None
    persist: bool = False
    metric: bool = False

    def read(self) -> str:
        """The path the report reads."""
        return f"{self.path}/{self.part}" if self.part else self.path


@dataclass(frozen=True)
class Stage:
    """A stage of ``dvc.yaml``. ``cmd`` runs under ``pipelines.timed``, which records its time
    (``results/times/<stage>.json``, read by the report) unless ``timed`` is off; ``foreach``:
    a stage per scheme (``${key}``, ``${item}``); ``task_outputs``: its outputs include each
    task's files of the scheme (the study); ``persist``: every output of it persists, its time
    record too (``Out.persist``); ``gathers``: ``publish`` takes every published output as an
    artifact and a dependency, ``report`` every output the report reads as a dependency.
    ``about``: the comment above it in ``dvc.yaml``."""

    name: str
    cmd: str
    deps: Sequence[str] = ()
    params: Sequence[str] = ()
    outs: Sequence[Out] = ()
    about: str = ""
    foreach: str | None = None
    timed: bool = True
    task_outputs: bool = False
    persist: bool = False
    gathers: str | None = None

    @property
    def key(self) -> str:
        return f"{self.name}@${{key}}" if self.foreach else self.name

    def record(self) -> Out | None:
        """Its time record, which the report reads (all of them: ``results/times``)."""
        return Out(f"results/times/{self.key}.json", report=True) if self.timed else None

    def outputs(self, root: Path) -> list[Out]:
        """Its time record, its declared outputs, and (the study) each task's files of the scheme."""
        record = self.record()
        outs = [*([record] if record else []), *self.outs, *(task_outputs(root) if self.task_outputs else [])]
        return [dataclasses.replace(o, persist=True) for o in outs] if self.persist else outs


def task_outputs(root: Path) -> list[Out]:
    """The files a study stage writes of its scheme for each task of ``root/params.yaml``
    (``posenc.tasks.Task.outputs``, under ``results/``; the task's class named in ``root/conf``)."""
    from posenc.tasks import load

    params = yaml.safe_load((root / "params.yaml").read_text()) or {}
    return [Out(f"results/{path}") for name in params.get("tasks") or {}
            for path in load(name, root / "conf").outputs("${key}")]


# ------------------------------------------------------------------ who reads what
def _listed(paths: Iterable[str]) -> list[str]:
    """``paths`` as a list of dependencies: a per-scheme path (``${key}``) by its folder, and a
    path inside another listed one left out; in the order they come."""
    folded = list(dict.fromkeys(str(Path(p).parent) if "${" in p else p for p in paths))
    return [p for p in folded if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in folded)]


def published(stages: Sequence[Stage], root: Path) -> list[str]:
    """The study run's artifacts: every published output, in the order of the stages."""
    return _listed(o.path for s in stages for o in s.outputs(root) if o.publish)


def reported(stages: Sequence[Stage], root: Path) -> list[str]:
    """What the report reads: every output it reads, in the order of the stages."""
    return _listed(o.read() for s in stages for o in s.outputs(root) if o.report or o.name)


def read_by_name(stages: Sequence[Stage]) -> dict[str, str]:
    """{name: path} of the outputs the report's templates read as ``study.<name>``."""
    return {o.name: o.read() for s in stages for o in s.outs if o.name}


# ------------------------------------------------------------------ dvc.yaml
def body(stage: Stage, stages: Sequence[Stage], root: Path) -> dict:
    """The stage as ``dvc.yaml`` holds it (under ``do:`` for a stage per scheme)."""
    cmd, deps = stage.cmd, list(stage.deps)
    if stage.gathers == "publish":
        gathered = published(stages, root)
        cmd, deps = " ".join([cmd, *gathered]), [*deps, *gathered]
    elif stage.gathers == "report":
        deps = [*deps, *reported(stages, root)]
    if stage.timed:
        cmd = f"python -m pipelines.timed {stage.record().path} {cmd}"
    out: dict = {"cmd": _Folded(cmd) if len(cmd) > 100 else cmd}
    if deps:
        out["deps"] = deps
    if stage.params:
        out["params"] = list(stage.params)
    outs = stage.outputs(root)
    for key, chosen in (("outs", [o for o in outs if not o.metric]), ("metrics", [o for o in outs if o.metric])):
        if chosen:
            out[key] = [{o.path: {"cache": False, **({"persist": True} if o.persist else {})}} for o in chosen]
    return {"foreach": stage.foreach, "do": out} if stage.foreach else out


def pipeline(stages: Sequence[Stage], plots: Sequence[str], root: Path) -> dict:
    """``dvc.yaml`` as loaded: {"stages": {name: body}, "plots": [...]}."""
    return {"stages": {s.name: body(s, stages, root) for s in stages}, "plots": list(plots)}


class _Folded(str):
    """A long command, written folded over lines (``>-``), as YAML reads it back: one line."""


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False):  # lists indented under their key
        return super().increase_indent(flow, False)


_Dumper.add_representer(_Folded, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", str(s), style=">"))


def _comment(text: str, indent: str) -> str:
    return "".join(f"{indent}# {line}".rstrip() + "\n" for line in text.strip("\n").splitlines()) if text else ""


def _yaml(obj: dict, indent: str = "") -> str:
    text = yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)
    return "".join(indent + line if line.strip() else line for line in text.splitlines(keepends=True))


def render(stages: Sequence[Stage], plots: Sequence[str], root: Path, top: str = "", plots_about: str = "") -> str:
    """The text of ``dvc.yaml``: the pipeline, with ``top`` above it, each stage's ``about``
    above the stage and ``plots_about`` above the plots. Read back, it is ``pipeline(stages,
    plots, root)`` (checked here)."""
    made = pipeline(stages, plots, root)
    parts = [HEADER, _comment(top, ""), "stages:\n"]
    for i, s in enumerate(stages):
        parts += ["\n" if i else "", _comment(s.about, "  "), _yaml({s.name: made["stages"][s.name]}, "  ")]
    parts += ["\n", _comment(plots_about, ""), _yaml({"plots": made["plots"]})]
    text = "".join(parts)
    if yaml.safe_load(text) != made:
        raise RuntimeError("dvc.yaml as written does not read back as the declared pipeline: a command or path "
                           "that YAML reads otherwise (a leading space, a tab, two spaces in a row)")
    return text
