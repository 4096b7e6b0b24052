"""First-layer attention logits split into word and position terms
(Ke, He & Liu 2020, "Rethinking Positional Encoding in Language Pre-training",
Figure 2).

    python -m pipelines.term_maps --ckpt outputs/runs/<run>/checkpoints/last.ckpt [--ckpt ...] \
        --out-dir figures/correlations --json results/correlations.json --batches 2 --length 128

For every checkpoint: rebuild the model, sample sequences from the validation
split of the model's own data config (``instantiate(cfg.data)``; the data folder
can be overridden with ``--data-dir`` or ``POSENC_DATA_DIR``), and split the
pre-mask first-layer logits with ``Transformer.first_layer_terms`` into
word-word, word-position, position-word and position-position terms, each
(B, H, T, T). The terms are averaged over the sampled sequences (per head),
then over heads, and drawn as four heatmaps side by side on one diverging
colour scale centred at 0; a term a scheme lacks is an empty panel titled
"(absent)". Causal models never use logits above the diagonal, so those
entries are left blank and left out of every statistic.

Writes, per checkpoint, ``<out-dir>/<run>.png|svg`` (Figure 2) and
``<out-dir>/<run>_heads.png|svg`` (each head), plus ``<out-dir>/overview.png|svg``
(rows = schemes, columns = the four terms; one colour scale per row), and a
JSON summary (see :mod:`analysis.terms` for its
statistics). Computing lives in :mod:`analysis.terms`, drawing in
:mod:`analysis.heatmaps` (imported when a figure is drawn: the computation imports no
plotting library); this module runs both for posenc checkpoints, and its command line is
``pipelines.term_maps``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.files import portable_path, write_json

from analysis.terms import DEFAULT_BAND_WIDTH, TermMaps, checkpoint_term_maps, seed_spread, summary_document


def _stem(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    stem, i = base, 2
    while stem in taken:
        stem, i = f"{base}_{i}", i + 1
    taken.add(stem)
    return stem


def summarise(
    ckpts: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    n_batches: int = 2,
    length: int | None = None,
    batch_size: int | None = None,
    band_width: int = DEFAULT_BAND_WIDTH,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    heads: bool = True,
    draw_seed: int | None = None,
) -> tuple[list[TermMaps], dict[str, dict]]:
    """Term maps and summary of every checkpoint, the figures of the drawn ones.

    Every checkpoint is summarised; with ``draw_seed`` only the runs trained
    with that seed are drawn (Figure 2 and, with ``heads``, every head, under
    ``out_dir``). Returns (the drawn runs' maps, {figure stem: summary}).
    """
    if not ckpts:
        raise ValueError("give at least one checkpoint")
    out_dir = Path(out_dir)
    taken: set[str] = set()
    drawn, summaries = [], {}
    for ckpt in ckpts:
        maps = checkpoint_term_maps(ckpt, n_batches, length, batch_size, data_dir, cache_dir, seed)
        stem = _stem(maps.meta.get("run_name", maps.label), taken)
        summary = maps.summary(band_width)
        if draw_seed is None or maps.meta.get("seed") == draw_seed:
            from analysis.heatmaps import draw

            summary["figures"] = [portable_path(p) for p in draw(maps, out_dir, stem, band_width, heads)]
            drawn.append(maps)
        summaries[stem] = summary
    return drawn, summaries


def run(
    ckpts: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike = "figures/correlations",
    json_path: str | os.PathLike = "results/correlations.json",
    **settings: Any,
) -> dict[str, Any]:
    """Figures and JSON for every checkpoint (``summarise``, which takes ``settings``), plus
    the overview of the drawn ones; returns the JSON object, whose ``schemes`` gives each
    term's band score as mean, sample sd and values over the seeds of every scheme."""
    from analysis.overview import plot_overview

    drawn, summaries = summarise(ckpts, out_dir, **settings)
    band_width = settings.get("band_width", DEFAULT_BAND_WIDTH)
    overview = plot_overview(drawn, Path(out_dir) / "overview", band_width)
    result = summary_document(
        summaries, band_width, seed=settings.get("seed", 0), overview=[portable_path(p) for p in overview],
        schemes=seed_spread(summaries),
    )  # fmt: skip
    write_json(json_path, result, allow_nan=False)
    return result
