"""The words and numbers the report prints: a comparison's verdict in words ("behind
`alibi`, within ±5%") and its numbers ("×1.91, Holm p = 0.027"), lists of names, and the
formats of means, spreads, shares and durations. Every verdict here was decided by
``analysis.stats`` (``word``, ``family``); these functions only spell it. The report's
templates call them by name (``pipelines.report.HELPERS``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from analysis import stats

__all__ = ["said", "detail", "grouped", "names", "num", "signed", "pct", "pm", "minutes", "at", "mean", "numeric", "shared_rate", "verdict_counts", "ranked", "setting"]

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


def setting(overrides: str, key: str) -> str:
    """The value a string of Hydra overrides gives ``key`` (``data.eval_batch_size=640`` -> "640"),
    or "?" when it gives none."""
    return next((o.split("=", 1)[1] for o in str(overrides).split() if o.split("=", 1)[0] == key), "?")
