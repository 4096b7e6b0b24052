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
