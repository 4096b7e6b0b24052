"""First-layer attention logits split into word and position terms
(Ke, He & Liu 2020, "Rethinking Positional Encoding in Language Pre-training",
Figure 2).

    python -m analysis.correlations --ckpt outputs/runs/<run>/checkpoints/last.ckpt [--ckpt ...] \
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
:mod:`analysis.heatmaps`; this module runs both for posenc checkpoints.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posenc.encodings.base import TERM_NAMES
from posenc.files import portable_path, write_json

from analysis.heatmaps import draw
from analysis.overview import plot_overview
from analysis.terms import DEFAULT_BAND_WIDTH, TermMaps, checkpoint_term_maps, seed_spread, summary_document


def _stem(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    stem, i = base, 2
    while stem in taken:
        stem, i = f"{base}_{i}", i + 1
    taken.add(stem)
    return stem


def print_table(summaries: dict[str, dict], file=None) -> None:
    file = file or sys.stdout
    print(
        f"{'model':28s} {'term':18s} {'mean|x|':>9s} {'std':>9s} {'map std':>9s} {'band':>7s} {'d-corr':>7s} "
        f"{'q-only':>7s}",
        file=file,
    )
    for name, s in summaries.items():
        for t in TERM_NAMES:
            r = s["terms"][t]
            if not r["present"]:
                print(f"{name:28s} {t:18s} {'(absent)':>9s}", file=file)
                continue
            print(
                f"{name:28s} {t:18s} {r['mean_abs']:9.3g} {r['std']:9.3g} {r['map_std']:9.3g} "
                f"{r['band_score']:+7.2f} {r['distance_corr']:+7.2f} {r['query_only_share']:7.2f}",
                file=file,
            )

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
    drawn, summaries = summarise(ckpts, out_dir, **settings)
    band_width = settings.get("band_width", DEFAULT_BAND_WIDTH)
    overview = plot_overview(drawn, Path(out_dir) / "overview", band_width)
    result = summary_document(
        summaries, band_width, seed=settings.get("seed", 0), overview=[portable_path(p) for p in overview],
        schemes=seed_spread(summaries),
    )  # fmt: skip
    write_json(json_path, result, allow_nan=False)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.correlations", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", action="append", required=True, help="a checkpoint (.ckpt); repeat for several")
    p.add_argument("--out-dir", default="figures/correlations")
    p.add_argument("--json", default="results/correlations.json")
    p.add_argument("--batches", type=int, default=2, help="validation batches to sample (default 2)")
    p.add_argument("--length", type=int, default=None, help="sequence length (default: the training length)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the run's data.eval_batch_size")
    p.add_argument("--band-width", type=int, default=DEFAULT_BAND_WIDTH, help="band half-width w of the band score")
    p.add_argument("--data-dir", default=None, help="corpus folder (default: POSENC_DATA_DIR, else the run's)")
    p.add_argument("--cache-dir", default=None, help="tokenizer cache (default: the run's paths.cache_dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-heads", action="store_true", help="skip the per-head figures")
    p.add_argument("--draw-seed", type=int, default=None,
                   help="draw only the runs trained with this seed (all are summarised)")
    a = p.parse_args(argv)
    if a.batches < 1:
        p.error("--batches must be at least 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return report(
        lambda: run(a.ckpt, a.out_dir, a.json, n_batches=a.batches, length=a.length, batch_size=a.batch_size,
                    band_width=a.band_width, data_dir=a.data_dir, cache_dir=a.cache_dir, seed=a.seed,
                    heads=not a.no_heads, draw_seed=a.draw_seed),
        a.json, a.out_dir,
    )  # fmt: skip


def report(analysis: Callable[[], dict], json_path: str, out_dir: str, errors=(FileNotFoundError, ValueError)) -> int:
    """Run an analysis, print its table and what it wrote; an input it refuses
    (one of ``errors``) is one line on stderr and exit status 2."""
    try:
        result = analysis()
    except errors as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(result["models"])
    print(f"wrote {json_path} and figures under {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
