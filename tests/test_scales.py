"""Kendall's τ between two studies' orderings, its bootstrap interval, and the schemes whose
place moves by more than their seeds spread them (``analysis.scales``)."""

from __future__ import annotations

import itertools

import pytest

from analysis import scales


def naive_tau(a, b):
    """(concordant - discordant) / pairs, for sequences without ties: Kendall's τ-a = τ-b."""
    c = d = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        s = (a[i] - a[j]) * (b[i] - b[j])
        c += s > 0
        d += s < 0
    return (c - d) / (len(a) * (len(a) - 1) / 2)


@pytest.mark.parametrize("b", [[1, 2, 3, 4, 5], [5, 4, 3, 2, 1], [2, 1, 3, 5, 4], [3, 5, 1, 2, 4]])
def test_kendall_is_the_naive_count_without_ties(b):
    a = [0.1, 0.5, 0.7, 1.2, 3.0]
    assert scales.kendall(a, b) == pytest.approx(naive_tau(a, b))


def test_places_count_from_the_best_in_either_direction_and_ties_share():
    means = {"a": 0.9, "b": 0.5, "c": 0.9, "d": 0.1}
    assert scales.places(means, higher_is_better=True) == {"a": 1, "b": 3, "c": 1, "d": 4}
    assert scales.places(means, higher_is_better=False) == {"a": 3, "b": 2, "c": 3, "d": 1}


def test_the_same_order_gives_tau_one_and_no_scheme_moves():
    a = {"x": [1.0, 1.1, 0.9], "y": [2.0, 2.1, 1.9], "z": [3.0, 3.2, 2.8], "w": [4.0, 4.1, 3.9]}
    b = {s: [10 * v for v in vals] for s, vals in a.items()}
    out = scales.compare(a, b, resamples=200)
    assert out["tau"] == pytest.approx(1.0)
    assert out["lo"] == pytest.approx(1.0) and out["hi"] == pytest.approx(1.0)
    assert out["moved"] == [] and out["n"] == 4 and out["seeds"] == (3, 3)
    assert out["places"]["w"]["a"] == 1 and out["places"]["x"]["b"] == 4


def test_a_scheme_that_jumps_past_its_spread_moves_and_overlapping_ones_do_not():
    a = {"x": [1.0, 1.05, 0.95], "y": [2.0, 2.05, 1.95], "z": [3.0, 3.05, 2.95], "w": [4.0, 4.05, 3.95]}
    b = dict(a, x=[5.0, 5.05, 4.95])  # x goes from last to first, far outside its seeds
    out = scales.compare(a, b, resamples=300)
    # every place changed (x 4 -> 1 pushes the others down one) and no seed spread covers a change
    assert out["moved"] == ["w", "x", "y", "z"]
    assert out["places"]["x"]["a"] == 4 and out["places"]["x"]["b"] == 1
    assert out["tau"] == pytest.approx(naive_tau([1, 2, 3, 4], [5, 2, 3, 4]))
    # seeds so spread that the orders are indistinguishable: nothing moves, and τ's interval is wide
    noisy_a = {"x": [0.0, 4.0], "y": [0.5, 3.5], "z": [1.0, 3.0], "w": [1.5, 2.5]}
    noisy_b = {"x": [1.5, 2.5], "y": [1.0, 3.0], "z": [0.5, 3.5], "w": [0.0, 4.0]}
    noisy = scales.compare(noisy_a, noisy_b, resamples=300)
    assert noisy["moved"] == []
    assert noisy["lo"] < 0 < noisy["hi"]


def test_only_schemes_both_hold_with_finite_values_count_and_too_few_give_no_tau():
    a = {"x": [1.0], "y": [2.0], "z": [3.0], "only_a": [4.0], "nan": [float("nan")]}
    b = {"x": [1.0], "y": [3.0], "z": [2.0], "nan": [1.0]}
    out = scales.compare(a, b, resamples=50)
    assert out["schemes"] == ["x", "y", "z"]
    assert out["lo"] == out["hi"] == out["tau"] == pytest.approx(1 / 3)  # one seed a side: no spread
    assert scales.compare({"x": [1.0], "y": [2.0]}, {"x": [1.0], "y": [2.0]})["tau"] is None


def test_samples_read_every_table_from_results_shaped_like_the_studys():
    lm = {"alibi": {"ratio_longest": {"mean": 1.0, "values": [1.0, 1.1]}},
          "learned": {"ratio_longest": {"mean": None, "values": []}}}
    mlm = {"summary": {"none": {"acc": [0.2, 0.3]}}}
    retrieval = {"schemes": {"rope": {"lengths": {"1": {"values": [0.9, 0.8]}, "4": {"values": [0.1, 0.0]}}},
                             "rope+yarn": {"lengths": {"1": {"values": [0.9]}}}}}
    reach = [{"scheme": "rope", "seed": s, "multiple": m, "distance": d}
             for s, m, d in [(0, 16, 10.0), (0, 16, 20.0), (1, 16, 30.0), (0, 1, 99.0)]]
    corr = {"schemes": {"cape (mlm)": {"terms": {"position-position": {"values": [1.0, 2.0]},
                                                 "word-position": {"values": [0.1, 0.2]}}},
                        "alibi (mlm)": {"terms": {"position-position": {"values": [3.0]}}}}}
    s = scales.samples(lm, mlm, retrieval, reach, corr, top=16)
    assert s["lm_ratio"] == {"alibi": [1.0, 1.1]}
    assert s["mlm_accuracy"] == {"none": [0.2, 0.3]}
    assert s["retrieval_1"] == {"rope": [0.9, 0.8]} and s["retrieval_4"] == {"rope": [0.1, 0.0]}
    assert s["reach_top"] == {"rope": [15.0, 30.0]}
    assert s["band_pp"] == {"cape": [1.0, 2.0], "alibi": [3.0]} and s["band_wp"] == {"cape": [0.1, 0.2]}
    assert [t[0] for t in scales.TABLES] == list(s)


# ------------------------------------------------------------------ the report's "Across scales"
def _t(verdict, diff=0.5, scale="points"):
    return {"verdict": verdict, "diff": diff, "scale": scale}


def test_a_finding_holds_only_when_both_tests_give_the_same_verdict():
    from analysis.stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED

    names = ("default", "scale")
    assert scales.holds(_t(BEHIND), _t(BEHIND)) == "holds" and scales.holds(_t(EQUIVALENT), _t(EQUIVALENT)) == "holds"
    assert scales.holds(_t(UNDECIDED), _t(UNDECIDED)) == "undecided at both"
    assert scales.holds(_t(AHEAD), _t(BEHIND)) == "reversed"
    assert scales.holds(_t(BEHIND), _t(EQUIVALENT), names) == "decided in default, equivalent in scale"
    assert scales.holds(_t(EQUIVALENT), _t(AHEAD), names) == "decided in scale, equivalent in default"
    assert scales.holds(_t(BEHIND), _t(UNDECIDED), names) == "decided in default only"
    assert scales.holds(_t(UNDECIDED), _t(EQUIVALENT), names) == "equivalent in scale only"
    assert scales.holds(_t(BEHIND, 1.5, "log"), _t(UNTESTED, 1.2, "log")) == "same direction, untested"
    assert scales.holds(_t(BEHIND, 1.5, "log"), _t(UNTESTED, 0.8, "log")) == "other direction, untested"
    assert scales.holds(_t(UNDECIDED), _t(UNTESTED)) == "untested"
    assert scales.depends_on_scale("reversed") and scales.depends_on_scale("decided in a, equivalent in b")
    assert not scales.depends_on_scale("decided in a only") and not scales.depends_on_scale("holds")


class _Study:
    """What ``scales.findings`` reads of a study, without files: tables as the stages write them."""

    def __init__(self, name: str, ratios: dict, acc: dict, exact4: dict):
        from analysis.stats import against, compare, family

        self.name, self.top = name, 16
        lm = {s: {"ratio_longest": {"values": v}} for s, v in ratios.items()}
        for s, t in against(ratios, "alibi", "log", 0.05, higher_is_better=False).items():
            lm[s]["tests"] = {"ratio": {"16": t}}
        self.lm = lm
        self.mlm = {"question": "fb", "tests": family({o: compare(acc["fb"], v, "points", 0.02) | {"against": o}
                                                       for o, v in acc.items() if o != "fb"})}
        self.retrieval = {"schemes": {s: {"lengths": {"4": {"values": v}}} for s, v in exact4.items()}}
        for s, t in against(exact4, "none", "points", 0.1).items():
            self.retrieval["schemes"][s]["lengths"]["4"]["vs"] = t


def test_findings_pair_each_stated_comparison_with_the_other_studys_own_test():
    from analysis.stats import BEHIND, EQUIVALENT, UNTESTED

    a = _Study("a", {"alibi": [1.0, 1.01, 0.99, 1.0], "rope": [3.0, 3.1, 2.9, 3.05], "kerple": [1.0, 1.005, 0.995, 1.0]},
               {"fb": [0.4, 0.41, 0.39], "none": [0.2, 0.21, 0.19]},
               {"none": [0.9, 0.95, 0.85], "rope": [0.0, 0.05, 0.0]})
    b = _Study("b", {"alibi": [1.0, 1.01, 0.99, 1.0], "rope": [1.0, 1.004, 0.998, 1.002], "kerple": [1.0, 1.01, 0.99, 1.0]},
               {"fb": [0.4, 0.41, 0.39], "none": [0.2, 0.21, 0.19]},
               {"none": [0.9], "rope": [0.1]})
    rows = {r["finding"]: r for r in scales.findings(a, b)}
    rope = rows["LM: `rope`'s ppl(16L) / ppl(L) against `alibi`'s"]
    assert rope["a"]["verdict"] == BEHIND and rope["b"]["verdict"] == EQUIVALENT
    assert rope["verdict"] == "decided in a, equivalent in b" and scales.depends_on_scale(rope["verdict"])
    assert rope["changes"] and not rope["one_only"]
    assert rows["LM: `kerple`'s ppl(16L) / ppl(L) against `alibi`'s"]["verdict"] == "holds"
    assert rows["MLM: `fb`'s accuracy against `none`'s"]["verdict"] == "holds"
    retrieval = rows["retrieval: `rope`'s exact match at 4L against `none`'s"]
    assert retrieval["b"]["verdict"] == UNTESTED and retrieval["verdict"] == "same direction, untested"
    assert len(rows) == 4
