"""Retrieval beyond perplexity: the tables and figures of the exact-match grids
(``posenc.retrieval``), of how fast each scheme learns the task, and of how far each
scheme attends (``analysis.reach``).

Every retrieval run is trained to a criterion (exact match at L on its validation
windows, ``criterion`` in the run config) or to a step cap, whichever comes first, and
then scored on the grid. A grid measures length generalisation only when the run does
the task at L, so the summaries use the runs that reached the criterion; a scheme none
of whose runs reached it is shown over all its runs and marked.

* ``per_run``: per run and length, exact match as the mean over depths (every cell
  scores the same number of trials, so this is also the pooled share), the successes
  and trials pooled over depths, per-digit accuracy, the top layer's attention to the
  needle, and whether the run reached the criterion and at which step.
* ``summary``: per scheme and length, the mean and sample sd over seeds of the runs
  used, the per-seed values, the Wilson interval of their pooled trials (the
  secondary, within-run interval), and a Welch test across seeds against one scheme
  (``analysis.stats``); per scheme, the steps each seed took to the criterion.
* ``plot_grid``: the familiar needle picture, a length x depth heatmap per scheme.
* ``plot_curves``: exact match against length beside the perplexity ratio
  ppl(T) / ppl(L) of the same schemes' causal-LM runs.
* ``plot_steps``: the steps each run took to the criterion.
* ``plot_reach``: mean attention distance and entropy against length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from posenc.retrieval import wilson

from .stats import against as tested_against
from .stats import comparison_cells, mean_sd, rank_intervals
from .style import order, styles


def read_csvs(files: Sequence[str | Path]) -> pd.DataFrame:
    """The rows of every file in one frame; a file with a header alone (a scheme
    without such runs) adds nothing (and does not turn the columns into objects)."""
    frames = [f for f in (pd.read_csv(p, keep_default_na=False, na_values=[""]) for p in files) if len(f)]
    if not frames:
        raise ValueError(f"no rows in any of {len(files)} files ({', '.join(map(str, files[:3]))}, ...)")
    return pd.concat(frames, ignore_index=True)


#: the columns of ``run_records``
RUN_COLUMNS = ("scheme", "seed", "steps", "criterion_step")


def run_records(studies: Sequence[dict]) -> pd.DataFrame:
    """The retrieval runs (those of a task scored on the grid, ``posenc.tasks``) of the study stages' results (``results/runs/<scheme>.json``,
    read): scheme, seed, the steps trained and the step the criterion was reached at
    (NaN when the cap came first)."""
    from posenc.tasks import Retrieval, load

    rows = [{"scheme": r["scheme"], "seed": int(r["seed"]), "steps": int(r["global_step"]),
             "criterion_step": r.get("criterion_step", math.nan)}
            for study in studies for r in study["runs"] if isinstance(load(r["task"]), Retrieval)]
    return pd.DataFrame(rows, columns=list(RUN_COLUMNS))


def base_scheme(name: str) -> str:
    """The scheme a grid row's run was trained as: ``rope`` for ``rope+yarn`` (a rule
    switched on) and for ``rope+pi+ft4L`` (fine-tuned from that scheme's run)."""
    return name.split("+")[0]


def per_run(grids: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, seed, length): see the module doc. Lengths a model cannot represent
    (no trials) are left out. A rule's rows and a fine-tuned run's take the criterion of
    the run they come from."""
    g = grids[grids["trials"] > 0].assign(k=lambda d: d["exact_match"] * d["trials"])
    out = g.groupby(["scheme", "seed", "length", "multiple"], as_index=False).agg(
        exact_match=("exact_match", "mean"), k=("k", "sum"), n=("trials", "sum"), digit_acc=("digit_acc", "mean"),
        needle_attention=("needle_attention", "mean"))
    out["k"] = out["k"].round().astype(int)
    out["base"] = out["scheme"].map(base_scheme)
    runs = runs.rename(columns={"scheme": "base"})[["base", "seed", "steps", "criterion_step"]]
    out = out.merge(runs, on=["base", "seed"], how="left", validate="many_to_one")
    if out["steps"].isna().any():
        missing = sorted(set(out.loc[out["steps"].isna(), "scheme"]))
        raise ValueError(f"grid rows without the record of their retrieval run: {', '.join(missing)}")
    out["reached"] = out["criterion_step"].notna()
    return out.drop(columns="base").sort_values(["scheme", "seed", "length"], ignore_index=True)


def used(runs: pd.DataFrame) -> pd.DataFrame:
    """The rows a summary uses: per scheme, those of the runs that reached the
    criterion, or all of them (to be marked) when none did."""
    any_reached = runs.groupby("scheme")["reached"].transform("any")
    return runs[runs["reached"] | ~any_reached]


def summary(runs: pd.DataFrame, against: str | None = "none", cap: int | None = None,
            margin: float | None = None) -> dict:
    """Per scheme (see the module doc): ``seeds``, ``reached`` (the seeds that reached the
    criterion), ``marked`` (none did: the numbers are over all seeds), ``steps`` (per seed,
    None when the cap came first), ``cap`` (the step cap the runs were given; without it, the
    most steps a run of the scheme trained) and ``lengths`` {multiple: mean, sd, n, values,
    lo, hi (pooled Wilson), digit_acc, needle_attention, vs (against ``against``: every scheme
    at one length is one family, ``analysis.stats.against`` in points with ``margin``)}."""
    out = {}
    chosen = used(runs)
    for scheme in order(runs["scheme"].unique()):
        mine = runs[runs["scheme"] == scheme]
        first = mine.drop_duplicates("seed").sort_values("seed")
        steps = {int(r.seed): (None if math.isnan(r.criterion_step) else int(r.criterion_step))
                 for r in first.itertuples()}
        lengths = {}
        for m, g in chosen[chosen["scheme"] == scheme].groupby("multiple"):
            g = g.sort_values("seed")
            values = [float(v) for v in g["exact_match"]]
            mean, sd = mean_sd(values)
            lo, hi = wilson(int(g["k"].sum()), int(g["n"].sum()))
            lengths[int(m)] = {"length": int(g["length"].iloc[0]), "mean": mean, "sd": sd, "n": len(values),
                               "values": values, "lo": lo, "hi": hi, "digit_acc": float(g["digit_acc"].mean()),
                               "needle_attention": float(g["needle_attention"].mean())}
        out[scheme] = {"seeds": sorted(steps), "reached": sorted(s for s, v in steps.items() if v is not None),
                       "marked": all(v is None for v in steps.values()), "steps": steps,
                       "cap": int(cap if cap is not None else first["steps"].max()), "lengths": lengths}
    for m in sorted({m for e in out.values() for m in e["lengths"]}):
        at_m = {s: e["lengths"][m]["values"] for s, e in out.items() if m in e["lengths"]}
        for scheme, test in tested_against(at_m, against, "points", margin).items():
            out[scheme]["lengths"][m]["vs"] = test
    return out


def step_ranks(t: dict) -> dict:
    """Each scheme's place by its mean steps to the criterion (1 = the fastest; the schemes
    proper, no ``+rule`` rows, over the seeds that reached it) with its 95% bootstrap
    interval over seeds (``analysis.stats.rank_intervals``)."""
    steps = {s: [e["steps"][str(x)] if str(x) in e["steps"] else e["steps"][x] for x in e["reached"]]
             for s, e in t.items() if "+" not in s and e["reached"]}
    return rank_intervals(steps, higher_is_better=False)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _spread(cell: dict) -> str:
    """A cell's mean over seeds ± their sd in %, or the one seed's value (no spread to show)."""
    return f"{_pct(cell['mean'])} ± {_pct(cell['sd'])}" if cell["n"] > 1 else _pct(cell["mean"])


def _seeds(e: dict) -> str:
    n, k = len(e["seeds"]), len(e["reached"])
    return f"{k} of {n}" if k else f"0 of {n} (marked)"


def table_markdown(t: dict) -> str:
    """Exact match (%) by length: mean ± sd over the seeds used (the value alone for one seed),
    then the pooled trials' interval, the digits at L and at the longest length, the seeds that reached the
    criterion, and the longest length against ``summary``'s reference scheme."""
    mults = sorted({m for e in t.values() for m in e["lengths"]})
    top = mults[-1]
    label = lambda m: f"{m}L" if m > 1 else "L"  # noqa: E731
    against = next((c["vs"]["against"] for e in t.values() for c in e["lengths"].values() if "vs" in c), None)
    head = ["scheme", *[label(m) for m in mults], f"trials' 95% interval at L, {label(top)}", "digits at L",
            f"digits at {label(top)}", "seeds reached"]
    if against:
        head += [f"{label(top)} − `{against}`'s (95% CI)", "p", "Holm p", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1 - bool(against)) + " --- |" * bool(against)]
    for s, e in t.items():
        cells = ["n/a" if m not in e["lengths"] else _spread(e["lengths"][m]) for m in mults]
        ends = [e["lengths"].get(1), e["lengths"].get(top)]
        interval = ", ".join("n/a" if c is None else f"[{_pct(c['lo'])}, {_pct(c['hi'])}]" for c in ends)
        digits = ["n/a" if c is None else _pct(c["digit_acc"]) for c in ends]
        name = f"`{s}`" + (" †" if e["marked"] else "")
        row = [name, *cells, interval, *digits, _seeds(e)]
        if against:
            row += comparison_cells((ends[1] or {}).get("vs"))
        lines.append("| " + " | ".join(row) + " |")
    if any(e["marked"] for e in t.values()):
        lines += ["", "† no run of this scheme reached the criterion by the cap: its numbers are over every run, "
                  "and they mix learning speed with length."]
    return "\n".join(lines) + "\n"


def steps_markdown(t: dict, criterion: str) -> str:
    """Steps to the criterion per scheme, fastest first: each seed's (or "cap" when the
    cap came first), the mean ± sd over the seeds that reached it, and the scheme's place by
    that mean with its 95% bootstrap interval over seeds (``step_ranks``)."""
    base = {s: e for s, e in t.items() if "+" not in s}  # a rule or a fine-tune shares its run's steps
    ranks = step_ranks(base)
    key = lambda s: (not base[s]["reached"], mean_sd([base[s]["steps"][x] for x in base[s]["reached"]])[0]  # noqa: E731
                     if base[s]["reached"] else 0)
    lines = [f"Steps to the criterion ({criterion}), validated every so many steps; \"cap\": not reached by the cap. "
             "The place is by the mean (1: the fastest), with its 95% bootstrap interval over seeds.",
             "", "| scheme | steps per seed | mean ± sd (seeds that reached it) | reached | place (95% interval) |",
             "| --- | --- | ---: | ---: | ---: |"]
    for s in sorted(base, key=key):
        e = base[s]
        per = ", ".join(f"s{seed}: " + (str(v) if v is not None else f"cap ({e['cap']})") for seed, v in e["steps"].items())
        got = [e["steps"][x] for x in e["reached"]]
        ms = "—" if not got else "{:.0f} ± {:.0f}".format(*mean_sd(got)) if len(got) > 1 else f"{got[0]} (one seed)"
        r = ranks.get(s)
        place = "—" if r is None else f"{r['place']} ({r['lo']}–{r['hi']})"
        lines.append(f"| `{s}` | {per} | {ms} | {len(got)} of {len(e['steps'])} | {place} |")
    return "\n".join(lines) + "\n"


def _heat(ax, cells: pd.DataFrame, mults: list[int], depths: list[float], title: str, cmap) -> object:
    grid = np.full((len(depths), len(mults)), np.nan)
    for (m, d), v in cells.groupby(["multiple", "depth"])["exact_match"].mean().items():
        grid[depths.index(d), mults.index(m)] = v
    im = ax.imshow(100 * grid, vmin=0, vmax=100, cmap=cmap, aspect="auto")
    for i in range(len(depths)):
        for j in range(len(mults)):
            v = grid[i, j]
            txt = "n/a" if math.isnan(v) else f"{100 * v:.0f}"
            ax.text(j, i, txt, ha="center", va="center", fontsize=7,
                    color="white" if not math.isnan(v) and v < 0.5 else "black")
    ax.set_xticks(range(len(mults)), [f"{m}L" if m > 1 else "L" for m in mults], fontsize=7)
    ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths], fontsize=7)
    ax.set_title(title, fontsize=9)
    return im


def plot_grid(df: pd.DataFrame, stem: str | Path, marked: Sequence[str] = ()) -> list[Path]:
    """One panel per scheme: needle depth (rows) x evaluation length (columns), exact match in %,
    the mean over the seeds in ``df`` (the runs ``used``); ``marked`` schemes' titles say that
    none of their runs reached the criterion."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from posenc.files import save_figure

    names = order(df["scheme"].unique())
    mults = sorted(df["multiple"].unique())
    depths = sorted(df["depth"].unique())
    cols = 4
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.1 * rows + 0.6), squeeze=False, sharex=True,
                             sharey=True, layout="constrained")
    cmap = sns.color_palette("rocket", as_cmap=True)
    im = None
    for ax, s in zip(axes.flat, names):
        im = _heat(ax, df[df["scheme"] == s], mults, depths, f"{s} † (not reached)" if s in marked else s, cmap)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("needle depth", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("evaluation length", fontsize=8)
    L = int(df["train_len"].iloc[0])
    fig.colorbar(im, ax=axes, shrink=0.6, label="exact match (%)")
    seeds = int(df["seed"].nunique())
    fig.suptitle(f"Passkey retrieval: exact match by needle depth and length (trained at L = {L} to the criterion; "
                 + ("one seed)" if seeds == 1 else f"mean over up to {seeds} seeds)"), fontsize=11)
    return save_figure(fig, stem, bbox_inches="tight")


def _family_panel(ax, row: dict, ref: str | None, members: list[str], st: dict, lengths: Sequence[int], L: int,
                  fam: str) -> None:
    """One panel of ``_family_figure``: the reference (in every family but NoPE's), the family's
    members, L marked, the log2 length axis; then the row's own ``finish``."""
    from matplotlib.ticker import FixedLocator, NullLocator

    if ref is not None and fam != "none":
        row["draw"](ax, ref, st[ref], 0, True)
    for rank, name in enumerate(members):
        row["draw"](ax, name, st[name], rank, False)
    ax.axvline(L, color="0.3", ls="--", lw=1.1, zorder=1)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(lengths[0] / 2**0.25, lengths[-1] * 2**0.25)
    ax.grid(True, alpha=0.3)
    if row.get("finish"):
        row["finish"](ax)


def _panel_labels(ax, row: dict, fam: str, first_column: bool, top: bool, bottom: bool, lengths: Sequence[int],
                  L: int) -> None:
    """A panel's labels: y on the first column, x (lengths and their multiples of L) on the
    bottom row, the family's title on the top row."""
    from .style import FAMILY_TITLES

    if first_column:
        ax.set_ylabel(row["ylabel"], fontsize=9.5)
    else:
        ax.tick_params(labelleft=False)
    if bottom:
        ax.set_xticks(lengths, [f"{t}\n({t // L}L)" for t in lengths])
        ax.set_xlabel("evaluation length T (tokens)")
    else:
        ax.tick_params(labelbottom=False)
    if top:
        ax.set_title(FAMILY_TITLES.get(fam, fam), fontsize=11)


def _family_figure(names: Sequence[str], rows: Sequence[dict], lengths: Sequence[int], L: int, title: str,
                   notes: Sequence[str] = (), reference_label: str = "reference"):
    """Small multiples by family, as the extrapolation figure draws them: one column
    per family present (NoPE, when drawn, is the grey dotted reference in every
    panel), one row per entry of ``rows`` ({"ylabel", "draw": f(ax, scheme, style,
    rank, reference), "finish": f(ax) or None}), the evaluation length on a log2 x
    axis with the training length L marked, and a legend per column under the panels, the
    reference's entry labelled "none (<reference_label>)". A row with ``"log": True`` gets a
    log y axis with readable ticks (``log_axis``)."""
    import matplotlib.pyplot as plt

    from .extrapolation import REFERENCE, legend_handle, log_axis
    from .style import by_family

    families = by_family(names)
    ref = REFERENCE if REFERENCE in names else None
    columns = [f for f in families if f != "none" or len(families) == 1]
    members = {f: [s for s in families[f] if s != REFERENCE or f == "none"] for f in columns}
    st = styles(names)
    n_legend = max(len(m) + (ref is not None and f != "none") for f, m in members.items())
    ncol = 2 if len(reference_label) <= 10 else 1  # a long label would run into the next column's legend
    heights = [3.0] * len(rows) + [0.75, 0.05 + 0.22 * math.ceil(n_legend / ncol)]
    fig = plt.figure(figsize=(0.6 + 3.9 * len(columns), sum(heights) + 1.2))
    gs = fig.add_gridspec(len(heights), len(columns), height_ratios=heights, hspace=0.14, wspace=0.08,
                          bottom=0.02, top=1 - 1.0 / fig.get_figheight())
    axes = np.empty((len(rows), len(columns)), dtype=object)
    for r, row in enumerate(rows):
        for c, fam in enumerate(columns):
            ax = axes[r, c] = fig.add_subplot(gs[r, c], sharey=axes[r, 0] if c else None,
                                              sharex=axes[0, c] if r else None)
            _family_panel(ax, row, ref, members[fam], st, lengths, L, fam)
            _panel_labels(ax, row, fam, first_column=c == 0, top=r == 0, bottom=r == len(rows) - 1, lengths=lengths, L=L)
    for r, row in enumerate(rows):  # once the shared row holds all its data
        if row.get("log"):
            for ax in axes[r]:
                ax.set_yscale("log")
            log_axis(axes[r, 0])
            for ax in axes[r, 1:]:
                ax.tick_params(labelleft=False)
    for c, fam in enumerate(columns):
        fig.add_subplot(gs[-2, c]).axis("off")
        lax = fig.add_subplot(gs[-1, c])
        lax.axis("off")
        handles = [legend_handle(st[ref], reference=True, label=reference_label)] if ref is not None and fam != "none" else []
        handles += [legend_handle(st[s], rank=rank) for rank, s in enumerate(members[fam])]
        lax.legend(handles=handles, loc="upper center", ncol=ncol, frameon=False, fontsize=9, handlelength=2.6,
                   columnspacing=1.2, borderaxespad=0.0)
    fig.suptitle(title, fontsize=12, y=1 - 0.1 / fig.get_figheight(), va="top")
    if notes:
        fig.text(0.01, 0.0, "\n".join(notes), fontsize=8, va="top", color="0.3")
    return fig


def _line(ax, x, y, style, rank: int, reference: bool, lo=None, hi=None) -> None:
    """One scheme's line (and its interval band) as the extrapolation figure draws it."""
    from .extrapolation import REFERENCE_COLOR, REFERENCE_LS, line_sizes

    kws = style.line_kws()
    lw, ms = (1.6, 4) if reference else line_sizes(rank)
    if reference:
        kws.update(color=REFERENCE_COLOR, linestyle=REFERENCE_LS, marker="o")
    ax.plot(x, y, lw=lw, markersize=ms, markeredgecolor="w", markeredgewidth=0.75,
            zorder=1.5 if reference else 2.5 + 0.01 * rank, **kws)
    if lo is not None:
        ax.fill_between(x, lo, hi, color=kws["color"], alpha=0.1 if reference else 0.15, linewidth=0, zorder=1)


def plot_curves(t: dict, extrapolation: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Small multiples by family (``_family_figure``): top, exact match against length
    (``summary``: the mean over seeds of the runs used, band from the lowest to the
    highest seed); bottom, ppl(T) / ppl(L) of the same schemes' causal-LM runs (per seed,
    then the mean over seeds), so a scheme flat in perplexity but blind far back shows as a
    flat lower curve under a falling upper one."""
    from posenc.files import save_figure

    against = next((c["vs"]["against"] for e in t.values() for c in e["lengths"].values() if "vs" in c), None)
    against_note = (f"the retrieval tests' reference (top; the perplexity ratio's tests, bottom, compare with the LM "
                    f"table's reference, as figures/extrapolation.png draws it)" if against == "none" else
                    f"a baseline (the retrieval tests compare with `{against}`)")
    ex = extrapolation[extrapolation["method"] == "nonoverlapping"].dropna(subset=["ppl"]).copy()
    at_l = ex[ex["eval_len"] == ex["train_len"]].set_index(["scheme", "seed"])["ppl"]
    ex["ratio"] = ex["ppl"] / [at_l.get((s, seed), np.nan) for s, seed in zip(ex["scheme"], ex["seed"])]
    ratio = ex.groupby(["scheme", "eval_len"], as_index=False)["ratio"].mean()
    names = order(set(t) | set(ratio["scheme"]))
    cells = [c for e in t.values() for c in e["lengths"].values()]
    L = min(c["length"] // m for e in t.values() for m, c in e["lengths"].items())
    lengths = sorted({c["length"] for c in cells} | {int(x) for x in ratio["eval_len"]})

    def exact(ax, s, style, rank, reference):
        c = sorted(t.get(s, {"lengths": {}})["lengths"].values(), key=lambda c: c["length"])
        if c:
            _line(ax, [x["length"] for x in c], [100 * x["mean"] for x in c], style, rank, reference,
                  [100 * min(x["values"]) for x in c], [100 * max(x["values"]) for x in c])

    def ppl(ax, s, style, rank, reference):
        r = ratio[ratio["scheme"] == s]
        if len(r):
            _line(ax, r["eval_len"], r["ratio"], style, rank, reference)

    def ppl_axis(ax):
        ax.axhline(1.0, color="0.2", lw=0.9, zorder=1)

    rows = [{"ylabel": "passkeys retrieved exactly (%)", "draw": exact, "finish": lambda ax: ax.set_ylim(-3, 103)},
            {"ylabel": "ppl(T) / ppl(L) (log scale)", "draw": ppl, "finish": ppl_axis, "log": True}]
    seeds = max(len(e["seeds"]) for e in t.values())
    notes = [("top: retrieval runs trained to the criterion, one seed a scheme, mean over needle depths" if seeds == 1 else
              f"top: retrieval runs trained to the criterion ({seeds} seeds a scheme), mean over needle depths and seeds, "
              "band: lowest to highest seed") + "; bottom: the causal-LM runs, mean over seeds",
             f"grey dotted: none (NoPE), in every panel: {against_note}; dashed: a context-extension rule of RoPE"]
    marked = [s for s, e in t.items() if e["marked"]]
    if marked:
        notes.append(f"no run reached the criterion (drawn over every run): {', '.join(marked)}")
    missing = sorted(set(ratio["scheme"]) - set(t))
    if missing:
        notes.append(f"no retrieval run: {', '.join(missing)}")
    fig = _family_figure(names, rows, lengths, L, "Passkeys retrieved exactly (top) and the perplexity ratio "
                         "(bottom) against length, by family", notes,
                         "the retrieval tests' reference" if against == "none" else "baseline")
    return save_figure(fig, stem, bbox_inches="tight")


def plot_steps(t: dict, stem: str | Path, criterion: str) -> list[Path]:
    """Steps to the criterion, a row per scheme (fastest first): each seed a dot (the seeds of
    a scheme a little apart, so that equal steps show), a run that reached the cap first a
    cross at the cap (dashed)."""
    import matplotlib.pyplot as plt

    from posenc.files import save_figure

    base = {s: e for s, e in t.items() if "+" not in s}
    names = sorted(base, key=lambda s: np.mean([v if v is not None else base[s]["cap"]
                                                for v in base[s]["steps"].values()]))
    st = styles(names)
    cap = max(e["cap"] for e in base.values())
    fig, ax = plt.subplots(figsize=(6.4, 0.32 * len(names) + 1.3), layout="constrained")
    for y, s in enumerate(names):
        got = [v for v in base[s]["steps"].values() if v is not None]
        missed = sum(v is None for v in base[s]["steps"].values())
        color = st[s].line_kws()["color"]
        seeds = len(base[s]["steps"])
        offset = lambda i: 0.25 * (i - (seeds - 1) / 2) / max(1, seeds - 1)  # noqa: E731 -- seeds side by side
        ax.scatter(got, [y + offset(i) for i in range(len(got))], s=30, color=color, edgecolor="white", linewidth=0.6,
                   zorder=3)
        if missed:
            ax.scatter([base[s]["cap"]] * missed, [y + offset(len(got) + i) for i in range(missed)], s=40, marker="x",
                       color=color, zorder=3)
    ax.axvline(cap, color="0.4", ls="--", lw=1)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, cap * 1.04)
    ax.set_xlabel("training steps to the criterion (x: not reached by the cap, dashed)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"How fast each scheme learns to retrieve: steps to {criterion}", fontsize=10)
    return save_figure(fig, stem, bbox_inches="tight")


def plot_reach(summary: pd.DataFrame, stem: str | Path) -> list[Path]:
    """Small multiples by family: mean attention distance (top) and attention entropy
    (bottom) of the causal-LM runs against length, mean over layers, heads and seeds,
    with uniform causal attention as the black dashed reference."""
    from posenc.files import save_figure

    names = order(summary["scheme"].unique())
    ref = summary.drop_duplicates("length").sort_values("length")
    lengths = [int(x) for x in ref["length"]]
    L = int(ref["length"].iloc[0] // ref["multiple"].iloc[0])

    def metric(col):
        def draw(ax, s, style, rank, reference):
            c = summary[summary["scheme"] == s].sort_values("length")
            _line(ax, c["length"], c[col], style, rank, reference)
        return draw

    def finish(col):
        def f(ax):
            ax.plot(ref["length"], ref[f"uniform_{col}"], color="black", ls=(0, (5, 3)), lw=1.1, zorder=1.2)
        return f

    rows = [{"ylabel": "mean attention distance (tokens, log scale)", "draw": metric("distance"),
             "finish": finish("distance"), "log": True},
            {"ylabel": "attention entropy (nats)", "draw": metric("entropy"), "finish": finish("entropy")}]
    seeds = int(summary["seeds"].max())
    notes = [f"mean over layers, heads and {seeds} seed{'s' if seeds > 1 else ''} of the causal-LM runs; "
             "black dashed: uniform causal attention, distance (T - 1) / 4 and entropy mean ln(i + 1)",
             "grey dotted: none (NoPE), a baseline in every panel (this figure tests nothing); dashed: a "
             "context-extension rule of RoPE"]
    fig = _family_figure(names, rows, lengths, L, "How far back each scheme attends, and how spread its "
                         "attention is, against length, by family", notes, "baseline")
    return save_figure(fig, stem, bbox_inches="tight")


def reach_markdown(summary: pd.DataFrame) -> str:
    """Mean attention distance (tokens) and entropy (nats) of every scheme at every length."""
    mults = sorted(summary["multiple"].unique())
    labels = [f"{m}L" if m > 1 else "L" for m in mults]
    head = ["scheme", *[f"distance {x}" for x in labels], *[f"entropy {x}" for x in labels]]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    ref = summary.drop_duplicates("multiple").set_index("multiple")
    lines.append("| uniform causal | " + " | ".join([f"{ref.at[m, 'uniform_distance']:.1f}" for m in mults]
                                                  + [f"{ref.at[m, 'uniform_entropy']:.2f}" for m in mults]) + " |")
    for s in order(summary["scheme"].unique()):
        r = summary[summary["scheme"] == s].set_index("multiple")
        cells = [f"{r.at[m, 'distance']:.1f}" if m in r.index else "n/a" for m in mults]
        cells += [f"{r.at[m, 'entropy']:.2f}" if m in r.index else "n/a" for m in mults]
        lines.append(f"| `{s}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
