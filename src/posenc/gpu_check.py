"""``python -m posenc.gpu_check``: the GPU check, which lives beside the benchmark
(``posenc.bench.gpu_check``; its docstring says what it measures)."""

from __future__ import annotations

import sys

from .bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
