"""The study's statistics (analysis.stats): Welch's t-test against SciPy, the sample sd,
and the words a comparison earns."""

from __future__ import annotations

import pytest
from scipy import stats as scipy_stats

from analysis import stats


@pytest.mark.parametrize("a,b", [([0.48, 0.47, 0.50], [0.24, 0.25, 0.23]), ([1.0, 2.0, 4.0, 3.5], [2.0, 2.1])])
def test_welch_matches_scipy(a, b):
    got = stats.welch(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert got["t"] == pytest.approx(ref.statistic) and got["p"] == pytest.approx(ref.pvalue)
    assert got["df"] == pytest.approx(ref.df)
    lo, hi = ref.confidence_interval(0.95)
    assert got["ci"] == pytest.approx([lo, hi])
    assert got["diff"] == pytest.approx(sum(a) / len(a) - sum(b) / len(b))


def test_welch_needs_two_seeds_a_side():
    assert stats.welch([0.5], [0.2, 0.3])["p"] is None


def test_welch_of_seeds_without_spread_has_no_p_and_a_point_interval():
    w = stats.welch([1.0, 1.0, 1.0], [0.5, 0.5])
    assert w["p"] is None and w["note"] == "no spread" and w["ci"] == [0.5, 0.5]


def test_mean_sd_is_the_sample_sd():
    assert stats.mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)
    assert stats.mean_sd([5.0]) == (5.0, 0.0)


@pytest.mark.parametrize("a,b,higher,word", [
    ([0.9, 0.92, 0.91], [0.5, 0.52, 0.49], True, "ahead of"),    # p ~ 1e-5
    ([0.5, 0.52, 0.49], [0.9, 0.92, 0.91], True, "behind"),
    ([0.9, 0.92, 0.91], [0.5, 0.52, 0.49], False, "behind"),     # a ratio: more is worse
    ([0.5, 0.9, 0.1], [0.55, 0.2, 0.8], True, "level with"),     # p ~ 0.9
    ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], True, "level with"),      # no spread, the same means
    ([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], True, "ahead of"),        # no spread, apart
    ([0.5], [0.1, 0.2], True, "untested against"),
])
def test_the_word_a_comparison_earns(a, b, higher, word):
    assert stats.verdict(stats.welch(a, b), higher_is_better=higher) == word


def test_the_word_follows_the_level_of_the_test():
    w = stats.welch([1.0, 1.2, 1.4], [0.8, 1.0, 1.1])  # p between 0.05 and 0.2
    assert 0.05 < w["p"] < 0.2
    assert stats.verdict(w) == "level with"
    assert stats.verdict(w, alpha=0.2) == "ahead of"


def test_welch_by_hand():
    """Welch's t-test of [1, 2, 3] against [4, 6] worked by hand: means 2 and 5, sample
    variances 1 and 2, so s²/n = 1/3 and 1, se = sqrt(4/3), t = -3 / se, and the
    Welch-Satterthwaite df = (4/3)² / ((1/3)²/2 + 1²/1) = 32/19; p and the interval
    from Student's t with that df (a 90% interval when asked for one)."""
    from scipy.stats import t as student

    w = stats.welch([1.0, 2.0, 3.0], [4.0, 6.0])
    se = (4 / 3) ** 0.5
    assert w["diff"] == pytest.approx(-3.0) and w["t"] == pytest.approx(-3.0 / se)
    assert w["df"] == pytest.approx(32 / 19)
    assert w["p"] == pytest.approx(2 * student.sf(3.0 / se, 32 / 19))
    half = student.ppf(0.975, 32 / 19) * se
    assert w["ci"] == pytest.approx([-3.0 - half, -3.0 + half])
    half90 = student.ppf(0.95, 32 / 19) * se
    assert stats.welch([1.0, 2.0, 3.0], [4.0, 6.0], level=0.9)["ci"] == pytest.approx([-3.0 - half90, -3.0 + half90])
    assert set(w) == {"diff", "t", "df", "p", "ci"}  # a test that ran has no note


@pytest.mark.parametrize("a,b,diff", [([0.5], [0.2, 0.3], 0.25), ([0.2, 0.3], [0.5], -0.25), ([0.7], [0.1], 0.6)])
def test_welch_with_one_seed_on_a_side_gives_the_difference_and_no_test(a, b, diff):
    """Fewer than two seeds on either side: the difference of the means and nothing else."""
    w = stats.welch(a, b)
    assert w == {"diff": pytest.approx(diff), "t": None, "df": None, "p": None, "ci": None,
                 "note": "needs at least 2 seeds on each side"}


def test_welch_of_seeds_without_spread_is_the_difference_alone():
    """Both sides without spread: the difference, a point interval, no t, df or p."""
    assert stats.welch([1.0, 1.0, 1.0], [0.5, 0.5]) == {"diff": 0.5, "t": None, "df": None, "p": None,
                                                      "ci": [0.5, 0.5], "note": "no spread"}


def test_mean_sd_of_two_values_and_of_equal_values():
    """The sample sd divides by n - 1: sqrt(2) for [1, 3]; equal values have sd 0."""
    m, sd = stats.mean_sd([1.0, 3.0])
    assert m == 2.0 and sd == pytest.approx(2**0.5)
    assert stats.mean_sd([2.0, 2.0, 2.0]) == (2.0, 0.0)


@pytest.mark.parametrize("test,higher,word", [
    ({"diff": 0.1, "p": 0.05}, True, "level with"),      # p at the level: not below it, no difference claimed
    ({"diff": 0.1, "p": 0.0499}, True, "ahead of"),
    ({"diff": 0.1, "p": 0.0499}, False, "behind"),
    ({"diff": -0.1, "p": 0.0499}, False, "ahead of"),     # less is better and it is less
    ({"diff": 0.3, "p": None}, True, "untested against"),  # no test and no note
    ({"diff": 0.3, "p": None, "note": "needs at least 2 seeds on each side"}, True, "untested against"),
    ({"diff": 0.3, "p": None, "note": "no spread"}, False, "behind"),
])
def test_the_word_of_a_given_test(test, higher, word):
    """``verdict`` on test results written by hand: the level is strict (p < alpha), the
    direction follows the sign of the difference and ``higher_is_better``."""
    assert stats.verdict(test, higher_is_better=higher) == word


@pytest.mark.parametrize("p,text", [(None, "—"), (0.5, "0.500"), (0.04567, "0.046"), (1.0, "1.000"),
                                    (0.001, "0.001"), (0.00099, "9.9e-04"), (2.34e-7, "2.3e-07")])
def test_format_p(p, text):
    """Three decimals from 0.001 up, two significant digits in e-notation below, a dash for no test."""
    assert stats.format_p(p) == text
