"""Where a study's jobs run (``python -m pipelines.study ... --executor NAME_OR_PATH``).

A study stage hands its jobs (training runs, then retrieval grids) to an executor
and collects them as they finish; the study loop sees four calls, the same for
every kind: ``submit(fn, *args, name=...)`` returns a handle with ``done()`` and
``result()`` (which raises when the job failed), ``wait(handles)`` blocks until
at least one of them has finished and returns the finished ones, ``describe(handle)``
says where to look when one failed (nothing for a pool job; a submitit job's id and
log), and ``call(fn, *args)`` runs a short call where it is cheapest. The kinds:

* ``pool`` (the default): the fork-server pool of ``--workers`` processes of
  ``--threads`` torch threads each, whose server imports torch and Lightning once
  for all workers (this process imports neither).
* ``pool`` with ``gpus: N`` (an int, or ``all``: every CUDA device this process may
  use, counted by torch in a child process, or the entries of CUDA_VISIBLE_DEVICES
  when it is set): N workers, each owning one device for its whole life (its
  initializer sets CUDA_VISIBLE_DEVICES to that device before anything touches
  CUDA). A worker runs one job at a time and takes the next when it is free, so no
  device ever runs two jobs and every device is busy while jobs remain;
  ``--workers`` is ignored.
* ``submitit``: each job is a submitit job (``submitit.AutoExecutor``), on this
  machine (``cluster: local``, a subprocess per job) or on SLURM (``cluster: slurm``,
  an sbatch job per job); both go through submitit's pickled call
  (``submitit.core._submit``). Each job pays a Python and torch start-up (and on
  SLURM a queue wait), so a retrieval run's grid is scored in one job
  (``whole_grids``), not one job per cell as on a pool. Locally at most ``max_jobs``
  jobs run at once (default ``--workers``); on SLURM every job is submitted at once
  unless ``max_jobs`` is set, and the scheduler decides. The jobs' pickles and logs
  go to ``folder`` (default ``<runs-dir>/../.submitit/<runs-dir name>``, beside the
  runs folder, not in it, and emptied with it when a stage starts).
  A job that reaches its time limit or is preempted (submitit's signal, USR2, some
  time before the end) is requeued, at most ``max_requeues`` times (default 3; then
  it fails, named by its job and the count), and starts its call again: a study job
  finds its run folder as the stopped job left it and resumes the run from its
  last.ckpt (``pipelines.study.train_or_resume``). A job that SLURM requeues by
  itself (``PreemptMode=REQUEUE``) resumes the same way.

Settings: ``conf/executor/<NAME>.yaml`` (the presets ``pool``, ``gpus``, ``local``,
``slurm``) or the path of the user's own ``.yaml``/``.yml``. Keys: ``kind`` (``pool``
or ``submitit``); for ``pool``: ``gpus``; for ``submitit``: ``cluster`` and
``timeout_min`` (both required: submitit's own default time limits are minutes),
``gpus_per_node``, ``cpus_per_task``, ``mem_gb``, ``max_jobs``, ``max_requeues``, ``folder``,
``slurm_partition``, ``slurm_account``, ``slurm_additional_parameters`` (a mapping of
further ``#SBATCH`` flags, e.g. ``{qos: high}``). A SLURM executor without a
partition is allowed (the cluster's default partition takes the jobs) with a warning.
A bad setting is refused (``ConfigError``) before any job runs.

Nothing here imports torch or submitit at import time: the default path of a study
stage must not pay for them.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from posenc import CONFIG_DIR
from posenc.errors import ConfigError
from posenc.spelling import did_you_mean

PRESETS = Path(CONFIG_DIR) / "executor"
#: the environment variable that chooses the executor when --executor is not given
ENV = "POSENC_EXECUTOR"
_REQUIRED = object()
#: each kind's keys (besides ``kind``) and their defaults
KEYS: dict[str, dict] = {
    "pool": {"gpus": None},
    "submitit": {"cluster": _REQUIRED, "timeout_min": _REQUIRED, "gpus_per_node": 0, "cpus_per_task": None,
                 "mem_gb": None, "max_jobs": None, "max_requeues": 3, "folder": None, "slurm_partition": None,
                 "slurm_account": None, "slurm_additional_parameters": None},
}
CLUSTERS = ("local", "slurm")
#: submitit's local executor starts a job at most 6 times (its ``max_retry``)
LOCAL_REQUEUES = 5
INSTALL = "pip install -e '.[cluster]'"


# ------------------------------------------------------------------ settings
def presets() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.yaml"))


def resolve(spec: str | None) -> Path:
    """The settings file of ``spec`` (a preset's name, or a path ending in .yaml/.yml);
    ``None``: the environment's ``POSENC_EXECUTOR``, else ``pool``."""
    given = f"{ENV}={os.environ[ENV]}: " if not spec and os.environ.get(ENV) else ""  # say where it came from
    spec = spec or os.environ.get(ENV) or "pool"
    if spec.endswith((".yaml", ".yml")):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ConfigError(f"{given}executor {spec}: no such file")
        return path
    path = PRESETS / f"{spec}.yaml"
    if "/" in spec or not path.is_file():
        hint = did_you_mean(spec, presets(), ignore_case=False)
        raise ConfigError(f"{given}unknown executor {spec!r}: {hint}the presets are {', '.join(presets())} "
                          "(conf/executor/<name>.yaml), or give the path of your own .yaml")
    return path


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check(raw, source: str = "settings") -> dict:
    """The settings ``raw`` (a mapping read from ``source``) with every key of their kind,
    or a ConfigError naming the key and what it may be."""
    where = f"executor {source}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: not a mapping of settings (kind: pool, or kind: submitit)")
    kind = raw.get("kind")
    if kind not in KEYS:
        raise ConfigError(f"{where}: kind {kind!r} is none of {', '.join(KEYS)}")
    unknown = sorted(set(raw) - set(KEYS[kind]) - {"kind"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} for kind {kind}; "
                          f"its keys are {', '.join(KEYS[kind])}")
    s = {"kind": kind, **KEYS[kind], **raw, "source": source}
    missing = [k for k, v in s.items() if v is _REQUIRED]
    if missing:
        raise ConfigError(f"{where}: kind {kind} needs {', '.join(missing)}")
    if kind == "pool":
        gpus = s["gpus"]
        if not (gpus is None or gpus == "all" or (_is_int(gpus) and gpus >= 1)):
            raise ConfigError(f"{where}: gpus: {gpus!r}: give a number of devices (at least 1), or all")
        return s
    if s["cluster"] not in CLUSTERS:
        raise ConfigError(f"{where}: cluster {s['cluster']!r} is none of {', '.join(CLUSTERS)}")
    positive = {"timeout_min": s["timeout_min"], "cpus_per_task": s["cpus_per_task"], "max_jobs": s["max_jobs"]}
    for key, v in positive.items():
        if v is not None and not (_is_int(v) and v >= 1):
            raise ConfigError(f"{where}: {key}: {v!r} must be a whole number, at least 1")
    for key in ("gpus_per_node", "max_requeues"):
        if not (_is_int(s[key]) and s[key] >= 0):
            raise ConfigError(f"{where}: {key}: {s[key]!r} must be a whole number, at least 0")
    if s["cluster"] == "local" and s["max_requeues"] > LOCAL_REQUEUES:
        raise ConfigError(f"{where}: max_requeues: {s['max_requeues']}: a local job is started at most "
                          f"{LOCAL_REQUEUES + 1} times by submitit, so at most {LOCAL_REQUEUES}")
    if s["mem_gb"] is not None and (isinstance(s["mem_gb"], bool) or not isinstance(s["mem_gb"], (int, float))
                                    or s["mem_gb"] <= 0):
        raise ConfigError(f"{where}: mem_gb: {s['mem_gb']!r} must be a positive number")
    for key in ("folder", "slurm_partition", "slurm_account"):
        if s[key] is not None and not isinstance(s[key], str):
            raise ConfigError(f"{where}: {key}: {s[key]!r} must be a string")
    if s["slurm_additional_parameters"] is not None and not isinstance(s["slurm_additional_parameters"], dict):
        raise ConfigError(f"{where}: slurm_additional_parameters must be a mapping of sbatch flags")
    if importlib.util.find_spec("submitit") is None:
        raise ConfigError(f"{where}: kind submitit needs the package submitit: {INSTALL}")
    return s


def visible_devices() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them: its
    entries when it is set, else 0 .. n-1 with n counted by torch in a child process
    (this process imports no torch, and initializes no CUDA)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()]
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ConfigError(f"could not count the CUDA devices: {(out.stderr.strip().splitlines() or [''])[-1]}")
    return [str(i) for i in range(int(out.stdout.strip()))]


def settings(spec: str | None) -> dict:
    """The checked settings of ``spec`` (see ``resolve``); a pool with ``gpus`` gets
    ``devices``, the CUDA devices its workers take, one each."""
    path = resolve(spec)
    from omegaconf import OmegaConf

    try:
        raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as e:  # noqa: BLE001 -- any parse error is the user's file
        raise ConfigError(f"executor {path}: cannot be read ({type(e).__name__}: {e})") from None
    s = check(raw, str(path))
    if s["kind"] == "pool" and s["gpus"] is not None:
        visible = visible_devices()
        n = len(visible) if s["gpus"] == "all" else s["gpus"]
        if n < 1 or n > len(visible):
            env = os.environ.get("CUDA_VISIBLE_DEVICES")
            seen = f"CUDA_VISIBLE_DEVICES={env!r}" if env is not None else "torch.cuda.device_count()"
            raise ConfigError(f"executor {path}: gpus: {s['gpus']}, but {len(visible)} CUDA device(s) are "
                              f"visible ({seen})")
        s["devices"] = visible[:n]
    return s


# ------------------------------------------------------------------ pool
def init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def init_device_worker(threads: int, devices) -> None:
    """A worker of a pool with GPUs: it takes one device from ``devices`` (a queue) for
    its life. The fork server has imported torch but never initialized CUDA, so CUDA,
    initialized in this worker at its first use, sees only the device set here."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices.get()
    init_worker(threads)


class Pool:
    """The study's fork-server pool: ``workers`` processes, or one per device of ``devices``."""

    kind = "pool"
    whole_grids = False  # a job costs nothing to start: a grid's cells spread over the workers

    @property
    def slots(self) -> int:
        """Jobs at once: one per worker (a study keeps the others in its queue, in its order)."""
        return self.workers

    def __init__(self, workers: int, threads: int, preload: list[str] = (), devices: list[str] | None = None):
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(list(preload))
        self.devices = devices
        if devices is None:
            self.workers = workers
            self.pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker, initargs=(threads,))
        else:
            queue = ctx.SimpleQueue()
            for d in devices:
                queue.put(d)
            self.workers = len(devices)
            self.pool = ProcessPoolExecutor(len(devices), mp_context=ctx, initializer=init_device_worker,
                                            initargs=(threads, queue))

    def __enter__(self):
        self.pool.__enter__()
        return self

    def __exit__(self, *exc):
        return self.pool.__exit__(*exc)

    def submit(self, fn, *args, name: str | None = None):
        return self.pool.submit(fn, *args)

    def wait(self, handles) -> set:
        return wait(handles, return_when=FIRST_COMPLETED)[0]

    def call(self, fn, *args):
        """``fn(*args)`` on a worker (it has imported what ``fn`` needs: this process need not)."""
        return self.pool.submit(fn, *args).result()

    def describe(self, handle) -> str:
        return ""

    def reason(self, e: BaseException) -> str:
        return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"

    def clear(self) -> None:
        pass

    def banner(self) -> str:
        if self.devices is None:
            return f"a pool of {self.workers} worker(s)"
        return (f"{len(self.devices)} GPU(s), one worker per device (CUDA_VISIBLE_DEVICES "
                f"{', '.join(self.devices)}; --workers is ignored)")

    def record(self) -> dict:
        """What the results' timing block says of where the jobs ran."""
        return {"executor": self.kind, "workers": self.workers} | ({"devices": len(self.devices)} if self.devices else {})


# ------------------------------------------------------------------ submitit
class InJob:
    """A job's call in a process of its own, torch's threads set as a pool worker sets them.

    Checkpointable as submitit defines it (a ``checkpoint`` method): when the job is
    preempted or reaches its time limit, submitit's signal handler asks it for the call
    to requeue, and it gives the same call, counted. Past ``max_requeues`` it refuses
    by raising, so the job fails with a message that names it and the count (a ``None``
    would fail it with submitit's words alone). What survives a requeue is what the call
    left on disk: a study job resumes its run from its last.ckpt."""

    def __init__(self, threads: int, fn, name: str | None, max_requeues: int, requeues: int = 0):
        self.threads, self.fn, self.name, self.max_requeues, self.requeues = threads, fn, name, max_requeues, requeues

    def __call__(self, *args):
        init_worker(self.threads)
        if self.requeues:
            print(f"{self.name}: started again after {self.requeues} stop(s) (preempted or at its time limit)",
                  file=sys.stderr, flush=True)
        return self.fn(*args)

    def checkpoint(self, *args):
        if self.requeues >= self.max_requeues:
            raise RuntimeError(f"job {self.name} was preempted or reached its time limit {self.requeues + 1} times: "
                               f"not requeued again (max_requeues: {self.max_requeues})")
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(InJob(self.threads, self.fn, self.name, self.max_requeues, self.requeues + 1), *args)


def _importable(fn):
    """``fn`` as a job's process can import it: a function of the module run as
    ``__main__`` (``python -m pipelines.study``) by its module's name."""
    if getattr(fn, "__module__", None) != "__main__":
        return fn
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if spec is None:  # a script run by its path: submitit's cloudpickle sends the function itself
        return fn
    return getattr(importlib.import_module(spec.name), fn.__qualname__)


class Job:
    """A submitit job, or one waiting to be submitted (``max_jobs``)."""

    def __init__(self, fn, args: tuple, name: str | None):
        self.fn, self.args, self.name, self.job = fn, args, name, None

    def done(self) -> bool:
        return self.job is not None and self.job.done()

    def result(self):
        return self.job.result()


class Submitit:
    """Jobs through ``submitit.AutoExecutor`` (``cluster``: local or slurm)."""

    kind = "submitit"
    whole_grids = True  # a job pays a Python and torch start-up (and a queue wait): a grid is one job
    poll_s = 0.5

    def __init__(self, s: dict, threads: int, workers: int, folder: str | Path):
        import submitit

        self.s, self.threads = s, threads
        self.owned = s["folder"] is None  # the stage's own folder, emptied when it starts
        self.folder = Path(folder if self.owned else s["folder"]).expanduser().absolute()
        self.max_jobs = s["max_jobs"] or (workers if s["cluster"] == "local" else None)
        self.slots = self.max_jobs  # None: every job submitted at once, the scheduler decides
        try:
            self.ex = submitit.AutoExecutor(folder=self.folder / "%j", cluster=s["cluster"],
                                            **{f"{s['cluster']}_max_num_timeout": s["max_requeues"]})
        except RuntimeError as e:  # SLURM's srun is not on PATH: not a SLURM login node
            raise ConfigError(f"executor {s['source']}: cluster {s['cluster']}: {e}") from None
        if s["cluster"] == "slurm" and not s["slurm_partition"]:
            print(f"warning: executor {s['source']}: no slurm_partition, the jobs go to the cluster's default "
                  "partition", file=sys.stderr)
        params = {k: s[k] for k in ("timeout_min", "gpus_per_node", "cpus_per_task", "mem_gb")}
        params |= {k: s[k] for k in ("slurm_partition", "slurm_account", "slurm_additional_parameters")}
        try:
            self.ex.update_parameters(**{k: v for k, v in params.items() if v is not None})
        except (ValueError, NameError, AssertionError) as e:
            raise ConfigError(f"executor {s['source']}: submitit refuses the settings: {e}") from None
        self.queue: list[Job] = []
        self.running: list[Job] = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:  # interrupted or broken: leave no job running on its own
            self.queue.clear()
            for h in self.running:
                if not h.job.done():
                    h.job.cancel(check=False)
            # a local job's cancel is a SIGINT, which a job was seen to outlive on a loaded
            # machine: one still running a few seconds on is ended outright (slurm's scancel holds)
            deadline = time.time() + 5
            for h in self.running:
                process = getattr(h.job, "_process", None)
                while process is not None and process.poll() is None and time.time() < deadline:
                    time.sleep(0.1)
                if process is not None and process.poll() is None:
                    process.kill()
        return False

    def submit(self, fn, *args, name: str | None = None) -> Job:
        h = Job(_importable(fn), args, name)
        self.queue.append(h)
        self._fill()
        return h

    def _fill(self) -> None:
        self.running = [h for h in self.running if not h.job.done()]
        while self.queue and (self.max_jobs is None or len(self.running) < self.max_jobs):
            h = self.queue.pop(0)
            if h.name:
                self.ex.update_parameters(name=h.name)
            h.job = self.ex.submit(InJob(self.threads, h.fn, h.name, self.s["max_requeues"]), *h.args)
            self.running.append(h)

    def wait(self, handles) -> set:
        while True:
            self._fill()
            finished = {h for h in handles if h.done()}
            if finished:
                return finished
            time.sleep(self.poll_s)

    def call(self, fn, *args):
        """``fn(*args)`` in this process: a job would pay a start-up, or a queue wait, for a check."""
        return fn(*args)

    def describe(self, handle: Job) -> str:
        if handle.job is None:
            return "not submitted"
        return f"job {handle.job.job_id}, log {handle.job.paths.stderr}"

    def reason(self, e: BaseException) -> str:
        """One line: a failed job's own exception (the last line of its trace), or why it
        did not finish (cancelled, timed out, preempted: submitit's UncompletedJobError)."""
        parts = str(e).split("\n----------------------\n")  # submitit's FailedJobError: head, trace, tail
        if len(parts) >= 3 and "trace:" in parts[0]:
            last = [x.strip() for x in parts[1].splitlines() if x.strip()]
            return (last[-1] if last else "the job failed")[:300]
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        return f"{type(e).__name__}: {' '.join(lines[:2])[:300]}"

    def clear(self) -> None:
        if self.owned and self.folder.is_dir():
            shutil.rmtree(self.folder)

    def banner(self) -> str:
        at_once = f"at most {self.max_jobs} at once" if self.max_jobs else "all submitted at once"
        return f"submitit jobs on {self.s['cluster']} ({at_once}; logs under {self.folder})"

    def record(self) -> dict:
        return {"executor": self.kind, "cluster": self.s["cluster"], "workers": self.max_jobs,
                "devices": self.s["gpus_per_node"]}


def build(s: dict, *, workers: int, threads: int, preload: list[str] = (), folder: str | Path = ".submitit"):
    """The executor of checked settings ``s`` (``settings``): a ``Pool`` of ``workers``
    processes (or one per device), or ``Submitit`` jobs whose files go to ``folder``
    unless the settings name one. Raises ConfigError when submitit refuses them."""
    if s["kind"] == "pool":
        return Pool(workers, threads, preload, s.get("devices"))
    return Submitit(s, threads, workers, folder)
