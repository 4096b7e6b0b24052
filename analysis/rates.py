"""The fairness profiles' figure: each scheme's validation perplexity at L against the learning
rate it was trained at (``profiles/fairness-lr<rate>/``, one seed a rate, 4x the default
steps), a line per scheme in its colour and marker (``analysis.style``), a panel per family,
each scheme's best rate filled. It reads ``analysis.findings.fairness``'s ``lm_best``
({scheme: {"rate", "by_rate": {rate: ppl}}}).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from .style import by_family, styles


def plot_rates(best: Mapping[str, Mapping], stem: str | Path, steps: int, default_rate: str | None = None) -> list[Path]:
    """Perplexity at L against the learning rate (log axis), a panel per family; ``steps`` the
    profiles' causal-LM steps (the title says them), ``default_rate`` the default study's rate
    (a dotted line)."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    names = list(best)
    if not names:  # no fairness profile has results: the figure says so
        fig, ax = plt.subplots(figsize=(6, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no fairness profile has results (python -m pipelines.profile fairness-lr<rate>)",
                ha="center", va="center")
        return save_figure(fig, stem)
    families = by_family(names)
    st = styles(names)
    cols = min(3, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False, sharex=True,
                             layout="constrained")
    rates = sorted({float(r) for b in best.values() for r in b["by_rate"]})
    for ax, (fam, members) in zip(axes.flat, families.items()):
        for s in members:
            by = best[s]["by_rate"]
            xs = sorted(by, key=float)
            kw = st[s].line_kws()
            ax.plot([float(r) for r in xs], [by[r] for r in xs], label=s, color=kw["color"], marker=st[s].marker,
                    markerfacecolor="white", lw=1.4)
            ax.plot([float(best[s]["rate"])], [by[best[s]["rate"]]], marker=st[s].marker, color=kw["color"], ls="none")
        if default_rate is not None:
            ax.axvline(float(default_rate), color="0.5", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xticks(rates, [f"{r:g}" for r in rates])
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
        ax.set_xlabel("learning rate")
    note = f"; dotted: the default study's rate {default_rate}" if default_rate is not None else ""
    fig.suptitle(f"Perplexity at L against the learning rate, {steps} causal-LM steps, one seed a rate "
                 f"(filled: each scheme's best rate{note})", fontsize=10)
    return save_figure(fig, stem, bbox_inches="tight")
