"""Which of T5's distance buckets a run trained, and how much of a longer window falls in
the others.

T5's bias (``posenc.encodings.T5Bias``) is a learned table of one value per head and
bucket, initialised at zero; a bucket whose distances never occur in a training window
gets no gradient and keeps its zero. Trained at L with ``max_distance`` above L, the
buckets of the distances from about L up stay untrained, and past L the model adds a
zero where the trained far buckets hold (mostly negative) biases.

* ``reached``: the buckets that a causal window of L tokens reaches (distances 0 … L − 1,
  ``t5_relative_bucket``);
* ``zero_rows``: the buckets whose row of a trained table is exactly zero in every head;
* ``pair_share``: the share of a causal window's (query, key) pairs, T(T + 1) / 2 of
  them, whose distance falls in a set of buckets: Σ_d (T − d) [bucket(d) in the set].

Checked by hand in ``tests/test_buckets.py`` (a window of 4 tokens and a bucket set drawn
on paper) and against a brute count over every pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from posenc.encodings import T5Bias

#: the class whose tables this module reads (a scheme's ``_target_`` in conf/encoding names it)
SCHEME = T5Bias


def buckets(distances: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """The causal bucket of each distance (key position minus query position is −d)."""
    from posenc.encodings.position_bias import t5_relative_bucket

    return t5_relative_bucket(-distances, False, num_buckets, max_distance)


def reached(length: int, num_buckets: int, max_distance: int) -> list[int]:
    """The buckets the distances of a causal window of ``length`` tokens fall in."""
    return sorted(set(buckets(torch.arange(length), num_buckets, max_distance).tolist()))


def pair_share(length: int, within: Iterable[int], num_buckets: int, max_distance: int) -> float:
    """The share of a causal window's (query, key) pairs whose bucket is in ``within``."""
    d = torch.arange(length)
    hit = torch.isin(buckets(d, num_buckets, max_distance), torch.tensor(sorted(set(within)), dtype=torch.long))
    return float(((length - d) * hit).sum() / (length * (length + 1) / 2))


def zero_rows(state_dict: Mapping[str, torch.Tensor]) -> list[int]:
    """The buckets whose row of the checkpoint's T5 table is exactly zero in every head (the
    table every layer shares, ``model.scheme.table.weight``)."""
    table = state_dict["model.scheme.table.weight"]  # (buckets, heads)
    return (table.abs().amax(dim=1) == 0).nonzero().flatten().tolist()


def mean_bias(state_dict: Mapping[str, torch.Tensor]) -> list[float]:
    """Each bucket's bias averaged over the heads."""
    return state_dict["model.scheme.table.weight"].float().mean(dim=1).tolist()


def summary(config: Mapping, states: Mapping[int, Mapping[str, torch.Tensor]], train_len: int,
            multipliers: Iterable[int]) -> dict:
    """One T5 scheme's buckets: its settings, the buckets a window of L reaches and those it
    does not, the zero rows of each seed's trained table, whether those are exactly the
    unreached ones in every seed, each bucket's bias (mean over heads and seeds), and the
    share of a window's pairs in unreached buckets at every multiple of L."""
    nb, md = int(config["num_buckets"]), int(config["max_distance"])
    hit = reached(train_len, nb, md)
    missed = [b for b in range(nb) if b not in hit]
    zeros = {int(seed): zero_rows(sd) for seed, sd in states.items()}
    biases = [mean_bias(sd) for sd in states.values()]
    return {"num_buckets": nb, "max_distance": md, "train_len": train_len, "reached": hit, "unreached": missed,
            "zero_rows": zeros, "untrained_are_unreached": all(z == missed for z in zeros.values()),
            "bias": [sum(col) / len(col) for col in zip(*biases)],
            "share_unreached": {int(m): pair_share(m * train_len, missed, nb, md) for m in multipliers}}


def markdown(table: Mapping[str, Mapping]) -> str:
    """One row per T5 scheme: buckets and max_distance, the buckets a window of L reaches,
    those exactly zero after training in every seed, and the share of pairs in them per length."""
    mults = sorted({int(m) for e in table.values() for m in e["share_unreached"]})
    label = lambda m: "L" if m == 1 else f"{m}L"  # noqa: E731
    head = ["scheme", "buckets", "max_distance", "reached at L", "zero after training (every seed)",
            *[f"pairs unreached at {label(m)}" for m in mults]]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]

    def spans(bs: list[int]) -> str:
        return "none" if not bs else f"{bs[0]}–{bs[-1]}" if bs == list(range(bs[0], bs[-1] + 1)) else ", ".join(map(str, bs))

    for s, e in table.items():
        zeros = sorted(set.intersection(*[set(z) for z in e["zero_rows"].values()])) if e["zero_rows"] else []
        shares = [f"{100 * e['share_unreached'][m if m in e['share_unreached'] else str(m)]:.0f}%" for m in mults]
        lines.append(f"| `{s}` | {e['num_buckets']} | {e['max_distance']} | {spans(e['reached'])} | {spans(zeros)} | "
                     + " | ".join(shares) + " |")
    return "\n".join(lines) + "\n"
