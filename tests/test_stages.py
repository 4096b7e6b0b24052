"""dvc.yaml is made from the stages declared in ``pipelines/pipeline.py``: each output is declared
once, with who reads it, and the study stage's outputs come from its tasks. A figure declared
once (a toy stage) is a stage, an artifact of the study's MLflow run and a file the report reads,
in dvc.yaml and in every profile's pipeline, with no hand edit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from pipelines import pipeline, profile
from pipelines.results import FILES
from pipelines.stages import Out, Stage, _listed, read_by_name
from posenc.taskbase import Task

from .conftest import REPO

#: a figure the project does not have: its module would be pipelines/toy.py, its template would
#: read ``study.toy``
TOY = Stage("toy", "python -m pipelines.toy results/extrapolation.csv --png figures/toy.png --json results/toy.json",
            deps=["results/extrapolation.csv", "pipelines/toy.py"], params=["schemes"],
            outs=[Out("figures/toy.png", publish=True), Out("results/toy.json", publish=True, name="toy")],
            about="a toy figure")


class Scored(Task):
    """A toy task whose study writes a file of rows per scheme (``results/scored/<scheme>.csv``)."""

    results = "scored"
    suffixes = ("csv",)


def _root(tmp_path, params: dict | None = None):
    """A project root holding what the pipeline is made from (params.yaml, conf/) and a profile
    ``demo`` with a pipeline of its own."""
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    text = yaml.safe_dump(params) if params else (REPO / "params.yaml").read_text()
    (tmp_path / "params.yaml").write_text(text)
    (tmp_path / "profiles" / "demo").mkdir(parents=True)
    (tmp_path / "profiles" / "demo" / "params.yaml").write_text(text)
    (tmp_path / "profiles" / "demo" / "dvc.yaml").write_text("stages: {}\n")
    return tmp_path


def test_the_committed_dvc_yaml_is_what_the_declared_stages_make():
    assert (REPO / "dvc.yaml").read_text() == pipeline.dvc_yaml()
    assert pipeline.main(["--check"]) == 0


@pytest.mark.slow
def test_a_figure_declared_once_is_a_stage_an_artifact_and_a_report_input_everywhere(tmp_path):
    root = _root(tmp_path)
    stages = [*pipeline.STAGES[:-2], TOY, *pipeline.STAGES[-2:]]  # before publish and the report
    assert [s.name for s in pipeline.STAGES[-2:]] == ["publish", "report"]
    changed = pipeline.write(root, stages)
    assert changed == [root / "dvc.yaml", root / "profiles/demo/dvc.yaml"]
    made = yaml.safe_load((root / "dvc.yaml").read_text())
    committed = yaml.safe_load((REPO / "dvc.yaml").read_text())
    assert made["stages"]["toy"] == {
        "cmd": "python -m pipelines.timed results/times/toy.json " + TOY.cmd,
        "deps": ["results/extrapolation.csv", "pipelines/toy.py"], "params": ["schemes"],
        "outs": [{"results/times/toy.json": {"cache": False}}, {"figures/toy.png": {"cache": False}},
                 {"results/toy.json": {"cache": False}}]}
    # the publish stage takes both as artifacts (its command line) and as dependencies
    publish, was = made["stages"]["publish"], committed["stages"]["publish"]
    assert publish["cmd"] == was["cmd"] + " figures/toy.png results/toy.json"
    assert publish["deps"] == was["deps"] + ["figures/toy.png", "results/toy.json"]
    # the report depends on what it reads, and its templates read it as study.toy
    report = committed["stages"]["report"]["deps"]
    assert sorted(made["stages"]["report"]["deps"]) == sorted([*report, "results/toy.json"])
    assert read_by_name(stages) == {**read_by_name(pipeline.STAGES), "toy": "results/toy.json"}
    assert FILES == {"params": "params.yaml", **read_by_name(pipeline.STAGES)}
    # nothing else moves
    rest = set(committed["stages"]) - {"publish", "report"}
    assert {s: made["stages"][s] for s in rest} == {s: committed["stages"][s] for s in rest}
    assert made["plots"] == committed["plots"]
    # the profile's pipeline follows: the stage at the project root, its paths under the profile
    demo = yaml.safe_load((root / "profiles/demo/dvc.yaml").read_text())
    assert demo == yaml.safe_load(profile.render("demo", root))
    toy = demo["stages"]["toy"]
    assert toy["wdir"] == "../.." and toy["params"] == [{"profiles/demo/params.yaml": ["schemes"]}]
    assert toy["cmd"].endswith("--png profiles/demo/figures/toy.png --json profiles/demo/results/toy.json")
    assert [next(iter(o)) for o in toy["outs"]] == [
        "profiles/demo/results/times/toy.json", "profiles/demo/figures/toy.png", "profiles/demo/results/toy.json"]
    assert demo["stages"]["publish"]["cmd"].endswith(" profiles/demo/figures/toy.png profiles/demo/results/toy.json")
    # and DVC reads both pipelines, with the toy stage in each
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}"}

    def dvc(*args):
        return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, capture_output=True, text=True, env=env,
                              timeout=300)

    assert dvc("init", "--no-scm", "-q").returncode == 0
    for target in ("dvc.yaml", "profiles/demo/dvc.yaml"):
        listed = dvc("stage", "list", target)
        assert listed.returncode == 0, listed.stderr[-2000:]
        names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
        prefix = "profiles/demo/dvc.yaml:" if target != "dvc.yaml" else ""
        assert f"{prefix}toy" in names and f"{prefix}publish" in names, listed.stdout


def test_the_study_stage_writes_what_its_tasks_declare(tmp_path):
    """Each task of params.yaml declares the files a study writes of a scheme
    (``Task.outputs``): those are the study stage's outputs, beside its runs file and time record."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["tasks"]["scored"] = dict(params["tasks"]["mlm"])
    root = _root(tmp_path, params)
    (root / "conf/task/scored.yaml").write_text(
        f"_target_: {__name__}.Scored\nname: scored\ncausal: true\ncls: false\n")
    outs = yaml.safe_load(pipeline.dvc_yaml(root=root))["stages"]["study"]["do"]["outs"]
    assert [next(iter(o)) for o in outs] == [
        "results/times/study@${key}.json", "results/runs/${key}.json", "results/extrapolation/${key}.csv",
        "results/extrapolation/${key}.json", "results/retrieval/${key}.csv", "results/scored/${key}.csv"]
    assert all(o[next(iter(o))] == {"cache": False, "persist": True} for o in outs)


def test_a_list_of_dependencies_names_a_per_scheme_output_by_its_folder():
    assert _listed(["figures/correlations/${key}", "figures/correlations/overview.png", "results/a.json",
                    "results/times/prepare.json", "results/times/study@${key}.json", "results/a.json"]) == [
        "figures/correlations", "results/a.json", "results/times"]
