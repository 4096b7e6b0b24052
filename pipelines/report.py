"""The results report: ``docs/results.md`` and the README's generated blocks, rendered
from the results files with Jinja2, so that every number a reader sees comes from them.

    python -m pipelines.report            # write docs/results.md and the README's blocks
    python -m pipelines.report --check    # render in memory; exit 1 naming the first difference

The templates are ``docs/templates/results.md.j2`` (the report) and
``docs/templates/readme-<name>.md.j2``, one per README block, which sits between
``<!-- generated: <name> -->`` and ``<!-- end generated -->`` in ``README.md``.
A template reads a study's results through ``pipelines.results.Study`` (``study`` is the
default one at the project root, ``profiles`` those under ``profiles/<name>/``), the
papers' numbers through ``literature`` (``docs/literature.yaml``) and the measured times of
the quick start and the tests through ``measured`` (``docs/measured``, ``pipelines.measure``). This module renders;
every test, family and verdict it prints was computed by ``analysis`` (``stats``,
``papers``, ``findings``, ``scales``), and spelt by ``analysis.words``. A
template that names a result that does not exist fails (Jinja's ``StrictUndefined``, and
``Study`` refuses a missing file, naming it), in the stage and in ``--check``.

``--check`` is what CI runs on the committed results: it fails when a committed generated
file differs from what the results give, or when a template cannot be rendered from them,
and it also checks the counts of runs and seeds that ``docs/`` quotes (``quoted_counts``) and
that each study credits a commit that can have made its results (``credits``,
``pipelines.commits.credit_problems``): an ancestor of HEAD, not later than its records, and a
study record that links its training runs.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from pathlib import Path

import yaml

from analysis import stats, words
from pipelines.results import ROOT, ReportError, Study
from posenc.files import write_text

TEMPLATES = "docs/templates"
LITERATURE = "docs/literature.yaml"
REPORT = "docs/results.md"
README = "README.md"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
#: the first line of every generated file and block
STAMP = "<!-- written by `python -m pipelines.report` from the results files: edit the template, not this -->"


def _analysis(name: str):
    """An analysis function, imported when a template first calls it."""
    module, _, fn = name.rpartition(".")

    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(f"analysis.{module}"), fn)(*args, **kwargs)

    return call


#: what the templates call: the words module's functions by their names, analysis functions
#: (imported when first called), and a few of Python's and the statistics' own
FILTERS = {"pct": words.pct, "num": words.num, "said": words.said, "detail": words.detail, "log": math.log}
HELPERS = {**{n: getattr(words, n) for n in words.__all__}, "p": stats.format_p, "isnan": math.isnan,
           "shown_diff": stats.shown_diff, "shown_margin": stats.shown_margin,
           "shown_detectable": stats.shown_detectable,
           "words": {"ahead": stats.AHEAD, "behind": stats.BEHIND, "equivalent": stats.EQUIVALENT,
                     "undecided": stats.UNDECIDED, "untested": stats.UNTESTED},
           **{n.rpartition(".")[2]: _analysis(n) for n in (
               "papers.against_papers", "papers.interval", "findings.flat_retrieval", "findings.flat_schemes",
               "findings.t5_control", "findings.power", "findings.with_seeds", "findings.at_length",
               "findings.fairness", "findings.ratios", "scales.findings", "scales.depends_on_scale",
               "stats.rank_intervals")}}
HELPERS["kendall_tables"] = lambda a, b, ra=None: _analysis("scales.kendall_tables")(a.samples(ra), b.samples(), a.top)
HELPERS["first_workers"] = lambda s: next(iter(s.timing["stages"].values()))["workers"]


# ------------------------------------------------------------------ rendering
def environment(root: Path):
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(root / TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                      extensions=["jinja2.ext.do"])
    env.globals.update(HELPERS)
    env.filters.update(FILTERS)
    from analysis.scales import depends_on_scale

    env.tests.update({"startswith": lambda s, prefix: str(s).startswith(prefix), "depends_on_scale": depends_on_scale,
                      "search": lambda s, pattern: re.search(pattern, str(s)) is not None})
    return env


def studies(root: Path) -> tuple[Study, list[Study]]:
    """The default study and the profiles that have results (``profiles/<name>/results``)."""
    profiles = [Study(p.parent, p.parent.name) for p in sorted((root / "profiles").glob("*/results"))]
    return Study(root), profiles


def render(root: Path = ROOT) -> dict[str, str]:
    """{path relative to root: its full new text}: the report and the README with its blocks."""
    from jinja2 import TemplateError

    env = environment(root)
    study, profiles = studies(root)
    literature = yaml.safe_load((root / LITERATURE).read_text())
    context = {"study": study, "profiles": profiles, "profile": {p.name: p for p in profiles}, "stamp": STAMP,
               "literature": literature, "measured": measured(root)}

    def one(template: str) -> str:
        try:
            return env.get_template(template).render(**context)
        except (TemplateError, ReportError, KeyError) as e:
            raise ReportError(f"{TEMPLATES}/{template}: {type(e).__name__}: {e}") from e

    out = {REPORT: one("results.md.j2")}
    readme = (root / README).read_text()

    def block(m: re.Match) -> str:
        body = one(f"readme-{m['name']}.md.j2")
        return f"{m.group(1)}{STAMP}\n{body.rstrip()}\n{m.group(4)}"

    out[README] = BLOCK.sub(block, readme)
    return out


def measured(root: Path) -> dict[str, dict]:
    """The records of ``python -m pipelines.measure`` (``docs/measured/<name>.json``), by name: the
    times the README gives for the quick start and the tests."""
    import json

    from pipelines.measure import RECORDS

    return {p.stem: json.loads(p.read_text()) for p in sorted((root / RECORDS).glob("*.json"))}


def _runs(study: Study, table: str) -> tuple[int, int, int]:
    """(runs, schemes, seeds a scheme) of the task that makes ``table``, from the study's params."""
    task = study.task(table)
    schemes = sum(task in str(e.get("tasks", "")).split() for e in study.params["schemes"].values())
    seeds = len(study.seeds(table))
    return schemes * seeds, schemes, seeds


#: counts of runs and seeds that pages of docs/ quote in prose: (file, pattern, what the params give)
QUOTED = (
    ("docs/reproduce.md", r"(\d+) causal-LM runs \((\d+) schemes × (\d+) seeds?", lambda s: _runs(s, "lm")),
    ("docs/reproduce.md", r"(\d+) masked-LM runs \((\d+) schemes × (\d+) seeds?", lambda s: _runs(s, "mlm")),
    ("docs/reproduce.md", r"(\d+) retrieval runs \((\d+) schemes × (\d+) seeds?", lambda s: _runs(s, "retrieval")),
)


def quoted_counts(root: Path = ROOT) -> list[str]:
    """Where a page of ``docs/`` quotes a count of runs or seeds that the default study's params
    no longer give: one line per difference (``QUOTED``)."""
    study = Study(root)
    wrong = []
    for rel, pattern, expected in QUOTED:
        path = root / rel
        for m in re.finditer(pattern, path.read_text() if path.exists() else ""):
            got, want = tuple(int(g) for g in m.groups()), expected(study)
            if got != want:
                wrong.append(f"{rel}: {m.group(0)!r} quotes {got}, params.yaml gives {want}")
    return wrong


def credits(root: Path = ROOT) -> list[str]:
    """Why a study's credited commit cannot have made its results (``pipelines.commits``), one
    line each, for the default study and every profile with results. Outside a git checkout
    (a copy of the results) there is no history to ask: one line says so on stderr, and the
    check passes on the rendering alone."""
    from pipelines.commits import credit_problems, git

    if git(root, "rev-parse", "--show-toplevel") != str(root.resolve()):
        print(f"report --check: {root} is not the top of a git checkout: the credited commits are not checked",
              file=sys.stderr)
        return []
    study, profiles = studies(root)
    out = credit_problems(root, study, "params.yaml")
    for prof in profiles:
        out += credit_problems(root, prof, (prof.root / "params.yaml").relative_to(root).as_posix())
    return out


def first_difference(name: str, old: str, new: str) -> str:
    for n, (a, b) in enumerate(zip(old.splitlines(), new.splitlines()), 1):
        if a != b:
            return f"{name}:{n}: committed {a[:160]!r}, the results give {b[:160]!r}"
    diff = list(difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0))
    return f"{name}: differs in length ({len(old.splitlines())} lines committed, {len(new.splitlines())} from the " \
           f"results): {' '.join(diff[2:4])[:200]}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="render in memory and fail on any difference")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests render a copy
    a = p.parse_args(argv)
    root = Path(a.root)
    try:
        rendered = render(root)
    except ReportError as e:
        print(f"report: {e}", file=sys.stderr)
        return 1
    if a.check:
        for rel, text in rendered.items():
            path = root / rel
            old = path.read_text() if path.exists() else ""
            if old != text:
                print(f"report --check: {first_difference(rel, old, text)}; run `python -m pipelines.report` "
                      "(or dvc repro) and commit", file=sys.stderr)
                return 1
        wrong = quoted_counts(root) + credits(root)
        if wrong:
            print("report --check: " + "; ".join(wrong), file=sys.stderr)
            return 1
        print(f"report --check: {', '.join(rendered)} match the results, and each credits the commit that made them")
        return 0
    for rel, text in rendered.items():
        if not (root / rel).exists() or (root / rel).read_text() != text:
            write_text(root / rel, text)
        print(root / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
