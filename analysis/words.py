"""The words the report prints: the one table that says each verdict id in words (``VERDICTS``,
``CLAIMS``), a comparison's verdict with its numbers ("behind `alibi`, within ±5%"; "×1.91,
Holm p = 0.027"), the reason a claim departs from its paper, lists of names, and the formats
of numbers. Every verdict was decided by a summary stage and stored as an id; nothing here
computes a statistic, so rewording a verdict re-runs the report alone (this module is a
dependency of the report stage only). The report's templates call these functions by name
(``pipelines.report``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from analysis.stats import format_p, shown_diff, shown_margin

#: each verdict id of ``analysis.stats``: (with the reference named, alone)
VERDICTS = {"ahead": ("ahead of", "ahead"), "behind": ("behind", "behind"),
            "equivalent": ("equivalent to", "equivalent"), "undecided": ("undecided against", "undecided"),
            "untested": ("untested against", "untested")}
#: each claim verdict id of ``analysis.papers``: (singular, plural)
CLAIMS = {"agrees": ("agrees", "agree"), "disagrees": ("disagrees", "disagree"), "in_part": ("in part", "in part"),
          "agrees_where_decided": ("agrees where decided", "agree where decided"),
          "disagrees_where_decided": ("disagrees where decided", "disagree where decided"),
          "undecided": ("undecided", "undecided"), "untested": ("untested", "untested")}

__all__ = ["said", "detail", "grouped", "names", "num", "signed", "pct", "pm", "minutes", "at", "numeric",
           "claim", "claim_counts", "reason", "setting", "detectable", "diff", "margin", "p",
           "verdict_word", "label"]


def verdict_word(v: str, reference: bool = False) -> str:
    """A verdict id in words: with a reference to follow ("ahead of") or alone ("ahead")."""
    return VERDICTS[v][0 if reference else 1]


def said(t: Mapping | None, reference: bool = True) -> str:
    """A comparison's verdict in words: "behind `alibi`", "behind `alibi`, within ±5%",
    "equivalent to `none` within ±10.0 pt", "undecided against `alibi`", "untested against
    `none`"; ``reference=False`` gives the words alone ("ahead", "equivalent within ±5%");
    ``detail`` gives the numbers."""
    if not t:
        return "untested"
    v = t["verdict"]
    w = f"{verdict_word(v, True)} `{t['against']}`" if reference and t.get("against") else verdict_word(v)
    if v in ("ahead", "behind"):
        return w + (f", within {shown_margin(t)}" if t.get("within_margin") else "")
    if v == "equivalent":
        return f"{w} within {shown_margin(t)}"
    return w


def detectable(t: Mapping) -> str:
    """What an undecided test could have detected, as a clause: "it detects only a factor beyond
    ×1.700", "it detects only a gap above 29 pt", "no gap within the possible range is
    detectable", or "there is no test"."""
    d = t.get("detectable")
    if d is None:
        return "there is no test"
    if t["scale"] != "log" and d >= 1:
        return "no gap within the possible range is detectable"
    return "it detects only " + (f"a factor beyond ×{d:.3f}" if t["scale"] == "log" else f"a gap above {100 * d:.0f} pt")


def detail(t: Mapping | None) -> str:
    """A comparison's numbers: "×1.91, Holm p = 0.027" (", paired" for a paired test); an
    undecided one adds what its test could detect, one without a test why."""
    if not t:
        return "no test"
    if t.get("p") is None:
        return f"{shown_diff(t)}; {t.get('note', 'no test')}"
    out = f"{shown_diff(t)}, {'paired, ' if t.get('paired') else ''}Holm p = {format_p(t['p_adj'])}"
    return out + (f"; {detectable(t)}" if t["verdict"] == "undecided" else "")


def grouped(tests: Mapping[str, Mapping]) -> dict[str, list[str]]:
    """The schemes of a family by the verdict id their comparison earned, in the order given."""
    out: dict[str, list[str]] = {v: [] for v in VERDICTS}
    for s, t in tests.items():
        out[t["verdict"]].append(s)
    return out


def diff(t: Mapping) -> str:
    """A comparison's difference: ×1.234 or +12.3 pt."""
    return shown_diff(t)


def margin(t: Mapping) -> str:
    return shown_margin(t)


def p(x: float | None) -> str:
    return format_p(x)


def label(k) -> str:
    """A multiple of L as the tables name it: "L", "16L"."""
    return "L" if int(k) == 1 else f"{int(k)}L"


def claim(v: str, plural: bool = False) -> str:
    """A claim's verdict id in words ("agrees where decided")."""
    return CLAIMS[v][1 if plural else 0]


def claim_counts(counts: Mapping[str, int]) -> str:
    """How many claims earn each verdict, in words: "5 agree, 1 disagrees, 2 agree where decided"."""
    return ", ".join(f"{n} {claim(v, n != 1)}" for v, n in counts.items())


def reason(r: Mapping | None) -> str:
    """A claim's reason (``analysis.papers.reason``) in words."""
    if not r:
        return ""
    parts = []
    if r.get("against"):
        parts.append("it does not hold against " + ", ".join(f"`{s}`" for s in r["against"]))
    if r.get("undecided"):
        parts.append("undecided against " + ", ".join(f"`{s}`" for s in r["undecided"]))
    c = r.get("control")
    if c and c["kind"] == "agrees":
        parts.append(f"the control agrees with the paper: {c['label']}")
    elif c and c["kind"] == "undecided":
        moved = (f"; the setting moves {', '.join(f'`{s}`' for s in c['moved'])}'s ratio (decided), "
                 f"{'and not' if c['unmoved'] else 'and'} {', '.join(f'`{s}`' for s in c['unmoved']) or 'the other'}'s"
                 if c["moved"] else "")
        parts.append(f"possibly the setting the control changes: {c['label']}, the difference is no longer decided, "
                     f"though the control does not show the paper's finding either{moved}")
    elif c:
        too = ", though by a difference within the margin" if c.get("within_margin") else ""
        parts.append("unexplained" + (f" (the control {c['label']} disagrees too{too})" if c.get("label") else ""))
    return "; ".join(parts)


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


def pm(cell: Mapping | None, digits: int = 2, scale: float = 1.0) -> str:
    """A stored mean ± sample sd (``{"mean", "sd", "n"}``; the mean alone for one seed), "—"
    without a mean."""
    if not cell or cell.get("mean") is None:
        return "—"
    out = f"{scale * cell['mean']:.{digits}f}"
    return out + (f" ± {scale * cell['sd']:.{digits}f}" if cell.get("n", 2) > 1 else "")


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def at(lengths: Mapping, key) -> dict:
    """An entry of a table keyed by length or multiple, which JSON turned into strings."""
    return lengths[str(key)]


def numeric(keys) -> list[str]:
    """Keys that spell numbers ("1e-3", "3e-3", "1e-2"), in the order of their values."""
    return sorted(keys, key=float)


def setting(overrides: str, key: str) -> str:
    """The value a string of Hydra overrides gives ``key`` (``data.eval_batch_size=640`` -> "640"),
    or "?" when it gives none."""
    return next((o.split("=", 1)[1] for o in str(overrides).split() if o.split("=", 1)[0] == key), "?")
