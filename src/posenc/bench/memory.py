"""Peak memory of a training step, and the cap on the address space.

Memory, CPU. Each (model, T) is measured in a fresh process, forked from a fork
server that has only imported torch and posenc (so its heap holds no tensors
from the benchmark, and a probe costs no interpreter start): build the model
and AdamW, run one training step and one evaluation forward at T=1 (this
allocates the gradients, the AdamW state and any lazily built caches), record
the resident set size (``VmRSS``) as the baseline, reset the kernel's peak-RSS
counter (``echo 5 > /proc/self/clear_refs`` sets ``VmHWM`` to the current
RSS), run one training step at T and read ``VmHWM``. Reported: peak minus
baseline, i.e. what a training step at T needs on top of the weights,
gradients and optimiser state (activations, attention masks and biases,
autograd buffers, temporaries). Where ``clear_refs`` cannot be written the
peak comes from ``ru_maxrss`` (not resettable, so it also covers the T=1
warm-up, which is negligible) and the JSON says so. RSS counts pages, not
bytes requested: allocator caching and transparent huge pages make small
numbers (the tiny CI model) coarse; at T >= 256 on ``small`` the step's tensors
dominate. ``--memory-lengths`` limits the probes to some lengths.
``python -m posenc.bench --memory-probe SCHEME T`` runs one probe by hand and
prints its JSON. CUDA: in the benchmark process,
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``, minus
``memory_allocated`` before the step.

Memory cap. On CPU the benchmark process (during timing) and every probe cap
their address space at their size plus ``--max-memory-gb`` (default: half of
``MemAvailable``), so a scheme that needs more than the machine has fails with
an allocation error -- reported as that (scheme, T) "out of memory" -- instead
of waking the OOM killer, which may pick another user's job.
"""

from __future__ import annotations

import gc
import resource
import sys
from collections.abc import Callable
from typing import Any

import torch

from .models import Runner, _error, batch_for, build_unit

# ------------------------------------------------------------------ memory


def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss_bytes(resettable: bool) -> int:
    kb = _status_kb("VmHWM") if resettable else None
    if kb is None:  # ru_maxrss is in KiB on Linux, bytes on macOS
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r if sys.platform == "darwin" else r * 1024
    return kb * 1024


def default_memory_budget_gb() -> float:
    """Half of what the kernel reports as available now."""
    kb = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    kb = int(line.split()[1])
    except OSError:
        pass
    if kb is None:
        import psutil

        kb = psutil.virtual_memory().available // 1024
    return round(0.5 * kb / 2**20, 1)


def limit_memory(budget_gb: float | None) -> tuple[int, int] | None:
    """Cap this process's address space at its current size + ``budget_gb``.

    On a shared machine a scheme whose memory grows like T^2 * width can ask
    for more than the machine has; with the cap the allocation fails with a
    RuntimeError (reported as that scheme's failure at that length) instead of
    waking the kernel's OOM killer, which may pick someone else's job.
    Returns the previous limits for ``restore_memory_limit`` (None: unchanged).
    """
    if not budget_gb or sys.platform != "linux":
        return None
    vm = _status_kb("VmSize")
    if vm is None:
        return None
    old = resource.getrlimit(resource.RLIMIT_AS)
    new = vm * 1024 + int(budget_gb * 2**30)
    if old[1] != resource.RLIM_INFINITY:
        new = min(new, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (new, old[1]))
    return old


def restore_memory_limit(old: tuple[int, int] | None) -> None:
    if old is not None:
        resource.setrlimit(resource.RLIMIT_AS, old)


def memory_probe(
    impl: str,
    scheme: str,
    T: int,
    batch: int,
    enc: dict[str, Any],
    model_cfg: dict[str, Any],
    vocab_size: int,
    seed: int,
    threads: int | None = None,
    max_memory_gb: float | None = None,
) -> dict[str, Any]:
    """Peak memory of one training step at T above the state after a T=1
    warm-up (see the module docstring). Run it in a fresh process on CPU."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    runner = Runner(impl, scheme, build_unit(impl, scheme, enc, model_cfg, vocab_size), "cpu")
    limit_memory(max_memory_gb)
    x1, y1 = batch_for(1, 1, vocab_size, "cpu", seed)
    runner.train_step(x1, y1)
    runner.eval_step(x1)
    x, y = batch_for(T, batch, vocab_size, "cpu", seed)
    del x1, y1
    gc.collect()
    base = _rss_bytes()
    resettable = _reset_peak_rss()
    runner.train_step(x, y)
    train_peak = _peak_rss_bytes(resettable) - base
    return {
        "impl": impl,
        "scheme": scheme,
        "T": T,
        "batch": batch,
        "baseline_rss": base,
        "train_peak": max(0, train_peak),
        "method": "VmHWM after clear_refs" if resettable else "ru_maxrss (not reset; includes the T=1 warm-up)",
    }


def _probe_job(args: tuple) -> dict[str, Any]:
    try:
        return memory_probe(*args)
    except Exception as e:  # noqa: BLE001 - reported in the results, the run goes on
        return _error(args[0], args[1], args[2], e)


def probe_memory_cpu(jobs: list[tuple], on_done: Callable[[], None]) -> list[dict[str, Any]]:
    """Each job in a fresh process forked from a fork server that has imported
    torch and posenc only (cheap start, clean heap)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "posenc.model", "posenc.encodings", "posenc.bench.memory", "x_transformers"])
    results = []
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1) as pool:
        for job in jobs:
            try:
                results.append(pool.submit(_probe_job, job).result())
            except Exception as e:  # noqa: BLE001 - e.g. the child was killed
                results.append(_error(job[0], job[1], job[2], e))
            on_done()
    return results


def probe_memory_cuda(runner: Runner, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    runner.train_step(x, y)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return {
        "impl": runner.impl,
        "scheme": runner.scheme,
        "T": x.shape[1],
        "batch": x.shape[0],
        "baseline_allocated": base,
        "train_peak": peak,
        "method": "cuda max_memory_allocated",
    }
