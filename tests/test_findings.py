"""The report's cross-table findings (``analysis.findings``): T5's control family, what each
family decides and with how many seeds, and the fairness profiles (each scheme's best rate,
Kendall's τ against the default order, the decided findings' directions)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import findings
from analysis.stats import BEHIND, against, compare, family


def _lm(ratios: dict, at_l: dict | None = None) -> dict:
    out = {}
    for s, v in ratios.items():
        out[s] = {"train_len": 64, "ratio_longest": {"values": v, "mean": sum(v) / len(v)},
                  "ratios": {"16": {"values": v, "mean": sum(v) / len(v)}},
                  "lengths": {"64": {"mean": (at_l or {}).get(s, 8.0)}}}
    return out


def test_t5_control_is_one_family_of_the_ratio_and_the_exact_match():
    lm = _lm({"t5_bias": [1.37, 1.38, 1.36], "t5_bias_scaled": [1.35, 1.34, 1.36]})
    ret = {"schemes": {s: {"lengths": {"16": {"values": v}}} for s, v in
                       (("t5_bias", [0.3, 0.2, 0.25]), ("t5_bias_scaled", [0.5, 0.45, 0.55]))}}
    c = findings.t5_control(lm, ret, 16, {"lm": 0.05, "retrieval": 0.1})
    assert set(c) == {"ratio", "exact"} and c["ratio"]["m"] == 2 and not c["ratio"]["higher_is_better"]
    # with the LM table's tests against its reference, the share of T5's excess that every bucket trained removes
    lm2 = _lm({"t5_bias": [1.37, 1.38, 1.36], "t5_bias_scaled": [1.35, 1.34, 1.36], "alibi": [1.0, 1.01, 0.99]})
    for s, t in against({s: e["ratio_longest"]["values"] for s, e in lm2.items()}, "alibi", "log", 0.05, False).items():
        lm2[s]["tests"] = {"ratio": {"16": t}}
    x = findings.t5_control(lm2, ret, 16, {"lm": 0.05, "retrieval": 0.1})["explained"]
    import math
    assert x["share"] == pytest.approx(1 - math.log(x["variant"]["diff"]) / math.log(x["plain"]["diff"]))
    assert c["ratio"]["diff"] == pytest.approx(compare([1.35, 1.34, 1.36], [1.37, 1.38, 1.36], "log")["diff"])
    assert c["exact"]["higher_is_better"] and c["exact"]["diff"] == pytest.approx(0.25)
    assert findings.t5_control(_lm({"t5_bias": [1.3, 1.4]}), {}, 16, {"lm": 0.05, "retrieval": 0.1}) == {}


def test_power_counts_each_familys_words_and_the_seeds_the_undecided_need():
    fam = against({"ref": [1.0, 1.01, 0.99], "far": [2.0, 2.1, 1.9], "noisy": [1.0, 1.6, 1.2]}, "ref", "log", 0.05,
                  higher_is_better=False)
    rows = findings.power({"lm": fam, "empty": {}})
    assert [r["name"] for r in rows] == ["lm"]  # an empty family is left out
    r = rows[0]
    assert r["seeds"] == [3] and r["m"] == 2 and r["decided"] == ["far"] and r["undecided"] == ["noisy"]
    assert r["needed"] == {"noisy": fam["noisy"]["seeds_needed"]} and fam["noisy"]["seeds_needed"] > 3


def test_with_seeds_redoes_a_family_with_the_first_seeds():
    samples = {"ref": [1.0, 1.01, 0.99, 1.0, 1.005], "a": [1.4, 1.2, 1.3, 1.25, 1.35]}
    assert findings.with_seeds(samples, "ref", 2, "log", 0.05, False) == \
        findings.tally(against({s: v[:2] for s, v in samples.items()}, "ref", "log", 0.05, False))


def _study(ratios: dict, acc: dict, at_l: dict | None = None, reference="alibi", question=None, against_=()):
    lm = _lm(ratios, at_l)
    for s, t in against(ratios, reference, "log", 0.05, higher_is_better=False).items():
        lm[s]["tests"] = {"ratio": {"16": t}}
    summary = {s: {"acc": v, "acc_mean": sum(v) / len(v)} for s, v in acc.items()}
    tests = family({o: compare(acc[question], acc[o], "points", 0.02) | {"against": o} for o in against_}) \
        if question else {}
    return SimpleNamespace(lm=lm, mlm={"question": question, "tests": tests, "summary": summary})


def test_fairness_picks_each_schemes_best_rate_and_compares_the_orders():
    """Three rates, one seed each: rope is best at 1e-3 (perplexity at L), the others at 3e-3;
    the tuned order of the ratios keeps rope behind alibi, so the decided finding holds; the
    masked LM's best rates are picked by accuracy."""
    default = _study({"alibi": [1.0, 1.01, 0.99], "rope": [3.0, 3.2, 2.9], "sinusoidal": [2.0, 2.1, 1.9]},
                     {"none": [0.2, 0.21, 0.19], "fb": [0.4, 0.41, 0.39]}, question="fb", against_=["none"])
    rates = {
        "1e-3": [_study({"alibi": [1.0], "rope": [2.5], "sinusoidal": [2.2]}, {"none": [0.22], "fb": [0.45]},
                        at_l={"alibi": 8.5, "rope": 7.0, "sinusoidal": 9.9})],
        "3e-3": [_study({"alibi": [0.99], "rope": [3.5], "sinusoidal": [1.8]}, {"none": [0.25], "fb": [0.43]},
                        at_l={"alibi": 8.1, "rope": 7.5, "sinusoidal": 9.2})],
        "1e-2": [_study({"alibi": [1.2], "rope": [4.0], "sinusoidal": [1.5]}, {"none": [0.1], "fb": [0.2]},
                        at_l={"alibi": 9.0, "rope": 8.0, "sinusoidal": 9.5})],
    }
    out = findings.fairness(default, rates, "3e-3", {"lm": 0.05, "mlm": 0.02})
    assert {s: b["rate"] for s, b in out["lm_best"].items()} == {"alibi": "3e-3", "rope": "1e-3", "sinusoidal": "3e-3"}
    assert out["lm_best"]["rope"]["by_rate"] == {"1e-3": 7.0, "3e-3": 7.5, "1e-2": 8.0}
    assert {s: b["rate"] for s, b in out["mlm_best"].items()} == {"none": "3e-3", "fb": "1e-3"}
    assert out["taus"]["lm"]["budget"]["tau"] == pytest.approx(1.0)  # alibi < sinusoidal < rope in both
    assert out["taus"]["lm"]["tuned"]["tau"] == pytest.approx(1.0)
    decided = {(f["kind"], f["a"], f["b"]): f for f in out["findings"]}
    rope = decided[("ratio", "rope", "alibi")]
    assert rope["verdict"] == BEHIND and rope["holds_tuned"] and rope["tuned"] == pytest.approx(2.5 / 0.99)
    assert rope["budget"] == pytest.approx(3.5 / 0.99) and rope["holds_budget"]
    assert not rope["tuned_within_margin"] and not rope["budget_within_margin"]  # ×2.5: far beyond ±5%
    mlm = decided[("accuracy", "fb", "none")]
    assert mlm["holds_tuned"] and mlm["tuned"] == pytest.approx(0.45 - 0.25) and not mlm["tuned_within_margin"]
    assert out["lm_best"]["rope"]["tuned_ratio"] == 2.5  # the ratio at its best rate
    assert out["growth"]["rope"] == {"default": pytest.approx(3.0333, abs=1e-3), "longer": 3.5}


def test_a_rate_with_two_seeds_is_judged_by_their_mean():
    """``best_rate`` over rates with one or two studies: a scheme's value at a rate is the mean of
    its seeds' (perplexity at L here), so a second seed can move the best rate: seed 0 alone puts
    rope's best at 1e-2 (7.0 < 7.2), the mean of both (7.0, 7.8 → 7.4) at 3e-3."""
    one = lambda ppl: _study({"rope": [1.0]}, {"fb": [0.5]}, at_l={"rope": ppl})  # noqa: E731
    rates = {"3e-3": [one(7.2)], "1e-2": [one(7.0)]}
    assert findings.best_rate(rates, findings.ppl_at_l, True)["rope"]["rate"] == "1e-2"
    rates["1e-2"].append(one(7.8))
    best = findings.best_rate(rates, findings.ppl_at_l, True)["rope"]
    assert best["rate"] == "3e-3" and best["by_rate"] == {"3e-3": 7.2, "1e-2": pytest.approx(7.4)}
    assert best["by_seed"] == {"3e-3": [7.2], "1e-2": [7.0, 7.8]}


def test_the_shared_rate_is_the_one_that_handicaps_no_scheme_most():
    """``shared_rate`` by hand: perplexity at L of two schemes at three rates. a's best is 1e-2
    (5.0), b's 3e-3 (6.0). At 3e-3 a is 5.5 / 5.0 - 1 = 10% worse than its best; at 1e-2 b is
    7.2 / 6.0 - 1 = 20% worse; at 3e-2 both are worse still: 3e-3 is shared. For accuracy the
    shortfall is in points; a rate a scheme lacks counts as the worst."""
    one = lambda a, b: [_study({"a": [1.0], "b": [1.0]}, {}, at_l={"a": a, "b": b})]  # noqa: E731
    best = findings.best_rate({"3e-3": one(5.5, 6.0), "1e-2": one(5.0, 7.2), "3e-2": one(6.0, 9.0)},
                              findings.ppl_at_l, True)
    out = findings.shared_rate(best, True)
    assert out["rate"] == "3e-3"
    assert out["worst"]["3e-3"] == {"scheme": "a", "shortfall": pytest.approx(0.1)}
    assert out["worst"]["1e-2"] == {"scheme": "b", "shortfall": pytest.approx(0.2)}
    acc = {"x": {"value": 0.5, "by_rate": {"1e-3": 0.5, "1e-2": 0.45}},
           "y": {"value": 0.6, "by_rate": {"1e-2": 0.6}}}
    out = findings.shared_rate(acc, False)
    assert out["rate"] == "1e-2" and out["worst"]["1e-2"] == {"scheme": "x", "shortfall": pytest.approx(0.05)}
    assert out["worst"]["1e-3"]["scheme"] == "y" and out["worst"]["1e-3"]["shortfall"] == float("inf")
    assert findings.shared_rate({}, True) is None


def test_profiles_at_one_rate_may_differ_in_their_seeds_alone():
    """``pipelines.findings._rate_groups``: profiles grouped by their rate, the first one's order
    kept; a second profile at a rate that shares a seed with the first, or trains otherwise (its
    steps here), is refused naming why."""
    from pipelines.findings import _rate_groups

    def study(name: str, rate: str, seeds: str, steps: int = 2000):
        spec = {"seeds": seeds, "seq_len": 64, "steps": steps}
        return SimpleNamespace(name=name, rate=rate, spec=lambda table: spec, seeds=lambda table: seeds.split())

    a, b, c = study("fairness-lr1e-2", "1e-2", "0"), study("fairness-lr1e-2-seed1", "1e-2", "1"), \
        study("fairness-lr3e-3", "3e-3", "0")
    assert _rate_groups([a, b, c]) == {"1e-2": [a, b], "3e-3": [c]}
    with pytest.raises(SystemExit, match="nothing but shared seeds"):
        _rate_groups([a, study("fairness-lr1e-2-again", "1e-2", "0")])
    with pytest.raises(SystemExit, match=r"\['steps'\]"):
        _rate_groups([a, study("fairness-lr1e-2-seed1", "1e-2", "1", steps=4000)])


def test_a_direction_beside_its_size_against_the_margin():
    """``within``: a factor within [1/(1+m), 1+m], or points within ±m (strictly), as the
    equivalence margin reads it."""
    assert findings.within(1.04, 0.05, True) and findings.within(1 / 1.05, 0.05, True)
    assert not findings.within(1.051, 0.05, True) and not findings.within(0.95, 0.05, True)
    assert findings.within(-0.019, 0.02, False) and not findings.within(0.02, 0.02, False)


def test_where_the_ratio_and_the_absolute_perplexity_disagree():
    """``ratio_and_absolute``: the schemes whose verdict against the reference at kL is not the
    same on the ratio as on the perplexity there, with both tests."""
    t = lambda v: {"verdict": v}  # noqa: E731
    lm = {"a": {"tests": {"ratio": {"16": t("behind")}, "ppl": {"16": t("undecided")}}},
          "b": {"tests": {"ratio": {"16": t("behind")}, "ppl": {"16": t("behind")}}},
          "c": {"tests": {"ratio": {"8": t("ahead")}}}, "ref": {}}
    assert findings.ratio_and_absolute(lm, 16) == [{"scheme": "a", "ratio": t("behind"), "ppl": t("undecided")}]


def test_the_primary_hypotheses_are_the_tables_own_families():
    """``primary``: each hypothesis params.yaml names gathers the family the tables tested (the
    same test objects), and an unknown family is refused naming it."""
    lm = {"a": {"tests": {"ratio": {"16": {"verdict": "behind"}}}}, "ref": {}}
    pairs = {"press": {"a:b": {"ratio": {"8": {"verdict": "ahead"}}}}}
    mlm = {"tests": {"none": {"verdict": "ahead"}}}
    ret = {"schemes": {"x": {"lengths": {"16": {"vs": {"verdict": "undecided"}}}}, "none": {"lengths": {"16": {}}}}}
    spec = [{"name": "e", "family": "lm_reference", "quantity": "ratio", "multiple": 16},
            {"name": "p", "family": "lm_pairs", "group": "press", "quantity": "ratio", "multiple": 8},
            {"name": "m", "family": "mlm_question"}, {"name": "r", "family": "retrieval_reference", "multiple": 16}]
    out = findings.primary(spec, lm, pairs, mlm, ret)
    assert [h["name"] for h in out] == ["e", "p", "m", "r"]
    assert out[0]["tests"]["a"] is lm["a"]["tests"]["ratio"]["16"] and out[1]["tests"] == {"a:b": {"verdict": "ahead"}}
    assert out[2]["tests"] == mlm["tests"] and out[3]["tests"] == {"x": {"verdict": "undecided"}}
    with pytest.raises(ValueError, match="family 'other'"):
        findings.primary([{"name": "o", "family": "other"}], lm, pairs, mlm, ret)


def test_the_budget_curve_finds_where_doubling_the_steps_stops_paying():
    """``budget``: three budgets at one rate; alibi gains 10% from 1000 to 2000 steps and 1% from
    2000 to 4000 (converged at 2000), none 10% then 5% (not converged at the largest doubling);
    the masked LM's gain is the relative rise of accuracy. The gains are the hand-computed
    1 - ppl(2S)/ppl(S) and acc(2S)/acc(S) - 1."""
    def at(ppl: dict, acc: dict):
        return SimpleNamespace(lm=_lm({s: [1.0] for s in ppl}, ppl),
                               mlm={"summary": {s: {"acc": [a], "acc_mean": a} for s, a in acc.items()}})

    by_steps = {1000: at({"alibi": 10.0, "none": 20.0}, {"none": 0.40}),
                2000: at({"alibi": 9.0, "none": 18.0}, {"none": 0.404}),
                4000: at({"alibi": 8.91, "none": 17.1}, {"none": 0.40804})}
    out = findings.budget(by_steps, criterion=0.02)
    lm = out["lm"]
    assert out["steps"] == [1000, 2000, 4000] and lm["at"] == 2000
    assert lm["by_steps"]["alibi"] == {1000: 10.0, 2000: 9.0, 4000: 8.91}
    assert lm["gains"]["alibi"] == {1000: pytest.approx(0.10), 2000: pytest.approx(0.01)}
    assert lm["gains"]["none"] == {1000: pytest.approx(0.10), 2000: pytest.approx(0.05)}
    assert lm["converged"] == {"alibi": 2000, "none": None}
    assert lm["met"] == ["alibi"] and lm["not_met"] == ["none"]
    mlm = out["mlm"]
    assert mlm["gains"]["none"] == {1000: pytest.approx(0.01), 2000: pytest.approx(0.01)}
    assert mlm["converged"] == {"none": 1000} and mlm["met"] == ["none"]
    # a gain exactly at the criterion has not converged; a budget with no double gives no gain
    edge = findings.budget({1000: at({"a": 8.0}, {}), 2000: at({"a": 6.0}, {})}, criterion=0.25)
    assert edge["lm"]["gains"]["a"] == {1000: 0.25} and edge["lm"]["converged"] == {"a": None}
    assert edge["lm"]["not_met"] == ["a"]
    assert findings.budget({1000: at({"a": 10.0}, {})})["lm"] == {
        "by_steps": {"a": {1000: 10.0}}, "gains": {"a": {}}, "tau": {}, "converged": {"a": None}, "at": None,
        "met": [], "not_met": []}
    # the orders at S and 2S: Kendall's τ as scipy gives it for the same values (lower ppl first)
    from scipy.stats import kendalltau

    three = {1000: at({"a": 10.0, "b": 11.0, "c": 12.0}, {}), 2000: at({"a": 9.5, "b": 9.0, "c": 10.0}, {})}
    assert findings.budget(three)["lm"]["tau"][1000]["tau"] == pytest.approx(
        kendalltau([10.0, 11.0, 12.0], [9.5, 9.0, 10.0]).statistic)


def test_the_budget_of_record_is_the_first_whose_doubling_keeps_the_ratios_order():
    """``budget``'s ``order``: the ratio ppl(kL) / ppl(L) of three schemes at three budgets. From
    1000 to 2000 steps b and c swap (τ = (2 - 1) / 3 = 1/3, by hand: pairs ab, ac agree, bc does
    not); from 2000 to 4000 the order holds (τ = 1): the budget of record is 2000. With a
    criterion of 0.2 the first budget already meets it."""
    def at(ratios: dict):
        return SimpleNamespace(lm=_lm({s: [r] for s, r in ratios.items()}),
                               mlm={"summary": {"a": {"acc": [0.5], "acc_mean": 0.5}}})

    by_steps = {1000: at({"a": 1.0, "b": 1.2, "c": 1.1}), 2000: at({"a": 1.0, "b": 1.1, "c": 1.2}),
                4000: at({"a": 1.02, "b": 1.12, "c": 1.25})}
    out = findings.budget(by_steps)["order"]
    assert out["criterion"] == findings.ORDER_TAU == 0.95
    assert out["tau"] == {1000: pytest.approx(1 / 3), 2000: pytest.approx(1.0)} and out["at"] == 2000
    assert findings.budget(by_steps, order_tau=0.2)["order"]["at"] == 1000
    assert findings.budget({1000: at({"a": 1.0})})["order"] == {"criterion": 0.95, "tau": {}, "at": None}


def test_the_budget_curve_refuses_studies_that_differ_in_more_than_their_steps():
    """``pipelines.findings._budget``: the fairness profile at the budget profiles' rate joins the
    curve; budget profiles at two rates, or one whose runs differ in more than their steps (here
    its batch), are refused naming why; without a budget profile there is no curve."""
    from pipelines.findings import _budget

    def study(name: str, rate: str, steps: int, batch: int = 16, ppl: float = 8.0):
        spec = {"seeds": "0", "seq_len": 64, "batch_size": batch, "steps": steps, "validate_every": steps}
        s = SimpleNamespace(name=name, rate=rate, lm=_lm({"a": [1.0]}, {"a": ppl}),
                            mlm={"summary": {"a": {"acc": [0.5], "acc_mean": 0.5}}})
        s.spec = lambda table: spec
        return s

    fair = {"1e-2": study("fairness-lr1e-2", "1e-2", 2000, ppl=8.0), "3e-3": study("fairness-lr3e-3", "3e-3", 2000)}
    out = _budget(fair, [study("budget-steps4000", "1e-2", 4000, ppl=7.6)])
    assert out["rate"] == "1e-2" and out["profiles"] == {2000: "fairness-lr1e-2", 4000: "budget-steps4000"}
    assert out["lm"]["gains"]["a"] == {2000: pytest.approx(0.05)} and out["lm"]["not_met"] == ["a"]
    assert _budget(fair, []) is None
    with pytest.raises(SystemExit, match="different learning rates"):
        _budget(fair, [study("budget-steps4000", "1e-2", 4000), study("budget-steps8000", "3e-3", 8000)])
    with pytest.raises(SystemExit, match=r"budget-steps4000: the runs of its lm table differ .* \['batch_size'\]"):
        _budget(fair, [study("budget-steps4000", "1e-2", 4000, batch=32)])


def test_a_studys_rate_is_the_one_its_task_or_common_overrides_set(tmp_path):
    """``Study.rate_of``, which the fairness, budget and retrieval-rate blocks key their studies
    by: the value of ``optim.lr=`` among the overrides of the task that makes the table, else
    among the study's common overrides, as written; None when neither sets one. ``rate`` is the
    causal LM's."""
    from pipelines.results import Study

    tasks = ('tasks: {lm: {overrides: ""}, mlm: {overrides: "optim.lr=3e-3"}, '
             'retrieval: {overrides: "data.eval_batch_size=640 optim.lr=1e-3"}}\n')
    (tmp_path / "params.yaml").write_text('common: "trainer.foo=1 optim.lr=1e-2 optim.lr_other=9"\n' + tasks)
    study = Study(tmp_path)
    assert study.rate == study.rate_of("lm") == "1e-2"
    assert study.rate_of("mlm") == "3e-3" and study.rate_of("retrieval") == "1e-3"
    (tmp_path / "other").mkdir()
    (tmp_path / "other/params.yaml").write_text('common: "optim.warmup=10"\n' + tasks)
    assert Study(tmp_path / "other", "other").rate is None


def test_retrieval_rates_best_is_interior_only_with_a_slower_rate_on_each_side():
    """``analysis.findings.retrieval_rate`` on steps written by hand: a miss (None, the cap) is
    slower than any run that meets the criterion; ties share the best; a best at the grid's end
    (or tied with it) is at that edge, not interior; every rate tied is flat; the spread over
    seeds ignores the runs that missed, counting them apart."""
    from analysis.findings import retrieval_rate

    steps = {"3e-3": {"a": 800, "b": 900, "c": 700, "d": 500, "e": 600},
             "1e-3": {"a": 1500, "b": None, "c": 700, "d": 500, "e": 600},
             "1e-2": {"a": 1200, "b": 600, "c": None, "d": 400, "e": 600}}
    out = retrieval_rate(steps, 4000, {"a": [800, None, 1000, 600], "b": [900], "d": [450, 700]}, "3e-3")
    assert out["rates"] == ["1e-3", "3e-3", "1e-2"]
    assert out["best"] == {"a": ["3e-3"], "b": ["1e-2"], "c": ["1e-3", "3e-3"], "d": ["1e-2"], "e": ["1e-3", "3e-3", "1e-2"]}
    assert out["interior"] == ["a"] and out["top"] == ["b", "d"] and out["bottom"] == ["c"] and out["flat"] == ["e"]
    assert out["steps"]["b"] == {"1e-3": None, "3e-3": 900, "1e-2": 600}
    assert out["spread"]["a"] == {"n": 4, "min": 600, "median": 800, "max": 1000, "missed": 1}
    assert out["spread"]["b"] == {"n": 1, "min": 900, "median": 900, "max": 900, "missed": 0}
    # b's best (600 at 1e-2) took fewer steps than its one seed at 3e-3 (900), d's (400) fewer than
    # both of its (450, 700); a's best is 3e-3 itself; c and e have no spread
    assert out["elsewhere"] == ["b", "d"] and out["beyond_spread"] == ["b", "d"]
    other = retrieval_rate(steps, 4000, {"d": [300, 700]}, "3e-3")  # a seed of d at 3e-3 took 300; b has no spread
    assert other["elsewhere"] == ["b", "d"] and other["beyond_spread"] == []
    assert retrieval_rate(steps, 4000)["elsewhere"] == []  # no default rate named


def test_the_retrieval_rate_check_reads_one_seed_of_the_default_and_refuses_other_differences():
    """``pipelines.findings._retrieval_rate`` on stand-in studies: the default study's run of the
    profiles' seed at its own rate joins theirs, the ten-seed profile gives the spread at the
    default rate; a profile that differs in more than its seed and evaluation, or runs a seed the
    default study lacks, is refused naming why; without a profile there is no block."""
    from pipelines.findings import _retrieval_rate

    def study(name, rate, seeds, steps, spec=None):
        spec = spec or {"seeds": seeds, "seq_len": 64, "steps": 4000, "criterion": 0.9, "evaluate": {}}
        def run(seed, step):  # a run that missed the criterion records no criterion_step
            return {"task": "retrieval", "seed": int(seed), **({"criterion_step": step} if step is not None else {})}

        runs = {s: {"runs": [run(seed, v[i]) for i, seed in enumerate(seeds.split())] + [{"task": "lm", "seed": 0}]}
                for s, v in steps.items()}
        st = SimpleNamespace(name=name, rate=rate, runs=runs)
        st.rate_of = lambda table: rate
        st.task = lambda table: "retrieval"
        st.spec = lambda table: dict(spec, seeds=seeds)
        st.seeds = lambda table: seeds.split()
        return st

    default = study("default", "3e-3", "0", {"a": [800], "b": [900]})
    seeds = study("retrieval-seeds", "3e-3", "0 1 2", {"a": [800, 700, 900], "b": [900, None, 1000]})
    high = study("retrieval-lr1e-2", "1e-2", "0", {"a": [1200], "b": [600]})
    low = study("retrieval-lr1e-3", "1e-3", "0", {"a": [1500], "b": [None]})
    out = _retrieval_rate(default, seeds, [low, high])
    assert out["steps"] == {"a": {"1e-3": 1500, "3e-3": 800, "1e-2": 1200}, "b": {"1e-3": None, "3e-3": 900, "1e-2": 600}}
    assert out["interior"] == ["a"] and out["top"] == ["b"] and out["seed"] == 0 and out["cap"] == 4000
    assert out["spread"]["b"] == {"n": 3, "min": 900, "median": 950.0, "max": 1000, "missed": 1}
    assert out["beyond_spread"] == ["b"]  # 600 at 1e-2 against 900 and 1000 at the default 3e-3
    assert out["profiles"] == {"1e-3": "retrieval-lr1e-3", "1e-2": "retrieval-lr1e-2"}
    assert _retrieval_rate(default, seeds, []) is None
    assert _retrieval_rate(default, default, [high])["spread"] == {}
    wider = study("retrieval-lr1e-2", "1e-2", "0", {"a": [1], "b": [1]},
                  {"seeds": "0", "seq_len": 128, "steps": 4000, "criterion": 0.9, "evaluate": {}})
    with pytest.raises(SystemExit, match=r"retrieval-lr1e-2: its retrieval differs .* \['seq_len'\]"):
        _retrieval_rate(default, seeds, [wider])
    with pytest.raises(SystemExit, match="its seeds"):
        _retrieval_rate(default, seeds, [study("retrieval-lr1e-2", "1e-2", "5", {"a": [1], "b": [1]})])
