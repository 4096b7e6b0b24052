"""The retrieval task (posenc.retrieval): its windows, its grid and its statistics.

The windows are checked on a small synthetic vocabulary whose strings are known;
the scorer against two models with known scores: one that copies what followed
the previous occurrence of its input token (it must score 100% at every length
and depth) and one that guesses a digit (it must score chance). The Wilson
interval is checked against scipy's."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import binomtest

from posenc import retrieval as rt
from posenc.errors import DataError

SPECIALS = ["<|endoftext|>", "[PAD]", "[CLS]", "[MASK]"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz .,")
STRINGS = SPECIALS + LETTERS + list("0123456789") + ["x1", "§", "¤", "µ", "¶", "ß", "Þ", "ð", "ø", "æ"]
DIGIT_IDS = [STRINGS.index(d) for d in "0123456789"]
UNUSED = [STRINGS.index(s) for s in ["§", "¤", "µ", "¶", "ß", "Þ", "ð", "ø", "æ"]]


def corpus(n: int, seed: int) -> np.ndarray:
    """Letters with a digit now and then, and the token "x1" (a string holding a digit)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(len(SPECIALS), len(SPECIALS) + len(LETTERS), size=n)
    ids[rng.random(n) < 0.05] = DIGIT_IDS[3]
    ids[rng.random(n) < 0.02] = STRINGS.index("x1")
    return ids


SPLITS = [corpus(20_000, 0), corpus(5_000, 1), corpus(5_000, 2)]
SYM = rt.task_symbols(STRINGS, SPLITS, [0, 1, 2, 3], 8)
FILLER = rt.filler_stream(SPLITS[1], STRINGS)


def test_symbols_are_the_digits_and_markers_that_occur_nowhere():
    assert SYM.digits == tuple(DIGIT_IDS)
    markers = [SYM.query, *SYM.keys]
    assert markers == UNUSED[:9]  # the lowest unused ids that are no special and hold no digit
    assert not np.isin(markers, np.concatenate(SPLITS)).any()
    with pytest.raises(DataError, match="marker tokens"):
        rt.task_symbols(STRINGS, SPLITS, [0, 1, 2, 3], 9)
    with pytest.raises(DataError, match="single-token digits"):
        rt.task_symbols([s for s in STRINGS if s != "7"], SPLITS, [0, 1, 2, 3], 2)


def test_the_filler_holds_no_digit():
    assert len(FILLER) < len(SPLITS[1])
    assert not np.isin(FILLER, DIGIT_IDS + [STRINGS.index("x1")]).any()
    kept = np.asarray(SPLITS[1])[~np.isin(SPLITS[1], DIGIT_IDS + [STRINGS.index("x1")])]
    np.testing.assert_array_equal(FILLER, kept)  # in order, nothing else dropped


def parts(x: torch.Tensor, y: torch.Tensor, layout: rt.Layout):
    """Where the key, value, query and answer of a one-needle window are."""
    x = x.tolist()
    (q,) = [i for i, t in enumerate(x) if t == SYM.query]
    key = x[q + 1]
    needle = x.index(key)
    return needle, q, key, x[needle + 1 : needle + 1 + layout.digits]


@pytest.mark.parametrize("length", [24, 64, 257])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_a_trial_window(length, depth):
    layout = rt.Layout(length, 1, 5)
    x, y = rt.trial(FILLER, SYM, length, depth, 5, seed=3, i=7)
    assert x.shape == y.shape == (length,)
    needle, q, key, value = parts(x, y, layout)
    # the needle sits at its depth of the filler: 0 = first token, 1 = right before the query
    assert needle == round(depth * layout.filler)
    if depth == 1.0:
        assert needle + 1 + layout.digits == q
    # the key occurs twice (needle, query), the query marker once, the value's digits are distinct
    assert x.tolist().count(key) == 2 and x.tolist().count(SYM.query) == 1
    assert len(set(value)) == 5 and set(value) <= set(DIGIT_IDS)
    # digits occur only in the needle and the query: never in the filler
    digit_at = [i for i, t in enumerate(x.tolist()) if t in DIGIT_IDS]
    assert digit_at == list(range(needle + 1, needle + 6)) + list(range(q + 2, length))
    # the scored targets are the answer: the value, predicted from the query key on
    scored = (y != rt.IGNORE).nonzero().flatten().tolist()
    assert scored == list(range(length - 5, length))
    assert y[scored].tolist() == value
    assert x[length - 5] == key and x[length - 4 :].tolist() == value[:4]


def test_trials_share_text_across_depths_and_are_fixed_by_seed_and_index():
    a, _ = rt.trial(FILLER, SYM, 64, 0.0, 5, seed=1, i=4)
    b, _ = rt.trial(FILLER, SYM, 64, 1.0, 5, seed=1, i=4)
    assert sorted(a.tolist()) == sorted(b.tolist())  # the same tokens, the needle moved
    again, _ = rt.trial(FILLER, SYM, 64, 0.0, 5, seed=1, i=4)
    assert torch.equal(a, again)
    assert not torch.equal(a, rt.trial(FILLER, SYM, 64, 0.0, 5, seed=1, i=5)[0])
    assert not torch.equal(a, rt.trial(FILLER, SYM, 64, 0.0, 5, seed=2, i=4)[0])


def test_training_examples_are_a_function_of_seed_and_id():
    layout = rt.Layout(64, 2, 4)
    one, two = rt.RetrievalExamples(FILLER, SYM, layout, 5), rt.RetrievalExamples(FILLER, SYM, layout, 5)
    for g in (0, 1, 4096, 10**6):
        assert all(torch.equal(p, q) for p, q in zip(one[g], two[g]))
    assert not torch.equal(one[0][0], one[1][0])
    assert not torch.equal(one[0][0], rt.RetrievalExamples(FILLER, SYM, layout, 6)[0][0])
    # two needles, two queries: 8 distinct digits, every one scored once
    x, y = one[3]
    assert (y != rt.IGNORE).sum() == 8 and len(set(y[y != rt.IGNORE].tolist())) == 8
    starts = torch.tensor([rt.RetrievalExamples(FILLER, SYM, layout, 5)[g][0].tolist().index(SYM.query)
                           for g in range(50)])
    assert (starts == layout.length + 1 - 2 * 5 - 1).all()  # the query block always ends the window


def test_layouts_that_cannot_be_built_are_refused():
    with pytest.raises(DataError, match="cannot hold"):
        rt.Layout(11, 1, 5)
    with pytest.raises(DataError, match="at most 10"):
        rt.Layout(64, 3, 4)
    with pytest.raises(DataError, match="at least one"):
        rt.Layout(64, 0, 4)
    assert rt.Layout(13, 1, 5).filler == 1


class Copier(torch.nn.Module):
    """Predicts, at each position, the token that followed the previous occurrence of
    the current token (an induction head, written out); with no previous
    occurrence, a fixed wrong digit."""

    vocab = len(STRINGS)

    def check_length(self, length: int) -> None:
        pass

    def forward(self, idx: torch.Tensor, last: int | None = None) -> torch.Tensor:
        B, T = idx.shape
        out = torch.zeros(B, T, self.vocab)
        for b in range(B):
            row = idx[b].tolist()
            seen: dict[int, int] = {}
            for t, tok in enumerate(row):
                guess = row[seen[tok] + 1] if tok in seen else DIGIT_IDS[0]
                out[b, t, guess] = 1.0
                seen[tok] = t
        return out if last is None else out[:, T - last :]


class Guesser(torch.nn.Module):
    """A uniformly random digit at every position (seeded)."""

    def __init__(self):
        super().__init__()
        self.gen = torch.Generator().manual_seed(0)

    def check_length(self, length: int) -> None:
        pass

    def forward(self, idx: torch.Tensor, last: int | None = None) -> torch.Tensor:
        idx = idx if last is None else idx[:, idx.shape[1] - last :]
        out = torch.zeros(*idx.shape, len(STRINGS))
        pick = torch.tensor(DIGIT_IDS)[torch.randint(10, idx.shape, generator=self.gen)]
        return out.scatter_(-1, pick[..., None], 1.0)


def test_a_model_that_copies_the_needle_scores_100_percent_everywhere():
    rows = rt.evaluate_grid(Copier(), FILLER, SYM, [24, 64, 200], digits=5, seed=0)
    assert len(rows) == 15
    for r in rows:
        assert r["exact_match"] == 1.0 and r["digit_acc"] == 1.0
        assert r["trials"] == 40  # the default count
        assert (r["exact_lo"], r["exact_hi"]) == pytest.approx(rt.wilson(40, 40))


def test_a_model_that_guesses_scores_chance():
    rows = rt.evaluate_grid(Guesser(), FILLER, SYM, [24, 64], digits=5, seed=0)
    digits = sum(r["digit_acc"] * r["trials"] * 5 for r in rows)
    n = sum(r["trials"] * 5 for r in rows)
    lo, hi = rt.wilson(round(digits), n, z=3.3)  # 99.9%
    assert lo < 0.1 < hi  # a tenth of the digits, as chance gives
    assert all(r["exact_match"] == 0.0 for r in rows)  # chance exact match is 1 / 30240


class HalfCopier(Copier):
    """Copies when the needle's key is one of the first four markers: right on about
    half the trials, so every cell needs more than the first trials."""

    def forward(self, idx, last=None):
        out = super().forward(idx, last)
        for b in range(idx.shape[0]):
            if idx[b, -5].item() not in SYM.keys[:4]:
                out[b] = out[b].roll(1, -1)
        return out


def test_a_cell_scores_its_trials_and_their_interval():
    """A cell scores exactly ``trials`` trials, the first ones of the fixed sequence, in
    batches of any size, and its interval is the Wilson interval of what they scored."""
    (r,) = rt.evaluate_grid(HalfCopier(), FILLER, SYM, [24], depths=[0.5], digits=5, seed=0, trials=60)
    assert r["trials"] == 60 and 0.3 < r["exact_match"] < 0.7
    right = sum(rt.trial(FILLER, SYM, 24, 0.5, 5, 0, i)[0][-5].item() in SYM.keys[:4] for i in range(60))
    assert r["exact_match"] == right / 60  # the half copier is right exactly when the key is one of four
    assert (r["exact_lo"], r["exact_hi"]) == pytest.approx(rt.wilson(right, 60))
    (small,) = rt.evaluate_grid(HalfCopier(), FILLER, SYM, [24], depths=[0.5], digits=5, seed=0, trials=60,
                                batch_tokens=24 * 7)
    assert small == r
    (first,) = rt.evaluate_grid(HalfCopier(), FILLER, SYM, [24], depths=[0.5], digits=5, seed=0, trials=20)
    assert first["exact_match"] == sum(rt.trial(FILLER, SYM, 24, 0.5, 5, 0, i)[0][-5].item() in SYM.keys[:4]
                                       for i in range(20)) / 20
    with pytest.raises(ValueError, match="at least one trial"):
        rt.evaluate_grid(HalfCopier(), FILLER, SYM, [24], trials=0)


def test_lengths_a_model_cannot_represent_are_not_applicable():
    class Short(Copier):
        def check_length(self, length):
            if length > 24:
                raise ValueError("longer than the table")

    rows = rt.evaluate_grid(Short(), FILLER, SYM, [24, 48], depths=[0.0], digits=5)
    assert rows[0]["exact_match"] == 1.0
    assert math.isnan(rows[1]["exact_match"]) and rows[1]["trials"] == 0
    assert "longer than the table" in rows[1]["note"]


@pytest.mark.parametrize("k,n", [(81, 263), (15, 148), (0, 20), (1, 29), (29, 29), (50, 100), (3, 1000)])
def test_wilson_interval_against_scipy(k, n):
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = rt.wilson(k, n)
    assert lo == pytest.approx(ref.low, abs=1e-6) and hi == pytest.approx(ref.high, abs=1e-6)


def test_a_retrieval_run_trains_is_scored_and_logs_its_grid(make_cfg, tmp_path):
    """task=retrieval end to end on the real corpus: the data module's windows, a short
    run, the grid CLI (pipelines.retrieval) and the MLflow metrics at step = length."""
    import mlflow
    from .helpers import datamodule

    from pipelines import retrieval as grid_cli
    from posenc.train import train

    cfg = make_cfg("task=retrieval", "encoding=alibi", "trainer.max_steps=30")
    dm = datamodule(cfg)
    dm.prepare_data()
    x, y = next(iter(dm.train_dataloader()))
    again = next(iter(dm.train_dataloader()))
    assert torch.equal(x, again[0]) and x.shape == (8, 32)
    assert ((y != rt.IGNORE).sum(-1) == 5).all()  # the answer digits alone are scored
    val = [b[0] for b in dm.val_dataloader()][:2]
    assert all(torch.equal(a, b) for a, b in zip(val, [b[0] for b in dm.val_dataloader()][:2]))
    run = tmp_path / "retrieval-run"
    metrics = train(cfg, out_dir=run)
    assert 0 <= metrics["val/acc"] <= 1 and metrics["global_step"] == 30
    assert grid_cli.main([str(run), "--multipliers", "1", "2"]) == 0
    rows = pd.read_csv(run / "retrieval.csv")
    assert len(rows) == 10 and set(rows["length"]) == {32, 64} and (rows["trials"] == 40).all()
    assert rows["needle_attention"].between(0, 1).all()
    run_id = rows["run_id"].iloc[0]
    client = mlflow.MlflowClient(cfg.logger.tracking_uri)
    hist = client.get_metric_history(run_id, "retrieval/exact_match")
    means = rows.groupby("length")["exact_match"].mean()
    assert sorted((m.step, round(m.value, 9)) for m in hist) == [(k, round(v, 9)) for k, v in means.items()]
    assert [a.path for a in client.list_artifacts(run_id, "retrieval")] == ["retrieval/retrieval.csv"]
    train(make_cfg("task=lm", "trainer.max_steps=2", "run_name=lm-run"), out_dir=tmp_path / "lm-run")
    with pytest.raises(SystemExit):  # a run of another task is refused
        grid_cli.main([str(tmp_path / "lm-run")])


@pytest.mark.slow
def test_a_study_stage_scores_its_retrieval_grids_cell_by_cell_as_one_process_would(tmp_path, data_root, cache_dir):
    """pipelines.study scores a retrieval run's grids (plain, a zero-shot rule, a
    fine-tuned run) one (length, depth) cell per job on its pool: the results file holds
    every cell once, in order, with the same values as the whole grid scored in one
    process, each grid is written beside its run, and the cells' seconds are recorded."""
    import json

    from pipelines import study
    from posenc.retrieval import score_cells

    common = (f"paths.root={tmp_path} paths.data_dir={data_root} paths.cache_dir={cache_dir} model=micro "
              "model.d_model=16 model.n_heads=2 trainer.enable_progress_bar=false trainer.enable_model_summary=false "
              "data.batch_size=4 trainer.max_steps=3 trainer.val_check_interval=3 trainer.limit_val_batches=1 "
              "log_checkpoint=false logger.experiment_name=study-retrieval")
    from .helpers import study_params

    out = tmp_path / "results" / "retrieval" / "rope.csv"
    params = study_params(tmp_path, retrieval={"overrides": "model.max_len=64", "evaluate": {
        "trials": 10, "attention_trials": 2, "split": "test", "extensions": "yarn pi@2x2"}})
    rc = study.main(["rope", "--params", params, "--tasks", "retrieval", "--workers", "2", "--runs-dir",
                     str(tmp_path / "runs"), "--results-dir", str(tmp_path / "results"),
                     "--extensions", "yarn", "ntk", "pi@2x2", "--common", common])
    assert rc == 0
    rows = pd.read_csv(out, keep_default_na=False)
    assert list(rows.groupby("scheme", sort=False).size().items()) == [
        ("rope", 10), ("rope+pi+ft2L", 10), ("rope+yarn", 10)]  # ntk is no retrieval rule here
    assert list(rows["extension"].unique()) == ["", "pi@2x2", "yarn"]
    for scheme, g in rows.groupby("scheme"):
        assert list(zip(g["length"], g["depth"])) == [(L, d) for L in (16, 32) for d in rt.DEPTHS]
        assert list(g["multiple"]) == [1] * 5 + [2] * 5
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == ["retrieval-pi-ft2L-s0", "retrieval-s0"]
    settings = {"trial_seed": 0, "trials": 10, "attention_trials": 2, "split": "test"}  # the test split's filler
    cells = [(L, d) for L in (16, 32) for d in rt.DEPTHS]
    validation = score_cells(str(runs / "retrieval-s0"), cells, {**settings, "split": "validation"})
    assert [r["needle_attention"] for r in validation] != pytest.approx(
        [r["needle_attention"] for r in score_cells(str(runs / "retrieval-s0"), cells, settings)])
    whole = {"rope": score_cells(str(runs / "retrieval-s0"), cells, settings),
             "rope+yarn": score_cells(str(runs / "retrieval-s0"), cells, settings, "yarn"),
             "rope+pi+ft2L": score_cells(str(runs / "retrieval-pi-ft2L-s0"), cells, settings, None, 16,
                                         {"scheme": "rope+pi+ft2L", "extension": "pi@2x2"})}
    for scheme, expected in whole.items():
        got = rows[rows["scheme"] == scheme]
        assert list(got["trials"]) == [r["trials"] for r in expected]
        assert list(got["exact_match"]) == pytest.approx([r["exact_match"] for r in expected])
        assert list(got["digit_acc"]) == pytest.approx([r["digit_acc"] for r in expected])
        assert list(got["needle_attention"]) == pytest.approx([r["needle_attention"] for r in expected])
    beside = pd.read_csv(runs / "retrieval-s0" / "retrieval-yarn.csv")
    assert len(beside) == 10 and set(beside["scheme"]) == {"rope+yarn"}
    assert len(pd.read_csv(runs / "retrieval-pi-ft2L-s0" / "retrieval.csv")) == 10
    (record,) = json.loads((tmp_path / "results" / "runs" / "rope.json").read_text())["runs"]
    assert record["task"] == "retrieval" and record["eval_s"] > 0 and "rows" not in record


@pytest.mark.parametrize("setting,match", [("data.seq_len=8", "task=retrieval with .*a window of 8 tokens cannot hold"),
                                           ("task.digits=11", "task.digits=11 must be .*at most 10"),
                                           ("task.needles=0", "task.needles=0 must be .*at least 1")])
def test_a_window_that_cannot_be_built_is_refused_before_anything_is_written(make_cfg, setting, match):
    from posenc.errors import ConfigError
    from posenc.config import check_config

    with pytest.raises(ConfigError, match=match):
        check_config(make_cfg("task=retrieval", setting))
    check_config(make_cfg("task=retrieval", "data.seq_len=13"))  # 1 needle of 5 digits, its query and 1 filler token


def _summary_inputs(tmp_path):
    """Hand-made study files for the retrieval summary: grids (40 trials a cell), run
    records with criterion steps, attention reach and extrapolation rows.

    - none: 3 seeds, all reached the criterion; exact match 0.5 at L at every depth, and
      at 2L 0.2 + 0.1 * seed at every depth but depth 1 (+0.1 there);
    - alibi: seeds 0 and 1 reached it (at 900 and 1100 steps), seed 2 did not (the cap,
      4000): 1.0 at L, at 2L 0.9 and 0.7; seed 2 scores 0.3 and 0.1 and is left out;
    - learned: no seed reached it: 0.6, 0.5, 0.4 at L, no 2L (a table of L rows);
    - xpos: no retrieval run (a header alone)."""
    from analysis.reach import COLUMNS, uniform_causal

    def grid(scheme, seed, score):  # score(multiple, depth) -> exact match, or None: not applicable
        return [{"scheme": scheme, "extension": "", "seed": seed, "train_len": 8, "run_id": f"r{seed}", "multiple": m,
                 "length": 8 * m, "depth": d, "trials": 40 if score(m, d) is not None else 0,
                 "exact_match": score(m, d) if score(m, d) is not None else math.nan, "exact_lo": 0.1,
                 "exact_hi": 0.9, "digit_acc": 0.5 + 0.1 * seed, "needle_attention": 0.25 * m,
                 "note": ""} for m in (1, 2) for d in rt.DEPTHS]

    grids = {
        "none": [r for s in (0, 1, 2) for r in grid("none", s, lambda m, d, s=s: 0.5 if m == 1 else
                                                     0.2 + 0.1 * s + 0.1 * (d == 1.0))],
        "alibi": [r for s, (at1, at2) in enumerate([(1.0, 0.9), (1.0, 0.7), (0.3, 0.1)])
                  for r in grid("alibi", s, lambda m, d, a=at1, b=at2: a if m == 1 else b)],
        "learned": [r for s in (0, 1, 2) for r in grid("learned", s, lambda m, d, s=s: 0.6 - 0.1 * s if m == 1 else None)],
        "xpos": [],
    }
    steps = {"none": [2600, 2400, 2800], "alibi": [900, 1100, None], "learned": [None, None, None], "xpos": []}
    files = {k: [] for k in ("res", "runs", "reach", "ex")}
    for scheme, rows in grids.items():
        files["res"].append(rt.write_rows(rows, tmp_path / "ret" / f"{scheme}.csv"))
        runs = [{"scheme": scheme, "task": "retrieval", "seed": s, "global_step": v or 4000,
                 **({"criterion_step": v} if v else {})} for s, v in enumerate(steps[scheme])]
        runs += [{"scheme": scheme, "task": "lm", "seed": 0, "global_step": 500}]
        files["runs"].append(tmp_path / "runs" / f"{scheme}.json")
        files["runs"][-1].parent.mkdir(exist_ok=True)
        files["runs"][-1].write_text(json.dumps({"scheme": scheme, "runs": runs}))
        reach_rows = [{"scheme": scheme, "seed": s, "train_len": 8, "multiple": m, "length": 8 * m, "layer": lay,
                       "head": h, "distance": 1.0 + s + lay + h, "entropy": 0.5 * m, "uniform_distance": (8 * m - 1) / 4,
                       "uniform_entropy": uniform_causal(8 * m)[1]}
                      for s in (0, 1) for m in (1, 2) for lay in (0, 1) for h in (0, 1)]
        files["reach"].append(rt.write_rows(reach_rows, tmp_path / "reach" / f"{scheme}.csv", COLUMNS))
        ex = pd.DataFrame([{"scheme": scheme, "seed": 0, "train_len": 8, "eval_len": 8 * m, "method": "nonoverlapping",
                            "ppl": 2.0 * m} for m in (1, 2)])
        files["ex"].append(tmp_path / "ex" / f"{scheme}.csv")
        files["ex"][-1].parent.mkdir(exist_ok=True)
        ex.to_csv(files["ex"][-1], index=False)
    return files


def test_the_retrieval_summary_keeps_the_runs_that_reached_the_criterion_and_tests_across_seeds(tmp_path):
    """pipelines.retrieval_summary on hand-made files (``_summary_inputs``): a run's exact
    match at a length is the mean over depths; a scheme's is the mean and sample sd over
    the seeds that reached the criterion, or over all seeds, marked, when none did; the
    interval pools the trials of those runs; every length is one family of tests against
    NoPE across seeds (Welch in points, Holm); the steps table gives each seed's steps or the
    cap and each scheme's place with its bootstrap interval."""
    from analysis.stats import compare, family, mean_sd
    from pipelines import retrieval_summary

    f = _summary_inputs(tmp_path)
    assert retrieval_summary.main([*map(str, f["res"]), "--runs", *map(str, f["runs"]), "--reach", *map(str, f["reach"]),
                                   "--extrapolation", *map(str, f["ex"]), "--out-dir", str(tmp_path / "fig"),
                                   "--md-dir", str(tmp_path), "--json", str(tmp_path / "summary.json"),
                                   "--tidy", str(tmp_path / "tidy.csv"), "--reach-tidy", str(tmp_path / "reach.csv"),
                                   "--reach-json", str(tmp_path / "reach.json"), "--criterion", "0.9"]) == 0
    t = json.loads((tmp_path / "summary.json").read_text())["schemes"]
    # how far each scheme attends, per multiple, as analysis.reach.summary takes it from the tidy rows
    import pandas as pd

    from analysis.reach import summary as reach_summary

    reach = json.loads((tmp_path / "reach.json").read_text())
    for r in reach_summary(pd.read_csv(tmp_path / "reach.csv").to_dict("records")).to_dict("records"):
        got = reach[r["scheme"]][str(int(r["multiple"]))]
        assert got["distance"] == pytest.approx(r["distance"]) and got["entropy"] == pytest.approx(r["entropy"])
        assert got["uniform_distance"] == pytest.approx(r["uniform_distance"]) and got["seeds"] == r["seeds"]
    assert list(t) == ["none", "learned", "alibi"]  # the schemes' drawing order; xpos has no run
    none2 = [0.2 + 0.02, 0.3 + 0.02, 0.4 + 0.02]  # a fifth of the depths gets +0.1
    assert t["none"]["lengths"]["2"]["values"] == pytest.approx(none2)
    assert t["none"]["lengths"]["1"]["mean"] == pytest.approx(0.5) and t["none"]["lengths"]["1"]["sd"] == 0
    assert t["alibi"]["reached"] == [0, 1] and not t["alibi"]["marked"]
    assert t["alibi"]["steps"] == {"0": 900, "1": 1100, "2": None} and t["alibi"]["cap"] == 4000
    a2 = t["alibi"]["lengths"]["2"]
    assert a2["values"] == pytest.approx([0.9, 0.7]) and a2["n"] == 2
    assert (a2["mean"], a2["sd"]) == pytest.approx(mean_sd([0.9, 0.7]))
    assert (a2["lo"], a2["hi"]) == pytest.approx(rt.wilson(round(0.9 * 200) + round(0.7 * 200), 400))
    assert a2["digit_acc"] == pytest.approx(0.55) and a2["needle_attention"] == pytest.approx(0.5)
    w = family({"alibi": compare([0.9, 0.7], none2, "points", 0.1)})["alibi"]  # alone at 2L: a family of one
    assert a2["vs"]["against"] == "none" and a2["vs"]["p"] == pytest.approx(w["p"])
    assert a2["vs"]["diff"] == pytest.approx(w["diff"]) and a2["vs"]["m"] == 1 and a2["vs"]["margin"] == 0.1
    assert t["learned"]["marked"] and t["learned"]["reached"] == []
    assert t["learned"]["lengths"]["1"]["values"] == pytest.approx([0.6, 0.5, 0.4])
    assert list(t["learned"]["lengths"]) == ["1"]  # no trials past L
    table = (tmp_path / "retrieval_table.md").read_text().splitlines()
    alibi = next(line for line in table if line.startswith("| `alibi`")).split(" | ")
    lo, hi = rt.wilson(320, 400)  # 0.9 and 0.7 of 200 trials each
    assert alibi[1:4] == ["100 ± 0", "80 ± 14", f"[99, 100], [{100 * lo:.0f}, {100 * hi:.0f}]"]
    assert alibi[6] == "2 of 3" and alibi[7].startswith(f"{100 * w['diff']:+.1f} pt (")
    learned = next(line for line in table if line.startswith("| `learned` †")).split(" | ")
    assert learned[1:3] == ["50 ± 10", "n/a"] and learned[6] == "0 of 3 (marked)"
    assert any(line.startswith("† no run of this scheme reached the criterion") for line in table)
    steps = (tmp_path / "retrieval_steps.md").read_text().splitlines()
    rows = [line for line in steps if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `alibi`", "| `none`", "| `learned`"]  # fastest first
    assert rows[0] == "| `alibi` | s0: 900, s1: 1100, s2: cap (4000) | 1000 ± 141 | 2 of 3 | 1 (1–1) |"
    assert rows[2] == "| `learned` | s0: cap (4000), s1: cap (4000), s2: cap (4000) | — | 0 of 3 | — |"
    ranks = json.loads((tmp_path / "summary.json").read_text())["ranks"]
    assert list(ranks) == ["alibi", "none"] and ranks["alibi"]["place"] == 1
    reach_table = (tmp_path / "reach_table.md").read_text()
    # distance: mean over seeds (0, 1), layers (0, 1), heads (0, 1) of 1 + s + l + h = 2.5
    assert "| `none` | 2.5 | 2.5 | 0.50 | 1.00 |" in reach_table and "| `xpos` | 2.5 |" in reach_table
    assert "| uniform causal | 1.8 | 3.8 |" in reach_table
    tidy = pd.read_csv(tmp_path / "tidy.csv")  # every row, the lengths a scheme cannot represent too
    assert len(tidy) == 90 and tidy["trials"].eq(0).sum() == 15 and set(tidy["scheme"]) == {"none", "learned", "alibi"}
    for name in ("grid", "curves", "reach", "steps"):
        assert (tmp_path / "fig" / f"{name}.png").stat().st_size > 0


def test_a_grid_row_without_its_run_record_is_refused(tmp_path):
    from analysis import retrieval as summary

    grid = pd.DataFrame([{"scheme": "rope+yarn", "seed": 1, "length": 8, "multiple": 1, "depth": 0.0, "trials": 40,
                          "exact_match": 1.0, "digit_acc": 1.0, "needle_attention": 0.5}])
    runs = summary.run_records([{"runs": [{"scheme": "rope", "task": "retrieval", "seed": 0, "global_step": 10}]}])
    with pytest.raises(ValueError, match="without the record of their retrieval run: rope\\+yarn"):
        summary.per_run(grid, runs)
    runs = summary.run_records([{"runs": [{"scheme": "rope", "task": "retrieval", "seed": 1, "global_step": 10,
                                           "criterion_step": 10}]}])
    (row,) = summary.per_run(grid, runs).to_dict("records")  # a rule's rows take their run's criterion
    assert row["reached"] and row["criterion_step"] == 10 and row["k"] == 40 and row["n"] == 40


@pytest.mark.parametrize("needles,digits", [(1, 5), (2, 4), (3, 2)])
def test_the_scored_suffix_holds_every_scored_target_and_starts_with_one(needles, digits):
    """``Layout.scored``, the suffix the model computes its top layer for in training
    (``LMModule`` with ``Transformer.forward(last=)``), holds every scored target of a
    window, and no shorter suffix does."""
    layout = rt.Layout(40, needles, digits)
    examples = rt.RetrievalExamples(FILLER, SYM, layout, 0)
    for g in range(20):
        _, y = examples[g]
        scored = (y != rt.IGNORE).nonzero().flatten()
        assert int(scored.min()) == 40 - layout.scored and int(scored.max()) == 39
        assert len(scored) == needles * digits


def test_validation_exact_match_counts_windows_whose_every_digit_is_right(make_cfg, tmp_path):
    """``val/exact`` (what the criterion stops on) is the share of validation windows whose
    every answer digit is the argmax: computed again here, window by window, from the saved
    weights with ``score_batch``, which the grid uses too."""
    from .helpers import datamodule

    from posenc.runs import load_module
    from posenc.train import train

    cfg = make_cfg("task=retrieval", "encoding=alibi", "trainer.max_steps=40", "model.d_model=32",
                   "optim.lr=3e-3", "trainer.limit_val_batches=3")
    metrics = train(cfg, out_dir=tmp_path / "run")
    model = load_module(tmp_path / "run" / "checkpoints" / "last.ckpt").model
    dm = datamodule(cfg)
    dm.prepare_data()
    exact = [e for x, y in list(dm.val_dataloader())[:3] for e in rt.score_batch(model, x, y, 5)[0].tolist()]
    assert len(exact) == 3 * 16 and 0 < metrics["val/acc"]
    assert metrics["val/exact"] == pytest.approx(sum(exact) / len(exact))


@pytest.mark.parametrize("value,stops_at", [(-0.5, 10), (1.0, None)])
def test_a_run_stops_at_the_first_validation_past_its_criterion_or_at_the_cap(make_cfg, tmp_path, value, stops_at):
    """``criterion``: Lightning's EarlyStopping on its threshold alone. A criterion every
    validation passes (exact match above -0.5) stops the run at the first validation and
    records that step; one no validation passes (above 1.0) leaves the run to its cap and
    records none."""
    import json

    from posenc.train import train

    cfg = make_cfg("task=retrieval", "encoding=alibi", "trainer.max_steps=30", "trainer.val_check_interval=10",
                   "criterion.metric=val/exact", f"criterion.value={value}")
    metrics = train(cfg, out_dir=tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["global_step"] == saved["global_step"] == (stops_at or 30)
    assert metrics.get("criterion_step") == saved.get("criterion_step") == stops_at


@pytest.mark.parametrize("settings,match", [
    (["criterion.metric=val/bleu", "criterion.value=0.9"], "criterion.metric=val/bleu is not validated by task=retrieval"),
    (["criterion.metric=val/exact", "criterion.value=high"], "criterion.value=high must be a number"),
    (["criterion.metric=val/exact", "criterion.value=0.9", "criterion.mode=up"], "criterion.mode=up must be max"),
])
def test_a_criterion_that_cannot_work_is_refused(make_cfg, settings, match):
    from posenc.config import check_config
    from posenc.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        check_config(make_cfg("task=retrieval", *settings))
    with pytest.raises(ConfigError, match="val/exact is not validated by task=lm; choose one of val/loss, val/ppl"):
        check_config(make_cfg("task=lm", "criterion.metric=val/exact", "criterion.value=0.9"))


# ---------------------------------------------------------------- windows, by hand
def test_a_hand_built_window_holds_each_part_where_the_layout_says():
    """``build`` on a numbered filler: needle n (its key, then its value) goes right before
    filler token ``starts[n]``, the query marker follows the filler, then the queries in
    ``order``. The input is the sequence but its last token; the target is -100 except at
    the positions whose next token is a queried value digit, where it holds that digit."""
    layout = rt.Layout(24, 2, 2)  # 2 needles of 2 digits: 13 fixed tokens, 12 filler
    assert (layout.fixed, layout.filler, layout.scored) == (13, 12, 5)
    filler = np.arange(100, 112)
    d, q = DIGIT_IDS, SYM.query
    values = np.array([[d[1], d[2]], [d[3], d[4]]])
    ka, kb = SYM.keys[0], SYM.keys[5]
    x, y = rt.build(filler, [2, 7], values, [ka, kb], [1, 0], SYM, layout)
    seq = [100, 101, ka, d[1], d[2], 102, 103, 104, 105, 106, kb, d[3], d[4], 107, 108, 109, 110, 111,
           q, kb, d[3], d[4], ka, d[1], d[2]]
    assert x.tolist() == seq[:-1] and x.dtype == y.dtype == torch.long  # class ids, as cross-entropy takes them
    want = [rt.IGNORE] * 24
    want[19], want[20], want[22], want[23] = d[3], d[4], d[1], d[2]  # the query key and first digit predict the next
    assert y.tolist() == want
    # needles at the very start and right before the query marker, queried in their own order
    x, y = rt.build(filler, [0, 12], values, [ka, kb], [0, 1], SYM, layout)
    seq = [ka, d[1], d[2], *range(100, 112), kb, d[3], d[4], q, ka, d[1], d[2], kb, d[3], d[4]]
    assert x.tolist() == seq[:-1]
    assert [t for t in y.tolist() if t != rt.IGNORE] == [d[1], d[2], d[3], d[4]]
    assert (y != rt.IGNORE).nonzero().flatten().tolist() == [19, 20, 22, 23]


def test_layout_sizes_by_hand():
    """fixed = 2 x needles x (1 + digits) + 1 (each needle twice: in the text and in the
    query block; the query marker), filler = length + 1 - fixed, scored = the query block
    but its first key. The limits are inclusive: 10 digits in all, no filler at all, one digit."""
    lay = rt.Layout(40, 2, 4)
    assert (lay.fixed, lay.filler, lay.scored) == (21, 20, 9)
    assert rt.Layout(12, 1, 5).filler == 0  # the needle and its query alone
    assert (rt.Layout(16, 1, 1).fixed, rt.Layout(16, 1, 1).filler) == (5, 12)
    assert rt.Layout(64, 2, 5).scored == 11 and rt.Layout(64, 5, 2).scored == 14
    with pytest.raises(DataError, match="at most 10"):
        rt.Layout(64, 1, 11)
    with pytest.raises(DataError, match="at least one"):
        rt.Layout(64, 1, 0)


def test_symbols_take_as_many_keys_as_asked_and_the_filler_is_int64():
    """With more unused tokens than needed, the markers are the lowest ones: the query
    marker, then ``n_keys`` keys and no more; the filler's ids are int64 whatever the
    corpus's array type (prepared corpora are uint16)."""
    sym = rt.task_symbols(STRINGS, SPLITS, [0, 1, 2, 3], 2)
    assert sym.query == UNUSED[0] and sym.keys == tuple(UNUSED[1:3])
    assert rt.task_symbols(STRINGS, SPLITS, [0, 1, 2, 3], 8) == SYM  # exactly as many unused tokens as needed
    filler = rt.filler_stream(SPLITS[1].astype(np.uint16), STRINGS)
    assert filler.dtype == np.int64
    np.testing.assert_array_equal(filler, FILLER)


def test_a_filler_just_long_enough_is_used_whole_and_one_token_more_gives_both_spans():
    """The filler span is drawn among every start that fits: a filler of exactly
    ``layout.filler`` tokens is one span, used whole and in order, in every window; with
    one token more both spans (from the first and from the second token) occur, and no
    other; one token less is refused."""
    layout = rt.Layout(20, 1, 5)  # 8 filler tokens
    exact = rt.RetrievalExamples(np.arange(100, 108), SYM, layout, 0)
    for g in range(30):
        x, _ = exact[g]
        assert x.shape == (20,) and [t for t in x.tolist() if t >= 100] == list(range(100, 108))
    longer = rt.RetrievalExamples(np.arange(100, 109), SYM, layout, 0)
    firsts = {[t for t in longer[g][0].tolist() if t >= 100][0] for g in range(60)}
    assert firsts == {100, 101}
    with pytest.raises(DataError, match="fewer than a window's 8"):
        rt.RetrievalExamples(np.arange(100, 107), SYM, layout, 0)


def test_a_needle_lands_uniformly_on_every_place_of_the_filler():
    """A training window's needle goes before any of the F filler tokens or after the
    last (F + 1 places, 0 .. F), each equally often: F = 2 here, so about a third of
    900 windows at each place."""
    layout = rt.Layout(14, 1, 5)
    assert layout.filler == 2
    ex = rt.RetrievalExamples(FILLER, SYM, layout, 0)
    places = [x.index(x[-5]) for x in (ex[g][0].tolist() for g in range(900))]  # where the queried key first is
    counts = [places.count(p) for p in range(3)]
    assert sum(counts) == 900 and all(240 < c < 360 for c in counts), counts


def test_two_needles_have_distinct_keys_in_text_order_and_every_query_order():
    """The needles of a window use different keys (a key names one value); they sit in
    ascending order in the text, and both query orders occur."""
    layout = rt.Layout(40, 2, 4)
    ex = rt.RetrievalExamples(FILLER, SYM, layout, 1)
    orders = set()
    for g in range(200):
        x = ex[g][0].tolist()
        keys = [t for t in x[: x.index(SYM.query)] if t in SYM.keys]
        assert len(keys) == 2 and keys[0] != keys[1]
        queried = [t for t in x[x.index(SYM.query) :] if t in SYM.keys]
        assert sorted(queried) == sorted(keys)
        orders.add(tuple(queried) == tuple(keys))
    assert orders == {True, False}


def test_the_default_seed_is_0_and_fixed_examples_are_the_first_windows():
    """``RetrievalExamples`` without a seed is seed 0; ``FixedExamples(base, n)`` holds
    n windows, window i being the base's window i."""
    layout = rt.Layout(32, 1, 5)
    base = rt.RetrievalExamples(FILLER, SYM, layout, 0)
    default = rt.RetrievalExamples(FILLER, SYM, layout)
    assert all(torch.equal(default[g][0], base[g][0]) for g in range(3))
    fixed = rt.FixedExamples(base, 5)
    assert len(fixed) == 5
    for i in range(5):
        assert all(torch.equal(a, b) for a, b in zip(fixed[i], base[i]))


def test_a_trial_of_three_digits():
    """A trial's value has ``digits`` digits, all scored, all distinct."""
    x, y = rt.trial(FILLER, SYM, 30, 0.5, 3, seed=0, i=2)
    scored = (y != rt.IGNORE).nonzero().flatten().tolist()
    assert scored == [27, 28, 29] and len(set(y[scored].tolist())) == 3
    assert x[26].item() == SYM.query and x[27].item() in SYM.keys and x.tolist().count(x[27].item()) == 2


# ---------------------------------------------------------------- scoring
def test_wilson_without_trials_and_at_the_ends():
    """No trials: the whole [0, 1]; all or none right: the interval ends exactly at 1 or 0
    and holds the share."""
    assert rt.wilson(0, 0) == (0.0, 1.0)
    for n in range(1, 120):
        assert 1 - 1e-12 < rt.wilson(n, n)[1] <= 1.0 and 0.0 <= rt.wilson(0, n)[0] < 1e-12
        lo, hi = rt.wilson(n // 3, n)
        assert 0.0 <= lo <= (n // 3) / n <= hi <= 1.0


class Fixed(torch.nn.Module):
    """Returns given logits for the answer positions and records what it was asked for."""

    def __init__(self, logits):
        super().__init__()
        self.logits, self.asked = logits, []

    def forward(self, idx, last=None):
        self.asked.append((tuple(idx.shape), last))
        return self.logits


def test_score_batch_by_hand():
    """Exact match and digits right of three windows of 3-digit answers, under teacher
    forcing: all three right; the middle one wrong; all wrong. The model is asked for the
    last ``digits`` positions alone."""
    V = 12
    y = torch.full((3, 8), rt.IGNORE)
    y[:, 5:] = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    guess = torch.tensor([[1, 2, 3], [4, 0, 6], [0, 0, 0]])
    model = Fixed(torch.nn.functional.one_hot(guess, V).float())
    exact, right = rt.score_batch(model, torch.zeros(3, 8, dtype=torch.long), y, 3)
    assert exact.tolist() == [True, False, False] and right.tolist() == [3, 2, 0]
    assert model.asked == [((3, 8), 3)]


def test_batch_tokens_follow_the_kind_of_attention():
    """Tokens per evaluation batch: 16384 for a position-only bias (ALiBi, T5), 1024 for a
    content bias (Shaw), 4096 without a bias (RoPE, NoPE) and for a stand-in model."""
    from posenc.config import build_model, compose

    got = {s: rt.batch_tokens_for(build_model(compose([f"encoding={s}", "model=micro", "task=lm"]), 64))
           for s in ("alibi", "t5_bias", "shaw", "rope", "none")}
    assert got == {"alibi": 16384, "t5_bias": 16384, "shaw": 1024, "rope": 4096, "none": 4096}
    assert rt.batch_tokens_for(Copier()) == 4096


class Counting(Copier):
    """The copier, recording the size of every batch it scores."""

    def __init__(self):
        super().__init__()
        self.batches, self.lasts = [], []

    def forward(self, idx, last=None):
        self.batches.append(idx.shape[0])
        self.lasts.append(last)
        return super().forward(idx, last)


def test_the_grid_rows_in_order_and_its_batches():
    """One row per (length, depth), length by length, each with every column; a batch
    holds batch_tokens // length windows (at least one), and by default the model's
    ``batch_tokens_for``; a cell may have a single trial."""
    m = Counting()
    rows = rt.evaluate_grid(m, FILLER, SYM, [24, 64], depths=[0.0, 1.0], digits=5, seed=0, trials=3)
    lo, hi = rt.wilson(3, 3)
    assert rows == [{"length": L, "depth": d, "trials": 3, "exact_match": 1.0, "exact_lo": lo, "exact_hi": hi,
                     "digit_acc": 1.0, "note": ""} for L in (24, 64) for d in (0.0, 1.0)]
    assert m.batches == [3, 3, 3, 3]  # 4096 // 64 = 64 windows fit
    m = Counting()
    rt.evaluate_grid(m, FILLER, SYM, [24], depths=[0.5], trials=10, batch_tokens=24 * 4)
    assert m.batches == [4, 4, 2] and m.lasts == [5, 5, 5]  # 5 answer digits by default
    m = Counting()
    rt.evaluate_grid(m, FILLER, SYM, [24], depths=[0.5], trials=3, batch_tokens=10)
    assert m.batches == [1, 1, 1]
    m = Counting()  # a model with a content bias: 1024 tokens a batch by default
    m.blocks = [SimpleNamespace(attn=SimpleNamespace(scheme=SimpleNamespace(has_bias=True, position_only_bias=False)))]
    rt.evaluate_grid(m, FILLER, SYM, [24], depths=[0.5], trials=50)
    assert m.batches == [42, 8]
    (one,) = rt.evaluate_grid(Copier(), FILLER, SYM, [24], depths=[0.5], trials=1)
    assert one["trials"] == 1 and one["exact_match"] == 1.0 and (one["exact_lo"], one["exact_hi"]) == rt.wilson(1, 1)
    # the trials are those of seed 0 unless told
    half = [rt.evaluate_grid(HalfCopier(), FILLER, SYM, [24], depths=[0.5], trials=60, **kw)[0]["exact_match"]
            for kw in ({}, {"seed": 0}, {"seed": 1})]
    assert half[0] == half[1] != half[2]


def test_a_length_not_applicable_is_a_row_of_its_own_and_the_grid_goes_on():
    """A length the model cannot represent, first in the list, gets one row per depth with
    no trials, NaN scores and the reason; the lengths after it are scored."""
    class Short(Copier):
        def check_length(self, length):
            if length > 24:
                raise ValueError("longer than the table")

    rows = rt.evaluate_grid(Short(), FILLER, SYM, [48, 24], depths=[0.0, 0.5], digits=5, trials=2)
    assert [(r["length"], r["depth"], r["trials"]) for r in rows] == [(48, 0.0, 0), (48, 0.5, 0), (24, 0.0, 2),
                                                                      (24, 0.5, 2)]
    na = rows[0]
    assert set(na) == {"length", "depth", "trials", "exact_match", "exact_lo", "exact_hi", "digit_acc", "note"}
    assert all(math.isnan(na[k]) for k in ("exact_match", "exact_lo", "exact_hi", "digit_acc"))
    assert na["note"] == "not applicable: longer than the table"
    assert rows[2]["exact_match"] == 1.0 and rows[2]["note"] == ""


def test_the_grid_shows_a_progress_bar_only_when_asked(capsys):
    """``progress=True`` draws a bar named "retrieval grid" (on stderr); by default nothing."""
    rt.evaluate_grid(Copier(), FILLER, SYM, [24], depths=[0.5], trials=2)
    assert capsys.readouterr().err == ""
    rt.evaluate_grid(Copier(), FILLER, SYM, [24], depths=[0.5], trials=2, progress=True)
    assert re.search(r"(^|\r)retrieval grid: ", capsys.readouterr().err)


def test_write_rows_writes_the_columns_in_order(tmp_path):
    """Rows as CSV with exactly the given columns, in order (keys outside them dropped),
    '\\n' line ends and no index; no rows give the header alone (the grid's columns by default)."""
    path = rt.write_rows([{"depth": 0.5, "length": 8, "note": "", "extra": 1}, {"length": 16, "depth": 1.0,
                                                                               "note": "x"}],
                         tmp_path / "a.csv", columns=("length", "depth", "note"))
    assert path == tmp_path / "a.csv"
    assert path.read_bytes() == b"length,depth,note\n8,0.5,\n16,1.0,x\n"
    assert rt.write_rows([], tmp_path / "b.csv").read_text() == ",".join(rt.GRID_COLUMNS) + "\n"


def test_the_task_on_a_prepared_corpus(make_cfg):
    """``Task`` on the default corpus: every token's string, the tokens of each split,
    digits that are the tokens "0" .. "9", markers found in no split and no special token,
    each split's filler (made once) and windows of the task's layout and seed."""
    from hydra.utils import instantiate

    from posenc.data import SPLITS as DATA_SPLITS
    from posenc.data import load_tokenizer

    dm = instantiate(make_cfg("task=retrieval").data)
    dm.prepare_data()
    prepared = dm.prepared
    task = rt.Task(prepared, digits=4, needles=2)
    tok = load_tokenizer(prepared.tokenizer_path)
    assert len(task.strings) == tok.get_vocab_size()
    assert all(tok.token_to_id(s) == i for i, s in enumerate(task.strings))
    assert set(task.tokens) == set(DATA_SPLITS)
    for s in DATA_SPLITS:
        np.testing.assert_array_equal(task.tokens[s], prepared.tokens(s))
    assert [task.strings[i] for i in task.sym.digits] == list("0123456789")
    markers = [task.sym.query, *task.sym.keys]
    assert len(markers) == 1 + rt.Task.N_KEYS == len(set(markers))
    assert not np.isin(markers, np.concatenate([np.asarray(t) for t in task.tokens.values()])).any()
    assert not set(markers) & set(prepared.meta["special_ids"].values())
    filler = task.filler("validation")
    assert filler is task.filler("validation")
    np.testing.assert_array_equal(filler, rt.filler_stream(prepared.tokens("validation"), task.strings))
    ex = task.examples("validation", 48, 3)
    assert ex.layout == rt.Layout(48, 2, 4) and ex.seed == 3 and ex.sym == task.sym and ex.filler is filler
    assert (task.digits, task.needles) == (4, 2)
    default = rt.Task(prepared)
    assert (default.digits, default.needles) == (5, 1)


# ---------------------------------------------------------------- the summary's statistics and tables
def test_run_records_keep_the_retrieval_runs_with_their_criterion_step():
    """One record per retrieval run (other tasks left out): scheme, seed and steps as
    ints, the criterion step, NaN when the cap came first (in a study where no run reached
    it too); no retrieval run at all gives the columns alone."""
    from analysis import retrieval as summary

    r = summary.run_records([
        {"runs": [{"scheme": "a", "task": "retrieval", "seed": "1", "global_step": "300", "criterion_step": 200},
                  {"scheme": "a", "task": "lm", "seed": 0, "global_step": 50}]},
        {"runs": [{"scheme": "b", "task": "retrieval", "seed": 0, "global_step": 4000}]}])
    assert list(r.columns) == ["scheme", "seed", "steps", "criterion_step"]
    (a, b) = r.to_dict("records")
    assert a == {"scheme": "a", "seed": 1, "steps": 300, "criterion_step": 200}
    assert (b["scheme"], b["seed"], b["steps"]) == ("b", 0, 4000) and math.isnan(b["criterion_step"])
    capped = summary.run_records([{"runs": [{"scheme": "b", "task": "retrieval", "seed": 0, "global_step": 9}]}])
    assert math.isnan(capped["criterion_step"].iloc[0])
    empty = summary.run_records([{"runs": [{"scheme": "a", "task": "mlm", "seed": 0, "global_step": 5}]}])
    assert len(empty) == 0 and list(empty.columns) == list(summary.RUN_COLUMNS)


def test_base_scheme_is_the_name_before_the_first_plus():
    from analysis.retrieval import base_scheme

    assert [base_scheme(s) for s in ("rope+pi+ft4L", "rope+yarn", "alibi")] == ["rope", "rope", "alibi"]


def _grid_rows(scheme, seed, cells, length=8):
    """Grid rows of one run: ``cells`` is [(multiple, depth, trials, exact_match)]."""
    return [{"scheme": scheme, "seed": seed, "length": length * m, "multiple": m, "depth": d, "trials": n,
             "exact_match": e, "digit_acc": 0.5, "needle_attention": 0.25} for m, d, n, e in cells]


def test_per_run_pools_cells_of_any_trial_count_and_sorts_its_rows():
    """A cell of a single trial counts; ``k`` is the count of successes (an int, rounded
    from exact match x trials); rows come sorted by scheme, seed and length and numbered
    from 0; a run recorded twice is refused rather than counted twice."""
    from analysis import retrieval as summary

    grids = pd.DataFrame(_grid_rows("b", 1, [(2, 0.0, 40, 0.7), (2, 1.0, 40, 0.3)])
                         + _grid_rows("b", 0, [(1, 0.0, 1, 1.0), (1, 1.0, 1, 0.0)])
                         + _grid_rows("a", 0, [(1, 0.5, 40, 0.7)]))
    runs = summary.run_records([{"runs": [{"scheme": s, "task": "retrieval", "seed": seed, "global_step": 100,
                                           "criterion_step": 100} for s, seed in (("a", 0), ("b", 0), ("b", 1))]}])
    out = summary.per_run(grids, runs)
    assert list(out.index) == [0, 1, 2]
    assert [(r["scheme"], r["seed"], r["length"]) for r in out.to_dict("records")] == [("a", 0, 8), ("b", 0, 8),
                                                                                      ("b", 1, 16)]
    assert out["k"].tolist() == [28, 1, 40] and out["n"].tolist() == [40, 2, 80]
    assert pd.api.types.is_integer_dtype(out["k"])
    assert out["exact_match"].tolist() == pytest.approx([0.7, 0.5, 0.5])
    twice = pd.concat([runs, runs.iloc[[0]]], ignore_index=True)
    with pytest.raises(pd.errors.MergeError):
        summary.per_run(grids, twice)


def _per_run_frame():
    """Per-run rows by hand: none (seeds 0, 1) at L only; alibi (seeds 0, 1) at L and 2L;
    rope: a single seed at L."""
    rows = [("none", 0, 1, 0.5), ("none", 1, 1, 0.7), ("alibi", 0, 1, 0.9), ("alibi", 0, 2, 0.6),
            ("alibi", 1, 1, 0.8), ("alibi", 1, 2, 0.4), ("rope", 3, 1, 1.0)]
    return pd.DataFrame([{"scheme": s, "seed": seed, "length": 8 * m, "multiple": m, "exact_match": e,
                          "k": round(40 * e), "n": 40, "digit_acc": 0.1 * (seed + 1), "needle_attention": 0.2 * m,
                          "steps": 1000, "criterion_step": 500.0, "reached": True} for s, seed, m, e in rows])


def test_summary_of_a_single_seed_and_what_is_tested_against_what():
    """``summary``: a scheme of a single seed has its length, sd 0 and an untested
    comparison; the reference scheme ("none" by default) is not tested against itself,
    and a length the reference lacks carries no test; every length is one family (Holm
    over its schemes); without a reference, nothing is tested; the cap given wins over the
    steps the runs trained."""
    from analysis import retrieval as summary
    from analysis.stats import compare, family

    t = summary.summary(_per_run_frame())
    one = t["rope"]["lengths"][1]
    vs = one.pop("vs")
    assert one == {"length": 8, "mean": 1.0, "sd": 0.0, "n": 1, "values": [1.0], "lo": rt.wilson(40, 40)[0],
                   "hi": rt.wilson(40, 40)[1], "digit_acc": pytest.approx(0.4), "needle_attention": pytest.approx(0.2)}
    assert vs["against"] == "none" and vs["verdict"] == "untested" and vs["diff"] == pytest.approx(0.4)
    assert t["rope"]["seeds"] == [3] and t["alibi"]["seeds"] == [0, 1]
    assert all("vs" not in c for c in t["none"]["lengths"].values())
    assert "vs" not in t["alibi"]["lengths"][2] and t["alibi"]["lengths"][2]["length"] == 16
    at_l = family({"alibi": compare([0.9, 0.8], [0.5, 0.7]), "rope": compare([1.0], [0.5, 0.7])})
    assert t["alibi"]["lengths"][1]["vs"]["p"] == pytest.approx(at_l["alibi"]["p"])
    assert t["alibi"]["lengths"][1]["vs"]["m"] == 1  # rope's one seed has no test: the family holds one
    plain = summary.summary(_per_run_frame(), against=None)
    assert not any("vs" in c for e in plain.values() for c in e["lengths"].values())
    # the cap: the one the runs were given, else the most steps a run of the scheme trained
    assert t["none"]["cap"] == 1000 and summary.summary(_per_run_frame(), cap=3000)["none"]["cap"] == 3000


def _entry(seeds, reached, lengths, marked=False):
    """A scheme's ``summary`` entry by hand: ``lengths`` {multiple: (mean, sd, lo, hi, digits[, vs])}, over
    the seeds that reached the criterion (all seeds when none did)."""
    n = len(reached or seeds)
    return {"seeds": seeds, "reached": reached, "marked": marked, "steps": {}, "cap": 4000,
            "lengths": {m: dict(zip(("length", "mean", "sd", "lo", "hi", "digit_acc"), (8 * m, *v[:5])), n=n,
                                **({"vs": v[5]} if len(v) > 5 else {})) for m, v in lengths.items()}}


def test_the_retrieval_table_by_hand():
    """``table_markdown`` of a summary written by hand: a column per length (L, 2L, 4L),
    the pooled interval and the digits at L and at the longest length, the seeds that
    reached the criterion, and the longest length against the reference with its cells
    (``analysis.stats.comparison_cells``: difference and interval, raw and Holm p, verdict);
    a scheme of one seed shows its value alone (no spread), its untested comparison the
    difference alone; a scheme without the longest length gets dashes; a marked scheme its
    dagger and the footnote."""
    from analysis.retrieval import table_markdown
    from analysis.stats import comparison_cells, compare, family

    fam = family({"alibi": compare([0.3, 0.45, 0.6], [0.15, 0.2, 0.25], "points", 0.1) | {"against": "none"},
                  "one": compare([0.1], [0.15, 0.2, 0.25], "points", 0.1) | {"against": "none"}})
    t = {
        "none": _entry([0, 1, 2], [0, 1, 2], {1: (1.0, 0.0, 0.953, 1.0, 1.0), 2: (0.6, 0.1, 0.5, 0.7, 0.8),
                                               4: (0.2, 0.05, 0.15, 0.26, 0.42)}),
        "alibi": _entry([0, 1, 2], [0, 2], {1: (0.9, 0.1, 0.85, 0.94, 0.97), 2: (0.8, 0.2, 0.7, 0.9, 0.9),
                                             4: (0.45, 0.15, 0.38, 0.52, 0.7, fam["alibi"])}),
        "learned": _entry([0, 1], [], {1: (0.5, 0.1, 0.4, 0.6, 0.6, fam["alibi"])}, marked=True),
        "one": _entry([0], [0], {1: (1.0, 0.0, 0.9, 1.0, 1.0), 2: (0.7, 0.0, 0.6, 0.8, 0.8),
                                 4: (0.1, 0.0, 0.03, 0.25, 0.3, fam["one"])}),
    }
    cells = lambda s: " | ".join(comparison_cells(fam[s]))  # noqa: E731
    assert table_markdown(t) == "\n".join([
        "| scheme | L | 2L | 4L | trials' 95% interval at L, 4L | digits at L | digits at 4L | seeds reached "
        "| 4L − `none`'s (95% CI) | p | Holm p | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        "| `none` | 100 ± 0 | 60 ± 10 | 20 ± 5 | [95, 100], [15, 26] | 100 | 42 | 3 of 3 | — | — | — | — |",
        f"| `alibi` | 90 ± 10 | 80 ± 20 | 45 ± 15 | [85, 94], [38, 52] | 97 | 70 | 2 of 3 | {cells('alibi')} |",
        "| `learned` † | 50 ± 10 | n/a | n/a | [40, 60], n/a | 60 | n/a | 0 of 2 (marked) | — | — | — | — |",
        f"| `one` | 100 | 70 | 10 | [90, 100], [3, 25] | 100 | 30 | 1 of 1 | {cells('one')} |",
        "",
        "† no run of this scheme reached the criterion by the cap: its numbers are over every run, and they mix "
        "learning speed with length.",
    ]) + "\n"
    assert cells("one") == "-10.0 pt | — | — | —"
    # no comparison and no marked scheme: neither the test's columns nor the footnote
    plain = {"none": _entry([0], [0], {1: (0.5, 0.0, 0.3, 0.7, 0.6), 2: (0.25, 0.0, 0.1, 0.4, 0.5)})}
    assert table_markdown(plain) == "\n".join([
        "| scheme | L | 2L | trials' 95% interval at L, 2L | digits at L | digits at 2L | seeds reached |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        "| `none` | 50 | 25 | [30, 70], [10, 40] | 60 | 50 | 1 of 1 |",
    ]) + "\n"


def test_the_steps_table_by_hand():
    """``steps_markdown``: fastest mean over the seeds that reached the criterion first
    (not the smallest spread), then the schemes none of whose seeds did, in the order
    given; one seed that reached it is shown alone; a rule's or a fine-tune's entry (a
    name with "+") is left out, as it shares its run's steps; each scheme's place with its
    bootstrap interval (``analysis.stats.rank_intervals``), a dash where no seed reached it."""
    from analysis.retrieval import step_ranks, steps_markdown

    def e(steps, cap=4000):
        return {"steps": steps, "reached": [s for s, v in steps.items() if v is not None], "cap": cap}

    t = {"none": e({0: 2600, 1: 2400, 2: 2800}), "alibi": e({0: 900, 1: 3000, 2: None}),
         "rope+yarn": e({0: 10}), "learned": e({0: None, 1: None}), "fire": e({0: 1200, 1: 1300}),
         "xpos": e({0: None}, cap=3000), "t5_bias": e({0: 700, 1: None})}
    r = step_ranks(t)
    assert list(r) == ["t5_bias", "fire", "alibi", "none"] and r["t5_bias"] == {"place": 1, "lo": 1, "hi": 1,
                                                                              "mean": 700.0}
    place = lambda s: f"{r[s]['place']} ({r[s]['lo']}–{r[s]['hi']})"  # noqa: E731
    assert steps_markdown(t, "exact match ≥ 90%") == "\n".join([
        "Steps to the criterion (exact match ≥ 90%), validated every so many steps; \"cap\": not reached by the cap. "
        "The place is by the mean (1: the fastest), with its 95% bootstrap interval over seeds.",
        "",
        "| scheme | steps per seed | mean ± sd (seeds that reached it) | reached | place (95% interval) |",
        "| --- | --- | ---: | ---: | ---: |",
        f"| `t5_bias` | s0: 700, s1: cap (4000) | 700 (one seed) | 1 of 2 | {place('t5_bias')} |",
        f"| `fire` | s0: 1200, s1: 1300 | 1250 ± 71 | 2 of 2 | {place('fire')} |",
        f"| `alibi` | s0: 900, s1: 3000, s2: cap (4000) | 1950 ± 1485 | 2 of 3 | {place('alibi')} |",
        f"| `none` | s0: 2600, s1: 2400, s2: 2800 | 2600 ± 200 | 3 of 3 | {place('none')} |",
        "| `learned` | s0: cap (4000), s1: cap (4000) | — | 0 of 2 | — |",
        "| `xpos` | s0: cap (3000) | — | 0 of 1 | — |",
    ]) + "\n"


def test_draw_at_given_depths_puts_each_needle_where_its_depth_says():
    """``draw`` with depths: needle n starts before filler token round(depth x filler), so
    depth 0 is the window's first token and depth 1 right before the query marker; in the
    built window, the key sits at that many filler tokens (plus the needles before it) from
    the start."""
    layout = rt.Layout(40, 2, 3)  # 2 needles of 3 digits: 17 fixed tokens, 24 filler
    F = layout.filler
    assert F == 24
    filler = np.arange(100, 100 + 3 * F)
    for depths, want in (([0.0, 1.0], [0, 24]), ([0.25, 0.5], [6, 12]), ([0.1, 0.9], [2, 22])):
        span, starts, values, keys, order = rt.draw(np.random.default_rng(0), filler, SYM, layout, depths)
        assert starts.tolist() == want and len(span) == F
        x, _ = rt.build(span, starts, values, keys, order, SYM, layout)
        seq = x.tolist()
        first = seq.index(keys[0])
        assert first == want[0]  # filler tokens before it, no needle before the first
        assert seq.index(keys[1]) == want[1] + 1 + layout.digits  # the first needle's key and digits come before


# ------------------------------------------------------------------ a trained run's cells
@pytest.fixture(scope="module")
def scored_run(tmp_path_factory, data_root, cache_dir):
    """A retrieval run (RoPE, 32-token windows, needles of 4 digits) trained 2 steps, with its own
    MLflow store."""
    from posenc.config import compose
    from posenc.train import train

    from .conftest import FAST

    root = tmp_path_factory.mktemp("scored")
    train(compose([f"paths.root={root}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}", *FAST,
                   "task=retrieval", "task.digits=4", "encoding=rope", "trainer.max_steps=2",
                   "trainer.val_check_interval=2",
                   "trainer.limit_val_batches=1", "log_checkpoint=false"]))
    (run_dir,) = (root / "outputs" / "runs").iterdir()
    return SimpleNamespace(path=run_dir, uri=f"sqlite:///{root}/mlflow.db",
                           run_id=json.loads((run_dir / "run.json").read_text())["mlflow_run_id"])


def test_a_runs_cells_score_as_the_grid_does_whichever_cells_share_the_call(scored_run, monkeypatch):
    """``score_cells`` on a trained run against the grid evaluated on the run's model and the
    split's filler directly (``evaluate_grid``, ``trial`` and ``needle_attention``): each cell's
    trials, exact match and digit accuracy (the grid asked for the run's digits, the trial seed,
    the trials and the device), the needle attention of its first trials (NaN where none are
    asked for), the run's labels and the multiple of L; a cell's row is the same scored alone
    or beside others, the validation split's filler is the default, a zero-shot rule on the
    lengths of another L labels its rows so, and ``extra`` replaces labels."""
    from posenc.runs import open_run, resolve_checkpoint, run_data

    run, module = open_run(resolve_checkpoint(scored_run.path, "last").path)
    assert run.task.digits == 4
    task = rt.Task(run_data(run.cfg, vocab_size=run.vocab_size).prepared, 4, 1)
    filler = task.filler("test")
    cells = [(64, 0.0), (32, 0.5), (32, 1.0)]
    settings = {"trial_seed": 3, "trials": 6, "attention_trials": 2, "split": "test"}
    asked, grid = [], rt.evaluate_grid
    monkeypatch.setattr(rt, "evaluate_grid", lambda *a, **kw: asked.append((a[3:], kw)) or grid(*a, **kw))
    rows = rt.score_cells(str(scored_run.path), cells, settings)
    assert asked == [(([L], [d]), {"digits": 4, "seed": 3, "trials": 6, "device": "cpu"}) for L, d in cells]
    assert [(r["length"], r["depth"], r["multiple"]) for r in rows] == [(64, 0.0, 2), (32, 0.5, 1), (32, 1.0, 1)]
    assert all(type(r["multiple"]) is int for r in rows)
    for (length, depth), row in zip(cells, rows):
        (want,) = grid(module.model, filler, task.sym, [length], [depth], digits=4, seed=3, trials=6)
        assert {k: row[k] for k in want} == pytest.approx(want, nan_ok=True)
        idx = torch.stack([rt.trial(filler, task.sym, length, depth, 4, 3, i)[0] for i in range(2)])
        start = round(depth * rt.Layout(length, 1, 4).filler)
        assert row["needle_attention"] == pytest.approx(rt.needle_attention(module.model, idx, start, 5, 4))
        assert (row["scheme"], row["extension"], row["seed"], row["train_len"], row["run_id"]) == (
            "rope", "", 0, 32, scored_run.run_id)
    alone = rt.score_cells(str(scored_run.path), cells[1:2], settings)
    assert alone == [pytest.approx(rows[1], nan_ok=True)]
    validation = rt.score_cells(str(scored_run.path), cells[1:2], {**settings, "split": "validation"})
    idx = torch.stack([rt.trial(task.filler("validation"), task.sym, 32, 0.5, 4, 3, i)[0] for i in range(2)])
    start = round(0.5 * rt.Layout(32, 1, 4).filler)
    assert validation[0]["needle_attention"] == pytest.approx(rt.needle_attention(module.model, idx, start, 5, 4))
    assert validation[0]["needle_attention"] != pytest.approx(rows[1]["needle_attention"])
    default = {k: v for k, v in settings.items() if k != "split"}
    assert rt.score_cells(str(scored_run.path), cells[1:2], default) == [pytest.approx(validation[0], nan_ok=True)]
    none = rt.score_cells(str(scored_run.path), cells[1:2], {**settings, "attention_trials": 0},
                          extra={"scheme": "rope+ft", "extension": "x"})
    assert math.isnan(none[0]["needle_attention"]) and (none[0]["scheme"], none[0]["extension"]) == ("rope+ft", "x")
    assert {k: v for k, v in none[0].items() if k not in ("needle_attention", "scheme", "extension")} == pytest.approx(
        {k: v for k, v in rows[1].items() if k not in ("needle_attention", "scheme", "extension")})
    (yarn,) = rt.score_cells(str(scored_run.path), [(64, 0.5)], settings, "yarn", 16)
    assert (yarn["scheme"], yarn["extension"], yarn["train_len"], yarn["multiple"]) == ("rope+yarn", "yarn", 16, 4)


def _finished_rows(run_id, scheme="alibi", seed=0):
    """Hand-made grid rows (L = 16), out of order: exact match 1 and 0.5 at L, 0.5 and NaN (a
    length past the table) at 2L."""
    base = {"scheme": scheme, "extension": "", "seed": seed, "train_len": 16, "run_id": run_id, "trials": 4,
            "needle_attention": 0.5, "note": ""}
    cells = [(32, 0.5, 2, 0.5, 0.75), (16, 1.0, 1, 0.5, 0.5), (32, 0.0, 2, math.nan, math.nan), (16, 0.0, 1, 1.0, 1.0)]
    return [{**base, "length": L, "depth": d, "multiple": m, "exact_match": e, "digit_acc": a}
            for L, d, m, e, a in cells]


def test_a_finished_grid_is_sorted_written_beside_the_run_and_logged_at_step_length(tmp_path, empty_store):
    """``finish_grid``: rows sorted by (length, depth), written to ``retrieval[-rule].csv`` in the
    run folder, the means over depths (NaN left out) logged to the run's MLflow run at step =
    length under ``retrieval/<metric>[_rule]``, the file under the run's ``retrieval/``
    artifacts, and the line of progress with the exact match at L; a grid scored plain logs
    ``retrieval/<metric>``; a grid of one cell is whole; a grid of no MLflow run is written,
    and logged nowhere."""
    import shutil

    import mlflow

    from posenc.tracking import sqlite_uri

    uri = sqlite_uri(shutil.copy(empty_store, tmp_path / "mlflow.db"))
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("grids")).info.run_id
    (tmp_path / "run").mkdir()
    rows, line = rt.finish_grid(_finished_rows(run_id), uri, str(tmp_path / "run"), "yarn")
    assert [(r["length"], r["depth"]) for r in rows] == [(16, 0.0), (16, 1.0), (32, 0.0), (32, 0.5)]
    assert line == "alibi s0 retrieval grid: exact match at L 75.0%"
    written = pd.read_csv(tmp_path / "run" / "retrieval-yarn.csv")
    assert list(zip(written["length"], written["depth"])) == [(16, 0.0), (16, 1.0), (32, 0.0), (32, 0.5)]
    for key, want in (("exact_match", [(16, 0.75), (32, 0.5)]), ("digit_acc", [(16, 0.75), (32, 0.75)])):
        hist = client.get_metric_history(run_id, f"retrieval/{key}_yarn")
        assert sorted((h.step, h.value) for h in hist) == want
    assert [a.path for a in client.list_artifacts(run_id, "retrieval")] == ["retrieval/retrieval-yarn.csv"]
    plain = client.create_run(client.get_run(run_id).info.experiment_id).info.run_id
    rt.finish_grid(_finished_rows(plain), uri, str(tmp_path / "run"))
    assert sorted((h.step, h.value) for h in client.get_metric_history(plain, "retrieval/exact_match")) == [
        (16, 0.75), (32, 0.5)]
    assert [a.path for a in client.list_artifacts(plain, "retrieval")] == ["retrieval/retrieval.csv"]
    (one,) = [r for r in _finished_rows(None, "rope", 2) if r["depth"] == 1.0]
    rows, line = rt.finish_grid([one], uri, str(tmp_path / "one"))
    assert rows == [one] and line == "rope s2 retrieval grid: exact match at L 50.0%"
    assert (tmp_path / "one" / "retrieval.csv").is_file() and client.get_metric_history(run_id, "retrieval/exact_match") == []
