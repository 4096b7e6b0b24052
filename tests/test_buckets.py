"""Which of T5's buckets a training window reaches and how much of a longer window falls in the
others (``analysis.buckets``), by hand and against a brute count over every pair; and the stage
that reads trained tables (``pipelines.buckets``)."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from analysis import buckets


def test_reached_by_hand():
    """A causal window of 4 tokens holds distances 0..3; with 32 buckets the first 16 are exact,
    so it reaches buckets 0..3. With 16 buckets up to 16, every distance from 15 on shares the
    last bucket, which a window of 64 reaches."""
    assert buckets.reached(4, 32, 128) == [0, 1, 2, 3]
    assert buckets.reached(64, 16, 16) == list(range(16))
    assert buckets.reached(64, 32, 128)[-1] < 31  # the far buckets of max_distance 128 stay out of reach


def test_pair_share_by_hand_and_against_a_brute_count():
    """In a causal window of T = 4 there are 10 (query, key) pairs, one at distance 3: a set
    holding distance 3's bucket alone holds 1/10 of them. Against counting every pair of a
    window of 300 for T5's default buckets."""
    assert buckets.pair_share(4, [3], 32, 128) == pytest.approx(0.1)
    assert buckets.pair_share(4, [], 32, 128) == 0.0
    far = [b for b in range(32) if b not in buckets.reached(64, 32, 128)]
    T = 300
    b = buckets.buckets(torch.arange(T), 32, 128).tolist()
    hits = sum(1 for i, j in itertools.combinations_with_replacement(range(T), 2) if b[j - i] in far)
    assert buckets.pair_share(T, far, 32, 128) == pytest.approx(hits / (T * (T + 1) / 2))


def _state(table: torch.Tensor) -> dict:
    return {"model.scheme.table.weight": table}


def test_summary_finds_the_zero_rows_and_whether_they_are_the_unreached_ones():
    """A table trained at L = 4 with 8 buckets up to 6 (4 exact): rows of the distances a window
    of 4 reaches are non-zero, the others exactly zero in both seeds."""
    reached = buckets.reached(4, 8, 6)
    table = torch.zeros(8, 2)
    table[reached] = torch.tensor([-0.5, 0.25])
    s = buckets.summary({"num_buckets": 8, "max_distance": 6}, {0: _state(table), 1: _state(table.clone())}, 4,
                        [1, 4])
    assert s["reached"] == reached and s["unreached"] == [b for b in range(8) if b not in reached]
    assert s["zero_rows"] == {0: s["unreached"], 1: s["unreached"]} and s["untrained_are_unreached"]
    assert s["share_unreached"][1] == 0.0 and s["share_unreached"][4] > 0
    assert s["bias"][reached[0]] == pytest.approx(-0.125) and s["bias"][s["unreached"][0]] == 0.0
    table[s["unreached"][0], 0] = 1e-3  # one head moved: that row is no longer zero
    assert not buckets.summary({"num_buckets": 8, "max_distance": 6}, {0: _state(table)}, 4, [1])[
        "untrained_are_unreached"]
    md = buckets.markdown({"t5": s})
    assert "| `t5` | 8 | 6 | 0–3 |" in md and md.splitlines()[0].endswith("pairs unreached at 4L |")


def test_the_stage_reads_the_t5_schemes_of_a_study(tmp_path, monkeypatch, capsys):
    """``pipelines.buckets`` on a study of two schemes: only T5's bias (by its class) is read,
    from the last checkpoint of each causal-LM run recorded in its results file."""
    from pipelines import buckets as stage

    runs = {}
    for scheme in ("t5_bias", "alibi"):
        recs = []
        for seed in (0, 1):
            folder = tmp_path / "runs" / scheme / f"lm-s{seed}"
            (folder / "checkpoints").mkdir(parents=True)
            table = torch.zeros(32, 4)
            table[: len(buckets.reached(8, 32, 128))] = 0.1
            torch.save({"state_dict": _state(table)}, folder / "checkpoints" / "last.ckpt")
            recs.append({"scheme": scheme, "task": "lm", "seed": seed, "run_dir": str(folder)})
        runs[scheme] = tmp_path / f"{scheme}.json"
        runs[scheme].write_text(json.dumps({"scheme": scheme, "runs": recs}))
    monkeypatch.chdir(tmp_path)
    assert stage.main([str(p) for p in runs.values()] + ["--train-len", "8", "--multipliers", "1", "2",
                                                          "--json", "b.json", "--md", "b.md"]) == 0
    out = json.loads((tmp_path / "b.json").read_text())
    assert list(out) == ["t5_bias"] and out["t5_bias"]["untrained_are_unreached"]
    assert "`t5_bias`" in (tmp_path / "b.md").read_text()
