"""The exact-match grid of a retrieval run (``task=retrieval``, ``posenc.retrieval``):
lengths x needle depths, also with zero-shot context-extension rules (``rope+yarn``).

    python -m pipelines.retrieval runs/rope/retrieval-s0 --multipliers 1 2 4 8 16 --extensions yarn

The study scores its retrieval runs cell by cell on its pool of workers
(``score_cells`` per (length, depth), then ``finish_grid``; ``pipelines.study``), or a
grid per job with a submitit executor (``pipelines.executors``), on the device each run
was trained on; this CLI scores any run folder the same way in one process, on the CPU
(``grid_job``). The
trials are the same for every scheme and seed (``--trial-seed``, the validation
split's filler); each cell scores ``--trials`` of them (``posenc.retrieval.evaluate_grid``),
and on the first ``--attention-trials`` it measures how much the top layer looks at the
needle (``analysis.reach.needle_attention``, column ``needle_attention``). The rows go to
``retrieval[-<rule>].csv`` in the run folder, and the run's MLflow run gets the
metrics ``retrieval/exact_match`` and ``retrieval/digit_acc`` at step = length
(mean over depths; ``..._<rule>`` with a rule) and the rows as an artifact.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path


@functools.lru_cache(maxsize=4)
def _loaded(run_dir: str, extension: str | None, base_len: int | None, device: str = "cpu"):
    """(model, task, row labels) of a trained run on ``device``, kept by a worker for the
    cells that follow.

    ``base_len``: the L of the grid's multiples and of the rule's original length
    (a run fine-tuned at 4L is scored on the lengths of the run it came from)."""
    from posenc import retrieval as rt
    from posenc.runs import open_run, resolve_checkpoint, run_data

    res = resolve_checkpoint(run_dir, "last")
    cfg, vocab_size, module = open_run(res.path, device, extension, base_len)
    L = base_len or int(cfg["data"]["seq_len"])
    dm = run_data(cfg, vocab_size=vocab_size)
    task = rt.Task(dm.prepared, int(cfg["task"]["digits"]), 1)
    labels = {"scheme": cfg["encoding"]["name"] + (f"+{extension}" if extension else ""), "extension": extension or "",
              "seed": cfg["seed"], "train_len": L, "run_id": res.run_id}
    return module.model, task, labels


def score_cells(run_dir: str, cells: list[tuple[int, float]], settings: dict, extension: str | None = None,
                base_len: int | None = None, extra: dict | None = None, device: str = "cpu") -> list[dict]:
    """Grid rows of a trained run on the given (length, depth) cells (with a
    context-extension rule switched on past L), on ``device``; ``extra`` replaces row
    labels (a fine-tuned run's scheme and extension). ``settings``: ``trial_seed``,
    ``trials`` and ``attention_trials``. A cell's row is the same whichever cells share
    the call (its trials are drawn from the cell and the trial seed alone): the study
    scores a grid a cell per job on its pool, and a whole grid per submitit job."""
    import math

    import torch

    from analysis.reach import needle_attention
    from posenc import retrieval as rt

    model, task, labels = _loaded(str(run_dir), extension, base_len, device)
    filler, seed = task.filler("validation"), settings["trial_seed"]
    rows = []
    for length, depth in cells:
        (row,) = rt.evaluate_grid(model, filler, task.sym, [length], [depth], digits=task.digits, seed=seed,
                                  trials=settings["trials"], device=device)
        row["needle_attention"] = math.nan
        if row["trials"] and settings["attention_trials"]:
            idx = torch.stack([rt.trial(filler, task.sym, length, depth, task.digits, seed, i)[0]
                               for i in range(settings["attention_trials"])])
            start = round(depth * rt.Layout(length, 1, task.digits).filler)  # the needle's key
            row["needle_attention"] = needle_attention(model, idx.to(device), start, 1 + task.digits, task.digits)
        rows.append(row)
    L = labels["train_len"]
    return [{**labels, **(extra or {}), "multiple": r["length"] // L, **r} for r in rows]


def log_grid(rows: list[dict], run_id: str | None, uri: str, extension: str | None, files: list[Path]) -> None:
    """MLflow metrics of a run's grid: mean over depths at step = length."""
    if run_id is None:
        return
    import pandas as pd

    from posenc import tracking

    tail = f"_{extension}" if extension else ""
    means = pd.DataFrame(rows).groupby("length")[["exact_match", "digit_acc"]].mean().dropna()  # n/a lengths
    c = tracking.client(uri)
    tracking.log_curves(c, run_id, {f"retrieval/{k}{tail}": list(means[k].items()) for k in means.columns})
    tracking.log_files(c, run_id, files, "retrieval")


def finish_grid(rows: list[dict], uri: str, run_dir: str, extension: str | None = None) -> tuple[list[dict], str]:
    """A run's whole grid, sorted by (length, depth): written beside the run
    (``retrieval[-<rule>].csv``, the zero-shot rule it was scored with) and logged
    to its MLflow run; returns the rows and a line of progress (the exact match at L)."""
    from posenc.retrieval import write_rows
    from posenc.runs import RunFolder

    rows = sorted(rows, key=lambda r: (r["length"], r["depth"]))
    path = write_rows(rows, RunFolder(run_dir).grid(extension))
    log_grid(rows, rows[0]["run_id"], uri, extension, [path])
    at_l = [r["exact_match"] for r in rows if r["multiple"] == 1]
    return rows, f"{rows[0]['scheme']} s{rows[0]['seed']} retrieval grid: exact match at L {100 * sum(at_l) / len(at_l):.1f}%"


def grid_job(out_dir: str, cfg, multipliers: list[int], extensions: list[str], settings: dict) -> list[dict]:
    """Score a trained retrieval run's whole grid in this process (plain, then with
    each zero-shot rule), write each grid beside the run and log it to MLflow."""
    from posenc.retrieval import DEPTHS

    cells = [(m * int(cfg.data.seq_len), d) for m in multipliers for d in DEPTHS]
    rows = []
    for ext in [None, *extensions]:
        rows += finish_grid(score_cells(out_dir, cells, settings, ext), cfg.logger.tracking_uri, out_dir, ext)[0]
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
    from omegaconf import OmegaConf

    from posenc.runs import load_state, resolve_checkpoint, stored_run

    res = resolve_checkpoint(a.run, "last")
    cfg = OmegaConf.create(stored_run(load_state(res.path), res.path)["cfg"])
    from posenc.tasks import Retrieval, build

    if not isinstance(build(cfg.task), Retrieval):
        p.error(f"{a.run} is a task={cfg.task.name} run, not a retrieval one")
    rows = grid_job(str(res.path.parent.parent), cfg, a.multipliers, a.extensions,
                    grid_settings(a))
    for r in rows:
        print(f"{r['scheme']:>16} {r['length']:>6} depth {r['depth']:.2f}: exact match {100 * r['exact_match']:5.1f}% "
              f"[{100 * r['exact_lo']:.1f}, {100 * r['exact_hi']:.1f}] over {r['trials']}, digits {100 * r['digit_acc']:.1f}%, "
              f"top layer on the needle {100 * r['needle_attention']:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
