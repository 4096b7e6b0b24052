"""The study's statistics (analysis.stats): a comparison against SciPy and by hand, on both
scales, unpaired and paired; equivalence against two one-sided tests written out; Holm's
correction by hand; the power of Welch's test against a simulation of the test itself at 2 to
20 degrees of freedom, and the noncentral t against statsmodels'; the paired test's power
against statsmodels' and a simulation; the verdicts a family earns; and the planted case the
verdicts must not get wrong (0% against NoPE's spread seeds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from analysis import stats


@pytest.mark.parametrize("a,b", [([0.48, 0.47, 0.50], [0.24, 0.25, 0.23]), ([0.1, 0.2, 0.4, 0.35], [0.2, 0.21])])
def test_compare_in_points_is_welch_as_scipy_computes_it(a, b):
    got = stats.compare(a, b, "points")
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic) and got["p"] == pytest.approx(ref.pvalue)
    assert got["df"] == pytest.approx(ref.df)
    lo, hi = ref.confidence_interval(0.95)
    assert got["ci"] == pytest.approx([max(lo, -1.0), min(hi, 1.0)])
    assert got["diff"] == pytest.approx(np.mean(a) - np.mean(b)) and got["n"] == [len(a), len(b)]


def test_compare_on_the_log_scale_by_hand():
    """Ratios [2, 8] against [1, 1, 1]: the logs' means are ln 4 and 0, so the factor is 4 (the
    geometric means' ratio, not the arithmetic 5); the test and the interval are Welch's on
    the logs, the interval exponentiated (a factor, positive)."""
    got = stats.compare([2.0, 8.0], [1.0, 1.0, 1.0], "log")
    assert got["diff"] == pytest.approx(4.0)
    ref = scipy_stats.ttest_ind(np.log([2.0, 8.0]), np.zeros(3), equal_var=False)
    assert got["p"] == pytest.approx(ref.pvalue)
    lo, hi = ref.confidence_interval(0.95)
    assert got["ci"] == pytest.approx([math.exp(lo), math.exp(hi)]) and got["ci"][0] > 0
    with pytest.raises(ValueError, match="positive"):
        stats.compare([0.0, 1.0], [1.0, 1.0], "log")


def test_an_interval_in_points_stays_within_the_possible_range():
    """0% in every seed against NoPE's 76, 20 and 46: Welch's interval runs below -100 points;
    the one given is clipped to [-1, 1] (which keeps its coverage), the p-value is Welch's."""
    got = stats.compare([0.0, 0.0, 0.0], [0.76, 0.20, 0.46])
    raw = scipy_stats.ttest_ind([0.0, 0.0, 0.0], [0.76, 0.20, 0.46], equal_var=False).confidence_interval()
    assert raw.low < -1.0 and got["ci"] == pytest.approx([-1.0, raw.high])


def test_equivalence_is_two_one_sided_welch_tests():
    """TOST within ±m: the larger p of 'a − b > −m' and 'a − b < m', each a one-sided Welch test
    (written here with SciPy's alternative=), on the test's scale (logs for a factor)."""
    a, b, m = [0.50, 0.51, 0.49, 0.505], [0.495, 0.50, 0.51], 0.02
    lower = scipy_stats.ttest_ind(np.add(a, m), b, equal_var=False, alternative="greater").pvalue
    upper = scipy_stats.ttest_ind(np.subtract(a, m), b, equal_var=False, alternative="less").pvalue
    assert stats.compare(a, b, "points", m)["p_equiv"] == pytest.approx(max(lower, upper))
    la, lb, bound = np.log([1.00, 1.01, 0.99]), np.log([1.0, 1.02, 1.01]), math.log1p(0.05)
    lower = scipy_stats.ttest_ind(la + bound, lb, equal_var=False, alternative="greater").pvalue
    upper = scipy_stats.ttest_ind(la - bound, lb, equal_var=False, alternative="less").pvalue
    got = stats.compare([1.00, 1.01, 0.99], [1.0, 1.02, 1.01], "log", 0.05)
    assert got["p_equiv"] == pytest.approx(max(lower, upper))
    assert stats.compare(a, b)["p_equiv"] is None  # no margin, no equivalence test


def test_no_test_with_one_seed_or_without_spread():
    one = stats.compare([0.5], [0.2, 0.3])
    assert one["p"] is None and one["diff"] == pytest.approx(0.25) and "one seed" in one["note"]
    flat = stats.compare([1.0, 1.0], [0.5, 0.5])
    assert flat["p"] is None and "no spread" in flat["note"] and flat["diff"] == 0.5
    fam = stats.family({"one": one, "flat": flat})
    assert {t["verdict"] for t in fam.values()} == {stats.UNTESTED} and fam["one"]["m"] == 0


def test_holm_by_hand():
    """Holm's step-down adjustment, computed by hand: sorted 0.01, 0.03, 0.04 times 3, 2, 1
    gives 0.03, 0.06, 0.04, and the last is raised to the 0.06 before it; None stays None and
    does not count among the tests; the result is capped at 1."""
    assert stats.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert stats.holm({"a": 0.02, "x": None, "b": 0.5}) == {"a": pytest.approx(0.04), "x": None, "b": 0.5}
    assert stats.holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    assert stats.holm({}) == {}


def test_holm_is_statsmodels_holm_bit_for_bit(monkeypatch):
    """``stats.holm`` against ``statsmodels``' ``multipletests(method="holm")`` on families of 1
    to 40 random p-values, ties and ones among them: equal to the last bit. (The garbage
    collection statsmodels runs on every call is skipped here: it changes no number.)"""
    import gc

    from statsmodels.stats.multitest import multipletests

    monkeypatch.setattr(gc, "collect", lambda *a: 0)

    rng = np.random.default_rng(7)
    for m in range(1, 41):
        p = rng.uniform(0, 0.2, m) ** rng.uniform(0.5, 3)
        p[: m // 4] = p[m // 2] if m > 3 else p[: m // 4]  # ties
        p[-1:] = 1.0 if m % 5 == 0 else p[-1:]
        ours = stats.holm({str(i): float(v) for i, v in enumerate(p)})
        theirs = multipletests(p, method="holm")[1]
        assert [ours[str(i)] for i in range(m)] == [float(v) for v in theirs]


@pytest.mark.parametrize("test,higher,word", [
    ({"diff": 0.1, "p": 0.05, "scale": "points"}, True, stats.UNDECIDED),   # at the level: not below it
    ({"diff": 0.1, "p": 0.0499, "scale": "points"}, True, stats.AHEAD),
    ({"diff": 0.1, "p": 0.0499, "scale": "points"}, False, stats.BEHIND),  # less is better and it is more
    ({"diff": 0.9, "p": 0.01, "scale": "log"}, False, stats.AHEAD),        # a factor below 1, less is better
    ({"diff": 1.2, "p": 0.01, "scale": "log"}, True, stats.AHEAD),
    ({"diff": 0.01, "p": 0.5, "p_equiv": 0.01, "scale": "points"}, True, stats.EQUIVALENT),
    ({"diff": 0.01, "p": 0.5, "p_equiv": 0.2, "scale": "points"}, True, stats.UNDECIDED),
    ({"diff": 0.3, "p": None, "scale": "points"}, True, stats.UNTESTED),
    # the adjusted p decides when there is one
    ({"diff": 0.3, "p": 0.01, "p_adj": 0.2, "p_equiv": 0.01, "p_equiv_adj": 0.3, "scale": "points"}, True,
     stats.UNDECIDED),
])
def test_the_verdict_of_a_test(test, higher, word):
    assert stats.verdict(test, higher) == word


def test_a_family_adjusts_together_and_a_raw_p_below_5_percent_can_stay_undecided():
    rng = np.random.default_rng(1)
    ref = list(0.5 + 0.01 * rng.standard_normal(3))
    samples = {"ref": ref, "far": [0.9, 0.91, 0.89], "near": [0.53, 0.56, 0.54], "same": list(ref)}
    fam = stats.against(samples, "ref", "points", margin=0.05)
    raw = {s: scipy_stats.ttest_ind(v, ref, equal_var=False).pvalue for s, v in samples.items() if s != "ref"}
    assert {s: t["p"] for s, t in fam.items()} == pytest.approx(raw)
    assert {s: t["p_adj"] for s, t in fam.items()} == pytest.approx(stats.holm(raw))
    assert fam["far"]["verdict"] == stats.AHEAD and fam["far"]["m"] == 3
    assert fam["same"]["verdict"] == stats.EQUIVALENT and fam["same"]["seeds_needed"] is None
    assert raw["near"] < 0.05 < fam["near"]["p_adj"] and fam["near"]["verdict"] == stats.UNDECIDED
    assert fam["near"]["seeds_needed"] > 3 and fam["near"]["detectable"] > abs(fam["near"]["diff"])
    assert stats.tally(fam)["needed"] == {"near": fam["near"]["seeds_needed"]}


def test_the_noncentral_t_is_statsmodels_power_when_the_variances_are_equal():
    """With equal variances and seeds, Welch's degrees of freedom are 2n − 2 and the noncentral t's
    power is the two-sample t-test's (statsmodels.stats.power.TTestIndPower): ``nct_power`` at
    every n, and ``welch_power`` itself from ``SIMULATE_BELOW`` seeds a side, where it is the
    noncentral t."""
    from statsmodels.stats.power import TTestIndPower

    for n, effect, alpha in [(3, 2.0, 0.05), (5, 1.2, 0.01), (10, 0.8, 0.004), (12, 1.3, 0.004), (20, 0.9, 0.01)]:
        want = TTestIndPower().power(effect, nobs1=n, alpha=alpha, ratio=1.0)
        se = math.sqrt(2 * 0.09 / n)
        assert stats.nct_power(effect * 0.3, se, 2 * n - 2, alpha) == pytest.approx(want, rel=1e-6)
        if n >= stats.SIMULATE_BELOW:
            assert stats.welch_power(effect * 0.3, [0.09, 0.09], [n, n], alpha) == pytest.approx(want, rel=1e-6)


def _welch_df(var, n):
    q = [v / k for v, k in zip(var, n)]
    return sum(q) ** 2 / sum(x**2 / (k - 1) for x, k in zip(q, n))


def _simulated_rejections(delta, var, n, alpha, draws=20_000, seed=12345, paired=False):
    """An independent simulation: normal draws with the given variances and a true difference
    ``delta``, each tested with SciPy's own test (Welch's, or the paired test on pairs whose
    differences have variance ``var[0]``); the share rejected at ``alpha``."""
    rng = np.random.default_rng(seed)
    if paired:
        d = delta + math.sqrt(var[0]) * rng.standard_normal((draws, n[0]))
        return float(np.mean(scipy_stats.ttest_1samp(d, 0.0, axis=1).pvalue < alpha))
    x = delta + math.sqrt(var[0]) * rng.standard_normal((draws, n[0]))
    y = math.sqrt(var[1]) * rng.standard_normal((draws, n[1]))
    return float(np.mean(scipy_stats.ttest_ind(x, y, axis=1, equal_var=False).pvalue < alpha))


@pytest.mark.parametrize("df,var,n", [(2, (1.0, 1e-4), (3, 3)), (3, (1.0, 1e-4), (4, 4)), (5, (1.0, 1e-4), (6, 6)),
                                      (10, (1.0, 1.0), (6, 6)), (20, (1.0, 1.0), (11, 11)),
                                      (20, (1.0, 1e-4), (21, 21))])
def test_welch_power_is_within_2_points_of_a_simulation_of_the_test(df, var, n):
    """The power ``welch_power`` states against SciPy's Welch test run on 20,000 independent
    draws, at the Welch degrees of freedom 2, 3, 5, 10 and 20 (the last both simulated, 11 a side,
    and from the noncentral t, 21 a side), at the level of one test and of a family of 15, at
    the difference it calls detectable with 80% power and at half of it: within 2 points."""
    assert _welch_df(var, n) == pytest.approx(df, abs=0.05)
    for alpha in (0.05, 0.05 / 15):
        test = {"p": 0.5, "var": list(var), "n": list(n), "scale": "points"}
        d = stats.detectable(test, alpha)
        for delta in (d, d / 2):
            got = stats.welch_power(delta, var, n, alpha)
            assert got == pytest.approx(_simulated_rejections(delta, var, n, alpha), abs=0.02), (df, alpha, delta)
        assert stats.welch_power(d, var, n, alpha) == pytest.approx(stats.POWER, abs=1e-3)


@pytest.mark.parametrize("var,n", [((1.0, 1e-4), (3, 3)), ((1.0, 1.0), (6, 6)), ((0.5, 2.0), (4, 7))])
def test_the_simulated_power_at_one_difference_is_welch_powers_where_it_simulates(var, n):
    """``simulated_power`` (the power at one difference, from the simulated draws) is
    ``welch_power``'s (checked against SciPy's test on independent draws above) wherever Welch's
    power is simulated (fewer than ``SIMULATE_BELOW`` seeds a side), at the level of one test
    and of a family of 15, at no difference (the level itself, about), at the detectable one
    and at half of it."""
    assert min(n) < stats.SIMULATE_BELOW
    for alpha in (0.05, 0.05 / 15):
        d = stats.detectable({"p": 0.5, "var": list(var), "n": list(n), "scale": "points"}, alpha)
        for delta in (0.0, d / 2, d):
            assert stats.simulated_power(delta, var, n, alpha) == stats.welch_power(delta, var, n, alpha)
        assert stats.simulated_power(0.0, var, n, alpha) == pytest.approx(alpha, abs=0.01)
        assert stats.simulated_power(d, var, n, alpha) == pytest.approx(stats.POWER, abs=1e-3)


def test_a_tail_scipy_cannot_evaluate_counts_as_zero_not_one():
    """scipy's noncentral t returns NaN far in its lower tail at about 2 degrees of freedom; that
    tail is about 0, so the power is the upper tail alone, never 1 (the bug that stopped
    ``detectable`` at the jump instead of at 80% power)."""
    df, nc = 2.1, 8.0
    crit = scipy_stats.t.ppf(1 - 0.05 / 28, df)
    upper = scipy_stats.nct.sf(crit, df, nc)
    got = stats.nct_power(nc, 1.0, df, 0.05 / 14)  # the lower tail: NaN in scipy 1.17, about 1e-17 in truth
    assert got == pytest.approx(upper, rel=1e-9) and 0.2 < got < 0.3


def test_the_committed_mlm_rows_state_what_their_tests_can_detect():
    """The masked LM's rows against ``none`` at the study's seeds (under 3 degrees of freedom, where
    the noncentral t's NaN tail once stopped ``detectable`` at the jump; the fire row was the
    case): every undecided row of the committed table states the detectable difference that
    ``detectable`` gives for the row's own seeds and variances at its family's strictest level, so
    it was made by the formula as it is now; there is at least one such row to check."""
    import json

    from .conftest import REPO

    mlm = json.loads((REPO / "results" / "mlm_table.json").read_text())
    rows = [t for t in (e.get("vs_reference") for e in mlm["summary"].values())
            if t and t["verdict"] == stats.UNDECIDED and t.get("df") is not None and t["df"] < 3]
    assert rows, "no undecided masked-LM row under 3 degrees of freedom to check"
    for t in rows:
        assert t["detectable"] == pytest.approx(stats.detectable(t, stats.ALPHA / t["m"]), rel=1e-9)
        assert t["detectable"] > abs(t["diff"])  # undecided: what it could detect exceeds what it saw


def test_a_paired_comparison_is_scipys_paired_test():
    """``paired=True``: SciPy's ttest_rel on the test's scale (logs for a factor), its interval,
    and the equivalence test as two one-sided paired tests written out; the differences'
    variance for the power."""
    a, b = [1.10, 1.30, 0.95, 1.20, 1.05], [1.00, 1.22, 0.90, 1.08, 1.01]
    got = stats.compare(a, b, "log", 0.05, paired=True)
    la, lb = np.log(a), np.log(b)
    ref = scipy_stats.ttest_rel(la, lb)
    assert got["paired"] and got["p"] == pytest.approx(ref.pvalue) and got["t"] == pytest.approx(ref.statistic)
    assert got["df"] == 4 and got["diff"] == pytest.approx(math.exp((la - lb).mean()))
    lo, hi = ref.confidence_interval(0.95)
    assert got["ci"] == pytest.approx([math.exp(lo), math.exp(hi)])
    bound = math.log1p(0.05)
    lower = scipy_stats.ttest_1samp(la - lb + bound, 0.0, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(la - lb - bound, 0.0, alternative="less").pvalue
    assert got["p_equiv"] == pytest.approx(max(lower, upper))
    assert got["var_diff"] == pytest.approx(np.var(la - lb, ddof=1))
    unpaired = stats.compare(a, b, "log", 0.05)
    assert unpaired["p"] > got["p"]  # the same seeds, paired: the seed-to-seed spread cancels
    with pytest.raises(ValueError, match="same seeds"):
        stats.compare([1.0, 2.0, 3.0], [1.0, 2.0], paired=True)


def test_the_paired_power_is_exact_statsmodels_and_a_simulation_agree():
    """The paired test's power is the one-sample t-test's (statsmodels.stats.power.TTestPower),
    exact for normal differences: a simulation of SciPy's paired test agrees within 2 points."""
    from statsmodels.stats.power import TTestPower

    for n, delta, var_d, alpha in [(3, 1.5, 0.2, 0.05), (5, 0.6, 0.1, 0.0125), (10, 0.3, 0.1, 0.004)]:
        got = stats.paired_power(delta, var_d, n, alpha)
        assert got == pytest.approx(TTestPower().power(delta / math.sqrt(var_d), nobs=n, alpha=alpha), rel=1e-6)
        assert got == pytest.approx(_simulated_rejections(delta, (var_d,), (n,), alpha, paired=True), abs=0.02)


def test_a_test_read_the_other_way_round():
    """``reversed_test``: b against a from a's test against b: the reciprocal factor, the interval
    inverted and swapped, the same p-values, ahead and behind swapped."""
    fam = stats.against({"ref": [1.0, 1.01, 0.99], "far": [2.0, 2.1, 1.9]}, "ref", "log", 0.05, higher_is_better=False)
    t = fam["far"]
    r = stats.reversed_test(t, "far")
    assert r["diff"] == pytest.approx(1 / t["diff"]) and r["ci"] == pytest.approx([1 / t["ci"][1], 1 / t["ci"][0]])
    assert r["p_adj"] == t["p_adj"] and r["against"] == "far" and t["verdict"] == stats.BEHIND
    assert r["verdict"] == stats.AHEAD
    points = stats.reversed_test(stats.compare([0.3, 0.31], [0.1, 0.12]) | {"against": "b"}, "a")
    assert points["diff"] == pytest.approx(-0.195)


def test_every_field_of_a_test_read_the_other_way_round():
    """Field by field against the definition (the reference's side and ours swapped): the
    difference and interval inverted, t negated, the variances and seed counts swapped, ahead and
    behind exchanged while equivalent and undecided stay; what is absent stays absent and the test
    itself is left as it was."""
    t = {"scale": "log", "diff": 1.25, "ci": [1.1, 1.6], "t": 2.5, "var": [0.01, 0.04], "n": [5, 4], "p": 0.01,
         "p_adj": 0.03, "against": "alibi", "verdict": stats.BEHIND, "m": 3}
    before = {k: list(v) if isinstance(v, list) else v for k, v in t.items()}
    r = stats.reversed_test(t, "rope")
    assert t == before
    assert r["diff"] == pytest.approx(0.8) and r["ci"] == pytest.approx([1 / 1.6, 1 / 1.1])
    expected = {**t, "t": -2.5, "var": [0.04, 0.01], "n": [4, 5], "against": "rope", "verdict": stats.AHEAD}
    assert {k: v for k, v in r.items() if k not in ("diff", "ci")} == {
        k: v for k, v in expected.items() if k not in ("diff", "ci")}
    for kept in (stats.EQUIVALENT, stats.UNDECIDED, stats.UNTESTED):
        assert stats.reversed_test({**t, "verdict": kept}, "rope")["verdict"] == kept
    points = {"scale": "points", "diff": 0.1, "ci": [0.05, 0.2], "t": None, "n": [3, 3], "against": "none"}
    r = stats.reversed_test(points, "sinusoidal")
    assert r == {**points, "diff": -0.1, "ci": [-0.2, -0.05], "against": "sinusoidal"}
    assert "var" not in r and "verdict" not in r and r["t"] is None
    bare = stats.reversed_test({**points, "ci": None, "var": []}, "sinusoidal")
    assert bare["ci"] is None and bare["var"] == []


def test_a_tally_lists_each_verdict_in_order_with_the_seeds_of_both_sides():
    def test(verdict, n, needed=None):
        return {"verdict": verdict, "n": n, "m": 4, "seeds_needed": needed}

    family = {"a": test(stats.BEHIND, [5, 5]), "b": test(stats.UNDECIDED, [3, 5], 9), "c": test(stats.AHEAD, [5, 5]),
              "d": test(stats.UNDECIDED, [4, 5], None), "e": test(stats.BEHIND, [5, 5])}
    assert stats.tally(family) == {
        "verdicts": {stats.AHEAD: ["c"], stats.BEHIND: ["a", "e"], stats.EQUIVALENT: [], stats.UNDECIDED: ["b", "d"],
                     stats.UNTESTED: []},
        "m": 4, "seeds": [3, 4, 5], "needed": {"b": 9, "d": None}}
    assert stats.tally({}) == {"verdicts": {v: [] for v in stats.VERDICTS}, "m": 0, "seeds": [], "needed": {}}


def test_a_margin_is_shown_as_a_share_or_as_points_and_no_margin_as_nothing():
    assert stats.shown_margin({"margin": 0.05, "scale": "log"}) == "±5%"
    assert stats.shown_margin({"margin": 0.125, "scale": "log"}) == "±12.5%"
    assert stats.shown_margin({"margin": 0.1, "scale": "points"}) == "±10.0 pt"
    assert stats.shown_margin({"margin": None, "scale": "log"}) == "" == stats.shown_margin({"scale": "points"})


def test_detectable_and_seeds_needed_meet_the_power():
    t = stats.compare([0.40, 0.45, 0.50], [0.30, 0.35, 0.40])
    d = stats.detectable(t, 0.05)
    assert stats.welch_power(d, t["var"], t["n"], 0.05) == pytest.approx(stats.POWER, abs=1e-4)
    n = stats.seeds_needed(t, 0.05)
    assert stats.welch_power(0.1, t["var"], (n, n), 0.05) >= stats.POWER > stats.welch_power(0.1, t["var"], (n - 1, n - 1), 0.05)
    log = stats.compare([2.0, 2.2, 1.9], [1.0, 1.05, 0.98], "log")
    assert stats.detectable(log, 0.05) > 1  # a factor


def test_the_planted_case_nope_against_zero_at_16L():
    """The case a reviewer found worded "level": a scheme at 0% in every seed against NoPE's
    76, 20 and 46%. At 3 seeds a side in a family of 14 it is undecided, never equivalent, and
    the test says it could detect no gap within the possible range; at 10 seeds as spread as
    those, it is decided."""
    none3 = [0.76, 0.20, 0.46]
    fam = stats.against({"none": none3, **{f"s{i}": [0.0] * 3 for i in range(14)}}, "none", margin=0.1)
    t = fam["s0"]
    assert t["verdict"] == stats.UNDECIDED and t["m"] == 14
    assert stats.detectable_cell(t) == "detects no gap in range"
    from analysis import words

    assert words.detectable(t) == "no gap within the possible range is detectable"
    none10 = [0.76, 0.20, 0.46, 0.62, 0.35, 0.55, 0.28, 0.70, 0.41, 0.52]
    fam = stats.against({"none": none10, **{f"s{i}": [0.0] * 10 for i in range(14)}}, "none", margin=0.1)
    assert fam["s0"]["verdict"] == stats.BEHIND


def test_rank_intervals_are_places_with_a_bootstrap_range():
    samples = {"fast": [700, 800, 750], "mid": [1000, 1200, 1100], "slow": [2000, 2100, 1900], "tie": [1000, 1300, 1000]}
    r = stats.rank_intervals(samples, higher_is_better=False, resamples=500)
    assert list(r) == ["fast", "mid", "tie", "slow"]
    assert r["fast"] == {"place": 1, "lo": 1, "hi": 1, "mean": 750.0}
    assert r["slow"]["place"] == 4 and r["slow"]["lo"] == 4
    assert r["mid"]["lo"] == 2 and r["mid"]["hi"] >= 3  # mid and tie swap places between draws
    assert stats.rank_intervals(samples, False, resamples=500) == r  # seeded: the report is reproducible
    assert stats.places({"a": 0.9, "b": 0.5, "c": 0.9}, True) == {"a": 1, "b": 3, "c": 1}


def test_how_a_comparison_is_printed():
    fam = stats.against({"ref": [1.0, 1.01, 0.99], "far": [2.0, 2.1, 1.9]}, "ref", "log", 0.05, higher_is_better=False)
    t = fam["far"]
    diff, p, p_adj, verdict = stats.comparison_cells(t)
    assert diff.startswith(f"×{t['diff']:.3f} (") and verdict == "behind"
    assert p == stats.format_p(t["p"]) and p_adj == stats.format_p(t["p_adj"])
    assert stats.comparison_cells(None) == ["—"] * 4 and stats.shown_margin(t) == "±5%"
    points = stats.compare([0.3, 0.31], [0.1, 0.12], "points", 0.02)
    assert stats.shown_diff(points) == "+19.5 pt" and stats.shown_margin(points) == "±2.0 pt"


@pytest.mark.parametrize("p,text", [(None, "—"), (0.5, "0.500"), (0.04567, "0.046"), (1.0, "1.000"),
                                    (0.001, "0.001"), (0.00099, "9.9e-04"), (2.34e-7, "2.3e-07")])
def test_format_p(p, text):
    """Three decimals from 0.001 up, two significant digits in e-notation below, a dash for no test."""
    assert stats.format_p(p) == text


def test_mean_sd_is_the_sample_sd():
    assert stats.mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert stats.mean_sd([5.0]) == (5.0, 0.0)
    m, sd = stats.mean_sd([1.0, 3.0])
    assert m == 2.0 and sd == pytest.approx(2**0.5)


# ------------------------------------------------------------------ cells, seeds and families on stated tests
def test_every_cell_a_table_prints_for_a_stated_test():
    """The cells of tests whose fields are stated (not computed): the difference with its interval
    in points and as a factor, the p-values, and each kind of verdict cell word for word: behind
    within the margin and paired, equivalent with its margin, undecided with what it detects
    (points below and at 100, a factor below and above 2), and no test."""
    pts = {"scale": "points", "diff": 0.123, "ci": [-0.05, 0.296], "p": 0.2, "p_adj": 0.4, "margin": 0.02,
           "verdict": stats.UNDECIDED, "detectable": 0.29, "within_margin": False}
    assert stats.comparison_cells(pts) == ["+12.3 pt (-5.0, +29.6)", "0.200", "0.400", "undecided (detects 29 pt)"]
    log = {"scale": "log", "diff": 1.234, "ci": [1.1, 1.4], "p": 0.0004, "p_adj": 0.0012, "margin": 0.05,
           "verdict": stats.BEHIND, "within_margin": True, "paired": True}
    assert stats.comparison_cells(log) == ["×1.234 (1.100, 1.400)", "4.0e-04", "0.001", "behind, within ±5%, paired"]
    assert stats.verdict_cell({**log, "within_margin": False, "paired": False}) == "behind"
    assert stats.verdict_cell({**log, "verdict": stats.EQUIVALENT}) == "equivalent (±5%), paired"
    assert stats.verdict_cell({**pts, "verdict": stats.EQUIVALENT}) == "equivalent (±2.0 pt)"
    assert stats.verdict_cell({**pts, "verdict": stats.UNTESTED}) == "—" and stats.verdict_cell(None) == "—"
    cells = {(s, d): stats.detectable_cell({"scale": s, "detectable": d})
             for s, d in (("points", 0.29), ("points", 0.999), ("points", 1.0), ("points", 1.5), ("log", 1.7),
                          ("log", 2.5), ("log", None))}
    assert cells == {("points", 0.29): "detects 29 pt", ("points", 0.999): "detects 100 pt",
                     ("points", 1.0): "detects no gap in range", ("points", 1.5): "detects no gap in range",
                     ("log", 1.7): "detects ×1.70", ("log", 2.5): "detects ×2.50", ("log", None): "no test"}
    assert stats.shown_diff(pts, 0.5) == "+50.0 pt" and stats.shown_diff(log, 2.0) == "×2.000"


def test_a_comparison_without_a_test_has_every_field_and_says_why():
    """One seed on a side: every field of a test present, the test's own None, the note word for
    word; no seed on one side, or a margin that is not positive, is refused."""
    out = stats.compare([0.5], [0.4, 0.6], margin=0.1)
    assert out == {"diff": pytest.approx(0.0), "scale": "points", "margin": 0.1, "n": [1, 2], "paired": False,
                   "ci": None, "t": None, "df": None, "p": None, "p_equiv": None, "var": None,
                   "note": "one seed on a side: no test"}
    for a, b in (([], [1.0, 2.0]), ([1.0, 2.0], [])):
        with pytest.raises(ValueError, match="at least one seed on each side"):
            stats.compare(a, b)
    with pytest.raises(ValueError, match="must be positive, got 0"):
        stats.compare([0.1, 0.2], [0.3, 0.4], margin=0)


def _welch(diff, var=(0.01, 0.01), n=(3, 3), scale="points", p=0.5):
    return {"diff": diff, "var": list(var), "n": list(n), "scale": scale, "p": p}


def test_seeds_needed_is_the_fewest_seeds_whose_power_reaches_80_percent():
    """``seeds_needed`` against its definition scanned here: the fewest seeds a side (from 2) at
    which the power at the observed difference (on the test's scale: the log of a factor) is
    80% or more, the one before it short; ``most`` + 1 (201 by default) where none up to ``most``
    is; None for no difference or no test."""
    alpha = 0.05 / 3

    def scanned(t):
        d = abs(math.log(t["diff"])) if t["scale"] == "log" else abs(t["diff"])
        return next(k for k in range(2, 400) if stats.power_function(t, alpha, n=k)(d) >= stats.POWER)

    for t in (_welch(0.15), _welch(1.2, var=(0.02, 0.02), scale="log"), _welch(0.08, var=(0.01, 0.02), n=(4, 3))):
        k = scanned(t)
        assert 3 <= k <= 100 and stats.seeds_needed(t, alpha) == k
        assert stats.power_function(t, alpha, n=k - 1)(abs(stats._on_scale(t["diff"], t["scale"]))) < stats.POWER
        assert stats.seeds_needed(t, alpha, most=k) == k and stats.seeds_needed(t, alpha, most=k - 1) == k
        assert stats.seeds_needed(t, alpha, most=k - 2) == k - 1
    assert stats.seeds_needed(_welch(5.0), alpha) == 2  # a gap of 50 standard deviations: the fewest tested
    assert stats.seeds_needed(_welch(1e-4), alpha) == 201 and stats.seeds_needed(_welch(1e-4), alpha, most=3) == 4
    assert stats.seeds_needed(_welch(0.0), alpha) is None and stats.seeds_needed(_welch(1.0, scale="log"), alpha) is None
    assert stats.seeds_needed(_welch(0.15, p=None), alpha) is None


def test_the_verdict_at_the_edges_of_its_rules():
    """By default higher is better; a difference of no size is never ahead; an equivalence p at the
    level is not below it (undecided)."""
    assert stats.verdict({"p": 0.01, "diff": 0.1, "scale": "points"}) == stats.AHEAD
    assert stats.verdict({"p": 0.01, "diff": 0.0, "scale": "points"}) == stats.BEHIND
    assert stats.verdict({"p": 0.01, "diff": 1.0, "scale": "log"}) == stats.BEHIND
    assert stats.verdict({"p": 0.5, "p_equiv": 0.05, "diff": 0.1, "scale": "points"}) == stats.UNDECIDED
    assert stats.verdict({"p": 0.5, "p_equiv": 0.0499, "diff": 0.1, "scale": "points"}) == stats.EQUIVALENT


def test_a_family_of_one_uses_its_level_a_tests_own_direction_and_its_own_alpha():
    """A family of one test: Holm's strictest level is alpha itself (what it detects is
    ``detectable`` at alpha); a test that carries ``higher_is_better`` keeps it against the
    family's; the family's alpha decides the verdict (p = 0.03: ahead at 0.05, undecided at
    0.01); an equivalence p at alpha is not within the margin (False, not None); a decided test
    needs no more seeds."""
    t = _welch(0.15, p=0.03) | {"p_equiv": 0.05}
    (one,) = stats.family({"a": t}).values()
    assert one["m"] == 1 and one["detectable"] == stats.detectable(one, stats.ALPHA)
    assert one["verdict"] == stats.AHEAD and one["within_margin"] is False and one["seeds_needed"] is None
    (own,) = stats.family({"a": t | {"higher_is_better": False}}).values()
    assert own["verdict"] == stats.BEHIND and own["higher_is_better"] is False
    (strict,) = stats.family({"a": t}, alpha=0.01).values()
    assert strict["verdict"] == stats.UNDECIDED and strict["seeds_needed"] == stats.seeds_needed(strict, 0.01)
    samples = {"ref": [0.50, 0.52, 0.48], "a": [0.55, 0.58, 0.56]}
    p = stats.compare(samples["a"], samples["ref"])["p"]
    assert 0.01 < p < 0.05
    assert stats.against(samples, "ref")["a"]["verdict"] == stats.AHEAD
    assert stats.against(samples, "ref", alpha=0.01)["a"]["verdict"] == stats.UNDECIDED


def test_places_by_direction():
    """Place 1 is the highest mean when higher is better, the lowest otherwise, for one table of
    means and for each row of an array of them; ``rank_intervals`` ranks higher first by default."""
    assert stats.places({"a": 1.0, "b": 2.0, "c": 2.0}, True) == {"a": 3, "b": 1, "c": 1}
    assert stats.places({"a": 1.0, "b": 2.0, "c": 2.0}, False) == {"a": 1, "b": 2, "c": 2}
    rows = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0]])
    assert stats.place_rows(rows, True).tolist() == [[3, 2, 1], [1, 3, 2]]
    assert stats.place_rows(rows, False).tolist() == [[1, 2, 3], [3, 1, 2]]
    ranked = stats.rank_intervals({"low": [1.0, 1.1, 0.9], "high": [5.0, 5.1, 4.9]}, resamples=50)
    assert ranked == {"high": {"place": 1, "lo": 1, "hi": 1, "mean": pytest.approx(5.0)},
                      "low": {"place": 2, "lo": 2, "hi": 2, "mean": pytest.approx(1.0)}}
    assert list(ranked) == ["high", "low"]


def _share_of_draws(samples, lead, trail, seed=stats.SEED, draws=stats.RESAMPLES):
    """An independent bootstrap: with the generator ``rank_intervals`` uses, each scheme's seeds
    redrawn in turn per draw; the share of draws whose mean of ``lead`` is above ``trail``'s."""
    rng = np.random.default_rng(seed)
    above = 0
    for _ in range(draws):
        means = {k: float(np.mean(np.asarray(v)[rng.integers(0, len(v), len(v))])) for k, v in samples.items()}
        above += means[lead] > means[trail]
    return above / draws


def test_a_rank_interval_spans_the_places_of_the_middle_95_percent_of_draws():
    """The interval is the 2.5th to the 97.5th percentile of the places over the bootstrap draws:
    x = (0, 0, 10) leads a single seed at 7 only where all three redrawn seeds are 10 (1/27 of
    draws in theory; 3.15% of the 2,000 seeded draws, counted here by an independent loop):
    more than 2.5%, so x's interval reaches place 1 (at the 3.5th percentile it would not);
    y = (0, 0, 10, 10, 10, 10, 10) trails a single seed at 3 in 2.25% of the draws: less than
    2.5%, so y's interval stays at place 1 (at the 98.5th it would reach 2)."""
    xs = {"f": [7.0], "x": [0.0, 0.0, 10.0]}
    assert 0.025 < _share_of_draws(xs, "x", "f") < 0.035
    assert stats.rank_intervals(xs) == {"f": {"place": 1, "lo": 1, "hi": 2, "mean": 7.0},
                                        "x": {"place": 2, "lo": 1, "hi": 2, "mean": pytest.approx(10 / 3)}}
    ys = {"f": [3.0], "y": [0.0, 0.0] + [10.0] * 5}
    assert 0.015 < _share_of_draws(ys, "f", "y") < 0.025
    assert stats.rank_intervals(ys) == {"y": {"place": 1, "lo": 1, "hi": 1, "mean": pytest.approx(50 / 7)},
                                        "f": {"place": 2, "lo": 2, "hi": 2, "mean": 3.0}}


def test_a_paired_equivalence_is_two_one_sided_paired_tests_and_no_spread_says_where():
    """Paired TOST within ±m: the larger p of the one-sided paired tests 'a − b > −m' and
    'a − b < m' (SciPy's ttest_rel with alternative=); an interval in points above +100 is
    clipped at 1; with no spread the note says where (in the differences of a paired test,
    between seeds on either side of Welch's), word for word."""
    a, b, m = [0.50, 0.53, 0.47, 0.52], [0.49, 0.52, 0.48, 0.50], 0.03
    lower = scipy_stats.ttest_rel(np.add(a, m), b, alternative="greater").pvalue
    upper = scipy_stats.ttest_rel(np.subtract(a, m), b, alternative="less").pvalue
    assert stats.compare(a, b, "points", m, paired=True)["p_equiv"] == pytest.approx(max(lower, upper))
    high = stats.compare([0.76, 0.20, 0.46], [0.0, 0.0, 0.0])
    raw = scipy_stats.ttest_ind([0.76, 0.20, 0.46], [0.0, 0.0, 0.0], equal_var=False).confidence_interval()
    assert raw.high > 1.0 and high["ci"] == pytest.approx([raw.low, 1.0])
    assert stats.compare([1.0, 1.0], [0.5, 0.5])["note"] == "no spread between seeds on either side: no test"
    assert stats.compare([1.0, 2.0], [0.5, 1.5], paired=True)["note"] == "no spread in the differences: no test"


def test_the_power_of_a_paired_test_is_the_paired_power_with_its_own_seeds_or_others():
    """``power_function`` of a paired comparison (``compare(paired=True)``) is ``paired_power``
    (checked against statsmodels and a simulation above) on the differences' variance, with the
    test's own pairs or ``n`` of them; Welch's formula is not used for it (its per-side variances
    here would give another power)."""
    a, b = [0.50, 0.58, 0.47, 0.56], [0.45, 0.50, 0.44, 0.49]
    t = stats.compare(a, b, paired=True)
    for n, k in ((None, 4), (9, 9)):
        got = stats.power_function(t, 0.05, n)
        for d in (0.01, 0.03):
            assert got(d) == stats.paired_power(d, t["var_diff"], k, 0.05)
    welch = stats.power_function({k: v for k, v in t.items() if k != "paired"}, 0.05)
    assert welch(0.03) != pytest.approx(stats.paired_power(0.03, t["var_diff"], 4, 0.05), abs=0.05)
