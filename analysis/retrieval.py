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


def read_csvs(files: Sequence[str | Path]) -> pd.DataFrame:
    """The rows of every file in one frame; a file with a header alone (a scheme
    without such runs) adds nothing (and does not turn the columns into objects)."""
    frames = [f for f in (pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in files) if len(f)]
    if not frames:
        raise ValueError(f"no rows in any of {len(files)} files ({', '.join(map(str, files[:3]))}, ...)")
    return pd.concat(frames, ignore_index=True)


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
    return save_figure(fig, stem, bbox_inches="tight")


def _family_figure(names: Sequence[str], rows: Sequence[dict], lengths: Sequence[int], L: int, title: str,
                   notes: Sequence[str] = ()):
    """Small multiples by family, as the extrapolation figure draws them: one column
    per family present (NoPE, when drawn, is the grey dotted reference in every
    panel), one row per entry of ``rows`` ({"ylabel", "draw": f(ax, scheme, style,
    rank, reference), "finish": f(ax) or None}), the evaluation length on a log2 x
    axis with the training length L marked, and a legend per column under the panels.
    A row with ``"log": True`` gets a log y axis with readable ticks (``log_axis``)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    from .extrapolation import REFERENCE, legend_handle, log_axis
    from .style import FAMILY_TITLES, by_family

    families = by_family(names)
    ref = REFERENCE if REFERENCE in names else None
    columns = [f for f in families if f != "none" or len(families) == 1]
    members = {f: [s for s in families[f] if s != REFERENCE or f == "none"] for f in columns}
    st = styles(names)
    n_legend = max(len(m) + (ref is not None and f != "none") for f, m in members.items())
    heights = [3.0] * len(rows) + [0.75, 0.05 + 0.22 * math.ceil(n_legend / 2)]
    fig = plt.figure(figsize=(0.6 + 3.9 * len(columns), sum(heights) + 1.2))
    gs = fig.add_gridspec(len(heights), len(columns), height_ratios=heights, hspace=0.14, wspace=0.08,
                          bottom=0.02, top=1 - 1.0 / fig.get_figheight())
    axes = np.empty((len(rows), len(columns)), dtype=object)
    for r, row in enumerate(rows):
        for c, fam in enumerate(columns):
            ax = axes[r, c] = fig.add_subplot(gs[r, c], sharey=axes[r, 0] if c else None,
                                              sharex=axes[0, c] if r else None)
            if ref is not None and fam != "none":
                row["draw"](ax, ref, st[ref], 0, True)
            for rank, name in enumerate(members[fam]):
                row["draw"](ax, name, st[name], rank, False)
            ax.axvline(L, color="0.3", ls="--", lw=1.1, zorder=1)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(lengths))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlim(lengths[0] / 2**0.25, lengths[-1] * 2**0.25)
            ax.grid(True, alpha=0.3)
            if row.get("finish"):
                row["finish"](ax)
            if c == 0:
                ax.set_ylabel(row["ylabel"], fontsize=9.5)
            else:
                ax.tick_params(labelleft=False)
            if r == len(rows) - 1:
                ax.set_xticks(lengths, [f"{t}\n({t // L}L)" for t in lengths])
                ax.set_xlabel("evaluation length T (tokens)")
            else:
                ax.tick_params(labelbottom=False)
            if r == 0:
                ax.set_title(FAMILY_TITLES.get(fam, fam), fontsize=11)
    for r, row in enumerate(rows):  # once the shared row holds all its data
        if row.get("log"):
            for ax in axes[r]:
                ax.set_yscale("log")
            log_axis(axes[r, 0])
            for ax in axes[r, 1:]:
                ax.tick_params(labelleft=False)
    for c, fam in enumerate(columns):
        fig.add_subplot(gs[-2, c]).axis("off")
        lax = fig.add_subplot(gs[-1, c])
        lax.axis("off")
        handles = [legend_handle(st[ref], reference=True)] if ref is not None and fam != "none" else []
        handles += [legend_handle(st[s], rank=rank) for rank, s in enumerate(members[fam])]
        lax.legend(handles=handles, loc="upper center", ncol=2, frameon=False, fontsize=9, handlelength=2.6,
                   columnspacing=1.2, borderaxespad=0.0)
    fig.suptitle(title, fontsize=12, y=1 - 0.1 / fig.get_figheight(), va="top")
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), fontsize=8, va="top", color="0.3")
    return fig


def _line(ax, x, y, style, rank: int, reference: bool, lo=None, hi=None) -> None:
    """One scheme's line (and its interval band) as the extrapolation figure draws it."""
    from .extrapolation import REFERENCE_COLOR, REFERENCE_LS, line_sizes

    kws = style.line_kws()
    lw, ms = (1.6, 4) if reference else line_sizes(rank)
    if reference:
        kws.update(color=REFERENCE_COLOR, linestyle=REFERENCE_LS, marker="o")
    ax.plot(x, y, lw=lw, markersize=ms, markeredgecolor="w", markeredgewidth=0.75,
            zorder=1.5 if reference else 2.5 + 0.01 * rank, **kws)
    if lo is not None:
        ax.fill_between(x, lo, hi, color=kws["color"], alpha=0.1 if reference else 0.15, linewidth=0, zorder=1)


def plot_curves(df: pd.DataFrame, extrapolation: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Small multiples by family (``_family_figure``): top, exact match against length
    (mean over depths, band: the mean of the cells' 95% Wilson bounds, ``by_length``);
    bottom, ppl(T) / ppl(L) of the same schemes' causal-LM runs (per seed, then the
    mean over seeds), so a scheme flat in perplexity but blind far back shows as a
    flat lower curve under a falling upper one."""
    from posenc.files import save_figure

    t = by_length(df)
    ex = extrapolation[extrapolation["method"] == "nonoverlapping"].dropna(subset=["ppl"]).copy()
    at_l = ex[ex["eval_len"] == ex["train_len"]].set_index(["scheme", "seed"])["ppl"]
    ex["ratio"] = ex["ppl"] / [at_l.get((s, seed), np.nan) for s, seed in zip(ex["scheme"], ex["seed"])]
    ratio = ex.groupby(["scheme", "eval_len"], as_index=False)["ratio"].mean()
    names = order(set(t["scheme"]) | set(ratio["scheme"]))
    L = int((t["length"] // t["multiple"]).min())
    lengths = sorted(set(int(x) for x in t["length"]) | set(int(x) for x in ratio["eval_len"]))

    def exact(ax, s, style, rank, reference):
        c = t[t["scheme"] == s]
        if len(c):
            _line(ax, c["length"], 100 * c["exact_match"], style, rank, reference, 100 * c["exact_lo"],
                  100 * c["exact_hi"])

    def ppl(ax, s, style, rank, reference):
        r = ratio[ratio["scheme"] == s]
        if len(r):
            _line(ax, r["eval_len"], r["ratio"], style, rank, reference)

    def ppl_axis(ax):
        ax.axhline(1.0, color="0.2", lw=0.9, zorder=1)

    rows = [{"ylabel": "passkeys retrieved exactly (%)", "draw": exact, "finish": lambda ax: ax.set_ylim(-3, 103)},
            {"ylabel": "ppl(T) / ppl(L) (log scale)", "draw": ppl, "finish": ppl_axis, "log": True}]
    seeds = int(df["seed"].nunique())
    notes = [f"top: one retrieval run per scheme ({seeds} seed{'s' if seeds > 1 else ''}), mean over needle depths, "
             "band: mean of the cells' 95% intervals; bottom: the causal-LM runs, mean over seeds",
             "grey dotted: none (NoPE), the reference in every panel; dashed: a context-extension rule of RoPE"]
    missing = sorted(set(ratio["scheme"]) - set(t["scheme"]))
    if missing:
        notes.append(f"no retrieval run: {', '.join(missing)}")
    fig = _family_figure(names, rows, lengths, L, "Flat perplexity is not retrieval: passkeys retrieved exactly "
                         "(top) and the perplexity ratio (bottom) against length, by family", notes)
    return save_figure(fig, stem, bbox_inches="tight")


def plot_reach(summary: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Small multiples by family: mean attention distance (top) and attention entropy
    (bottom) of the causal-LM runs against length, mean over layers, heads and seeds,
    with uniform causal attention as the black dashed reference."""
    from posenc.files import save_figure

    names = order(summary["scheme"].unique())
    ref = summary.drop_duplicates("length").sort_values("length")
    lengths = [int(x) for x in ref["length"]]
    L = int(ref["length"].iloc[0] // ref["multiple"].iloc[0])

    def metric(col):
        def draw(ax, s, style, rank, reference):
            c = summary[summary["scheme"] == s].sort_values("length")
            _line(ax, c["length"], c[col], style, rank, reference)
        return draw

    def finish(col):
        def f(ax):
            ax.plot(ref["length"], ref[f"uniform_{col}"], color="black", ls=(0, (5, 3)), lw=1.1, zorder=1.2)
        return f

    rows = [{"ylabel": "mean attention distance (tokens, log scale)", "draw": metric("distance"),
             "finish": finish("distance"), "log": True},
            {"ylabel": "attention entropy (nats)", "draw": metric("entropy"), "finish": finish("entropy")}]
    seeds = int(summary["seeds"].max())
    notes = [f"mean over layers, heads and {seeds} seed{'s' if seeds > 1 else ''} of the causal-LM runs; "
             "black dashed: uniform causal attention, distance (T - 1) / 4 and entropy mean ln(i + 1)",
             "grey dotted: none (NoPE), the reference in every panel; dashed: a context-extension rule of RoPE"]
    fig = _family_figure(names, rows, lengths, L, "How far back each scheme attends, and how spread its "
                         "attention is, against length, by family", notes)
    return save_figure(fig, stem, bbox_inches="tight")


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
