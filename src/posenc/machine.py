"""What machine a result was made on: the CPU, its cores, the torch build and which
matrix-multiply kernels it runs.

Why the kernels: torch multiplies float32 matrices on x86 CPUs with Intel MKL, which
picks its kernels by the CPU's instruction set (AVX-512 on an Intel Xeon that has it,
AVX2 on an AMD EPYC), and the two sum in different orders. The same code and seed then
give results that differ in the last bits (the study's ALiBi seed-0 validation loss,
2.136683464 against 2.136683226). ``MKL_ENABLE_INSTRUCTIONS=AVX2`` makes MKL take its
AVX2 kernels on an AVX-512 CPU too, which reproduces an AVX2 machine's results to the
bit (``docs/reproduce.md``).
"""

from __future__ import annotations

import os
import platform


def cpu_name() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, object]:
    """The CPU, its cores, Python and torch, torch's own vector instruction set, and the
    instruction set MKL was told to use (``MKL_ENABLE_INSTRUCTIONS``; unset: its own choice
    for this CPU)."""
    import torch

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS") or "the CPU's own"}
