"""How far a model attends: mean attention distance and attention entropy per layer
and head, against the evaluation length.

For attention probabilities p (a query row i over keys j), the row's distance is
sum_j p_ij |i - j| and its entropy -sum_j p_ij ln p_ij (nats); a (length, layer,
head) cell is the mean over every query row of every window scored. Uniform
causal attention over T tokens gives distance (T - 1) / 4 and entropy
mean_i ln(i + 1) (``uniform_causal``): the reference a scheme that spreads its
attention as the context grows approaches, while one that keeps looking nearby
(ALiBi) stays flat. Checked against hand-built patterns whose values are known in
closed form (``tests/test_reach.py``: identity, first token, uniform).

The probabilities are the model's own: one forward of the model hands back
every layer's (``Transformer.forward(attention=...)``, the reference path's
``Attention.probabilities``), so a context-extension rule switched on at
evaluation (YaRN's temperature) is in them, and this module computes no
attention of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


#: the columns of a reach file (``checkpoint_reach`` rows)
COLUMNS = ("scheme", "seed", "train_len", "multiple", "length", "layer", "head", "distance", "entropy",
           "uniform_distance", "uniform_entropy")


def row_stats(probs: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distance, entropy) of every query row of ``probs`` (..., Tq, Tk): (..., Tq) each."""
    dist = (q_pos[:, None] - k_pos[None, :]).abs().to(probs.dtype)
    distance = (probs * dist).sum(-1)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(-1)
    return distance, entropy


def uniform_causal(T: int) -> tuple[float, float]:
    """(mean distance, mean entropy) of uniform causal attention over T tokens."""
    return (T - 1) / 4, float(np.mean(np.log(np.arange(1, T + 1))))


@torch.no_grad()
def attention_probabilities(model, idx: torch.Tensor, last: int | None = None) -> list[torch.Tensor]:
    """Every layer's attention probabilities (B, H, T, T) of a posenc Transformer in
    eval mode, from one forward of the model itself. With ``last``, the rows of the last
    ``last`` queries alone, (B, H, last, T) (the model computes the top layer for those
    rows only)."""
    out: list[torch.Tensor] = []
    model(idx, last=last, attention=out)
    T = idx.shape[1]
    return [p[:, :, T - last :] if last and p.shape[2] == T else p for p in out]


@torch.no_grad()
def reach_rows(model, tokens: np.ndarray, lengths: Sequence[int], windows: int = 4) -> list[dict]:
    """Rows {length, layer, head, distance, entropy, uniform_distance, uniform_entropy}:
    the means over ``windows`` non-overlapping windows of each length from the start
    of ``tokens``. Lengths the model cannot represent are left out."""
    model.eval()
    rows = []
    for T in lengths:
        try:
            model.check_length(T)
        except ValueError:
            continue
        if len(tokens) < windows * T:
            raise ValueError(f"{len(tokens)} tokens hold fewer than {windows} windows of {T}")
        idx = torch.from_numpy(np.asarray(tokens[: windows * T], dtype=np.int64).reshape(windows, T))
        pos = torch.arange(T)
        u_dist, u_ent = uniform_causal(T)
        for layer, probs in enumerate(attention_probabilities(model, idx)):
            distance, entropy = row_stats(probs, pos, pos)
            for head in range(probs.shape[1]):
                rows.append({"length": T, "layer": layer, "head": head,
                             "distance": float(distance[:, head].mean()), "entropy": float(entropy[:, head].mean()),
                             "uniform_distance": u_dist, "uniform_entropy": u_ent})  # fmt: skip
    return rows


def checkpoint_reach(ckpt, multipliers: Sequence[int], extension: str | None = None, windows: int = 4) -> list[dict]:
    """``reach_rows`` of a causal-LM checkpoint on its validation split at multiples of
    its training length L, with a context-extension rule switched on past L."""
    from posenc.runs import open_run, run_data

    run, module = open_run(ckpt, "cpu", extension)
    L = run.train_len
    tokens = run_data(run.cfg, vocab_size=run.vocab_size).tokens("validation")
    base = {"scheme": run.label(extension), "seed": run.seed, "train_len": L}
    return [{**base, "multiple": r["length"] // L, **r}
            for r in reach_rows(module.model, tokens, [m * L for m in multipliers], windows)]


def summary(rows: Sequence[dict]) -> "object":
    """Mean over heads, layers and seeds per (scheme, length): a DataFrame with the
    mean distance and entropy, their sd over seeds, and the uniform reference."""
    import pandas as pd

    df = pd.DataFrame(list(rows))
    per_seed = df.groupby(["scheme", "length", "multiple", "seed"], as_index=False)[
        ["distance", "entropy", "uniform_distance", "uniform_entropy"]].mean()
    out = per_seed.groupby(["scheme", "length", "multiple"], as_index=False).agg(
        distance=("distance", "mean"), distance_sd=("distance", "std"), entropy=("entropy", "mean"),
        entropy_sd=("entropy", "std"), uniform_distance=("uniform_distance", "first"),
        uniform_entropy=("uniform_entropy", "first"), seeds=("seed", "nunique"))
    return out.fillna({"distance_sd": 0.0, "entropy_sd": 0.0})

