"""Ke et al.'s first-layer term maps of posenc checkpoints, from the command line
(``analysis.correlations``, which computes them with ``analysis.terms`` and draws them with
``analysis.heatmaps``).

    python -m pipelines.term_maps --ckpt outputs/runs/<run>/checkpoints/last.ckpt [--ckpt ...] \
        --out-dir figures/correlations --json results/correlations.json --batches 2 --length 128

Prints every map's statistics and writes the figures and the JSON summary; a checkpoint or
folder it cannot read is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from posenc.encodings.base import TERM_NAMES

from analysis import correlations as corr
from analysis import terms


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

def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.term_maps", description=corr.__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", action="append", required=True, help="a checkpoint (.ckpt); repeat for several")
    p.add_argument("--out-dir", default="figures/correlations")
    p.add_argument("--json", default="results/correlations.json")
    p.add_argument("--batches", type=int, default=2, help="validation batches to sample (default 2)")
    p.add_argument("--length", type=int, default=None, help="sequence length (default: the training length)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the run's data.eval_batch_size")
    p.add_argument("--band-width", type=int, default=terms.DEFAULT_BAND_WIDTH, help="band half-width w of the band score")
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
        lambda: corr.run(a.ckpt, a.out_dir, a.json, n_batches=a.batches, length=a.length, batch_size=a.batch_size,
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
