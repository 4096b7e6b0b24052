"""The worked examples of docs/add-a-scheme.md work as written.

Every Python block on the page that follows a line naming its file (`src/...py` or
`tests/...py`) is written to a temporary folder, outside the repository: the scheme
modules as top-level modules, their references beside them (imports of
``posenc.encodings.<module>`` become ``<module>``), and a config per scheme in a config
root on ``POSENC_SCHEME_PATH``. Then every property test that applies to each example
scheme, and its reference, must pass, and the YAML the page shows must name the class
its example defines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml

from .conftest import REPO
from .test_new_scheme import collected_cases

PAGE = REPO / "docs" / "add-a-scheme.md"
BLOCK = re.compile(r"`(?P<path>(?:src|tests)/[\w/]+\.py)`:\n\n```python\n(?P<code>.*?)```", re.S)
#: property tests every example must get (the ones that check what the page explains)
MUST = {"test_terms_sum_to_logits", "test_shift_invariance_matches_relative_flag",
        "test_docstring_cites_paper_and_names_its_check", "test_model_equals_dense_reference",
        "test_last_positions_equal_the_full_forward"}


def page_files() -> dict[str, str]:
    """{path on the page: its code}."""
    return {m["path"]: m["code"] for m in BLOCK.finditer(PAGE.read_text())}


def test_the_page_names_a_module_and_a_reference_per_example():
    files = page_files()
    modules = sorted(p for p in files if p.startswith("src/posenc/encodings/"))
    assert modules == ["src/posenc/encodings/gated_distance.py", "src/posenc/encodings/sandwich.py"]
    for module in modules:
        assert f"tests/test_{module.rsplit('/', 1)[1]}" in files  # tests/test_<module>.py
    shown = yaml.safe_load(re.search(r"```yaml\n(.*?)```", PAGE.read_text(), re.S).group(1))
    assert shown["scheme"]["_target_"] == "posenc.encodings.sandwich.Sandwich"
    assert "class Sandwich(" in files["src/posenc/encodings/sandwich.py"]


@pytest.mark.slow  # one pytest process of the property tests for two schemes: about a minute on 2 cores
def test_the_worked_examples_pass_every_property_test_and_their_references(tmp_path):
    src, conf = tmp_path / "src", tmp_path / "conf" / "encoding"
    src.mkdir()
    conf.mkdir(parents=True)
    names = []
    for path, code in page_files().items():
        stem = path.rsplit("/", 1)[1].removesuffix(".py")
        code = re.sub(r"\bposenc\.encodings\.(sandwich|gated_distance)\b", r"\1", code)
        (src / f"{stem}.py").write_text(code)
        if path.startswith("src/"):
            cls = re.search(r"^class (\w+)\(", code, re.M).group(1)
            (conf / f"{stem}.yaml").write_text(f"name: {stem}\nscheme:\n  _target_: {stem}.{cls}\n  _partial_: true\n")
            names.append(stem)
    env = dict(os.environ, POSENC_SCHEME_PATH=str(tmp_path / "conf"), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
    files = ["tests/test_encodings.py", "tests/test_attention.py", *map(str, sorted(src.glob("test_*.py")))]
    base = [sys.executable, "-m", "pytest", *files, "-n0", "-p", "no:cacheprovider", "-k",
            " or ".join(names)]
    collect = subprocess.run(base + ["--collect-only", "-q"], cwd=REPO, env=env, capture_output=True, text=True)
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-2000:]
    for name in names:
        got = collected_cases(collect.stdout, name)
        assert MUST <= set(got), (name, sorted(MUST - set(got)))
        assert f"test_{name}_vs_formula" in collect.stdout  # the reference, selected by -k through its module
    run = subprocess.run(base + ["-q"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:]
    assert " passed" in run.stdout and "failed" not in run.stdout, run.stdout[-2000:]
