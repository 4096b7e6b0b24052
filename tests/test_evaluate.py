"""Fast tests of ``posenc.evaluate``, one assertion per value a line exists for.

Written to kill mutants (``python -m tests.mutation``): the token choice (``span_length``,
``windows``, ``resolve_stride``) against lists worked out by hand from the module
docstring; ``score`` / ``evaluate_model`` against a hand computation on a stand-in model
whose logits are a closed formula of (token, position); the results files, read back;
``log_to_mlflow`` against a recording stand-in client and once against a real sqlite store;
``evaluate_checkpoint`` with its collaborators replaced by recorders (every argument it
passes on), and once end to end on a run trained two steps. The per-token reference of the
sliding window on a real model is in test_references.py, the study-level checks
(training's validation loss, the extension rules, the CLI) in test_extrapolation.py.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import mlflow
import numpy as np
import pytest
import torch

from posenc import evaluate as ev
from posenc import runs
from posenc.files import portable_path
from posenc.runs import Resolved

from .conftest import FAST

V = 5  # the stand-in model's vocabulary


# ------------------------------------------------------------------ stand-in model
class Toy(torch.nn.Module):
    """logits[v] = 2·[v == x] + [v == (x + pos) mod V]: a closed formula of the input token
    and its position, so the NLL of every target can be computed by hand (``nll_by_hand``)
    and depends on where in its window the target sits."""

    def __init__(self, reject=(), fail=False):
        super().__init__()
        self.reject, self.fail = set(reject), fail
        self.checked, self.shapes = [], []

    def check_length(self, T):
        self.checked.append(T)
        if T in self.reject:
            raise ValueError(f"table of {min(self.reject) - 1} < T={T}")

    def forward(self, x, pos):
        assert not self.training and not torch.is_grad_enabled()
        assert torch.equal(pos, torch.arange(x.shape[1])) and x.dtype == torch.int64
        if self.fail:
            raise RuntimeError("forward failed")
        self.shapes.append(tuple(x.shape))
        v = torch.arange(V)
        return 2.0 * (x[..., None] == v) + 1.0 * (((x + pos) % V)[..., None] == v)


def nll_by_hand(a: int, p: int, y: int) -> float:
    """-log softmax(logits)[y] for input token a at position p (pure Python)."""
    logits = [2.0 * (v == a) + 1.0 * (v == (a + p) % V) for v in range(V)]
    return math.log(sum(math.exp(x) for x in logits)) - logits[y]


def total_by_hand(t, T: int, stride: int, n: int) -> float:
    """Summed NLL of targets t[1 .. n] by the module docstring's rule: windows end at
    T, T + s, ... and finally n; target p is scored by the first window reaching it,
    at position p - 1 - start of that window (start = end - T)."""
    ends = [T]
    while ends[-1] < n:
        ends.append(min(ends[-1] + stride, n))
    total = 0.0
    for p in range(1, n + 1):
        start = next(e for e in ends if e >= p) - T
        total += nll_by_hand(int(t[p - 1]), p - 1 - start, int(t[p]))
    return total


def toks(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=size)


# ------------------------------------------------------------------ constants
def test_constants_are_the_documented_ones():
    """The values the README and the CLI document."""
    assert ev.METHODS == ("nonoverlapping", "sliding")
    assert ev.DEFAULT_MULTIPLIERS == (1, 2, 4, 8, 16)
    assert ev.DEFAULT_MAX_TOKENS == 65536
    assert ev.DEFAULT_TOKEN_BUDGET == 8192
    assert ev.STEP_TAG == ("extrapolation.step", "evaluation length in tokens (metric extrapolation/ppl_<method>)")
    assert ev.COLUMNS == (
        "scheme", "seed", "train_len", "eval_len", "method", "stride", "ppl", "nll", "n_tokens", "note",
        "extension", "corpus", "split", "run_id", "checkpoint",
    )  # fmt: skip


def test_settings_defaults_are_the_module_constants():
    """Settings() is the CLI's defaults: each equals the module constant it names."""
    s = ev.Settings()
    assert s.multipliers == ev.DEFAULT_MULTIPLIERS and s.methods == ev.METHODS
    assert s.max_tokens == ev.DEFAULT_MAX_TOKENS and s.token_budget == ev.DEFAULT_TOKEN_BUDGET
    assert (s.split, s.which, s.device) == ("validation", "last", "cpu")
    assert s.log_mlflow is True and s.progress is True
    assert s.lengths is None and s.stride is None and s.extension is None
    assert (s.data_dir, s.cache_dir, s.runs_dir, s.tracking_uri) == (None, None, None, None)
    assert s.extra == {} and ev.Settings().extra is not s.extra  # a fresh dict each


# ------------------------------------------------------------------ span_length
def test_span_length_tiles_the_lcm_under_the_limit():
    """N = floor(min(max_tokens, n_available - 1) / lcm) * lcm (module docstring), by hand."""
    assert ev.span_length(100, [4, 6], None) == 96  # lcm 12, limit 99
    assert ev.span_length(100, [6, 4], 50) == 48  # limit 50
    assert ev.span_length(100, [4, 6], 1000) == 96  # max_tokens past the split: the split's limit
    assert ev.span_length(1000, [4], 10) == 8
    assert ev.span_length(1000, (np.int64(3), np.int64(5)), np.int64(31)) == 30  # lcm 15
    n = ev.span_length(1000, [4], 10)
    assert type(n) is int
    # n_available - 1 is the limit: 13 tokens hold 12 targets, 12 tokens only 11
    assert ev.span_length(13, [12], None) == ev.span_length(13, [12], 1000) == 12
    for max_tokens in (None, 1000):
        with pytest.raises(ValueError, match="needs a multiple of 12 tokens"):
            ev.span_length(12, [12], max_tokens)
    assert ev.span_length(2, [1], None) == 1  # N = 1 is enough
    assert ev.span_length(10, [1, 2], None) == 8  # length 1 is allowed


def test_span_length_errors_say_what_to_change():
    """Each refusal names the cause and the fix (the messages the CLI shows)."""
    with pytest.raises(ValueError, match="^no evaluation lengths given$"):
        ev.span_length(100, [], None)
    with pytest.raises(
        ValueError, match=re.escape("evaluation lengths must be at least 1, got [0, 4]; fix --lengths / --multipliers")
    ):
        ev.span_length(100, [0, 4], None)
    with pytest.raises(ValueError, match=r"at least 1, got \[4, -2\]"):
        ev.span_length(100, [4, -2], None)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "cannot score the same tokens at lengths [12, 4]: that needs a multiple of 12 tokens, but "
            "max_tokens=5 and the split holds 100 tokens; raise max_tokens or evaluate shorter lengths"
        ),
    ):
        ev.span_length(100, [12, 4], 5)


# ------------------------------------------------------------------ windows
def test_one_passage_is_the_splits_first_span():
    for n_available, lengths, max_tokens in ((100, [4, 6], None), (100, [4, 6], 50), (13, [12], None)):
        assert ev.passage_starts(n_available, lengths, max_tokens) == (ev.span_length(n_available, lengths, max_tokens),
                                                                       [0])
        assert ev.passage_starts(n_available, lengths, max_tokens, 1, seed=5)[1] == [0]  # no draw


def test_passages_are_disjoint_slots_of_the_split_drawn_by_the_seed():
    """Three passages of a 1000-token split under max_tokens 200 at lengths 4 and 8: each 64
    scored tokens (the largest multiple of 8 within 200 / 3), starting on one of the split's
    999 // 64 = 15 slots of 64, distinct and ascending, each inside the split (start + 65
    tokens); the same seed gives the same ones, and over many seeds every slot is drawn, about
    equally often (3 of 15 a draw: 1/5 each)."""
    n, starts = ev.passage_starts(1000, [4, 8], 200, passages=3, seed=11)
    assert n == 64 and len(starts) == 3 and starts == sorted(set(starts))
    assert all(s % 64 == 0 and s + n + 1 <= 1000 for s in starts)
    assert ev.passage_starts(1000, [4, 8], 200, passages=3, seed=11) == (n, starts)
    counts = np.zeros(15)
    for seed in range(3000):
        counts[np.array(ev.passage_starts(1000, [4, 8], 200, passages=3, seed=seed)[1]) // 64] += 1
    assert counts.sum() == 9000 and counts.min() > 0
    np.testing.assert_allclose(counts / 3000, 0.2, atol=0.03)
    # without max_tokens the split bounds each passage: (1000 - 1) // 3 = 333 -> 328 at length 8
    assert ev.passage_starts(1000, [8], None, passages=3, seed=0)[0] == 328
    # two passages of a split that holds exactly two
    assert ev.passage_starts(17, [8], None, passages=2, seed=0) == (8, [0, 8])
    # and of one that holds two with tokens to spare, but not a third passage and its next token:
    # 24 tokens hold (24 - 1) // 8 = 2 slots of 8, so every seed draws both
    assert {tuple(ev.passage_starts(24, [8], None, passages=2, seed=seed)[1]) for seed in range(40)} == {(0, 8)}


def test_passages_need_a_seed_and_a_positive_count():
    with pytest.raises(ValueError, match="passages=2: the passages are drawn by a seed, and none was given"):
        ev.passage_starts(1000, [8], 200, passages=2)
    with pytest.raises(ValueError, match="passages=0: score at least one passage"):
        ev.passage_starts(1000, [8], 200, passages=0, seed=1)


def test_evaluate_model_over_passages_sums_each_passage_by_hand():
    """With passages, a row's NLL is the mean over every passage's tokens, each passage scored
    as a span of its own (its first window starting at the passage's start), by hand."""
    t = toks(400, seed=9)
    rows = ev.evaluate_model(Toy(), t, [4, 8], ("nonoverlapping", "sliding"), stride=3, max_tokens=96,
                             progress=False, passages=3, seed=4)
    n, starts = ev.passage_starts(400, [4, 8], 96, 3, 4)
    assert n == 32 and len(starts) == 3
    for r in rows:
        want = sum(total_by_hand(t[s : s + n + 1], r["eval_len"], r["stride"], n) for s in starts) / (3 * n)
        assert r["n_tokens"] == 3 * n and r["passages"] == " ".join(map(str, starts))
        assert r["nll"] == pytest.approx(want, rel=1e-6)
    other = ev.evaluate_model(Toy(), t, [4], ("nonoverlapping",), max_tokens=96, progress=False, passages=3, seed=5)
    assert other[0]["passages"] != rows[0]["passages"]  # another seed, other passages (these two seeds differ)


def test_windows_nonoverlapping_by_hand():
    """[i*T, i*T + T) for i = 0 .. N/T - 1, every token scored (first index 0)."""
    assert ev.windows(12, 4, "nonoverlapping") == [(0, 0), (4, 0), (8, 0)]
    assert ev.windows(12, 4, "nonoverlapping", 1) == [(0, 0), (4, 0), (8, 0)]  # the stride is ignored
    assert ev.windows(4, 4, "nonoverlapping") == [(0, 0)]  # one window exactly the span
    assert ev.windows(6, 1, "nonoverlapping") == [(i, 0) for i in range(6)]
    assert ev.windows(12, 4, "nonoverlapping") == ev.windows(12, 4, "sliding")  # sliding, stride None: T


def test_windows_sliding_by_hand():
    """The first window scores all T targets; each later one ends s further on (the last at N)
    and scores its last (new_end - end) targets: (start, first) = (end - T, T - step)."""
    assert ev.windows(12, 4, "sliding", 3) == [(0, 0), (3, 1), (6, 1), (8, 2)]  # ends 4, 7, 10, 12
    assert ev.windows(6, 4, "sliding", 1) == [(0, 0), (1, 3), (2, 3)]
    assert ev.windows(8, 4, "sliding", 4) == [(0, 0), (4, 0)]  # stride == T: non-overlapping
    assert ev.windows(10, 4, "sliding", 4) == [(0, 0), (4, 0), (6, 2)]  # a final partial step
    assert ev.windows(4, 4, "sliding", 2) == [(0, 0)]  # N == T: one window
    assert ev.windows(9, 3, "sliding", 2.0) == [(0, 0), (2, 1), (4, 1), (6, 1)]  # stride taken as int
    assert ev.windows(12, 4, "sliding") == [(0, 0), (4, 0), (8, 0)]


def test_windows_partition_the_scored_targets():
    """The scored targets s + j .. s + T - 1 of all windows are 0 .. N - 1, each once, in order."""
    for n, T, s in [(12, 4, 3), (30, 8, 5), (16, 16, 7), (9, 1, 1), (25, 6, 6), (25, 6, 1)]:
        for method, stride in (("sliding", s), ("nonoverlapping", None)):
            if method == "nonoverlapping" and n % T:
                continue
            scored = []
            for start, first in ev.windows(n, T, method, stride):
                assert 0 <= start and start + T <= n and 0 <= first < T
                scored += range(start + first, start + T)
            assert scored == list(range(n)), (n, T, s, method)


def test_windows_errors():
    """Each refusal of ``windows``, with its message."""
    with pytest.raises(ValueError, match=r"^window 5 is longer than the 4 scored tokens$"):
        ev.windows(4, 5, "nonoverlapping")
    with pytest.raises(ValueError, match=r"^window 5 is longer than the 4 scored tokens$"):
        ev.windows(4, 5, "sliding", 1)
    with pytest.raises(ValueError, match=r"^10 scored tokens do not tile into windows of 4$"):
        ev.windows(10, 4, "nonoverlapping")
    for bad in (0, -1, 5):
        with pytest.raises(
            ValueError, match=re.escape(f"stride={bad} must be in [1, window=4] (a larger stride skips tokens)")
        ):
            ev.windows(12, 4, "sliding", bad)
    with pytest.raises(
        ValueError, match=re.escape("unknown method 'bogus'; choose from ('nonoverlapping', 'sliding')")
    ):
        ev.windows(12, 4, "bogus")
    with pytest.raises(ValueError, match="unknown method 'Sliding'"):
        ev.windows(12, 4, "Sliding", 2)


# ------------------------------------------------------------------ resolve_stride
def test_resolve_stride():
    """None: T // 2 (at least 1); a stride is capped at the window; below 1 is refused."""
    assert [ev.resolve_stride(T, None) for T in (1, 2, 3, 8, 9)] == [1, 1, 1, 4, 4]
    assert type(ev.resolve_stride(9, None)) is int
    assert [ev.resolve_stride(8, s) for s in (1, 3, 8, 9, 20)] == [1, 3, 8, 8, 8]
    assert type(ev.resolve_stride(8, 3.0)) is int and ev.resolve_stride(8, 3.0) == 3
    for bad in (0, -2):
        with pytest.raises(ValueError, match=f"^stride={bad} must be positive$"):
            ev.resolve_stride(8, bad)


# ------------------------------------------------------------------ score
@pytest.mark.parametrize("T,stride,n", [(4, 3, 12), (4, 1, 10), (8, 8, 24), (6, 4, 25), (5, 2, 5)])
def test_score_sliding_equals_the_hand_computation(T, stride, n):
    """Summed NLL and count of ``score`` against the per-token rule computed by hand."""
    t = toks(n + 3)
    total, count = ev.score(Toy().eval(), t, T, "sliding", stride, n, progress=False)
    assert count == n
    assert total == pytest.approx(total_by_hand(t, T, stride, n), rel=1e-6)


def test_score_nonoverlapping_defaults_and_context_matter():
    """Default method non-overlapping over t[1 : len(t)], by hand; a sliding stride below T
    changes the total (the stand-in's NLL depends on the position), so the hand rule is
    discriminating."""
    t = toks(33)
    total, count = ev.score(Toy().eval(), t, 8)
    assert count == 32 and total == pytest.approx(total_by_hand(t, 8, 8, 32), rel=1e-6)
    sliding, _ = ev.score(Toy().eval(), t, 8, "sliding", 3, progress=False)
    assert sliding == pytest.approx(total_by_hand(t, 8, 3, 32), rel=1e-6)
    assert abs(sliding - total) > 0.1
    # the default is non-overlapping, not sliding with its stride None (= T): only the first
    # refuses a span that windows of T do not tile
    with pytest.raises(ValueError, match="^30 scored tokens do not tile into windows of 8$"):
        ev.score(Toy().eval(), toks(31), 8, progress=False)
    assert ev.score(Toy().eval(), toks(31), 8, "sliding", progress=False)[1] == 30


@pytest.mark.parametrize(
    "budget,batches",
    [(1, [1] * 6), (7, [1] * 6), (8, [1] * 6), (16, [2, 2, 2]), (25, [3, 3]), (40, [5, 1]), (8192, [6])],
)
def test_score_batches_under_the_token_budget(budget, batches):
    """batch = max(1, budget // T) windows per forward; the result does not depend on it."""
    t = toks(49, seed=2)
    model = Toy().eval()
    total, count = ev.score(model, t, 8, "nonoverlapping", None, 48, budget, progress=False)
    assert [b for b, _ in model.shapes] == batches and {T for _, T in model.shapes} == {8}
    assert count == 48 and total == pytest.approx(total_by_hand(t, 8, 8, 48), rel=1e-6)


# ------------------------------------------------------------------ evaluate_model
def test_evaluate_model_rows_by_hand():
    """Rows for sorted, de-duplicated lengths x methods over the same N = 16 tokens
    (max_tokens 20, lcm 8): nll = mean NLL by hand, ppl = exp(nll), stride = T
    (non-overlapping) or the given one (sliding), empty note."""
    t = toks(60, seed=3)
    model = Toy()
    rows = ev.evaluate_model(model, t, [8, 4, 8], ["nonoverlapping", "sliding"], stride=3, max_tokens=20,
                             progress=False)  # fmt: skip
    assert model.checked == [4, 8]
    assert [(r["eval_len"], r["method"], r["stride"]) for r in rows] == [
        (4, "nonoverlapping", 4),
        (4, "sliding", 3),
        (8, "nonoverlapping", 8),
        (8, "sliding", 3),
    ]
    for r in rows:
        assert list(r) == ["eval_len", "method", "stride", "ppl", "nll", "n_tokens", "note", "passages"]
        want = total_by_hand(t, r["eval_len"], r["stride"], 16) / 16
        assert r["n_tokens"] == 16 and r["note"] == "" and r["passages"] == "0"
        assert r["nll"] == pytest.approx(want, rel=1e-6)
        assert r["ppl"] == pytest.approx(math.exp(want), rel=1e-6)


def test_evaluate_model_default_methods_stride_and_max_tokens():
    """Defaults: non-overlapping only, max_tokens = DEFAULT_MAX_TOKENS (here the whole split:
    floor(59 / 8) * 8 = 56 tokens), on the CPU; max_tokens=None is the whole split too;
    a sliding stride of None is half the window."""
    t = toks(60, seed=4)
    (row,) = ev.evaluate_model(Toy(), t, [8], progress=False)
    assert (row["method"], row["stride"], row["n_tokens"]) == ("nonoverlapping", 8, 56)
    assert row["nll"] == pytest.approx(total_by_hand(t, 8, 8, 56) / 56, rel=1e-6)
    (row,) = ev.evaluate_model(Toy(), t, [8], ["sliding"], max_tokens=None, progress=False)
    assert (row["stride"], row["n_tokens"]) == (4, 56)
    assert row["nll"] == pytest.approx(total_by_hand(t, 8, 4, 56) / 56, rel=1e-6)
    (row,) = ev.evaluate_model(Toy(), t, [8], ["sliding"], stride=100, max_tokens=30, progress=False)
    assert (row["stride"], row["n_tokens"]) == (8, 24)  # capped at the window


def test_evaluate_model_passes_its_settings_to_score(monkeypatch):
    """Every argument reaches ``score`` (model, tokens, T, method, stride, N, budget,
    device, progress), the same N for every length and method."""
    calls = []
    real = ev.score

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(ev, "score", spy)
    t, model, device = toks(40), Toy(), torch.device("cpu")
    ev.evaluate_model(model, t, [4, 8], ("sliding", "nonoverlapping"), 3, 30, 17, device, False)
    assert [kw for _, kw in calls] == [{}] * 4
    want = [(4, "sliding", 3), (4, "nonoverlapping", 4), (8, "sliding", 3), (8, "nonoverlapping", 8)]
    assert [a[2:5] for a, _ in calls] == want
    for a, _ in calls:
        assert a[0] is model and a[1].base is t and np.array_equal(a[1], t[:25])  # the span: N + 1 tokens of t
        assert a[5:7] == (24, 17) and a[7] is device and a[8] is False


def test_evaluate_model_not_applicable_rows():
    """A length the model refuses (check_length raises ValueError) is not scored: ppl and nll
    NaN, n_tokens 0, note "not applicable: <reason>", for every method; the others are."""
    t = toks(40, seed=5)
    model = Toy(reject={8})
    rows = ev.evaluate_model(model, t, [8, 4], ("nonoverlapping", "sliding"), max_tokens=None, progress=False)
    assert {T for _, T in model.shapes} == {4}
    ok, na = rows[:2], rows[2:]
    for r in ok:
        assert r["eval_len"] == 4 and r["n_tokens"] == 32 and r["note"] == "" and math.isfinite(r["ppl"])
    assert [(r["eval_len"], r["method"], r["stride"]) for r in na] == [(8, "nonoverlapping", 8), (8, "sliding", 4)]
    for r in na:
        assert math.isnan(r["ppl"]) and math.isnan(r["nll"]) and r["n_tokens"] == 0
        assert r["note"] == "not applicable: table of 7 < T=8"


def test_evaluate_model_refuses_an_unknown_method_before_scoring():
    """A method outside METHODS is refused with its message before any length is checked or scored."""
    model = Toy()
    with pytest.raises(
        ValueError, match=re.escape("unknown method 'bogus'; choose from ('nonoverlapping', 'sliding')")
    ):
        ev.evaluate_model(model, toks(40), [4], ["nonoverlapping", "bogus"], progress=False)
    assert model.checked == [] and model.shapes == []


def test_evaluate_model_restores_the_training_flag():
    """The model is scored in eval mode and handed back in the mode it came in, also when
    scoring raises."""
    for mode in (True, False):
        model = Toy().train(mode)
        ev.evaluate_model(model, toks(20), [4], progress=False)
        assert model.training is mode
        failing = Toy(fail=True).train(mode)
        with pytest.raises(RuntimeError, match="forward failed"):
            ev.evaluate_model(failing, toks(20), [4], progress=False)
        assert failing.training is mode


def test_evaluate_model_logs_and_shows_progress(caplog, capsys):
    """One INFO line per scored row ("T=<T> <method>: ppl <x.xxx> over <n> tokens in <s>s")
    and a progress bar unless progress=False (the default shows it)."""
    t = toks(40, seed=6)
    with caplog.at_level(logging.INFO, logger="posenc.evaluate"):
        t0 = time.perf_counter()
        rows = ev.evaluate_model(Toy(reject={8}), t, [4, 8], ["sliding"], stride=2, max_tokens=32)
        elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert "sliding T=4" in err and "sliding T=8" not in err
    msgs = [r.getMessage() for r in caplog.records if r.name == "posenc.evaluate"]
    assert len(msgs) == 1
    m = re.fullmatch(r"T=4 sliding: ppl (\d+\.\d{3}) over 32 tokens in (\d+\.\d)s", msgs[0])
    assert m, msgs
    assert float(m.group(1)) == pytest.approx(rows[0]["ppl"], abs=5e-4)
    assert 0 <= float(m.group(2)) <= elapsed + 0.05
    ev.evaluate_model(Toy(), t, [4], progress=False)
    assert capsys.readouterr().err == ""
    ev.evaluate_model(Toy(), t, [4], progress=True)
    assert "nonoverlapping T=4" in capsys.readouterr().err


# ------------------------------------------------------------------ results files
def test_clean():
    """Non-finite floats become None (JSON null); everything else is kept as is."""
    for v in (math.nan, math.inf, -math.inf, np.float64("nan")):
        assert ev._clean(v) is None
    for v in (1.5, 0.0, -2.0, 3, 0, "x", "", None, np.float64(2.5)):
        assert ev._clean(v) == v and type(ev._clean(v)) is type(v)


ROWS = [
    {"eval_len": 8, "method": "sliding", "ppl": 3.25, "nll": math.log(3.25), "n_tokens": 16, "note": "",
     "zeta": 1, "alpha": "a", "scheme": "rope"},
    {"eval_len": 16, "method": "nonoverlapping", "ppl": math.nan, "nll": math.inf, "n_tokens": 0,
     "note": "not applicable: table", "alpha": None, "scheme": "learned", "seed": 0},
]  # fmt: skip


def test_write_results_columns_and_formats(tmp_path):
    """Columns = COLUMNS then the other keys sorted; NaN / inf / None -> empty CSV field and
    JSON null; CSV lines end in \\n; JSON records indented by 1."""
    files = ev.write_results(ROWS, tmp_path / "res")
    assert files == [tmp_path / "res.csv", tmp_path / "res.json"]
    cols = list(ev.COLUMNS) + ["alpha", "zeta"]
    text = files[0].read_bytes().decode()  # bytes: read_text would turn \r\n into \n
    assert "\r" not in text and text.endswith("\n")
    lines = text.split("\n")
    assert lines[0] == ",".join(cols) and lines[3:] == [""]
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert parsed[0] == {c: "" for c in cols} | {"eval_len": "8", "method": "sliding", "ppl": "3.25",
                                                 "nll": repr(math.log(3.25)), "n_tokens": "16", "zeta": "1",
                                                 "alpha": "a", "scheme": "rope"}  # fmt: skip
    assert parsed[1] == {c: "" for c in cols} | {
        "eval_len": "16",
        "method": "nonoverlapping",
        "n_tokens": "0",
        "note": "not applicable: table",
        "scheme": "learned",
        "seed": "0",
    }
    records = [{c: r.get(c) for c in cols} for r in ROWS]
    records[1].update(ppl=None, nll=None)
    assert files[1].read_text() == json.dumps(records, indent=1) + "\n"


def test_write_results_file_names(tmp_path):
    """out with .csv, .json or no suffix names the same two files; another suffix is kept."""
    for out in ("a", "a.csv", "a.json"):
        assert ev.write_results(ROWS, tmp_path / out) == [tmp_path / "a.csv", tmp_path / "a.json"]
    assert ev.write_results(ROWS, str(tmp_path / "b.v2")) == [tmp_path / "b.v2.csv", tmp_path / "b.v2.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "a.json", "b.v2.csv", "b.v2.json"]


def test_read_results_round_trip(tmp_path):
    """CSV and JSON read back alike: ppl numeric (NaN where not applicable), note "" where
    empty, a ``source`` column with the file, one index over all files."""
    csv_path, json_path = ev.write_results(ROWS, tmp_path / "r")
    for paths in ([csv_path], [json_path], [str(csv_path)]):
        df = ev.read_results(paths)
        assert list(df["eval_len"]) == [8, 16] and list(df["method"]) == ["sliding", "nonoverlapping"]
        assert df["ppl"].dtype == np.float64 and df["ppl"][0] == 3.25 and math.isnan(df["ppl"][1])
        assert list(df["note"]) == ["", "not applicable: table"]
        assert list(df["source"]) == [str(paths[0])] * 2
    both = ev.read_results([csv_path, json_path])
    assert list(both.index) == [0, 1, 2, 3]
    assert list(both["source"]) == [str(csv_path)] * 2 + [str(json_path)] * 2
    assert list(both["ppl"][:1]) == [3.25] and list(both["note"]) == ["", "not applicable: table"] * 2


def test_read_results_coerces_ppl_and_fills_a_missing_note(tmp_path):
    """A hand-written file: a non-numeric ppl is NaN, a file without a note column gets
    note "" for every row."""
    p = tmp_path / "hand.csv"
    p.write_text("eval_len,ppl\n8,2.5\n16,oops\n")
    df = ev.read_results([p])
    assert df["ppl"][0] == 2.5 and math.isnan(df["ppl"][1])
    assert list(df["note"]) == ["", ""]


def test_read_results_errors(tmp_path):
    """A missing file is named in the error; no files at all is refused."""
    with pytest.raises(FileNotFoundError, match=re.escape(f"no results file {tmp_path / 'missing.csv'}")):
        ev.read_results([tmp_path / "missing.csv"])
    with pytest.raises(ValueError, match="^no results files given$"):
        ev.read_results([])


# ------------------------------------------------------------------ log_to_mlflow
class FakeClient:
    """Records what ``log_to_mlflow`` asks of an MlflowClient; ``held`` is the run's history."""

    made: ClassVar[list] = []
    held: ClassVar[dict] = {}

    def __init__(self, tracking_uri):
        self.uri, self.calls = tracking_uri, []
        FakeClient.made.append(self)

    def get_metric_history(self, run_id, key):
        self.calls.append(("history", run_id, key))
        return [SimpleNamespace(step=s, value=v) for s, v in self.held.get(key, [])]

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.calls.append(("batch", run_id, metrics))

    def set_tag(self, run_id, key, value):
        self.calls.append(("tag", run_id, key, value))

    def log_artifact(self, run_id, local_path, artifact_path=None):
        self.calls.append(("artifact", run_id, local_path, artifact_path))


@pytest.fixture
def fake_mlflow(monkeypatch):
    monkeypatch.setattr(FakeClient, "made", [])
    monkeypatch.setattr(FakeClient, "held", {})
    monkeypatch.setattr(mlflow, "MlflowClient", FakeClient)
    return FakeClient


LOG_ROWS = [
    {"method": "sliding", "eval_len": 8, "ppl": 3.5},
    {"method": "nonoverlapping", "eval_len": np.int64(16), "ppl": 2},
    {"method": "nonoverlapping", "eval_len": 32, "ppl": math.nan},
    {"method": "sliding", "eval_len": 32, "ppl": None},
    {"method": "sliding", "eval_len": 64, "ppl": math.inf},
    {"method": "sliding", "eval_len": 128},
    {"method": "nonoverlapping", "eval_len": 4, "ppl": 5.0},
]


def test_log_to_mlflow_metrics_tags_and_artifacts(fake_mlflow, tmp_path):
    """Applicable rows only, as extrapolation/ppl_<method> at step = eval_len (float value,
    a millisecond timestamp of now); the STEP_TAG tag then the given tags (values str);
    the files under extrapolation/; the history read once per key."""
    t0 = int(time.time() * 1000)
    ev.log_to_mlflow(LOG_ROWS, "run1", "sqlite:///x.db", [tmp_path / "a.csv", tmp_path / "a.json"],
                     {"extrapolation.split": "test", "n": 3, "none": None})  # fmt: skip
    t1 = int(time.time() * 1000)
    (client,) = fake_mlflow.made
    assert client.uri == "sqlite:///x.db"
    hist = [c for c in client.calls if c[0] == "history"]
    assert sorted(hist) == [
        ("history", "run1", "extrapolation/ppl_nonoverlapping"),
        ("history", "run1", "extrapolation/ppl_sliding"),
    ]
    (batch,) = [c for c in client.calls if c[0] == "batch"]
    assert batch[1] == "run1"
    assert [(m.key, m.value, m.step) for m in batch[2]] == [
        ("extrapolation/ppl_sliding", 3.5, 8), ("extrapolation/ppl_nonoverlapping", 2.0, 16),
        ("extrapolation/ppl_nonoverlapping", 5.0, 4)]  # fmt: skip
    assert all(type(m.value) is float and type(m.step) is int and t0 <= m.timestamp <= t1 for m in batch[2])
    assert [c[1:] for c in client.calls if c[0] == "tag"] == [
        ("run1", *ev.STEP_TAG),
        ("run1", "extrapolation.split", "test"),
        ("run1", "n", "3"),
        ("run1", "none", "None"),
    ]
    assert [c[1:] for c in client.calls if c[0] == "artifact"] == [
        ("run1", str(tmp_path / "a.csv"), "extrapolation"),
        ("run1", str(tmp_path / "a.json"), "extrapolation"),
    ]


def test_log_to_mlflow_extension_suffix_and_held_points(fake_mlflow):
    """With an extension rule the key ends in _<rule>; points the run already holds (same
    step and value) are not logged again, other values at that step are; no tags given:
    only STEP_TAG; no files: no artifacts."""
    fake_mlflow.held = {"extrapolation/ppl_sliding_pi": [(8, 3.5)], "extrapolation/ppl_nonoverlapping_pi": [(16, 2.5)]}
    ev.log_to_mlflow(LOG_ROWS, "run2", "uri", extension="pi")
    (client,) = fake_mlflow.made
    assert sorted(c[2] for c in client.calls if c[0] == "history") == [
        "extrapolation/ppl_nonoverlapping_pi",
        "extrapolation/ppl_sliding_pi",
    ]
    (batch,) = [c for c in client.calls if c[0] == "batch"]
    assert [(m.key, m.value, m.step) for m in batch[2]] == [
        ("extrapolation/ppl_nonoverlapping_pi", 2.0, 16),
        ("extrapolation/ppl_nonoverlapping_pi", 5.0, 4),
    ]
    assert [c[1:] for c in client.calls if c[0] in ("tag", "artifact")] == [("run2", *ev.STEP_TAG)]
    fake_mlflow.made.clear()
    ev.log_to_mlflow(LOG_ROWS[:1], "run3", "uri", extension="")  # "" is no rule
    (batch,) = [c for c in fake_mlflow.made[0].calls if c[0] == "batch"]
    assert [m.key for m in batch[2]] == ["extrapolation/ppl_sliding"]


# ------------------------------------------------------------------ the stored run
def test_a_stored_run_is_read_by_name_from_the_record_or_the_old_hyper_parameters():
    """``runs.StoredRun``: what training stores (``runs.RECORD``; checkpoints from before the
    record kept it as Lightning's hyper-parameters), read by name: L, the scheme and its label
    with a rule, seed, corpus, run name, task (its name, and the object its config builds) and
    MLflow store; a composed config (a DictConfig) answers the same."""
    from omegaconf import OmegaConf

    from posenc.config import compose
    from posenc.tasks import Retrieval

    cfg = {"data": {"seq_len": 48, "corpus": {"name": "tinyshakespeare"}}, "encoding": {"name": "rope"}, "seed": 3,
           "run_name": "r", "task": {"_target_": "posenc.tasks.Retrieval", "name": "retrieval", "digits": 4},
           "logger": {"tracking_uri": "sqlite:///x.db"}}
    for state in ({runs.RECORD: {"cfg": cfg, "vocab_size": "260", "identity": {"a": 1}}},
                  {"hyper_parameters": {"cfg": cfg, "vocab_size": 260, "identity": {"a": 1}}}):
        run = runs.StoredRun.read(state, "x.ckpt")
        assert (run.train_len, run.scheme, run.label(), run.label("yarn"), run.seed, run.corpus, run.run_name,
                run.task_name, run.tracking_uri, run.vocab_size, run.identity) == (
            48, "rope", "rope", "rope+yarn", 3, "tinyshakespeare", "r", "retrieval", "sqlite:///x.db", 260, {"a": 1})
        assert isinstance(run.task, Retrieval) and run.task.digits == 4
    with pytest.raises(runs.ConfigError, match="x.ckpt holds no posenc run config"):
        runs.StoredRun.read({"state_dict": {}}, "x.ckpt")
    composed = compose(["task=lm", "data.seq_len=24", "encoding=alibi", "seed=5"])
    assert OmegaConf.is_config(composed)
    planned = runs.StoredRun(composed)
    assert (planned.train_len, planned.scheme, planned.seed, planned.task_name, planned.vocab_size) == (
        24, "alibi", 5, "lm", None)


# ------------------------------------------------------------------ evaluate_checkpoint (recorded)
CFG = {"data": {"seq_len": 4, "corpus": {"name": "corpusA"}}, "encoding": {"name": "schemeB"}, "seed": 7,
       "logger": {"tracking_uri": "uri-of-cfg"}}  # fmt: skip


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """evaluate_checkpoint's collaborators replaced by recorders; ``rec.res`` is what
    resolve_checkpoint returns, ``rec.cfg`` the stored config, ``rec.model`` the model."""
    rec = SimpleNamespace(
        calls={},
        cfg=json.loads(json.dumps(CFG)),
        model=Toy(),
        tokens=toks(70, seed=8),
        res=Resolved(tmp_path / "run" / "checkpoints" / "last.ckpt", None, None),
    )
    state = {"hyper_parameters": "hp"}

    def record(name, *args):
        rec.calls.setdefault(name, []).append(args)

    def resolve_checkpoint(ref, which, runs_dir, tracking_uri):
        record("resolve", ref, which, runs_dir, tracking_uri)
        return rec.res

    def load_state(path):
        record("load_state", path)
        return state

    def stored_run(st, path):
        record("stored_run", st, path)
        return {"cfg": rec.cfg, "vocab_size": V}

    def module_from_state(st, path, device, scheme_settings):
        record("module", st, path, device, scheme_settings)
        return SimpleNamespace(model=rec.model)

    def run_data(cfg, data_dir, cache_dir, vocab_size):
        record("run_data", cfg, data_dir, cache_dir, vocab_size)
        return SimpleNamespace(tokens=lambda split: record("split", split) or rec.tokens)

    real_evaluate_model = rec.evaluate_model = ev.evaluate_model

    def evaluate_model(model, tokens, lengths, methods, stride, max_tokens, token_budget, device, progress, passages,
                       seed):
        record("evaluate", model, tokens, lengths, methods, stride, max_tokens, token_budget, device, progress,
               passages, seed)
        return real_evaluate_model(model, tokens, lengths, methods, stride, max_tokens, token_budget, "cpu", False,
                                   passages, seed)

    def log_to_mlflow(rows, run_id, uri, files, tags, extension):
        record("log", rows, run_id, uri, files, tags, extension)

    for f in (resolve_checkpoint, run_data, evaluate_model, log_to_mlflow):
        monkeypatch.setattr(ev, f.__name__, f)
    for f in (load_state, stored_run, module_from_state):  # what ``runs.open_run`` calls
        monkeypatch.setattr(runs, f.__name__, f)
    monkeypatch.setattr(ev, "default_tracking_uri", lambda: "uri-default")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(tmp_path)
    rec.state = state
    return rec


def test_evaluate_checkpoint_defaults(recorded, caplog):
    """settings=None is Settings(): multipliers 1..16 x the stored seq_len, both methods,
    half-window stride, DEFAULT_MAX_TOKENS, DEFAULT_TOKEN_BUDGET, the validation split, the
    last checkpoint, on the CPU, with progress; no out: no files; a checkpoint without a
    known MLflow run is not logged, with a warning naming it."""
    with caplog.at_level(logging.WARNING, logger="posenc.evaluate"):
        rows, files = ev.evaluate_checkpoint("ref")
    c, res = recorded.calls, recorded.res
    assert c["resolve"] == [("ref", "last", None, None)]
    assert c["load_state"] == [(res.path,)] and c["stored_run"] == [(recorded.state, res.path)]
    assert c["module"] == [(recorded.state, res.path, "cpu", None)]
    assert c["run_data"] == [(recorded.cfg, None, None, V)] and c["split"] == [("validation",)]
    ((model, tokens, *args),) = c["evaluate"]
    assert model is recorded.model and tokens is recorded.tokens
    assert args == [[4, 8, 16, 32, 64], ("nonoverlapping", "sliding"), None, 65536, 8192, "cpu", True, 1, 7]
    assert [(r["eval_len"], r["method"], r["stride"]) for r in rows] == [
        (T, m, T if m == "nonoverlapping" else T // 2) for T in (4, 8, 16, 32, 64) for m in ev.METHODS
    ]
    assert all(r["n_tokens"] == 64 for r in rows)
    assert files == [] and "log" not in c
    assert [r.getMessage() for r in caplog.records if r.name == "posenc.evaluate"] == [
        f"no MLflow run known for {res.path}: results not logged to MLflow"
    ]


def test_evaluate_checkpoint_settings_reach_every_step(recorded, tmp_path):
    """Every setting reaches the step that uses it; rows are the run's fields (scheme with
    +rule, extension, seed, train_len, corpus, split, run id, checkpoint relative to the
    working directory, extra) followed by evaluate_model's row; files written with out;
    logged with the split, the scored-token count and the stride as tags."""
    recorded.res = Resolved(recorded.res.path, "rid", "uri-of-res")
    s = ev.Settings(
        multipliers=(1, 3),
        methods=("sliding",),
        stride=3,
        max_tokens=40,
        split="test",
        token_budget=9,
        device="cpu",
        which="best",
        data_dir="dd",
        cache_dir="cd",
        runs_dir="rd",
        tracking_uri="uri-of-settings",
        progress=False,
        extension="pi",
        extra={"study": "x", "seed": 99},
    )
    rows, files = ev.evaluate_checkpoint("ref2", s, out=str(tmp_path / "out" / "res.csv"))
    c, res = recorded.calls, recorded.res
    assert c["resolve"] == [("ref2", "best", "rd", "uri-of-settings")]
    assert c["module"] == [(recorded.state, res.path, "cpu", {"scaling": "pi", "original_len": 4})]
    assert c["run_data"] == [(recorded.cfg, "dd", "cd", V)] and c["split"] == [("test",)]
    ((_, _, *args),) = c["evaluate"]
    assert args == [[4, 12], ("sliding",), 3, 40, 9, "cpu", False, 1, 7]
    own = recorded.evaluate_model(Toy(), recorded.tokens, [4, 12], ("sliding",), 3, 40, progress=False)
    base = {"scheme": "schemeB+pi", "extension": "pi", "seed": 99, "train_len": 4, "corpus": "corpusA",
            "split": "test", "run_id": "rid", "checkpoint": str(Path("run", "checkpoints", "last.ckpt")),
            "study": "x"}  # fmt: skip
    assert rows == [{**base, **r} for r in own] and list(rows[0]) == list(base) + list(own[0])
    assert files == [tmp_path / "out" / "res.csv", tmp_path / "out" / "res.json"]
    assert json.loads(files[1].read_text())[0]["scheme"] == "schemeB+pi"
    assert c["log"] == [(rows, "rid", "uri-of-settings", files,
                         {"extrapolation.split": "test", "extrapolation.n_tokens": 36, "extrapolation.passages": 1,
                          "extrapolation.stride": 3},
                         "pi")]  # fmt: skip


def test_evaluate_checkpoint_explicit_lengths_no_extension_no_logging(recorded):
    """Explicit lengths replace multipliers x train length; no rule: plain scheme name,
    extension "", no scheme settings; log_mlflow=False: nothing logged, even with a run."""
    recorded.res = Resolved(recorded.res.path, "rid", None)
    s = ev.Settings(lengths=(6, 2, 6), methods=("nonoverlapping",), max_tokens=None, log_mlflow=False,
                    progress=False)  # fmt: skip
    rows, files = ev.evaluate_checkpoint("ref", s)
    assert recorded.calls["module"][0][3] is None
    assert recorded.calls["evaluate"][0][2] == [6, 2, 6]
    assert [(r["eval_len"], r["n_tokens"]) for r in rows] == [(2, 66), (6, 66)]
    assert {(r["scheme"], r["extension"], r["seed"]) for r in rows} == {("schemeB", "", 7)}
    assert files == [] and "log" not in recorded.calls


@pytest.mark.parametrize("given,stored,logger,want", [
    ("uri-s", "uri-r", {"tracking_uri": "uri-c"}, "uri-s"),
    (None, "uri-r", {"tracking_uri": "uri-c"}, "uri-r"),
    (None, None, {"tracking_uri": "uri-c"}, "uri-c"),
    (None, None, {}, "uri-default"),
    (None, None, None, "uri-default"),
])  # fmt: skip
def test_evaluate_checkpoint_tracking_uri_order(recorded, given, stored, logger, want):
    """Where results are logged: Settings.tracking_uri, else the resolved run's, else the
    stored config's logger, else default_tracking_uri()."""
    recorded.res = Resolved(recorded.res.path, "rid", stored)
    recorded.cfg["logger"] = logger
    s = ev.Settings(multipliers=(1,), methods=("nonoverlapping",), tracking_uri=given, progress=False)
    ev.evaluate_checkpoint("ref", s)
    assert recorded.calls["log"][0][2] == want


def test_evaluate_checkpoint_token_count_tag(recorded):
    """extrapolation.n_tokens is the count of the first scored row (rows not applicable
    count 0 and are skipped), 0 when no row was scored."""
    recorded.res = Resolved(recorded.res.path, "rid", None)
    recorded.model = Toy(reject={4})
    s = ev.Settings(multipliers=(1, 2), methods=("nonoverlapping",), max_tokens=40, progress=False)
    ev.evaluate_checkpoint("ref", s)
    assert recorded.calls["log"][0][4] == {"extrapolation.split": "validation", "extrapolation.n_tokens": 40,
                                           "extrapolation.passages": 1, "extrapolation.stride": "half window"}
    recorded.model = Toy(reject={4, 8})
    ev.evaluate_checkpoint("ref", s)
    assert recorded.calls["log"][1][4]["extrapolation.n_tokens"] == 0


@pytest.mark.parametrize("device,cuda,want", [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"),
                                              ("cuda:1", False, "cuda:1")])  # fmt: skip
def test_evaluate_checkpoint_device(recorded, monkeypatch, device, cuda, want):
    """device "auto" is cuda when available, else cpu; any other device is taken as given."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    s = ev.Settings(multipliers=(1,), methods=("nonoverlapping",), device=device, log_mlflow=False, progress=False)
    ev.evaluate_checkpoint("ref", s)
    assert recorded.calls["module"][0][2] == want and recorded.calls["evaluate"][0][-4] == want


# ------------------------------------------------------------------ a real run
TRAIN_LEN = 16


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_root, cache_dir):
    """A tiny RoPE run trained 2 steps (seq_len 16) with its own sqlite MLflow store."""
    from posenc.config import compose

    from posenc.train import train

    root = tmp_path_factory.mktemp("evaluate")
    base = [f"paths.root={root}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}"]
    more = ["trainer.max_steps=2", "trainer.val_check_interval=2", "trainer.limit_val_batches=1",
            f"data.seq_len={TRAIN_LEN}", "log_checkpoint=false"]  # fmt: skip
    cfg = compose(base + FAST + more)
    train(cfg)
    (run_dir,) = (root / "outputs" / "runs").iterdir()
    run_id = json.loads((run_dir / "run.json").read_text())["mlflow_run_id"]
    uri = f"sqlite:///{root}/mlflow.db"
    experiment_id = mlflow.MlflowClient(uri).get_run(run_id).info.experiment_id
    return SimpleNamespace(root=root, run_dir=run_dir, uri=uri, experiment_id=experiment_id)


@pytest.fixture
def real_store(trained, tmp_path, monkeypatch):
    """A new, empty MLflow run in the trained run's store, and a copy of the run folder
    whose run.json names it (each test sees only what it logged itself); MLflow's own
    default store points into tmp_path, so a run logged without a URI leaves the project alone."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/default-mlruns")
    client = mlflow.MlflowClient(trained.uri)
    run_id = client.create_run(trained.experiment_id).info.run_id
    run_dir = Path(shutil.copytree(trained.run_dir, tmp_path / "run"))
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**meta, "mlflow_run_id": run_id}))
    return SimpleNamespace(client=client, run_id=run_id, run_dir=run_dir, uri=trained.uri)


def test_evaluate_checkpoint_of_a_trained_run(real_store, tmp_path):
    """End to end on a real run folder: the run's fields in every row, the lengths from the
    multipliers, the files, and the MLflow metrics and tags on the run's own store."""
    s = ev.Settings(multipliers=(1, 2), max_tokens=64, device="auto", progress=False, extra={"note2": 1})
    rows, files = ev.evaluate_checkpoint(real_store.run_dir, s, out=str(tmp_path / "ev"))
    ckpt = (real_store.run_dir / "checkpoints" / "last.ckpt").resolve()
    assert [(r["eval_len"], r["method"], r["stride"], r["n_tokens"]) for r in rows] == [
        (16, "nonoverlapping", 16, 64),
        (16, "sliding", 8, 64),
        (32, "nonoverlapping", 32, 64),
        (32, "sliding", 16, 64),
    ]
    for r in rows:
        assert (r["scheme"], r["extension"], r["seed"], r["train_len"], r["corpus"], r["split"]) == (
            "rope",
            "",
            0,
            TRAIN_LEN,
            "tinyshakespeare",
            "validation",
        )
        assert (r["run_id"], r["checkpoint"], r["note2"], r["note"]) == (real_store.run_id, portable_path(ckpt), 1, "")
        assert 1 < r["ppl"] < 1000 and r["nll"] == pytest.approx(math.log(r["ppl"]))
    assert files == [tmp_path / "ev.csv", tmp_path / "ev.json"] and all(f.is_file() for f in files)
    client, run_id = real_store.client, real_store.run_id
    tags = client.get_run(run_id).data.tags
    assert tags["extrapolation.split"] == "validation" and tags["extrapolation.n_tokens"] == "64"
    assert tags["extrapolation.stride"] == "half window" and tags[ev.STEP_TAG[0]] == ev.STEP_TAG[1]
    for method in ev.METHODS:
        hist = client.get_metric_history(run_id, f"extrapolation/ppl_{method}")
        assert sorted((h.step, h.value) for h in hist) == sorted(
            (r["eval_len"], r["ppl"]) for r in rows if r["method"] == method
        )

    s = ev.Settings(lengths=[48, 16], methods=("nonoverlapping",), max_tokens=96, log_mlflow=False,
                    progress=False, extension="pi")  # fmt: skip
    rows, files = ev.evaluate_checkpoint(real_store.run_dir, s)
    assert [(r["eval_len"], r["n_tokens"], r["scheme"], r["extension"]) for r in rows] == [
        (16, 96, "rope+pi", "pi"),
        (48, 96, "rope+pi", "pi"),
    ]
    assert files == []


def test_a_studys_rows_at_lengths_are_the_checkpoints_nonoverlapping_rows(real_store, capfd):
    """``rows_at_lengths`` (a study's rows of one run): the non-overlapping windows alone at each
    multiple of the given L, on that split's passages, with the rule switched on and the label
    in place of the run's scheme, the same rows ``evaluate_checkpoint`` gives with those
    settings spelled out, and no progress bar."""
    got = ev.rows_at_lengths(str(real_store.run_dir), None, None, 8, "cpu", [2, 3], 96, "test", 2)
    s = ev.Settings(methods=("nonoverlapping",), lengths=[16, 24], max_tokens=96, split="test", passages=2,
                    progress=False, log_mlflow=False)
    want, _ = ev.evaluate_checkpoint(real_store.run_dir, s)
    assert [(r["eval_len"], r["method"], r["split"], r["scheme"], r["extension"]) for r in got] == [
        (16, "nonoverlapping", "test", "rope", ""), (24, "nonoverlapping", "test", "rope", "")]
    assert [r["ppl"] for r in got] == [r["ppl"] for r in want] and [r["train_len"] for r in got] == [TRAIN_LEN] * 2
    assert [r["n_tokens"] for r in got] == [r["n_tokens"] for r in want]
    one = ev.rows_at_lengths(str(real_store.run_dir), None, None, 8, "cpu", [2], 96, "test")
    assert one[0]["ppl"] != got[0]["ppl"]  # one passage, not two
    assert ev.rows_at_lengths(str(real_store.run_dir), None, None, 8, "cpu", [2], 48)[0]["split"] == "validation"
    assert capfd.readouterr().err == ""
    label = {"scheme": "rope+pi+ft2L", "extension": "pi@2x2"}
    fine = ev.rows_at_lengths(str(real_store.run_dir), "pi", label, 8, "cpu", [2, 4], None)
    assert [(r["eval_len"], r["scheme"], r["extension"], r["train_len"]) for r in fine] == [
        (16, "rope+pi+ft2L", "pi@2x2", 8), (32, "rope+pi+ft2L", "pi@2x2", 8)]
    s = ev.Settings(methods=("nonoverlapping",), lengths=[16, 32], max_tokens=None, extension="pi", progress=False,
                    log_mlflow=False)
    assert [r["ppl"] for r in fine] == [r["ppl"] for r in ev.evaluate_checkpoint(real_store.run_dir, s)[0]]


def test_log_to_mlflow_on_a_real_store(real_store, tmp_path):
    """On a real sqlite store: metric keys, values and steps, NaN / None rows left out,
    logging the same rows twice keeps one point per length, tags as str, artifacts under
    extrapolation/."""
    client, run_id = real_store.client, real_store.run_id
    f = tmp_path / "r.csv"
    f.write_text("x\n")
    rows = [{"method": "sliding", "eval_len": 16, "ppl": 4.5}, {"method": "sliding", "eval_len": 32, "ppl": None},
            {"method": "nonoverlapping", "eval_len": 16, "ppl": math.nan}]  # fmt: skip
    for _ in range(2):
        ev.log_to_mlflow(rows, run_id, real_store.uri, [f], {"k": 3}, extension="ntk")
    data = client.get_run(run_id).data
    assert data.metrics == {"extrapolation/ppl_sliding_ntk": 4.5}
    assert [(h.step, h.value) for h in client.get_metric_history(run_id, "extrapolation/ppl_sliding_ntk")] == [
        (16, 4.5)
    ]
    assert data.tags["k"] == "3" and data.tags[ev.STEP_TAG[0]] == ev.STEP_TAG[1]
    assert [a.path for a in client.list_artifacts(run_id, "extrapolation")] == ["extrapolation/r.csv"]
