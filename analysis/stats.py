"""The statistics behind every comparison the study words: a test of two schemes' seeds,
families of such tests corrected together, and the word each comparison earns.

**The unit** is the training run: one value per seed (a perplexity ratio, an accuracy,
an exact match over the grid's trials). For retrieval that value is the share of the
same trials a run gets right, so the spread of the runs' values between seeds holds the
trials' binomial noise as well as the training seed's: a test over runs accounts for
both levels (the summary-statistics approach to a two-level design, exact when every run
is scored on the same trials, as here; Holmes & Friston 1998). The trials' own interval
(Wilson) is shown beside it, never used to decide.

**One comparison** (``compare``) of scheme a's seeds against scheme b's:

* the scale: a quantity that multiplies (a perplexity ratio, steps) is compared as the
  difference of the logarithms (``scale="log"``), so the effect is a factor (a's
  geometric mean over b's) and its interval a factor's, positive by construction; a
  share (accuracy, exact match) as the difference in points (``scale="points"``), its
  interval clipped to the possible range [-1, 1] (clipping to the parameter space keeps
  an interval's coverage);
* Welch's t-test of the means on that scale (``scipy.stats.ttest_ind(equal_var=False)``),
  its two-sided p and 95% interval;
* an equivalence test when the family has a margin m (two one-sided tests,
  ``statsmodels.stats.weightstats.ttost_ind(usevar="unequal")``): the difference lies
  within ±m points, or the factor within [1/(1+m), 1+m];
* fewer than two seeds on a side, or no spread on either side, gives no test.

**A family** (``family``) is the comparisons one table states, each against a reference
fixed in ``params.yaml`` before the data: their p-values are adjusted together with
Holm's step-down method (``statsmodels.stats.multitest.multipletests``), and so are the
equivalence tests' (an equivalence is a claim too). Each comparison then earns a word:

* ``AHEAD`` / ``BEHIND``: the difference is decided (Holm-adjusted p < 5%);
* ``EQUIVALENT``: not decided, and equivalent within the margin (adjusted p < 5%);
* ``UNDECIDED``: neither. Its ``detectable`` says what the test could have found: the
  smallest difference it detects with 80% power at Holm's strictest level (5% over the
  family's size), with its seeds and observed variances (the power of Welch's test from
  the noncentral t), and ``seeds_needed`` how many seeds a side would decide the observed
  difference, were it real;
* ``UNTESTED``: one seed on a side, or no spread on either: no test.

A decided difference can also lie within the margin (``within_margin``): the sentence
then says both. Ranks ("the fastest", "the best") are places with a bootstrap interval
over seeds (``rank_intervals``), never a reference. Checked against hand-worked cases
and SciPy's own tests in ``tests/test_stats.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

#: the two-sided level of every test, after correction
ALPHA = 0.05
#: the power at which ``detectable`` and ``seeds_needed`` are stated
POWER = 0.8
#: bootstrap draws of ``rank_intervals`` and the generator's seed (the report is reproducible)
RESAMPLES = 2000
SEED = 0

AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED = (
    "ahead of", "behind", "equivalent to", "undecided against", "untested against")
WORDS = (AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED)
SCALES = ("points", "log")


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), (float(v.std(ddof=1)) if len(v) > 1 else 0.0)


def _scaled(values: Sequence[float], scale: str) -> np.ndarray:
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r}: one of {', '.join(SCALES)}")
    v = np.asarray(values, dtype=float)
    if scale == "log":
        if (v <= 0).any():
            raise ValueError(f"a log-scale comparison needs positive values, got {list(v)}")
        return np.log(v)
    return v


def _shown(x: float, scale: str) -> float:
    """A difference on the test's scale as it is shown: a factor for the log scale."""
    return float(math.exp(x)) if scale == "log" else float(x)


def _bound(margin: float | None, scale: str) -> float | None:
    """The margin on the test's scale: ±m points, or ±log(1 + m) for a factor."""
    if margin is None:
        return None
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    return math.log1p(margin) if scale == "log" else float(margin)


def welch_power(delta: float, var: Sequence[float], n: Sequence[int], alpha: float) -> float:
    """The power of Welch's two-sided t-test at level ``alpha`` to detect a true difference
    ``delta`` between two groups of ``n`` seeds with variances ``var``: the noncentral t
    (``scipy.stats.nct``) with the Welch-Satterthwaite degrees of freedom of those
    variances and noncentrality delta / se, the approximation statsmodels and G*Power use."""
    from scipy import stats

    (va, vb), (na, nb) = var, n
    se2 = va / na + vb / nb
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    crit, nc = stats.t.ppf(1 - alpha / 2, df), abs(delta) / math.sqrt(se2)
    power = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    return power if math.isfinite(power) else 1.0  # nct fails far in its tail, where the power is 1


def compare(a: Sequence[float], b: Sequence[float], scale: str = "points", margin: float | None = None,
            level: float = 0.95) -> dict:
    """One comparison of a's seeds against b's (see the module doc): ``diff`` (a − b in
    points, or a's geometric mean over b's for ``scale="log"``), ``ci``, Welch's ``t``,
    ``df`` and ``p``, ``p_equiv`` (None without a margin), ``var`` (the sample variances on
    the test's scale), ``n`` (seeds a side); ``note`` says why there is no test."""
    from scipy import stats
    from statsmodels.stats.weightstats import ttost_ind

    x, y = _scaled(a, scale), _scaled(b, scale)
    if not len(x) or not len(y):
        raise ValueError("a comparison needs at least one seed on each side")
    d = float(x.mean() - y.mean())
    out = {"diff": _shown(d, scale), "scale": scale, "margin": margin, "n": [len(x), len(y)],
           "ci": None, "t": None, "df": None, "p": None, "p_equiv": None, "var": None}
    if len(x) < 2 or len(y) < 2:
        return out | {"note": "one seed on a side: no test"}
    out["var"] = [float(x.var(ddof=1)), float(y.var(ddof=1))]
    if x.std() == 0 and y.std() == 0:
        return out | {"note": "no spread between seeds on either side: no test"}
    res = stats.ttest_ind(x, y, equal_var=False)
    lo, hi = (float(v) for v in res.confidence_interval(level))
    if scale == "points":
        lo, hi = max(lo, -1.0), min(hi, 1.0)
    out.update(ci=[_shown(lo, scale), _shown(hi, scale)], t=float(res.statistic), df=float(res.df),
               p=float(res.pvalue))
    bound = _bound(margin, scale)
    if bound is not None:
        out["p_equiv"] = float(ttost_ind(x, y, -bound, bound, usevar="unequal")[0])
    return out


def detectable(test: Mapping, alpha: float, power: float = POWER) -> float | None:
    """The smallest true difference (points, or a factor above 1) the test detects with
    ``power`` at level ``alpha``, with its seeds and their observed variances
    (``welch_power``); None without a test."""
    from scipy.optimize import brentq

    if test.get("p") is None:
        return None
    var, n = test["var"], test["n"]
    hi = math.sqrt(var[0] / n[0] + var[1] / n[1])  # one standard error, doubled until the power is reached
    while welch_power(hi, var, n, alpha) < power:
        hi *= 2
    return _shown(brentq(lambda d: welch_power(d, var, n, alpha) - power, 0.0, hi, xtol=1e-6), test["scale"])


def seeds_needed(test: Mapping, alpha: float, power: float = POWER, most: int = 200) -> int | None:
    """Seeds a side with which the test would detect its observed difference (were it real)
    with ``power`` at level ``alpha``, given the variances it observed (``welch_power``);
    None without a test or a difference, ``most`` + 1 when more than ``most`` would be needed."""
    if test.get("p") is None:
        return None
    d = abs(math.log(test["diff"]) if test["scale"] == "log" else test["diff"])
    if d == 0:
        return None
    return next((k for k in range(2, most + 1) if welch_power(d, test["var"], (k, k), alpha) >= power), most + 1)


def holm(ps: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of the p-values tested together (``statsmodels``);
    None (no test) stays None and does not count among them."""
    from statsmodels.stats.multitest import multipletests

    tested = [k for k, p in ps.items() if p is not None]
    out: dict[str, float | None] = {k: None for k in ps}
    if tested:
        adjusted = multipletests([ps[k] for k in tested], method="holm")[1]
        out.update({k: float(p) for k, p in zip(tested, adjusted)})
    return out


def word(test: Mapping, higher_is_better: bool = True, alpha: float = ALPHA) -> str:
    """The word a comparison of a family earns from its adjusted tests (see the module doc)."""
    p = test.get("p_adj", test.get("p"))
    if p is None:
        return UNTESTED
    if p < alpha:
        return AHEAD if (test["diff"] > (1.0 if test["scale"] == "log" else 0.0)) == higher_is_better else BEHIND
    pe = test.get("p_equiv_adj", test.get("p_equiv"))
    return EQUIVALENT if pe is not None and pe < alpha else UNDECIDED


def family(tests: Mapping[str, dict], higher_is_better: bool = True, alpha: float = ALPHA) -> dict[str, dict]:
    """The comparisons of one table, corrected together: each test (``compare``) gains
    ``p_adj`` and ``p_equiv_adj`` (Holm), ``m`` (the tests in the family), ``word``,
    ``within_margin``, ``detectable`` and ``seeds_needed`` (at Holm's strictest level,
    ``alpha`` / m), and ``higher_is_better`` (``higher_is_better`` unless the test carries its
    own, as a family of mixed quantities does)."""
    adjusted = holm({k: t["p"] for k, t in tests.items()})
    adjusted_equiv = holm({k: t.get("p_equiv") for k, t in tests.items()})
    m = sum(p is not None for p in adjusted.values())
    strictest = alpha / max(m, 1)
    out = {}
    for k, t in tests.items():
        hib = t.get("higher_is_better", higher_is_better)  # a test may carry its own direction
        t = {**t, "p_adj": adjusted[k], "p_equiv_adj": adjusted_equiv[k], "m": m, "higher_is_better": hib}
        t["word"] = word(t, hib, alpha)
        t["within_margin"] = t["p_equiv_adj"] is not None and t["p_equiv_adj"] < alpha
        t["detectable"] = detectable(t, strictest)
        t["seeds_needed"] = seeds_needed(t, strictest) if t["word"] == UNDECIDED else None
        out[k] = t
    return out


def against(samples: Mapping[str, Sequence[float]], reference: str, scale: str = "points",
            margin: float | None = None, higher_is_better: bool = True, alpha: float = ALPHA) -> dict[str, dict]:
    """Every scheme of ``samples`` ({scheme: per-seed values}) against ``reference``, as one
    family (``family``); {} when the reference has no values."""
    if reference not in samples or not len(samples[reference]):
        return {}
    tests = {s: compare(v, samples[reference], scale, margin) | {"against": reference}
             for s, v in samples.items() if s != reference and len(v)}
    return family(tests, higher_is_better, alpha)


def tally(tests: Mapping[str, Mapping]) -> dict:
    """What a family decided: {word: [schemes]} in the order given, the family's size and
    seeds a side, and, for the undecided, the seeds each would need (``seeds_needed``)."""
    words: dict[str, list[str]] = {w: [] for w in WORDS}
    for s, t in tests.items():
        words[t["word"]].append(s)
    seeds = sorted({n for t in tests.values() for n in t["n"]})
    return {"words": words, "m": next((t["m"] for t in tests.values()), 0), "seeds": seeds,
            "needed": {s: tests[s]["seeds_needed"] for s in words[UNDECIDED]}}


# ------------------------------------------------------------------ ranks
def places(means: Mapping[str, float], higher_is_better: bool) -> dict[str, int]:
    """{scheme: its place, 1 for the best}; ties share the better place (competition ranking)."""
    sign = -1 if higher_is_better else 1
    ordered = sorted(means.values(), key=lambda v: sign * v)
    return {s: 1 + ordered.index(v) for s, v in means.items()}


def resample_means(samples: Mapping[str, Sequence[float]], schemes: Sequence[str],
                   rng: np.random.Generator) -> dict[str, float]:
    """One bootstrap draw: each scheme's seeds redrawn with replacement, then averaged."""
    out = {}
    for s in schemes:
        v = np.asarray(samples[s], dtype=float)
        out[s] = float(v[rng.integers(0, len(v), len(v))].mean())
    return out


def rank_intervals(samples: Mapping[str, Sequence[float]], higher_is_better: bool = True,
                   resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, dict]:
    """Each scheme's place by its mean (1 = the best) and its 95% bootstrap interval, from
    ``resamples`` draws that redraw every scheme's seeds (a scheme of one seed keeps its
    value): {scheme: {"place", "lo", "hi", "mean"}}, best first. "The fastest" is then a
    place whose interval may overlap others', not a reference."""
    names = [s for s, v in samples.items() if len(v)]
    means = {s: float(np.mean(samples[s])) for s in names}
    observed = places(means, higher_is_better)
    rng = np.random.default_rng(seed)
    draws = [places(resample_means(samples, names, rng), higher_is_better) for _ in range(resamples)]
    out = {}
    for s in sorted(names, key=lambda s: (observed[s], s)):
        lo, hi = np.percentile([d[s] for d in draws], [2.5, 97.5])
        out[s] = {"place": observed[s], "lo": int(math.floor(lo)), "hi": int(math.ceil(hi)), "mean": means[s]}
    return out


def format_p(p: float | None) -> str:
    """A p-value as the tables print it: three decimals, or two significant digits below 0.001."""
    return "—" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


# ------------------------------------------------------------------ how a comparison is printed
def shown_margin(test: Mapping) -> str:
    """The margin as a reader reads it: "±5%" for a factor, "±2.0 pt" for points."""
    m = test.get("margin")
    if m is None:
        return ""
    return f"±{100 * m:g}%" if test["scale"] == "log" else f"±{100 * m:.1f} pt"


def shown_diff(test: Mapping, value: float | None = None) -> str:
    """A difference (the test's own by default) as the tables print it: a factor ×1.23, or
    signed points +12.3 pt."""
    v = test["diff"] if value is None else value
    return f"×{v:.3f}" if test["scale"] == "log" else f"{100 * v:+.1f} pt"


def shown_detectable(test: Mapping, short: bool = False) -> str:
    """What an undecided test could have detected, as a clause: "it detects only a factor
    beyond ×1.700", "it detects only a gap above 29 pt", or "no gap within the possible range is
    detectable" (a detectable gap of 100 points or more); ``short`` for a table cell ("detects
    ×1.70", "detects 29 pt", "detects no gap in range")."""
    d = test.get("detectable")
    if d is None:
        return "no test" if short else "there is no test"
    if test["scale"] != "log" and d >= 1:
        return "detects no gap in range" if short else "no gap within the possible range is detectable"
    if test["scale"] == "log":
        amount = f"×{d:.2f}" if short else f"a factor beyond ×{d:.3f}"
    else:
        amount = f"{100 * d:.0f} pt" if short else f"a gap above {100 * d:.0f} pt"
    return f"detects {amount}" if short else f"it detects only {amount}"


def verdict_cell(test: Mapping | None) -> str:
    """A comparison's verdict in a table cell: "behind", "behind, within ±5%", "equivalent
    (±5%)", "undecided (detects ×1.70)" (the smallest factor or gap its test detects, see
    ``shown_detectable``), or "—" without a test."""
    if not test or test["word"] == UNTESTED:
        return "—"
    short = {AHEAD: "ahead", BEHIND: "behind", EQUIVALENT: "equivalent", UNDECIDED: "undecided"}[test["word"]]
    if test["word"] in (AHEAD, BEHIND):
        return short + (f", within {shown_margin(test)}" if test["within_margin"] else "")
    if test["word"] == EQUIVALENT:
        return f"{short} ({shown_margin(test)})"
    return f"{short} ({shown_detectable(test, short=True)})"


def comparison_cells(test: Mapping | None) -> list[str]:
    """The cells a table gives a comparison: the difference with its 95% interval, the raw
    and the Holm-adjusted p, and the verdict (dashes without a test)."""
    if not test:
        return ["—", "—", "—", "—"]
    ci = test.get("ci")
    if ci is None:
        diff = shown_diff(test)
    elif test["scale"] == "log":
        diff = f"{shown_diff(test)} ({ci[0]:.3f}, {ci[1]:.3f})"
    else:
        diff = f"{shown_diff(test)} ({100 * ci[0]:+.1f}, {100 * ci[1]:+.1f})"
    return [diff, format_p(test.get("p")), format_p(test.get("p_adj")), verdict_cell(test)]
