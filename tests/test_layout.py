"""Where things live: one home for the run folder's layout, one for MLflow I/O, and a
config layer that does not need Lightning (the study's stage commands, the benchmark and
the tests compose configs and build models through it)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
import yaml

from .conftest import REPO

CODE = [p for d in ("src", "pipelines", "analysis") for p in sorted((REPO / d).rglob("*.py"))]


@pytest.mark.slow
def test_the_config_layer_composes_checks_and_builds_a_model_without_lightning():
    script = (
        "import sys\n"
        "from posenc.config import build_model, check_config, compose\n"
        "cfg = compose(['encoding=t5_bias', 'model=micro'])\n"
        "check_config(cfg)\n"
        "model = build_model(cfg, 260)\n"
        "assert type(model).__name__ == 'Transformer' and model.cfg.d_model == 64\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_mlflow_is_read_and_written_in_tracking_alone():
    importers = [p.relative_to(REPO).as_posix() for p in CODE
                 if re.search(r"^\s*(import mlflow|from mlflow)", p.read_text(), re.M)]
    assert importers == ["src/posenc/tracking.py"]


def test_the_run_folder_layout_is_named_in_runs_alone():
    names = r"""["'](run\.json|config\.yaml|metrics\.json|last\.ckpt|checkpoints)["']"""
    spelt = [p.relative_to(REPO).as_posix() for p in CODE if re.search(names, p.read_text())]
    assert spelt == ["src/posenc/runs.py"]


def test_the_import_graph_has_no_circle_counting_imports_inside_functions():
    from .imports import circles, graph

    edges = graph()
    assert circles(edges) == []
    # the direction the layers keep: a task reads the data, the run folder writes to MLflow
    assert "posenc.data" in edges["posenc.tasks"] and "posenc.tasks" not in edges["posenc.data"]
    assert "posenc.tracking" in edges["posenc.runs"] and "posenc.runs" not in edges["posenc.tracking"]


#: what resolves a name into code: a call of one of these on a string written in the code
#: imports by a string (on a name read from a config, ``_target_``, it is the config registry)
RESOLVERS = {"import_module", "__import__", "get_method", "get_object", "get_class", "instantiate", "locate", "_locate"}
#: a dotted path of a module (or of something in it) of the project
PROJECT_PATH = re.compile(r"^(posenc|pipelines|analysis|tests)(\.\w+)+$")


def strings_naming_modules(path) -> list[str]:
    """Where the module at ``path`` names a project module by a string: a resolver called on a
    string (``RESOLVERS``), or a dotted project path written as a string (an f-string counted
    by its first part), docstrings aside. A name an API takes for what it runs or labels, and
    imports nothing of for this module, is no import: the module after ``-m`` in a command
    line, a logger's name, and a fork server's preload list (each module in it is imported by
    name where it is used)."""
    import ast

    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            allowed.add(id(node.body[0].value))  # a docstring
        if isinstance(node, (ast.List, ast.Tuple)):  # [python, -m, pipelines.study, ...]
            items = node.elts
            allowed |= {id(b) for a, b in zip(items, items[1:]) if isinstance(a, ast.Constant) and a.value == "-m"}
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("getLogger", "set_forkserver_preload"):
                allowed |= {id(n) for arg in node.args for n in ast.walk(arg)}
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PRELOAD" for t in node.targets):
            allowed |= {id(n) for n in ast.walk(node.value)}  # pipelines.study's fork-server preload
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in RESOLVERS \
                and node.args and isinstance(node.args[0], (ast.Constant, ast.JoinedStr)):
            found.append(f"{node.lineno}: {ast.unparse(node)[:80]}")
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = f"{node.values[0].value}x"  # f"analysis.{module}": the path it starts
        if isinstance(text, str) and id(node) not in allowed and PROJECT_PATH.match(text):
            found.append(f"{node.lineno}: {text!r}")
    return sorted(set(found))


def test_no_module_imports_another_by_a_string():
    """A module uses another by importing it, so that the import graph (``tests/imports.py``)
    and a reader see the dependency: no dotted path of a project module in a string, and no
    resolver (importlib, Hydra's ``get_method``) called on one. The configs' ``_target_`` are
    the config registry (read from ``conf/``, not written in the code)."""
    found = [f"{p.relative_to(REPO)}:{line}" for p in CODE for line in strings_naming_modules(p)]
    assert found == []


def test_the_string_import_finder_sees_each_kind(tmp_path):
    """The finder on a module written to hold one of each: what it must report, and what it must not."""
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent('''
        """Docstring naming posenc.tasks is fine."""
        import importlib
        import logging
        from hydra.utils import get_method

        log = logging.getLogger("pipelines.publish")
        CMD = ["python", "-m", "pipelines.study"]
        PRELOAD = ["posenc.train"]
        WRITER = "posenc.evaluate.write_results"

        def f(module, target):
            importlib.import_module(f"analysis.{module}")
            get_method("tool.fn")
            return get_method(target)
    '''))
    found = strings_naming_modules(src)
    lines = src.read_text().splitlines()
    assert {lines[int(f.split(":")[0]) - 1].strip() for f in found} == {
        'WRITER = "posenc.evaluate.write_results"', 'importlib.import_module(f"analysis.{module}")',
        'get_method("tool.fn")'}
    assert len(found) == 4  # the f-string twice: a resolver called on a string, and a path


def test_checkpoints_are_read_in_posenc_runs_alone():
    """``torch.load`` is called in ``posenc.runs`` alone (``load_state``: ``weights_only=True``,
    which unpickles tensors and plain containers, nothing that runs code)."""
    loads = re.compile(r"\btorch\.load\(|\bload\(.*weights_only")
    calls = [p.relative_to(REPO).as_posix() for p in CODE if loads.search(p.read_text())]
    assert calls == ["src/posenc/runs.py"]
    assert "weights_only=True" in (REPO / "src/posenc/runs.py").read_text()
    assert "weights_only=False" not in "".join(p.read_text() for p in CODE)


def test_the_circle_finder_sees_a_circle_hidden_in_a_function(tmp_path):
    from .imports import circles, graph

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n    return g\n")
    (pkg / "c.py").write_text("from pkg import a\n")
    edges = graph({"pkg": pkg})
    assert edges["pkg.a"] == {"pkg.b"} and edges["pkg.b"] == {"pkg.a"} and edges["pkg.c"] == {"pkg.a"}
    assert circles(edges) == [["pkg.a", "pkg.b"]]


def test_no_module_but_the_tasks_switches_on_a_task_name():
    """What a task does is asked of its task object (``posenc.tasks``: its dataset, scored
    targets, checks, metrics, evaluation and results); no other module compares a task's name
    (or the old ``objective``) with a value, in the library, the analysis, the pipelines or the
    report's templates."""
    names = "|".join(p.stem for p in (REPO / "conf/task").glob("*.yaml"))
    switch = re.compile(rf"""(objective|task(\.name)?|\[["']task["']\])\s*(==|!=|in)\s*[\(\["']"""
                        rf"""|(==|!=)\s*["']({names}|causal)["']|["']({names})["']\s*(not\s+)?in\s""")
    templates = sorted((REPO / "docs/templates").glob("*.j2"))
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in CODE + templates if p.name != "tasks.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if switch.search(line)]
    assert found == []


def test_the_study_and_its_tables_stage_name_no_task():
    """The study stage plans, runs and writes whatever tasks its params file lists, and the
    tables stage's every-task table asks each task what it logs: neither names one (a name
    in a string, or an attribute of the old per-task params, ``a.lm``)."""
    names = "|".join(p.stem for p in (REPO / "conf/task").glob("*.yaml"))
    named = re.compile(rf"""["']({names})["']|\.({names})\b(?!\.py)""")
    for rel in ("pipelines/study.py", "pipelines/executors.py"):
        code = (REPO / rel).read_text()
        body = code[code.index('"""', 3) + 3:]  # the code, not the module's text
        assert [line.strip() for line in body.splitlines() if named.search(line)] == [], rel
    tables = (REPO / "pipelines/tables.py").read_text()
    every = tables[tables.index("def tasks_table"):tables.index("# ------------------------------------------------------------------ timing")]
    assert not named.search(every)


def test_the_report_asks_for_a_task_by_the_table_it_makes():
    """The templates, the pipelines and the analysis read a task's entry of the params file
    (its seeds, lengths, steps) and its time through the table its runs make
    (``pipelines.results.Study.spec``, ``seeds``, ``task``: by the task's class), never by the
    task's name. (The tables' names, ``lm``, ``mlm``, ``retrieval``, are those of their files.
    ``pipelines/pipeline.py`` declares dvc.yaml, whose stages name the params they take and
    interpolate by their keys, ``${tasks.lm.seq_len}``, as DVC reads them: it is left out, as
    dvc.yaml is.)"""
    names = "|".join(p.stem for p in (REPO / "conf/task").glob("*.yaml"))
    by_name = re.compile(rf"""\btasks\.({names})\b|\[["']tasks["']\]\s*\[["']({names})["']\]|task_s(\.get\(|\[)["']({names})["']""")
    files = [*sorted((REPO / "docs/templates").glob("*.j2")),
             *sorted(p for p in (REPO / "pipelines").glob("*.py") if p.name != "pipeline.py"),
             *sorted((REPO / "analysis").glob("*.py"))]
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if by_name.search(line)]
    assert found == []


def test_a_study_finds_the_task_of_a_table_by_its_class(tmp_path):
    from pipelines.results import ReportError, Study

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    study = Study(tmp_path)
    assert [study.task(t) for t in ("lm", "mlm", "retrieval")] == ["lm", "mlm", "retrieval"]
    assert study.seeds("lm") == str(params["tasks"]["lm"]["seeds"]).split()
    del params["tasks"]["mlm"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ReportError, match="0 tasks of class MaskedLM"):
        Study(tmp_path).task("mlm")


@pytest.mark.slow
def test_computation_imports_no_plotting_library():
    """Statistics, term maps, reach, the retrieval grid and summary, the scale comparison and
    the tables are imported by their tests and the pipelines without matplotlib or seaborn:
    drawing lives in its own modules (``analysis.extrapolation``, ``heatmaps``, ``overview``, the
    ``plot_*`` functions), imported when a figure is drawn."""
    computing = ["analysis.stats", "analysis.terms", "analysis.reach", "analysis.scales", "analysis.retrieval",
                 "analysis.correlations", "analysis.pretrained", "pipelines.tables", "pipelines.gather",
                 "pipelines.retrieval_summary", "pipelines.report", "posenc.evaluate", "posenc.retrieval", "posenc.tasks"]
    script = ("import importlib, sys\n"
              f"for m in {computing!r}:\n    importlib.import_module(m)\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'seaborn')))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_every_command_line_lives_in_pipelines_or_the_package_entry_points():
    """``analysis/`` computes and draws; its command lines are ``pipelines.*`` modules."""
    cli = re.compile(r"^(import argparse|if __name__ == .__main__.:)", re.M)
    assert [p.name for p in sorted((REPO / "analysis").glob("*.py")) if cli.search(p.read_text())] == []


def test_the_report_renders_and_analysis_computes():
    """``pipelines/report.py`` is a renderer: short, with no statistics of its own (no scipy,
    statsmodels or numpy; its tests, verdicts and their words come from ``analysis``), and its
    results are read through one table of files (``pipelines.results.FILES``)."""
    text = (REPO / "pipelines/report.py").read_text()
    assert len(text.splitlines()) < 300
    assert not re.search(r"^\s*(import|from)\s+(scipy|statsmodels|numpy|pandas)\b", text, re.M)
    assert "cached_property" not in text


def test_every_function_of_the_package_the_pipelines_and_the_analysis_reads_at_once():
    """No function in ``src/``, ``pipelines/`` or ``analysis/`` is 60 lines or longer: a stage,
    a benchmark table or a training step is its steps, each a function that fits on a screen."""
    import ast

    long = []
    for p in CODE:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n >= 60:
                    long.append(f"{p.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert long == []


def test_the_report_templates_name_no_scheme():
    """The report's templates follow the schemes that ``params.yaml`` names (the tables'
    references, ``report:``): no Jinja expression in them names a scheme, as a
    string (``'rope'``, ``'rope+'``) or an attribute (``lm.t5_bias``)."""
    names = "|".join(sorted((p.stem for p in (REPO / "conf/encoding").glob("*.yaml")), key=len, reverse=True))
    named = re.compile(rf"""["']({names})\+?["']|\.({names})\b""")
    found = []
    for p in sorted((REPO / "docs/templates").glob("*.j2")):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            for expr in re.findall(r"\{[{%](.*?)[%}]\}", line):
                expr = re.sub(r"(selectattr|rejectattr)\([^)]*\)", "", expr)  # Jinja's tests ('none') are no schemes
                if named.search(expr):
                    found.append(f"{p.name}:{n}: {expr.strip()}")
    assert found == []
