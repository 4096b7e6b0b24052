"""The results report: ``docs/results.md``, a page per profile (``docs/profiles/<name>.md``)
and the README's generated blocks, rendered from the results files with Jinja2, so that every
number a reader sees comes from them.

    python -m pipelines.report            # write docs/results.md and the README's blocks
    python -m pipelines.report --check    # render in memory; exit 1 naming the first difference

The templates are ``docs/templates/results.md.j2`` (the report), ``profile.md.j2`` (a
profile's page) and ``docs/templates/readme-<name>.md.j2``, one per README block, which sits between
``<!-- generated: <name> -->`` and ``<!-- end generated -->`` in ``README.md``.
A template reads a study's results through ``pipelines.results.Study`` (``study`` is the
default one at the project root, ``profiles`` those under ``profiles/<name>/``), the
papers' numbers through ``literature`` (``docs/literature.yaml``) and the measured times of
the quick start and the tests through ``measured`` (``docs/measured``, ``pipelines.measure``).
This module only renders: every statistic it prints (tests, families, verdicts, τ and its
interval, the papers' verdicts, the fairness findings, the chronology) was computed once by the
summary stage that owns it and written to its results file (``tables``, ``retrieval``,
``papers``, ``findings``, ``scales``, ``chronology``), and every verdict id is said by
``analysis.words``. A
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
import re
import sys
from pathlib import Path

from analysis import words
from pipelines.results import ROOT, ReportError, Study, read_yaml, studies
from posenc.files import write_text

TEMPLATES = "docs/templates"
LITERATURE = "docs/literature.yaml"
REPORT = "docs/results.md"
PROFILES = "docs/profiles"
README = "README.md"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
#: the first line of every generated file and block
STAMP = "<!-- written by `python -m pipelines.report` from the results files: edit the template, not this -->"


#: what the templates call: the words module's functions by their names. None computes a statistic:
#: the summary stages wrote every one into its results file (``tests/test_report.py`` checks it).
FILTERS = {"pct": words.pct, "num": words.num, "said": words.said, "detail": words.detail, "label": words.label}
HELPERS = {n: getattr(words, n) for n in words.__all__}


# ------------------------------------------------------------------ rendering
def environment(root: Path):
    """The templates' Jinja environment. Compiling the templates takes most of a rendering, so
    their bytecode is cached in the system's temporary folder (Jinja checks each template's
    source against its cached checksum: an edited template compiles again)."""
    import tempfile

    from jinja2 import Environment, FileSystemBytecodeCache, FileSystemLoader, StrictUndefined

    cache = Path(tempfile.gettempdir()) / "posenc-report-templates"
    cache.mkdir(exist_ok=True)
    env = Environment(loader=FileSystemLoader(str(root / TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                      extensions=["jinja2.ext.do"], bytecode_cache=FileSystemBytecodeCache(str(cache)))
    env.globals.update(HELPERS)
    env.filters.update(FILTERS)
    env.tests.update({"startswith": lambda s, prefix: str(s).startswith(prefix),
                      "search": lambda s, pattern: re.search(pattern, str(s)) is not None})
    return env


def render(root: Path = ROOT) -> dict[str, str]:
    """{path relative to root: its full new text}: the report and the README with its blocks."""
    from jinja2 import TemplateError

    env = environment(root)
    study, profiles = studies(root)
    literature = read_yaml((root / LITERATURE).read_text())
    context = {"study": study, "profiles": profiles, "profile": {p.name: p for p in profiles}, "stamp": STAMP,
               "literature": literature, "measured": measured(root)}

    def one(template: str, **more) -> str:
        try:
            return env.get_template(template).render(**context, **more)
        except (TemplateError, ReportError, KeyError) as e:
            raise ReportError(f"{TEMPLATES}/{template}: {type(e).__name__}: {e}") from e

    out = {REPORT: one("results.md.j2")}
    for prof in profiles:  # a page of its own for every profile with results
        out[f"{PROFILES}/{prof.name}.md"] = one("profile.md.j2", prof=prof)
    # their index, also where there is none: the folder is the stage's output, and git keeps no empty folder
    out[f"{PROFILES}/README.md"] = one("profiles-index.md.j2")
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
    stale = sorted(p.relative_to(root).as_posix() for p in (root / PROFILES).glob("*.md")
                   if p.relative_to(root).as_posix() not in rendered)  # pages of profiles without results
    if a.check:
        if stale:
            print(f"report --check: {', '.join(stale)}: a page of no profile with results; run `python -m "
                  "pipelines.report` (or dvc repro) and commit", file=sys.stderr)
            return 1
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
    for rel in stale:
        (root / rel).unlink()
        print(f"removed {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
