"""The study against the papers (``analysis.papers``): the verdict each test's words give, how a
claim combines its tests, the conditions on intervals, one family over every claim, and the
control that gives the reason where a claim disagrees."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis import papers
from analysis.stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED


@pytest.mark.parametrize("word,expect,verdict", [
    (AHEAD, ["ahead"], papers.AGREES), (BEHIND, ["ahead"], papers.DISAGREES),
    (EQUIVALENT, ["ahead"], papers.DISAGREES),  # no difference beyond the margin, where one was claimed
    (EQUIVALENT, ["ahead", "equivalent"], papers.AGREES), (UNDECIDED, ["ahead"], papers.UNDECIDED_CLAIM),
    (UNTESTED, ["behind"], papers.UNDECIDED_CLAIM),
])
def test_judge(word, expect, verdict):
    assert papers.judge(word, expect) == verdict


def test_combine():
    A, D, U = papers.AGREES, papers.DISAGREES, papers.UNDECIDED_CLAIM
    assert papers.combine([A, A]) == A and papers.combine([D, D]) == D
    assert papers.combine([A, D]) == papers.IN_PART and papers.combine([A, U]) == papers.IN_PART
    assert papers.combine([D, U]) == papers.IN_PART and papers.combine([U, U]) == U


def test_flat_is_a_condition_on_the_ratios_interval():
    assert papers.flat_condition([0.99, 0.985, 0.995], 0.05)["verdict"] == papers.AGREES
    assert papers.flat_condition([1.3, 1.4, 1.35], 0.05)["verdict"] == papers.DISAGREES
    assert papers.flat_condition([0.9, 1.3, 1.1], 0.05)["verdict"] == papers.UNDECIDED_CLAIM  # wide: undecided
    assert papers.flat_condition([1.0], 0.05)["verdict"] == papers.UNDECIDED_CLAIM  # one seed


def _lm(ratios: dict, at_l: dict | None = None) -> dict:
    out = {}
    for s, v in ratios.items():
        out[s] = {"train_len": 64, "ratio_longest": {"values": v, "mean": sum(v) / len(v)},
                  "lengths": {"64": {"values": (at_l or {}).get(s, [])}}}
    return out


def _study(lm: dict) -> SimpleNamespace:
    return SimpleNamespace(lm=lm, top=16, retrieval={"schemes": {}}, correlations={"schemes": {}}, minilm={},
                           params={"lm_table": {"margin": 0.05}, "retrieval_table": {"margin": 0.1}})


LITERATURE = {
    "papers": {"p": {"short": "P 2022", "cite": "P 2022"}},
    "band": {"banded": 1.0, "weak": 0.5},
    "claims": [
        {"key": "rope", "paper": "p", "claim": "rope degrades less", "quoted": "q",
         "tests": [{"kind": "lm_ratio", "a": "rope", "b": "sinusoidal", "expect": ["ahead"]}],
         "controls": [{"study": "wide", "kind": "lm_ratio", "a": "rope", "b": "sinusoidal", "label": "wide heads"}]},
        {"key": "flat", "paper": "p", "claim": "alibi flat", "quoted": "q", "tests": [{"kind": "flat", "a": "alibi"}]},
        {"key": "at_l", "paper": "p", "claim": "alibi at L", "quoted": "q",
         "tests": [{"kind": "lm_at", "multiple": 1, "a": "alibi", "b": "sinusoidal", "expect": ["ahead", "equivalent"]}]},
        {"key": "none", "paper": "p", "claim": "not asked", "quoted": "q", "untested": "no such scheme"},
    ],
}


def test_against_papers_one_family_a_control_and_the_reason():
    """RoPE degrades more than sinusoidal at the default scale (the claim disagrees), and less in
    the control profile: the reason names the control. All comparisons of the claims are one
    family (m = 2 here: the ratio test and the test at L)."""
    default = _study(_lm({"rope": [3.0, 3.3, 2.8, 3.1], "sinusoidal": [1.9, 2.0, 1.95, 2.05],
                          "alibi": [0.99, 0.985, 0.995, 0.99]},
                         at_l={"alibi": [8.7, 8.8, 8.75, 8.72], "sinusoidal": [9.5, 9.6, 9.55, 9.58]}))
    wide = _study(_lm({"rope": [1.6, 1.7, 1.65, 1.62], "sinusoidal": [1.9, 2.0, 1.95, 2.05]}))
    rows = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": wide})}
    rope = rows["rope"]
    assert rope["results"][0]["comparison"]["word"] == BEHIND and rope["verdict"] == papers.DISAGREES
    assert rope["results"][0]["comparison"]["m"] == 2  # the paper's family: the ratio test and the test at L
    assert rope["controls"][0]["verdict"] == papers.AGREES
    assert rope["reason"] == "the control agrees with the paper: wide heads"
    unclear = _study(_lm({"rope": [1.6, 2.4, 1.9, 2.2], "sinusoidal": [1.9, 2.0, 1.95, 2.05]}))
    row = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": unclear})}["rope"]
    assert row["controls"][0]["verdict"] == papers.UNDECIDED_CLAIM and row["reason"].startswith("possibly the setting")
    shifts = row["controls"][0]["shifts"]  # each scheme in the control against itself in the default study
    assert shifts["rope"]["word"] == "ahead of" and shifts["sinusoidal"]["word"] in ("equivalent to", "undecided against")
    assert row["reason"].endswith("the setting moves `rope`'s ratio (decided), and not `sinusoidal`'s")
    same = _study(_lm({"rope": [3.0, 3.3, 2.8, 3.1], "sinusoidal": [1.9, 2.0, 1.95, 2.05]}))
    row = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {"wide": same})}["rope"]
    assert row["reason"] == "unexplained (the control wide heads disagrees too)"
    assert rows["flat"]["verdict"] == papers.AGREES and rows["at_l"]["verdict"] == papers.AGREES
    assert rows["none"]["verdict"] == papers.UNTESTED_CLAIM and rows["none"]["reason"] is None
    no_control = {r["key"]: r for r in papers.against_papers(LITERATURE, default, {})}
    assert no_control["rope"]["reason"] == "unexplained"
    assert no_control["rope"]["controls"][0]["verdict"] == papers.UNTESTED_CLAIM  # the profile has no results


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
    words, or why it is untested; every paper a claim cites has a short name and a citation."""
    import yaml

    from .conftest import REPO

    lit = yaml.safe_load((REPO / "docs" / "literature.yaml").read_text())
    kinds = {"lm_ratio", "lm_at", "flat", "rule", "exact", "band"}
    for c in lit["claims"]:
        assert c["paper"] in lit["papers"] and {"key", "claim", "quoted"} <= set(c)
        assert ("tests" in c) != ("untested" in c), c["key"]
        for t in c.get("tests", []):
            assert t["kind"] in kinds and set(t.get("expect", [])) <= set(papers.SHORT), c["key"]
    assert all({"short", "cite", "setting"} <= set(p) for p in lit["papers"].values())


def test_the_reason_names_where_a_claim_holds_only_in_part():
    """In part: the schemes it does not hold against, then those left undecided; only a
    disagreement asks the controls (none here: unexplained)."""
    def r(b, verdict):
        return {"test": {"a": "none", "b": b}, "verdict": verdict}

    agree_undecided = {"verdict": papers.IN_PART, "controls": [],
                       "results": [r("rope", papers.AGREES), r("alibi", papers.UNDECIDED_CLAIM)]}
    assert papers._reason(agree_undecided) == "undecided against `alibi`"
    mixed = {"verdict": papers.IN_PART, "controls": [],
             "results": [r("rope", papers.AGREES), r("alibi", papers.DISAGREES), r("t5", papers.UNDECIDED_CLAIM)]}
    assert papers._reason(mixed) == "it does not hold against `alibi`; undecided against `t5`; unexplained"
    assert papers._reason({"verdict": papers.AGREES, "controls": [], "results": []}) is None
