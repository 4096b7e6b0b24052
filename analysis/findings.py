"""The comparisons the report states that read across tables or studies, each a family with a
reference fixed before the data (``analysis.stats``): the flat-perplexity schemes' retrieval,
the controls (T5 with every bucket trained), the fairness profiles (each scheme at its best
learning rate, for 4x the steps) and what each family can decide with its seeds.

Nothing here draws or words a sentence: ``pipelines.report`` renders these results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .papers import interval
from .scales import compare as kendall_compare
from .stats import AHEAD, BEHIND, EQUIVALENT, UNDECIDED, UNTESTED, against, compare, family, tally


def ratios(lm: Mapping) -> dict[str, list[float]]:
    """ppl(longest) / ppl(L) per seed of every row of an LM table that has one."""
    return {s: list(e["ratio_longest"]["values"]) for s, e in lm.items() if e["ratio_longest"].get("values")}


def flat(values: Sequence[float], margin: float) -> bool:
    """Whether a ratio is flat: the upper end of its 95% interval over seeds at most 1 + margin
    (one seed has no interval and is never called flat)."""
    ci = interval(values)
    return ci is not None and ci[1] <= 1 + margin


def flat_schemes(lm: Mapping, margin: float) -> list[str]:
    """The schemes proper (no ``+rule`` row) whose ratio is flat, in name order."""
    return [s for s, v in sorted(ratios(lm).items()) if "+" not in s and flat(v, margin)]


def flat_retrieval(lm: Mapping, retrieval: Mapping, multiple: int, reference: str, margin: float,
                   retrieval_margin: float) -> dict:
    """Does a flat perplexity curve mean retrieval at length? The flat schemes (``flat_schemes``)
    with a retrieval row at ``multiple``, their per-seed exact match there, and each against
    ``reference`` (fixed in params: the LM table's reference, Press et al.'s flat scheme) as
    one family, when the reference is among them."""
    schemes = retrieval.get("schemes") or {}
    flats = [s for s in flat_schemes(lm, margin) if str(multiple) in (schemes.get(s) or {}).get("lengths", {})]
    values = {s: schemes[s]["lengths"][str(multiple)]["values"] for s in flats}
    tests = against(values, reference, "points", retrieval_margin) if reference in values else {}
    return {"flats": flats, "values": values, "reference": reference, "tests": tests}


def t5_control(lm: Mapping, retrieval: Mapping, top: int, margins: Mapping, plain: str = "t5_bias",
               variant: str = "t5_bias_scaled") -> dict:
    """T5 with every bucket trained (``variant``) against T5 as the study runs it (``plain``):
    the perplexity ratio (log scale) and the exact match at the longest length, one family."""
    tests = {}
    r = ratios(lm)
    if plain in r and variant in r:
        tests["ratio"] = compare(r[variant], r[plain], "log", margins["lm"]) | {"higher_is_better": False}
    cells = {s: ((retrieval.get("schemes") or {}).get(s) or {}).get("lengths", {}).get(str(top)) for s in (plain, variant)}
    if all(cells.values()):
        tests["exact"] = compare(cells[variant]["values"], cells[plain]["values"], "points", margins["retrieval"])
    return family(tests)


def power(families: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """What each family decides with its seeds: {name, seeds, m, decided, equivalent,
    undecided, untested, needed: {scheme: seeds a side its observed difference would need}}."""
    out = []
    for name, tests in families.items():
        if not tests:
            continue
        t = tally(tests)
        w = t["words"]
        out.append({"name": name, "seeds": t["seeds"], "m": t["m"], "decided": w[AHEAD] + w[BEHIND],
                    "equivalent": w[EQUIVALENT], "undecided": w[UNDECIDED], "untested": w[UNTESTED],
                    "needed": t["needed"]})
    return out


# ------------------------------------------------------------------ fairness
def ppl_at_l(study) -> dict[str, float]:
    """{scheme: validation perplexity at L, the mean over seeds} of a study's LM table (no rule rows)."""
    out = {}
    for s, e in study.lm.items():
        cell = e["lengths"].get(str(e["train_len"])) or {}
        if "+" not in s and cell.get("mean") is not None:
            out[s] = cell["mean"]
    return out


def accuracy(study) -> dict[str, float]:
    """{scheme: masked-token accuracy on validation, the mean over seeds} of a study's MLM table."""
    return {s: e["acc_mean"] for s, e in study.mlm["summary"].items()}


def best_rate(profiles: Mapping[str, object], read, lower_is_better: bool) -> dict[str, dict]:
    """Each scheme's best learning rate over the fairness profiles ({rate: Study}) by the value
    ``read`` gives per scheme (``ppl_at_l``: lower is better; ``accuracy``: higher is better):
    {scheme: {"rate", "value", "by_rate": {rate: value}}}."""
    by: dict[str, dict[str, float]] = {}
    for rate, prof in profiles.items():
        for s, v in read(prof).items():
            by.setdefault(s, {})[rate] = v
    choose = min if lower_is_better else max
    return {s: {"rate": choose(v, key=v.get), "value": choose(v.values()), "by_rate": v} for s, v in sorted(by.items())}


def fairness(default, profiles: Mapping[str, object], default_rate: str) -> dict:
    """The default study against the fairness profiles ({rate: Study}, one seed each, 4x the
    steps): Kendall's τ of every LM and MLM ordering between the default study and (a) the
    profile at the default rate (the budget alone), (b) each scheme at its best rate (the
    budget and the rate), with each scheme's best rate; and each comparison the default
    study decides, with its direction at the tuned, longer budget."""
    lm_best, mlm_best = best_rate(profiles, ppl_at_l, True), best_rate(profiles, accuracy, False)
    same = profiles[default_rate]
    tuned_ratio = {s: _ratio_of(profiles[b["rate"]], s) for s, b in lm_best.items()}
    tuned_acc = {s: [profiles[b["rate"]].mlm["summary"][s]["acc_mean"]] for s, b in mlm_best.items()}
    d_ratio, d_acc = ratios(default.lm), {s: e["acc"] for s, e in default.mlm["summary"].items()}
    d_ratio = {s: v for s, v in d_ratio.items() if "+" not in s}
    taus = {
        "lm": {"budget": kendall_compare(d_ratio, _drop_empty({s: _ratio_of(same, s) for s in d_ratio}), False),
               "tuned": kendall_compare(d_ratio, _drop_empty(tuned_ratio), False)},
        "mlm": {"budget": kendall_compare(d_acc, {s: [e["acc_mean"]] for s, e in same.mlm["summary"].items()}, True),
                "tuned": kendall_compare(d_acc, tuned_acc, True)},
    }
    findings = []
    for s, t in default.lm.items():
        c = t.get("vs_reference")
        ref = c and c["against"]
        if c and c["word"] in (AHEAD, BEHIND) and tuned_ratio.get(s) and tuned_ratio.get(ref):
            findings.append(_direction(f"LM: `{s}`'s ratio against `{ref}`'s", c, tuned_ratio[s][0] / tuned_ratio[ref][0],
                                       _ratio_of(same, s), _ratio_of(same, ref), log=True))
    for o, c in (default.mlm.get("tests") or {}).items():
        q = default.mlm["question"]
        if c["word"] in (AHEAD, BEHIND) and q in tuned_acc and o in tuned_acc:
            findings.append(_direction(f"MLM: `{q}`'s accuracy against `{o}`'s", c, tuned_acc[q][0] - tuned_acc[o][0],
                                       [same.mlm["summary"].get(q, {}).get("acc_mean")],
                                       [same.mlm["summary"].get(o, {}).get("acc_mean")], log=False))
    growth = {s: {"default": sum(v) / len(v), "longer": _ratio_of(same, s)[0]} for s, v in d_ratio.items()
              if _ratio_of(same, s)}
    return {"lm_best": lm_best, "mlm_best": mlm_best, "taus": taus, "findings": findings, "growth": growth}


def _ratio_of(study, s: str) -> list[float]:
    e = study.lm.get(s) or {}
    return list(e.get("ratio_longest", {}).get("values") or [])


def _drop_empty(d: Mapping[str, list]) -> dict:
    return {k: v for k, v in d.items() if v}


def _direction(finding: str, test: Mapping, tuned: float, same_a: Sequence, same_b: Sequence, log: bool) -> dict:
    """A decided comparison of the default study against the sign of the same difference at the
    tuned, longer budget (one seed: a direction, not a test) and at the default rate, longer."""
    neutral = 1.0 if log else 0.0
    default_up = (test["diff"] > neutral)
    budget = None
    if same_a and same_b and same_a[0] is not None and same_b[0] is not None:
        budget = (same_a[0] / same_b[0]) if log else (same_a[0] - same_b[0])
    return {"finding": finding, "word": test["word"], "diff": test["diff"], "tuned": tuned, "budget": budget,
            "holds_tuned": (tuned > neutral) == default_up, "holds_budget": None if budget is None else
            (budget > neutral) == default_up, "log": log}


def with_seeds(samples: Mapping[str, Sequence[float]], reference: str, n: int, scale: str, margin: float,
               higher_is_better: bool = True) -> dict:
    """The family ``against(samples, reference)`` redone with the first ``n`` seeds of every
    scheme (seed order): how many it would decide with fewer seeds (``tally``)."""
    return tally(against({s: list(v)[:n] for s, v in samples.items()}, reference, scale, margin, higher_is_better))


def at_length(lm: Mapping, a: str, b: str, multiple: int, margin: float) -> dict | None:
    """Perplexity at ``multiple`` x L of row ``a`` against row ``b`` (per seed, log scale, lower is
    better), a family of one; None when either lacks values there."""
    def values(s: str) -> list[float]:
        e = lm.get(s) or {}
        return list((e.get("lengths", {}).get(str(multiple * e.get("train_len", 0))) or {}).get("values") or [])

    x, y = values(a), values(b)
    if not x or not y:
        return None
    return family({a: compare(x, y, "log", margin) | {"against": b}}, higher_is_better=False)[a]
