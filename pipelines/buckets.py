"""Which of T5's distance buckets the study's runs trained (``analysis.buckets``).

    python -m pipelines.buckets results/runs/*.json --params params.yaml --train-len 64 \
        --multipliers 1 2 4 8 16 --json results/buckets.json --md figures/buckets_table.md

For every scheme of the study whose class is T5's bias (``t5_bias``, and variants of it
such as ``t5_bias_scaled``), reads the last checkpoint of each of its causal-LM runs and
writes which buckets a training window reaches, which stayed exactly at their zero
initial value, and the share of a longer window's pairs that fall in the unreached ones.
The runs are not committed: like the heatmaps, this stage needs its schemes' study
stages to have trained them in this clone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posenc.files import write_json, write_text

from .gather import per_scheme, study_schemes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.buckets", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="results/runs/<scheme>.json files of pipelines.study")
    p.add_argument("--params", help="the study's params file: its schemes only")
    p.add_argument("--train-len", type=int, required=True, help="L, the causal-LM runs' window")
    p.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--json", required=True)
    p.add_argument("--md", required=True)
    a = p.parse_args(argv)
    from hydra.utils import get_class

    from analysis import buckets
    from posenc.fingerprint import scheme_target
    from posenc.runs import weights

    from .heatmaps import checkpoints, reach_task

    out = {}
    for scheme, path in per_scheme(a.runs, study_schemes(a.params) if a.params else None, "runs").items():
        _, config, target = scheme_target(scheme)
        if get_class(target) is not buckets.SCHEME:
            continue
        runs = json.loads(Path(path).read_text())["runs"]
        task = reach_task([r["task"] for r in runs])
        seeds = sorted(r["seed"] for r in runs if r["task"] == task)  # the order checkpoints() gives
        states = {seed: weights(ckpt) for seed, ckpt in zip(seeds, checkpoints(path, reach_task))}
        out[scheme] = buckets.summary(config["scheme"], states, a.train_len, a.multipliers)
    table = buckets.markdown(out) if out else "No scheme of the study is T5's bias.\n"
    write_json(a.json, out)
    write_text(a.md, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
