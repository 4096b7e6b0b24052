"""One scheme's Ke et al. heatmaps and band scores, and how far its causal-LM runs
attend, from the runs its study stage made.

    python -m pipelines.heatmaps alibi --runs results/runs/alibi.json --batches 2 \
        --out-dir figures/correlations/alibi --json results/correlations/alibi.json \
        --maps results/correlations/alibi.npz --reach results/reach/alibi.csv --multipliers 1 2 4 8 16

Reads the runs that ``pipelines.study`` recorded in ``--runs`` (its masked-LM runs,
or its causal-LM ones when the scheme is causal only, such as xPos: their panels
are titled "(lm)"), summarises every run (band score of each term, and their mean
and sd over seeds), draws the run of ``--draw-seed`` (by default the lowest seed those runs
have: the study's first; Figure 2 and every head,
under ``--out-dir``) and saves their maps (``--maps``), from which the
``correlations`` stage draws the overview of every scheme. With ``--reach`` it
also writes the mean attention distance and entropy of every causal-LM run per
layer, head and length (``analysis.reach``; with each zero-shot rule of
``--extensions`` too, e.g. ``rope+yarn``). Everything it writes belongs to this
scheme alone.

The runs themselves are not committed: on a fresh clone this stage can run only
after the scheme's study stage has trained them again, and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posenc.files import write_json
from posenc.runs import RunFolder

def first_layer_task(names) -> str | None:
    """Of the tasks ``names``, the one whose runs the Ke et al. maps read: a bidirectional one
    (the masked LM, as Ke et al.'s BERT) when there is one, else one scored at every length
    (the causal LM); None when neither (``posenc.tasks``)."""
    from posenc.tasks import load

    names = sorted(set(names))
    return next((t for t in names if not load(t).causal), None) or reach_task(names)


def reach_task(names) -> str | None:
    """Of the tasks ``names``, the one whose runs attention reach reads: scored at every length."""
    from posenc.tasks import load

    return next((t for t in sorted(set(names)) if load(t).results == "extrapolation"), None)


def first_seed(runs_file: str | Path, choose=first_layer_task) -> int:
    """The lowest seed of the runs of the task that ``choose`` picks (the run drawn by default)."""
    runs = json.loads(Path(runs_file).read_text())["runs"]
    task = choose([r["task"] for r in runs])
    return min(int(r["seed"]) for r in runs if r["task"] == task)


def checkpoints(runs_file: str | Path, choose=first_layer_task) -> list[Path]:
    """The last checkpoint of every run of the scheme's task that ``choose`` picks among its tasks."""
    doc = json.loads(Path(runs_file).read_text())
    runs = doc["runs"]
    task = choose([r["task"] for r in runs])
    if task is None:
        raise SystemExit(f"{runs_file}: no runs of a task these maps read (tasks: "
                         f"{', '.join(sorted({r['task'] for r in runs})) or 'none'})")
    ckpts = [RunFolder(r["run_dir"]).last for r in sorted(runs, key=lambda r: r["seed"])
             if r["task"] == task]
    missing = [str(c) for c in ckpts if not c.is_file()]
    if missing:
        raise SystemExit(
            f"error: the runs of {doc['scheme']} recorded in {runs_file} are not here ({', '.join(missing)}): "
            f"runs are not committed, so on a fresh clone this stage needs them trained again: "
            f"`dvc repro --force study@{doc['scheme']} heatmaps@{doc['scheme']}`"
        )
    return ckpts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.heatmaps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scheme")
    p.add_argument("--runs", required=True, help="results/runs/<scheme>.json of pipelines.study")
    p.add_argument("--draw-seed", type=int, default=None,
                   help="the seed whose run is drawn (default: the lowest seed of the runs read)")
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--out-dir", required=True, help="this scheme's figures")
    p.add_argument("--json", required=True, help="this scheme's summary (every run, spread over seeds)")
    p.add_argument("--maps", required=True, help=".npz of the drawn run's maps, for the overview")
    p.add_argument("--reach", help=".csv of the attention distance and entropy of the causal-LM runs")
    p.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="--reach lengths, x L")
    p.add_argument("--extensions", nargs="*", default=[],
                   help="zero-shot context-extension rules also measured by --reach (fine-tuned ones are skipped)")
    a = p.parse_args(argv)
    if a.batches < 1:
        p.error("--batches must be at least 1")
    from analysis.correlations import summarise
    from analysis.terms import DEFAULT_BAND_WIDTH, seed_spread, summary_document

    ckpts = checkpoints(a.runs)
    if a.draw_seed is None:
        a.draw_seed = first_seed(a.runs)
    drawn, summaries = summarise(ckpts, a.out_dir, a.batches, draw_seed=a.draw_seed)
    if len(drawn) != 1:
        raise SystemExit(f"error: {a.scheme}: expected one run of seed {a.draw_seed} to draw, found {len(drawn)}")
    drawn[0].save(a.maps)
    doc = summary_document(summaries, DEFAULT_BAND_WIDTH, scheme=a.scheme, seed=0, draw_seed=a.draw_seed,
                           maps=Path(a.maps).as_posix(), schemes=seed_spread(summaries))
    write_json(a.json, doc, allow_nan=False)
    for label, spread in doc["schemes"].items():
        bands = ", ".join(f"{t} {v['band_mean']:+.2f} ± {v['band_sd']:.2f}" for t, v in spread["terms"].items())
        print(f"{label}, seeds {spread['seeds']}: {bands}")
    if a.reach:
        from analysis.reach import COLUMNS, checkpoint_reach
        from posenc.retrieval import write_rows

        rules = [None] + [e for spec in a.extensions for e in spec.split() if "@" not in e]  # "a b" from DVC
        has_lm = reach_task(r["task"] for r in json.loads(Path(a.runs).read_text())["runs"]) is not None
        ckpts = checkpoints(a.runs, reach_task) if has_lm else []  # no causal-LM runs: a header alone
        rows = [r for c in ckpts for e in rules for r in checkpoint_reach(c, a.multipliers, e)]
        write_rows(rows, a.reach, COLUMNS)
        print(f"{a.scheme}: attention distance and entropy of {len(rows)} (run, rule, length, layer, head) cells")
    return 0


if __name__ == "__main__":
    sys.exit(main())
