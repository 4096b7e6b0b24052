"""The overview of the Ke, He & Liu 2020 (Figure 2) heatmaps: one row per scheme,
the four terms as columns, one colour scale per row (drawn with the helpers of
:mod:`analysis.heatmaps`). Kept apart from the per-model figures because it is
drawn by a summary stage from every scheme's saved maps, while the per-model
figures are drawn by each scheme's own stage from its checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import seaborn as sns  # noqa: E402

from posenc.encodings.base import TERM_NAMES  # noqa: E402

from analysis.heatmaps import _absent, _figure, _finish, _fit_colorbar, _heatmap, _vmax  # noqa: E402
from analysis.terms import DEFAULT_BAND_WIDTH, TermMaps, band_score  # noqa: E402


def plot_overview(
    all_maps: Sequence[TermMaps], stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH
) -> list[Path]:
    """Rows = schemes, columns = the four terms; a shared colour scale per row."""
    if not all_maps:
        raise ValueError("no models to draw")
    sns.set_theme(style="white", context="paper")
    n = len(all_maps)
    W, Hgt = 12.5, 2.75 * n + 0.9
    fig, grid = _figure(W, Hgt, n, [1, 1, 1, 1, 0.05], (1.0, 0.6, 0.8, 0.45), wspace=0.3, hspace=0.45)
    for r, maps in enumerate(all_maps):
        vmax = _vmax(maps.head_mean(t) for t in maps.present)
        cax = fig.add_subplot(grid[r, 4])
        axes = [fig.add_subplot(grid[r, c]) for c in range(4)]
        first = True
        for c, (ax, term) in enumerate(zip(axes, TERM_NAMES)):
            if term in maps.per_head:
                _heatmap(ax, maps.head_mean(term), vmax, cbar_ax=cax if first else None)
                if first:
                    _fit_colorbar(cax, ax, axes[-1])
                first = False
                m = maps.per_head[term].mean(0)
                ax.set_title(f"{term}  (band {band_score(m, band_width, maps.causal):+.2f})", fontsize=9)
            else:
                _absent(ax, f"{term}\n(absent)")
            if c == 0:
                ax.set_ylabel(f"{maps.label}\nquery position i", fontsize=9)
            else:
                ax.set_ylabel("")
            if r < n - 1:
                ax.set_xlabel("")
        if first:
            cax.set_visible(False)
    text = "First-layer attention logits by term (Ke, He & Liu 2020, Fig. 2): mean over sequences and heads,"
    return _finish(fig, stem, text + " one colour scale per row", top=1 - 0.15 / Hgt)
