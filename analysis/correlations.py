"""First-layer attention logits split into word and position terms
(Ke, He & Liu 2020, "Rethinking Positional Encoding in Language Pre-training",
Figure 2).

    python -m analysis.correlations --ckpt outputs/runs/<run>/checkpoints/last.ckpt [--ckpt ...] \
        --out-dir figures/correlations --json results/correlations.json --batches 2 --length 128

For every checkpoint: rebuild the model, sample sequences from the validation
split of the model's own data config (``instantiate(cfg.data)``; the data folder
can be overridden with ``--data-dir`` or ``POSENC_DATA_DIR``), and split the
pre-mask first-layer logits with ``Transformer.first_layer_terms`` into
word-word, word-position, position-word and position-position terms, each
(B, H, T, T). The terms are averaged over the sampled sequences (per head),
then over heads, and drawn as four heatmaps side by side on one diverging
colour scale centred at 0; a term a scheme lacks is an empty panel titled
"(absent)". Causal models never use logits above the diagonal, so those
entries are left blank and left out of every statistic.

Writes, per checkpoint, ``<out-dir>/<run>.png|svg`` (Figure 2) and
``<out-dir>/<run>_heads.png|svg`` (each head), plus ``<out-dir>/overview.png|svg``
(rows = schemes, columns = the four terms; one colour scale per row), and a
JSON summary with, for each term:

* ``mean``, ``mean_abs``, ``std``: mean, mean |value| and standard deviation over every used
  entry of every sampled sequence and head (the size of the term in the
  logits the softmax sees);
* ``map_mean_abs``, ``map_std``: the same over the head- and batch-averaged
  map that is drawn (the part of the term that is consistent across
  sentences);
* ``band_score`` (see :func:`band_score`) and ``distance_corr`` (see
  :func:`distance_corr`) of the drawn map, and both per head under ``per_head``.

Band score (diagonal-band score), for a map M over the used entries (all
(i, j), or j <= i for causal models), with band half-width w (``--band-width``,
default 2)::

    band_score = (mean_{|i-j| <= w} M_ij  -  mean_{|i-j| > w} M_ij) / std(M)

i.e. how far the logits near the diagonal lie above the rest, in units of the
map's standard deviation. It is signed: positive when nearby positions get
higher logits (the band of Ke et al.'s position-position map), negative when
they get lower ones, about 0 for a map without a diagonal band (e.g. one that
varies only by row or column); it is 0 for a constant map.
``distance_corr`` is the Pearson correlation of M_ij with -|i - j| over the same
entries (1 for a logit that falls linearly with distance, e.g. ALiBi).
``query_only_share`` (see :func:`query_only_share`) is the share of the map's
variance that depends on the query position alone; the softmax over keys
ignores that part.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch
from torch import Tensor

from posenc.encodings.base import TERM_NAMES
from posenc.evaluate import portable_path

DEFAULT_BAND_WIDTH = 2
CMAP = "RdBu_r"
BAND_SCORE_DEFINITION = (
    "band_score = (mean of M_ij over |i-j| <= w  -  mean of M_ij over |i-j| > w) / std(M), over the used "
    "entries (j <= i for causal models) of the map M; signed, 0 for a map without a diagonal band or a "
    "constant map. distance_corr = Pearson correlation of M_ij with -|i-j| over the same entries."
)


# ------------------------------------------------------------------ file output
def _atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` into a temporary file, then os.replace it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    path = Path(path)

    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, allow_nan=False)
            f.write("\n")

    _atomic_write(path, write)
    return path


def save_figure(fig, stem: str | os.PathLike, dpi: int = 150) -> list[Path]:
    """``<stem>.png`` and ``<stem>.svg``, each written atomically, then close the
    figure (the figures lay themselves out with fixed margins:
    ``bbox_inches="tight"`` would draw twice)."""
    stem = Path(stem)
    out = []
    try:
        for fmt in ("png", "svg"):
            path = stem.with_name(f"{stem.name}.{fmt}")
            _atomic_write(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=dpi))
            out.append(path)
    finally:
        plt.close(fig)
    return out


# ------------------------------------------------------------------ statistics
def used_entries(T: int, causal: bool) -> np.ndarray:
    """(T, T) bool: the (query i, key j) pairs the softmax uses."""
    return np.tril(np.ones((T, T), dtype=bool)) if causal else np.ones((T, T), dtype=bool)


def band_score(m: np.ndarray, width: int = DEFAULT_BAND_WIDTH, causal: bool = False) -> float:
    """(mean of M inside |i-j| <= width - mean outside) / std(M), over used entries.

    See the module docstring. Returns 0.0 for a constant map or when one side
    of the band is empty (width >= T - 1).
    """
    m = np.asarray(m, dtype=np.float64)
    T = m.shape[-1]
    used = used_entries(T, causal)
    dist = np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    inside, outside = used & (dist <= width), used & (dist > width)
    sd = m[used].std()
    if not inside.any() or not outside.any() or sd <= 1e-12 * max(1.0, np.abs(m[used]).max()):
        return 0.0
    return float((m[inside].mean() - m[outside].mean()) / sd)


def distance_corr(m: np.ndarray, causal: bool = False) -> float:
    """Pearson correlation of M_ij with -|i - j| over used entries (0.0 if M is constant)."""
    m = np.asarray(m, dtype=np.float64)
    T = m.shape[-1]
    used = used_entries(T, causal)
    d = -np.abs(np.arange(T)[:, None] - np.arange(T)[None, :]).astype(np.float64)
    x, y = m[used], d[used]
    x, y = x - x.mean(), y - y.mean()
    den = math.sqrt(float((x * x).sum()) * float((y * y).sum()))
    if den <= 1e-300 or np.abs(x).max() <= 1e-12 * max(1.0, np.abs(m[used]).max()):
        return 0.0
    return float((x * y).sum() / den)


def query_only_share(m: np.ndarray, causal: bool = False) -> float:
    """Share of the variance of M (over used entries) explained by its row means.

    A term that varies only with the query position i adds the same amount to
    every logit of row i, which the softmax over keys cancels: a share near 1
    means the term's structure cannot move attention. 0.0 for a constant map.
    """
    m = np.asarray(m, dtype=np.float64)
    used = used_entries(m.shape[-1], causal)
    row_mean = np.array([r[u].mean() for r, u in zip(m, used)])
    total = m[used].var()
    if total <= 1e-24 * max(1.0, float(np.abs(m[used]).max()) ** 2):
        return 0.0
    fitted = np.broadcast_to(row_mean[:, None], m.shape)[used]
    return float(fitted.var() / total)


# ------------------------------------------------------------------ term maps
@dataclass
class TermMaps:
    """Batch-averaged first-layer logit terms of one model.

    ``per_head[term]`` is (H, T, T), the mean over the sampled sequences;
    ``raw[term]`` holds mean_abs and std over every used entry of every
    sequence and head. Absent terms are missing from both.
    """

    label: str
    per_head: dict[str, np.ndarray]
    raw: dict[str, dict[str, float]]
    causal: bool
    n_sequences: int
    caption: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def present(self) -> list[str]:
        return [t for t in TERM_NAMES if t in self.per_head]

    @property
    def length(self) -> int:
        return next(iter(self.per_head.values())).shape[-1]

    @property
    def n_heads(self) -> int:
        return next(iter(self.per_head.values())).shape[0]

    def head_mean(self, term: str) -> np.ndarray:
        """(T, T) map averaged over heads; upper triangle NaN for causal models."""
        m = self.per_head[term].mean(0)
        return np.where(used_entries(m.shape[-1], self.causal), m, np.nan)

    def summary(self, band_width: int = DEFAULT_BAND_WIDTH) -> dict[str, Any]:
        used = used_entries(self.length, self.causal)
        terms: dict[str, Any] = {}
        for t in TERM_NAMES:
            if t not in self.per_head:
                terms[t] = {"present": False}
                continue
            m = self.per_head[t].mean(0)
            heads = self.per_head[t]
            terms[t] = {
                "present": True,
                "mean": self.raw[t]["mean"],
                "mean_abs": self.raw[t]["mean_abs"],
                "std": self.raw[t]["std"],
                "map_mean_abs": float(np.abs(m[used]).mean()),
                "map_std": float(m[used].std()),
                "band_score": band_score(m, band_width, self.causal),
                "distance_corr": distance_corr(m, self.causal),
                "query_only_share": query_only_share(m, self.causal),
                "per_head": {
                    "map_std": [float(h[used].std()) for h in heads],
                    "band_score": [band_score(h, band_width, self.causal) for h in heads],
                    "distance_corr": [distance_corr(h, self.causal) for h in heads],
                },
            }
        return {
            "label": self.label,
            "causal": self.causal,
            "length": self.length,
            "n_heads": self.n_heads,
            "n_sequences": self.n_sequences,
            "band_width": band_width,
            **self.meta,
            "terms": terms,
        }


class TermAccumulator:
    """Running means of term dicts {name: (B, H, T, T)} over batches, in float64."""

    def __init__(self, causal: bool):
        self.causal = causal
        self.n = 0
        self.sums: dict[str, Tensor] = {}
        self.moments: dict[str, list[float]] = {}  # count, sum, sum of squares, sum of |x|

    def add(self, terms: dict[str, Tensor]) -> None:
        unknown = set(terms) - set(TERM_NAMES)
        if unknown:
            raise ValueError(f"unknown term names {sorted(unknown)}; expected a subset of {TERM_NAMES}")
        if self.n and set(terms) != set(self.sums):
            raise ValueError(f"terms changed between batches: {sorted(self.sums)} then {sorted(terms)}")
        B, H, T, T2 = next(iter(terms.values())).shape
        used = torch.from_numpy(used_entries(T, self.causal))
        for name, t in terms.items():
            if t.shape != (B, H, T, T2):
                raise ValueError(f"term {name} has shape {tuple(t.shape)}, expected {(B, H, T, T2)}")
            t = t.detach().to("cpu", torch.float64)
            self.sums[name] = self.sums.get(name, 0) + t.sum(0)
            v = t[..., used]
            mom = self.moments.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            mom[0] += v.numel()
            mom[1] += float(v.sum())
            mom[2] += float((v * v).sum())
            mom[3] += float(v.abs().sum())
        self.n += B

    def result(self, label: str, caption: str = "", **meta) -> TermMaps:
        if not self.n:
            raise ValueError("no batches were added")
        per_head = {k: (v / self.n).numpy() for k, v in self.sums.items()}
        raw = {}
        for k, (cnt, s, ss, sa) in self.moments.items():
            mean = s / cnt
            raw[k] = {"mean": mean, "mean_abs": sa / cnt, "std": math.sqrt(max(ss / cnt - mean * mean, 0.0))}
        return TermMaps(label, per_head, raw, self.causal, self.n, caption, dict(meta))


# ------------------------------------------------------------------ our checkpoints
def load_checkpoint(path: str | os.PathLike):
    """(Transformer in eval mode, resolved run config) from a Lightning checkpoint,
    loaded like every posenc checkpoint (``posenc.evaluate.load_module``: weights only)."""
    from omegaconf import OmegaConf

    from posenc.evaluate import load_module

    if not Path(path).is_file():
        raise FileNotFoundError(f"--ckpt {path}: no such checkpoint file")
    module = load_module(path)
    return module.model, OmegaConf.create(module.hparams["cfg"])


def validation_batches(
    cfg,
    n_batches: int,
    length: int | None = None,
    batch_size: int | None = None,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    vocab_size: int | None = None,
) -> list[Tensor]:
    """Input batches (B, T) sampled without replacement from the validation split.

    Uses the run's own data config with ``seq_len = length`` (default: the
    training length) through ``instantiate(cfg.data).val_dataloader()``; for
    ``task=mlm`` the inputs are masked and start with [CLS], as in training.
    ``data_dir`` (else ``POSENC_DATA_DIR``, else the run's setting) replaces
    the corpus folder, ``cache_dir`` the tokenizer cache.
    """
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg.data, resolve=True)
    if length is not None:
        data["seq_len"] = int(length)
    if batch_size is not None:
        data["eval_batch_size"] = int(batch_size)
    data_dir = data_dir or os.environ.get("POSENC_DATA_DIR")
    if data_dir:
        data["corpus"]["root"] = str(data_dir)
    if cache_dir:
        data["cache_dir"] = str(cache_dir)
    dm = instantiate(OmegaConf.create(data))
    dm.prepare_data()
    if vocab_size is not None and dm.tokenizer_vocab_size != vocab_size:
        raise ValueError(
            f"the tokenizer prepared for data={data['corpus']['name']} has {dm.tokenizer_vocab_size} tokens, "
            f"the checkpoint {vocab_size}: point --data-dir/--cache-dir at the data the model was trained on"
        )
    loader = dm.val_dataloader()
    ds, bs = loader.dataset, loader.batch_size
    n = min(len(ds), n_batches * bs)
    idx = np.sort(np.random.default_rng(seed).choice(len(ds), size=n, replace=False))
    batches = []
    for s in range(0, n, bs):
        batches.append(torch.stack([ds[int(i)][0] for i in idx[s : s + bs]]))
    return batches


def model_term_maps(model, batches: Iterable[Tensor], label: str, **meta) -> TermMaps:
    """Average ``model.first_layer_terms`` over input batches (B, T) at positions 0..T-1."""
    model.eval()
    acc = TermAccumulator(causal=bool(model.cfg.causal))
    for x in batches:
        model.check_length(x.shape[1])
        acc.add(model.first_layer_terms(x))
    caption = (
        "Input to layer 1 = LN1(word + position), split exactly: word part g(w - mean w)/s + b, "
        "position part g(p - mean p)/s, s = std of the full input; q/k biases go with the word part."
    )
    return acc.result(label, caption, **meta)


def checkpoint_term_maps(
    path: str | os.PathLike,
    n_batches: int = 2,
    length: int | None = None,
    batch_size: int | None = None,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
) -> TermMaps:
    model, cfg = load_checkpoint(path)
    length = int(length or cfg.data.seq_len)
    model.check_length(length)
    batches = validation_batches(
        cfg, n_batches, length, batch_size, data_dir, cache_dir, seed, vocab_size=model.cfg.vocab_size
    )
    label = f"{cfg.encoding.name} ({cfg.task.name})"
    meta = {
        "run_name": str(cfg.run_name),
        "checkpoint": portable_path(path),
        "encoding": str(cfg.encoding.name),
        "seed": int(cfg.seed),
        "task": str(cfg.task.name),
        "data": str(cfg.data.corpus.name),
    }
    return model_term_maps(model, batches, label, **meta)


# ------------------------------------------------------------------ figures
def _vmax(maps: Iterable[np.ndarray]) -> float:
    vals = [np.nanmax(np.abs(m)) for m in maps if np.isfinite(m).any()]
    v = max(vals, default=0.0)
    return float(v) if v > 0 else 1.0


def _tick_step(T: int, n_ticks: int = 8) -> int:
    """A power of two that gives at most about ``n_ticks`` ticks."""
    return max(1, int(2 ** math.ceil(math.log2(max(T / n_ticks, 1)))))


def _heatmap(ax, m: np.ndarray, vmax: float, cbar_ax=None, cbar_label: str | None = None, n_ticks: int = 8) -> None:
    """One (T, T) map with imshow (seaborn's heatmap is ~100x slower for 128x128 maps);
    NaN entries (masked, causal upper triangle) are drawn white."""
    T = m.shape[-1]
    cmap = plt.get_cmap(CMAP).with_extremes(bad="white")
    im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, vmin=-vmax, vmax=vmax, interpolation="nearest", aspect="equal")
    ticks = np.arange(0, T, _tick_step(T, n_ticks))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.tick_params(labelsize=7, length=2)
    ax.set_xlabel("key position j", fontsize=8)
    ax.set_ylabel("query position i", fontsize=8)
    ax.grid(False)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(True)
        ax.spines[side].set_linewidth(0.5)
    if cbar_ax is not None:
        cb = ax.figure.colorbar(im, cax=cbar_ax)
        cb.ax.tick_params(labelsize=7)
        if cbar_label:
            cb.set_label(cbar_label, fontsize=8)


def _absent(ax, title: str) -> None:
    """An empty, square panel for a term the scheme does not have."""
    ax.set_title(title, fontsize=9)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "(absent)", ha="center", va="center", fontsize=9, color="0.5", transform=ax.transAxes)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_color("0.75")


def _fit_colorbar(cax, ax, right_of=None) -> None:
    """Give the colour bar the height of an aspect-locked image axis (and put it
    just right of ``right_of``, the last panel of its row)."""
    ax.apply_aspect()
    p, c = ax.get_position(), cax.get_position()
    x0 = c.x0
    if right_of is not None:
        right_of.apply_aspect()
        x0 = right_of.get_position().x1 + 0.012
    cax.set_position([x0, p.y0, c.width, p.height])


def _stats_line(maps: TermMaps, term: str, band_width: int) -> str:
    m = maps.per_head[term].mean(0)
    return (
        f"mean|x| {maps.raw[term]['mean_abs']:.2g}, std {maps.raw[term]['std']:.2g}\n"
        f"band {band_score(m, band_width, maps.causal):+.2f}"
    )


def plot_terms(
    maps: TermMaps, stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH, title: str | None = None
) -> list[Path]:
    """Figure 2 for one model: four head-averaged maps, one colour scale."""
    sns.set_theme(style="white", context="paper")
    W, Hgt = 15.5, 4.8  # inches; fixed margins instead of bbox_inches="tight" (a second draw per file)
    fig = plt.figure(figsize=(W, Hgt))
    grid = fig.add_gridspec(
        1,
        5,
        width_ratios=[1, 1, 1, 1, 0.05],
        wspace=0.3,
        left=0.6 / W,
        right=1 - 0.7 / W,
        top=1 - 1.05 / Hgt,
        bottom=0.95 / Hgt,
    )
    axes = [fig.add_subplot(grid[0, i]) for i in range(4)]
    cax = fig.add_subplot(grid[0, 4])
    vmax = _vmax(maps.head_mean(t) for t in maps.present)
    for ax, term in zip(axes, TERM_NAMES):
        if term in maps.per_head:
            first = term == maps.present[0]
            _heatmap(ax, maps.head_mean(term), vmax, cbar_ax=cax if first else None, cbar_label="logit term")
            ax.set_title(f"{term}\n{_stats_line(maps, term, band_width)}", fontsize=9)
        else:
            _absent(ax, f"{term}\n(absent)")
    if maps.present:
        _fit_colorbar(cax, next(a for a, t in zip(axes, TERM_NAMES) if t in maps.per_head), axes[-1])
    else:
        cax.set_visible(False)
    fig.suptitle(
        title or f"{maps.label}: first-layer attention logits by term", fontsize=12, y=1 - 0.12 / Hgt, va="top"
    )
    caption = (
        f"Mean over {maps.n_sequences} sequences of length {maps.length} and {maps.n_heads} heads; logits on the "
        f"softmax scale; one colour scale, centred at 0. band = band score (|i-j| <= {band_width}); "
        "mean|x|/std over all sequences, heads and used entries."
    )
    if maps.causal:
        caption += " Causal model: entries above the diagonal are masked and left blank."
    if maps.caption:
        caption += "\n" + maps.caption
    fig.text(0.5, 0.08 / Hgt, caption, ha="center", va="bottom", fontsize=8, wrap=True)
    return save_figure(fig, stem)


def plot_heads(maps: TermMaps, stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH) -> list[Path]:
    """Every head: rows = present terms, columns = heads; one colour scale per row."""
    sns.set_theme(style="white", context="paper")
    rows, H = maps.present, maps.n_heads
    if not rows:
        raise ValueError(f"{maps.label} has no terms to draw")
    W, Hgt = max(2.0 * H + 1.6, 7.0), 2.2 * len(rows) + 1.0
    fig = plt.figure(figsize=(W, Hgt))
    grid = fig.add_gridspec(
        len(rows),
        H + 1,
        width_ratios=[1] * H + [0.06],
        wspace=0.35,
        hspace=0.45,
        left=0.8 / W,
        right=1 - 0.6 / W,
        top=1 - 0.9 / Hgt,
        bottom=0.3 / Hgt,
    )
    used = used_entries(maps.length, maps.causal)
    for r, term in enumerate(rows):
        heads = np.where(used, maps.per_head[term], np.nan)
        vmax = _vmax(heads)
        cax = fig.add_subplot(grid[r, H])
        axes = [fig.add_subplot(grid[r, h]) for h in range(H)]
        for h, ax in enumerate(axes):
            _heatmap(ax, heads[h], vmax, cbar_ax=cax if h == 0 else None, n_ticks=4)
            ax.set_xlabel("")
            ax.set_ylabel(term if h == 0 else "", fontsize=9)
            ax.set_title(
                f"head {h}  band {band_score(maps.per_head[term][h], band_width, maps.causal):+.2f}", fontsize=8
            )
        _fit_colorbar(cax, axes[0], axes[-1])
    fig.suptitle(
        f"{maps.label}: first-layer logit terms per head, mean over {maps.n_sequences} sequences\n"
        "(one colour scale per row)",
        fontsize=11,
        y=1 - 0.1 / Hgt,
        va="top",
    )
    return save_figure(fig, stem)


def plot_overview(
    all_maps: Sequence[TermMaps], stem: str | os.PathLike, band_width: int = DEFAULT_BAND_WIDTH
) -> list[Path]:
    """Rows = schemes, columns = the four terms; a shared colour scale per row."""
    if not all_maps:
        raise ValueError("no models to draw")
    sns.set_theme(style="white", context="paper")
    n = len(all_maps)
    W, Hgt = 12.5, 2.75 * n + 0.9
    fig = plt.figure(figsize=(W, Hgt))
    grid = fig.add_gridspec(
        n,
        5,
        width_ratios=[1, 1, 1, 1, 0.05],
        wspace=0.3,
        hspace=0.45,
        left=1.0 / W,
        right=1 - 0.6 / W,
        top=1 - 0.8 / Hgt,
        bottom=0.45 / Hgt,
    )
    for r, maps in enumerate(all_maps):
        vmax = _vmax(maps.head_mean(t) for t in maps.present)
        cax = fig.add_subplot(grid[r, 4])
        axes = [fig.add_subplot(grid[r, c]) for c in range(4)]
        first = True
        for c, (ax, term) in enumerate(zip(axes, TERM_NAMES)):
            if term in maps.per_head:
                _heatmap(ax, maps.head_mean(term), vmax, cbar_ax=cax if first else None)
                if first:
                    _fit_colorbar(cax, ax, axes[-1])
                first = False
                m = maps.per_head[term].mean(0)
                ax.set_title(f"{term}  (band {band_score(m, band_width, maps.causal):+.2f})", fontsize=9)
            else:
                _absent(ax, f"{term}\n(absent)")
            if c == 0:
                ax.set_ylabel(f"{maps.label}\nquery position i", fontsize=9)
            else:
                ax.set_ylabel("")
            if r < n - 1:
                ax.set_xlabel("")
        if first:
            cax.set_visible(False)
    fig.suptitle(
        "First-layer attention logits by term (Ke, He & Liu 2020, Fig. 2): mean over sequences and heads,"
        " one colour scale per row",
        fontsize=11,
        y=1 - 0.15 / Hgt,
        va="top",
    )
    return save_figure(fig, stem)


# ------------------------------------------------------------------ CLI
def _stem(name: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    stem, i = base, 2
    while stem in taken:
        stem, i = f"{base}_{i}", i + 1
    taken.add(stem)
    return stem


def print_table(summaries: dict[str, dict], file=None) -> None:
    file = file or sys.stdout
    print(
        f"{'model':28s} {'term':18s} {'mean|x|':>9s} {'std':>9s} {'map std':>9s} {'band':>7s} {'d-corr':>7s} "
        f"{'q-only':>7s}",
        file=file,
    )
    for name, s in summaries.items():
        for t in TERM_NAMES:
            r = s["terms"][t]
            if not r["present"]:
                print(f"{name:28s} {t:18s} {'(absent)':>9s}", file=file)
                continue
            print(
                f"{name:28s} {t:18s} {r['mean_abs']:9.3g} {r['std']:9.3g} {r['map_std']:9.3g} "
                f"{r['band_score']:+7.2f} {r['distance_corr']:+7.2f} {r['query_only_share']:7.2f}",
                file=file,
            )


def seed_spread(summaries: dict[str, dict]) -> dict[str, dict]:
    """Per model label ("rope (mlm)"): each present term's band score over the
    seeds of that scheme and task, as mean, sample sd (0 for one seed), n and values."""
    groups: dict[str, list[dict]] = {}
    for s in summaries.values():
        groups.setdefault(s["label"], []).append(s)
    out = {}
    for label, runs in sorted(groups.items()):
        terms = {}
        for t in TERM_NAMES:
            vals = [r["terms"][t]["band_score"] for r in runs if r["terms"][t].get("present")]
            if vals:
                sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0
                terms[t] = {"band_mean": float(np.mean(vals)), "band_sd": sd, "n": len(vals), "values": vals}
        out[label] = {"seeds": sorted(r.get("seed") for r in runs), "terms": terms}
    return out


def run(
    ckpts: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike = "figures/correlations",
    json_path: str | os.PathLike = "results/correlations.json",
    n_batches: int = 2,
    length: int | None = None,
    batch_size: int | None = None,
    band_width: int = DEFAULT_BAND_WIDTH,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    heads: bool = True,
    draw_seed: int | None = None,
) -> dict[str, Any]:
    """Figures and JSON for every checkpoint; returns the JSON object.

    Every checkpoint is summarised; with ``draw_seed`` only the runs trained
    with that seed are drawn (one figure per scheme), and ``schemes`` in the
    JSON gives each term's band score as mean, sample sd and values over the
    seeds of every scheme.
    """
    if not ckpts:
        raise ValueError("give at least one checkpoint")
    out_dir = Path(out_dir)
    taken: set[str] = set()
    all_maps, summaries = [], {}
    for ckpt in ckpts:
        maps = checkpoint_term_maps(ckpt, n_batches, length, batch_size, data_dir, cache_dir, seed)
        stem = _stem(maps.meta.get("run_name", maps.label), taken)
        summary = maps.summary(band_width)
        if draw_seed is None or maps.meta.get("seed") == draw_seed:
            figs = plot_terms(maps, out_dir / stem, band_width)
            if heads:
                figs += plot_heads(maps, out_dir / f"{stem}_heads", band_width)
            summary["figures"] = [str(p) for p in figs]
            all_maps.append(maps)
        summaries[stem] = summary
    overview = plot_overview(all_maps, out_dir / "overview", band_width)
    result = {
        "figure": "Ke, He & Liu 2020, Figure 2: first-layer logits split into word/position terms",
        "band_score_definition": BAND_SCORE_DEFINITION,
        "band_width": band_width,
        "seed": seed,
        "overview": [str(p) for p in overview],
        "schemes": seed_spread(summaries),
        "models": summaries,
    }
    write_json(json_path, result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.correlations", description=__doc__.split("\n\n")[0])
    p.add_argument("--ckpt", action="append", required=True, help="a checkpoint (.ckpt); repeat for several")
    p.add_argument("--out-dir", default="figures/correlations")
    p.add_argument("--json", default="results/correlations.json")
    p.add_argument("--batches", type=int, default=2, help="validation batches to sample (default 2)")
    p.add_argument("--length", type=int, default=None, help="sequence length (default: the training length)")
    p.add_argument("--batch-size", type=int, default=None, help="default: the run's data.eval_batch_size")
    p.add_argument("--band-width", type=int, default=DEFAULT_BAND_WIDTH, help="band half-width w of the band score")
    p.add_argument("--data-dir", default=None, help="corpus folder (default: POSENC_DATA_DIR, else the run's)")
    p.add_argument("--cache-dir", default=None, help="tokenizer cache (default: the run's paths.cache_dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-heads", action="store_true", help="skip the per-head figures")
    p.add_argument("--draw-seed", type=int, default=None,
                   help="draw only the runs trained with this seed (all are summarised)")
    a = p.parse_args(argv)
    if a.batches < 1:
        p.error("--batches must be at least 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = run(
            a.ckpt,
            a.out_dir,
            a.json,
            a.batches,
            a.length,
            a.batch_size,
            a.band_width,
            a.data_dir,
            a.cache_dir,
            a.seed,
            heads=not a.no_heads,
            draw_seed=a.draw_seed,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(result["models"])
    print(f"wrote {a.json} and figures under {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
