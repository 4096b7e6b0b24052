"""The fairness and budget profiles' figures. ``plot_rates``: each scheme's validation perplexity
at L against the learning rate it was trained at (``profiles/fairness-lr<rate>/``, one seed a rate, 4x the default
steps), a line per scheme in its colour and marker (``analysis.style``), a panel per family,
each scheme's best rate filled, from ``analysis.findings.fairness``'s ``lm_best``
({scheme: {"rate", "by_rate": {rate: ppl}}}). ``plot_budget``: the same against the steps at one
rate (``profiles/budget-steps<n>/`` beside the fairness profile at that rate), each scheme's
converged budget filled, from ``analysis.findings.budget``. ``plot_order``: the budget criterion
of record, Kendall's τ between the orders at S and 2S steps against S, with its threshold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from .style import by_family, styles


def plot_rates(best: Mapping[str, Mapping], stem: str | Path, steps: int, default_rate: str | None = None,
               seeds: Mapping[str, int] | None = None) -> list[Path]:
    """Perplexity at L against the learning rate (log axis), a panel per family; ``steps`` the
    profiles' causal-LM steps (the title says them), ``default_rate`` the default study's rate
    (a dotted line), ``seeds`` {rate: the seeds averaged there} (the title says which have more than one)."""
    note = f"; dotted: the default study's rate {default_rate}" if default_rate is not None else ""
    more = sorted((r for r, n in (seeds or {}).items() if n > 1), key=float)
    told = (f"the mean of {max(seeds[r] for r in more)} seeds at {', '.join(more)}, one seed elsewhere" if more
            else "one seed a rate")
    return _curves({s: b["by_rate"] for s, b in best.items()}, {s: b["rate"] for s, b in best.items()}, stem,
                   "learning rate", None if default_rate is None else float(default_rate),
                   f"Perplexity at L against the learning rate, {steps} causal-LM steps, {told} "
                   f"(filled: each scheme's best rate{note})",
                   "no fairness profile has results (python -m pipelines.profile fairness-lr<rate>)")


def plot_budget(curve: Mapping, stem: str | Path, rate: str | None, default_steps: int | None = None) -> list[Path]:
    """Perplexity at L against the causal-LM steps (log axis), a panel per family, from
    ``analysis.findings.budget``'s ``lm`` block: filled, the budget each scheme has converged at
    (doubling it improves its perplexity by less than the criterion); ``default_steps`` the
    default study's (a dotted line)."""
    lm = curve.get("lm", {}) if curve else {}
    crit = f"{100 * curve['criterion']:g}%" if curve else ""
    return _curves(lm.get("by_steps", {}), {s: n for s, n in lm.get("converged", {}).items() if n is not None}, stem,
                   "causal-LM steps", default_steps,
                   f"Perplexity at L against the steps, learning rate {rate}, one seed a budget (filled: the first "
                   f"budget whose doubling improves it by less than {crit}; dotted: the default study's steps)",
                   "no budget profile has results (python -m pipelines.profile budget-steps<n>)")


def plot_order(curve: Mapping, stem: str | Path, rate: str | None, top: int) -> list[Path]:
    """Kendall's τ between the schemes' orders at S and at 2S steps, against S (log axis), from
    ``analysis.findings.budget``: the ratio ppl(``top`` L) / ppl(L) (the criterion of record, its
    threshold a dashed line and the budget it picks filled), perplexity at L and masked-LM
    accuracy beside it."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    fig, ax = plt.subplots(figsize=(5.2, 3.2), layout="constrained")
    order = (curve or {}).get("order") or {}
    if not order.get("tau"):
        ax.axis("off")
        ax.text(0.5, 0.5, "no budget doubles another (python -m pipelines.profile budget-steps<n>)",
                ha="center", va="center")
        return save_figure(fig, stem)
    lines = ((f"ppl({top}L) / ppl(L): the criterion", curve["ratio_tau"], "C0", "o"),
             ("causal LM: ppl at L", curve["lm"]["tau"], "C1", "s"),
             ("masked LM: accuracy", curve["mlm"]["tau"], "C2", "^"))
    xs = sorted(order["tau"])
    for label, taus, color, marker in lines:
        pts = [(n, (taus.get(n) or {}).get("tau")) for n in xs]
        pts = [(n, t) for n, t in pts if t is not None]
        ax.plot([n for n, _ in pts], [t for _, t in pts], marker=marker, color=color, markerfacecolor="white",
                label=label, lw=1.4)
    ax.axhline(order["criterion"], color="0.4", ls="--", lw=1)
    if order.get("at") is not None:
        ax.plot([order["at"]], [order["tau"][order["at"]]], marker="o", color="C0", ls="none", ms=8)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{n}→{2 * n}" for n in xs])
    ax.minorticks_off()
    ax.set_ylim(min(-0.05, ax.get_ylim()[0]), 1.05)
    ax.set_xlabel("doubling the causal-LM steps (S → 2S)")
    ax.set_ylabel("Kendall's τ, order at S vs 2S")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    picked = f"; filled: {order['at']} steps, the first that meets it" if order.get("at") is not None else ""
    ax.set_title(f"Does doubling the steps reorder the schemes? Learning rate {rate}, one seed a budget\n"
                 f"(dashed: the criterion τ ≥ {order['criterion']:g}{picked})", fontsize=9)
    return save_figure(fig, stem, bbox_inches="tight")


def _curves(curves: Mapping[str, Mapping], marked: Mapping[str, object], stem: str | Path, xlabel: str,
            vline: float | None, title: str, empty: str) -> list[Path]:
    """Validation perplexity at L against ``xlabel`` (log axis): ``curves`` {scheme: {x: ppl}} (x
    a number or its text), a line per scheme in its colour and marker, a panel per family, the
    point at ``marked[scheme]`` filled, a dotted line at ``vline``; without curves, ``empty``."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    names = list(curves)
    if not names:  # no profile has results: the figure says so
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, empty, ha="center", va="center")
        return save_figure(fig, stem)
    families = by_family(names)
    st = styles(names)
    cols = min(3, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, sharex=True,
                             layout="constrained")
    xs_all = sorted({float(x) for c in curves.values() for x in c} | ({float(vline)} if vline is not None else set()))
    for ax, (fam, members) in zip(axes.flat, families.items()):
        for s in members:
            by = curves[s]
            xs = sorted(by, key=float)
            kw = st[s].line_kws()
            ax.plot([float(x) for x in xs], [by[x] for x in xs], label=s, color=kw["color"], marker=st[s].marker,
                    markerfacecolor="white", lw=1.4)
            if marked.get(s) in by:
                ax.plot([float(marked[s])], [by[marked[s]]], marker=st[s].marker, color=kw["color"], ls="none")
        if vline is not None:
            ax.axvline(float(vline), color="0.5", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xticks(xs_all, [f"{x:g}" for x in xs_all])
        ax.tick_params(labelbottom=True)  # a panel with no visible panel under it keeps its labels
        ax.minorticks_off()
        ax.set_title(fam, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    for ax in axes.flat[len(families):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("validation ppl at L")
    for ax in axes[-1, :]:
        ax.set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, stem, bbox_inches="tight")
