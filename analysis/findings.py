"""The comparisons the report states that read across tables or studies (``analysis.stats``):
the flat-perplexity schemes' retrieval, the controls (T5 with every bucket trained), the
fairness profiles (each scheme at its best learning rate, for 4x the steps), what each family
can decide with its seeds, where the ratio and the absolute perplexity disagree, and the
primary hypotheses params.yaml names.

Nothing here draws or words a sentence: ``pipelines.findings`` writes these results, the
report renders them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from .papers import interval
from .scales import compare as kendall_compare
from .stats import AHEAD, BEHIND, DECIDED, EQUIVALENT, UNDECIDED, UNTESTED, against, compare, family, tally


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
    ``reference`` (the LM table's reference in params, Press et al.'s flat scheme) as one
    family, when the reference is among them."""
    schemes = retrieval.get("schemes") or {}
    flats = [s for s in flat_schemes(lm, margin) if str(multiple) in (schemes.get(s) or {}).get("lengths", {})]
    values = {s: schemes[s]["lengths"][str(multiple)]["values"] for s in flats}
    tests = against(values, reference, "points", retrieval_margin) if reference in values else {}
    return {"flats": flats, "values": values, "reference": reference, "tests": tests}


def t5_control(lm: Mapping, retrieval: Mapping, top: int, margins: Mapping, plain: str = "t5_bias",
               variant: str = "t5_bias_scaled") -> dict:
    """T5 with every bucket trained (``variant``) against T5 as the study runs it (``plain``):
    the perplexity ratio (log scale) and the exact match at the longest length, one family;
    with ``explained``, the share of ``plain``'s excess ratio over the LM table's reference
    (on the log scale) that the variant removes."""
    tests = {}
    r = ratios(lm)
    if plain in r and variant in r:
        tests["ratio"] = compare(r[variant], r[plain], "log", margins["lm"]) | {"higher_is_better": False}
    cells = {s: ((retrieval.get("schemes") or {}).get(s) or {}).get("lengths", {}).get(str(top)) for s in (plain, variant)}
    if all(cells.values()):
        tests["exact"] = compare(cells[variant]["values"], cells[plain]["values"], "points", margins["retrieval"])
    out = family(tests)
    vs = {s: (((lm.get(s) or {}).get("tests") or {}).get("ratio") or {}).get(str(top)) for s in (plain, variant)}
    if out and all(vs.values()) and vs[plain]["diff"] != 1:
        out["explained"] = {"share": 1 - math.log(vs[variant]["diff"]) / math.log(vs[plain]["diff"]),
                            "plain": vs[plain], "variant": vs[variant]}
    return out


def power(families: Mapping[str, Mapping[str, Mapping]]) -> list[dict]:
    """What each family decides with its seeds: {name, seeds, m, decided, equivalent,
    undecided, untested, needed: {scheme: seeds a side its observed difference would need}}."""
    out = []
    for name, tests in families.items():
        if not tests:
            continue
        t = tally(tests)
        v = t["verdicts"]
        out.append({"name": name, "seeds": t["seeds"], "m": t["m"], "decided": v[AHEAD] + v[BEHIND],
                    "equivalent": v[EQUIVALENT], "undecided": v[UNDECIDED], "untested": v[UNTESTED],
                    "needed": t["needed"]})
    return out


def with_seeds(samples: Mapping[str, Sequence[float]], reference: str, n: int, scale: str, margin: float,
               higher_is_better: bool = True) -> dict:
    """The family ``against(samples, reference)`` redone with the first ``n`` seeds of every
    scheme (seed order): how many it would decide with fewer seeds (``tally``)."""
    return tally(against({s: list(v)[:n] for s, v in samples.items()}, reference, scale, margin, higher_is_better))


def ratio_and_absolute(lm: Mapping, k: int) -> list[dict]:
    """The schemes whose verdict against the reference at kL differs between the ratio
    ppl(kL) / ppl(L) and the absolute perplexity at kL: [{scheme, ratio, ppl}] (the tests)."""
    out = []
    for s, e in lm.items():
        t = e.get("tests") or {}
        r, p = (t.get("ratio") or {}).get(str(k)), (t.get("ppl") or {}).get(str(k))
        if r and p and r["verdict"] != p["verdict"]:
            out.append({"scheme": s, "ratio": r, "ppl": p})
    return out


def primary(spec: Sequence[Mapping], lm: Mapping, pairs: Mapping, mlm: Mapping, retrieval: Mapping) -> list[dict]:
    """The primary hypotheses params.yaml names (``primary``), each a family the tables already
    tested, gathered: [{name, why, family, ..., tests: {label: test}}]. A family is ``lm_reference``
    (every scheme's ``quantity`` against the LM table's reference at ``multiple``), ``lm_pairs`` (the
    pairs of ``group``), ``mlm_question`` (the masked-LM question against each scheme named) or
    ``retrieval_reference`` (every scheme's exact match against the retrieval table's reference at
    ``multiple``)."""
    out = []
    for h in spec:
        kind, k = h["family"], str(h.get("multiple", ""))
        if kind == "lm_reference":
            tests = {s: t for s, e in lm.items()
                     if (t := ((e.get("tests") or {}).get(h["quantity"]) or {}).get(k))}
        elif kind == "lm_pairs":
            tests = {key: t for key, p in (pairs.get(h["group"]) or {}).items() if (t := (p.get(h["quantity"]) or {}).get(k))}
        elif kind == "mlm_question":
            tests = dict(mlm.get("tests") or {})
        elif kind == "retrieval_reference":
            tests = {s: c["vs"] for s, e in (retrieval.get("schemes") or {}).items()
                     if "vs" in (c := (e.get("lengths") or {}).get(k) or {})}
        else:
            raise ValueError(f"primary {h.get('name')!r}: family {kind!r} is not one of lm_reference, lm_pairs, "
                             "mlm_question, retrieval_reference; fix params.yaml's primary")
        out.append({**h, "tests": tests})
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


def best_rate(profiles: Mapping[str, Sequence], read, lower_is_better: bool) -> dict[str, dict]:
    """Each scheme's best learning rate over the fairness profiles ({rate: [Study, ...]}, the
    studies at a rate differing in their seed alone) by the value ``read`` gives per scheme
    (``ppl_at_l``: lower is better; ``accuracy``: higher is better), averaged over the studies of
    a rate that hold the scheme: {scheme: {"rate", "value", "by_rate": {rate: mean},
    "by_seed": {rate: [value of each study]}}}."""
    by: dict[str, dict[str, list[float]]] = {}
    for rate, studies in profiles.items():
        for prof in studies:
            for s, v in read(prof).items():
                by.setdefault(s, {}).setdefault(rate, []).append(v)
    choose = min if lower_is_better else max
    out = {}
    for s, v in sorted(by.items()):
        mean = {r: sum(x) / len(x) for r, x in v.items()}
        best = choose(mean, key=mean.get)
        out[s] = {"rate": best, "value": mean[best], "by_rate": mean, "by_seed": v}
    return out


def shared_rate(best: Mapping[str, dict], lower_is_better: bool) -> dict:
    """The one rate a study's schemes share, read off ``best_rate``'s table: the grid rate whose
    largest shortfall from any scheme's own best is least (the fair choice when the optima differ:
    no scheme is handicapped by more). A shortfall is ``value / best - 1`` where lower is better
    (perplexity: a fraction), ``best - value`` where higher is (accuracy: points); a scheme with no
    value at a rate counts as an infinite shortfall there. {"rate", "worst": {rate: {"scheme",
    "shortfall"}}}, rates in grid order; None without a scheme."""
    if not best:
        return None
    rates = sorted({r for b in best.values() for r in b["by_rate"]}, key=float)

    def short(b: dict, r: str) -> float:
        v = b["by_rate"].get(r)
        if v is None:
            return math.inf
        return v / b["value"] - 1 if lower_is_better else b["value"] - v

    worst = {}
    for r in rates:
        scheme = max(best, key=lambda s: short(best[s], r))
        worst[r] = {"scheme": scheme, "shortfall": short(best[scheme], r)}
    return {"rate": min(rates, key=lambda r: worst[r]["shortfall"]), "worst": worst}


def fairness(default, profiles: Mapping[str, Sequence], default_rate: str, margins: Mapping,
             mlm_rate: str | None = None) -> dict:
    """The default study against the fairness profiles ({rate: [Study, ...]}, one seed each, 4x the
    steps; a rate may have more than one, each a study of its own): each scheme's best rate from
    the mean over a rate's seeds (``best_rate``), and, from the first study of each rate (the one
    every rate has), Kendall's τ of every LM and MLM ordering between the default study and (a) the
    profile at the default rate (the budget alone), (b) each scheme at its best rate (the
    budget and the rate), with each scheme's best rate; each comparison the default study
    decides, with the same difference at the tuned, longer budget and at the longer budget
    alone, its direction and its size against the table's margin (``margins``: lm, mlm); and
    each scheme's ratio at both budgets (``growth``). ``default_rate``: the default study's causal-LM
    rate; ``mlm_rate``: its masked LM's, when that differs (the masked LM's longer budget alone is
    read at it, where a profile has it)."""
    lm_best, mlm_best = best_rate(profiles, ppl_at_l, True), best_rate(profiles, accuracy, False)
    profiles = {rate: studies[0] for rate, studies in profiles.items()}
    same = profiles[default_rate]
    same_mlm = profiles.get(mlm_rate or default_rate, same)
    tuned_ratio = {s: _ratio_of(profiles[b["rate"]], s) for s, b in lm_best.items()}
    for s, b in lm_best.items():
        b["tuned_ratio"] = tuned_ratio[s][0] if tuned_ratio[s] else None
    tuned_acc = {s: [profiles[b["rate"]].mlm["summary"][s]["acc_mean"]] for s, b in mlm_best.items()}
    d_ratio, d_acc = ratios(default.lm), {s: e["acc"] for s, e in default.mlm["summary"].items()}
    d_ratio = {s: v for s, v in d_ratio.items() if "+" not in s}
    taus = {
        "lm": {"budget": kendall_compare(d_ratio, _drop_empty({s: _ratio_of(same, s) for s in d_ratio}), False),
               "tuned": kendall_compare(d_ratio, _drop_empty(tuned_ratio), False)},
        "mlm": {"budget": kendall_compare(d_acc, {s: [e["acc_mean"]] for s, e in same_mlm.mlm["summary"].items()}, True),
                "tuned": kendall_compare(d_acc, tuned_acc, True)},
    }
    top = str(max(int(k) for e in default.lm.values() for k in e.get("ratios", {})))
    findings = []
    for s, e in default.lm.items():
        c = ((e.get("tests") or {}).get("ratio") or {}).get(top)
        ref = c and c["against"]
        if c and c["verdict"] in DECIDED and tuned_ratio.get(s) and tuned_ratio.get(ref):
            findings.append(_direction("ratio", s, ref, c, tuned_ratio[s][0] / tuned_ratio[ref][0],
                                       _ratio_of(same, s), _ratio_of(same, ref), margins["lm"]))
    for o, c in (default.mlm.get("tests") or {}).items():
        q = default.mlm["question"]
        if c["verdict"] in DECIDED and q in tuned_acc and o in tuned_acc:
            findings.append(_direction("accuracy", q, o, c, tuned_acc[q][0] - tuned_acc[o][0],
                                       [same_mlm.mlm["summary"].get(q, {}).get("acc_mean")],
                                       [same_mlm.mlm["summary"].get(o, {}).get("acc_mean")], margins["mlm"]))
    growth = {s: {"default": sum(v) / len(v), "longer": _ratio_of(same, s)[0]} for s, v in d_ratio.items()
              if _ratio_of(same, s)}
    return {"lm_best": lm_best, "mlm_best": mlm_best, "taus": taus, "findings": findings, "growth": growth,
            "shared": {"lm": shared_rate(lm_best, True), "mlm": shared_rate(mlm_best, False)}}


#: the budget criterion: a scheme has converged at S steps when doubling them improves its
#: validation quality at L by less than this (perplexity down, masked-LM accuracy up; a fraction)
CONVERGED = 0.02
#: the budget criterion of record: S steps suffice when doubling them leaves the order of the
#: study's primary quantity, the ratio ppl(kL) / ppl(L) at the longest length, with Kendall's τ of
#: at least this between the orders at S and at 2S (the comparison has converged, if not the models)
ORDER_TAU = 0.95


def budget(by_steps: Mapping[int, object], criterion: float = CONVERGED, order_tau: float = ORDER_TAU) -> dict:
    """The budget curve: studies trained alike but for their steps ({steps: Study}, one learning
    rate), each scheme's validation perplexity at L (causal LM, ``ppl_at_l``) and accuracy (masked
    LM, ``accuracy``) by steps, and for each budget S whose double 2S is there, the gain of
    doubling: 1 - ppl(2S) / ppl(S) for the causal LM, acc(2S) / acc(S) - 1 for the masked LM (a
    positive gain is an improvement). A scheme has converged at S when its gain from S to 2S is
    below ``criterion``; ``converged`` names the first such S (None when no doubling meets it),
    ``met`` / ``not_met`` the schemes at the largest budget whose double is there. ``tau``: for
    each doubling, Kendall's τ between the schemes' orders at S and at 2S (``analysis.scales.
    compare``; one seed a budget, so no interval) of the task's quantity, and at the top level
    (``ratio_tau``) the same for the causal LM's ratio ppl(kL) / ppl(L) at the longest length;
    ``order``: the criterion of record on it, {"criterion": ``order_tau``, "tau": {S: τ}, "at": the
    first S whose τ reaches it, or None}.
    {task: {"by_steps": {scheme: {steps: value}}, "gains": {scheme: {steps: gain}}, "tau": {S: ...},
    "converged": {scheme: S or None}, "at": S, "met": [...], "not_met": [...]}}, task "lm" / "mlm"."""
    steps = sorted(by_steps)
    doubled = [n for n in steps if 2 * n in steps]  # the budgets whose double is there
    at = doubled[-1] if doubled else None
    out: dict = {"criterion": criterion, "steps": steps}
    for task, read, lower in (("lm", ppl_at_l, True), ("mlm", accuracy, False)):
        values: dict[str, dict[int, float]] = {}
        for n in steps:
            for s, v in read(by_steps[n]).items():
                values.setdefault(s, {})[n] = v
        gains = {s: {n: (1 - v[2 * n] / v[n]) if lower else (v[2 * n] / v[n] - 1) for n in v if 2 * n in v}
                 for s, v in sorted(values.items())}
        tau = {n: kendall_compare({s: [v[n]] for s, v in values.items() if n in v},
                                  {s: [v[2 * n]] for s, v in values.items() if 2 * n in v}, not lower)
               for n in doubled}
        out[task] = {"by_steps": dict(sorted(values.items())), "gains": gains, "tau": tau,
                     "converged": {s: next((n for n in sorted(g) if g[n] < criterion), None) for s, g in gains.items()},
                     "at": at, "met": [s for s, g in gains.items() if at in g and g[at] < criterion],
                     "not_met": [s for s, g in gains.items() if at in g and g[at] >= criterion]}
    ratio = {n: {s: _ratio_of(by_steps[n], s) for s in out["lm"]["by_steps"]} for n in steps}
    out["ratio_tau"] = {n: kendall_compare(_drop_empty(ratio[n]), _drop_empty(ratio[2 * n]), False) for n in doubled}
    taus = {n: out["ratio_tau"][n]["tau"] for n in doubled}
    out["order"] = {"criterion": order_tau, "tau": taus,
                    "at": next((n for n in doubled if taus[n] is not None and taus[n] >= order_tau), None)}
    return out


def retrieval_rate(steps: Mapping[str, Mapping[str, int | None]], cap: int,
                   spread: Mapping[str, Sequence[int | None]] | None = None, spread_rate: str | None = None) -> dict:
    """Whether retrieval's learning rate is interior: ``steps`` {rate: {scheme: the steps its run
    took to the criterion, or None when it stopped at the cap ``cap`` without meeting it}} (one
    run a rate and scheme, the same seed). A run that misses the criterion counts as slower than
    any that meets it. A scheme's best rates are those with its fewest steps (validation every
    100 steps makes ties common); the best is interior when a rate below the lowest best and one
    above the highest best each took more steps (or missed), at the ``bottom`` or ``top`` edge
    when the grid has no rate beyond it. ``spread`` {scheme: steps over seeds at ``spread_rate``}
    gives the runs' own spread, against which a one-seed difference between rates is read.
    {"rates", "cap", "steps", "best": {scheme: [rates]}, "interior", "top", "bottom", "flat",
    "spread": {scheme: {"n", "min", "median", "max", "missed"}}, "elsewhere", "beyond_spread"}; ``flat``: every
    rate ties; the spread's min, median and max are over the runs that met the criterion, ``missed``
    the others; ``elsewhere``: the schemes whose best rates leave out ``spread_rate`` (none without it);
    ``beyond_spread``: those of them with a spread whose best took fewer steps than every seed at
    ``spread_rate`` (a difference reseeding alone did not make)."""
    rates = sorted(steps, key=float)
    schemes = sorted({s for by in steps.values() for s in by})
    cost = {s: {r: (steps[r][s] if steps[r][s] is not None else math.inf) for r in rates if s in steps[r]}
            for s in schemes}
    out: dict = {"rates": rates, "cap": cap, "steps": {s: {r: steps[r][s] for r in rates if s in steps[r]} for s in schemes},
                 "best": {}, "interior": [], "top": [], "bottom": [], "flat": []}
    for s, by in cost.items():
        low = min(by.values())
        best = [r for r in rates if by.get(r) == low]
        out["best"][s] = best
        if len(best) == len(by):
            out["flat"].append(s)
            continue
        lo, hi = rates.index(best[0]), rates.index(best[-1])
        below = any(by.get(r, -math.inf) > low for r in rates[:lo])
        above = any(by.get(r, -math.inf) > low for r in rates[hi + 1:])
        if below and above:
            out["interior"].append(s)
        else:
            if not above:
                out["top"].append(s)
            if not below:
                out["bottom"].append(s)
    out["spread"] = {}
    for s, runs in (spread or {}).items():
        met = sorted(v for v in runs if v is not None)
        if met:
            out["spread"][s] = {"n": len(runs), "min": met[0], "median": statistics.median(met), "max": met[-1],
                                "missed": len(runs) - len(met)}
    out["elsewhere"] = [s for s in schemes if spread_rate not in out["best"][s]] if spread_rate is not None else []
    out["beyond_spread"] = [s for s in out["elsewhere"] if s in out["spread"] and min(cost[s].values())
                            < out["spread"][s]["min"]]
    return out


def _ratio_of(study, s: str) -> list[float]:
    e = study.lm.get(s) or {}
    return list(e.get("ratio_longest", {}).get("values") or [])


def _drop_empty(d: Mapping[str, list]) -> dict:
    return {k: v for k, v in d.items() if v}


def within(value: float, margin: float, log: bool) -> bool:
    """Whether a difference (a factor when ``log``, else points) lies within the margin."""
    return 1 / (1 + margin) <= value <= 1 + margin if log else abs(value) < margin


def _direction(kind: str, a: str, b: str, test: Mapping, tuned: float, same_a: Sequence, same_b: Sequence,
               margin: float) -> dict:
    """A decided comparison of the default study (a against b, ``kind``: the LM table's "ratio" or
    the masked LM's "accuracy") beside the same
    difference at the tuned, longer budget and at the default rate, longer (one seed each: a
    direction and a size, not a test): whether each points the same way and lies within the
    table's margin."""
    log = kind == "ratio"
    neutral = 1.0 if log else 0.0
    default_up = test["diff"] > neutral
    budget = None
    if same_a and same_b and same_a[0] is not None and same_b[0] is not None:
        budget = (same_a[0] / same_b[0]) if log else (same_a[0] - same_b[0])
    return {"kind": kind, "a": a, "b": b, "verdict": test["verdict"], "diff": test["diff"], "tuned": tuned,
            "budget": budget, "log": log, "margin": margin, "holds_tuned": (tuned > neutral) == default_up,
            "tuned_within_margin": within(tuned, margin, log),
            "holds_budget": None if budget is None else (budget > neutral) == default_up,
            "budget_within_margin": None if budget is None else within(budget, margin, log)}
