"""Drawing the Ke, He & Liu 2020 (Figure 2) heatmaps from :class:`analysis.terms.TermMaps`.

Four head-averaged maps side by side on one diverging colour scale centred at 0
(``plot_terms``) and every head (``plot_heads``) of one model; the grid of every
scheme is :mod:`analysis.overview`. A term a scheme lacks is an empty panel titled
"(absent)"; entries a causal model never uses (above the diagonal) are left blank.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402

from posenc.encodings.base import TERM_NAMES  # noqa: E402
from posenc.files import save_figure  # noqa: E402

from analysis.terms import DEFAULT_BAND_WIDTH, TermMaps, band_score, used_entries  # noqa: E402

CMAP = "RdBu_r"


def _vmax(maps: Iterable[np.ndarray]) -> float:
    vals = [np.nanmax(np.abs(m)) for m in maps if np.isfinite(m).any()]
    v = max(vals, default=0.0)
    return float(v) if v > 0 else 1.0


def _tick_step(T: int, n_ticks: int = 8) -> int:
    """A power of two that gives at most about ``n_ticks`` ticks."""
    return max(1, int(2 ** math.ceil(math.log2(max(T / n_ticks, 1)))))


def _heatmap(ax, m: np.ndarray, vmax: float, cbar_ax=None, cbar_label: str | None = None, n_ticks: int = 8) -> None:
    """One (T, T) map with imshow (seaborn's heatmap is ~100x slower for 128x128 maps);
    NaN entries (masked, causal upper triangle) are drawn white."""
    T = m.shape[-1]
    cmap = plt.get_cmap(CMAP).with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=-vmax, vmax=vmax, interpolation="nearest", aspect="equal")
    ticks = np.arange(0, T, _tick_step(T, n_ticks))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.tick_params(labelsize=7, length=2)
    ax.set_xlabel("key position j", fontsize=8)
    ax.set_ylabel("query position i", fontsize=8)
    ax.grid(False)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(True)
        ax.spines[side].set_linewidth(0.5)
    if cbar_ax is not None:
        cb = ax.figure.colorbar(im, cax=cbar_ax)
        cb.ax.tick_params(labelsize=7)
        if cbar_label:
            cb.set_label(cbar_label, fontsize=8)


def _figure(W: float, Hgt: float, rows: int, width_ratios: list[float], margins: tuple, **space):
    """A W x Hgt inch figure and its grid, with fixed margins (left, right, top,
    bottom) in inches instead of ``bbox_inches="tight"`` (a second draw per file)."""
    left, right, top, bottom = margins
    fig = plt.figure(figsize=(W, Hgt))
    grid = fig.add_gridspec(
        rows, len(width_ratios), width_ratios=width_ratios, left=left / W, right=1 - right / W,
        top=1 - top / Hgt, bottom=bottom / Hgt, **space,
    )  # fmt: skip
    return fig, grid


def _absent(ax, title: str) -> None:
    """An empty, square panel for a term the scheme does not have."""
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "(absent)", ha="center", va="center", fontsize=9, color="0.5", transform=ax.transAxes)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_color("0.75")


def _fit_colorbar(cax, ax, right_of=None) -> None:
    """Give the colour bar the height of an aspect-locked image axis (and put it
    just right of ``right_of``, the last panel of its row)."""
    ax.apply_aspect()
    p, c = ax.get_position(), cax.get_position()
    x0 = c.x0
    if right_of is not None:
        right_of.apply_aspect()
        x0 = right_of.get_position().x1 + 0.012
    cax.set_position([x0, p.y0, c.width, p.height])


def _stats_line(maps: TermMaps, term: str, band_width: int) -> str:
    m = maps.per_head[term].mean(0)
    return (
        f"mean|x| {maps.raw[term]['mean_abs']:.2g}, std {maps.raw[term]['std']:.2g}\n"
        f"band {band_score(m, band_width, maps.causal):+.2f}"
    )


def plot_terms(
    maps: TermMaps, stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH, title: str | None = None
) -> list[Path]:
    """Figure 2 for one model: four head-averaged maps, one colour scale."""
    sns.set_theme(style="white", context="paper")
    W, Hgt = 15.5, 4.8  # inches
    fig, grid = _figure(W, Hgt, 1, [1, 1, 1, 1, 0.05], (0.6, 0.7, 1.05, 0.95), wspace=0.3)
    axes = [fig.add_subplot(grid[0, i]) for i in range(4)]
    cax = fig.add_subplot(grid[0, 4])
    vmax = _vmax(maps.head_mean(t) for t in maps.present)
    for ax, term in zip(axes, TERM_NAMES):
        if term in maps.per_head:
            first = term == maps.present[0]
            _heatmap(ax, maps.head_mean(term), vmax, cbar_ax=cax if first else None, cbar_label="logit term")
            ax.set_title(f"{term}\n{_stats_line(maps, term, band_width)}", fontsize=9)
        else:
            _absent(ax, f"{term}\n(absent)")
    if maps.present:
        _fit_colorbar(cax, next(a for a, t in zip(axes, TERM_NAMES) if t in maps.per_head), axes[-1])
    else:
        cax.set_visible(False)
    fig.suptitle(
        title or f"{maps.label}: first-layer attention logits by term", fontsize=12, y=1 - 0.12 / Hgt, va="top"
    )
    caption = (
        f"Mean over {maps.n_sequences} sequences of length {maps.length} and {maps.n_heads} heads; logits on the "
        f"softmax scale; one colour scale, centred at 0. band = band score (|i-j| <= {band_width}); "
        "mean|x|/std over all sequences, heads and used entries."
    )
    if maps.causal:
        caption += " Causal model: entries above the diagonal are masked and left blank."
    if maps.caption:
        caption += "\n" + maps.caption
    fig.text(0.5, 0.08 / Hgt, caption, ha="center", va="bottom", fontsize=8, wrap=True)
    return save_figure(fig, stem)


def plot_heads(maps: TermMaps, stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH) -> list[Path]:
    """Every head: rows = present terms, columns = heads; one colour scale per row."""
    sns.set_theme(style="white", context="paper")
    rows, H = maps.present, maps.n_heads
    if not rows:
        raise ValueError(f"{maps.label} has no terms to draw")
    W, Hgt = max(2.0 * H + 1.6, 7.0), 2.2 * len(rows) + 1.0
    fig, grid = _figure(W, Hgt, len(rows), [1] * H + [0.06], (0.8, 0.6, 0.9, 0.3), wspace=0.35, hspace=0.45)
    used = used_entries(maps.length, maps.causal)
    for r, term in enumerate(rows):
        heads = np.where(used, maps.per_head[term], np.nan)
        vmax = _vmax(heads)
        cax = fig.add_subplot(grid[r, H])
        axes = [fig.add_subplot(grid[r, h]) for h in range(H)]
        for h, ax in enumerate(axes):
            _heatmap(ax, heads[h], vmax, cbar_ax=cax if h == 0 else None, n_ticks=4)
            ax.set_xlabel("")
            ax.set_ylabel(term if h == 0 else "", fontsize=9)
            ax.set_title(
                f"head {h}  band {band_score(maps.per_head[term][h], band_width, maps.causal):+.2f}", fontsize=8
            )
        _fit_colorbar(cax, axes[0], axes[-1])
    text = f"{maps.label}: first-layer logit terms per head, mean over {maps.n_sequences} sequences\n"
    return _finish(fig, stem, text + "(one colour scale per row)", top=1 - 0.1 / Hgt)


def _finish(fig, stem: str | os.PathLike, title: str, top: float) -> list[Path]:
    fig.suptitle(title, fontsize=11, y=top, va="top")
    return save_figure(fig, stem)


def draw(
    maps: TermMaps, out_dir: str | os.PathLike, stem: str, band_width: int = DEFAULT_BAND_WIDTH,
    heads: bool = True, title: str | None = None,
) -> list[Path]:
    """``<out_dir>/<stem>`` (the four terms) and, with ``heads``, ``<stem>_heads``."""
    out_dir = Path(out_dir)
    figs = plot_terms(maps, out_dir / stem, band_width, title)
    if heads:
        figs += plot_heads(maps, out_dir / f"{stem}_heads", band_width)
    return figs
