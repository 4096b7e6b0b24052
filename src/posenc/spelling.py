"""The "did you mean" of every one-line refusal: the closest of the names a setting takes.

Light (the standard library alone), so the study's parent process, which imports neither torch
nor Lightning, refuses an executor with it as ``python train.py`` refuses an option.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(name: str, options: Iterable[str], ignore_case: bool = True) -> str | None:
    """The option closest to ``name`` (``RoPE`` or ``rop`` -> ``rope``), or None when none is close."""
    options = list(options)
    fold = (lambda s: s.lower()) if ignore_case else (lambda s: s)
    by_key = {fold(o): o for o in options}
    found = difflib.get_close_matches(fold(name), list(by_key), n=1, cutoff=0.6)
    return by_key[found[0]] if found else None


def did_you_mean(name: str, options: Iterable[str], quote: bool = True, ignore_case: bool = True) -> str:
    """"did you mean 'rope'? " (a trailing space, to go before the rest of the sentence), or ""."""
    found = closest(name, options, ignore_case)
    if found is None:
        return ""
    return f"did you mean {found!r}? " if quote else f"did you mean {found}? "
