"""The study against the papers, claim by claim (``docs/literature.yaml``): each claim's
comparisons run on the study's results, corrected together as one family, and the verdict
their words give.

A claim lists tests (see the file's header for the kinds). The comparisons (``lm_ratio``,
``lm_at``, ``exact``) of one paper's claims form a family (``analysis.stats.family``, Holm);
``rule`` reads the LM table's own family of context-extension rows; ``flat`` and ``band``
are conditions on intervals over seeds:

* ``flat``: the ratio's 95% interval (Student's t over seeds) lies within 1 ± the LM margin
  (agrees), or wholly above 1 + the margin (disagrees);
* ``band``: every named scheme's band score has its 95% interval above ``banded`` (or within
  ±``weak``), and so does MiniLM's single value; a scheme whose interval lies wholly on the
  other side disagrees.

A test agrees when its word is one the claim expects, disagrees when it is the opposite
decided word or an equivalence where a difference was expected, and is undecided otherwise.
A claim agrees when all its tests agree, disagrees when all that decide disagree, holds
"in part" when some agree and some disagree, and is undecided when none decides. Where a
claim disagrees, its ``controls`` (the same test in a profile) give the reason: a control
that agrees with the paper; else one where the difference is no longer decided (the setting
it changes may explain the disagreement, without showing the paper's finding); else
"unexplained".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED, compare, family, mean_sd

#: the words a claim's ``expect`` may name
SHORT = {"ahead": AHEAD, "behind": BEHIND, "equivalent": EQUIVALENT}
AGREES, DISAGREES, IN_PART, UNDECIDED_CLAIM, UNTESTED_CLAIM = "agrees", "disagrees", "in part", "undecided", "untested"


def interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """The t interval of the mean of per-seed values; None for fewer than two."""
    from scipy import stats

    if len(values) < 2:
        return None
    m, sd = mean_sd(values)
    half = stats.t.ppf(0.5 + level / 2, len(values) - 1) * sd / math.sqrt(len(values))
    return m - half, m + half


def _ratio(lm: Mapping, s: str) -> list[float]:
    return list((lm.get(s) or {}).get("ratio_longest", {}).get("values") or [])


def _ppl_at(lm: Mapping, s: str, multiple: int) -> list[float]:
    e = lm.get(s) or {}
    cell = e.get("lengths", {}).get(str(multiple * e.get("train_len", 0))) or {}
    return list(cell.get("values") or [])


def _exact(retrieval: Mapping, s: str, multiple: int) -> list[float]:
    cell = ((retrieval.get("schemes") or {}).get(s) or {}).get("lengths", {}).get(str(multiple)) or {}
    return list(cell.get("values") or [])


def comparison(test: Mapping, lm: Mapping, retrieval: Mapping, top: int, margins: Mapping) -> dict | None:
    """The comparison a test of kind lm_ratio, lm_at or exact asks for (``analysis.stats.compare``),
    or None when a side has no values."""
    a, b = test["a"], test["b"]
    if test["kind"] == "lm_ratio":
        x, y, scale, margin = _ratio(lm, a), _ratio(lm, b), "log", margins["lm"]
    elif test["kind"] == "lm_at":
        x, y, scale, margin = _ppl_at(lm, a, test["multiple"]), _ppl_at(lm, b, test["multiple"]), "log", margins["lm"]
    else:
        x, y, scale, margin = _exact(retrieval, a, top), _exact(retrieval, b, top), "points", margins["retrieval"]
    if not x or not y:
        return None
    return compare(x, y, scale, margin) | {"a": a, "b": b, "against": b, "higher_is_better": scale == "points"}


def judge(word: str, expect: Sequence[str]) -> str:
    """A test's word against the words a claim expects."""
    wanted = {SHORT[e] for e in expect}
    if word in wanted:
        return AGREES
    if word in (AHEAD, BEHIND) or (word == EQUIVALENT and EQUIVALENT not in wanted):
        return DISAGREES
    return UNDECIDED_CLAIM if word in (UNDECIDED, UNTESTED) else DISAGREES


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
    decided = [v for v in verdicts if v in (AGREES, DISAGREES)]
    if not decided:
        return UNDECIDED_CLAIM
    if all(v == AGREES for v in verdicts):
        return AGREES
    if all(v == DISAGREES for v in decided):
        return DISAGREES if len(decided) == len(verdicts) else IN_PART
    return IN_PART


def against_papers(literature: Mapping, study, profiles: Mapping) -> list[dict]:
    """Every claim of ``literature`` with its tests, verdict and reason (see the module doc).
    ``study`` is the default study (``pipelines.results.Study``: its ``lm``, ``correlations``,
    ``minilm``, ``params``, ``top``), ``profiles`` {name: Study}; the retrieval tests read the
    ``retrieval-seeds`` profile when it has results."""
    lm, top = study.lm, study.top
    retrieval = (profiles.get("retrieval-seeds") or study).retrieval
    margins = {"lm": study.params["lm_table"]["margin"], "retrieval": study.params["retrieval_table"]["margin"]}
    rows, pending = [], {}
    for claim in literature["claims"]:
        row = {**claim, "paper_key": claim["paper"], "paper": literature["papers"][claim["paper"]], "results": []}
        for i, test in enumerate(claim.get("tests", [])):
            kind = test["kind"]
            if kind in ("lm_ratio", "lm_at", "exact"):
                c = comparison(test, lm, retrieval, top, margins)
                if c is not None:
                    pending[(f"{claim['paper']}/{claim['key']}", i)] = c
                row["results"].append({"test": test, "comparison": c})
            elif kind == "rule":
                t = (lm.get(test["a"]) or {}).get("vs_plain")
                row["results"].append({"test": test, "comparison": t,
                                       "verdict": judge(t["word"], test["expect"]) if t else UNDECIDED_CLAIM})
            elif kind == "flat":
                row["results"].append({"test": test, **flat_condition(_ratio(lm, test["a"]), margins["lm"])})
            else:
                row["results"].append({"test": test, **band_condition(test, study.correlations, study.minilm,
                                                                      literature["band"])})
        rows.append(row)
    judged = {}
    for paper in {key[0].split("/")[0] for key in pending}:  # a family per paper: its claims, Holm together
        judged.update(family({k: c for k, c in pending.items() if k[0].split("/")[0] == paper}))
    for row in rows:
        for i, r in enumerate(row["results"]):
            key = (f"{row['paper_key']}/{row['key']}", i)
            if key in judged:
                c = judged[key]
                r["comparison"], r["verdict"] = c, judge(c["word"], r["test"]["expect"])
            elif "verdict" not in r:
                r["verdict"] = UNDECIDED_CLAIM
        row["verdict"] = UNTESTED_CLAIM if "untested" in row else combine([r["verdict"] for r in row["results"]])
        expect = next((t["expect"] for t in row.get("tests", []) if "expect" in t), ["ahead"])
        row["controls"] = [_control(c, profiles, margins, expect, study) for c in row.get("controls", [])]
        row["reason"] = _reason(row)
    return rows


def _control(control: Mapping, profiles: Mapping, margins: Mapping, expect: Sequence[str], study) -> dict:
    """A control: the claim's test in the profile that changes one setting, and how that setting
    moves each of the two schemes (``shifts``: each scheme's ratio in the profile against its
    ratio in the default study, a family of two; lm_ratio controls only)."""
    prof = profiles.get(control["study"])
    if prof is None:
        return {**control, "comparison": None, "verdict": UNTESTED_CLAIM, "shifts": {}}
    c = comparison(control, prof.lm, prof.retrieval if control["kind"] == "exact" else {}, prof.top, margins)
    if c is None:
        return {**control, "comparison": None, "verdict": UNTESTED_CLAIM, "shifts": {}}
    c = family({"c": c})["c"]
    shifts = {}
    if control["kind"] == "lm_ratio":
        moved = {s: compare(_ratio(prof.lm, s), _ratio(study.lm, s), "log", margins["lm"]) | {"against": s}
                 for s in (control["a"], control["b"]) if _ratio(prof.lm, s) and _ratio(study.lm, s)}
        shifts = family(moved, higher_is_better=False)
    return {**control, "comparison": c, "verdict": judge(c["word"], expect), "shifts": shifts}


def _reason(row: Mapping) -> str | None:
    """Why a claim does not simply agree: for one that holds in part, the schemes it does not
    hold against and those left undecided; where it disagrees, a control that agrees with the
    paper, else one that leaves the difference undecided (the setting it changes may explain it),
    else "unexplained"."""
    if row["verdict"] not in (DISAGREES, IN_PART):
        return None
    parts = []
    if row["verdict"] == IN_PART:
        for verdict, words in ((DISAGREES, "it does not hold against"), (UNDECIDED_CLAIM, "undecided against")):
            names = [r["test"].get("b") or r["test"].get("a") for r in row["results"] if r["verdict"] == verdict]
            if names:
                parts.append(f"{words} {', '.join(f'`{s}`' for s in names)}")
    if row["verdict"] == DISAGREES or any(r["verdict"] == DISAGREES for r in row["results"]):
        parts.append(_why(row["controls"]))
    return "; ".join(parts)


def _why(controls: Sequence[Mapping]) -> str:
    """What the controls say of a disagreement (see ``_reason``)."""
    for c in controls:
        if c["verdict"] == AGREES:
            return f"the control agrees with the paper: {c['label']}"
    for c in controls:
        if c["verdict"] == UNDECIDED_CLAIM:
            moved = [s for s, t in c["shifts"].items() if t["word"] in (AHEAD, BEHIND)]
            which = (f"; the setting moves {', '.join(f'`{s}`' for s in moved)}'s ratio (decided), "
                     f"{'and not' if len(moved) < len(c['shifts']) else 'and'} "
                     f"{', '.join(f'`{s}`' for s in c['shifts'] if s not in moved) or 'the other'}'s") if moved else ""
            return (f"possibly the setting the control changes: {c['label']}, the difference is no longer "
                    f"decided, though the control does not show the paper's finding either{which}")
    ran = [c for c in controls if c["verdict"] != UNTESTED_CLAIM]
    return "unexplained" + (f" (the control {ran[0]['label']} disagrees too)" if ran else "")
