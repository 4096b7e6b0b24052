"""Scheme discovery for the tests: every encoding config there is, no list.

A scheme is a class plus ``encoding/<name>.yaml`` in a Hydra config root. The
roots are the repository's ``conf/`` and every folder named in the environment
variable ``POSENC_SCHEME_PATH`` (``os.pathsep``-separated; the same kind of
folder one passes to ``hydra.searchpath``, a ``file://`` prefix is allowed), so
a scheme kept outside the tree is tested like the others once its config root
is on that path and its module on ``PYTHONPATH``.

A config whose ``_target_`` cannot be imported is still discovered: every test
that builds it fails with the reason (``scheme_class``), none is skipped.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from posenc.encodings import PositionalScheme

REPO = Path(__file__).resolve().parents[1]
ENV = "POSENC_SCHEME_PATH"


@dataclass(frozen=True)
class SchemeConfig:
    name: str
    path: Path
    #: the class named by ``scheme._target_``; None when it cannot be imported
    cls: type[PositionalScheme] | None
    #: why ``cls`` is None
    error: str | None = None


def config_roots(env: str | None = None) -> list[Path]:
    """The repository's ``conf/``, then each folder of ``POSENC_SCHEME_PATH``."""
    env = os.environ.get(ENV, "") if env is None else env
    extra = [e.strip() for e in env.split(os.pathsep) if e.strip()]
    return [REPO / "conf"] + [Path(e.removeprefix("file://")).expanduser().resolve() for e in extra]


def _load_class(path: Path) -> tuple[type[PositionalScheme] | None, str | None]:
    try:
        target = OmegaConf.load(path).scheme._target_
    except Exception as e:  # unreadable YAML or no scheme._target_
        return None, f"{path}: no readable scheme._target_ ({type(e).__name__}: {e})"
    try:
        cls = get_class(str(target))
    except Exception as e:
        return None, (
            f"{path}: its _target_ {target!r} cannot be imported ({type(e).__name__}: {e}). "
            "Put the folder of its module on PYTHONPATH, or fix the _target_."
        )
    if not (isinstance(cls, type) and issubclass(cls, PositionalScheme)):
        return None, f"{path}: _target_ {target!r} is not a posenc.encodings.PositionalScheme subclass"
    return cls, None


@cache
def _discover(env: str) -> tuple[dict[str, SchemeConfig], tuple[str, ...]]:
    configs: dict[str, SchemeConfig] = {}
    problems: list[str] = []
    for i, root in enumerate(config_roots(env)):
        folder = root / "encoding"
        if not folder.is_dir():
            problems.append(f"{ENV} names {root}, which has no encoding/ folder")
            continue
        for path in sorted(folder.glob("*.yaml")):
            name = path.stem
            if name in configs:
                problems.append(f"encoding {name!r} is defined twice: {configs[name].path} and {path}")
                continue
            cls, error = _load_class(path)
            configs[name] = SchemeConfig(name, path, cls, error)
    return dict(sorted(configs.items())), tuple(problems)


def discover() -> tuple[dict[str, SchemeConfig], tuple[str, ...]]:
    """(name -> SchemeConfig, problems with the search path) for the current environment."""
    return _discover(os.environ.get(ENV, ""))


def config(name: str) -> SchemeConfig:
    configs, _ = discover()
    if name not in configs:
        pytest.fail(f"no encoding/{name}.yaml in any config root: {config_roots()}", pytrace=False)
    return configs[name]


def scheme_class(name: str) -> type[PositionalScheme]:
    """The class of scheme ``name``; fails the calling test if its ``_target_`` does not import."""
    cfg = config(name)
    if cfg.cls is None:
        pytest.fail(f"encoding={name}: {cfg.error}", pytrace=False)
    return cfg.cls


def factory(name: str, **overrides):
    """The partial a model would get from ``encoding/<name>.yaml``, wherever it lives."""
    cfg_path = config(name).path
    scheme_class(name)
    root = OmegaConf.create({"task": {"cls": False}})  # what ${task.*} settings read
    root.encoding = OmegaConf.load(cfg_path)
    cfg = root.encoding
    assert cfg.name == name, f"{cfg_path} names itself {cfg.name}"
    assert cfg.scheme._partial_ is True, f"{cfg_path}: scheme._partial_ must be true"
    for key, value in overrides.items():
        cfg.scheme[key] = value
    return instantiate(cfg.scheme)


# ------------------------------------------------------------------ docstrings
YEAR = re.compile(r"\b(19|20)\d\d\b")
#: a sentence that starts "Checked against", up to a full stop before a capital letter,
#: the end of the docstring or a blank line
CHECKED = re.compile(r"(?:\A|[.!?]\s+|\n[ \t]*)(Checked against\b.*?)(?:\.(?=\s+[A-Z]|\s*\Z)|\n[ \t]*\n|\Z)", re.S)
TEST_NAME = re.compile(r"\btest_\w+\b(?!\.py)")
DEF_TEST = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(test_\w+)[ \t]*\(", re.M)


@cache
def _defined_tests(folder: Path, recursive: bool) -> frozenset[str]:
    files = folder.rglob("*.py") if recursive else folder.glob("*.py")
    return frozenset(n for f in files for n in DEF_TEST.findall(f.read_text(errors="replace")))


def defined_tests(cls: type) -> frozenset[str]:
    """Test functions defined in a .py file under the repository's tests/ or in the
    folder of ``cls``'s own module."""
    module_file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    own = _defined_tests(Path(module_file).resolve().parent, False) if module_file else frozenset()
    return _defined_tests(REPO / "tests", True) | own


def checked_against(doc: str) -> str | None:
    """The docstring's sentence that starts "Checked against", or None."""
    m = CHECKED.search(doc)
    return m.group(1) if m else None
