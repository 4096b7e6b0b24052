"""The causal LM's table: perplexity at every evaluation length, the ratio ppl(kL) / ppl(L) at
every multiple k, and their tests, one family per quantity and length (``analysis.stats``).

* ``lm_table``: per scheme (a row; ``rope+pi`` is the scheme ``rope`` evaluated with a
  context-extension rule) its perplexity at every length and its ratios, per seed;
* ``compare_lm``: every scheme proper against the reference (``lm_table.reference`` in
  params.yaml) at every multiple, on the ratio (k > 1) and on the absolute perplexity at kL
  (k ≥ 1), each (quantity, k) a family of its own (Welch on the log scale, Holm over the
  schemes; ``tests``); every context-extension row against its own scheme's plain row, seed by
  seed (the same checkpoints, or each fine-tuned from its seed's run: paired tests; ``rule``);
  each scheme's place by its perplexity at the longest length, with its bootstrap interval
  (``place``);
* ``compare_pairs``: the pairs params.yaml names (``lm_table.pairs``: {group: "a:b c:d"}), each
  group a family per quantity and length;
* ``lm_markdown``: the Markdown of all of it (``figures/lm_table.md``), verdicts as their ids.

Quantities are keyed ``"ratio"`` and ``"ppl"``, multiples by their string ("16"), so that a
table just built and one read back from JSON look alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from .stats import against, compare, comparison_cells, family, mean_sd, rank_intervals, verdict_cell

QUANTITIES = ("ratio", "ppl")


def _cell(values: list[float], seeds: list[int]) -> dict:
    m, sd = mean_sd(values) if values else (None, None)
    return {"mean": m, "sd": sd, "n": len(values), "values": values, "seeds": seeds}


def lm_table(paths: Sequence[str | Path]) -> dict:
    """Per scheme: its L, seeds, and perplexity mean/sd/n with the per-seed values (seed order)
    at every evaluation length (``lengths``, keyed by the length); the ratio ppl(kL) / ppl(L)
    per seed at every multiple k > 1 of L (``ratios``, keyed by k); and ``ratio_longest``, the
    ratio at the longest length (its ``longest``). A seed without a finite value at L or kL
    gives no ratio there."""
    from posenc.evaluate import read_results

    df = read_results(paths)
    df = df[df["method"] == "nonoverlapping"]
    out = {}
    for scheme, sub in df.groupby("scheme"):
        L = int(sub["train_len"].iloc[0])
        lengths = {}
        for length, g in sub.groupby("eval_len"):
            g = g.sort_values("seed")
            keep = [(int(s), float(v)) for s, v in zip(g["seed"], g["ppl"]) if math.isfinite(v)]
            lengths[int(length)] = _cell([v for _, v in keep], [s for s, _ in keep])
        per_seed = {int(s): dict(zip(g["eval_len"].astype(int), g["ppl"].astype(float)))
                    for s, g in sub.groupby("seed")}
        ratios = {}
        for T in sorted(t for t in lengths if t > L and t % L == 0):
            keep = [(s, v[T] / v[L]) for s, v in sorted(per_seed.items())
                    if math.isfinite(v.get(T, math.nan)) and math.isfinite(v.get(L, math.nan))]
            ratios[str(T // L)] = _cell([r for _, r in keep], [s for s, _ in keep])
        top = max(lengths)
        longest = ratios.get(str(top // L)) if top > L else _cell([1.0] * lengths[L]["n"], lengths[L]["seeds"])
        longest = longest or _cell([], [])
        out[str(scheme)] = {"train_len": L, "seeds": sorted(int(s) for s in sub["seed"].unique()), "lengths": lengths,
                            "ratios": ratios, "ratio_longest": {"mean": longest["mean"], "sd": longest["sd"],
                                                                "n": longest["n"], "longest": top,
                                                                "values": longest["values"]}}
    return out


def at_length(entry: Mapping, length: int) -> dict:
    """A scheme's statistics at one evaluation length ({} if absent); the keys are ints
    when the table was just built and strings when it was read back from JSON."""
    return entry["lengths"].get(length) or entry["lengths"].get(str(length)) or {}


def seed_values(entry: Mapping, quantity: str, k: int | str) -> dict[int, float]:
    """{seed: value} of a row's ratio at multiple k, or of its perplexity at kL."""
    cell = (entry["ratios"].get(str(k)) if quantity == "ratio" else at_length(entry, int(k) * entry["train_len"])) or {}
    return dict(zip(cell.get("seeds") or [], cell.get("values") or []))


def multiples(table: Mapping, quantity: str) -> list[int]:
    """The multiples of L the table holds a quantity at: k > 1 for the ratio, every k for the
    perplexity."""
    out = set()
    for e in table.values():
        L = e["train_len"]
        out |= {int(k) for k in e["ratios"]} if quantity == "ratio" else {int(t) // L for t in e["lengths"]
                                                                          if int(t) % L == 0}
    return sorted(out)


def plain_scheme(name: str) -> str:
    """The scheme a row was trained as: ``rope`` for ``rope+pi`` and ``rope+pi+ft4L``."""
    return name.split("+")[0]


def _strip(table: Mapping) -> dict:
    return {s: {k: v for k, v in e.items() if k not in ("tests", "rule", "place")} for s, e in table.items()}


def compare_lm(table: Mapping, reference: str | None, margin: float | None = None) -> dict:
    """The table with its tests (see the module doc): ``tests`` {quantity: {k: test}} of every
    scheme proper of the reference's L against the reference, ``rule`` {quantity: {k: test}} of
    every context-extension row against its plain row (paired by seed), ``place`` of every
    scheme proper (of the reference's L, when there is one) by its perplexity at the longest length."""
    table = _strip(table)
    L = table[reference]["train_len"] if reference in table else None
    proper = [s for s in table if "+" not in s and table[s]["train_len"] == L]
    for q in QUANTITIES:
        for k in multiples(table, q):
            values = {s: list(seed_values(table[s], q, k).values()) for s in proper}
            for s, t in against({s: v for s, v in values.items() if v}, reference, "log", margin,
                                higher_is_better=False).items():
                table[s].setdefault("tests", {}).setdefault(q, {})[str(k)] = t
    rows = [r for r in table if "+" in r and plain_scheme(r) in table
            and table[r]["train_len"] == table[plain_scheme(r)]["train_len"]]
    for q in QUANTITIES:
        for k in multiples(table, q):
            tests = {}
            for r in rows:
                mine, plain = seed_values(table[r], q, k), seed_values(table[plain_scheme(r)], q, k)
                seeds = sorted(set(mine) & set(plain))
                if seeds:
                    tests[r] = compare([mine[s] for s in seeds], [plain[s] for s in seeds], "log", margin,
                                       paired=True) | {"against": plain_scheme(r)}
            for r, t in family(tests, higher_is_better=False).items():
                table[r].setdefault("rule", {}).setdefault(q, {})[str(k)] = t
    _place(table, proper if L is not None else [s for s in table if "+" not in s])
    return table


def _place(table: dict, schemes: Sequence[str]) -> None:
    """Each scheme's place by its perplexity at the longest length (1: the lowest), with its 95%
    bootstrap interval over seeds (``analysis.stats.rank_intervals``)."""
    top = max((max(int(t) for t in table[s]["lengths"]) for s in schemes), default=None)
    samples = {s: at_length(table[s], top).get("values") or [] for s in schemes}
    for s, r in rank_intervals({s: v for s, v in samples.items() if v}, higher_is_better=False).items():
        table[s]["place"] = {"place": r["place"], "lo": r["lo"], "hi": r["hi"], "length": top}


def parse_pairs(groups: Mapping[str, str] | None) -> dict[str, list[tuple[str, str]]]:
    """params.yaml's ``lm_table.pairs`` ({group: "a:b c:d"}) as {group: [(a, b), ...]}; refuses a
    pair that is not two names joined by a colon."""
    out = {}
    for group, text in (groups or {}).items():
        pairs = []
        for item in str(text).split():
            a, sep, b = item.partition(":")
            if not sep or not a or not b or a == b:
                raise ValueError(f"lm_table.pairs.{group}: {item!r} is not a pair of two schemes 'a:b'")
            pairs.append((a, b))
        out[str(group)] = pairs
    return out


def compare_pairs(table: Mapping, groups: Mapping[str, Sequence[tuple[str, str]]], margin: float | None) -> dict:
    """Each group of pairs (``parse_pairs``) tested at every multiple on both quantities, each
    (group, quantity, k) a family (Welch, log scale, lower is better): {group: {"a:b": {"a", "b",
    "ratio": {k: test}, "ppl": {k: test}}}}; a pair with a side the table lacks is left out."""
    out: dict = {}
    for group, pairs in groups.items():
        present = [(a, b) for a, b in pairs if a in table and b in table
                   and table[a]["train_len"] == table[b]["train_len"]]
        out[group] = {f"{a}:{b}": {"a": a, "b": b} for a, b in present}
        for q in QUANTITIES:
            for k in multiples(table, q):
                tests = {}
                for a, b in present:
                    x, y = list(seed_values(table[a], q, k).values()), list(seed_values(table[b], q, k).values())
                    if x and y:
                        tests[f"{a}:{b}"] = compare(x, y, "log", margin) | {"against": b}
                for key, t in family(tests, higher_is_better=False).items():
                    out[group][key].setdefault(q, {})[str(k)] = t
    return out


# ------------------------------------------------------------------ Markdown
def _label(k: int) -> str:
    return "L" if k == 1 else f"{k}L"


def _pm(cell: Mapping | None) -> str:
    return "n/a" if not cell or cell.get("mean") is None else f"{cell['mean']:.2f} ± {cell['sd']:.2f}"


def _short(t: Mapping | None) -> str:
    """A comparison in a grid cell: the factor and the verdict id ("×1.32 behind")."""
    return "—" if not t else f"×{t['diff']:.2f} {verdict_cell(t)}"


def _absolute(table: Mapping) -> list[str]:
    lengths = sorted({int(t) for e in table.values() for t in e["lengths"]})
    L = min(e["train_len"] for e in table.values())
    head = " | ".join(f"{t} ({_label(t // L)})" if t % L == 0 else str(t) for t in lengths)
    top = next((e["place"]["length"] for e in table.values() if "place" in e), None)
    place = f" place by ppl({_label(top // L)}) (95% interval) |" if top else ""
    lines = [f"| scheme | {head} | seeds |{place}", "| --- |" + " ---: |" * (len(lengths) + 1) + " ---: |" * bool(top)]

    def key(s):
        cell = at_length(table[s], lengths[-1])
        return (cell.get("mean") is None, cell.get("mean") or 0, s)

    for s in sorted(table, key=key):
        e = table[s]
        row = f"| `{s}` | {' | '.join(_pm(at_length(e, t)) for t in lengths)} | {len(e['seeds'])} |"
        if top:
            p = e.get("place")
            row += f" {p['place']} ({p['lo']}–{p['hi']}) |" if p else " — |"
        lines.append(row)
    return lines


def _grid(table: Mapping, quantity: str, reference: str) -> list[str]:
    ks = multiples(table, quantity)
    what = "ppl(kL) / ppl(L), mean ± sd, and its factor over" if quantity == "ratio" else "ppl(kL) over"
    lines = ["", f"{what} `{reference}`'s with the verdict (a family per length):", "",
             "| scheme | " + " | ".join(_label(k) for k in ks) + " |", "| --- |" + " --- |" * len(ks)]
    for s, e in table.items():
        if "tests" not in e:
            continue
        cells = []
        for k in ks:
            t = e["tests"].get(quantity, {}).get(str(k))
            value = e["ratios"].get(str(k)) if quantity == "ratio" else None
            cells.append((f"{value['mean']:.2f}; " if value and value.get("mean") is not None else "") + _short(t))
        lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return lines


def _detail(rows: Sequence[tuple[str, str, Mapping]], first: str) -> list[str]:
    head = (f"| {first} | against | at | ratio's factor (95% CI) | p | Holm p | verdict | "
            "ppl(kL)'s factor (95% CI) | p | Holm p | verdict |")
    lines = ["", head, "| --- | --- | --- |" + " ---: | ---: | ---: | --- |" * 2]
    for name, against_, tests in rows:
        for k in sorted({int(k) for q in QUANTITIES for k in tests.get(q, {})}):
            cells = [*comparison_cells(tests.get("ratio", {}).get(str(k))), *comparison_cells(tests.get("ppl", {}).get(str(k)))]
            lines.append(f"| `{name}` | `{against_}` | {_label(k)} | " + " | ".join(cells) + " |")
    return lines


def lm_markdown(table: Mapping, reference: str | None = None, pairs: Mapping | None = None) -> str:
    """The LM table's Markdown (see the module doc): perplexity by length with each scheme's
    place; with a reference, the grids of both quantities' verdicts by length and every test in
    full; the context-extension rows against their plain rows; the named pairs."""
    lines = _absolute(table)
    if reference and any("tests" in e for e in table.values()):
        lines += _grid(table, "ratio", reference) + _grid(table, "ppl", reference)
        lines += ["", f"Every test against `{reference}` (Welch's test of the logarithms, Holm over the schemes at "
                  "each length):"]
        lines += _detail([(s, reference, e["tests"]) for s, e in table.items() if "tests" in e], "scheme")
    rules = [(s, plain_scheme(s), e["rule"]) for s, e in sorted(table.items()) if "rule" in e]
    if rules:
        lines += ["", "Context-extension rows against their own scheme's plain row, seed by seed (paired tests; "
                  "a family per quantity and length):"]
        lines += _detail(rules, "row")
    for group, found in (pairs or {}).items():
        if found:
            lines += ["", f"Pairs `{group}` (params.yaml's `lm_table.pairs`; a family per quantity and length):"]
            lines += _detail([(p["a"], p["b"], p) for p in found.values()], "scheme")
    return "\n".join(lines) + "\n"
