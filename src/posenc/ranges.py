"""The range of every numeric setting, declared once: a setting gets its check by being
declared (a ``Range`` in the model schema's field metadata, ``posenc.model.ModelSize``, or
in ``posenc.config.RANGES``), not by an ``if`` of its own. ``check`` finds what is wrong
with a value and words it as a refusal names it: the setting, the value, the range and an
example.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """``low`` <= value <= ``high`` (either end open when ``*_open``, absent when None), a whole
    number when ``whole``; ``null`` allows no value. ``fraction``: a whole number of at least 1
    (a count) or a fraction in (0, 1] (Lightning's ``limit_val_batches`` and the like)."""

    low: float | None = None
    high: float | None = None
    whole: bool = True
    low_open: bool = False
    high_open: bool = False
    null: bool = False
    fraction: bool = False

    def describe(self) -> str:
        if self.fraction:
            return "a whole number of at least 1, or a fraction in (0, 1]"
        kind = "a whole number" if self.whole else "a number"
        ends = []
        if self.low is not None:
            ends.append(f"{'above' if self.low_open else 'at least'} {_show(self.low)}")
        if self.high is not None:
            ends.append(f"{'below' if self.high_open else 'at most'} {_show(self.high)}")
        return kind + (" " + " and ".join(ends) if ends else "") + (", or null" if self.null else "")

    def problem(self, value) -> str | None:
        """Why ``value`` is out of range, or None when it fits."""
        if value is None:
            return None if self.null else "needs a value"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"must be {self.describe()}"
        if not math.isfinite(value):
            return f"must be {self.describe()}"
        if self.fraction:
            fits = (float(value).is_integer() and value >= 1) or (isinstance(value, float) and 0 < value <= 1)
            return None if fits else f"must be {self.describe()}"
        if self.whole and not float(value).is_integer():
            return f"must be {self.describe()}"
        if self.whole and isinstance(value, float):  # `1e3` reads as 1000.0, which a count must not be
            return f"must be {self.describe()}, written as one: {_show(value)}, not {value!r}"
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return f"must be {self.describe()}"
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return f"must be {self.describe()}"
        return None

    def outside(self) -> list:
        """Values just out of range (the tests try each: none may start a run)."""
        if self.fraction:
            return [0, -1, 1.5]
        out = []
        if self.low is not None:
            out.append(self.low if self.low_open else self.low - (1 if self.whole else 0.5))
        if self.high is not None:
            out.append(self.high if self.high_open else self.high + (1 if self.whole else 0.5))
        if self.whole:
            out.append((self.low if self.low is not None else 0) + 1.5)
        return out


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)
