"""The study against the papers (``analysis.papers``): the verdict each test's verdict gives, how
a claim combines its tests (one definition of "in part", and "agrees where decided"), the
conditions on intervals, that a claim reads the tables' own tests at every multiple and is met
at the paper's, and the control that gives the reason where a claim disagrees."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import papers, words
from analysis.stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED, against, reversed_test


@pytest.mark.parametrize("verdict,expect,judged", [
    (AHEAD, ["ahead"], papers.AGREES), (BEHIND, ["ahead"], papers.DISAGREES),
    (EQUIVALENT, ["ahead"], papers.DISAGREES),  # no difference beyond the margin, where one was claimed
    (EQUIVALENT, ["ahead", "equivalent"], papers.AGREES), (UNDECIDED, ["ahead"], papers.UNDECIDED_CLAIM),
    (UNTESTED, ["behind"], papers.UNDECIDED_CLAIM),
])
def test_judge(verdict, expect, judged):
    assert papers.judge(verdict, expect) == judged


def test_combine():
    """In part: some tests agree and some disagree, whatever the rest; where the others are
    undecided, the claim agrees (or disagrees) where decided."""
    A, D, U = papers.AGREES, papers.DISAGREES, papers.UNDECIDED_CLAIM
    assert papers.combine([A, A]) == A and papers.combine([D, D]) == D
    assert papers.combine([A, D]) == papers.IN_PART and papers.combine([A, D, U]) == papers.IN_PART
    assert papers.combine([A, U]) == papers.AGREES_WHERE_DECIDED
    assert papers.combine([D, U]) == papers.DISAGREES_WHERE_DECIDED and papers.combine([U, U]) == U


def test_flat_is_a_condition_on_the_ratios_interval():
    assert papers.flat_condition([0.99, 0.985, 0.995], 0.05)["verdict"] == papers.AGREES
    assert papers.flat_condition([1.3, 1.4, 1.35], 0.05)["verdict"] == papers.DISAGREES
    assert papers.flat_condition([0.9, 1.3, 1.1], 0.05)["verdict"] == papers.UNDECIDED_CLAIM  # wide: undecided
    assert papers.flat_condition([1.0], 0.05)["verdict"] == papers.UNDECIDED_CLAIM  # one seed


def _study(ratios: dict, reference: str = "alibi", pairs=(), at_l: dict | None = None) -> SimpleNamespace:
    """A study whose LM table holds ratios at 2L and 8L (the given per-seed values at 8L, 0.8 times
    them at 2L) and their tests against ``reference``, each multiple a family, as the tables stage
    writes them; ``pairs`` tested as one group, each multiple a family."""
    lm = {s: {"train_len": 64, "ratios": {k: {"values": [x * f for x in v]} for k, f in (("2", 0.8), ("8", 1.0))},
              "lengths": {"64": {"values": (at_l or {}).get(s, [])}}} for s, v in ratios.items()}
    for k in ("2", "8"):
        for s, t in against({s: e["ratios"][k]["values"] for s, e in lm.items()}, reference, "log", 0.05,
                            higher_is_better=False).items():
            lm[s].setdefault("tests", {}).setdefault("ratio", {})[k] = t
    if at_l:
        for s, t in against(at_l, reference, "log", 0.05, higher_is_better=False).items():
            lm[s].setdefault("tests", {}).setdefault("ppl", {})["1"] = t
    group = {}
    for k in ("2", "8"):
        from analysis.stats import compare, family

        tests = {f"{a}:{b}": compare(lm[a]["ratios"][k]["values"], lm[b]["ratios"][k]["values"], "log", 0.05)
                 | {"against": b} for a, b in pairs if a in lm and b in lm}
        for key, t in family(tests, higher_is_better=False).items():
            group.setdefault(key, {"a": key.split(":")[0], "b": key.split(":")[1]}).setdefault("ratio", {})[k] = t
    return SimpleNamespace(lm=lm, lm_pairs={"g": group} if pairs else {}, retrieval={"schemes": {}},
                           correlations={"schemes": {}}, minilm={},
                           params={"lm_table": {"margin": 0.05}, "retrieval_table": {"margin": 0.1}})


LITERATURE = {
    "papers": {"p": {"short": "P 2022", "cite": "P 2022", "multiple": 8}},
    "band": {"banded": 1.0, "weak": 0.5},
    "claims": [
        {"key": "rope", "paper": "p", "claim": "rope degrades less", "quoted": "q",
         "tests": [{"kind": "lm_ratio", "a": "rope", "b": "sinusoidal", "expect": ["ahead"]}],
         "controls": [{"study": "wide", "kind": "lm_ratio", "a": "rope", "b": "sinusoidal", "label": "wide heads"}]},
        {"key": "sin", "paper": "p", "claim": "sinusoidal degrades", "quoted": "q",
         "tests": [{"kind": "lm_ratio", "a": "alibi", "b": "sinusoidal", "expect": ["ahead"]}]},
        {"key": "flat", "paper": "p", "claim": "alibi flat", "quoted": "q", "tests": [{"kind": "flat", "a": "alibi"}]},
        {"key": "at_l", "paper": "p", "claim": "alibi at L", "quoted": "q",
         "tests": [{"kind": "lm_at", "multiple": 1, "a": "alibi", "b": "sinusoidal", "expect": ["ahead", "equivalent"]}]},
        {"key": "read", "paper": "p", "claim": "a reading", "quoted": "q", "reading": "not the paper's task",
         "tests": [{"kind": "lm_ratio", "a": "sinusoidal", "b": "alibi", "expect": ["behind"]}]},
        {"key": "none", "paper": "p", "claim": "not asked", "quoted": "q", "untested": "no such scheme"},
    ],
}
DEFAULT = {"rope": [3.0, 3.3, 2.8, 3.1], "sinusoidal": [1.9, 2.0, 1.95, 2.05], "alibi": [0.99, 0.985, 0.995, 0.99]}


def test_a_claim_reads_the_tables_own_tests_at_every_multiple_and_is_met_at_the_papers():
    """No second family: a claim on a pair reads the pair's test as the tables stage wrote it (a
    family of the group), a claim that names the table's reference first reads the table's test
    the other way round; every multiple is shown, the verdict is the paper's multiple's (8L)."""
    default = _study(DEFAULT, pairs=[("rope", "sinusoidal")],
                     at_l={"alibi": [8.7, 8.8, 8.75, 8.72], "sinusoidal": [9.5, 9.6, 9.55, 9.58],
                           "rope": [7.8, 7.9, 7.85, 7.8]})
    rows = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {})}
    rope = rows["rope"]["results"][0]
    assert rope["at"] == 8 and set(rope["by_multiple"]) == {"2", "8"}
    assert rope["comparison"] is default.lm_pairs["g"]["rope:sinusoidal"]["ratio"]["8"]
    assert rope["comparison"]["verdict"] == BEHIND and rows["rope"]["verdict"] == papers.DISAGREES
    sin = rows["sin"]["results"][0]
    assert sin["comparison"] == reversed_test(default.lm["sinusoidal"]["tests"]["ratio"]["8"], "sinusoidal")
    assert sin["comparison"]["m"] == 2 and rows["sin"]["verdict"] == papers.AGREES  # the table's family: 2 tests
    assert rows["at_l"]["results"][0]["at"] == 1 and rows["at_l"]["verdict"] == papers.AGREES
    assert rows["flat"]["verdict"] == papers.AGREES and rows["flat"]["results"][0]["at"] == 8
    assert not rows["read"]["tallied"] and not rows["none"]["tallied"] and rows["rope"]["tallied"]
    assert rows["none"]["verdict"] == papers.UNTESTED_CLAIM and rows["none"]["reason"] is None
    t = papers.tally(list(rows.values()))
    assert t == {"claims": 4, "papers": 1, "counts": {"agrees": 3, "disagrees": 1}, "outside": 2}
    assert words.claim_counts(t["counts"]) == "3 agree, 1 disagrees"


def test_a_control_gives_the_reason_a_claim_disagrees():
    """RoPE degrades more than sinusoidal at the default scale (the claim disagrees), and less in
    the control profile: the reason names the control; a control that leaves the difference
    undecided names the schemes the setting moves; one that disagrees too leaves it unexplained."""
    default = _study(DEFAULT, pairs=[("rope", "sinusoidal")])
    wide = _study({"rope": [1.6, 1.7, 1.65, 1.62], "sinusoidal": [1.9, 2.0, 1.95, 2.05]},
                  reference="sinusoidal", pairs=[("rope", "sinusoidal")])
    row = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": wide})}["rope"]
    assert row["controls"][0]["verdict"] == papers.AGREES and row["controls"][0]["at"] == 8
    assert words.reason(row["reason"]) == "it does not hold against `sinusoidal`; the control agrees with the paper: wide heads"
    unclear = _study({"rope": [1.6, 2.4, 1.9, 2.2], "sinusoidal": [1.9, 2.0, 1.95, 2.05]}, reference="sinusoidal",
                     pairs=[("rope", "sinusoidal")])
    row = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": unclear})}["rope"]
    assert row["controls"][0]["verdict"] == papers.UNDECIDED_CLAIM
    shifts = row["controls"][0]["shifts"]  # each scheme in the control against itself in the default study
    assert shifts["rope"]["verdict"] == AHEAD and shifts["sinusoidal"]["verdict"] in (EQUIVALENT, UNDECIDED)
    said = words.reason(row["reason"])
    assert "possibly the setting the control changes" in said
    assert said.endswith("the setting moves `rope`'s ratio (decided), and not `sinusoidal`'s")
    same = _study({"rope": [3.0, 3.3, 2.8, 3.1], "sinusoidal": [1.9, 2.0, 1.95, 2.05]}, reference="sinusoidal",
                  pairs=[("rope", "sinusoidal")])
    row = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": same})}["rope"]
    assert words.reason(row["reason"]).endswith("unexplained (the control wide heads disagrees too)")
    no_control = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {})}["rope"]
    assert words.reason(no_control["reason"]).endswith("; unexplained")
    assert no_control["controls"][0]["verdict"] == papers.UNTESTED_CLAIM  # the profile has no results


def test_a_rule_claim_on_the_perplexity_reads_the_rule_rows_test_at_its_multiple_alone():
    """``kind: rule`` with ``quantity: ppl``: the rule row's paired test of its perplexity against
    its plain scheme's, as the tables stage wrote it, at the test's multiple only (not the ratio's
    multiples); a control reads the same test in its profile."""
    from analysis.stats import compare, family

    def study(tuned):
        plain = [7.8, 7.9, 7.85, 7.82]
        lm = {"rope": {"train_len": 64, "ratios": {}, "lengths": {}},
              "rope+pi+ft4L": {"train_len": 64, "ratios": {}, "lengths": {}, "rule": {
                  "ppl": {k: family({"rope": compare(tuned, plain, "log", 0.05, paired=True) | {"against": "rope"}},
                                    higher_is_better=False)["rope"] for k in ("1", "2")},
                  "ratio": {"2": {"verdict": AHEAD, "against": "rope"}}}}}
        return SimpleNamespace(lm=lm, lm_pairs={}, retrieval={"schemes": {}}, correlations={"schemes": {}}, minilm={},
                               params={"lm_table": {"margin": 0.05}, "retrieval_table": {"margin": 0.1}})

    claim = {"key": "within", "paper": "p", "claim": "kept within L", "quoted": "q",
             "tests": [{"kind": "rule", "a": "rope+pi+ft4L", "quantity": "ppl", "multiple": 1,
                        "expect": ["equivalent", "ahead"]}],
             "controls": [{"study": "longer", "kind": "rule", "a": "rope+pi+ft4L", "quantity": "ppl", "multiple": 1,
                           "label": "longer"}]}
    lit = {**LITERATURE, "claims": [claim]}
    worse = study([8.8, 8.7, 8.9, 8.75])  # 12% worse at L: behind, so the claim disagrees
    kept = study([7.81, 7.92, 7.84, 7.83])  # within 5%: equivalent, so it agrees
    (row,) = papers.against_papers(lit, worse, {"longer": kept})
    result = row["results"][0]
    assert result["at"] == 1 and set(result["by_multiple"]) == {"1"}
    assert result["comparison"] is worse.lm["rope+pi+ft4L"]["rule"]["ppl"]["1"]
    assert result["comparison"]["verdict"] == BEHIND and row["verdict"] == papers.DISAGREES
    assert row["controls"][0]["verdict"] == papers.AGREES and row["controls"][0]["shifts"] == {}
    assert words.reason(row["reason"]).endswith("the control agrees with the paper: longer")
    near = study([7.86, 7.97, 7.90, 7.88])  # 0.7% worse, consistently: behind, and within the 5% margin
    (row,) = papers.against_papers(lit, worse, {"longer": near})
    control = row["controls"][0]["comparison"]
    assert control["verdict"] == BEHIND and control["within_margin"] and row["reason"]["control"]["within_margin"]
    assert words.reason(row["reason"]).endswith(
        "unexplained (the control longer disagrees too, though by a difference within the margin)")
    (row,) = papers.against_papers(lit, kept, {})
    assert row["results"][0]["comparison"]["verdict"] == EQUIVALENT and row["verdict"] == papers.AGREES


def test_band_conditions_read_each_scheme_and_minilm():
    corr = {"schemes": {"sinusoidal (mlm)": {"terms": {"position-position": {"values": [1.5, 1.4, 1.6]},
                                                        "word-position": {"values": [-0.1, -0.05, -0.12]}}}}}
    mini = {"models": {"m": {"terms": {"position-position": {"band_score": 1.8},
                                       "word-position": {"band_score": 0.8}}}}}
    limits = {"banded": 1.0, "weak": 0.5}
    pp = papers.band_condition({"term": "position-position", "schemes": ["sinusoidal"], "above": "banded"}, corr,
                               mini, limits)
    assert pp["verdict"] == papers.AGREES and set(pp["per"]) == {"sinusoidal", "all-MiniLM-L6-v2"}
    wp = papers.band_condition({"term": "word-position", "schemes": ["sinusoidal"], "within": "weak"}, corr, mini,
                               limits)
    assert wp["per"]["sinusoidal"]["verdict"] == papers.AGREES
    assert wp["per"]["all-MiniLM-L6-v2"]["verdict"] == papers.DISAGREES and wp["verdict"] == papers.IN_PART


def test_the_shipped_literature_file_is_well_formed():
    """Every claim names a known paper and either tests of known kinds, each expecting known
    verdicts, or why it is untested; a claim the paper did not make says so (``reading``); every
    paper whose claims compare schemes names the multiple its claims are met at; every paper a
    claim cites has a short name and a citation; Press et al.'s setting gives their heads' width."""
    import yaml

    from .conftest import REPO

    lit = yaml.safe_load((REPO / "docs" / "literature.yaml").read_text())
    kinds = {"lm_ratio", "lm_at", "flat", "rule", "exact", "band"}
    for c in lit["claims"]:
        assert c["paper"] in lit["papers"] and {"key", "claim", "quoted"} <= set(c)
        assert ("tests" in c) != ("untested" in c), c["key"]
        for t in c.get("tests", []):
            assert t["kind"] in kinds and set(t.get("expect", [])) <= set(papers.SHORT), c["key"]
            if t["kind"] in papers.COMPARISONS or t["kind"] == "flat":
                assert "multiple" in lit["papers"][c["paper"]] or "multiple" in t, c["key"]
    assert all({"short", "cite", "setting"} <= set(p) for p in lit["papers"].values())
    assert "8 heads of 128" in lit["papers"]["press2022"]["setting"]
    assert "reading" in next(c for c in lit["claims"] if c["key"] == "kazemnejad_lm")


def test_the_reason_names_where_a_claim_holds_only_in_part():
    """In part: the schemes it does not hold against, then those left undecided; only a
    disagreement asks the controls (none here: unexplained); a claim that agrees where decided
    names the undecided ones."""
    def r(b, verdict):
        return {"test": {"a": "none", "b": b}, "verdict": verdict}

    agree_undecided = {"verdict": papers.AGREES_WHERE_DECIDED, "controls": [],
                       "results": [r("rope", papers.AGREES), r("alibi", papers.UNDECIDED_CLAIM)]}
    assert words.reason(papers.reason(agree_undecided)) == "undecided against `alibi`"
    mixed = {"verdict": papers.IN_PART, "controls": [],
             "results": [r("rope", papers.AGREES), r("alibi", papers.DISAGREES), r("t5", papers.UNDECIDED_CLAIM)]}
    assert words.reason(papers.reason(mixed)) == "it does not hold against `alibi`; undecided against `t5`; unexplained"
    assert papers.reason({"verdict": papers.AGREES, "controls": [], "results": []}) is None
