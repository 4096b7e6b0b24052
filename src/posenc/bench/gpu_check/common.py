"""What the parts of the GPU check share: its tolerances and vocabulary, the words for each
route's cost, and how it records an environment, a path and a failure."""

from __future__ import annotations

import math
import platform
from datetime import datetime, timezone
from pathlib import Path

import lightning as L
import torch

from ...files import project_root

#: relative error of the first block's output allowed against float64 on the CPU
BF16_TOL = 2e-2
FP32_TOL = 1e-4
#: a step over this many times NoPE's is explained in the report
SLOW_STEP = 1.3
#: byte-level Tiny Shakespeare: 256 bytes and 4 special tokens
VOCAB = 260

ROUTE_REASONS = {
    "masked": "a T x T float bias per head (per sequence too, where it reads the content) is built and passed to "
    "scaled_dot_product_attention as its mask; PyTorch's FlashAttention kernel takes no mask, so the step runs on "
    "the memory-efficient kernel, which reads the mask at every logit, and a trainable bias adds the backward "
    "of its T x T gradient",
    "probabilities": "a value term (relative values) needs the attention probabilities themselves: "
    "the (B, H, T, T) matrix is materialised, no fused kernel applies",
    "recomputed": "the bias is rebuilt block by block in the backward (CPU route)",
    "flex": "FlexAttention, compiled: the relative bias read inside the kernel (score_mod), an exactly low-rank "
    "absolute part appended to q and k, causality a block mask; what it still costs over the fused kernel is "
    "FlexAttention's own (compare the float-mask route below)",
}
#: a scheme on the fused route that is still slower: what it adds outside the kernel (not profiled)
FUSED_EXTRA = {
    "rope": "the rotation of q and k, elementwise kernels outside the attention kernel",
    "xpos": "the rotation and scaling of q and k, elementwise kernels outside the attention kernel",
}


def recorded_path(path: str | None) -> str | None:
    """A path as the report records it: relative to the project when inside it, else its name alone."""
    if path is None:
        return None
    p = Path(path).expanduser().absolute()
    try:
        return p.relative_to(project_root()).as_posix()
    except ValueError:
        return p.name


def environment(device: str) -> dict:
    env = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "python": platform.python_version(),
           "torch": torch.__version__, "lightning": L.__version__, "device": device}  # fmt: skip
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda, memory_gib=round(p.total_memory / 2**30, 1),
                   capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)  # fmt: skip
    else:
        from ...machine import machine

        env["cpu"] = machine().get("cpu", platform.processor())
    return env


def failure(e: BaseException, limit: int = 300) -> str:
    """An exception as one line of at most ``limit`` characters of its message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def fmt(x, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def compiled_graphs() -> int:
    """The graphs torch.compile has made in this process (dynamo's count of unique graphs)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
