"""What a study result was made from: the shared code, one scheme's own code and
config, and the study's settings, each reduced to a digest.

The study (``dvc.yaml``) gives every scheme a stage of its own. That stage must
re-run when the code every scheme runs through changes (the model, attention,
training, data; ``study_core``) or when *its own* scheme changes, and not when
another scheme is added or edited. The shared part is a list of files: the study
stage's dependencies in ``dvc.yaml``, which ``study_core`` reads, so that there is
one list. The scheme's part cannot be a list of files: several schemes live in
one module, and a scheme uses helpers from other modules. So it is computed:
``scheme_fingerprint`` follows the class named by ``conf/encoding/<name>.yaml``
(``_target_``) to every function, class and module of the project it reaches
(``code_closure``) and hashes each, with the YAML's content. The ``fingerprint``
stage writes one such file per scheme, ``results/fingerprints/<name>.json``, and
``study@<name>`` depends on that file alone for its scheme: DVC compares files by
content, so a rewrite with the same digests changes nothing downstream.

What counts as a change of code: the abstract syntax tree of a function or class
without its docstrings (``code_digest``), so editing a docstring, a comment or
the layout re-runs nothing, while any change to what the code does re-runs the
schemes that reach it. What ``code_closure`` cannot see: code reached only by a
name built at run time (``getattr(module, name)``, ``importlib``); a scheme that
does so should import what it uses by name.

``results/runs/<scheme>.json`` records the digests its runs were made with
(``provenance``), so the summary stages can refuse to put results of different
code or settings into one table (``pipelines.gather.check_provenance``).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import sys
import sysconfig
import textwrap
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import CONFIG_DIR

PROJECT_ROOT = Path(CONFIG_DIR).parent

def study_core(root: Path = PROJECT_ROOT) -> tuple[str, ...]:
    """What every ``study@<scheme>`` stage depends on besides its own scheme: the stage's
    ``deps`` in ``root/dvc.yaml`` (files, or folders whose files all count), less the
    per-scheme ones (under ``results/``). ``dvc.yaml`` holds the one list; the profiles'
    pipelines are made from it, and the provenance digest (``files_digest``) reads it here."""
    import yaml

    stage = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]["study"]["do"]
    return tuple(d for d in stage["deps"] if isinstance(d, str) and not d.startswith("results/"))


def sha256(data: str | bytes) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def json_digest(obj: Any) -> str:
    """sha256 of a JSON document with sorted keys (the same object, the same digest)."""
    return sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str))


# ------------------------------------------------------------------ shared code
def _files(paths: Iterable[str], root: Path) -> list[Path]:
    out = []
    for rel in paths:
        p = root / rel
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{rel}: a dependency of the study stages (dvc.yaml) but not in {root}")
    return out


def files_digest(paths: Iterable[str] | None = None, root: Path = PROJECT_ROOT) -> str:
    """One digest of the contents of ``paths`` (files, or every file under a folder; by
    default the study's shared code, ``study_core``), keyed by their paths relative to
    ``root``."""
    paths = study_core(root) if paths is None else paths
    return json_digest({f.relative_to(root).as_posix(): sha256(f.read_bytes()) for f in _files(paths, root)})


# ------------------------------------------------------------------ a scheme's code
def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_digest(source: str) -> str:
    """sha256 of the syntax tree of ``source`` without docstrings: comments, layout and
    docstrings do not count, what the code does does."""
    tree = _strip_docstrings(ast.parse(textwrap.dedent(source)))
    return sha256(ast.dump(tree, annotate_fields=True, include_attributes=False))


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs |= {p for p in sys.path if p.endswith(("site-packages", "dist-packages"))}
    return tuple(str(Path(d).resolve()) for d in dirs)


def is_project_module(module: types.ModuleType | None) -> bool:
    """posenc itself, or code that is not part of Python or an installed library
    (a user's scheme kept in a folder of their own)."""
    if module is None:
        return False
    name = module.__name__
    if name == "posenc" or name.startswith("posenc."):
        return True
    file = getattr(module, "__file__", None)
    if not file or name in sys.builtin_module_names:
        return False
    return not str(Path(file).resolve()).startswith(_library_dirs())


def _is_literal(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if isinstance(value, (tuple, list, frozenset, set)):
        return all(_is_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_is_literal(k) and _is_literal(v) for k, v in value.items())
    return False


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _functions_of(cls: type) -> list[types.FunctionType]:
    out = []
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            out += [f for f in (value.fget, value.fset, value.fdel) if f is not None]
        elif isinstance(value, types.FunctionType):
            out.append(value)
    return out


def _name(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    return f"{obj.__module__}.{obj.__qualname__}"


def code_closure(target: Any) -> dict[str, str]:
    """{qualified name: ``code_digest``} of ``target`` (a class or function) and every
    function, class and module of the project it reaches: a class's bases and the
    functions of each, the globals a function's code names (and its defaults and
    closure), the members of a project module named as a global. A literal
    constant of a project module that the code names (an int, a string, a tuple of
    them) is recorded by its value, a ``Path`` of a file by the file's content (FIRE's
    compiled kernel, ``native.SOURCE``). Library and standard-library code is left out."""
    out: dict[str, str] = {}
    todo: list[Any] = [target]
    while todo:
        obj = todo.pop()
        if isinstance(obj, types.MethodType):
            obj = obj.__func__
        key = _name(obj)
        if key in out:
            continue
        if isinstance(obj, types.ModuleType):
            out[key] = code_digest(inspect.getsource(obj))
            todo += [v for v in vars(obj).values()
                     if isinstance(v, (type, types.FunctionType)) and getattr(v, "__module__", None) == obj.__name__]
            continue
        if isinstance(obj, type):
            out[key] = code_digest(inspect.getsource(obj))
            todo += [b for b in obj.__mro__[1:] if is_project_module(sys.modules.get(b.__module__))]
            todo += _functions_of(obj)
            todo += [v for v in vars(obj).values() if isinstance(v, type) and is_project_module(
                sys.modules.get(v.__module__))]
            continue
        if not isinstance(obj, types.FunctionType):
            continue
        out[key] = code_digest(inspect.getsource(obj))
        reached = [obj.__globals__[n] for n in sorted(_code_names(obj.__code__)) if n in obj.__globals__]
        reached += list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
        reached += [c.cell_contents for c in obj.__closure__ or () if _has_contents(c)]
        module = obj.__module__
        for name in sorted(_code_names(obj.__code__)):
            value = obj.__globals__.get(name)
            if name in obj.__globals__ and not name.startswith("__") and _is_literal(value) \
                    and not isinstance(value, (bool, type(None))):
                out[f"{module}.{name}"] = sha256(repr(value))
            elif isinstance(value, Path) and value.is_file():  # a file the code reads (a kernel's source)
                out[f"{module}.{name}"] = sha256(value.read_bytes())
        for value in reached:
            if isinstance(value, types.ModuleType):
                if is_project_module(value):
                    todo.append(value)
            elif isinstance(value, (type, types.FunctionType, types.MethodType)):
                mod = sys.modules.get(getattr(value, "__module__", "") or "")
                if is_project_module(mod):
                    todo.append(value)
    return dict(sorted(out.items()))


def _has_contents(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def encoding_config(name: str, conf_dir: str | Path = CONFIG_DIR) -> Path:
    path = Path(conf_dir) / "encoding" / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in (Path(conf_dir) / "encoding").glob("*.yaml"))
        raise FileNotFoundError(f"no scheme {name!r}: {path} does not exist; available: {', '.join(available)}")
    return path


def scheme_target(name: str, conf_dir: str | Path = CONFIG_DIR) -> tuple[Path, dict[str, Any], str]:
    """(its file, its parsed config, the class path its ``scheme._target_`` names) of scheme
    ``name`` (``conf/encoding/<name>.yaml``); ValueError when it names no class."""
    import yaml

    path = encoding_config(name, conf_dir)
    config = yaml.safe_load(path.read_text()) or {}
    target = (config.get("scheme") or {}).get("_target_")
    if not target:
        raise ValueError(f"{path}: no scheme._target_ naming the scheme's class")
    return path, config, target


def scheme_fingerprint(name: str, conf_dir: str | Path = CONFIG_DIR) -> dict[str, Any]:
    """The fingerprint of scheme ``name``: its config (``conf/encoding/<name>.yaml``,
    parsed, so comments do not count), the class its ``_target_`` names and the
    ``code_closure`` of that class, and ``digest``, one sha256 of all of it."""
    from hydra.utils import get_object

    path, config, target = scheme_target(name, conf_dir)
    obj = get_object(target)
    try:
        rel = path.resolve().relative_to(PROJECT_ROOT).as_posix()
    except ValueError:
        rel = str(path)
    doc = {"scheme": name, "config_file": rel, "config": config, "target": _name(obj), "code": code_closure(obj)}
    doc["digest"] = json_digest({k: doc[k] for k in ("config", "target", "code")})
    return doc


def changed_parts(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints of a scheme, for a person to read."""
    out = []
    if old.get("config") != new.get("config"):
        out.append(f"config {new.get('config_file')}")
    if old.get("target") != new.get("target"):
        out.append(f"class {old.get('target')} -> {new.get('target')}")
    a, b = old.get("code", {}), new.get("code", {})
    out += [f"code {k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return out
