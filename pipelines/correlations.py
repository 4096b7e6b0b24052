"""Ke et al. heatmaps of every trained masked-LM run of one seed.

    python -m pipelines.correlations runs/mlm --seed 0 --out-dir figures/correlations \
        --json results/correlations.json [--batches 2]

Finds ``<runs_dir>/*-s<seed>/checkpoints/last.ckpt`` and hands them to
``analysis.correlations`` (one figure per scheme plus the overview grid).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from analysis import correlations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.correlations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--batches", type=int, default=2)
    a = p.parse_args(argv)
    ckpts = sorted(Path(a.runs_dir).glob(f"*-s{a.seed}/checkpoints/last.ckpt"))
    if not ckpts:
        raise SystemExit(f"no checkpoints matching {a.runs_dir}/*-s{a.seed}/checkpoints/last.ckpt")
    args = [x for c in ckpts for x in ("--ckpt", str(c))]
    return correlations.main(args + ["--out-dir", a.out_dir, "--json", a.json, "--batches", str(a.batches)])


if __name__ == "__main__":
    raise SystemExit(main())
