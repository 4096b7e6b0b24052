"""``bench.png`` / ``bench.svg``: step time and peak memory relative to ``none``,
one hue per T, with the per-round ratios as dots. The memory panel is on a log
axis with several readable tick labels spanning the data (``log_ticks``); the
legends sit to the right of their panels, outside the axes, so they cover no bar
or line."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .config import POSENC, TARGET_FLOP_EFFICIENCY, TARGET_MEM, TARGET_STEP_CHEAP
from ..files import save_figure
from .report import _model_label


def log_ticks(lo: float, hi: float) -> list[float]:
    """Readable ticks for a log axis from ``lo`` to ``hi``: 1-2-5 per decade, denser
    (1, 1.5, 2, 3, 4, 5, 6, 8, then finer) when that gives fewer than three."""
    lo, hi = max(min(lo, hi), 1e-12), max(lo, hi, 1e-12)
    decades = range(int(math.floor(math.log10(lo))) - 1, int(math.ceil(math.log10(hi))) + 1)
    ticks: list[float] = []
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 8), (1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9)):
        ticks = [round(m * 10.0**k, 12) for k in decades for m in mantissas if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3:
            break
    return ticks


def _per_round(res: dict[str, Any]):
    """posenc's per-round step time over none's in the same round: (scheme, T, ratio) rows, the dots."""
    import pandas as pd

    base = {(r["T"], r["round"]): r["train_s"] for r in res["raw"] if r["impl"] == POSENC and r["scheme"] == "none"}
    return pd.DataFrame(
        [
            {"scheme": r["scheme"], "T": r["T"], "ratio": r["train_s"] / base[(r["T"], r["round"])]}
            for r in res["raw"]
            if r["impl"] == POSENC and (r["T"], r["round"]) in base
        ]
    )


def _panels(df) -> list[tuple[str, str]]:
    """(column, axis label) of each panel: the step ratio, and the FLOP efficiency and the memory
    ratio where they were measured."""
    panels = [("step_ratio", "training-step time / none")]
    if "flop_efficiency" in df and df["flop_efficiency"].notna().any():
        panels.append(("flop_efficiency", "step / none ÷ FLOP share"))
    if "mem_ratio" in df and df["mem_ratio"].notna().any():
        panels.append(("mem_ratio", "peak training memory / none"))
    return panels


def _memory_axis(ax, values) -> None:
    """A log axis over the memory ratios ``values``, 1 and the target, with readable ticks (``log_ticks``)."""
    import matplotlib.ticker

    ax.axhline(TARGET_MEM, ls="--", c="tab:orange", lw=1, label=f"{TARGET_MEM}× (no value term)")
    ax.set_yscale("log")
    vals = [v for v in values if v > 0] + [1.0, TARGET_MEM]
    lo, hi = min(min(vals) / 1.15, 0.8), max(vals) * 1.15
    ax.set_ylim(lo, hi)
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(log_ticks(lo, hi)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _panel(ax, df, dots, order: list[str], col: str, label: str) -> None:
    """One panel: bars of ``col`` per scheme, a hue per T, with its target line (and, for the
    step ratio, the per-round ratios as dots); the legend outside the axes, to the right."""
    import seaborn as sns

    sns.barplot(data=df, x="scheme", y=col, hue="T", order=order, palette="viridis", ax=ax)
    if col == "step_ratio" and not dots.empty:
        sns.stripplot(data=dots, x="scheme", y="ratio", hue="T", order=order, dodge=True, palette="dark:k", size=3,
                      ax=ax, legend=False)
        ax.axhline(TARGET_STEP_CHEAP, ls="--", c="tab:orange", lw=1, label=f"{TARGET_STEP_CHEAP}× (ALiBi, T5, KERPLE)")
    if col == "flop_efficiency":
        ax.axhline(TARGET_FLOP_EFFICIENCY, ls="--", c="tab:orange", lw=1,
                   label=f"{TARGET_FLOP_EFFICIENCY}× (every scheme)")
    if col == "mem_ratio":
        _memory_axis(ax, df[col].dropna())
    ax.axhline(1.0, c="k", lw=0.8)
    ax.set_ylabel(label)
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=35)
    for t in ax.get_xticklabels():
        t.set_ha("right")
    # outside the axes, to the right: it covers no bar, dot or target line
    ax.legend(title="T", fontsize=8, loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0, frameon=False)


def plot(res: dict[str, Any], out_dir: Path) -> list[Path]:
    """``bench.png`` and ``bench.svg`` in ``out_dir`` from a benchmark's summary: a panel per
    ratio (``_panels``); nothing when no posenc row has a step ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    rows = [r for r in res["summary"] if r["impl"] == POSENC and r.get("step_ratio") is not None]
    if not rows:
        return []
    df = pd.DataFrame(rows)
    order = list(dict.fromkeys(df["scheme"]))
    dots = _per_round(res)
    panels = _panels(df)
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(7, 0.75 * len(order) + 2), 3.6 * len(panels)), squeeze=False)
    for ax, (col, label) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, df, dots, order, col, label)
    meta = res["meta"]
    axes[0, 0].set_title(
        f"posenc, model {_model_label(meta['settings']).replace('`', '')}, {meta['dtype']}, {meta['device_name']} "
        f"(bars: best/best, dots: per round)",
        fontsize=9,
    )
    fig.tight_layout()
    return save_figure(fig, out_dir / "bench")
