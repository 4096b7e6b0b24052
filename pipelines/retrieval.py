"""The exact-match grid of a retrieval run (``task=retrieval``, ``posenc.retrieval``):
lengths x needle depths, also with zero-shot context-extension rules (``rope+yarn``).

    python -m pipelines.retrieval runs/rope/retrieval-s0 --multipliers 1 2 4 8 16 --extensions yarn

The study scores its retrieval runs cell by cell on its pool of workers
(``posenc.retrieval.score_cells`` per (length, depth), then ``finish_grid``; ``pipelines.study``),
or a grid per job with a submitit executor (``pipelines.executors``), on the device each run
was trained on; this CLI scores any run folder the same way in one process, on the CPU
(``grid_job``). The
trials are the same for every scheme and seed (``--trial-seed``, the validation
split's filler); each cell scores ``--trials`` of them (``posenc.retrieval.evaluate_grid``),
and on the first ``--attention-trials`` it measures how much the top layer looks at the
needle (``posenc.retrieval.needle_attention``, column ``needle_attention``). The rows go to
``retrieval[-<rule>].csv`` in the run folder, and the run's MLflow run gets the
metrics ``retrieval/exact_match`` and ``retrieval/digit_acc`` at step = length
(mean over depths; ``..._<rule>`` with a rule) and the rows as an artifact.
"""

from __future__ import annotations

import argparse
import sys


def grid_job(out_dir: str, run, multipliers: list[int], extensions: list[str], settings: dict) -> list[dict]:
    """Score a trained retrieval run's whole grid in this process (plain, then with
    each zero-shot rule), write each grid beside the run and log it to MLflow (``run``:
    its ``posenc.runs.StoredRun``)."""
    from posenc.retrieval import DEPTHS, finish_grid, score_cells

    cells = [(m * run.train_len, d) for m in multipliers for d in DEPTHS]
    rows = []
    for ext in [None, *extensions]:
        rows += finish_grid(score_cells(out_dir, cells, settings, ext), run.tracking_uri, out_dir, ext)[0]
    return rows


def add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The grid's settings, the same for this CLI and the study's stages."""
    p.add_argument("--trial-seed", type=int, default=0, help="seed of the evaluation trials (the same for every scheme)")
    p.add_argument("--trials", type=int, default=40, help="trials a (length, depth) cell scores")
    p.add_argument("--attention-trials", type=int, default=8,
                   help="trials of a cell on which the top layer's attention to the needle is measured (0: none)")


def check_grid_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.trials < 1:
        p.error(f"--trials {a.trials}: a cell needs at least one trial")
    if not 0 <= a.attention_trials <= a.trials:
        p.error(f"--attention-trials {a.attention_trials}: between 0 and --trials ({a.trials})")


def grid_settings(a: argparse.Namespace) -> dict:
    return {"trial_seed": a.trial_seed, "trials": a.trials, "attention_trials": a.attention_trials}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.retrieval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a retrieval run folder (python train.py task=retrieval ...)")
    p.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--extensions", nargs="*", default=[], help="zero-shot context-extension rules (rope: pi ntk yarn)")
    add_grid_arguments(p)
    a = p.parse_args(argv)
    check_grid_arguments(p, a)
    from posenc.runs import StoredRun, load_state, resolve_checkpoint
    from posenc.tasks import Retrieval

    res = resolve_checkpoint(a.run, "last")
    run = StoredRun.read(load_state(res.path), res.path)
    if not isinstance(run.task, Retrieval):
        p.error(f"{a.run} is a task={run.task_name} run, not a retrieval one")
    rows = grid_job(str(res.path.parent.parent), run, a.multipliers, a.extensions, grid_settings(a))
    for r in rows:
        print(f"{r['scheme']:>16} {r['length']:>6} depth {r['depth']:.2f}: exact match {100 * r['exact_match']:5.1f}% "
              f"[{100 * r['exact_lo']:.1f}, {100 * r['exact_hi']:.1f}] over {r['trials']}, digits {100 * r['digit_acc']:.1f}%, "
              f"top layer on the needle {100 * r['needle_attention']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
