"""The results report: ``docs/results.md`` and the README's generated blocks, rendered
from the results files with Jinja2, so that every number a reader sees comes from them.

    python -m pipelines.report            # write docs/results.md and the README's blocks
    python -m pipelines.report --check    # render in memory; exit 1 naming the first difference

The templates are ``docs/templates/results.md.j2`` (the report) and
``docs/templates/readme-<name>.md.j2``, one per README block, which sits between
``<!-- generated: <name> -->`` and ``<!-- end generated -->`` in ``README.md``.
A template reads a study's results through ``Study`` (``study`` is the default one at the
project root, ``profiles`` those under ``profiles/<name>/``) and the papers' numbers
through ``literature`` (``docs/literature.yaml``). This module reads and renders; every
test, family and verdict it prints was computed by ``analysis`` (``stats``, ``papers``,
``findings``, ``scales``), and a sentence that compares prints its words from there. A
template that names a result that does not exist fails (Jinja's ``StrictUndefined``, and
``Study`` refuses a missing file, naming it), in the stage and in ``--check``.

``--check`` is what CI runs on the committed results: it fails when a committed generated
file differs from what the results give, or when a template cannot be rendered from them,
and it also checks the counts of runs and seeds that ``docs/`` quotes (``quoted_counts``).
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

import yaml

from analysis import stats
from posenc.files import write_text

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = "docs/templates"
LITERATURE = "docs/literature.yaml"
REPORT = "docs/results.md"
README = "README.md"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
#: the first line of every generated file and block
STAMP = "<!-- written by `python -m pipelines.report` from the results files: edit the template, not this -->"
#: a study's results files, by the name a template reads them with (``study.lm``)
FILES = {"params": "params.yaml", "mlflow": "results/mlflow_study.json", "prepare": "results/prepare.json",
         "timing": "results/timing.json", "lm": "results/lm_table.json", "mlm": "results/mlm_table.json",
         "correlations": "results/correlations.json", "retrieval": "results/retrieval_table.json",
         "minilm": "results/pretrained_minilm.json", "bench": "figures/bench/bench.json",
         "buckets": "results/buckets.json"}


class ReportError(Exception):
    """A result a template needs is missing, or a generated file is out of date."""


class Study:
    """The results of one study (the default one at the project root, or a profile under
    ``profiles/<name>/``): each file of ``FILES`` read when a template first asks for it."""

    def __init__(self, root: Path, name: str = "default"):
        self.root, self.name = Path(root), name

    def __getattr__(self, key: str):
        if key not in FILES:
            raise AttributeError(key)
        path = self.path(FILES[key])
        value = yaml.safe_load(path.read_text()) if path.suffix == ".yaml" else json.loads(path.read_text())
        setattr(self, key, value)  # read once
        return value

    def path(self, rel: str) -> Path:
        p = self.root / rel
        if not p.exists():
            raise ReportError(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: no such results file "
                              f"(run the study: dvc repro)")
        return p

    def has(self, key: str) -> bool:
        return (self.root / FILES[key]).exists()

    @functools.cached_property
    def runs(self) -> dict[str, dict]:
        """{scheme: its study stage's record} for the study's schemes."""
        return {s: json.loads(self.path(f"results/runs/{s}.json").read_text()) for s in self.params["schemes"]}

    @functools.cached_property
    def reach_rows(self) -> list[dict]:
        """The rows of ``results/reach.csv`` (one per scheme, seed, length, layer and head)."""
        import pandas as pd

        return pd.read_csv(self.path("results/reach.csv")).to_dict("records")

    @functools.cached_property
    def reach(self) -> dict:
        """{scheme: {multiple: {distance, entropy, uniform_distance, uniform_entropy, seeds}}}."""
        from analysis.reach import summary

        out: dict = {}
        for r in summary(self.reach_rows).to_dict("records"):
            out.setdefault(r["scheme"], {})[str(int(r["multiple"]))] = r
        return out

    @property
    def top(self) -> int:
        """The longest evaluation length, as a multiple of L."""
        return max(int(m) for m in str(self.params["lm"]["multipliers"]).split())

    def seeds(self, task: str) -> list[str]:
        """The seeds of a task's runs in this study."""
        own = (self.params.get(task) or {}).get("seeds")
        return str(own if own is not None else self.params["seeds"]).split()

    def link(self, rel: str) -> str:
        """A relative link from ``docs/`` to one of this study's files (figures, tables)."""
        where = self.root.relative_to(self.root.parent.parent) if self.name != "default" else Path(".")
        return (Path("..") / where / rel).as_posix()

    def table(self, name: str) -> str:
        """A generated Markdown table (``figures/<name>.md``), as the stage wrote it."""
        return self.path(f"figures/{name}.md").read_text().rstrip("\n")

    @functools.cached_property
    def times(self) -> dict[str, dict]:
        """{stage: {started, finished, seconds}} of every stage that recorded its time."""
        folder = self.path("results/times")
        return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}

    @functools.cached_property
    def wall(self) -> dict:
        """The repro's wall time from the stages' records: ``span`` from the first stage's
        start to the last one's end, ``one_sitting`` (no gap of more than 10 minutes between
        stages: the span is one repro's), the seconds per kind of stage, and ``date``."""
        t = self.times
        if not t:
            raise ReportError(f"{self.root / 'results/times'}: no stage recorded its time")
        spans = sorted((r["started"], r["finished"]) for r in t.values())
        reach, gaps = spans[0][1], []
        for start, end in spans[1:]:
            gaps.append(start - reach)
            reach = max(reach, end)
        kinds: dict[str, float] = {}
        for stage, r in t.items():
            kind = stage.split("@")[0]
            kinds[kind] = kinds.get(kind, 0.0) + r["seconds"]
        finished = max(r["finished"] for r in t.values())
        return {"span": reach - spans[0][0], "one_sitting": all(g < 600 for g in gaps),
                "stages": sum(r["seconds"] for r in t.values()), "kinds": kinds,
                "date": datetime.fromtimestamp(finished, timezone.utc).strftime("%Y-%m-%d")}

    @functools.cached_property
    def machines(self) -> list[dict]:
        """The distinct machines the study stages recorded (one, when a repro made them all)."""
        seen: list[dict] = []
        for record in self.runs.values():
            m = record.get("machine")
            if m and m not in seen:
                seen.append(m)
        return seen

    @functools.cached_property
    def code(self) -> list[str]:
        """The distinct digests of the shared code the study stages recorded."""
        return sorted({(r.get("provenance") or {}).get("core", "not recorded") for r in self.runs.values()})

    @property
    def margins(self) -> dict:
        return {"lm": self.params["lm_table"]["margin"], "retrieval": self.params["retrieval_table"]["margin"]}


# ------------------------------------------------------------------ words and numbers, for templates
def said(t: dict | None, reference: bool = True) -> str:
    """A comparison's verdict in words: "behind `alibi`", "behind `alibi`, within ±5%",
    "equivalent to `none` within ±10.0 pt", "undecided against `alibi`", "untested against
    `none`"; ``reference=False`` gives the word alone ("ahead", "behind", "equivalent within
    ±5%", "undecided", "untested"); ``detail`` gives the numbers."""
    if not t:
        return "untested"
    w = t["word"]
    if reference and t.get("against"):
        w = f"{w} `{t['against']}`"
    else:  # the word alone
        w = {stats.AHEAD: "ahead", stats.EQUIVALENT: "equivalent", stats.UNDECIDED: "undecided",
             stats.UNTESTED: "untested"}.get(w, w)
    if t["word"] in (stats.AHEAD, stats.BEHIND):
        return w + (f", within {stats.shown_margin(t)}" if t.get("within_margin") else "")
    if t["word"] == stats.EQUIVALENT:
        return f"{w} within {stats.shown_margin(t)}"
    return w


def detail(t: dict | None) -> str:
    """A comparison's numbers: "×1.91, Holm p = 0.027"; an undecided one adds what its test
    could detect ("; it detects only a factor beyond ×2.100"), one without a test why."""
    if not t:
        return "no test"
    if t.get("p") is None:
        return f"{stats.shown_diff(t)}; {t.get('note', 'no test')}"
    out = f"{stats.shown_diff(t)}, Holm p = {stats.format_p(t['p_adj'])}"
    return out + (f"; {stats.shown_detectable(t)}" if t["word"] == stats.UNDECIDED else "")


def grouped(tests: dict[str, dict]) -> dict[str, list[str]]:
    """The schemes of a family by the word their comparison earned, in the order given."""
    out: dict[str, list[str]] = {w: [] for w in stats.WORDS}
    for s, t in tests.items():
        out[t["word"]].append(s)
    return out


def names(items: Sequence[str], code: bool = True) -> str:
    """"a, b and c", each in backticks."""
    items = [f"`{i}`" if code else str(i) for i in items]
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def signed(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}"


def pct(x: float, digits: int = 0) -> str:
    """A share as a percentage, without the sign: 0.2345 -> 23 (digits=0)."""
    return f"{100 * x:.{digits}f}"


def pm(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """mean ± sample sd of per-seed values (the value alone for one seed)."""
    m, sd = stats.mean_sd([scale * v for v in values])
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(values) > 1 else "")


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def at(lengths: dict, key) -> dict:
    """An entry of a table keyed by length or multiple, which JSON turned into strings."""
    return lengths[str(key)]


def mean(values: Sequence[float]) -> float:
    return stats.mean_sd(list(values))[0]


def numeric(keys) -> list[str]:
    """Keys that spell numbers ("1e-3", "3e-3", "1e-2"), in the order of their values."""
    return sorted(keys, key=float)


def shared_rate(common: str) -> str | None:
    """The learning rate every run of a study shares (``optim.lr=`` in its common overrides)."""
    return common.split("optim.lr=")[1].split()[0] if "optim.lr=" in common else None


#: a verdict's verb in the plural, where it has one ("8 agree, 1 disagrees")
PLURAL = {"agrees": "agree", "disagrees": "disagree"}


def verdict_counts(claims: Sequence[Mapping]) -> str:
    """How many claims earn each verdict, in words: "8 agree, 1 disagrees, 2 in part"."""
    counts = Counter(c["verdict"] for c in claims)
    return ", ".join(f"{n} {PLURAL.get(v, v) if n != 1 else v}" for v, n in sorted(counts.items()))


def ranked(values: dict[str, float], reverse: bool = False) -> list[str]:
    """The keys of ``values`` by value."""
    return sorted(values, key=values.get, reverse=reverse)


def _analysis(name: str):
    """An analysis function, imported when a template first calls it."""
    module, _, fn = name.rpartition(".")

    def call(*args, **kwargs):
        import importlib

        return getattr(importlib.import_module(f"analysis.{module}"), fn)(*args, **kwargs)

    return call


FILTERS = {"pct": pct, "num": num, "said": said, "detail": detail, "log": math.log}
HELPERS = {"said": said, "detail": detail, "grouped": grouped, "names": names, "num": num, "signed": signed,
           "pct": pct, "pm": pm, "minutes": minutes, "at": at, "mean": mean, "ranked": ranked, "numeric": numeric,
           "shared_rate": shared_rate, "verdict_counts": verdict_counts, "p": stats.format_p,
           "isnan": math.isnan, "shown_diff": stats.shown_diff, "shown_margin": stats.shown_margin,
           "shown_detectable": stats.shown_detectable,
           "words": {"ahead": stats.AHEAD, "behind": stats.BEHIND, "equivalent": stats.EQUIVALENT,
                     "undecided": stats.UNDECIDED, "untested": stats.UNTESTED},
           **{n.rpartition(".")[2]: _analysis(n) for n in (
               "papers.against_papers", "papers.interval", "findings.flat_retrieval", "findings.flat_schemes",
               "findings.t5_control", "findings.power", "findings.with_seeds", "findings.at_length", "findings.fairness", "findings.ratios", "scales.findings",
               "scales.depends_on_scale", "stats.rank_intervals")}}
HELPERS["kendall_tables"] = lambda a, b, ra=None: _taus(a, b, ra)
HELPERS["first_workers"] = lambda s: next(iter(s.timing["stages"].values()))["workers"]


def _taus(a: Study, b: Study, retrieval: Study | None = None) -> list[dict]:
    """Kendall's τ between the orderings of ``a`` (its retrieval from ``retrieval`` when given) and
    ``b`` for every table of ``analysis.scales.TABLES``, with its bootstrap interval and the
    schemes that move (``analysis.scales.compare``)."""
    from analysis.scales import RESAMPLES, TABLES, compare, samples

    def of(s: Study, r: Study) -> dict:
        return samples(s.lm, s.mlm, r.retrieval, s.reach_rows, s.correlations, s.top)

    sa, sb = of(a, retrieval or a), of(b, b)
    return [{"key": key, "label": label.format(top=a.top), "resamples": RESAMPLES,
             **compare(sa[key], sb[key], better, resamples=RESAMPLES)} for key, label, better in TABLES]


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
               "literature": literature}

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


def _runs(study: Study, task: str) -> tuple[int, int, int]:
    """(runs, schemes, seeds a scheme) of one task of a study, from its params."""
    schemes = sum(task in str(e.get("tasks", "")).split() for e in study.params["schemes"].values())
    seeds = len(study.seeds(task))
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
        wrong = quoted_counts(root)
        if wrong:
            print("report --check: " + "; ".join(wrong), file=sys.stderr)
            return 1
        print(f"report --check: {', '.join(rendered)} match the results")
        return 0
    for rel, text in rendered.items():
        if not (root / rel).exists() or (root / rel).read_text() != text:
            write_text(root / rel, text)
        print(root / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
