"""The suite's own rules (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import NO_SKIPS, REPO

SKIPPING = '''
import pytest


def test_plain():
    pytest.skip("no widget")


@pytest.mark.may_skip(reason="the gadget is optional")
def test_allowed():
    pytest.skip("no gadget")


@pytest.fixture
def needs():
    pytest.skip("the fixture says no")


def test_through_a_fixture(needs):
    pass


def test_passes():
    pass
'''


@pytest.mark.slow
def test_a_skip_fails_where_skips_are_not_allowed(tmp_path):
    """With POSENC_NO_SKIPS set (as .ci/run sets it) a skipped test fails and names the reason
    it gave (a fixture's skip is reported as an error at setup); a test marked ``may_skip`` is still
    skipped. Without the variable the three are ordinary skips."""
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_skipping.py").write_text(textwrap.dedent(SKIPPING))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--rootdir", str(tmp_path), str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != NO_SKIPS}
    plain = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    strict = subprocess.run(cmd, cwd=tmp_path, env={**env, NO_SKIPS: "1"}, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert plain.returncode == 0, plain.stdout[-3000:]
    assert "1 passed, 3 skipped" in plain.stdout, plain.stdout[-3000:]
    assert strict.returncode == 1, strict.stdout[-3000:]
    assert "1 failed, 1 passed, 1 skipped, 1 error" in strict.stdout, strict.stdout[-3000:]
    assert "FAILED test_skipping.py::test_plain" in strict.stdout
    assert "ERROR test_skipping.py::test_through_a_fixture" in strict.stdout
    assert "skipped (no widget), and POSENC_NO_SKIPS is set" in strict.stdout
    assert "skipped (the fixture says no), and POSENC_NO_SKIPS is set" in strict.stdout
    assert "SKIPPED [1] test_skipping.py" in strict.stdout and "no gadget" in strict.stdout


def test_the_full_suite_runs_two_workers_per_core_the_fast_tier_xdists_own(monkeypatch):
    """``-n auto``: pytest-xdist's own count (a worker per core) for the fast tier, two workers per
    core for ``--full``, no more than the memory holds at 2 GiB each; pytest-xdist's variable sets
    both. The cores are pytest-xdist's count, stood in for here by three."""
    from types import SimpleNamespace

    import xdist.plugin

    from .conftest import pytest_xdist_auto_num_workers

    def config(full: bool):
        return SimpleNamespace(getoption=lambda name: full if name == "--full" else None)

    monkeypatch.delenv("PYTEST_XDIST_AUTO_NUM_WORKERS", raising=False)
    monkeypatch.setattr(xdist.plugin, "pytest_xdist_auto_num_workers", lambda config: 3)
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 64 * 2**30 // 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert pytest_xdist_auto_num_workers(config(False)) is None
    assert pytest_xdist_auto_num_workers(config(True)) == 6
    pages["SC_PHYS_PAGES"] = 9 * 2**30 // 4096  # 9 GiB: four workers
    assert pytest_xdist_auto_num_workers(config(True)) == 4
    monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", "5")  # the user's count, as pytest-xdist reads it
    assert pytest_xdist_auto_num_workers(config(True)) is None


def test_a_mutation_run_that_judged_nothing_stops_and_keeps_the_last_report(monkeypatch, tmp_path):
    """mutmut ends with 1 both when mutants survived and when the tests failed on the unmutated
    copy (its stats run, which then judges nothing): the second must stop ``python -m
    tests.mutation`` with mutmut's output, not write a score of nothing."""
    from tests import mutation

    def mutmut_says(text: str):
        return lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, text, "")

    failed = "Running stats\rfailed to collect stats. runner returned 1\n"
    monkeypatch.setattr(mutation.subprocess, "run", mutmut_says(failed))
    with pytest.raises(SystemExit, match="failed to collect stats"):
        mutation.run(["posenc.*"], 1)
    monkeypatch.setattr(mutation.subprocess, "run", mutmut_says("done in 9s\n"))  # survivors: exit 1, nothing wrong
    mutation.run(["posenc.*"], 1)

    # and a run that left every mutant unjudged writes no report
    monkeypatch.setattr(mutation, "REPO", tmp_path)
    monkeypatch.setattr(mutation, "REPORT", tmp_path / "mutation.md")
    monkeypatch.setattr(mutation, "run", lambda names, n: None)
    monkeypatch.setattr(mutation, "results", lambda: {"posenc.data.x_f__mutmut_1": mutation.NOT_JUDGED})
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match="no mutant was judged"):
        mutation.main([])
    assert not (tmp_path / "mutation.md").exists()


def test_a_mutation_report_is_not_replaced_by_one_that_judged_fewer(monkeypatch, tmp_path):
    """A store that judged fewer mutants than the written report did (a stopped run, verdicts
    lost) leaves the report as it was, unless ``--replace``; the count is read from the lines the
    report writes (the one written last is read back)."""
    from tests import mutation

    report = tmp_path / "mutation.md"
    report.write_text("# Mutation score\n\n- mutants in scope: 3 (killed 2)\n- not judged yet (left out): 1\n")
    assert mutation.judged_in(report) == 2 and mutation.judged_in(tmp_path / "none.md") is None
    monkeypatch.setattr(mutation, "REPO", tmp_path)
    monkeypatch.setattr(mutation, "REPORT", report)
    monkeypatch.setattr(mutation, "run", lambda names, n: None)
    monkeypatch.setattr(mutation, "verdicts", lambda: {})
    monkeypatch.setattr(mutation, "load_equivalent", lambda: {})
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path))
    (tmp_path / "mutants").mkdir()
    one = {"posenc.data.x_f__mutmut_1": "killed", "posenc.data.x_f__mutmut_2": mutation.NOT_JUDGED,
           "posenc.data.x_f__mutmut_3": mutation.NOT_JUDGED}
    monkeypatch.setattr(mutation, "results", lambda: one)
    before = report.read_text()
    with pytest.raises(SystemExit, match="cover 1 mutants, the report they would replace 2"):
        mutation.main([])
    assert report.read_text() == before
    mutation.main(["--replace"])
    assert report.read_text() != before and mutation.judged_in(report) == 1
