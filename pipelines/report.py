"""The results report: ``docs/results.md`` and the README's generated blocks, rendered
from the results files with Jinja2, so that every number a reader sees comes from them.

    python -m pipelines.report            # write docs/results.md and the README's blocks
    python -m pipelines.report --check    # render in memory; exit 1 naming the first difference

The templates are ``docs/templates/results.md.j2`` (the report) and
``docs/templates/readme-<name>.md.j2``, one per README block, which sits between
``<!-- generated: <name> -->`` and ``<!-- end generated -->`` in ``README.md``.
A template reads a study's results through ``Study`` (``study`` is the default one
at the project root, ``profiles`` those under ``profiles/<name>/``), and words every
comparison with ``compare``, which takes the words from the test (``analysis.stats``),
so that no sentence can claim a difference the seeds do not support. A template that
names a result that does not exist fails (Jinja's ``StrictUndefined``, and ``Study``
refuses a missing file, naming it), in the stage and in ``--check``.

``--check`` is what CI runs on the committed results: it fails when a committed
generated file differs from what the results give, or when a template cannot be
rendered from them.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import math
import re
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import yaml

from analysis.stats import AHEAD, ALPHA, BEHIND, LEVEL, UNTESTED, format_p, mean_sd, verdict, welch
from posenc.files import write_text

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = "docs/templates"
REPORT = "docs/results.md"
README = "README.md"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
#: the first line of every generated file and block
STAMP = "<!-- written by `python -m pipelines.report` from the results files: edit the template, not this -->"


class ReportError(Exception):
    """A result a template needs is missing, or a generated file is out of date."""


class Study:
    """The results of one study (the default one at the project root, or a profile
    under ``profiles/<name>/``), read when a template first asks for them."""

    def __init__(self, root: Path, name: str = "default"):
        self.root, self.name = Path(root), name

    def path(self, rel: str) -> Path:
        p = self.root / rel
        if not p.exists():
            raise ReportError(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: no such results file "
                              f"(run the study: dvc repro)")
        return p

    def _json(self, rel: str):
        return json.loads(self.path(rel).read_text())

    @functools.cached_property
    def params(self) -> dict:
        return yaml.safe_load(self.path("params.yaml").read_text())

    @functools.cached_property
    def mlflow(self) -> dict:
        return self._json("results/mlflow_study.json")

    @functools.cached_property
    def prepare(self) -> dict:
        return self._json("results/prepare.json")

    @functools.cached_property
    def timing(self) -> dict:
        return self._json("results/timing.json")

    @functools.cached_property
    def lm(self) -> dict:
        return self._json("results/lm_table.json")

    @functools.cached_property
    def mlm(self) -> dict:
        return self._json("results/mlm_table.json")

    @functools.cached_property
    def correlations(self) -> dict:
        return self._json("results/correlations.json")

    @functools.cached_property
    def retrieval(self) -> dict:
        return self._json("results/retrieval_table.json")

    @functools.cached_property
    def minilm(self) -> dict:
        return self._json("results/pretrained_minilm.json")

    @functools.cached_property
    def bench(self) -> dict:
        return self._json("figures/bench/bench.json")

    @functools.cached_property
    def runs(self) -> dict[str, dict]:
        """{scheme: its study stage's record} for the study's schemes."""
        return {s: self._json(f"results/runs/{s}.json") for s in self.params["schemes"]}

    @functools.cached_property
    def reach(self) -> dict:
        """{scheme: {multiple: {distance, entropy, uniform_distance, uniform_entropy, seeds}}}."""
        import pandas as pd

        from analysis.reach import summary

        rows = pd.read_csv(self.path("results/reach.csv"))
        out: dict = {}
        for r in summary(rows.to_dict("records")).to_dict("records"):
            out.setdefault(r["scheme"], {})[str(int(r["multiple"]))] = r
        return out

    @functools.cached_property
    def reach_rows(self) -> list[dict]:
        """The rows of ``results/reach.csv`` (one per scheme, seed, length, layer and head)."""
        import pandas as pd

        return pd.read_csv(self.path("results/reach.csv")).to_dict("records")

    def samples(self, retrieval: "Study | None" = None) -> dict[str, dict[str, list[float]]]:
        """Every table ``analysis.scales`` compares: {table: {scheme: per-seed values}}; the
        retrieval tables from ``retrieval`` (a study with more retrieval seeds) when given."""
        from analysis.scales import samples

        return samples(self.lm, self.mlm, (retrieval or self).retrieval, self.reach_rows, self.correlations,
                       self.top)

    @property
    def top(self) -> int:
        """The longest evaluation length, as a multiple of L."""
        return max(int(m) for m in str(self.params["lm"]["multipliers"]).split())

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


# ------------------------------------------------------------------ what templates call
class Comparison(dict):
    """``welch`` of a against b, with the words it earns: ``word`` ("ahead of", "level
    with", "behind"; ``analysis.stats.verdict``), ``p`` and ``ci`` printable."""

    def __str__(self) -> str:
        return self["word"]

    @property
    def word(self) -> str:
        return self["word"]

    @property
    def diff(self) -> float:
        return self["diff"]

    @property
    def p(self) -> str:
        return format_p(self["p"])

    @property
    def apart(self) -> bool:
        return self["word"] in ("ahead of", "behind")


def compare(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> Comparison:
    """How ``a`` (one scheme's per-seed values) stands against ``b``, from Welch's test."""
    test = welch(list(a), list(b))
    return Comparison(test, word=verdict(test, higher_is_better))


def holm(ps: dict[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of several p-values tested together: sorted ascending, the
    k-th smallest (from 0) is multiplied by (m - k), kept at least as large as the one before it
    and capped at 1; None (no test) stays None and does not count in m. A difference is then
    claimed where the adjusted p is below the level, which keeps the chance of any false claim
    in the family at that level. Checked by hand: {a: 0.01, b: 0.04, c: 0.03} gives
    a 0.03 (0.01 x 3), c 0.06 (0.03 x 2) and b 0.06 (0.04 x 1, raised to 0.06)."""
    tested = sorted((p, k) for k, p in ps.items() if p is not None)
    out: dict[str, float | None] = {k: None for k, p in ps.items() if p is None}
    running = 0.0
    for i, (p, k) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - i) * p))
        out[k] = running
    return {k: out[k] for k in ps}


def against_best(samples: dict[str, Sequence[float]], best: str, higher_is_better: bool = True) -> dict:
    """Each scheme's per-seed values against those of ``best`` (Welch), with Holm's adjustment
    for the several comparisons (``holm``): {scheme: Comparison}, whose ``p``
    and word are the adjusted ones (the unadjusted p stays as ``p_raw``)."""
    tests = {s: welch(list(v), list(samples[best])) for s, v in samples.items() if s != best}
    adjusted = holm({s: t["p"] for s, t in tests.items()})
    out = {}
    for s, t in tests.items():
        t = {**t, "p_raw": t["p"], "p": adjusted[s]}
        out[s] = Comparison(t, word=verdict(t, higher_is_better))
    return out


def judged(test: dict, higher_is_better: bool = True) -> Comparison:
    """The words of a test a results file already holds (``vs_question``, ``vs_none``, ...)."""
    return Comparison(test, word=verdict(test, higher_is_better))


def verdicts(tests: dict[str, dict], higher_is_better: bool = True) -> dict[str, Comparison]:
    """{scheme: its comparison} for tests a results file holds per scheme."""
    return {s: judged(t, higher_is_better) for s, t in tests.items()}


def group(compared: dict[str, Comparison]) -> dict[str, list[str]]:
    """The schemes by the word their comparison earned: {"ahead of": [...], "level with": [...],
    "behind": [...], "untested against": [...]}, in the order given."""
    out: dict[str, list[str]] = {w: [] for w in ("ahead of", "level with", "behind", "untested against")}
    for scheme, c in compared.items():
        out[c.word].append(scheme)
    return out


def groups_sentence(groups: dict[str, list[str]], phrases: dict[str, tuple[str, str]], detail=None) -> str:
    """The groups of ``group`` as one clause each, joined by semicolons: ``phrases`` maps a word
    to its (singular, plural) predicate, ``detail`` (a function of the scheme, or a dict) adds a
    parenthesis after each name.
    Words without a phrase and empty groups are left out."""
    clauses = []
    for word, (one, many) in phrases.items():
        members = groups.get(word) or []
        if members:
            describe = detail.get if isinstance(detail, dict) else detail
            shown = [f"`{s}`" + (f" ({describe(s)})" if detail else "") for s in members]
            listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]
            clauses.append(f"{listed} {one if len(members) == 1 else many}")
    return "; ".join(clauses)


def flat(values: Sequence[float], tolerance: float = 0.05) -> bool:
    """Whether a ratio ppl(longest) / ppl(L) is flat: the upper end of its 95% interval over seeds
    (Student's t) at most 1 + ``tolerance``. One seed has no interval and is never called flat."""
    from scipy import stats

    if len(values) < 2:
        return False
    m, sd = mean_sd(list(values))
    return m + stats.t.ppf(0.975, len(values) - 1) * sd / math.sqrt(len(values)) <= 1 + tolerance


def lm_tests(lm: dict) -> dict[str, dict]:
    """Each scheme's ratio ppl(longest)/ppl(L) against the question scheme's (``vs_question``)."""
    return {s: e["vs_question"] for s, e in lm.items() if "vs_question" in e}


def tested_at(schemes: dict, multiple: int) -> dict[str, "Comparison"]:
    """{scheme: its test against the retrieval summary's reference at one length} (``vs`` of
    ``analysis.retrieval.summary``), for the schemes tested there."""
    out = {}
    for name, entry in schemes.items():
        cell = entry["lengths"].get(str(multiple)) or {}
        if "vs" in cell:
            out[name] = judged(cell["vs"])
    return out


def differ(*samples: Sequence[float]) -> dict:
    """Whether several schemes' per-seed values differ at all: Alexander and Govern's test of
    equal means, which, like Welch's, does not assume equal variances (``scipy.stats.alexandergovern``).
    ``{"p": ..., "word": "differ" | "do not differ" | "untested"}``: untested with fewer than two
    seeds a scheme, or a scheme whose seeds do not vary (the test needs a spread in every group)."""
    from scipy import stats

    if len(samples) < 2 or any(len(s) < 2 or len(set(s)) < 2 for s in samples):
        return {"p": None, "word": "untested"}
    p = float(stats.alexandergovern(*[list(map(float, s)) for s in samples]).pvalue)
    return {"p": p, "word": "differ" if p < ALPHA else "do not differ"}  # "their means differ"


def flat_schemes(lm: dict) -> list[str]:
    """The schemes (no ``+rule`` row) of an LM table whose ratio ppl(longest) / ppl(L) is flat
    (``flat``), in name order."""
    return [s for s, e in sorted(lm.items()) if "+" not in s and flat(e["ratio_longest"].get("values") or [])]


def flat_retrieval(lm: dict, schemes: dict, multiple: int) -> dict:
    """Does a flat perplexity curve mean retrieval at length? The schemes whose ratio
    ppl(longest) / ppl(L) is flat (``flat``) and that have a retrieval row: ``flats`` (in name
    order), their per-seed exact match at ``multiple`` (``values``), ``differ`` (Alexander and
    Govern over them), the one with the highest mean (``best``) and, when they differ, each
    other one against it (``vs_best``, Welch with Holm's adjustment; else {}). ``flats`` has
    fewer than two schemes when there is nothing to compare."""
    flats = [s for s, e in sorted(lm.items())
             if s in schemes and flat(e["ratio_longest"].get("values") or [])
             and str(multiple) in schemes[s]["lengths"]]
    values = {s: schemes[s]["lengths"][str(multiple)]["values"] for s in flats}
    if len(flats) < 2:
        return {"flats": flats, "values": values, "differ": {"p": None, "word": "untested"}, "best": None, "vs_best": {}}
    best = max(flats, key=lambda s: (mean(values[s]), s))
    d = differ(*values.values())
    return {"flats": flats, "values": values, "differ": d, "best": best,
            "vs_best": against_best(values, best) if d["word"] == "differ" else {}}


def exact_at(schemes: dict, multiple: int) -> dict[str, str]:
    """{scheme: its exact match at one length, "mean% ± sd" over seeds (the value alone for one)}."""
    out = {}
    for name, entry in schemes.items():
        cell = entry["lengths"].get(str(multiple))
        if cell:
            out[name] = f"{pct(cell['mean'])}%" + (f" ± {pct(cell['sd'])}" if cell["n"] > 1 else "")
    return out


def reached_steps(entry: dict) -> list[int]:
    """The steps to the criterion of the seeds of a retrieval summary entry that reached it."""
    return [entry["steps"][str(s)] for s in entry["reached"]]


def rank_by_steps(entries: Sequence[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """(scheme, retrieval entry) pairs with at least two seeds at the criterion, fastest first."""
    return sorted((e for e in entries if len(e[1]["reached"]) > 1), key=lambda e: mean(reached_steps(e[1])))


def holds(first: Comparison, second: Comparison, names: tuple[str, str] = ("the first", "the second")) -> str:
    """Whether a comparison stated at one scale holds at another, from the two tests:
    "holds" (the same word), "reversed" (apart in opposite directions) or "apart in <name>
    only" (apart at one scale, level at the other: the comparison depends on scale, or the
    level side's seeds are too few to tell); when either side has too few seeds for the test,
    the direction of the difference of means: "same direction, untested" or "other direction,
    untested" after a claimed difference, "untested" after a level one."""
    if UNTESTED not in (first.word, second.word):
        if first.word == second.word:
            return "holds"
        if LEVEL not in (first.word, second.word):
            return "reversed"
        return f"apart in {names[0] if first.word != LEVEL else names[1]} only"
    if first.word in (AHEAD, BEHIND) or (first.word == UNTESTED and first.diff != 0):
        return ("same" if (first.diff > 0) == (second.diff > 0) else "other") + " direction, untested"
    return "untested"


def depends_on_scale(verdict: str) -> bool:
    """Whether a verdict of ``holds`` says the comparison does not hold at the other scale."""
    return verdict == "reversed" or verdict.startswith("apart in ")


def scale_taus(a: "Study", b: "Study", retrieval: "Study | None" = None) -> list[dict]:
    """Kendall's τ between the orderings of study ``a`` (its retrieval tables from ``retrieval``
    when given) and study ``b`` for every table of ``analysis.scales.TABLES``, with its
    bootstrap interval and the schemes that move (``analysis.scales.compare``)."""
    from analysis.scales import RESAMPLES, TABLES
    from analysis.scales import compare as kendall_compare

    sa, sb = a.samples(retrieval), b.samples()
    return [{"key": key, "label": label.format(top=a.top), "resamples": RESAMPLES,
             **kendall_compare(sa[key], sb[key], better, resamples=RESAMPLES)}
            for key, label, better in TABLES]


def _values(lm: dict, s: str) -> list[float]:
    return list(lm[s]["ratio_longest"].get("values") or []) if s in lm else []


def scale_findings(a: "Study", b: "Study", retrieval: "Study | None" = None) -> list[dict]:
    """The comparisons the report states about study ``a``, each made again on study ``b`` with
    the same test (``compare``): [{"finding", "a", "b" (the words and values at each scale),
    "verdict" (``holds``)}]. Retrieval at ``a`` reads ``retrieval`` when given (more seeds)."""
    ra = retrieval or a
    rows = []

    def row(finding: str, ca: Comparison, cb: Comparison, show) -> None:
        said = lambda c: "untested" if c.word == UNTESTED else c.word  # noqa: E731
        rows.append({"finding": finding, "a": f"{said(ca)} ({show(ca)})", "b": f"{said(cb)} ({show(cb)})",
                     "verdict": holds(ca, cb, (a.name, b.name))})

    def shown(scale: float, digits: int, before: str = "", after: str = ""):
        """How a row shows a comparison: its difference (x ``scale``, signed), then its p when tested."""
        return lambda c: f"{before}{signed(scale * c.diff, digits)}{after}" + (
            f", p = {c.p}" if c["p"] is not None else "")

    ratio_diff = shown(1, 2, before="ratio ")
    q = a.params["lm_table"]["question"]
    for s in sorted(a.lm):
        if s != q and "+" not in s and _values(a.lm, s) and _values(b.lm, s) and _values(b.lm, q):
            row(f"LM: `{s}`'s ppl({a.top}L) / ppl(L) against `{q}`'s",
                compare(_values(a.lm, s), _values(a.lm, q), higher_is_better=False),
                compare(_values(b.lm, s), _values(b.lm, q), higher_is_better=False), ratio_diff)
    if all(_values(x.lm, s) for x in (a, b) for s in ("rope", "sinusoidal")):
        row("LM: RoPE's ratio against sinusoidal's (Press et al.: RoPE degrades less)",
            compare(_values(a.lm, "rope"), _values(a.lm, "sinusoidal"), higher_is_better=False),
            compare(_values(b.lm, "rope"), _values(b.lm, "sinusoidal"), higher_is_better=False), ratio_diff)

    ta, tb = ra.retrieval["schemes"], b.retrieval["schemes"]
    ref = ra.retrieval["against"]
    points = shown(100, 0, after=" points")
    for m in (4, a.top):
        for s in sorted(ta):
            ca_cell, cb_cell = ta[s]["lengths"].get(str(m)), (tb.get(s) or {}).get("lengths", {}).get(str(m))
            ref_a, ref_b = ta[ref]["lengths"].get(str(m)), tb.get(ref, {}).get("lengths", {}).get(str(m))
            if s == ref or "+" in s or not (ca_cell and cb_cell and ref_a and ref_b):
                continue
            row(f"retrieval: `{s}`'s exact match at {m}L against `{ref}`'s",
                compare(ca_cell["values"], ref_a["values"]), compare(cb_cell["values"], ref_b["values"]), points)

    M, M2 = a.mlm, b.mlm
    mq = M["question"]
    acc_diff = shown(100, 1, after=" points")
    if mq in M2["summary"]:
        for other in M.get("tests") or {}:
            if other in M2["summary"]:
                row(f"MLM: `{mq}`'s accuracy against `{other}`'s",
                    compare(M["summary"][mq]["acc"], M["summary"][other]["acc"]),
                    compare(M2["summary"][mq]["acc"], M2["summary"][other]["acc"]), acc_diff)
    return rows


def fastest(entries: dict) -> list[str]:
    """The schemes (no ``+rule`` row) with the fewest mean steps to the retrieval criterion over
    their seeds that reached it, one seed or more: several when they tie, in name order."""
    reached = {s: mean(reached_steps(e)) for s, e in entries.items() if "+" not in s and e["reached"]}
    return sorted(s for s, v in reached.items() if v == min(reached.values()))


def exact_range(entries: dict, multiple: int) -> tuple[float, float] | None:
    """(lowest, highest) mean exact match at ``multiple`` x L over the schemes (no ``+rule``
    row) of a retrieval summary; None when none has a value there."""
    means = [e["lengths"][str(multiple)]["mean"] for s, e in entries.items()
             if "+" not in s and str(multiple) in e["lengths"]]
    return (min(means), max(means)) if means else None


def at(lengths: dict, key) -> dict:
    """An entry of a table keyed by length or multiple, which JSON turned into strings."""
    return lengths[str(key)]


def num(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def signed(x: float, digits: int = 2) -> str:
    return f"{x:+.{digits}f}"


def pct(x: float, digits: int = 0) -> str:
    """A share as a percentage, without the sign: 0.2345 -> 23 (digits=0)."""
    return f"{100 * x:.{digits}f}"


def pm(values: Sequence[float], digits: int = 2, scale: float = 1.0) -> str:
    """mean ± sample sd of per-seed values."""
    m, sd = mean_sd([scale * v for v in values])
    return f"{m:.{digits}f} ± {sd:.{digits}f}"


def names(items: Sequence[str], code: bool = True) -> str:
    """"a, b and c", each in backticks."""
    items = [f"`{i}`" if code else str(i) for i in items]
    if not items:
        return "none"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def mean(values: Sequence[float]) -> float:
    return mean_sd(list(values))[0]


FILTERS = {"pct": pct, "num": num}
TESTS = {"depends_on_scale": depends_on_scale, "reached_every_seed": lambda e: len(e["reached"]) == len(e["seeds"]),
         "startswith": lambda s, prefix: str(s).startswith(prefix),
         "search": lambda s, pattern: re.search(pattern, str(s)) is not None}
HELPERS = {"exact_range": exact_range, "flat_schemes": flat_schemes, "scale_taus": scale_taus, "scale_findings": scale_findings, "fastest": fastest,
           "flat_retrieval": flat_retrieval, "tested_at": tested_at, "exact_at": exact_at, "groups_sentence": groups_sentence, "reached_steps": reached_steps, "rank_by_steps": rank_by_steps, "compare": compare, "judged": judged, "verdicts": verdicts, "group": group, "lm_tests": lm_tests,
           "at": at, "num": num, "signed": signed, "pct": pct, "pm": pm, "p": format_p,
           "names": names, "minutes": minutes, "mean": mean, "isnan": math.isnan}


# ------------------------------------------------------------------ rendering
def environment(root: Path):
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(loader=FileSystemLoader(str(root / TEMPLATES)), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                      extensions=["jinja2.ext.do"])
    env.globals.update(HELPERS)
    env.filters.update(FILTERS)
    env.tests.update(TESTS)
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
    context = {"study": study, "profiles": profiles, "profile": {p.name: p for p in profiles}, "stamp": STAMP}

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
        print(f"report --check: {', '.join(rendered)} match the results")
        return 0
    for rel, text in rendered.items():
        if not (root / rel).exists() or (root / rel).read_text() != text:
            write_text(root / rel, text)
        print(root / rel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
