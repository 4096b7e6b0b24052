"""posenc's one hand-written CPU kernel, FIRE's bias on a block past its threshold
(``encodings/fire_block.cpp``), compiled on first use with torch's C++ extension builder
(a C++ compiler and ninja; about 10 s on a 2-core machine, once, then cached by torch under
``TORCH_EXTENSIONS_DIR``, ``~/.cache/torch_extensions`` by default). Where it cannot be
built, or with ``POSENC_NATIVE=0`` in the environment, FIRE runs its PyTorch version: the
same values (the tests compare the two), slower."""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

SOURCE = Path(__file__).parent / "encodings" / "fire_block.cpp"
ENV = "POSENC_NATIVE"

_state: dict[str, bool] = {}  # "built": whether the kernel loaded; "off": turned off in this process


#: compiler flags, tried in turn: with OpenMP, torch's ``at::parallel_for`` uses torch's threads;
#: a compiler without it (Apple's clang) still builds the kernel, on one thread
FLAGS = (["-O3", "-fopenmp"], ["-O3"])


def _build(source: Path, name: str) -> bool:
    from torch.utils.cpp_extension import load

    errors = []
    for flags in FLAGS:
        try:
            load(name, [str(source)], extra_cflags=flags, extra_ldflags=flags[1:], is_python_module=False)
            return True
        except Exception as e:  # noqa: BLE001 - any failure to build leaves the PyTorch version
            errors.append(f"{' '.join(flags)}: {type(e).__name__}: {str(e).strip()[-300:]}")
    warnings.warn("posenc: FIRE's C++ kernel could not be built, so FIRE runs its PyTorch version (same values, "
                  "slower). " + " | ".join(errors), stacklevel=3)
    return False


def fire_block_ops():
    """``torch.ops.posenc`` with ``fire_block_forward`` and ``fire_block_backward``, built
    on the first call, or None: turned off (``POSENC_NATIVE=0``, ``disabled``) or not buildable."""
    if _state.get("off") or os.environ.get(ENV, "1") == "0":
        return None
    if "built" not in _state:
        _state["built"] = _build(SOURCE, "posenc_fire_block")
    return torch.ops.posenc if _state["built"] else None


def describe() -> str:
    """Which version of FIRE's block runs, for a report: builds the kernel if it is on."""
    if fire_block_ops() is not None:
        return "compiled C++"
    return f"PyTorch ({ENV}=0)" if _state.get("off") or os.environ.get(ENV, "1") == "0" else "PyTorch (no build)"


@contextmanager
def disabled():
    """Run FIRE's PyTorch version inside the block (the tests compare it with the kernel)."""
    before = _state.get("off", False)
    _state["off"] = True
    try:
        yield
    finally:
        _state["off"] = before
