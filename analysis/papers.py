"""The study against the papers, claim by claim (``docs/literature.yaml``): each claim's tests
read from the study's own tables, and the verdict their ids give.

A claim lists tests (see the file's header for the kinds). A comparison is never tested a
second time here: ``lm_ratio`` and ``lm_at`` read the LM table's test (a scheme against the
table's reference, read the other way round when the claim names the reference first) or the
test of a pair params.yaml names (``lm_table.pairs``); ``rule`` reads a context-extension row
against its plain row (paired; on the ratio, or with ``quantity: ppl`` on the perplexity at the
test's ``multiple`` alone); ``exact`` reads the retrieval table's test against its
reference. Each is read at every multiple of L the table holds (``by_multiple``), and the claim
is met at the multiple nearest the paper's own range (the paper's ``multiple``; a test may fix
its own). ``flat`` and ``band`` are conditions on intervals over seeds:

* ``flat``: the ratio's 95% interval (Student's t over seeds) lies within 1 ± the LM margin
  (agrees), or wholly above 1 + the margin (disagrees);
* ``band``: every named scheme's band score has its 95% interval above ``banded`` (or within
  ±``weak``), and so does MiniLM's single value; a scheme whose interval lies wholly on the
  other side disagrees.

A test agrees when its verdict is one the claim expects, disagrees when it is the opposite
decided verdict or an equivalence where a difference was expected, and is undecided otherwise.
A claim (``combine``) *agrees* when all its tests agree and *disagrees* when all disagree; it
*agrees where decided* when some agree and the rest are undecided (and *disagrees where
decided* the other way round); it holds *in part* when some tests agree and some disagree;
it is *undecided* when none decides. A claim the paper did not make (``reading``) or one the
study cannot test (``untested``) stays outside the tally. Where a claim disagrees, its
``controls`` (the same test in a profile) give the reason: a control that agrees with the
paper; else one where the difference is no longer decided (the setting it changes may explain
the disagreement, without showing the paper's finding); else none. The reasons are data
(``reason``); ``analysis.words`` says them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED, compare, family, mean_sd, reversed_test

#: the verdicts a claim's ``expect`` may name
SHORT = {"ahead": AHEAD, "behind": BEHIND, "equivalent": EQUIVALENT}
#: a claim's verdict ids (``analysis.words.CLAIMS`` says them)
AGREES, DISAGREES, IN_PART, UNDECIDED_CLAIM, UNTESTED_CLAIM = "agrees", "disagrees", "in_part", "undecided", "untested"
AGREES_WHERE_DECIDED, DISAGREES_WHERE_DECIDED = "agrees_where_decided", "disagrees_where_decided"
CLAIM_VERDICTS = (AGREES, AGREES_WHERE_DECIDED, IN_PART, DISAGREES_WHERE_DECIDED, DISAGREES, UNDECIDED_CLAIM,
                  UNTESTED_CLAIM)
COMPARISONS = ("lm_ratio", "lm_at", "rule", "exact")


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The t interval of the mean of per-seed values; None for fewer than two."""
    from scipy import stats

    if len(values) < 2:
        return None
    m, sd = mean_sd(values)
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return m - half, m + half


def _either_way(tests_of_a: Mapping | None, tests_of_b: Mapping | None, a: str, b: str) -> dict | None:
    """{k: a's test against b}: a's own tests when they are against b, or b's against a read
    the other way round; None when neither is."""
    if tests_of_a and next(iter(tests_of_a.values()))["against"] == b:
        return dict(tests_of_a)
    if tests_of_b and next(iter(tests_of_b.values()))["against"] == a:
        return {k: reversed_test(t, b) for k, t in tests_of_b.items()}
    return None


def lm_tests(lm: Mapping, pairs: Mapping, a: str, b: str, quantity: str) -> dict | None:
    """{k: test} of a's ``quantity`` ("ratio" or "ppl") against b's at every multiple: the LM
    table's test against its reference, or a named pair's (either way round)."""
    found = _either_way(((lm.get(a) or {}).get("tests") or {}).get(quantity),
                        ((lm.get(b) or {}).get("tests") or {}).get(quantity), a, b)
    if found:
        return found
    for group in pairs.values():
        p, q = group.get(f"{a}:{b}"), group.get(f"{b}:{a}")
        if p and p.get(quantity):
            return dict(p[quantity])
        if q and q.get(quantity):
            return {k: reversed_test(t, b) for k, t in q[quantity].items()}
    return None


def exact_tests(retrieval: Mapping, a: str, b: str) -> dict | None:
    """{k: test} of a's exact match against b's at every multiple (the retrieval table's family
    against its reference, either way round)."""
    schemes = retrieval.get("schemes") or {}

    def of(s):
        return {k: c["vs"] for k, c in ((schemes.get(s) or {}).get("lengths") or {}).items() if "vs" in c} or None

    return _either_way(of(a), of(b), a, b)


def judge(verdict: str, expect: Sequence[str]) -> str:
    """A test's verdict against the verdicts a claim expects."""
    wanted = {SHORT[e] for e in expect}
    if verdict in wanted:
        return AGREES
    if verdict in (AHEAD, BEHIND) or (verdict == EQUIVALENT and EQUIVALENT not in wanted):
        return DISAGREES
    return UNDECIDED_CLAIM if verdict in (UNDECIDED, UNTESTED) else DISAGREES


def flat_condition(values: Sequence[float], margin: float) -> dict:
    """``flat``: the ratio's interval within 1 ± margin, or wholly above 1 + margin."""
    ci = interval(values)
    if ci is None:
        return {"ci": None, "verdict": UNDECIDED_CLAIM}
    verdict = AGREES if 1 - margin <= ci[0] and ci[1] <= 1 + margin else DISAGREES if ci[0] > 1 + margin \
        else UNDECIDED_CLAIM
    return {"ci": list(ci), "mean": mean_sd(values)[0], "verdict": verdict}


def band_condition(test: Mapping, correlations: Mapping, minilm: Mapping, limits: Mapping) -> dict:
    """``band``: each scheme's band score of the term (its interval over seeds) and MiniLM's."""
    above = limits[test["above"]] if "above" in test else None
    within = limits[test["within"]] if "within" in test else None

    def side(lo: float, hi: float) -> str:
        if above is not None:
            return AGREES if lo > above else DISAGREES if hi < above else UNDECIDED_CLAIM
        return AGREES if -within < lo and hi < within else DISAGREES if lo > within or hi < -within \
            else UNDECIDED_CLAIM

    per = {}
    for s in test["schemes"]:
        label = next((k for k in correlations.get("schemes", {}) if k.split()[0] == s), None)
        values = (correlations["schemes"][label]["terms"].get(test["term"]) or {}).get("values") if label else None
        ci = interval(values or [])
        if ci is not None:
            per[s] = {"mean": mean_sd(values)[0], "ci": list(ci), "verdict": side(*ci)}
    mini = next(iter((minilm.get("models") or {}).values()), None)
    if mini is not None:
        v = mini["terms"][test["term"]]["band_score"]
        per["all-MiniLM-L6-v2"] = {"mean": v, "ci": None, "verdict": side(v, v)}
    return {"per": per, "verdict": combine([p["verdict"] for p in per.values()])}


def combine(verdicts: Sequence[str]) -> str:
    """A claim's verdict from its tests' (see the module doc)."""
    agree, disagree = AGREES in verdicts, DISAGREES in verdicts
    if agree and disagree:
        return IN_PART
    if agree:
        return AGREES if all(v == AGREES for v in verdicts) else AGREES_WHERE_DECIDED
    if disagree:
        return DISAGREES if all(v == DISAGREES for v in verdicts) else DISAGREES_WHERE_DECIDED
    return UNDECIDED_CLAIM


def comparison(test: Mapping, study, multiple: int) -> dict:
    """A comparison test of a claim read from the study's tables: ``by_multiple`` {k: test},
    ``at`` (the multiple it is met at), ``comparison`` (the test there) and ``verdict``."""
    kind, a = test["kind"], test["a"]
    at = int(test.get("multiple", multiple))
    quantity = test.get("quantity", "ratio")  # a rule row's test on its ratio, or on its perplexity at kL
    if kind == "rule":
        found = dict(((study.lm.get(a) or {}).get("rule") or {}).get(quantity) or {}) or None
    elif kind == "exact":
        found = exact_tests(study.retrieval, a, test["b"])
    else:
        found = lm_tests(study.lm, study.lm_pairs, a, test["b"], "ratio" if kind == "lm_ratio" else "ppl")
    if (kind == "lm_at" or quantity == "ppl") and found:
        found = {str(at): found[str(at)]} if str(at) in found else None
    c = (found or {}).get(str(at))
    return {"test": test, "at": at, "by_multiple": found or {}, "comparison": c,
            "verdict": judge(c["verdict"], test["expect"]) if c else UNDECIDED_CLAIM}


def _ratio_at(lm: Mapping, s: str, k: int) -> list[float]:
    e = lm.get(s) or {}
    return list(((e.get("ratios") or {}).get(str(k)) or {}).get("values") or [])


def against_papers(literature: Mapping, study, profiles: Mapping) -> list[dict]:
    """Every claim of ``literature`` with its tests, verdict and reason (see the module doc).
    ``study`` is the default study (``pipelines.results.Study``: its ``lm``, ``lm_pairs``,
    ``correlations``, ``minilm``, ``params``; its ``retrieval`` is the one the retrieval claims
    read), ``profiles`` {name: Study} for the controls."""
    margin = study.params["lm_table"]["margin"]
    rows = []
    for claim in literature["claims"]:
        paper = literature["papers"][claim["paper"]]
        multiple = int(paper.get("multiple", 1))
        row = {**claim, "paper_key": claim["paper"], "paper": paper, "multiple": multiple, "results": [],
               "tallied": "reading" not in claim and "untested" not in claim}
        for test in claim.get("tests", []):
            kind = test["kind"]
            if kind in COMPARISONS:
                row["results"].append(comparison(test, study, multiple))
            elif kind == "flat":
                row["results"].append({"test": test, "at": multiple,
                                        **flat_condition(_ratio_at(study.lm, test["a"], multiple), margin)})
            else:
                row["results"].append({"test": test, **band_condition(test, study.correlations, study.minilm,
                                                                      literature["band"])})
        row["verdict"] = UNTESTED_CLAIM if "untested" in row else combine([r["verdict"] for r in row["results"]])
        expect = next((t["expect"] for t in row.get("tests", []) if "expect" in t), ["ahead"])
        row["controls"] = [_control(c, profiles, margin, expect, study, multiple) for c in row.get("controls", [])]
        row["reason"] = reason(row)
        rows.append(row)
    return rows


def _control(control: Mapping, profiles: Mapping, margin: float, expect: Sequence[str], study, multiple: int) -> dict:
    """A control: the claim's test read from the profile that changes one setting, and how that
    setting moves each of the two schemes (``shifts``: each scheme's ratio in the profile against
    its ratio in the default study at the same multiple, a family of two; lm_ratio controls only)."""
    prof = profiles.get(control["study"])
    if prof is None:
        return {**control, "comparison": None, "verdict": UNTESTED_CLAIM, "shifts": {}}
    read = comparison({**control, "expect": expect}, prof, multiple)
    if read["comparison"] is None:
        return {**control, "comparison": None, "verdict": UNTESTED_CLAIM, "shifts": {}}
    shifts = {}
    if control["kind"] == "lm_ratio":
        moved = {s: compare(_ratio_at(prof.lm, s, multiple), _ratio_at(study.lm, s, multiple), "log", margin)
                 | {"against": s} for s in (control["a"], control["b"])
                 if _ratio_at(prof.lm, s, multiple) and _ratio_at(study.lm, s, multiple)}
        shifts = family(moved, higher_is_better=False)
    return {**control, "at": read["at"], "comparison": read["comparison"], "by_multiple": read["by_multiple"],
            "verdict": read["verdict"], "shifts": shifts}


def reason(row: Mapping) -> dict | None:
    """Why a claim does not simply agree, as data (``analysis.words.reason`` says it): the
    schemes it does not hold against (``against``) and those left undecided (``undecided``),
    and where a test disagrees what the controls say (``control``: ``agrees`` with the
    control's label, ``undecided`` with the schemes whose ratio the setting moves and those it
    does not, or ``none`` with the label of a control that disagrees too, if any ran, and whether
    its difference lies within the table's margin: ``within_margin``)."""
    if row["verdict"] in (AGREES, UNDECIDED_CLAIM, UNTESTED_CLAIM):
        return None

    def named(verdict):
        return [r["test"].get("b") or (r.get("comparison") or {}).get("against") or r["test"].get("a")
                for r in row["results"] if r["verdict"] == verdict]

    out = {"against": named(DISAGREES), "undecided": named(UNDECIDED_CLAIM), "control": None}
    if out["against"]:
        out["control"] = _why(row["controls"])
    return out


def _why(controls: Sequence[Mapping]) -> dict:
    """What the controls say of a disagreement (see ``reason``)."""
    for c in controls:
        if c["verdict"] == AGREES:
            return {"kind": "agrees", "label": c["label"]}
    for c in controls:
        if c["verdict"] == UNDECIDED_CLAIM:
            moved = [s for s, t in c["shifts"].items() if t["verdict"] in (AHEAD, BEHIND)]
            return {"kind": "undecided", "label": c["label"], "moved": moved,
                    "unmoved": [s for s in c["shifts"] if s not in moved]}
    ran = [c for c in controls if c["verdict"] != UNTESTED_CLAIM]
    within = bool(ran) and bool((ran[0].get("comparison") or {}).get("within_margin"))
    return {"kind": "none", "label": ran[0]["label"] if ran else None, "within_margin": within}


def tally(rows: Sequence[Mapping]) -> dict:
    """How many of the tallied claims (``tallied``: made by the paper and testable) earn each
    verdict, in ``CLAIM_VERDICTS`` order, and how many claims stay outside the tally."""
    counted = [r for r in rows if r["tallied"]]
    counts = {v: sum(r["verdict"] == v for r in counted) for v in CLAIM_VERDICTS}
    return {"claims": len(counted), "papers": len({r["paper_key"] for r in counted}),
            "counts": {v: n for v, n in counts.items() if n}, "outside": len(rows) - len(counted)}
