"""Length extrapolation of a trained model: perplexity at L, 2L, 4L, ... (Press et al. 2022).

    python -m pipelines.extrapolate outputs/runs/<stamp>_alibi-extrap-L64-s0 \
        --out results/extrapolation/alibi-s0.csv
    python -m pipelines.extrapolate <mlflow run id> --methods nonoverlapping sliding --stride 32

CHECKPOINT is a .ckpt file, a run folder (its checkpoints/last.ckpt, or the
best with --which best) or an MLflow run id. Writes <out>.csv and <out>.json
(one row per length and method) and logs ``extrapolation/ppl_<method>`` to the
model's MLflow run with step = evaluation length. The same validation tokens
are scored at every length: see ``posenc.evaluate``.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys

from posenc import evaluate as ev


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.extrapolate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("checkpoint", nargs="+", help=".ckpt path, run folder or MLflow run id (several allowed)")
    p.add_argument("--out", help="results file (.csv; a .json twin is written beside it). With several "
                   "checkpoints all rows go into this one file")  # fmt: skip
    p.add_argument("--multipliers", type=int, nargs="+", default=list(ev.DEFAULT_MULTIPLIERS),
                   help="evaluation lengths as multiples of the training length (default: 1 2 4 8 16)")
    p.add_argument("--lengths", type=int, nargs="+", help="explicit evaluation lengths (instead of multipliers)")
    p.add_argument("--methods", nargs="+", choices=ev.METHODS, default=list(ev.METHODS))
    p.add_argument("--stride", type=int, help="sliding-window stride in tokens (default: half the window)")
    p.add_argument("--max-tokens", type=int, default=ev.DEFAULT_MAX_TOKENS,
                   help="scored tokens, floored to a multiple of every length; 0 = the whole split")
    p.add_argument("--split", default="validation", choices=["validation", "test", "train"])
    p.add_argument("--passages", type=int, default=1,
                   help="passages of the split the scored tokens are cut into, drawn by the run's seed (default: 1, "
                        "the split's first tokens)")
    p.add_argument("--token-budget", type=int, default=ev.DEFAULT_TOKEN_BUDGET,
                   help="batch * length stays under this many tokens")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default: cuda when present)")
    p.add_argument("--which", choices=["last", "best"], default="last", help="checkpoint of a run folder / run id")
    p.add_argument("--data-dir", help="replace the corpus folder recorded in the checkpoint")
    p.add_argument("--cache-dir", help="replace the tokenizer/token cache recorded in the checkpoint")
    p.add_argument("--runs-dir", help="where run folders are searched for a run id (default: ./outputs)")
    p.add_argument("--tracking-uri", help="MLflow URI (default: the run's own, else sqlite:///./mlflow.db)")
    p.add_argument("--extension", choices=["pi", "pi_dynamic", "ntk", "yarn"],
                   help="a RoPE context-extension rule applied past the training length (rows: rope+<rule>)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to the model's MLflow run")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    if a.passages < 1:
        p.error(f"--passages {a.passages}: score at least one passage")
    for flag, values in (("--lengths", a.lengths), ("--multipliers", a.multipliers)):
        if values and min(values) < 1:
            p.error(f"{flag} must be at least 1, got {values}")
    return a


def main(argv: list[str] | None = None) -> list[dict]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    a = parse_args(argv)
    settings = ev.Settings(
        multipliers=a.multipliers, lengths=a.lengths, methods=a.methods, stride=a.stride,
        max_tokens=a.max_tokens or None, split=a.split, passages=a.passages, token_budget=a.token_budget,
        device=a.device,
        which=a.which, data_dir=a.data_dir, cache_dir=a.cache_dir, runs_dir=a.runs_dir,
        tracking_uri=a.tracking_uri, log_mlflow=not a.no_mlflow, progress=not a.no_progress, extension=a.extension,
    )  # fmt: skip
    rows: list[dict] = []
    single = len(a.checkpoint) == 1
    for ref in a.checkpoint:
        # one checkpoint: its results files are logged to its run; several: one combined file at the end
        got, _ = ev.evaluate_checkpoint(ref, settings, a.out if single else None)
        rows += got
    if a.out and not single:
        ev.write_results(rows, a.out)
    for r in rows:
        ppl = "n/a" if r["ppl"] is None or not math.isfinite(r["ppl"]) else f"{r['ppl']:.3f}"
        print(f"{r['scheme']:>20} s{r['seed']} L={r['train_len']:<5} T={r['eval_len']:<6} {r['method']:<15} "
              f"ppl={ppl:>10} n={r['n_tokens']} {r['note']}")  # fmt: skip
    return rows


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ValueError, FileNotFoundError) as e:  # bad input: one line, not a traceback
        sys.exit(f"error: {e}")
