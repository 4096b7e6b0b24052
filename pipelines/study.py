"""One scheme of the study: its causal-LM and masked-LM runs over seeds, the
length extrapolation of every causal-LM run, and its retrieval runs with their
exact-match grid, on a pool of worker processes (or another executor, ``--executor``).

    python -m pipelines.study rope --tasks lm mlm --seeds 0 1 2 --workers 2 --threads 1 \
        --runs-dir runs/rope --results results/runs/rope.json \
        --extrapolation results/extrapolation/rope.csv --multipliers 1 2 4 8 16 --max-tokens 16384 \
        --common "data=tinyshakespeare data.vocab_size=260 model=tiny" --scheme-overrides "" \
        --lm "data.seq_len=64 trainer.max_steps=600" --mlm "data.seq_len=64 trainer.max_steps=600" \
        --retrieval "data.seq_len=64 trainer.max_steps=1200" --retrieval-seeds 0 \
        --retrieval-results results/retrieval/rope.csv --retrieval-extensions yarn

Why a pool inside one stage: ``dvc repro`` runs its stages one at a time, so
a stage per run would leave the second core idle, and parallel ``dvc repro``
calls fight over the repository lock. A stage per scheme keeps DVC's caching
exact (a change to one scheme's settings re-runs that scheme only) while its
runs share the cores: ``--workers`` processes of ``--threads`` torch threads,
forked from a server that has imported torch and Lightning once, so each
stage pays the import cost once, not once per run (the parent process imports
neither before the pool starts).

Each job is one training run (``posenc.train.train``) into
``<runs-dir>/<task>-s<seed>/``; a causal-LM job then scores its checkpoint at
every evaluation length (``posenc.evaluate``). A retrieval run (``task=retrieval``,
``--retrieval-seeds``, which may be fewer than ``--seeds``; with each fine-tuning
rule of ``--retrieval-extensions`` it also trains its fine-tuned run) is scored
on its exact-match grid by the pool itself, one (length, depth) cell per job, the
longest lengths first (``pipelines.retrieval.score_cells``): a grid at 16L costs
several times its training, and as one job it kept one worker busy long after
the other had finished. Each grid is the run's plain one and one per zero-shot
rule of ``--retrieval-extensions`` (``rope+yarn``); when its last cell is in,
it is written beside its run and logged to its MLflow run, and all grid rows go
to ``--retrieval-results`` (a header alone without the task). ``<runs-dir>`` belongs to the
stage: it is emptied before the runs start, so it never mixes runs of two
versions of the study (the runs are not DVC outputs: they are not committed,
and the committed results must not depend on them being present). The results
file records, per run, the final validation (and test) metrics and the seconds
spent training and evaluating, and for the stage its start-up and wall time;
the extrapolation rows of all seeds go to one file. It also records the machine
(``posenc.machine``: the CPU and which matrix-multiply kernels it ran) and what the
runs were made with (``provenance``): the digests of the shared code
(``posenc.fingerprint.study_core``: the study stage's deps in dvc.yaml), of the scheme (its fingerprint) and of the
study's settings (``--common``, ``--lm``, ``--mlm``, seeds, lengths and the
data's token checksum; not ``--scheme-overrides``, ``--tasks``, ``--extensions``
or the worker count), which the summaries compare before they put schemes in
one table. A failed job does not stop the others; the stage then exits
non-zero naming every failure, and writes no results file (DVC keeps nothing
of a failed stage).

Where the jobs run: ``--executor NAME_OR_PATH`` (default: the environment's
``POSENC_EXECUTOR``, else ``pool``), a preset of ``conf/executor`` or the path of the
user's own YAML (``pipelines.executors`` lists the keys):

* ``pool``: the fork-server pool above, ``--workers`` processes.
* ``gpus``: the same pool with one worker per CUDA device, each owning its device
  (CUDA_VISIBLE_DEVICES) for its life, so a job starts when a device is free and no
  device runs two (``--workers`` is ignored): ``POSENC_EXECUTOR=gpus dvc repro`` on a
  node with several GPUs.
* ``local`` and ``slurm``: each job a submitit job, a subprocess of this machine or an
  sbatch job (``slurm_partition``, ``gpus_per_node``, ``cpus_per_task``, ``mem_gb``,
  ``timeout_min`` in the file). The stage waits for its jobs and writes its results as
  above; a job that fails, is cancelled, times out or is preempted fails the stage,
  named with its job id and log. A job pays a Python and torch start-up (and a queue
  wait), so a retrieval grid is scored in one job, not a cell per job; a cell's row
  does not depend on the cells scored beside it, and the rows are sorted as above.
  Why submitit: Hydra's SLURM launcher is built on it, it is how most users of
  research clusters send Python calls to SLURM, and its local mode goes through the
  same code path (a pickled call run by ``submitit.core._submit`` in a process of its
  own), so a local run tests what a SLURM run does. Why not Ray: it needs a Ray
  cluster started on the SLURM allocation first, and on one node the pool already
  gives one worker per GPU.

The executor is deliberately no DVC param, no part of the stage command in dvc.yaml
and no part of the results' ``provenance``: where the jobs ran changes no result (a
run is seeded by its config, and its device is its trainer's, a setting of the
study), so choosing it must neither invalidate the cached study stages nor change
their digests. The results' ``timing`` block records it (``executor``, ``workers``,
``devices``; ``cluster`` for submitit) beside the threads. Runs are scored on the
device they trained on (``trainer.accelerator``: gpu or cuda -> cuda, else the CPU).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from pipelines import executors
from pipelines.retrieval import add_grid_arguments, check_grid_arguments, grid_settings, scoring_device
from posenc.errors import ConfigError
from posenc.tasks import load, misfits  # light: no torch in the parent before the pool starts

T0 = time.time()

#: modules the fork server imports once for all workers of a stage
PRELOAD = ["posenc.train", "posenc.evaluate", "posenc.retrieval"]


def job_label(scheme: str, task: str, seed: int) -> str:
    """How the progress lines name a job (its MLflow run name also carries the corpus)."""
    return f"{scheme}-{task}-s{seed}"


def parse_extension(spec: str) -> tuple[str, int, int]:
    """``pi`` -> (pi, 0, 0), zero-shot; ``pi@4x100`` -> (pi, 4, 100): fine-tuned with the
    rule at 4L for 100 steps from the run's weights before it is evaluated."""
    rule, _, tune = spec.partition("@")
    if not tune:
        return rule, 0, 0
    try:
        mult, steps = (int(x) for x in tune.split("x"))
    except ValueError:
        raise ValueError(f"extension {spec!r}: write <rule> or <rule>@<multiple>x<steps>, e.g. pi@4x100") from None
    if mult < 1 or steps < 1:
        raise ValueError(f"extension {spec!r}: the multiple and the steps must be at least 1")
    return rule, mult, steps


def finetune_overrides(cfg, rule: str, mult: int, steps: int, init_from: str) -> list[str]:
    """The Hydra overrides that fine-tune a causal-LM run with ``rule`` at ``mult`` x L
    for ``steps`` steps (Chen et al. 2023, scaled down): the same tokens per step,
    a tenth of the learning rate, a short warm-up."""
    L, B = int(cfg.data.seq_len), int(cfg.data.batch_size)
    return [
        f"init_from={init_from}", f"encoding.scheme.scaling={rule}", f"encoding.scheme.original_len={L}",
        f"data.seq_len={mult * L}", f"model.max_len={mult * L}", f"data.batch_size={max(1, B // mult)}",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", f"optim.lr={cfg.optim.lr / 10}",
        f"optim.warmup_steps={max(1, steps // 10)}", f"run_name={cfg.encoding.name}+{rule}+ft{mult}L-{cfg.run_name}",
        "criterion.metric=null",  # a fixed budget: the run it starts from was trained to the criterion
    ]  # fmt: skip


def run_job(scheme: str, task: str, seed: int, overrides: list[str], out_dir: str, extrapolate: dict | None,
            extensions: list[str] = ()) -> dict:
    """Train one run (and evaluate it at every length when ``extrapolate`` is given,
    also with each of the scheme's context-extension rules in ``extensions``, zero-shot
    or after a fine-tune, see ``parse_extension``). A retrieval run is not scored
    here: its ``grids`` (the run with each zero-shot rule, and each fine-tuned run)
    name what the executor scores (``pipelines.retrieval.score_cells``). A run is scored on the
    device it was trained on (``trainer.accelerator``)."""
    started = time.time()
    from posenc import evaluate as ev
    from posenc.config import compose
    from posenc.runs import RunFolder
    from posenc.train import train

    from posenc.tasks import build as build_task

    base = [f"encoding={scheme}", f"task={task}", f"seed={seed}", *overrides]
    cfg = compose(base)
    scored_on_grid = build_task(cfg.task).evaluation == "grid"
    t = time.perf_counter()
    metrics = train(cfg, out_dir=out_dir)
    train_s = time.perf_counter() - t
    rows, grids, eval_s = [], [], 0.0
    L = int(cfg.data.seq_len)
    lengths = [int(m) * L for m in extrapolate["multipliers"]] if extrapolate else []
    device = scoring_device(cfg.trainer.accelerator)  # a run trained on a GPU is scored on it
    common = {"methods": ("nonoverlapping",), "device": device, "progress": False, "lengths": lengths,
              "max_tokens": extrapolate and extrapolate["max_tokens"]}  # fmt: skip
    for spec in [None, *extensions] if extrapolate else []:
        rule, mult, steps = parse_extension(spec) if spec else (None, 0, 0)
        if not mult:  # the run itself, plain or with a rule switched on
            if scored_on_grid:
                grids.append({"run_dir": out_dir, "extension": rule, "base_len": L, "extra": None, "device": device})
                continue
            t = time.perf_counter()
            rows += ev.evaluate_checkpoint(out_dir, ev.Settings(extension=rule, **common))[0]
            eval_s += time.perf_counter() - t
            continue
        tuned_dir = str(Path(out_dir).with_name(f"{task}-{rule}-ft{mult}L-s{seed}"))  # beside the study's runs
        t = time.perf_counter()
        train(compose(base + finetune_overrides(cfg, rule, mult, steps, str(RunFolder(out_dir).last))),
              out_dir=tuned_dir)
        train_s += time.perf_counter() - t
        label = {"scheme": f"{scheme}+{rule}+ft{mult}L", "extension": spec}
        if scored_on_grid:
            grids.append({"run_dir": tuned_dir, "extension": None, "base_len": L, "extra": label, "device": device})
            continue
        t = time.perf_counter()
        rows += ev.evaluate_checkpoint(tuned_dir, ev.Settings(extra=label | {"train_len": L}, **common))[0]
        eval_s += time.perf_counter() - t
    keep = ("val/loss", "val/ppl", "val/acc", "val/exact", "test/loss", "test/ppl", "test/acc", "test/exact",
            "global_step", "criterion_step")
    return {"scheme": scheme, "task": task, "seed": seed, "run_dir": out_dir,
            **{k: metrics[k] for k in keep if k in metrics},
            "train_s": round(train_s, 2), "eval_s": round(eval_s, 2), "started": started, "rows": rows,
            "grids": grids, "tracking_uri": cfg.logger.tracking_uri if cfg.get("logger") else None}


def timed(fn, *args):
    """(fn(*args), its seconds): a job whose time the stage records."""
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def grid_cells(grid: dict, lengths: list[int]) -> list[tuple[int, float]]:
    """The (length, depth) cells of one retrieval grid, the longest (dearest) first."""
    from posenc.retrieval import DEPTHS

    return [(m * grid["base_len"], d) for m in sorted(lengths, reverse=True) for d in DEPTHS]


def provenance(a: argparse.Namespace, done: list[dict]) -> dict:
    """What the runs were made with: digests of the shared code, of the scheme, and of the
    study's settings (the data by the token checksum its runs recorded)."""
    from posenc.fingerprint import files_digest, json_digest, scheme_fingerprint
    from posenc.runs import RunFolder

    tokens = sorted({RunFolder(r["run_dir"]).info()["identity"]["data.tokens_sha256"] for r in done})
    settings = {"common": shlex.split(a.common), "lm": shlex.split(a.lm), "mlm": shlex.split(a.mlm),
                "seeds": a.seeds, "multipliers": a.multipliers, "max_tokens": a.max_tokens, "data": tokens}
    if a.mlm_seeds != a.seeds:  # added only when they differ: the digests of the other studies stay as they were
        settings["mlm_seeds"] = a.mlm_seeds
    if "grid" in a.evaluation.values():  # added only with the task: the digests of the other studies stay as they were
        settings["retrieval"] = {"overrides": shlex.split(a.retrieval), "seeds": a.retrieval_seeds, **a.grid}
    return {"core": files_digest(), "scheme": scheme_fingerprint(a.scheme)["digest"],
            "settings": json_digest(settings)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scheme", help="an encoding name (conf/encoding/<name>.yaml)")
    p.add_argument("--tasks", nargs="+", default=["lm", "mlm"],
                   help="tasks (conf/task/<name>.yaml); --lm, --mlm and --retrieval give the overrides of theirs")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=2, help="training processes at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--executor", default=None,
                   help=f"where the jobs run: a preset of conf/executor ({', '.join(executors.presets())}) or the "
                   f"path of your own .yaml (default: ${executors.ENV}, else pool); see pipelines/executors.py")
    p.add_argument("--runs-dir", required=True, help="run folders go to <runs-dir>/<task>-s<seed>")
    p.add_argument("--results", required=True, help="JSON file: per-run metrics and timings")
    p.add_argument("--extrapolation", help="results file (.csv, with a .json twin) of the causal-LM runs")
    p.add_argument("--multipliers", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--extensions", nargs="*", default=[],
                   help="context-extension rules of the scheme (rope: pi ntk yarn), evaluated zero-shot too; "
                   "<rule>@<multiple>x<steps> (pi@4x100): fine-tuned with the rule at that multiple of L first")
    p.add_argument("--common", default="", help="Hydra overrides for every run (one string)")
    p.add_argument("--scheme-overrides", default="",
                   help="Hydra overrides of this scheme's runs (one string; after --common, before --lm/--mlm)")
    p.add_argument("--lm", default="", help="Hydra overrides for the causal-LM runs")
    p.add_argument("--mlm", default="", help="Hydra overrides for the masked-LM runs")
    p.add_argument("--retrieval", default="", help="Hydra overrides for the retrieval runs")
    p.add_argument("--mlm-seeds", type=int, nargs="+", help="seeds of the masked-LM runs (default: --seeds)")
    p.add_argument("--retrieval-seeds", type=int, nargs="+", help="seeds of the retrieval runs (default: --seeds)")
    p.add_argument("--retrieval-results", help="results file (.csv) of the retrieval grids")
    p.add_argument("--retrieval-extensions", nargs="*", default=[],
                   help="zero-shot rules of --extensions that the retrieval grid is scored with too (yarn)")
    add_grid_arguments(p)
    a = p.parse_args(argv)
    # a list may come as one string ("pi yarn", or "" for none: DVC passes it quoted, since an
    # empty value would leave two spaces in the command, which its lock file does not keep)
    a.extensions = [x for e in a.extensions for x in e.split()]
    a.retrieval_extensions = [x for e in a.retrieval_extensions for x in e.split()]
    if a.workers < 1 or a.threads < 1:
        p.error("--workers and --threads must be at least 1")
    # what each task does with a trained run: "lengths" writes --extrapolation, "grid" --retrieval-results
    try:
        a.evaluation = {t: load(t).evaluation for t in a.tasks}
    except ConfigError as e:
        p.error(str(e))
    kinds = set(a.evaluation.values())
    if "lengths" in kinds and not a.extrapolation:
        p.error("--extrapolation is required when a task scored at every length (the causal LM) is run")
    if "grid" in kinds and not a.retrieval_results:
        p.error("--retrieval-results is required when a task scored on the retrieval grid is run")
    check_grid_arguments(p, a)
    a.grid = grid_settings(a)
    a.retrieval_seeds = a.retrieval_seeds or a.seeds
    a.mlm_seeds = a.mlm_seeds or a.seeds
    for spec in a.extensions:
        try:
            parse_extension(spec)
        except ValueError as e:
            p.error(str(e))
    try:  # where the jobs run: refused here, in one line, before anything runs or the runs folder is emptied
        a.executor = executors.settings(a.executor)
    except ConfigError as e:
        raise SystemExit(refusal(e)) from None
    return a


def refusal(why) -> int:
    """Say in one line why the study refused to run (nothing was run or written); exit 2."""
    print(f"study refused, nothing was run: {why}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    seeds = {"mlm": a.mlm_seeds, "retrieval": a.retrieval_seeds}  # a task's seeds, when its flag gives its own
    n = sum(len(seeds.get(task, a.seeds)) for task in a.tasks)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by the fork server (and a submitit job)
    runs = Path(a.runs_dir)
    try:  # submitit's own checks of the settings (SLURM's srun on PATH): before anything runs
        ex = executors.build(a.executor, workers=min(a.workers, n), threads=a.threads, preload=PRELOAD,
                             folder=runs.parent / ".submitit" / runs.name)  # beside the runs folder, not in it
    except ConfigError as e:
        return refusal(e)
    if a.executor["kind"] != "pool" or a.executor["gpus"] is not None:
        print(f"{a.scheme}: {n} runs as {ex.banner()}", flush=True)
    done, failed = [], []
    grids: dict[tuple, dict] = {}  # (seed, grid index) -> the grid, its rows and its jobs left
    try:
        with ex:
            # the scheme takes every task, or nothing runs (a pool worker imports its class: the parent need not)
            try:
                refused = ex.call(misfits, a.scheme, a.tasks)
            except (ConfigError, OSError, ImportError, ValueError) as e:
                refused = [f"scheme {a.scheme}: {e}"]
            if refused:
                print("\n".join(["study refused, nothing was run:"] + refused), file=sys.stderr)
                return 2
            evaluation = a.evaluation
            jobs = []
            retrieval_rules = [e for e in a.extensions if e in a.retrieval_extensions]
            rules = {"lm": a.extensions, "retrieval": retrieval_rules}  # a task's rules, from its flag
            own = {"lm": a.lm, "mlm": a.mlm, "retrieval": a.retrieval}  # a task's overrides, from its flag
            # the longest jobs first: a run scored on its grid (training and the grid), then the runs
            # scored at every length, then the rest
            for task in sorted(a.tasks, key=lambda t: ["grid", "lengths", None].index(evaluation[t])):
                for seed in seeds.get(task, a.seeds):
                    overrides = shlex.split(a.common) + shlex.split(a.scheme_overrides) + shlex.split(own.get(task, ""))
                    extra = {"multipliers": a.multipliers, "max_tokens": a.max_tokens} if evaluation[task] else None
                    jobs.append((a.scheme, task, seed, overrides, str(runs / f"{task}-s{seed}"), extra,
                                 rules.get(task, [])))
            if runs.is_dir():  # the stage's own folder: no run of an earlier version stays beside the new ones
                shutil.rmtree(a.runs_dir)
            ex.clear()  # and the logs of the jobs of an earlier version
            pending = {ex.submit(run_job, *job, name=job_label(*job[:3])): ("run", job) for job in jobs}
            # imported while the workers train: the parent itself never imports Lightning
            from pipelines.retrieval import finish_grid, score_cells
            from posenc.evaluate import write_results
            from posenc.files import portable_path, write_json

            while pending:
                finished = ex.wait(pending)
                for fut in finished:
                    kind, job = pending.pop(fut)
                    where = ex.describe(fut)
                    where = f" ({where})" if where else ""
                    if kind == "cells":
                        key, cells = job
                        g = grids[key]
                        try:
                            rows, seconds = fut.result()
                            g["rows"] += rows
                            g["record"]["eval_s"] = round(g["record"]["eval_s"] + seconds, 2)
                        except Exception as e:  # noqa: BLE001 -- reported below, the others go on
                            part = f"grid cell {cells[0]}" if len(cells) == 1 else f"grid of {len(cells)} cells"
                            failed.append(f"{job_label(a.scheme, 'retrieval', key[0])} {part}: {ex.reason(e)}{where}")
                        g["left"] -= 1
                        if g["left"] == 0 and len(g["rows"]) == g["cells"]:
                            rows = finish_grid(g["run_dir"], g["rows"], g["uri"], g["extension"])
                            g["record"]["rows"] += rows
                            at_l = [r["exact_match"] for r in rows if r["multiple"] == 1]
                            print(f"    {rows[0]['scheme']} s{key[0]} retrieval grid: exact match at L "
                                  f"{100 * sum(at_l) / len(at_l):.1f}%", flush=True)
                        continue
                    scheme, task, seed = job[:3]
                    try:
                        r = fut.result()
                    except Exception as e:  # noqa: BLE001 -- reported below, the others go on
                        failed.append(f"{job_label(scheme, task, seed)}: {ex.reason(e)}{where}")
                        print(f"[{len(done) + len(failed)}/{n}] {job_label(scheme, task, seed)} FAILED", flush=True)
                        continue
                    done.append(r)
                    uri = r.pop("tracking_uri")
                    for i, grid in enumerate(r.pop("grids")):  # score a retrieval run's grids
                        cells = grid_cells(grid, a.multipliers)
                        # a cell per job on a pool (the workers share a grid); a grid per job where a job
                        # pays a start-up (submitit): a cell's rows do not depend on the cells beside it
                        parts = [cells] if ex.whole_grids else [[cell] for cell in cells]
                        grids[seed, i] = {**grid, "rows": [], "cells": len(cells), "left": len(parts),
                                          "uri": uri, "record": r}
                        for part in parts:
                            fut = ex.submit(timed, score_cells, grid["run_dir"], part, a.grid, grid["extension"],
                                            grid["base_len"], grid["extra"], grid["device"],
                                            name=f"{job_label(scheme, task, seed)}-grid{i}")
                            pending[fut] = ("cells", ((seed, i), part))
                    acc = f", val acc {100 * r['val/acc']:.1f}%" if "val/acc" in r else ""
                    print(f"[{len(done) + len(failed)}/{n}] {job_label(scheme, task, seed)}: val ppl {r.get('val/ppl', float('nan')):.3f}"
                          f"{acc}, train {r['train_s']:.0f} s, eval {r['eval_s']:.0f} s", flush=True)
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or a worker's run stopped by a signal
        why = str(e) if str(e) and not isinstance(e, KeyboardInterrupt) else "Ctrl-C"
        print(f"study of {a.scheme} interrupted ({why}): {len(done)} of {n} runs had finished; a run stopped "
              f"by the interrupt keeps its last.ckpt under {a.runs_dir}; no results were written", file=sys.stderr)
        return 130
    if failed:
        print("\n".join(["study failed:"] + failed), file=sys.stderr)
        return 1
    done.sort(key=lambda r: (r["task"], r["seed"]))
    # rows by what the task scores its runs on: perplexity at every length, or the retrieval grid
    rows = {kind: [row for r in done if evaluation[r["task"]] == kind for row in r["rows"]] for kind in ("lengths", "grid")}
    for r in done:
        del r["rows"]
    if a.extrapolation and any(evaluation[t] == "lengths" for t in a.tasks):
        write_results(rows["lengths"], a.extrapolation)
    elif a.extrapolation:  # no task scored at every length: no file of an earlier version stays as this one's
        for old in (Path(a.extrapolation), Path(a.extrapolation).with_suffix(".json")):
            old.unlink(missing_ok=True)
    if a.retrieval_results:  # without the task, a header alone (the stage's output all the same)
        from posenc.retrieval import write_rows

        order = lambda r: (r["scheme"], r["seed"], r["length"], r["depth"])  # noqa: E731 -- grids finish in any order
        write_rows(sorted(rows["grid"], key=order), a.retrieval_results)
    for r in done:
        r["run_dir"] = portable_path(r["run_dir"])
    timing = {
        **ex.record(), "threads": a.threads,  # where the jobs ran: no part of the provenance
        "startup_s": round(min(r.pop("started") for r in done) - T0, 2),
        "train_s": round(sum(r["train_s"] for r in done), 2),
        "eval_s": round(sum(r["eval_s"] for r in done), 2),
        "wall_s": round(time.time() - T0, 2),
    }
    from posenc.machine import machine

    write_json(a.results, {"scheme": a.scheme, "provenance": provenance(a, done), "machine": machine(), "timing": timing,
                           "runs": done})
    print(f"{a.scheme}: {n} runs in {timing['wall_s']:.0f} s (start-up {timing['startup_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
