"""Perplexity against evaluation length (Press, Smith & Lewis 2022, Figure 1), as
small multiples by family of scheme.

    python -m pipelines.extrapolation_figure results/extrapolation/*.csv --out figures/extrapolation
    python -m pipelines.extrapolation_figure results/extrapolation/*.csv --schemes alibi rope sinusoidal

Reads results files written by ``pipelines.extrapolate`` (.csv or .json) and draws
one column per family of scheme present among the drawn schemes, in the order of
``posenc.encodings.base.FAMILIES``: absolute; rotary with RoPE's context-extension
rows (``rope+pi``, ``rope+ntk``, ``rope+yarn``, ``rope+pi+ft4L``, dashed); position
bias; content-relative; then ``other`` for names that no ``conf/encoding`` YAML
describes. The family comes from the scheme's class, and every scheme's colour,
marker and dashes from ``analysis.style``: the same in every figure, and unchanged
when schemes are added. The reference (``reference``: ``none`` unless given; the study's
figure passes the LM table's reference, the scheme its tests compare against), when it
is in the data, is drawn in every other family's panel as a thin grey dotted line
labelled "<name> (<reference_label>)", and in its own family's panel as itself, labelled
so too; a reference alone in its family (NoPE) has no column of its own unless nothing
else is drawn.

Each column has two panels on the same x axis, the evaluation length T on a log2
axis (ticks ``64 (1L)``, ...) with a dashed vertical mark at the training length L:

* top: validation perplexity on a log axis, the mean over seeds with a 95%
  bootstrap confidence band (seaborn, 1000 resamples, seed 0) where a scheme has
  several seeds;
* bottom: ppl(T) / ppl(L), taken per seed and then averaged, with the same band,
  on a log axis with a horizontal line at 1: flat schemes lie on the line and
  degrading ones rise above it, whatever their perplexity at L.

The y axis is shared along each row (``sharey`` per row). Perplexity: so that
levels can be compared across families (the reference sits at the same
height in every panel, and a scheme that is best at L but explodes past it is seen
against the others); per-panel axes would make every panel look alike and zoom
nearly coincident curves apart no better, since the ones that overlap here
(kerple and fire) differ by under 1%. Ratio: so that "flat" looks equally flat in
every column and a degradation of the same size reads the same in all of them;
the price is that the rotary panel, whose rows reach a ratio of about 4, sets the
range. Within a panel the schemes are drawn in ``analysis.style`` order, each
later one on top with a slightly thinner line and smaller marker (and the
families' markers run from bulky to slim), so coincident points stay visible as
a marker inside a marker (every RoPE rule equals rope at L by construction).

Legends sit in a row of their own under the panels, one per column (the
reference first, then the family's schemes), so they cover no curve. Schemes with
no value past L (ppl NaN: ``learned`` and ``tupe`` hold a table of L positions)
show their point at L and are listed in the notes under the figure, as is a
scheme with no row at L (no ratio). With several training lengths in the data the
figure has one pair of rows (perplexity, ratio) per training length, each titled
with its L. ``--schemes`` (``schemes=``) draws only the schemes named, plus
the reference when the data has it; a name with no rows stops with
the list of the available ones. Writes <out>.png and <out>.svg.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from analysis.style import FAMILY_TITLES, by_family, styles  # noqa: E402
from posenc.evaluate import read_results  # noqa: E402
from posenc.files import save_figure  # noqa: E402

TRAIN_LEN_GID = "train-length-mark"
RATIO_ONE_GID = "ratio-one-mark"
#: the gid of a scheme's line is SCHEME_GID + its name
SCHEME_GID = "scheme:"
REFERENCE = "none"
#: the reference in every other family's panel: grey and dotted, a style no scheme has
REFERENCE_COLOR, REFERENCE_LS = "0.5", (0, (1.2, 1.6))
#: line width and marker size of the first scheme drawn in a panel, and how much each
#: later one (drawn on top) is narrower: where schemes coincide (every RoPE rule equals
#: rope at L; kerple and fire), the later line runs inside the earlier one and its
#: marker sits inside the earlier marker, so both stay visible
LW, MS, LW_STEP, MS_STEP = 2.5, 7.5, 0.15, 0.4
METHOD_LABELS = {"nonoverlapping": "non-overlapping windows", "sliding": "sliding window"}
PPL_LABEL = "validation perplexity (log scale)"
RATIO_LABEL = "ppl(T) / ppl(L), per seed (log scale)"


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
    """The data lines of a panel, one per scheme drawn (the reference included;
    the training-length mark and the line at ratio 1 excluded)."""
    return [ln for ln in ax.get_lines() if str(ln.get_gid() or "").startswith(SCHEME_GID)]


def line_schemes(ax) -> list[str]:
    """The names of the schemes drawn in a panel, in drawing order."""
    return [ln.get_gid()[len(SCHEME_GID) :] for ln in scheme_lines(ax)]


def _select(df, schemes: Sequence[str] | None, reference: str = REFERENCE) -> list[str]:
    """The schemes to draw: all in the data, or ``schemes`` plus the reference."""
    available = sorted(df["scheme"].unique())
    if schemes is None:
        return available
    schemes = list(dict.fromkeys(str(s) for s in schemes))
    if not schemes:
        raise ValueError(f"no schemes given; available: {', '.join(available)}")
    unknown = [s for s in schemes if s not in available]
    if unknown:
        raise ValueError(f"no results for scheme(s) {', '.join(unknown)}; available: {', '.join(available)}")
    if reference in available and reference not in schemes:
        schemes.append(reference)
    return schemes


def _with_ratio(df):
    """``df`` with ``ratio`` = ppl / ppl at eval_len == train_len of the same scheme, seed and L."""
    at_l = df[df["eval_len"] == df["train_len"]].groupby(["scheme", "seed", "train_len"])["ppl"].mean()
    at_l = at_l.rename("ppl_at_L").reset_index()
    out = df.merge(at_l, on=["scheme", "seed", "train_len"], how="left")
    out["ratio"] = out["ppl"] / out["ppl_at_L"]
    return out


def _draw(ax, data, y: str, style, multi_seed: bool, reference: bool = False, rank: int = 0) -> None:
    """One scheme's mean line (and band) of column ``y`` against eval_len."""
    d = data[np.isfinite(data[y])]
    if d.empty:
        return
    kws = style.line_kws()
    if reference:
        kws.update(color=REFERENCE_COLOR, linestyle=REFERENCE_LS, marker="o", zorder=1.5)
    else:
        kws.update(zorder=2.5 + 0.01 * rank)
    sns.lineplot(
        data=d, x="eval_len", y=y, estimator="mean", errorbar=("ci", 95) if multi_seed else None,
        n_boot=1000, seed=0, ax=ax, legend=False, lw=1.6 if reference else line_sizes(rank)[0],
        markersize=4 if reference else line_sizes(rank)[1], err_kws={"alpha": 0.12 if reference else 0.18, "lw": 0},
        **kws,
    )  # fmt: skip
    ax.get_lines()[-1].set_gid(SCHEME_GID + style.name)


def legend_handle(style, reference: bool = False, rank: int = 0, label: str | None = None):
    """A legend entry drawn as the scheme's line is (``rank``: its drawing order in the panel);
    ``reference``: the grey dotted reference line, labelled "<name> (<label>)"."""
    if reference:
        return plt.Line2D([], [], color=REFERENCE_COLOR, linestyle=REFERENCE_LS, marker="o", lw=1.6, markersize=4,
                          label=f"{style.name} ({label or 'reference'})")  # fmt: skip
    lw, ms = line_sizes(rank)
    return plt.Line2D([], [], lw=lw, markersize=ms, markeredgecolor="w", markeredgewidth=0.75,
                      label=style.label if label is None else f"{style.label} ({label})", **style.line_kws())  # fmt: skip


def legend_columns(columns: Sequence[str]) -> int:
    """Columns of each panel's legend: two side by side while the panels are few, one when five
    or more share the width (their labels would run into the next panel's)."""
    return 2 if len(columns) < 5 else 1


def line_sizes(rank: int) -> tuple[float, float]:
    """Line width and marker size of the scheme drawn ``rank``-th in its panel."""
    return max(LW - LW_STEP * rank, 1.0), max(MS - MS_STEP * rank, 4.0)


def log_axis(ax) -> None:
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ax.yaxis.set_major_locator(FixedLocator(_ppl_ticks(lo, hi)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    method: str = "nonoverlapping",
    title: str | None = None,
    schemes: Sequence[str] | None = None,
    conf_dir: str | os.PathLike | None = None,
    reference: str = REFERENCE,
    reference_label: str = "reference",
):
    """Build the figure from results files; returns (figure, [png, svg]).

    ``schemes``: draw only these (plus the reference when the data has it); a name with
    no rows raises ValueError listing the available ones. ``reference``: the scheme drawn
    in every panel, labelled with ``reference_label``. ``conf_dir``: the Hydra config root
    whose ``encoding/`` gives each scheme's class (default: posenc's ``conf/``)."""
    df = read_results(paths)
    if "method" in df:
        if method not in set(df["method"]):
            raise ValueError(f"no rows with method={method!r} in {list(paths)}; found {sorted(set(df['method']))}")
        df = df[df["method"] == method]
    drawn = _select(df, schemes, reference)
    df = _with_ratio(df[df["scheme"].isin(drawn)].copy())
    st = styles(drawn, conf_dir)
    families = by_family(drawn, conf_dir)
    ref = reference if reference in drawn else None
    home = st[ref].family if ref else None  # the reference's own family: drawn there as itself
    columns = [f for f in families if f != home or families[f] != [ref] or len(families) == 1]
    train_lens = sorted(int(x) for x in df["train_len"].unique())

    sns.set_theme(style="whitegrid", context="notebook")
    fig, gs, axes = _grid(families, columns, train_lens, ref)
    notes = _not_applicable(df, drawn, train_lens)
    for i, L in enumerate(train_lens):
        _length_rows(axes[2 * i: 2 * i + 2], df[df["train_len"] == L], L, len(train_lens) > 1, columns, families,
                     st, ref)
    for c, fam in enumerate(columns):  # one legend per column, in a row of its own under the panels
        lax = fig.add_subplot(gs[-1, c])
        lax.axis("off")
        handles = [legend_handle(st[ref], reference=True, label=reference_label)] if ref and fam != home else []
        handles += [legend_handle(st[s], rank=rank, label=reference_label if s == ref else None)
                    for rank, s in enumerate(families[fam])]
        lax.legend(handles=handles, loc="upper center", ncol=legend_columns(columns), frameon=False, fontsize=9,
                   handlelength=2.6,
                   columnspacing=1.2, borderaxespad=0.0)  # fmt: skip
    fig.suptitle(title or f"Train short, test long: perplexity vs evaluation length, by family\n"
                 f"{_detail(df, method, train_lens)}", fontsize=12, y=1 - 0.1 / fig.get_figheight(), va="top")
    legend_notes = ["dashed: a context-extension rule of RoPE (rope+<rule>)"] if any("+" in s for s in drawn) else []
    if ref is not None and columns != [home]:
        legend_notes.insert(0, f"grey dotted: {ref}, {reference_label}, repeated in every other family's panel")
    fig.text(0.01, 0.0, "\n".join(legend_notes + notes), fontsize=8, va="top", color="0.3")
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".png", ".svg") else out
    return fig, save_figure(fig, stem, bbox_inches="tight")


def _grid(families: dict, columns: list[str], train_lens: list[int], ref: str | None):
    """The figure, its grid and its axes: per training length a perplexity row and a ratio
    row (axes[2i], axes[2i + 1]) sharing x, a spacer row under them for the ratio row's x labels,
    and a row for the legends at the bottom; the columns share y."""
    home = None if ref is None else next(f for f, members in families.items() if ref in members)
    n_legend = max(len(families[f]) + (ref is not None and f != home) for f in columns)
    legend_h = 0.05 + 0.22 * int(np.ceil(n_legend / legend_columns(columns)))
    heights = [h for i in range(len(train_lens)) for h in (3.3, 2.4, 0.75 if i == len(train_lens) - 1 else 1.25)]
    heights.append(legend_h)
    fig = plt.figure(figsize=(0.6 + 3.9 * len(columns), sum(heights) + 1.1))
    gs = fig.add_gridspec(len(heights), len(columns), height_ratios=heights, hspace=0.12, wspace=0.08,
                          bottom=0.02, top=1 - 0.95 / fig.get_figheight())
    axes = np.empty((2 * len(train_lens), len(columns)), dtype=object)
    for r in range(axes.shape[0]):
        for c in range(len(columns)):
            share_y = axes[r, 0] if c else None
            share_x = axes[r - 1, c] if r % 2 else None
            axes[r, c] = fig.add_subplot(gs[r // 2 * 3 + r % 2, c], sharey=share_y, sharex=share_x)
    for i in range(len(train_lens)):
        for c in range(len(columns)):
            fig.add_subplot(gs[3 * i + 2, c]).axis("off")
    return fig, gs, axes


def _not_applicable(df, drawn: list[str], train_lens: list[int]) -> list[str]:
    """The figure's notes: lengths where a scheme has no perplexity, and schemes with no ratio."""
    notes = []
    for s in drawn:
        for L in train_lens:
            sub = df[(df["scheme"] == s) & (df["train_len"] == L)]
            na = sub[~np.isfinite(sub["ppl"])]
            if len(na):
                lens = sorted(int(x) for x in na["eval_len"].unique())
                notes.append(f"{s} (L={L}): not applicable at {', '.join(map(str, lens))}")
            if len(sub) and not np.isfinite(sub["ppl_at_L"]).any():
                notes.append(f"{s} (L={L}): no perplexity at L, so no ratio")
    return notes


def _length_rows(rows, sub, L: int, several: bool, columns: list[str], families: dict, st: dict, ref: str | None):
    """The perplexity and ratio rows (``rows``: two rows of axes) of one training length L."""
    ok = sub[np.isfinite(sub["ppl"])]
    multi_seed = bool(len(ok)) and ok.groupby(["scheme", "eval_len"])["seed"].nunique().max() > 1
    ticks = sorted(int(x) for x in sub["eval_len"].unique())
    for c, fam in enumerate(columns):
        ax_p, ax_r = rows[0, c], rows[1, c]
        members = families[fam]
        for ax, y in ((ax_p, "ppl"), (ax_r, "ratio")):
            if ref is not None and ref not in members:
                _draw(ax, sub[sub["scheme"] == ref], y, st[ref], multi_seed, reference=True)
            for rank, s in enumerate(members):
                _draw(ax, sub[sub["scheme"] == s], y, st[s], multi_seed, rank=rank)
            ax.axvline(L, color="0.3", ls="--", lw=1.1, gid=TRAIN_LEN_GID, label="_train_len", zorder=1)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlim(ticks[0] / 2**0.25, ticks[-1] * 2**0.25)
            if c == 0:
                ax.set_ylabel(PPL_LABEL if y == "ppl" else RATIO_LABEL, fontsize=9.5)
            else:
                ax.set_ylabel("")
                ax.tick_params(labelleft=False)
        ax_r.axhline(1.0, color="0.2", lw=0.9, gid=RATIO_ONE_GID, zorder=1)
        ax_r.set_xticks(ticks, [f"{t}\n({t // L}L)" if t % L == 0 else str(t) for t in ticks])
        ax_r.set_xlabel("evaluation length T (tokens)")
        ax_p.tick_params(labelbottom=False)
        ax_p.set_xlabel("")
        ax_p.text(L, 0.98, " L", transform=ax_p.get_xaxis_transform(), va="top", ha="left", color="0.3")
        head = FAMILY_TITLES.get(fam, fam)
        ax_p.set_title(f"{head}\ntrained at L = {L}" if several else head, fontsize=11)
    for row in rows:  # log axes with readable ticks, once the shared row has all its data
        for ax in row:
            ax.set_yscale("log")
        log_axis(row[0])


def _detail(df, method: str, train_lens: list[int]) -> str:
    """The title's second line: corpus and split, method, L, and the seeds averaged."""
    seeds = df.groupby("scheme")["seed"].nunique()
    seed_txt = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    corpus = ", ".join(sorted(df["corpus"].dropna().unique())) if "corpus" in df else ""
    return ", ".join(
        x for x in (f"{corpus} {df['split'].iloc[0]}" if corpus and "split" in df else corpus,
                    METHOD_LABELS.get(method, method),
                    f"trained at L = {train_lens[0]}" if len(train_lens) == 1 else "",
                    f"mean of {seed_txt} seed{'s' if seeds.max() > 1 else ''}"
                    + (" with 95% CI" if seeds.max() > 1 else ""))
        if x
    )  # fmt: skip
