"""The suite's own rules (tests/conftest.py)."""

from __future__ import annotations

import json
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


ORDERED = {
    "test_quick.py": "def test_one():\n    pass\n\n\ndef test_two():\n    pass\n",
    "test_long.py": "import time\n\n\ndef test_first():\n    pass\n\n\ndef test_sleeps():\n    time.sleep(1.2)\n",
    "test_middle.py": "def test_only():\n    pass\n",
}


def _suite(tmp_path, durations: dict | None) -> list[str]:
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    for name, text in ORDERED.items():
        (tmp_path / name).write_text(text)
    if durations is not None:
        (tmp_path / "durations.json").write_text(json.dumps(durations))
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)]


@pytest.mark.slow
def test_the_full_suite_starts_its_slowest_tests_first_and_records_their_seconds(tmp_path):
    """``--full`` orders the modules by their tests' seconds in durations.json beside the conftest
    (a module's tests together, in their order; unrecorded modules after, in theirs); a run with
    ``--record-durations`` on two xdist workers writes the seconds of every test of a second or
    more, and only those."""
    cmd = _suite(tmp_path, {"test_middle.py::test_only": 5.0, "test_long.py::test_sleeps": 30.0})
    listed = subprocess.run([*cmd, "--full", "-n0", "--collect-only", "-q"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout[-3000:]
    order = [line for line in listed.stdout.splitlines() if "::" in line]
    assert order == ["test_long.py::test_first", "test_long.py::test_sleeps", "test_middle.py::test_only",
                     "test_quick.py::test_one", "test_quick.py::test_two"], listed.stdout
    plain = subprocess.run([*cmd, "-n0", "--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert [line for line in plain.stdout.splitlines() if "::" in line][0] == "test_long.py::test_first"  # files' order

    ran = subprocess.run([*cmd, "--full", "-n", "2", "--record-durations", "recorded.json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-3000:]
    recorded = json.loads((tmp_path / "recorded.json").read_text())
    assert list(recorded) == ["test_long.py::test_sleeps"] and 1.2 <= recorded["test_long.py::test_sleeps"] < 30


def test_slowest_first_keeps_a_module_together_and_ties_in_order():
    from types import SimpleNamespace

    from .conftest import slowest_first

    items = [SimpleNamespace(nodeid=n) for n in ("a.py::x", "a.py::y", "b.py::x[1]", "b.py::x[2]", "c.py::z", "d.py::w",
                                                  "e.py::v")]
    slowest_first(items, {"a.py::x": 3.0, "a.py::y": 2.0, "b.py::x[2]": 4.0, "d.py::w": 5.0, "e.py::v": 4.0})
    assert [i.nodeid for i in items] == ["a.py::x", "a.py::y", "d.py::w", "b.py::x[1]", "b.py::x[2]", "e.py::v",
                                         "c.py::z"]  # a's 5 s in two tests before b's 4 s in one; ties in order


def test_the_full_suite_hands_out_whole_modules():
    """Under ``--full`` pytest-xdist's default distribution (``load``) becomes ``loadfile``: a
    worker takes a whole module, in the order of slowest_first; a distribution the command line
    names otherwise, one process, and the fast tier are left as they are."""
    from types import SimpleNamespace

    from .conftest import pytest_configure

    def configured(full: bool, dist: str) -> str:
        option = SimpleNamespace(dist=dist)
        config = SimpleNamespace(option=option, addinivalue_line=lambda *a: None,
                                 getoption=lambda name: {"--full": full, "--record-durations": None}[name])
        pytest_configure(config)
        return option.dist

    assert [configured(True, "load"), configured(True, "worksteal"), configured(True, "no"),
            configured(False, "load")] == ["loadfile", "worksteal", "no", "load"]
