"""Computing the Ke, He & Liu 2020 (Figure 2) analysis: first-layer attention
logits split into word-word, word-position, position-word and position-position
terms, averaged over sequences, and the statistics that summarise a map.

This module computes and draws nothing; :mod:`analysis.heatmaps` draws what it
returns, :mod:`analysis.correlations` runs both for posenc checkpoints and
:mod:`analysis.pretrained` for all-MiniLM-L6-v2.

Per term, ``TermMaps.summary`` gives:

* ``mean``, ``mean_abs``, ``std``: mean, mean |value| and standard deviation over every used
  entry of every sampled sequence and head (the size of the term in the
  logits the softmax sees);
* ``map_mean_abs``, ``map_std``: the same over the head- and batch-averaged
  map that is drawn (the part of the term that is consistent across
  sentences);
* ``band_score`` (see :func:`band_score`) and ``distance_corr`` (see
  :func:`distance_corr`) of the drawn map, and both per head under ``per_head``.

Band score (diagonal-band score), for a map M over the used entries (all
(i, j), or j <= i for causal models), with band half-width w (default 2)::

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

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from posenc.encodings.base import TERM_NAMES
from posenc.files import atomic, portable_path

DEFAULT_BAND_WIDTH = 2
BAND_SCORE_DEFINITION = (
    "band_score = (mean of M_ij over |i-j| <= w  -  mean of M_ij over |i-j| > w) / std(M), over the used "
    "entries (j <= i for causal models) of the map M; signed, 0 for a map without a diagonal band or a "
    "constant map. distance_corr = Pearson correlation of M_ij with -|i-j| over the same entries."
)


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

    def save(self, path: str | os.PathLike) -> Path:
        """Write the maps to a compressed ``.npz`` (what a summary stage needs to draw the
        overview without the checkpoint); ``load`` reads it back unchanged."""
        import io
        import json

        arrays = {f"per_head:{t}": self.per_head[t] for t in self.present}
        header = {"label": self.label, "raw": self.raw, "causal": self.causal, "n_sequences": self.n_sequences,
                  "caption": self.caption, "meta": self.meta}
        buf = io.BytesIO()  # np.savez on a path would append ".npz" to a temporary name
        np.savez_compressed(buf, header=np.array(json.dumps(header)), **arrays)
        return atomic(path, lambda tmp: tmp.write_bytes(buf.getvalue()))

    @classmethod
    def load(cls, path: str | os.PathLike) -> TermMaps:
        import json

        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["header"]))
            per_head = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("per_head:")}
        per_head = {t: per_head[t] for t in TERM_NAMES if t in per_head}
        return cls(header["label"], per_head, header["raw"], header["causal"], header["n_sequences"],
                   header["caption"], header["meta"])

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

# ------------------------------------------------------------------ posenc models
def sample_batches(dm, n_batches: int, seed: int = 0) -> list[Tensor]:
    """Input batches (B, T) of the validation loader of a prepared DataModule, its
    windows sampled without replacement with ``seed`` (for ``task=mlm`` masked and
    starting with [CLS], as in training)."""
    loader = dm.val_dataloader()
    ds, bs = loader.dataset, loader.batch_size
    n = min(len(ds), n_batches * bs)
    idx = np.sort(np.random.default_rng(seed).choice(len(ds), size=n, replace=False))
    return [torch.stack([ds[int(i)][0] for i in idx[s : s + bs]]) for s in range(0, n, bs)]


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
    """Term maps of a checkpoint on ``n_batches`` validation batches of its own data
    (``posenc.runs.run_data``) at ``length`` (default: the training length)."""
    from posenc.runs import open_run, run_data

    if not Path(path).is_file():
        raise FileNotFoundError(f"--ckpt {path}: no such checkpoint file")
    run, module = open_run(path)
    model = module.model
    length = int(length or run.train_len)
    model.check_length(length)
    settings = {"seq_len": length, **({"eval_batch_size": int(batch_size)} if batch_size else {})}
    dm = run_data(run.cfg, data_dir, cache_dir, model.cfg.vocab_size, **settings)
    meta = {
        "run_name": str(run.run_name),
        "checkpoint": portable_path(path),
        "encoding": run.scheme,
        "seed": int(run.seed),
        "task": run.task_name,
        "data": run.corpus,
    }
    return model_term_maps(model, sample_batches(dm, n_batches, seed), f"{run.scheme} ({run.task_name})", **meta)


# ------------------------------------------------------------------ summaries
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


def summary_document(summaries: dict[str, dict], band_width: int, **extra: Any) -> dict[str, Any]:
    """The JSON object of an analysis: definitions, then ``extra``, then every model's summary."""
    return {
        "figure": "Ke, He & Liu 2020, Figure 2: first-layer logits split into word/position terms",
        "band_score_definition": BAND_SCORE_DEFINITION,
        "band_width": band_width,
        **extra,
        "models": summaries,
    }
