"""The findings stage: the comparisons the report states across tables and studies
(``analysis.findings``), written once for the report, and the fairness profiles' figure.

    python -m pipelines.findings --retrieval retrieval-seeds --out results/findings.json \
        --figure figures/fairness

Reads the default study's tables, the retrieval table of the profile ``--retrieval`` (when it
has results) and the fairness profiles (``profiles/fairness-lr<rate>/``). Writes:

* ``primary``: the primary hypotheses ``params.yaml`` names, each family as the tables tested it;
* ``t5``: T5 with every bucket trained against T5 as the study runs it, the share of its excess
  ratio that training every bucket removes, and both at the fairness profiles' longer budget;
* ``flat``: the flat-perplexity schemes' exact match at the longest length, against the LM
  table's reference;
* ``fairness``: each scheme's best rate, Kendall's τ of the orderings, the default study's
  decided findings at the tuned, longer budget (direction and size against the margin), the
  ratios at both budgets and what the longer budget would cost the default study;
* ``budget``: the budget profiles (``profiles/budget-steps<n>/``) beside the fairness profile at
  their rate, each scheme's validation quality at L by steps, what doubling the steps gains, and
  the budget where that gain falls below the criterion (``analysis.findings.budget``);
* ``retrieval_rate``: the steps every scheme's retrieval run takes to the criterion at the default
  rate and at the retrieval-rate profiles' (``profiles/retrieval-lr<rate>/``, one seed), each
  scheme's best rate and whether it is interior (``analysis.findings.retrieval_rate``);
* ``power`` and ``seeds``: what each family decides with its seeds, and with fewer;
* ``ratio_and_absolute``: where the ratio and the absolute perplexity at the longest length
  give different verdicts.

The figures (.png and .svg): ``--figure``, perplexity at L against the learning rate, and
``--budget-figure``, against the steps, a line per scheme (``analysis.rates``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posenc.files import write_json

from analysis import findings

from .results import ROOT, Study


def _t5(study: Study, retrieval: Study, longer: Study | None) -> dict:
    """The bucket control (``analysis.findings.t5_control``) and, at the longer budget, each of
    the two schemes' ratio (one seed: a direction)."""
    P = study.params
    plain, variant = P["report"]["bucket_control"]["plain"], P["report"]["bucket_control"]["variant"]
    margins = {"lm": P["lm_table"]["margin"], "retrieval": P["retrieval_table"]["margin"]}
    out = {"plain": plain, "variant": variant,
           "tests": findings.t5_control(study.lm, retrieval.retrieval, study.top, margins, plain, variant)}
    ratios = {s: ((longer.lm.get(s) or {}).get("ratio_longest") or {}).get("mean") for s in (plain, variant)} \
        if longer else {}
    if ratios and all(ratios.values()) and longer.spec("lm")["steps"] > study.spec("lm")["steps"]:
        out["longer"] = {"profile": longer.name, "factor": longer.spec("lm")["steps"] / study.spec("lm")["steps"],
                         **ratios, "costs_more": ratios[variant] < ratios[plain] / (1 + margins["lm"])}
    return out


#: what a budget profile may change against the fairness profile at its rate: the steps alone
BUDGET_KEYS = ("steps", "validate_every")


def _other_keys(a: Study, b: Study, table: str, allowed) -> list[str]:
    """The keys of ``a``'s runs of ``table`` (``Study.spec``), other than ``allowed``, whose value
    differs from ``b``'s: what a profile changes beyond what its comparison allows."""
    mine, theirs = a.spec(table), b.spec(table)
    return [k for k in mine if k not in allowed and mine[k] != theirs.get(k)]


def _budget(fair: dict[str, Study], budgets: list[Study]) -> dict | None:
    """The budget block: the budget profiles (``profiles/budget-steps<n>/``, one rate) beside the
    fairness profile at their rate, by causal-LM steps (``analysis.findings.budget``); None without
    a budget profile. Refuses profiles at different rates, or one that differs from the fairness
    profile in more than its steps."""
    if not budgets:
        return None
    rates = {b.rate for b in budgets}
    if len(rates) != 1 or None in rates:
        raise SystemExit(f"the budget profiles set different learning rates ({sorted(map(str, rates))}): one curve "
                         f"needs one rate")
    rate = rates.pop()
    curve = ([fair[rate]] if rate in fair else []) + budgets
    for b in curve[1:]:
        for table in ("lm", "mlm"):
            other = _other_keys(b, curve[0], table, BUDGET_KEYS)
            if other:
                raise SystemExit(f"{b.name}: the runs of its {table} table differ from {curve[0].name}'s in {other}, "
                                 f"not in their steps alone: the budget curve compares budgets only")
    by_steps = {b.spec("lm")["steps"]: b for b in curve}
    if len(by_steps) != len(curve) or any(b.spec("mlm")["steps"] != b.spec("lm")["steps"] for b in curve):
        raise SystemExit(f"the budget curve's studies ({', '.join(b.name for b in curve)}) need one causal- and "
                         f"masked-LM budget each, and a different one from each other")
    return {**findings.budget(by_steps), "rate": rate, "profiles": {n: b.name for n, b in sorted(by_steps.items())}}


#: what a retrieval-rate profile may change against the default study's retrieval: its seeds (one
#: of the default's) and its evaluation (the steps to the criterion do not depend on it)
RATE_KEYS = ("seeds", "evaluate")


def _criterion_steps(study: Study, seeds: list[str] | None = None) -> dict[str, list[int | None]]:
    """{scheme: the steps each retrieval run of the study (of ``seeds``, else all) took to the
    criterion, None for a run that stopped at the cap}, in seed order."""
    name = study.task("retrieval")
    out = {}
    for s, record in study.runs.items():
        runs = sorted((r for r in record["runs"] if r["task"] == name and (seeds is None or str(r["seed"]) in seeds)),
                      key=lambda r: r["seed"])
        if runs:
            out[s] = [r.get("criterion_step") for r in runs]
    return out


def _retrieval_rate(study: Study, retrieval: Study, profiles: list[Study]) -> dict | None:
    """The retrieval-rate block: the steps to the criterion of one seed of every scheme at the
    rate of ``study`` (the report's retrieval study: the ten-seed profile, whose seed 0 the rate
    profiles share, at the default study's rate) and at each profile's
    (``profiles/retrieval-lr<rate>/``), and the spread over the seeds of ``retrieval`` (when it has
    more than one at that rate) (``analysis.findings.retrieval_rate``); None without such a
    profile. Refuses a profile whose retrieval differs from ``study``'s in more than its seed and
    evaluation, or that runs another seed count."""
    if not profiles:
        return None
    seed = None
    for prof in profiles:
        other = _other_keys(study, prof, "retrieval", RATE_KEYS)
        if other or len(prof.seeds("retrieval")) != 1 or prof.seeds("retrieval")[0] not in study.seeds("retrieval"):
            raise SystemExit(f"{prof.name}: its retrieval differs from the default study's in {other or 'its seeds'}: "
                             f"a rate check compares one seed the default study has, trained alike but for the rate")
        if seed not in (None, prof.seeds("retrieval")[0]):
            raise SystemExit("the retrieval-rate profiles run different seeds: the check compares one seed")
        seed = prof.seeds("retrieval")[0]
    rate = study.rate_of("retrieval")
    steps = {prof.rate_of("retrieval"): {s: v[0] for s, v in _criterion_steps(prof).items()} for prof in profiles}
    steps[rate] = {s: v[0] for s, v in _criterion_steps(study, [seed]).items()}
    spread = (_criterion_steps(retrieval) if len(retrieval.seeds("retrieval")) > 1
              and retrieval.rate_of("retrieval") == rate else None)
    out = findings.retrieval_rate(steps, study.spec("retrieval")["steps"], spread, rate)
    return {**out, "seed": int(seed), "default_rate": rate, "profiles": {p.rate_of("retrieval"): p.name for p in profiles},
            "spread_from": retrieval.name if spread else None}


def _rate_groups(profiles: list[Study]) -> dict[str, list[Study]]:
    """{rate: the profiles at that rate}, in the order given (name order: ``fairness-lr1e-2``
    before ``fairness-lr1e-2-seed1``). Profiles at one rate must differ in their seeds alone."""
    groups: dict[str, list[Study]] = {}
    for prof in profiles:
        groups.setdefault(prof.rate, []).append(prof)
    for rate, group in groups.items():
        for prof in group[1:]:
            for table in ("lm", "mlm"):
                other = _other_keys(prof, group[0], table, ("seeds",))
                if other or set(prof.seeds(table)) & set(group[0].seeds(table)):
                    raise SystemExit(f"{prof.name}: its {table} runs differ from {group[0].name}'s in "
                                     f"{other or 'nothing but shared seeds'}: the profiles at one rate add seeds")
    return groups


def _profiles(root: Path, prefix: str, table: str) -> list[Study]:
    """The profiles named ``<prefix>...`` whose results hold ``table``, in name order."""
    return [Study(d, d.name) for d in sorted((root / "profiles").glob(prefix + "*")) if (d / "results" / table).exists()]


def _fairness(study: Study, groups: dict[str, list[Study]]) -> dict | None:
    """The fairness block (see the module doc), or None without the profile at the default rate.
    ``groups``: {rate: the fairness profiles at that rate, seed 0's first}."""
    P = study.params
    rate = study.rate
    if rate not in groups:
        return None
    margins = {"lm": P["lm_table"]["margin"], "mlm": P["mlm_table"]["margin"]}
    out = findings.fairness(study, groups, rate, margins, study.rate_of("mlm"))
    profiles = {r: g[0] for r, g in groups.items()}
    one = profiles[rate]
    factor = one.spec("lm")["steps"] / study.spec("lm")["steps"]
    grid = sorted(profiles, key=float)
    edges = []
    for task, best in (("causal", out["lm_best"]), ("masked", out["mlm_best"])):
        rates = [b["rate"] for b in best.values()]
        for edge, side in ((grid[-1], "highest"), (grid[0], "lowest")):
            if rates.count(edge):
                edges.append({"task": task, "rate": edge, "side": side, "schemes": rates.count(edge), "of": len(rates)})
    up = {s: g for s, g in out["growth"].items() if g["longer"] > 1 + margins["lm"]}
    at_l, longer_at_l = findings.ppl_at_l(study), findings.ppl_at_l(one)
    fit = {s: {"default": at_l[s], "longer": longer_at_l[s]} for s in at_l if s in longer_at_l}
    lm_s = study.timing["total"]["task_s"].get(study.task("lm"), 0)
    mlm_s = study.timing["total"]["task_s"].get(study.task("mlm"), 0)
    workers = next(iter(study.timing["stages"].values()))["workers"]
    extra = (factor - 1) * (lm_s + mlm_s) / workers
    return {**out, "rate": rate, "rates": grid, "seeds_per_rate": {r: len(groups[r]) for r in grid}, "factor": factor,
            "steps": {"lm": one.spec("lm")["steps"], "mlm": one.spec("mlm")["steps"]},
            "best_counts": {task: {r: [b["rate"] for b in best.values()].count(r) for r in grid}
                            for task, best in (("lm", out["lm_best"]), ("mlm", out["mlm_best"]))},
            "edges": edges, "fit": fit, "fit_lower": sum(f["longer"] < f["default"] for f in fit.values()), "wider": [s for s, g in up.items() if g["longer"] > g["default"] * 1.1],
            "narrower": [s for s, g in up.items() if g["longer"] < g["default"] / 1.1],
            "cost": {"worker_s": lm_s + mlm_s, "workers": workers, "extra_s": extra}}


def _families(study: Study, retrieval: Study) -> dict:
    """The families whose seeds and power the report tabulates, by their name in the table."""
    P, top = study.params, study.top
    ref = P["lm_table"]["reference"]
    fams: dict = {}
    for q, what in (("ratio", "ratio ppl({k}L) / ppl(L)"), ("ppl", "ppl({k}L)")):
        ks = sorted({int(k) for e in study.lm.values() for k in ((e.get("tests") or {}).get(q) or {})})
        for k in ks if q == "ratio" else [top]:
            fams[f"LM: {what.format(k=k)} against `{ref}`"] = {
                s: e["tests"][q][str(k)] for s, e in study.lm.items() if str(k) in ((e.get("tests") or {}).get(q) or {})}
    fams[f"LM: context-extension rows against their plain scheme at {top}L (paired)"] = {
        s: e["rule"]["ratio"][str(top)] for s, e in study.lm.items() if str(top) in ((e.get("rule") or {}).get("ratio") or {})}
    fams[f"MLM: accuracy against `{study.mlm['reference']}`"] = {
        s: e["vs_reference"] for s, e in study.mlm["summary"].items() if "vs_reference" in e}
    fams[f"MLM: `{study.mlm['question']}` against the schemes named"] = study.mlm.get("tests") or {}
    where = f" (profile `{retrieval.name}`)" if retrieval is not study else ""
    for m in sorted({4, top}):
        fams[f"retrieval: exact match at {m}L against `{retrieval.retrieval['against']}`{where}"] = {
            s: e["lengths"][str(m)]["vs"] for s, e in retrieval.retrieval["schemes"].items()
            if "vs" in e["lengths"].get(str(m), {})}
    return fams


def _seeds(study: Study, retrieval: Study) -> dict:
    """How many comparisons the LM table (ratio at the longest length) and the retrieval table (at
    the longest length) decide or find equivalent with their first 3 seeds and with all."""
    P, top = study.params, study.top
    lr = {s: e["ratios"][str(top)]["values"] for s, e in study.lm.items()
          if "+" not in s and str(top) in e.get("ratios", {})}
    ex = {s: e["lengths"][str(top)]["values"] for s, e in retrieval.retrieval["schemes"].items()
          if "+" not in s and str(top) in e["lengths"]}
    out = {}
    for key, samples, ref, scale, margin, hib, n in (
            ("lm", lr, P["lm_table"]["reference"], "log", P["lm_table"]["margin"], False, len(study.seeds("lm"))),
            ("retrieval", ex, retrieval.retrieval["against"], "points", P["retrieval_table"]["margin"], True,
             len(retrieval.seeds("retrieval")))):
        rows = []
        for k in sorted({min(3, n), n}):
            v = findings.with_seeds(samples, ref, k, scale, margin, hib)["verdicts"]
            rows.append({"seeds": k, "decided": len(v["ahead"]) + len(v["behind"]) + len(v["equivalent"]),
                         "of": len(samples) - 1})
        out[key] = {"reference": ref, "rows": rows}
    return out


def _model(model: str) -> dict | None:
    """The default study's model settings (``conf/model/<name>.yaml``, with the overrides a
    profile's ``model`` adds, ``micro model.n_heads=1``): its width, layers and heads."""
    import yaml

    name, *overrides = str(model).split()
    path = ROOT / "conf" / "model" / f"{name}.yaml"
    if not path.exists():
        return None
    cfg = yaml.safe_load(path.read_text())
    for o in overrides:
        key, _, value = o.partition("=")
        cfg[key.removeprefix("model.")] = yaml.safe_load(value)
    return {k: cfg.get(k) for k in ("d_model", "n_layers", "n_heads")} | {
        "head_width": cfg["d_model"] // cfg["n_heads"] if cfg.get("n_heads") else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.findings", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--retrieval", default="retrieval-seeds", help="the profile the retrieval findings read")
    p.add_argument("--out", default="results/findings.json")
    p.add_argument("--figure", default="figures/fairness", help="the fairness figure's stem (.png and .svg)")
    p.add_argument("--budget-figure", default="figures/budget", help="the budget figure's stem (.png and .svg)")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests run it on a copy
    a = p.parse_args(argv)
    root = Path(a.root)
    study = Study(root)
    seeds = Study(root / "profiles" / a.retrieval, a.retrieval)
    retrieval = seeds if seeds.has("retrieval") else study
    groups = _rate_groups(_profiles(root, "fairness-lr", "lm_table.json"))
    fair = {r: g[0] for r, g in groups.items()}
    budgets = _profiles(root, "budget-steps", "lm_table.json")
    retrieval_rates = _profiles(root, "retrieval-lr", "retrieval_table.json")
    P, top = study.params, study.top
    fairness = _fairness(study, groups)
    families = _families(study, retrieval)
    from analysis import stats

    out = {"retrieval": retrieval.name,
           "method": {"simulate_below": stats.SIMULATE_BELOW, "draws": stats.DRAWS, "tolerance": stats.TOLERANCE},
           "primary": findings.primary(P.get("primary") or [], study.lm, study.lm_pairs, study.mlm, retrieval.retrieval),
           "t5": _t5(study, retrieval, fair.get(fairness["rate"]) if fairness else None),
           "flat": findings.flat_retrieval(study.lm, retrieval.retrieval, top, P["lm_table"]["reference"],
                                           P["lm_table"]["margin"], P["retrieval_table"]["margin"]),
           "fairness": fairness,
           "budget": (budget := _budget(fair, budgets)),
           "retrieval_rate": _retrieval_rate(retrieval, retrieval, retrieval_rates),
           "power": findings.power(families), "seeds": _seeds(study, retrieval),
           "model": _model(P["model"]),
           "ratio_and_absolute": findings.ratio_and_absolute(study.lm, top),
           "buckets": {s: {"far_mean": sum(e["bias"][e["reached"][-3]:e["reached"][-1] + 1]) / len(
               e["bias"][e["reached"][-3]:e["reached"][-1] + 1])} for s, e in (study.buckets if study.has("buckets") else {}).items()
               if e.get("unreached") and len(e.get("reached", [])) >= 3}}
    write_json(a.out, out)
    from analysis.rates import plot_budget, plot_order, plot_rates

    plot_rates(fairness["lm_best"] if fairness else {}, a.figure, fairness["steps"]["lm"] if fairness else 0,
               fairness["rate"] if fairness else None, fairness["seeds_per_rate"] if fairness else None)
    plot_budget(budget or {}, a.budget_figure, budget["rate"] if budget else None, study.spec("lm")["steps"])
    plot_order(budget or {}, f"{a.budget_figure}_order", budget["rate"] if budget else None, top)
    print(f"wrote {a.out}, {a.figure}.png, {a.budget_figure}.png and {a.budget_figure}_order.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
