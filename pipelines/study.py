"""One scheme of the study: its runs of every task it takes, over each task's seeds, and what
each task does with a trained run, on a pool of worker processes (or another executor,
``--executor``).

    python -m pipelines.study rope --params params.yaml --tasks lm mlm retrieval \
        --extensions "pi ntk yarn pi@4x200" --workers 2 --threads 1 --runs-dir runs/rope --results-dir results \
        --common "data=tinyshakespeare data.vocab_size=260 model=micro"

A task's part is data: its entry under ``tasks:`` in the params file, the same keys for every
task (``posenc.tasks.STUDY_KEYS``: seeds, window, batch, steps, validation interval, criterion,
overrides and ``evaluate``), and the rest is asked of its class (``posenc.tasks``): the
overrides of its runs (``run_overrides``), what it does with a trained run (``evaluate``: calls
made in the run's own job, giving rows, and follow-up jobs such as the retrieval grid's cells),
the metrics kept (``kept``) and where its rows go (``outputs``, ``write``). The stage plans
(``plan``), runs on the executor (``Stage``) and writes (``write``); it names no task.

Why a pool inside one stage: ``dvc repro`` runs its stages one at a time, so
a stage per run would leave the second core idle, and parallel ``dvc repro``
calls fight over the repository lock. A stage per scheme keeps DVC's caching
exact (a change to one scheme's settings re-runs that scheme only) while its
runs share the cores: ``--workers`` processes of ``--threads`` torch threads,
forked from a server that has imported torch and Lightning once, so each
stage pays the import cost once, not once per run (the parent process imports
neither before the pool starts).

Each job is one training run (``posenc.train.train``) into ``<runs-dir>/<task>-s<seed>/``,
then the fine-tunes of the rules of the scheme's ``--extensions`` that its task's ``evaluate:
extensions`` takes (``<rule>@<m>x<n>``, beside it), then its task's calls (the causal LM: its
perplexity at every length, ``posenc.evaluate``). Follow-up jobs go to the same executor, one
part per job (a retrieval grid's (length, depth) cells, the longest first: a grid at 16L costs
several times its training, and as one job it kept one worker busy long after the other had
finished), or one job for all parts where a job pays a start-up (submitit); when a follow-up's
last part is in, its ``finish`` writes it beside its run and logs it to MLflow.
``<runs-dir>`` belongs to the stage: it is emptied before the runs start, so it never mixes
runs of two versions of the study (the runs are not DVC outputs: they are not committed, and
the committed results must not depend on them being present). The stage writes, under
``--results-dir``, each task's rows (``<results>/<scheme>.csv``; a header alone for a task of
the params file that the scheme does not take, since DVC expects every output) and, last,
``runs/<scheme>.json``: per run the kept metrics and the seconds spent training and
evaluating, and for the stage its start-up and wall time. It also records the commit whose
code made the runs (``git``: ``pipelines.commits.made_at``, asked at the project root, where the
stage runs; the report credits it), the machine
(``posenc.machine``: the CPU and which matrix-multiply kernels it ran) and what the runs were
made with (``provenance``): the digests of the shared code (``posenc.fingerprint.study_core``:
the study stage's deps in dvc.yaml), of the scheme (its fingerprint) and of the study's
settings (``--common``, every task entry of the params file and the data's token checksum;
not ``--scheme-overrides``, ``--tasks``, ``--extensions`` or the worker count), which the
summaries compare before they put schemes in one table. A failed job does not stop the
others; the stage then exits non-zero naming every failure, and writes no results (DVC
keeps the committed ones: the outputs are ``persist``).

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
  above; a job that fails or is cancelled fails the stage, named with its job id and
  log. One that is preempted or reaches its time limit is requeued (``max_requeues``
  times at most, then it fails the stage) and resumes its run from its last.ckpt
  (``train_or_resume``). A job pays a Python and torch start-up (and a queue
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
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

from pipelines import executors
from posenc.errors import ConfigError
from posenc.tasks import check_spec, load, misfits, seeds  # light: no torch in the parent before the pool starts

T0 = time.time()

#: modules the fork server imports once for all workers of a stage
PRELOAD = ["posenc.train", "posenc.evaluate"]


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


def scoring_device(accelerator: str) -> str:
    """Where a run is scored after its training: on a GPU when its trainer ran on one
    (``trainer.accelerator`` gpu or cuda), else on the CPU."""
    return "cuda" if str(accelerator).lower() in ("gpu", "cuda") else "cpu"


def task_rules(evaluate: dict, scheme_rules: list[str]) -> list[str]:
    """The rules of the scheme's ``extensions`` a task's runs are also scored with: its entry's
    ``evaluate: extensions`` (``all``, or the rules it takes: ``yarn pi@4x200``)."""
    wanted = str(evaluate.get("extensions") or "").split()
    return list(scheme_rules) if wanted == ["all"] else [r for r in scheme_rules if r in wanted]


def finetune_overrides(cfg, rule: str, mult: int, steps: int, init_from: str) -> list[str]:
    """The Hydra overrides that fine-tune a run with ``rule`` at ``mult`` x L for ``steps``
    steps (Chen et al. 2023, scaled down): the same tokens per step, a tenth of the learning
    rate, a short warm-up; position interpolation (``pi``) with their fixed factor, ``mult``,
    which the fine-tuned run keeps at every length it is scored at."""
    from posenc.runs import StoredRun

    L, B = StoredRun(cfg).train_len, int(cfg.data.batch_size)
    return [
        f"init_from={init_from}", f"encoding.scheme.scaling={rule}", f"encoding.scheme.original_len={L}",
        f"data.seq_len={mult * L}", f"model.max_len={mult * L}", f"data.batch_size={max(1, B // mult)}",
        f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps}", f"optim.lr={cfg.optim.lr / 10}",
        f"optim.warmup_steps={max(1, steps // 10)}", f"run_name={cfg.encoding.name}+{rule}+ft{mult}L-{cfg.run_name}",
        "criterion.metric=null",  # a fixed budget: the run it starts from was trained to the criterion
        *([f"encoding.scheme.factor={mult}"] if rule == "pi" else []),
    ]  # fmt: skip


def train_or_resume(cfg, out_dir: str) -> dict:
    """Train the run of ``cfg`` into ``out_dir``; its final metrics. A job started again
    (requeued after a preemption or its time limit) finds the run as it was left: a finished
    run (its metrics file) is not trained again, and one with a last.ckpt resumes from it
    (``ckpt_path=<it>``: checked against the run's identity as ``ckpt_path=last`` is), so it
    ends where an uninterrupted run would (``tests/test_executors.py`` preempts one)."""
    from posenc.runs import RunFolder
    from posenc.train import train

    run = RunFolder(out_dir)
    if run.metrics.exists():
        kept = json.loads(run.metrics.read_text())
        return {k: v for k, v in kept.items() if k not in ("run_name", "encoding", "task", "seed")}
    if run.last.exists():
        cfg.ckpt_path = str(run.last)
    return train(cfg, out_dir=out_dir)


def run_job(scheme: str, task_name: str, seed: int, overrides: list[str], out_dir: str, evaluate: dict,
            rules: list[str]) -> dict:
    """Train one run, then the fine-tunes of its ``rules`` (``parse_extension``), and let its
    task evaluate the run and its variants (``Task.evaluate``: rows, and follow-up jobs for the
    executor). Everything is scored on the device the run trained on (``trainer.accelerator``).
    Started again after a stop, it resumes what it had not finished (``train_or_resume``)."""
    started = time.time()
    from posenc.config import compose
    from posenc.runs import RunFolder, StoredRun
    from posenc.tasks import build

    base = [f"encoding={scheme}", f"task={task_name}", f"seed={seed}", *overrides]
    cfg = compose(base)
    task = build(cfg.task)
    t = time.perf_counter()
    metrics = train_or_resume(cfg, out_dir)
    L, device = StoredRun(cfg).train_len, scoring_device(cfg.trainer.accelerator)
    scored = []
    for spec in [None, *rules]:
        rule, mult, steps = parse_extension(spec) if spec else (None, 0, 0)
        if not mult:  # the run itself, plain or with a rule switched on
            scored.append({"run_dir": out_dir, "rule": rule, "label": None, "base_len": L, "device": device})
            continue
        tuned = str(Path(out_dir).with_name(f"{task_name}-{rule}-ft{mult}L-s{seed}"))  # beside the study's runs
        train_or_resume(compose(base + finetune_overrides(cfg, rule, mult, steps, str(RunFolder(out_dir).last))), tuned)
        label = {"scheme": f"{scheme}+{rule}+ft{mult}L", "extension": spec}
        scored.append({"run_dir": tuned, "rule": None, "label": label, "base_len": L, "device": device})
    train_s, t = time.perf_counter() - t, time.perf_counter()
    calls, follow_ups = task.evaluate(scored, evaluate)
    rows = [row for call in calls for row in call.fn(**call.kwargs)]
    return {"scheme": scheme, "task": task_name, "seed": seed, "run_dir": out_dir,
            **{k: metrics[k] for k in task.kept() if k in metrics},
            "train_s": round(train_s, 2), "eval_s": round(time.perf_counter() - t, 2), "started": started,
            "rows": rows, "follow_ups": follow_ups,
            "tracking_uri": cfg.logger.tracking_uri if cfg.get("logger") else None}  # fmt: skip


def call_part(fn, part: list, kwargs: dict) -> tuple[list[dict], float]:
    """One follow-up job (``posenc.tasks.FollowUp``): its rows and its seconds."""
    t = time.perf_counter()
    rows = fn(cells=part, **kwargs)
    return rows, time.perf_counter() - t


def provenance(a: argparse.Namespace, done: list[dict]) -> dict:
    """What the runs were made with: digests of the shared code, of the scheme, and of the
    study's settings (every task's entry, and the data by the token checksum its runs recorded)."""
    from posenc.fingerprint import files_digest, json_digest, scheme_fingerprint
    from posenc.runs import RunFolder

    tokens = sorted({RunFolder(r["run_dir"]).info()["identity"]["data.tokens_sha256"] for r in done})
    settings = {"common": shlex.split(a.common), "tasks": a.specs, "data": tokens}
    return {"core": files_digest(), "scheme": scheme_fingerprint(a.scheme)["digest"],
            "settings": json_digest(settings)}


def read_tasks(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Every task entry of the params file (``a.specs``, checked) and the Task object of each
    task this scheme takes (``a.task``)."""
    import yaml

    try:
        a.specs = yaml.safe_load(Path(a.params).read_text()).get("tasks") or {}
    except (OSError, AttributeError, yaml.YAMLError) as e:
        p.error(f"--params {a.params}: {e}")
    try:
        for name, spec in a.specs.items():
            check_spec(name, spec)
            load(name).check_evaluate(name, spec["evaluate"])
        unknown = [t for t in a.tasks if t not in a.specs]
        if unknown:
            raise ConfigError(f"task {', '.join(unknown)} has no entry in {a.params} (tasks: {', '.join(a.specs)})")
        a.task = {t: load(t) for t in a.tasks}
        for spec in a.extensions:
            parse_extension(spec)
    except (ConfigError, ValueError) as e:
        raise SystemExit(refusal(e)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scheme", help="an encoding name (conf/encoding/<name>.yaml)")
    p.add_argument("--params", default="params.yaml", help="the params file: its `tasks:` entries")
    p.add_argument("--tasks", nargs="+", required=True, help="the tasks this scheme takes (entries of tasks:)")
    p.add_argument("--workers", type=int, default=2, help="training processes at once")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--executor", default=None,
                   help=f"where the jobs run: a preset of conf/executor ({', '.join(executors.presets())}) or the "
                   f"path of your own .yaml (default: ${executors.ENV}, else pool); see pipelines/executors.py")
    p.add_argument("--runs-dir", required=True, help="run folders go to <runs-dir>/<task>-s<seed>")
    p.add_argument("--results-dir", required=True,
                   help="<results-dir>/runs/<scheme>.json: per-run metrics and timings; each task's rows go to "
                   "<results-dir>/<its results folder>/<scheme>.csv")
    p.add_argument("--extensions", nargs="*", default=[],
                   help="context-extension rules of the scheme (rope: pi ntk yarn), evaluated zero-shot too; "
                   "<rule>@<multiple>x<steps> (pi@4x100): fine-tuned with the rule at that multiple of L first")
    p.add_argument("--common", default="", help="Hydra overrides for every run (one string)")
    p.add_argument("--scheme-overrides", default="",
                   help="Hydra overrides of this scheme's runs (one string; after --common, before a task's own)")
    a = p.parse_args(argv)
    # a list may come as one string ("pi yarn", or "" for none: DVC passes it quoted, since an
    # empty value would leave two spaces in the command, which its lock file does not keep)
    a.extensions = [x for e in a.extensions for x in e.split()]
    if a.workers < 1 or a.threads < 1:
        p.error("--workers and --threads must be at least 1")
    read_tasks(p, a)
    try:  # where the jobs run: refused here, in one line, before anything runs or the runs folder is emptied
        a.executor = executors.settings(a.executor)
    except ConfigError as e:
        raise SystemExit(refusal(e)) from None
    return a


def refusal(why) -> int:
    """Say in one line why the study refused to run (nothing was run or written); exit 2."""
    print(f"study refused, nothing was run: {why}", file=sys.stderr)
    return 2


def plan(a: argparse.Namespace) -> list[tuple]:
    """The runs of the stage, the dearest task's first (``Task.cost``), so that the cores stay busy
    to the end."""
    jobs = []
    for name in sorted(a.tasks, key=lambda t: -a.task[t].cost):
        spec = a.specs[name]
        overrides = shlex.split(a.common) + shlex.split(a.scheme_overrides) + a.task[name].run_overrides(spec)
        for seed in seeds(spec):
            jobs.append((a.scheme, name, seed, overrides, str(Path(a.runs_dir) / f"{name}-s{seed}"),
                         dict(spec["evaluate"]), task_rules(spec["evaluate"], a.extensions)))
    return jobs


class Stage:
    """The stage's jobs on the executor: each run, then the follow-up jobs its task leaves
    (``posenc.tasks.FollowUp``: parts spread over the workers, or one job where a job pays a
    start-up), finished when their last part is in. A failed job does not stop the others."""

    def __init__(self, a: argparse.Namespace, ex, n: int):
        self.a, self.ex, self.n = a, ex, n
        self.done, self.failed, self.open = [], [], {}

    def label(self, job) -> str:
        return job_label(self.a.scheme, *job[1:3])

    def where(self, fut) -> str:
        where = self.ex.describe(fut)
        return f" ({where})" if where else ""

    def run(self, jobs: list[tuple]) -> None:
        queue = Queue(self.ex)
        self.start(jobs, queue)
        queue.run()

    def start(self, jobs: list[tuple], queue: Queue) -> None:
        for job in jobs:
            queue.put(self, run_job, job, self.label(job), ("run", job))

    def take(self, fut, tag: tuple, queue: Queue) -> None:
        """A finished job of this stage: its run's record and follow-ups, or a part's rows."""
        kind, job = tag
        if kind == "run":
            self.on_run(fut, job, queue)
        else:
            self.on_part(fut, job)

    def on_run(self, fut, job, queue: Queue) -> None:
        name = self.label(job)
        try:
            r = fut.result()
        except Exception as e:  # noqa: BLE001 -- reported at the end, the others go on
            self.failed.append(f"{name}: {self.ex.reason(e)}{self.where(fut)}")
            print(f"[{len(self.done) + len(self.failed)}/{self.n}] {name} FAILED", flush=True)
            return
        self.done.append(r)
        uri = r.pop("tracking_uri")
        for f in r.pop("follow_ups"):
            parts = [[c for part in f.parts for c in part]] if self.ex.whole_grids else f.parts
            self.open[name, f.name] = {"follow": f, "rows": [], "left": len(parts), "uri": uri, "record": r}
            for part in parts:
                queue.put(self, call_part, (f.call, part, f.kwargs), f"{name}-{f.name}", ("part", (name, f.name, len(part))),
                          first=True)
        acc = f", val acc {100 * r['val/acc']:.1f}%" if "val/acc" in r else ""
        print(f"[{len(self.done) + len(self.failed)}/{self.n}] {name}: val ppl {r.get('val/ppl', float('nan')):.3f}"
              f"{acc}, train {r['train_s']:.0f} s, eval {r['eval_s']:.0f} s", flush=True)

    def on_part(self, fut, job) -> None:
        name, follow, size = job
        g = self.open[name, follow]
        try:
            rows, seconds = fut.result()
            g["rows"] += rows
            g["record"]["eval_s"] = round(g["record"]["eval_s"] + seconds, 2)
        except Exception as e:  # noqa: BLE001 -- reported at the end, the others go on
            self.failed.append(f"{name} {follow} ({size} of its parts): {self.ex.reason(e)}{self.where(fut)}")
            g["failed"] = True
        g["left"] -= 1
        if g["left"] == 0 and not g.get("failed"):
            f = g["follow"]
            rows, line = f.finish(g["rows"], g["uri"], **f.finish_kwargs)
            g["record"]["rows"] += rows
            print(f"    {line}", flush=True)


class Queue:
    """The jobs of one or more stages on one executor. At most ``ex.slots`` are in flight
    (with no bound, as on SLURM, all are submitted and its scheduler decides); the rest wait
    here: follow-ups first (they finish a stage whose runs have trained), then runs in the
    order they came. A job starts when a worker, a device or a job slot frees, whichever
    stage it is of, and each stage ends as soon as its own last job is in."""

    def __init__(self, ex):
        self.ex, self.first, self.then, self.flying, self.left = ex, [], [], {}, {}
        self.begun: dict = {}  # per stage: when its first job was submitted (its turn came)

    def put(self, stage, fn, args: tuple, name: str, tag: tuple, first: bool = False) -> None:
        """A job of ``stage``: ``fn(*args)``, named ``name``; ``stage.take(fut, tag, self)`` when it is in."""
        (self.first if first else self.then).append((stage, fn, args, name, tag))
        self.left[stage] = self.left.get(stage, 0) + 1

    def fill(self) -> None:
        while (self.first or self.then) and (self.ex.slots is None or len(self.flying) < self.ex.slots):
            stage, fn, args, name, tag = (self.first or self.then).pop(0)
            self.begun.setdefault(stage, time.time())
            self.flying[self.ex.submit(fn, *args, name=name)] = (stage, tag)

    def run(self, on_end=None) -> None:
        """Until no job is left; ``on_end(stage)`` as each stage's last job is in."""
        while self.flying or self.first or self.then:
            self.fill()
            for fut in self.ex.wait(self.flying):
                stage, tag = self.flying.pop(fut)
                stage.take(fut, tag, self)
                self.left[stage] -= 1
                if self.left[stage] == 0 and on_end is not None:
                    on_end(stage)


def admit(a: argparse.Namespace, ex) -> list[str]:
    """Why the scheme cannot take its tasks (one line each), on a worker of ``ex`` (a pool
    worker imports its class: the parent need not); nothing when it can."""
    try:
        return ex.call(misfits, a.scheme, a.tasks)
    except (ConfigError, OSError, ImportError, ValueError) as e:
        return [f"scheme {a.scheme}: {e}"]


def write(a: argparse.Namespace, done: list[dict], record: dict, t0: float = T0) -> None:
    """The stage's results: each task's rows (``Task.write``; a header alone for a task of the
    study this scheme does not take), then the runs file, last, with the provenance and times
    (from ``t0``: this process's start, or when the stage's first job was submitted in a
    fan-out, ``Queue.begun``)."""
    from pipelines.commits import made_at
    from posenc.files import portable_path, write_json
    from posenc.machine import machine

    done.sort(key=lambda r: (r["task"], r["seed"]))
    for name in a.specs:
        task = a.task.get(name) or load(name)
        rows = [row for r in done if r["task"] == name for row in r["rows"]]
        if task.results:
            order = lambda r: [r[k] for k in task.row_order]  # noqa: E731 -- () keeps the runs' order
            task.write(sorted(rows, key=order), Path(a.results_dir) / task.outputs(a.scheme)[0])
    for r in done:
        del r["rows"]
        r["run_dir"] = portable_path(r["run_dir"])
    timing = {**record, "threads": a.threads,  # where the jobs ran: no part of the provenance
              "startup_s": round(min(r.pop("started") for r in done) - t0, 2),
              "train_s": round(sum(r["train_s"] for r in done), 2), "eval_s": round(sum(r["eval_s"] for r in done), 2),
              "wall_s": round(time.time() - t0, 2)}  # fmt: skip
    write_json(Path(a.results_dir) / "runs" / f"{a.scheme}.json",
               {"scheme": a.scheme, "provenance": provenance(a, done), "git": made_at(Path.cwd(), a.params),
                "machine": machine(), "timing": timing, "runs": done})
    print(f"{a.scheme}: {len(done)} runs in {timing['wall_s']:.0f} s (start-up {timing['startup_s']:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    jobs = plan(a)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by the fork server (and a submitit job)
    runs = Path(a.runs_dir)
    try:  # submitit's own checks of the settings (SLURM's srun on PATH): before anything runs
        ex = executors.build(a.executor, workers=min(a.workers, len(jobs)), threads=a.threads, preload=PRELOAD,
                             folder=runs.parent / ".submitit" / runs.name)  # beside the runs folder, not in it
    except ConfigError as e:
        return refusal(e)
    if a.executor["kind"] != "pool" or a.executor["gpus"] is not None:
        print(f"{a.scheme}: {len(jobs)} runs as {ex.banner()}", flush=True)
    stage = Stage(a, ex, len(jobs))
    try:
        with ex:
            refused = admit(a, ex)  # the scheme takes every task, or nothing runs
            if refused:
                print("\n".join(["study refused, nothing was run:"] + refused), file=sys.stderr)
                return 2
            shutil.rmtree(runs, ignore_errors=True)  # the stage's own folder: no run of an earlier version stays
            ex.clear()  # and the logs of the jobs of an earlier version
            stage.run(jobs)
    except (KeyboardInterrupt, SystemExit) as e:  # Ctrl-C, or a worker's run stopped by a signal
        why = str(e) if str(e) and not isinstance(e, KeyboardInterrupt) else "Ctrl-C"
        print(f"study of {a.scheme} interrupted ({why}): {len(stage.done)} of {len(jobs)} runs had finished; a run "
              f"stopped by the interrupt keeps its last.ckpt under {a.runs_dir}; no results were written", file=sys.stderr)
        return 130
    if stage.failed:
        print("\n".join(["study failed:"] + stage.failed), file=sys.stderr)
        return 1
    write(a, stage.done, ex.record())
    return 0


if __name__ == "__main__":
    sys.exit(main())
