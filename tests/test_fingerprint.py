"""What a study stage depends on: the shared core (dvc.yaml's list, read by study_core) and
its own scheme's fingerprint, which moves with that scheme's code and config only."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipelines import fingerprint as fp_cli
from pipelines.gather import check_provenance, per_scheme
from posenc.fingerprint import code_closure, code_digest, files_digest, scheme_fingerprint, sha256

from .conftest import REPO

PER_SCHEME_DEPS = {"results/prepare.json", "results/fingerprints/${key}.json"}


def test_the_shared_core_is_the_study_stages_dependency_list():
    from posenc.fingerprint import study_core

    core = study_core()
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["study"]["do"]
    assert set(stage["deps"]) == set(core) | PER_SCHEME_DEPS
    assert len(stage["deps"]) == len(core) + len(PER_SCHEME_DEPS)
    assert "src/posenc/model.py" in core and "conf/trainer" in core
    # no scheme's own code is in the shared part: only the base class; nor the executor
    assert not [p for p in core if p.startswith("src/posenc/encodings/") and p != "src/posenc/encodings/base.py"]
    assert "conf/encoding" not in core and "conf" not in core and "pipelines/executors.py" not in core


def test_files_digest_follows_content_not_time(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.yaml").write_text("x: 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    first = files_digest(["d", "b.py"], tmp_path)
    (tmp_path / "b.py").write_text("y = 2\n")  # rewritten, same content
    assert files_digest(["d", "b.py"], tmp_path) == first
    (tmp_path / "d" / "a.yaml").write_text("x: 2\n")
    assert files_digest(["d", "b.py"], tmp_path) != first
    with pytest.raises(FileNotFoundError, match="missing.py"):
        files_digest(["missing.py"], tmp_path)


def test_code_digest_ignores_docstrings_comments_and_layout():
    a = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    b = "def f(x):\n\n    return (x +\n            1)\n"
    assert code_digest(a) == code_digest(b)
    assert code_digest(a) != code_digest(a.replace("x + 1", "x + 2"))


MODULE = '''
import math

from posenc.encodings.base import PositionalScheme

SCALE = {scale}


def shared(d):
    return d * SCALE


def only_b(d):
    return d + {b_offset}


class A(PositionalScheme):
    """Scheme A. {doc}"""

    def absolute_bias(self, q_pos, k_pos):
        return shared(math.pi)


class B(PositionalScheme):
    def absolute_bias(self, q_pos, k_pos):
        return only_b(shared(1.0))
'''


def _closure(tmp_path, monkeypatch, tag: str, cls: str, **fields) -> dict[str, str]:
    """The closure of class ``cls`` of a module written with ``fields``, keys without the module name."""
    values = {"scale": 2.0, "b_offset": 1, "doc": "", **fields}
    name = f"fp_probe_{tag}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE.format(**values)))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        return {k.replace(name + ".", ""): v for k, v in code_closure(getattr(module, cls)).items()}
    finally:
        sys.modules.pop(name, None)


def test_a_scheme_closure_moves_with_its_own_code_only(tmp_path, monkeypatch):
    a0 = _closure(tmp_path, monkeypatch, "a0", "A")
    assert {"A", "A.absolute_bias", "shared", "SCALE"} <= set(a0)
    assert "only_b" not in a0 and "B" not in a0 and not any(k.startswith("math") for k in a0)
    assert "posenc.encodings.base.PositionalScheme" in a0  # its base class, from the project
    # another scheme's helper changes: A's closure does not
    assert _closure(tmp_path, monkeypatch, "a1", "A", b_offset=5) == a0
    assert _closure(tmp_path, monkeypatch, "b0", "B") != _closure(tmp_path, monkeypatch, "b1", "B", b_offset=5)
    # a helper A uses, or a constant it reads, changes: A's closure does
    assert _closure(tmp_path, monkeypatch, "a2", "A", scale=3.0) != a0
    # its docstring changes: nothing that runs changed
    assert _closure(tmp_path, monkeypatch, "a3", "A", doc="Checked against nothing yet.") == a0


def test_a_file_the_code_names_counts_by_content(tmp_path, monkeypatch):
    """A ``Path`` of a file that a function names (FIRE's kernel source) is recorded by the
    file's content: editing the file changes the closure, touching it does not."""
    src = tmp_path / "kernel.cpp"
    src.write_text("int f() { return 1; }\n")
    module = tmp_path / "fp_probe_file.py"
    module.write_text(f"from pathlib import Path\nSOURCE = Path({str(src)!r})\n\ndef build():\n    return SOURCE.read_text()\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def closure():
        sys.modules.pop("fp_probe_file", None)
        return code_closure(importlib.import_module("fp_probe_file").build)

    before = closure()
    assert "fp_probe_file.SOURCE" in before
    src.touch()
    assert closure() == before
    src.write_text("int f() { return 2; }\n")
    assert closure() != before
    sys.modules.pop("fp_probe_file", None)
    from posenc import native
    assert scheme_fingerprint("fire")["code"]["posenc.native.SOURCE"] == sha256(native.SOURCE.read_bytes())


def test_every_scheme_has_a_fingerprint_of_its_own():
    names = sorted(p.stem for p in (REPO / "conf" / "encoding").glob("*.yaml"))
    prints = {n: scheme_fingerprint(n) for n in names}
    assert len({f["digest"] for f in prints.values()}) == len(names)
    assert prints["alibi"] == scheme_fingerprint("alibi")  # deterministic
    assert "posenc.encodings.position_bias.alibi_slopes" in prints["alibi"]["code"]
    assert not any("FIRE" in k or "T5Bias" in k for k in prints["alibi"]["code"])  # same module, other schemes
    assert "posenc.encodings.position_bias.t5_relative_bucket" in prints["tupe"]["code"]  # a helper from another module
    with pytest.raises(FileNotFoundError, match="available: .*alibi"):
        scheme_fingerprint("nope")


def test_fingerprint_stage_writes_changed_files_only(tmp_path, capsys):
    params, out = tmp_path / "params.yaml", tmp_path / "fp"
    params.write_text(yaml.safe_dump({"schemes": {"none": {}, "alibi": {}}}))
    assert fp_cli.main(["--params", str(params), "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["alibi.json", "none.json"]
    assert json.loads((out / "alibi.json").read_text())["digest"] == scheme_fingerprint("alibi")["digest"]
    stamp = (out / "alibi.json").stat().st_mtime_ns
    capsys.readouterr()
    assert fp_cli.main(["--params", str(params), "--out-dir", str(out), "--check"]) == 0
    assert fp_cli.main(["--params", str(params), "--out-dir", str(out)]) == 0
    assert "alibi: unchanged" in capsys.readouterr().out and (out / "alibi.json").stat().st_mtime_ns == stamp
    # a changed fingerprint: --check says what and exits 1; a scheme that left the study: its file goes
    doc = json.loads((out / "alibi.json").read_text())
    doc["code"]["posenc.encodings.position_bias.alibi_slopes"] = "0" * 64
    (out / "alibi.json").write_text(json.dumps(doc))
    params.write_text(yaml.safe_dump({"schemes": {"alibi": {}}}))
    assert fp_cli.main(["--params", str(params), "--out-dir", str(out), "--check"]) == 1
    said = capsys.readouterr().out
    assert "alibi: changed: code posenc.encodings.position_bias.alibi_slopes" in said and "none: no longer in" in said
    assert (out / "none.json").exists()  # --check writes nothing
    assert fp_cli.main(["--params", str(params), "--out-dir", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["alibi.json"]
    assert json.loads((out / "alibi.json").read_text())["digest"] == scheme_fingerprint("alibi")["digest"]


def _runs_file(path: Path, scheme: str, core: str, settings: str = "s") -> Path:
    path.write_text(json.dumps({"scheme": scheme, "provenance": {"core": core, "scheme": scheme,
                                                                   "settings": settings}, "runs": []}))
    return path


def test_results_of_other_code_or_settings_are_refused(tmp_path):
    a = _runs_file(tmp_path / "a.json", "a", "c1")
    b = _runs_file(tmp_path / "b.json", "b", "c1")
    check_provenance({"a": a, "b": b})  # same code and settings: fine
    c = _runs_file(tmp_path / "c.json", "c", "c2")
    with pytest.raises(SystemExit, match=r"(?s)code c1.*: a, b\n.*code c2.*: c"):
        check_provenance({"a": a, "b": b, "c": c})
    d = _runs_file(tmp_path / "d.json", "d", "c1", settings="other")
    with pytest.raises(SystemExit, match="different shared code or study settings"):
        check_provenance({"a": a, "d": d})


def test_a_missing_scheme_is_reported_and_left_out(tmp_path, capsys):
    a = _runs_file(tmp_path / "a.json", "a", "c1")
    extra = _runs_file(tmp_path / "x.json", "x", "c1")
    assert per_scheme([a, extra], ["a", "b"], "runs") == {"a": a}
    err = capsys.readouterr().err
    assert "no runs for scheme b" in err and "x.json belongs to no scheme of the study" in err
    assert per_scheme([a, extra], None, "runs") == {"a": a, "x": extra}


def _imported(path: Path, seen: set[str]) -> None:
    """The files of ``src/posenc`` and ``pipelines`` that ``path`` imports, whatever the depth,
    added to ``seen`` (read from the source: ``import``/``from`` lines, absolute or relative)."""
    import ast

    rel = path.relative_to(REPO).as_posix()
    if rel in seen:
        return
    seen.add(rel)
    package = path.parent
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            stem = (node.module or "").replace(".", "/")
            root = base if node.level else REPO / ("src" if (node.module or "").startswith("posenc") else "")
            names = [root / stem] + [root / stem / a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [REPO / ("src" if a.name.startswith("posenc") else "") / a.name.replace(".", "/")
                     for a in node.names]
        for n in names:
            for candidate in (n.with_suffix(".py"), n / "__init__.py"):
                if candidate.is_file() and candidate.is_relative_to(REPO):
                    _imported(candidate, seen)


def test_the_shared_core_holds_every_module_a_study_run_imports():
    """A module the study's training imports (``pipelines/study.py`` and ``posenc.train``, at
    any depth) is in the shared core, or in a folder of it: a change to it re-runs every study
    stage. Left out, as the core's docstring says: a scheme's own code (its fingerprint), the
    executor and the commit record, which cannot change a result."""
    from posenc.fingerprint import study_core

    seen: set[str] = set()
    for start in ("pipelines/study.py", "src/posenc/train.py"):
        _imported(REPO / start, seen)
    core = study_core()
    own = ("src/posenc/encodings/", "src/posenc/native.py", "src/posenc/fingerprint.py")
    allowed = {"pipelines/executors.py", "pipelines/commits.py", "src/posenc/spelling.py", "src/posenc/streams.py"}
    missing = sorted(f for f in seen if not f.startswith(own) and f not in allowed
                     and not any(f == c or f.startswith(c.rstrip("/") + "/") for c in core))
    assert missing == []
