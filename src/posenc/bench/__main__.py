"""``python -m posenc.bench``: the command line of ``posenc.bench.cli``."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
