"""Ke et al. heatmaps of every trained masked-LM run of one seed.

    python -m pipelines.correlations runs/mlm --seed 0 --out-dir figures/correlations \
        --json results/correlations.json [--batches 2] [--lm-runs runs/lm]

Finds ``<runs_dir>/*-s<seed>/checkpoints/last.ckpt`` and hands them to
``analysis.correlations`` (one figure per scheme plus the overview grid).
``--lm-runs``: also the causal-LM runs of that seed whose scheme has no
masked-LM run (schemes defined for causal attention only, such as xPos); their
panels are titled "(lm)".
"""

from __future__ import annotations

import argparse
from pathlib import Path

from omegaconf import OmegaConf

from analysis import correlations


def scheme_of(ckpt: Path) -> str:
    """The encoding of the run a checkpoint belongs to (its saved config.yaml)."""
    return str(OmegaConf.load(ckpt.parent.parent / "config.yaml").encoding.name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.correlations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--lm-runs", default=None, help="causal-LM runs for schemes without a masked-LM run")
    a = p.parse_args(argv)
    pattern = f"*-s{a.seed}/checkpoints/last.ckpt"
    ckpts = sorted(Path(a.runs_dir).glob(pattern))
    if not ckpts:
        raise SystemExit(f"no checkpoints matching {a.runs_dir}/{pattern}")
    if a.lm_runs:
        have = {scheme_of(c) for c in ckpts}
        ckpts += [c for c in sorted(Path(a.lm_runs).glob(pattern)) if scheme_of(c) not in have]
    args = [x for c in ckpts for x in ("--ckpt", str(c))]
    return correlations.main(args + ["--out-dir", a.out_dir, "--json", a.json, "--batches", str(a.batches)])


if __name__ == "__main__":
    raise SystemExit(main())
