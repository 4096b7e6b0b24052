"""The statistics behind every comparison the study states: a test of two schemes' seeds,
families of such tests corrected together, the verdict each comparison earns, and what a
test could have detected.

**The unit** is the training run: one value per seed (a perplexity ratio, an accuracy,
an exact match over the grid's trials). For retrieval that value is the share of the
same trials a run gets right, so the spread of the runs' values between seeds holds the
trials' binomial noise as well as the training seed's: a test over runs accounts for
both levels (the summary-statistics approach to a two-level design, exact when every run
is scored on the same trials, as here; Holmes & Friston 1998). The trials' own interval
(Wilson) is shown beside it, never used to decide.

**One comparison** (``compare``) of scheme a's seeds against scheme b's:

* the scale: a quantity that multiplies (a perplexity, a ratio of perplexities, steps) is
  compared as the difference of the logarithms (``scale="log"``), so the effect is a factor
  (a's geometric mean over b's) and its interval a factor's, positive by construction; a
  share (accuracy, exact match) as the difference in points (``scale="points"``), its
  interval clipped to the possible range [-1, 1] (clipping to the parameter space keeps
  an interval's coverage);
* the test fits the design: Welch's t-test of the means (``scipy.stats.ttest_ind(equal_var=
  False)``) for two sets of runs, and the paired t-test (``scipy.stats.ttest_rel``) when
  both sides are the same checkpoints, seed by seed (``paired=True``: a context-extension
  rule switched on, or a run fine-tuned from the seed's own run); its two-sided p and 95%
  interval;
* an equivalence test when the family has a margin m (two one-sided tests, statsmodels'
  ``ttost_ind(usevar="unequal")`` or ``ttost_paired``): the difference lies within ±m
  points, or the factor within [1/(1+m), 1+m];
* fewer than two seeds on a side, or no spread, gives no test.

**A family** (``family``) is the comparisons one table states at one length: their
p-values are adjusted together with Holm's step-down method
(``statsmodels.stats.multitest.multipletests``), and so are the equivalence tests' (an
equivalence is a claim too). Each comparison then earns a verdict, stored as an id (the
report's words for them are ``analysis.words``):

* ``ahead`` / ``behind``: the difference is decided (Holm-adjusted p < 5%);
* ``equivalent``: not decided, and equivalent within the margin (adjusted p < 5%);
* ``undecided``: neither. Its ``detectable`` says what the test could have found: the
  smallest difference it detects with 80% power at Holm's strictest level (5% over the
  family's size), with its seeds and observed variances, and ``seeds_needed`` how many
  seeds a side would decide the observed difference, were it real;
* ``untested``: one seed on a side, or no spread: no test.

**Power** (``power_function``): for the paired test it is exact, the noncentral t of the one-sample
test on the differences. For Welch's test the noncentral t with the Welch-Satterthwaite
degrees of freedom (statsmodels', G*Power's) treats those degrees of freedom as known,
where they are random: against a simulation of Welch's test it overstates the power at
80% by 28 points at 3 seeds a side, 3.5 at 6 and 1.4 at 10 (equal variances, the level of
a family of 15), and by at most 0.9 from 12 a side up (measured at 12, 15, 20 and 30).
So with fewer than ``SIMULATE_BELOW`` seeds on a side the power is simulated
(``simulated_power``): Welch's test on ``DRAWS`` seeded draws with the observed variances
(±0.6 points of power at 80%, 95% of the time), the same draws for every difference, so
``detectable`` is the root of a fixed function; from 12 a side, the noncentral t (within the
tolerance ``TOLERANCE``). scipy's noncentral t returns NaN far in its tail, where its true
value is about 0: a tail that is not finite counts as 0, never 1.

A decided difference can also lie within the margin (``within_margin``): the sentence
then says both. Ranks ("the fastest", "the best") are places with a bootstrap interval
over seeds (``rank_intervals``), never a reference. Checked against hand-worked cases,
SciPy's and statsmodels' own functions and simulations in ``tests/test_stats.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

#: the two-sided level of every test, after correction
ALPHA = 0.05
#: the power at which ``detectable`` and ``seeds_needed`` are stated
POWER = 0.8
#: bootstrap draws of ``rank_intervals`` and the generator's seed (the results are reproducible)
RESAMPLES = 2000
SEED = 0
#: Welch's power is simulated with fewer seeds than this on a side (see the module doc)
SIMULATE_BELOW = 12
#: simulated draws of Welch's test: ±0.6 points of power at 80% (1.96 sqrt(0.8 * 0.2 / DRAWS))
DRAWS = 20_000
#: how far (in power) the noncentral t may be from a simulation where it is used
TOLERANCE = 0.01

#: the verdict ids a comparison earns (``analysis.words`` says them)
AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED = "ahead", "behind", "equivalent", "undecided", "untested"
VERDICTS = (AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED)
DECIDED = (AHEAD, BEHIND)
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


def _on_scale(x: float, scale: str) -> float:
    """A shown difference back on the test's scale (``_shown``'s inverse)."""
    return math.log(x) if scale == "log" else float(x)


def _bound(margin: float | None, scale: str) -> float | None:
    """The margin on the test's scale: ±m points, or ±log(1 + m) for a factor."""
    if margin is None:
        return None
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    return math.log1p(margin) if scale == "log" else float(margin)


# ------------------------------------------------------------------ power
def _finite(x: float) -> float:
    """A tail probability of scipy's noncentral t: NaN or inf far in the tail counts as 0."""
    return float(x) if math.isfinite(x) else 0.0


def nct_power(delta: float, se: float, df: float, alpha: float) -> float:
    """The noncentral-t power of a two-sided t-test at level ``alpha``: a true difference
    ``delta`` over a standard error ``se`` with ``df`` degrees of freedom (``scipy.stats.nct``),
    each tail that scipy cannot evaluate counted as 0."""
    from scipy import stats

    crit, nc = stats.t.ppf(1 - alpha / 2, df), abs(delta) / se
    return _finite(stats.nct.sf(crit, df, nc)) + _finite(stats.nct.cdf(-crit, df, nc))


@functools.lru_cache(maxsize=64)
def _draws(na: int, nb: int) -> tuple[np.ndarray, ...]:
    """Standard normal draws of two groups of ``na`` and ``nb`` seeds (``DRAWS`` of each), as
    their means and sample variances; seeded by the group sizes, so every call agrees."""
    rng = np.random.default_rng([SEED, na, nb])
    za, zb = rng.standard_normal((DRAWS, na)), rng.standard_normal((DRAWS, nb))
    return za.mean(1), za.var(1, ddof=1), zb.mean(1), zb.var(1, ddof=1)


def _rejections(var: Sequence[float], n: Sequence[int], alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Welch's test on the simulated draws with variances ``var``: per draw the shift e and the
    bound c such that a true difference delta is rejected when |delta + e| > c (Welch's t
    with the draw's own degrees of freedom)."""
    from scipy import stats

    (va, vb), (na, nb) = var, n
    ma, sa, mb, sb = _draws(int(na), int(nb))
    qa, qb = va * sa / na, vb * sb / nb  # each side's squared standard error, per draw
    se2 = qa + qb
    df = se2**2 / (qa**2 / (na - 1) + qb**2 / (nb - 1))
    return math.sqrt(va) * ma - math.sqrt(vb) * mb, stats.t.ppf(1 - alpha / 2, df) * np.sqrt(se2)


def simulated_power(delta: float, var: Sequence[float], n: Sequence[int], alpha: float) -> float:
    """The power of Welch's two-sided test at level ``alpha`` to detect a true difference
    ``delta`` between two normal groups of ``n`` seeds with variances ``var``: the share of
    ``DRAWS`` seeded simulated experiments it rejects."""
    e, c = _rejections(var, n, alpha)
    return float(np.mean(np.abs(delta + e) > c))


def welch_power(delta: float, var: Sequence[float], n: Sequence[int], alpha: float) -> float:
    """The power of Welch's two-sided t-test at level ``alpha`` to detect a true difference
    ``delta`` between two groups of ``n`` seeds with variances ``var``: simulated with fewer
    than ``SIMULATE_BELOW`` seeds on a side, else the noncentral t with the Welch-Satterthwaite
    degrees of freedom (see the module doc)."""
    return power_function({"var": var, "n": n}, alpha)(delta)


def paired_power(delta: float, var_diff: float, n: int, alpha: float) -> float:
    """The power of the paired two-sided t-test at level ``alpha``: ``n`` pairs whose
    differences have variance ``var_diff``, a true mean difference ``delta``. Exact for normal
    differences: the one-sample t statistic follows the noncentral t."""
    return nct_power(delta, math.sqrt(var_diff / n), n - 1, alpha)


def power_function(test: Mapping, alpha: float, n: int | None = None):
    """The power of the test ``test`` (``compare``'s: paired, or Welch's) at level ``alpha``, with
    its own seeds or ``n`` a side, as a function of the true difference on its scale (see the
    module doc: exact for the paired test; for Welch's, simulated below ``SIMULATE_BELOW`` seeds
    a side, the noncentral t from there)."""
    if test.get("paired"):
        k = n or test["n"][0]
        return lambda delta: paired_power(delta, test["var_diff"], k, alpha)
    var, (na, nb) = test["var"], ((n, n) if n else test["n"])
    if min(na, nb) < SIMULATE_BELOW:
        e, c = _rejections(var, (na, nb), alpha)  # the draws' shifts and bounds, computed once
        return lambda delta: float(np.mean(np.abs(delta + e) > c))
    va, vb = var
    se2 = va / na + vb / nb
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return lambda delta: nct_power(delta, math.sqrt(se2), df, alpha)


def compare(a: Sequence[float], b: Sequence[float], scale: str = "points", margin: float | None = None,
            level: float = 0.95, paired: bool = False) -> dict:
    """One comparison of a's seeds against b's (see the module doc): ``diff`` (a − b in
    points, or a's geometric mean over b's for ``scale="log"``), ``ci``, the test's ``t``, ``df``
    and ``p``, ``p_equiv`` (None without a margin), ``var`` (each side's sample variance on the
    test's scale), ``n`` (seeds a side), ``paired`` and for a paired test ``var_diff`` (the
    differences' variance); ``note`` says why there is no test. A paired test takes the seeds
    in the same order on both sides."""
    from scipy import stats
    from statsmodels.stats.weightstats import ttost_ind, ttost_paired

    x, y = _scaled(a, scale), _scaled(b, scale)
    if not len(x) or not len(y):
        raise ValueError("a comparison needs at least one seed on each side")
    if paired and len(x) != len(y):
        raise ValueError(f"a paired comparison needs the same seeds on both sides, got {len(x)} and {len(y)}")
    d = float(x.mean() - y.mean())
    out = {"diff": _shown(d, scale), "scale": scale, "margin": margin, "n": [len(x), len(y)], "paired": paired,
           "ci": None, "t": None, "df": None, "p": None, "p_equiv": None, "var": None}
    if len(x) < 2 or len(y) < 2:
        return out | {"note": "one seed on a side: no test"}
    out["var"] = [float(x.var(ddof=1)), float(y.var(ddof=1))]
    spread = (x - y).std() if paired else max(x.std(), y.std())
    if spread == 0:
        return out | {"note": f"no spread {'in the differences' if paired else 'between seeds on either side'}: no test"}
    res = stats.ttest_rel(x, y) if paired else stats.ttest_ind(x, y, equal_var=False)
    lo, hi = (float(v) for v in res.confidence_interval(level))
    if scale == "points":
        lo, hi = max(lo, -1.0), min(hi, 1.0)
    out.update(ci=[_shown(lo, scale), _shown(hi, scale)], t=float(res.statistic), df=float(res.df),
               p=float(res.pvalue))
    if paired:
        out["var_diff"] = float((x - y).var(ddof=1))
    bound = _bound(margin, scale)
    if bound is not None:
        tost = ttost_paired(x, y, -bound, bound) if paired else ttost_ind(x, y, -bound, bound, usevar="unequal")
        out["p_equiv"] = float(tost[0])
    return out


def detectable(test: Mapping, alpha: float, power_: float = POWER) -> float | None:
    """The smallest true difference (points, or a factor above 1) the test detects with
    ``power_`` at level ``alpha``, with its seeds and their observed variances (``power_function``,
    bisected: the simulated power is a fixed step function of the difference); None without
    a test."""
    if test.get("p") is None:
        return None
    power = power_function(test, alpha)
    hi = 1e-9 + (math.sqrt(test["var_diff"] / test["n"][0]) if test.get("paired")
                 else math.sqrt(test["var"][0] / test["n"][0] + test["var"][1] / test["n"][1]))
    while power(hi) < power_:  # one standard error, doubled until the power is reached
        hi *= 2
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if power(mid) >= power_ else (mid, hi)
    return _shown(hi, test["scale"])


def seeds_needed(test: Mapping, alpha: float, power_: float = POWER, most: int = 200) -> int | None:
    """Seeds a side with which the test would detect its observed difference (were it real)
    with ``power_`` at level ``alpha``, given the variances it observed (``power_function``); None
    without a test or a difference, ``most`` + 1 when more than ``most`` would be needed."""
    if test.get("p") is None:
        return None
    d = abs(_on_scale(test["diff"], test["scale"]))
    if d == 0:
        return None
    return next((k for k in range(2, most + 1) if power_function(test, alpha, n=k)(d) >= power_), most + 1)


def holm(ps: Mapping[str, float | None]) -> dict[str, float | None]:
    """Holm's step-down adjustment of the p-values tested together: sorted ascending, the i-th
    of m times m - i + 1, each raised to the largest before it, capped at 1 (Holm 1979; the
    operations of ``statsmodels.stats.multitest.multipletests(method="holm")``, against which
    ``tests/test_stats.py`` checks it bit for bit). Not that function itself: it runs a full
    ``gc.collect()`` on every call, a quarter of a second in a process that holds torch, and
    the summaries adjust thousands of families. None (no test) stays None and does not count."""
    tested = [k for k, p in ps.items() if p is not None]
    out: dict[str, float | None] = {k: None for k in ps}
    if tested:
        p = np.array([ps[k] for k in tested], dtype=float)
        order = np.argsort(p)
        stepped = np.maximum.accumulate(p[order] * np.arange(len(p), 0, -1))
        adjusted = np.empty_like(p)
        adjusted[order] = np.minimum(stepped, 1.0)
        out.update({k: float(v) for k, v in zip(tested, adjusted)})
    return out


def verdict(test: Mapping, higher_is_better: bool = True, alpha: float = ALPHA) -> str:
    """The verdict id a comparison of a family earns from its adjusted tests (see the module doc)."""
    p = test.get("p_adj", test.get("p"))
    if p is None:
        return UNTESTED
    if p < alpha:
        return AHEAD if (test["diff"] > (1.0 if test["scale"] == "log" else 0.0)) == higher_is_better else BEHIND
    pe = test.get("p_equiv_adj", test.get("p_equiv"))
    return EQUIVALENT if pe is not None and pe < alpha else UNDECIDED


def family(tests: Mapping[str, dict], higher_is_better: bool = True, alpha: float = ALPHA) -> dict[str, dict]:
    """The comparisons of one family, corrected together: each test (``compare``) gains
    ``p_adj`` and ``p_equiv_adj`` (Holm), ``m`` (the tests in the family), ``verdict``,
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
        t["verdict"] = verdict(t, hib, alpha)
        t["within_margin"] = t["p_equiv_adj"] is not None and t["p_equiv_adj"] < alpha
        t["detectable"] = detectable(t, strictest)
        t["seeds_needed"] = seeds_needed(t, strictest) if t["verdict"] == UNDECIDED else None
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


def reversed_test(test: Mapping, a: str) -> dict:
    """The comparison of ``a`` against ``test["against"]`` read the other way round: the
    reference against ``a``. The same test and p; the difference and its interval inverted
    (a factor's reciprocal, or the negated points), ahead and behind swapped."""
    log = test["scale"] == "log"
    flip = (lambda v: 1 / v) if log else (lambda v: -v)  # noqa: E731
    out = {**test, "diff": flip(test["diff"]), "against": a, "t": None if test.get("t") is None else -test["t"]}
    if test.get("ci"):
        out["ci"] = [flip(test["ci"][1]), flip(test["ci"][0])]
    if "var" in test and test["var"]:
        out["var"] = list(test["var"])[::-1]
    out["n"] = list(test["n"])[::-1]
    swap = {AHEAD: BEHIND, BEHIND: AHEAD}
    if "verdict" in test:
        out["verdict"] = swap.get(test["verdict"], test["verdict"])
    return out


def tally(tests: Mapping[str, Mapping]) -> dict:
    """What a family decided: {verdict: [schemes]} in the order given, the family's size and
    seeds a side, and, for the undecided, the seeds each would need (``seeds_needed``)."""
    verdicts: dict[str, list[str]] = {v: [] for v in VERDICTS}
    for s, t in tests.items():
        verdicts[t["verdict"]].append(s)
    seeds = sorted({n for t in tests.values() for n in t["n"]})
    return {"verdicts": verdicts, "m": next((t["m"] for t in tests.values()), 0), "seeds": seeds,
            "needed": {s: tests[s]["seeds_needed"] for s in verdicts[UNDECIDED]}}


# ------------------------------------------------------------------ ranks
def places(means: Mapping[str, float], higher_is_better: bool) -> dict[str, int]:
    """{scheme: its place, 1 for the best}; ties share the better place (competition ranking)."""
    sign = -1 if higher_is_better else 1
    ordered = sorted(means.values(), key=lambda v: sign * v)
    return {s: 1 + ordered.index(v) for s, v in means.items()}


def place_rows(means: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """``places`` of every row of ``means`` (draws, schemes) at once: 1 + the schemes strictly better."""
    m = -means if higher_is_better else means
    return 1 + (m[:, None, :] < m[:, :, None]).sum(axis=2)


def draw_indices(samples: Mapping[str, Sequence[float]], schemes: Sequence[str],
                 rng: np.random.Generator) -> list[np.ndarray]:
    """One bootstrap draw: for each scheme, the indices of its seeds redrawn with replacement."""
    return [rng.integers(0, len(samples[s]), len(samples[s])) for s in schemes]


def resampled_means(samples: Mapping[str, Sequence[float]], schemes: Sequence[str],
                    draws: Sequence[Sequence[np.ndarray]]) -> np.ndarray:
    """The means of ``draws`` (``draw_indices`` per draw) as an array (draws, schemes)."""
    out = np.empty((len(draws), len(schemes)))
    for j, s in enumerate(schemes):
        v = np.asarray(samples[s], dtype=float)
        out[:, j] = v[np.stack([d[j] for d in draws])].mean(axis=1)
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
    draws = [draw_indices(samples, names, rng) for _ in range(resamples)]
    ranks = place_rows(resampled_means(samples, names, draws), higher_is_better)
    out = {}
    for s in sorted(names, key=lambda s: (observed[s], s)):
        lo, hi = np.percentile(ranks[:, names.index(s)], [2.5, 97.5])
        out[s] = {"place": observed[s], "lo": int(math.floor(lo)), "hi": int(math.ceil(hi)), "mean": means[s]}
    return out


# ------------------------------------------------------------------ how a table cell prints a comparison
def format_p(p: float | None) -> str:
    """A p-value as the tables print it: three decimals, or two significant digits below 0.001."""
    return "—" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


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


def detectable_cell(test: Mapping) -> str:
    """What an undecided test could have detected, in a table cell: "detects ×1.70",
    "detects 29 pt", "detects no gap in range" (a gap of 100 points or more), "no test"."""
    d = test.get("detectable")
    if d is None:
        return "no test"
    if test["scale"] != "log" and d >= 1:
        return "detects no gap in range"
    return f"detects ×{d:.2f}" if test["scale"] == "log" else f"detects {100 * d:.0f} pt"


def verdict_cell(test: Mapping | None) -> str:
    """A comparison's verdict id in a table cell: "behind", "behind, within ±5%", "equivalent
    (±5%)", "undecided (detects ×1.70)" (``detectable_cell``), or "—" without a test; "paired"
    where the test is."""
    if not test or test["verdict"] == UNTESTED:
        return "—"
    v = test["verdict"]
    if v in DECIDED:
        cell = v + (f", within {shown_margin(test)}" if test["within_margin"] else "")
    elif v == EQUIVALENT:
        cell = f"{v} ({shown_margin(test)})"
    else:
        cell = f"{v} ({detectable_cell(test)})"
    return cell + (", paired" if test.get("paired") else "")


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
