"""Where things live: one home for the run folder's layout, one for MLflow I/O, and a
config layer that does not need Lightning (the study's stage commands, the benchmark and
the tests compose configs and build models through it)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from .conftest import REPO

CODE = [p for d in ("src", "pipelines", "analysis") for p in sorted((REPO / d).rglob("*.py"))]


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
    task's name. (The tables' names, ``lm``, ``mlm``, ``retrieval``, are those of their files.)"""
    names = "|".join(p.stem for p in (REPO / "conf/task").glob("*.yaml"))
    by_name = re.compile(rf"""\btasks\.({names})\b|\[["']tasks["']\]\s*\[["']({names})["']\]|task_s(\.get\(|\[)["']({names})["']""")
    files = [*sorted((REPO / "docs/templates").glob("*.j2")), *sorted((REPO / "pipelines").glob("*.py")),
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


def test_every_function_of_the_pipelines_and_the_analysis_reads_at_once():
    """No function in ``pipelines/`` or ``analysis/`` is 60 lines or longer: a stage is its steps,
    each a function that fits on a screen."""
    import ast

    long = []
    for p in sorted((REPO / "pipelines").rglob("*.py")) + sorted((REPO / "analysis").rglob("*.py")):
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
