"""Speed and memory of every positional scheme, against ``none`` and x-transformers.

``python -m posenc.bench`` measures, in ONE process, for every scheme in
``conf/encoding/*.yaml`` (discovered at run time) and every length T:

* training-step time (forward + backward + AdamW step) and evaluation time
  (``eval()`` mode, forward under ``no_grad``), as tokens/s;
* the ratio of each to the ``none`` scheme of the same model in the same run;
* peak memory of a training step, and its ratio to ``none``;
* FLOP/s as a fraction of this machine's matmul peak, measured in the same run;
* the same for x-transformers (optional ``[bench]`` extra) at identical sizes
  for the schemes it shares, and the posenc / x-transformers ratios.

The method, module by module:

* ``config``: the workload (model, batch, lengths), the settings, the
  discovery of the schemes and the composition of their configs;
* ``models``: building the posenc models, their steps (``Runner``), the batches;
* ``xtransformers``: the x-transformers twins and how they map to posenc's schemes;
* ``timing``: the measuring run (interleaved rounds, rotating order);
* ``memory``: the peak-memory probes (fork server, RSS, CUDA) and the memory cap;
* ``flops``: counted and PaLM FLOPs, the matmul peak;
* ``report``: the summary, the ratios, the targets, the T² growth, the tables;
* ``figure``: the figure;
* ``cli``: the command line (``python -m posenc.bench --help``);
* ``gpu_check``: the GPU check (``python -m posenc.gpu_check``), which runs this benchmark among
  its parts.

Outputs (``--out-dir``, default ``results/bench``; each file written to a
temporary file and moved into place): ``bench.json`` (settings, environment,
every raw timing, memory probe and FLOP count, the summary, the targets),
``bench.md`` (the tables, also printed), ``bench.png`` / ``bench.svg`` (step
time and peak memory relative to ``none``, one hue per T, with the per-round
ratios as dots).

``--tiny`` is a configuration for CI that runs in seconds of compute (d_model
32, 2 layers, 2 heads, d_ff 64, vocab 256, T in {32, 64}, 128 tokens per
batch, 1 round).
"""

from __future__ import annotations

from .cli import build_parser, main, parse_per_length, rerender, settings_from_args, write_outputs
from .config import (
    CONF_DIR,
    DEFAULT_ORDER,
    POSENC,
    TARGET_LENGTH,
    TARGET_FLOP_EFFICIENCY,
    TARGET_MEM,
    TARGET_STEP_CHEAP,
    TINY_MODEL,
    XT,
    BenchSettings,
    compose_configs,
    discover_schemes,
)
from .figure import plot
from .flops import (
    FLOP_CHECK_LENGTH,
    FLOP_FIT_LENGTHS,
    quadratic_fit,
    count_flops,
    flop_model,
    matmul_peak,
    palm_flops_per_token,
)
from .memory import (
    default_memory_budget_gb,
    limit_memory,
    memory_probe,
    probe_memory_cpu,
    probe_memory_cuda,
    restore_memory_limit,
)
from .models import Runner, autocast, batch_for, build_posenc, build_unit, sync
from .report import TARGET_COLUMNS, environment, evaluate_targets, markdown, summarize, targets_markdown
from .timing import run_benchmark
from .xtransformers import XT_SHARED, build_xt, xt_kwargs, xtransformers_version

__all__ = [
    "CONF_DIR",
    "DEFAULT_ORDER",
    "FLOP_CHECK_LENGTH",
    "FLOP_FIT_LENGTHS",
    "POSENC",
    "TARGET_COLUMNS",
    "TARGET_LENGTH",
    "TARGET_FLOP_EFFICIENCY",
    "TARGET_MEM",
    "TARGET_STEP_CHEAP",
    "TINY_MODEL",
    "XT",
    "XT_SHARED",
    "Runner",
    "BenchSettings",
    "autocast",
    "batch_for",
    "build_parser",
    "build_posenc",
    "build_unit",
    "build_xt",
    "compose_configs",
    "count_flops",
    "default_memory_budget_gb",
    "discover_schemes",
    "environment",
    "evaluate_targets",
    "flop_model",
    "limit_memory",
    "main",
    "markdown",
    "matmul_peak",
    "memory_probe",
    "palm_flops_per_token",
    "quadratic_fit",
    "parse_per_length",
    "plot",
    "probe_memory_cpu",
    "probe_memory_cuda",
    "rerender",
    "restore_memory_limit",
    "run_benchmark",
    "settings_from_args",
    "summarize",
    "sync",
    "targets_markdown",
    "write_outputs",
    "xt_kwargs",
    "xtransformers_version",
]
