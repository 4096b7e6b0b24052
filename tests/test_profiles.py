"""Frozen profiles (``pipelines.profile``): an exploratory study kept as the record of the code that
made it. The pipeline functions run on a copy of the project's dvc.yaml in a temporary folder;
the last test runs DVC itself on a frozen stage whose dependency changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines import pipeline, profile
from pipelines import status as status_module

REPO = Path(__file__).resolve().parents[1]
PARAMS = "# a profile of the test\nabout: a demo\ncommon: ''   # kept comment\n"


@pytest.fixture()
def project(tmp_path):
    """A project folder with the repository's dvc.yaml and a profile ``demo`` whose pipeline is made."""
    shutil.copy(REPO / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "profiles/demo").mkdir(parents=True)
    (tmp_path / "profiles/demo/params.yaml").write_text(PARAMS)
    (tmp_path / "profiles/demo/dvc.yaml").write_text(profile.render("demo", tmp_path))
    return tmp_path


def _stages(root: Path) -> dict:
    return yaml.safe_load((root / "profiles/demo/dvc.yaml").read_text())["stages"]


def test_freezing_marks_every_stage_and_keeps_the_params_comments(project):
    before = _stages(project)
    profile.freeze("demo", "exploratory: made before the plan", project)
    assert profile.frozen("demo", project) == "exploratory: made before the plan"
    params = (project / "profiles/demo/params.yaml").read_text()
    assert params.startswith(PARAMS) and "# kept comment" in params
    after = _stages(project)
    assert set(after) == set(before)
    for name, spec in after.items():
        body = spec.get("do", spec)
        assert body.pop("frozen") is True, name
        assert spec == before[name], name  # nothing else changed
    assert profile.is_current("demo", project)


def test_a_frozen_pipeline_is_current_only_with_every_stage_frozen_and_does_not_follow_the_project(project):
    profile.freeze("demo", "a record", project)
    path = project / "profiles/demo/dvc.yaml"
    frozen_text = path.read_text()
    # the project's pipeline moves on (a stage gains a dependency): the frozen one keeps its stages
    moved = yaml.safe_load((project / "dvc.yaml").read_text())
    moved["stages"]["tables"]["deps"].append("src/posenc/new_module.py")
    (project / "dvc.yaml").write_text(yaml.safe_dump(moved, sort_keys=False))
    assert profile.is_current("demo", project)
    # `python -m pipelines.pipeline` writes the project's dvc.yaml and every profile's but a frozen one's
    shutil.copy(REPO / "params.yaml", project / "params.yaml")
    (project / "conf").symlink_to(REPO / "conf")  # the tasks' configs, which the study's outputs come from
    (project / "profiles/other").mkdir()
    (project / "profiles/other/params.yaml").write_text(PARAMS)
    (project / "profiles/other/dvc.yaml").write_text("stages: {}\n")
    made = pipeline.write(project)
    assert project / "profiles/other/dvc.yaml" in made and path not in made and path.read_text() == frozen_text
    unfrozen = yaml.safe_load(frozen_text)
    del unfrozen["stages"]["tables"]["frozen"]
    path.write_text(yaml.safe_dump(unfrozen, sort_keys=False))
    assert not profile.is_current("demo", project)


def test_thawing_restores_the_params_and_the_pipeline_made_from_the_project(project):
    made = (project / "profiles/demo/dvc.yaml").read_text()
    profile.freeze("demo", "a folded reason " * 12, project)  # long enough for YAML to fold it over lines
    assert "\n  " in (project / "profiles/demo/params.yaml").read_text().split("frozen:", 1)[1]
    profile.thaw("demo", project)
    assert (project / "profiles/demo/params.yaml").read_text() == PARAMS
    assert profile.frozen("demo", project) is None
    assert (project / "profiles/demo/dvc.yaml").read_text() == made


def test_running_a_frozen_profile_is_refused_before_dvc_runs(project, monkeypatch, capsys):
    profile.freeze("demo", "a record", project)
    calls = []
    monkeypatch.setattr(profile, "ROOT", project)
    monkeypatch.setattr(profile.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    assert profile.main(["demo"]) == 2
    assert profile.main(["demo", "--force"]) == 2
    assert calls == []
    err = capsys.readouterr().err
    assert "frozen (a record)" in err and "--thaw" in err
    assert profile.main(["--check"]) == 0


def test_a_frozen_profile_without_a_pipeline_cannot_be_frozen(tmp_path):
    (tmp_path / "profiles/new").mkdir(parents=True)
    (tmp_path / "profiles/new/params.yaml").write_text("common: ''\n")
    with pytest.raises(SystemExit, match="never ran"):
        profile.freeze("new", "why", tmp_path)


def test_status_lists_frozen_profiles_with_why(project, monkeypatch, capsys):
    profile.freeze("demo", "exploratory: before the plan", project)
    monkeypatch.chdir(project)
    monkeypatch.setattr(status_module, "collect", lambda pipelines, root: [])
    assert status_module.main([]) == 0
    out = capsys.readouterr().out
    assert "frozen, not checked" in out and "profile demo: exploratory: before the plan" in out


@pytest.mark.slow
def test_dvc_neither_checks_nor_runs_a_frozen_stage_whose_dependency_changed(tmp_path):
    """What freezing relies on, asked of DVC itself: a frozen stage with a changed dependency is
    not listed by ``dvc status`` and not run by ``dvc repro``, and the same stage not frozen is both."""
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=300)

    run("git", "init", "-q")
    run(sys.executable, "-m", "dvc", "init", "-q")
    (tmp_path / "dep.txt").write_text("a\n")
    stage = {"cmd": "cp dep.txt out.txt", "deps": ["dep.txt"], "outs": [{"out.txt": {"cache": False}}]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": stage}}))
    run(sys.executable, "-m", "dvc", "repro", "-q")
    (tmp_path / "dep.txt").write_text("b\n")
    assert "s" in run(sys.executable, "-m", "dvc", "status", "--json").stdout
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(profile.frozen_pipeline({"stages": {"s": stage}})))
    assert run(sys.executable, "-m", "dvc", "status", "--json").stdout.strip() == "{}"
    run(sys.executable, "-m", "dvc", "repro", "-q")
    assert (tmp_path / "out.txt").read_text() == "a\n"
