"""The README's times (``pipelines.measure``): each is a record that the report renders into a
README block, so a time typed by hand, or a record changed without rendering, fails
``report --check``; the full suite's command is the one CI runs."""

from __future__ import annotations

import json

from pipelines import measure, report

from .conftest import REPO
from .test_report import project_copy


def test_the_full_suite_is_the_command_ci_runs():
    assert measure.ci_command() == ["python", "-m", "pytest", "--full", "-n", "auto", "--durations=30"]
    assert ".venv/bin/python -m pytest --full -n auto --durations=30" in (REPO / ".ci/run").read_text().splitlines()[-1]
    assert measure.WHAT["pytest"][1] == ["python", "-m", "pytest", "-q"]  # plain pytest: the fast tier


def test_what_a_measured_command_ended_with(tmp_path):
    out = "....\n=========== 1538 passed, 2 skipped, 3 warnings in 2252.12s (0:37:32) ===========\n"
    assert measure.last_words("full", tmp_path, out) == "1538 passed, 2 skipped, 3 warnings"
    assert measure.last_words("pytest", tmp_path, "1510 passed in 1298.40s (0:21:38)\n") == "1510 passed"
    run = tmp_path / "outputs/runs/2026-11-29_rope-lm-tinyshakespeare-s0"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.json").write_text(json.dumps({"val/ppl": 6.90871}))
    assert measure.last_words("quickstart", tmp_path, "") == "val ppl 6.909"


def test_every_time_the_readme_gives_comes_from_a_record(tmp_path, capsys):
    """The quick start's, the tests' and the default repro's times are generated blocks: a record
    changed (the quick start measured again) changes the block, and until the README is rendered
    again ``--check`` names the line that differs."""
    root = project_copy(tmp_path)
    readme = (root / "README.md").read_text()
    for block in ("quickstart", "tests", "repro"):
        assert f"<!-- generated: {block} -->" in readme
    record = root / "docs/measured/quickstart.json"
    doc = json.loads(record.read_text())
    assert f"took {doc['seconds']:.0f} s" in readme and doc["said"] in readme
    doc.update(seconds=47.0, said="val ppl 6.910", load=[0.1, 0.4], threads=None)
    record.write_text(json.dumps(doc))
    assert report.main(["--root", str(root), "--check"]) == 1
    assert "README.md:" in capsys.readouterr().err
    assert report.main(["--root", str(root)]) == 0
    readme = (root / "README.md").read_text()
    assert "took 47 s (0.8 min) and ended at val ppl 6.910" in readme and "mostly free cores" in readme
    assert "torch's default threads, one per core" in readme
