"""Writing results: every file posenc produces goes through ``atomic``.

A reader (DVC, a plot, a second stage, a resumed run) never sees a truncated
file: the content is written to a temporary file in the target folder, given
the mode a plain new file would get under the umask, and renamed over the
target. A failure leaves the old file (or none) and no temporary behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def project_root() -> Path:
    """Where ``mlflow.db``, ``mlartifacts/``, ``outputs/`` and ``.cache/`` live (``paths.root``):
    ``POSENC_ROOT``, else the project this code belongs to (``src/posenc/`` is two folders below
    it, beside ``conf/``: ``posenc.CONFIG_DIR``), whatever the working folder."""
    if os.environ.get("POSENC_ROOT"):
        return Path(os.environ["POSENC_ROOT"]).expanduser().resolve()
    return Path(__file__).resolve().parents[2]


def file_mode() -> int:
    """The mode a plain new file gets under the current umask (mkstemp would give 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Create ``path`` through ``write(tmp)``, which fills a temporary file, then rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path: str | os.PathLike, text: str) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            f.write(text)

    return atomic(path, write)


def write_json(path: str | os.PathLike, obj: Any, indent: int = 2, **dump_kw) -> Path:
    """``obj`` as JSON with a final newline; ``dump_kw`` go to ``json.dumps``."""
    return write_text(path, json.dumps(obj, indent=indent, **dump_kw) + "\n")


def save_figure(
    fig, stem: str | os.PathLike, formats: Sequence[str] = ("png", "svg"), dpi: int = 150, **savefig_kw
) -> list[Path]:
    """``<stem>.<fmt>`` for every format, each written atomically; the figure is closed after.
    An SVG carries no creation date and fixed element ids, so the same figure gives the
    same bytes."""
    import matplotlib.pyplot as plt

    stem = Path(stem)

    def save(tmp: Path, fmt: str) -> None:
        kw = {"metadata": {"Date": None}, **savefig_kw} if fmt == "svg" else savefig_kw
        with plt.rc_context({"svg.hashsalt": "posenc"}):
            fig.savefig(tmp, format=fmt, dpi=dpi, **kw)

    try:
        return [atomic(stem.with_name(f"{stem.name}.{fmt}"), lambda tmp, fmt=fmt: save(tmp, fmt)) for fmt in formats]
    finally:
        plt.close(fig)


def portable_path(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory (the project root for every stage)
    when it lies below it, else as given: results files then hold no absolute path
    of the machine that made them."""
    p = Path(path).expanduser().absolute()
    try:
        return p.relative_to(Path.cwd().absolute()).as_posix()
    except ValueError:
        return str(path)
