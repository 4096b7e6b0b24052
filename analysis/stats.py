"""The statistics every table and sentence of the study uses: mean and sample standard
deviation over seeds, Welch's t-test of two schemes' seeds, and the word that a
comparison earns from that test.

Welch's t-test (unequal variances): t = (m_a - m_b) / sqrt(s_a²/n_a + s_b²/n_b),
degrees of freedom by Welch-Satterthwaite, two-sided p-value and a 95% confidence
interval of the difference m_a - m_b. Checked against
``scipy.stats.ttest_ind(equal_var=False)`` in ``tests/test_stats.py``.

``verdict`` turns a test into words, so that no sentence can claim a difference the
seeds do not support: "ahead of" or "behind" only when p < ``alpha`` (5%), "level
with" otherwise. Two schemes whose seeds do not vary at all (every retrieval seed at
100%) are level when their means are equal and apart when they differ; with fewer
than two seeds a side there is no test, and the word says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: the two-sided level below which a difference is called one
ALPHA = 0.05

AHEAD, LEVEL, BEHIND, UNTESTED = "ahead of", "level with", "behind", "untested against"


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    m = sum(values) / n
    return m, (math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0)


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict:
    """Welch's t-test of mean(a) - mean(b): t, df, two-sided p and the confidence interval."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return {"diff": mean_sd(a)[0] - mean_sd(b)[0], "t": None, "df": None, "p": None, "ci": None,
                "note": "needs at least 2 seeds on each side"}
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    va, vb = sa**2 / len(a), sb**2 / len(b)
    diff, se = ma - mb, math.sqrt(va + vb)
    if se == 0:
        return {"diff": diff, "t": None, "df": None, "p": None, "ci": [diff, diff], "note": "no spread"}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = diff / se
    p = 2 * stats.t.sf(abs(t), df)
    half = stats.t.ppf(0.5 + level / 2, df) * se
    return {"diff": diff, "t": t, "df": df, "p": float(p), "ci": [diff - half, diff + half]}


def verdict(test: dict, higher_is_better: bool = True, alpha: float = ALPHA) -> str:
    """How a scheme stands against another, from ``welch(a, b)`` of the first against the
    second: ``AHEAD`` ("ahead of"), ``LEVEL`` ("level with"), ``BEHIND`` ("behind") or
    ``UNTESTED`` (fewer than 2 seeds a side). ``higher_is_better=False`` for a quantity
    where less is better (a perplexity ratio, steps to a criterion)."""
    diff, p = test["diff"], test["p"]
    if p is None:
        if test.get("note") != "no spread":
            return UNTESTED
        apart = diff != 0  # seeds without spread on both sides: the means are the whole story
    else:
        apart = p < alpha
    if not apart:
        return LEVEL
    return AHEAD if (diff > 0) == higher_is_better else BEHIND


def format_p(p: float | None) -> str:
    """A p-value as the tables print it: three decimals, or two significant digits below 0.001."""
    return "—" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")
