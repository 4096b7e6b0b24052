"""Perplexity against evaluation length (Press, Smith & Lewis 2022, Figure 1).

    python -m analysis.extrapolation results/extrapolation/*.csv --out figures/extrapolation

Reads results files written by ``pipelines.extrapolate`` (.csv or .json),
draws one line per scheme (mean over seeds, with a 95% bootstrap confidence
band where a scheme has several seeds), x = evaluation length on a log2 axis,
y = perplexity on a log axis, a dashed vertical mark at the training length,
and one panel per training length. Lengths a scheme cannot represent (ppl
NaN, e.g. a learned table) are left out of its line and listed under the
figure. Writes <out>.png and <out>.svg.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from posenc.evaluate import read_results  # noqa: E402
from posenc.files import save_figure  # noqa: E402

TRAIN_LEN_GID = "train-length-mark"
METHOD_LABELS = {"nonoverlapping": "non-overlapping windows", "sliding": "sliding window"}


def _ppl_ticks(lo: float, hi: float) -> list[float]:
    """Readable ticks for a log perplexity axis: 1-2-5 per decade, denser when the
    panel spans less than that (at least three ticks where possible)."""
    lo, hi = max(lo, 1e-12), max(hi, 1e-12)
    decades = range(int(np.floor(np.log10(lo))) - 1, int(np.ceil(np.log10(hi))) + 1)
    for mantissas in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 8), (1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0**k for k in decades for m in mantissas if lo <= m * 10.0**k <= hi]
        if len(ticks) >= 3:
            return ticks
    return ticks


def scheme_lines(ax) -> list:
    """The data lines of a panel (the training-length mark excluded)."""
    return [ln for ln in ax.get_lines() if ln.get_gid() != TRAIN_LEN_GID]


def plot(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    method: str = "nonoverlapping",
    title: str | None = None,
):
    """Build the figure from results files; returns (figure, [png, svg])."""
    df = read_results(paths)
    if "method" in df:
        if method not in set(df["method"]):
            raise ValueError(f"no rows with method={method!r} in {list(paths)}; found {sorted(set(df['method']))}")
        df = df[df["method"] == method]
    schemes = sorted(df["scheme"].unique())
    train_lens = sorted(int(x) for x in df["train_len"].unique())
    # a context-extension rule (rope+pi) is drawn dashed in its scheme's colour, with its own marker
    base = sorted({s.split("+")[0] for s in schemes})
    colours = dict(zip(base, sns.color_palette("tab20" if len(base) > 10 else "tab10", len(base))))
    palette = {s: colours[s.split("+")[0]] for s in schemes}
    markers = dict(zip(schemes, ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d", "8", "H"] * 2))
    dashes = {s: (4, 1.5) if "+" in s else "" for s in schemes}

    sns.set_theme(style="whitegrid", context="notebook")
    fig, axes = plt.subplots(1, len(train_lens), figsize=(6.2 * len(train_lens), 5.2), squeeze=False)
    notes = []
    for ax, L in zip(axes[0], train_lens):
        sub = df[df["train_len"] == L]
        ok = sub[np.isfinite(sub["ppl"])]
        for s in schemes:
            na = sub[(sub["scheme"] == s) & ~np.isfinite(sub["ppl"])]
            if len(na):
                lens = sorted(int(x) for x in na["eval_len"].unique())
                notes.append(f"{s} (L={L}): not applicable at {', '.join(map(str, lens))}")
        multi_seed = ok.groupby(["scheme", "eval_len"])["seed"].nunique().max() > 1 if len(ok) else False
        sns.lineplot(
            data=ok, x="eval_len", y="ppl", hue="scheme", hue_order=[s for s in schemes if s in set(ok["scheme"])],
            style="scheme", markers=markers, dashes=dashes, palette=palette, estimator="mean",
            errorbar=("ci", 95) if multi_seed else None, n_boot=1000, seed=0, ax=ax, legend=False,
        )  # fmt: skip
        ax.axvline(L, color="0.3", ls="--", lw=1.2, gid=TRAIN_LEN_GID, label="_train_len")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(FixedLocator(_ppl_ticks(*ax.get_ylim())))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ticks = sorted(int(x) for x in sub["eval_len"].unique())
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([f"{t}\n({t // L}L)" if t % L == 0 else str(t) for t in ticks])
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("validation perplexity (log scale)")
        ax.set_title(f"trained at L = {L}")
        ax.text(L, 0.98, " L", transform=ax.get_xaxis_transform(), va="top", ha="left", color="0.3")
    # one shared legend, in scheme order, outside the panels
    handles = [
        plt.Line2D([], [], color=palette[s], marker=markers[s], ls="--" if "+" in s else "-", label=s) for s in schemes
    ]  # fmt: skip
    fig.legend(handles=handles, title="encoding", loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    seeds = df.groupby("scheme")["seed"].nunique()
    seed_txt = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    corpus = ", ".join(sorted(df["corpus"].dropna().unique())) if "corpus" in df else ""
    detail = ", ".join(
        x for x in (f"{corpus} {df['split'].iloc[0]}" if corpus and "split" in df else corpus,
                    METHOD_LABELS.get(method, method),
                    f"mean of {seed_txt} seed{'s' if seeds.max() > 1 else ''}"
                    + (" with 95% CI" if seeds.max() > 1 else ""))
        if x
    )  # fmt: skip
    fig.suptitle(title or f"Train short, test long: perplexity vs evaluation length\n{detail}", fontsize=12)
    if notes:
        fig.text(0.01, -0.02, "\n".join(notes), fontsize=8, va="top", color="0.3")
    fig.tight_layout()
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".png", ".svg") else out
    return fig, save_figure(fig, stem, bbox_inches="tight")


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m analysis.extrapolation", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("results", nargs="+", help="results files (.csv or .json) from pipelines.extrapolate")
    p.add_argument("--out", default="figures/extrapolation", help="output stem: writes <out>.png and <out>.svg")
    p.add_argument("--method", default="nonoverlapping", choices=["nonoverlapping", "sliding"])
    p.add_argument("--title")
    a = p.parse_args(argv)
    fig, files = plot(a.results, a.out, a.method, a.title)
    plt.close(fig)
    for f in files:
        print(f)
    return files


if __name__ == "__main__":
    main(sys.argv[1:])
