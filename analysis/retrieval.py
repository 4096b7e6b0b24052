"""Retrieval beyond perplexity: the tables and figures of the exact-match grids
(``posenc.retrieval``) and of how far each scheme attends (``analysis.reach``).

* ``by_length``: per scheme and length, exact match and per-digit accuracy as the
  mean over depths (and seeds) of the cells, with the mean of the cells' 95%
  Wilson bounds as its interval. Cells are not pooled by their trial counts:
  a cell near 50% scores more trials (``evaluate_grid``), and pooling would
  weight the depths unequally. The mean of the bounds is conservative: it is at
  least as wide as an interval for the mean of independent cells needs.
* ``plot_grid``: the familiar needle picture, a length x depth heatmap per scheme.
* ``plot_curves``: exact match against length beside the perplexity ratio
  ppl(T) / ppl(L) of the same schemes' causal-LM runs.
* ``plot_reach``: mean attention distance and entropy against length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .style import order, styles


def read(files: Sequence[str | Path]) -> pd.DataFrame:
    df = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    return df[df["trials"] > 0]  # not-applicable lengths (a learned table past L) have no trials


def by_length(df: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, multiple): exact match, its interval and per-digit accuracy (see the module doc)."""
    g = df.groupby(["scheme", "length", "multiple"], as_index=False).agg(
        exact_match=("exact_match", "mean"), exact_lo=("exact_lo", "mean"), exact_hi=("exact_hi", "mean"),
        digit_acc=("digit_acc", "mean"), trials=("trials", "sum"), seeds=("seed", "nunique"))
    return g.sort_values(["scheme", "length"], ignore_index=True)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def table_markdown(df: pd.DataFrame) -> str:
    """Exact match (%) by length with its interval, then per-digit accuracy at L and 16L."""
    t = by_length(df)
    mults = sorted(t["multiple"].unique())
    names = order(t["scheme"].unique())
    head = ["scheme", *[f"{m}L" if m > 1 else "L" for m in mults], "digits at L", f"digits at {mults[-1]}L", "seeds"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for s in names:
        rows = t[t["scheme"] == s].set_index("multiple")
        cells = [("n/a" if m not in rows.index else
                  f"{_pct(rows.at[m, 'exact_match'])} [{_pct(rows.at[m, 'exact_lo'])}, {_pct(rows.at[m, 'exact_hi'])}]")
                 for m in mults]
        digits = [("n/a" if m not in rows.index else _pct(rows.at[m, "digit_acc"])) for m in (mults[0], mults[-1])]
        lines.append(f"| `{s}` | " + " | ".join(cells + digits) + f" | {int(rows['seeds'].max())} |")
    return "\n".join(lines) + "\n"


def _heat(ax, cells: pd.DataFrame, mults: list[int], depths: list[float], title: str, cmap) -> object:
    grid = np.full((len(depths), len(mults)), np.nan)
    for (m, d), v in cells.groupby(["multiple", "depth"])["exact_match"].mean().items():
        grid[depths.index(d), mults.index(m)] = v
    im = ax.imshow(100 * grid, vmin=0, vmax=100, cmap=cmap, aspect="auto")
    for i in range(len(depths)):
        for j in range(len(mults)):
            v = grid[i, j]
            txt = "n/a" if math.isnan(v) else f"{100 * v:.0f}"
            ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                    color="white" if not math.isnan(v) and v < 0.5 else "black")
    ax.set_xticks(range(len(mults)), [f"{m}L" if m > 1 else "L" for m in mults], fontsize=7)
    ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
    ax.set_title(title, fontsize=9)
    return im


def plot_grid(df: pd.DataFrame, stem: str | Path) -> list[Path]:
    """One panel per scheme: needle depth (rows) x evaluation length (columns), exact match in %."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from posenc.files import save_figure

    names = order(df["scheme"].unique())
    mults = sorted(df["multiple"].unique())
    depths = sorted(df["depth"].unique())
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.1 * rows + 0.6), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    cmap = sns.color_palette("rocket", as_cmap=True)
    im = None
    for ax, s in zip(axes.flat, names):
        im = _heat(ax, df[df["scheme"] == s], mults, depths, s, cmap)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("needle depth", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("evaluation length", fontsize=8)
    L = int(df["train_len"].iloc[0])
    fig.colorbar(im, ax=axes, shrink=0.6, label="exact match (%)")
    fig.suptitle(f"Passkey retrieval: exact match by needle depth and length (trained at L = {L})", fontsize=11)
    return save_figure(fig, stem)


def plot_curves(df: pd.DataFrame, extrapolation: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Left: ppl(T) / ppl(L) of the causal-LM runs (mean over seeds); right: exact match
    against length (mean over depths, with the interval of ``by_length``)."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    t = by_length(df)
    ex = extrapolation[extrapolation["method"] == "nonoverlapping"].dropna(subset=["ppl"]).copy()
    at_l = ex[ex["eval_len"] == ex["train_len"]].set_index(["scheme", "seed"])["ppl"]
    ex["ratio"] = ex["ppl"] / [at_l.get((s, seed), np.nan) for s, seed in zip(ex["scheme"], ex["seed"])]
    ratio = ex.groupby(["scheme", "eval_len"], as_index=False)["ratio"].mean()
    names = order(set(t["scheme"]) | set(ratio["scheme"]))
    st = styles(names)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    for s in names:
        kw = st[s].line_kws()
        r = ratio[ratio["scheme"] == s]
        if len(r):
            a1.plot(r["eval_len"], r["ratio"], label=s, markersize=4, **kw)
        c = t[t["scheme"] == s]
        if len(c):
            a2.plot(c["length"], 100 * c["exact_match"], label=s, markersize=4, **kw)
            a2.fill_between(c["length"], 100 * c["exact_lo"], 100 * c["exact_hi"], color=kw["color"], alpha=0.12,
                            linewidth=0)
    L = int(t["length"].min())
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.axvline(L, color="0.6", linewidth=0.8, linestyle=":")
        ax.set_xlabel("evaluation length T (tokens, log scale)")
        ax.grid(True, alpha=0.3)
    a1.set_yscale("log")
    a1.set_ylabel("ppl(T) / ppl(L), mean over seeds (log scale)")
    a1.set_title("Language modelling: perplexity ratio")
    a2.set_ylim(-3, 103)
    a2.set_ylabel("exact match (%), mean over needle depths")
    a2.set_title("Retrieval: passkeys retrieved exactly")
    a2.legend(fontsize=7, ncol=2, loc="upper right")
    fig.suptitle("Flat perplexity is not retrieval: the same schemes in both views (dotted: training length L)")
    return save_figure(fig, stem)


def plot_reach(summary: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Mean attention distance and entropy (mean over layers, heads and seeds) against
    length, with uniform causal attention as the reference (dashed black)."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    names = order(summary["scheme"].unique())
    st = styles(names)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.2), layout="constrained")
    ref = summary.drop_duplicates("length").sort_values("length")
    for ax, col, label in ((a1, "distance", "mean attention distance (tokens, log scale)"),
                           (a2, "entropy", "attention entropy (nats)")):
        ax.plot(ref["length"], ref[f"uniform_{col}"], color="black", linestyle="--", linewidth=1,
                label="uniform causal attention")
        for s in names:
            c = summary[summary["scheme"] == s]
            ax.plot(c["length"], c[col], label=s, markersize=4, **st[s].line_kws())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length T (tokens, log scale)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    a1.set_yscale("log", base=2)
    a1.set_title("How far back the causal-LM runs attend")
    a2.set_title("How spread their attention is")
    a2.legend(fontsize=7, ncol=2, loc="upper left")
    fig.suptitle("Attention distance and entropy against length (mean over layers, heads and seeds)")
    return save_figure(fig, stem)


def reach_markdown(summary: pd.DataFrame) -> str:
    """Mean attention distance (tokens) and entropy (nats) of every scheme at every length."""
    mults = sorted(summary["multiple"].unique())
    labels = [f"{m}L" if m > 1 else "L" for m in mults]
    head = ["scheme", *[f"distance {x}" for x in labels], *[f"entropy {x}" for x in labels]]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    ref = summary.drop_duplicates("multiple").set_index("multiple")
    lines.append("| uniform causal | " + " | ".join([f"{ref.at[m, 'uniform_distance']:.1f}" for m in mults]
                                                  + [f"{ref.at[m, 'uniform_entropy']:.2f}" for m in mults]) + " |")
    for s in order(summary["scheme"].unique()):
        r = summary[summary["scheme"] == s].set_index("multiple")
        cells = [f"{r.at[m, 'distance']:.1f}" if m in r.index else "n/a" for m in mults]
        cells += [f"{r.at[m, 'entropy']:.2f}" if m in r.index else "n/a" for m in mults]
        lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
