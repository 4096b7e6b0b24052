"""Ke et al. heatmaps of every trained masked-LM run, with the spread over seeds.

    python -m pipelines.correlations runs --draw-seed 0 --out-dir figures/correlations \
        --json results/correlations.json [--batches 2]

Finds ``<runs_dir>/<scheme>/mlm-s<seed>/checkpoints/last.ckpt`` (the layout
``pipelines.study`` writes) and hands them to ``analysis.correlations``: every
run is summarised (band score of each term, and its mean and sd over seeds per
scheme), the runs of ``--draw-seed`` are drawn (one figure per scheme plus the
overview grid). Schemes without a masked-LM run (causal only, such as xPos)
are taken from their causal-LM runs; their panels are titled "(lm)".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from analysis import correlations
from posenc.encodings.base import TERM_NAMES

from posenc.files import write_text


def checkpoints(runs_dir: str | Path) -> list[Path]:
    """The masked-LM checkpoints of every scheme, or its causal-LM ones where it has none."""
    out = []
    for scheme in sorted(p for p in Path(runs_dir).iterdir() if p.is_dir()):
        for task in ("mlm", "lm"):
            found = sorted(scheme.glob(f"{task}-s*/checkpoints/last.ckpt"))
            if found:
                out += found
                break
    return out


def band_markdown(schemes: dict[str, dict]) -> str:
    """The band score of every term, mean ± sd over seeds, one row per scheme."""
    lines = ["| scheme | " + " | ".join(TERM_NAMES) + " | seeds |", "| --- |" + " ---: |" * (len(TERM_NAMES) + 1)]
    for label, e in schemes.items():
        cells = [f"{e['terms'][t]['band_mean']:+.2f} ± {e['terms'][t]['band_sd']:.2f}" if t in e["terms"] else "—"
                 for t in TERM_NAMES]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {len(e['seeds'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.correlations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir")
    p.add_argument("--draw-seed", type=int, default=0, help="the seed whose runs are drawn")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--md", help="Markdown table of the band scores over seeds")
    p.add_argument("--batches", type=int, default=2)
    a = p.parse_args(argv)
    ckpts = checkpoints(a.runs_dir) if Path(a.runs_dir).is_dir() else []
    if not ckpts:
        raise SystemExit(f"no checkpoints matching {a.runs_dir}/<scheme>/(mlm|lm)-s<seed>/checkpoints/last.ckpt")
    args = [x for c in ckpts for x in ("--ckpt", str(c))]
    rc = correlations.main(args + ["--out-dir", a.out_dir, "--json", a.json, "--batches", str(a.batches),
                                   "--draw-seed", str(a.draw_seed)])
    if rc == 0 and a.md:
        write_text(a.md, band_markdown(json.loads(Path(a.json).read_text())["schemes"]))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
