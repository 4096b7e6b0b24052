"""One scheme of the study: its causal-LM and masked-LM runs over seeds, and the
length extrapolation of every causal-LM run, on a pool of worker processes.

    python -m pipelines.study rope --tasks lm mlm --seeds 0 1 2 --workers 2 --threads 1 \
        --runs-dir runs/rope --results results/runs/rope.json \
        --extrapolation results/extrapolation/rope.csv --multipliers 1 2 4 8 16 --max-tokens 16384 \
        --common "data=tinyshakespeare data.vocab_size=260 model=tiny" --scheme-overrides "" \
        --lm "data.seq_len=64 trainer.max_steps=600" --mlm "data.seq_len=64 trainer.max_steps=600"

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
every evaluation length (``posenc.evaluate``). ``<runs-dir>`` belongs to the
stage: it is emptied before the runs start, so it never mixes runs of two
versions of the study (the runs are not DVC outputs: they are not committed,
and the committed results must not depend on them being present). The results
file records, per run, the final validation (and test) metrics and the seconds
spent training and evaluating, and for the stage its start-up and wall time;
the extrapolation rows of all seeds go to one file. It also records what the
runs were made with (``provenance``): the digests of the shared code
(``posenc.fingerprint.STUDY_CORE``), of the scheme (its fingerprint) and of the
study's settings (``--common``, ``--lm``, ``--mlm``, seeds, lengths and the
data's token checksum; not ``--scheme-overrides``, ``--tasks``, ``--extensions``
or the worker count), which the summaries compare before they put schemes in
one table. A failed job does not stop the others; the stage then exits
non-zero naming every failure, and writes no results file (DVC keeps nothing
of a failed stage).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shlex
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

T0 = time.time()

#: modules the fork server imports once for all workers of a stage
PRELOAD = ["posenc.train", "posenc.evaluate"]


def job_label(scheme: str, task: str, seed: int) -> str:
    """How the progress lines name a job (its MLflow run name also carries the corpus)."""
    return f"{scheme}-{task}-s{seed}"


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


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
    ]  # fmt: skip


def run_job(scheme: str, task: str, seed: int, overrides: list[str], out_dir: str, extrapolate: dict | None,
            extensions: list[str] = ()) -> dict:
    """Train one run (and evaluate it at every length when ``extrapolate`` is given,
    also with each of the scheme's context-extension rules in ``extensions``, zero-shot
    or after a fine-tune, see ``parse_extension``)."""
    started = time.time()
    from pipelines.common import compose_config
    from posenc import evaluate as ev
    from posenc.train import train

    base = [f"encoding={scheme}", f"task={task}", f"seed={seed}", *overrides]
    cfg = compose_config(base)
    t = time.perf_counter()
    metrics = train(cfg, out_dir=out_dir)
    train_s = time.perf_counter() - t
    rows, eval_s = [], 0.0
    if extrapolate is not None:
        L = int(cfg.data.seq_len)
        lengths = [int(m) * L for m in extrapolate["multipliers"]]
        common = {"methods": ("nonoverlapping",), "device": "cpu", "progress": False, "lengths": lengths,
                  "max_tokens": extrapolate["max_tokens"]}  # fmt: skip
        for spec in [None, *extensions]:
            rule, mult, steps = parse_extension(spec) if spec else (None, 0, 0)
            if not mult:  # the run itself, plain or with a rule switched on
                t = time.perf_counter()
                rows += ev.evaluate_checkpoint(out_dir, ev.Settings(extension=rule, **common))[0]
                eval_s += time.perf_counter() - t
                continue
            tuned_dir = str(Path(out_dir).with_name(f"{task}-{rule}-ft{mult}L-s{seed}"))  # beside the study's runs
            t = time.perf_counter()
            train(compose_config(base + finetune_overrides(cfg, rule, mult, steps, f"{out_dir}/checkpoints/last.ckpt")),
                  out_dir=tuned_dir)
            train_s += time.perf_counter() - t
            t = time.perf_counter()
            label = {"scheme": f"{scheme}+{rule}+ft{mult}L", "train_len": L, "extension": spec}
            rows += ev.evaluate_checkpoint(tuned_dir, ev.Settings(extra=label, **common))[0]
            eval_s += time.perf_counter() - t
    keep = ("val/loss", "val/ppl", "val/acc", "test/loss", "test/ppl", "test/acc", "global_step")
    return {"scheme": scheme, "task": task, "seed": seed, "run_dir": out_dir,
            **{k: metrics[k] for k in keep if k in metrics},
            "train_s": round(train_s, 2), "eval_s": round(eval_s, 2), "started": started, "rows": rows}


def provenance(a: argparse.Namespace, done: list[dict]) -> dict:
    """What the runs were made with: digests of the shared code, of the scheme, and of the
    study's settings (the data by the token checksum its runs recorded)."""
    import json

    from posenc.fingerprint import files_digest, json_digest, scheme_fingerprint

    tokens = sorted({json.loads((Path(r["run_dir"]) / "run.json").read_text())["identity"]["data.tokens_sha256"]
                     for r in done})
    settings = {"common": shlex.split(a.common), "lm": shlex.split(a.lm), "mlm": shlex.split(a.mlm),
                "seeds": a.seeds, "multipliers": a.multipliers, "max_tokens": a.max_tokens, "data": tokens}
    return {"core": files_digest(), "scheme": scheme_fingerprint(a.scheme)["digest"],
            "settings": json_digest(settings)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scheme", help="an encoding name (conf/encoding/<name>.yaml)")
    p.add_argument("--tasks", nargs="+", choices=["lm", "mlm"], default=["lm", "mlm"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--workers", type=int, default=2, help="training processes at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
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
    a = p.parse_args(argv)
    if a.workers < 1 or a.threads < 1:
        p.error("--workers and --threads must be at least 1")
    if "lm" in a.tasks and not a.extrapolation:
        p.error("--extrapolation is required when the causal-LM task is run")
    for spec in a.extensions:
        try:
            parse_extension(spec)
        except ValueError as e:
            p.error(str(e))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    jobs = []
    for task in a.tasks:  # causal-LM jobs first: they also evaluate, so they are the longest
        for seed in a.seeds:
            overrides = shlex.split(a.common) + shlex.split(a.scheme_overrides) + shlex.split(getattr(a, task))
            extra = {"multipliers": a.multipliers, "max_tokens": a.max_tokens} if task == "lm" else None
            jobs.append((a.scheme, task, seed, overrides, str(Path(a.runs_dir) / f"{task}-s{seed}"), extra,
                         a.extensions if task == "lm" else []))
    if Path(a.runs_dir).is_dir():  # the stage's own folder: no run of an earlier version stays beside the new ones
        shutil.rmtree(a.runs_dir)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by the fork server
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    done, failed, n = [], [], len(jobs)
    try:
        with ProcessPoolExecutor(min(a.workers, n), mp_context=ctx, initializer=_init_worker,
                                 initargs=(a.threads,)) as pool:
            futures = {pool.submit(run_job, *job): job for job in jobs}
            # imported while the workers train: the parent itself never imports Lightning
            from posenc.evaluate import write_results
            from posenc.files import portable_path, write_json

            for fut in as_completed(futures):
                scheme, task, seed = futures[fut][:3]
                try:
                    r = fut.result()
                except Exception as e:  # noqa: BLE001 -- reported below, the others go on
                    failed.append(f"{job_label(scheme, task, seed)}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                    print(f"[{len(done) + len(failed)}/{n}] {job_label(scheme, task, seed)} FAILED", flush=True)
                    continue
                done.append(r)
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
    rows = [row for r in done for row in r.pop("rows")]
    if "lm" in a.tasks:
        write_results(rows, a.extrapolation)
    for r in done:
        r["run_dir"] = portable_path(r["run_dir"])
    timing = {
        "workers": min(a.workers, n), "threads": a.threads,
        "startup_s": round(min(r.pop("started") for r in done) - T0, 2),
        "train_s": round(sum(r["train_s"] for r in done), 2),
        "eval_s": round(sum(r["eval_s"] for r in done), 2),
        "wall_s": round(time.time() - T0, 2),
    }
    write_json(a.results, {"scheme": a.scheme, "provenance": provenance(a, done), "timing": timing, "runs": done})
    print(f"{a.scheme}: {n} runs in {timing['wall_s']:.0f} s (start-up {timing['startup_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
