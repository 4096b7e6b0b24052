"""How far each ranking of schemes moves between two studies (two scales): Kendall's τ
between the orderings, with a bootstrap interval over seeds, and the schemes whose
place changes by more than the spread between seeds.

A table here is ``{scheme: [one value per seed]}`` (``samples``: the LM ratio
ppl(16L) / ppl(L), masked-LM accuracy, exact match at L and 4L, attention distance at
16L, band scores). Two studies are compared over the schemes both hold:

* τ: ``scipy.stats.kendalltau`` (τ-b, which counts ties) of the schemes' means in the
  two studies; 1 is the same order, 0 no relation, −1 the reverse. Checked against
  the naive count (concordant − discordant pairs over all pairs) in ``tests/test_scales.py``.
* its interval: ``resamples`` bootstrap draws, each redrawing every scheme's seeds with
  replacement in each study (a scheme of one seed keeps its value), recomputing the
  means and τ; the 2.5 and 97.5 percentiles. It holds the spread between training
  seeds, not that of the schemes chosen.
* a scheme's place (1 = the best) in each study and its 95% bootstrap range from the
  same draws; a scheme **moves** when its two ranges do not overlap: its place changed
  by more than its seeds spread it in either study.

Nothing here draws: ``pipelines.report`` words the results (``docs/results.md``,
"Across scales").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from .stats import (AHEAD, BEHIND, EQUIVALENT, RESAMPLES, SEED, UNDECIDED, UNTESTED, draw_indices, place_rows,
                    places, resampled_means)


def kendall(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's τ-b of two paired sequences (NaN when either is constant)."""
    from scipy import stats

    return float(stats.kendalltau(a, b).statistic)


def compare(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]], higher_is_better: bool = True,
            resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """τ between the orderings of ``a`` and ``b`` ({scheme: per-seed values}) over the schemes
    both hold with a finite value, its bootstrap interval, and each scheme's places.

    Returns ``{"schemes", "n", "tau", "lo", "hi", "seeds": (seeds a scheme in a, in b; the
    fewest), "places": {scheme: {"a", "b", "a_range", "b_range", "moves"}}, "moved"}``;
    tau is None with fewer than three schemes in common. Each draw redraws a's seeds, then
    b's (``analysis.stats.draw_indices``); the τ of all draws are one call of
    ``scipy.stats.kendalltau`` along the draws' axis."""
    from scipy import stats

    common = sorted(s for s in a if s in b and len(a[s]) and len(b[s])
                    and all(math.isfinite(x) for x in list(a[s]) + list(b[s])))
    seeds = (min((len(a[s]) for s in common), default=0), min((len(b[s]) for s in common), default=0))
    if len(common) < 3:
        return {"schemes": common, "n": len(common), "tau": None, "lo": None, "hi": None, "seeds": seeds,
                "places": {}, "moved": []}
    mean_a = {s: float(np.mean(a[s])) for s in common}
    mean_b = {s: float(np.mean(b[s])) for s in common}
    rng = np.random.default_rng(seed)
    draws_a, draws_b = [], []
    for _ in range(resamples):
        draws_a.append(draw_indices(a, common, rng))
        draws_b.append(draw_indices(b, common, rng))
    da, db = resampled_means(a, common, draws_a), resampled_means(b, common, draws_b)  # (draws, schemes)
    taus = np.asarray(stats.kendalltau(da, db, axis=1).statistic, dtype=float)
    taus = taus[np.isfinite(taus)]
    ranks_a, ranks_b = place_rows(da, higher_is_better), place_rows(db, higher_is_better)
    pa, pb = places(mean_a, higher_is_better), places(mean_b, higher_is_better)
    out_places = {}
    for j, s in enumerate(common):
        ra = np.percentile(ranks_a[:, j], [2.5, 97.5])
        rb = np.percentile(ranks_b[:, j], [2.5, 97.5])
        moves = bool(ra[1] < rb[0] or rb[1] < ra[0])
        out_places[s] = {"a": pa[s], "b": pb[s], "a_range": [float(x) for x in ra],
                         "b_range": [float(x) for x in rb], "moves": moves}
    return {"schemes": common, "n": len(common), "tau": kendall([mean_a[s] for s in common], [mean_b[s] for s in common]),
            "lo": float(np.percentile(taus, 2.5)) if len(taus) else None,
            "hi": float(np.percentile(taus, 97.5)) if len(taus) else None, "seeds": seeds,
            "places": out_places, "moved": [s for s in common if out_places[s]["moves"]]}


# ------------------------------------------------------------------ the tables, from a study's results files
def lm_ratio(lm: Mapping) -> dict[str, list[float]]:
    """ppl(longest) / ppl(L) per seed of every scheme with a value (``results/lm_table.json``)."""
    return {s: list(e["ratio_longest"]["values"]) for s, e in lm.items()
            if e["ratio_longest"].get("mean") is not None and e["ratio_longest"].get("values")}


def mlm_accuracy(mlm: Mapping) -> dict[str, list[float]]:
    """Masked-token accuracy per seed (``results/mlm_table.json``)."""
    return {s: list(e["acc"]) for s, e in mlm["summary"].items()}


def retrieval_exact(table: Mapping, multiple: int) -> dict[str, list[float]]:
    """Exact match at ``multiple`` x L per seed that reached the criterion, of the schemes
    proper (no ``+rule`` rows; ``results/retrieval_table.json``)."""
    out = {}
    for s, e in table["schemes"].items():
        cell = e["lengths"].get(str(multiple))
        if "+" not in s and cell and cell.get("values"):
            out[s] = list(cell["values"])
    return out


def reach_distance(rows: Sequence[Mapping], multiple: int) -> dict[str, list[float]]:
    """Mean attention distance at ``multiple`` x L per seed: the mean over layers, heads (and
    windows) of ``results/reach.csv``'s rows, as ``analysis.reach.summary`` takes it."""
    per: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        if int(r["multiple"]) == multiple:
            per.setdefault((r["scheme"], int(r["seed"])), []).append(float(r["distance"]))
    out: dict[str, list[float]] = {}
    for (scheme, _seed), v in sorted(per.items()):
        out.setdefault(scheme, []).append(float(np.mean(v)))
    return out


def band_scores(correlations: Mapping, term: str) -> dict[str, list[float]]:
    """Band score of ``term`` per seed, keyed by the scheme's name (``results/correlations.json``)."""
    return {label.split()[0]: list(e["terms"][term]["values"]) for label, e in correlations["schemes"].items()
            if term in e["terms"]}


#: the tables compared across scales: (key, label, higher is better)
TABLES = (
    ("lm_ratio", "LM: ppl({top}L) / ppl(L)", False),
    ("mlm_accuracy", "MLM accuracy", True),
    ("retrieval_1", "retrieval exact match at L", True),
    ("retrieval_4", "retrieval exact match at 4L", True),
    ("reach_top", "attention distance at {top}L", True),
    ("band_pp", "band score, position-position", True),
    ("band_wp", "band score, word-position", True),
)


def samples(lm: Mapping, mlm: Mapping, retrieval: Mapping, reach_rows: Sequence[Mapping], correlations: Mapping,
            top: int) -> dict[str, dict[str, list[float]]]:
    """Every table of ``TABLES`` of one study: {key: {scheme: per-seed values}}."""
    return {"lm_ratio": lm_ratio(lm), "mlm_accuracy": mlm_accuracy(mlm),
            "retrieval_1": retrieval_exact(retrieval, 1), "retrieval_4": retrieval_exact(retrieval, 4),
            "reach_top": reach_distance(reach_rows, top),
            "band_pp": band_scores(correlations, "position-position"),
            "band_wp": band_scores(correlations, "word-position")}


# ------------------------------------------------------------------ does a finding hold at another scale?
def kendall_tables(a: Mapping[str, Mapping], b: Mapping[str, Mapping], top: int) -> list[dict]:
    """Kendall's τ between the orderings of two studies for every table of ``TABLES``
    (``a`` and ``b`` as ``samples`` gives them), with its bootstrap interval and the schemes
    that move (``compare``); ``top`` names the longest length in the labels."""
    return [{"key": key, "label": label.format(top=top), "resamples": RESAMPLES,
             **compare(a[key], b[key], better, resamples=RESAMPLES)} for key, label, better in TABLES]


def holds(a: Mapping, b: Mapping, names: tuple[str, str] = ("the first", "the second")) -> str:
    """Whether a comparison's verdict at one scale (``a``, a test of ``analysis.stats.family``)
    holds at another (``b``): "holds" (the same word), "reversed" (decided in opposite
    directions), "decided in <name>, equivalent in <other>" (a difference at one scale, none
    beyond the margin at the other: it depends on scale), "decided in <name> only" or
    "equivalent in <name> only" (the other scale's test cannot tell: too few seeds, or a
    spread too wide), "undecided at both"; with one seed on a side there is no test, and
    the verdict is the direction of the difference alone ("same direction, untested" or
    "other direction, untested" after a decided one, else "untested")."""
    wa, wb = a["verdict"], b["verdict"]
    decided = (AHEAD, BEHIND)
    if UNTESTED in (wa, wb):
        if wa in decided or wb in decided:
            neutral = 1.0 if a["scale"] == "log" else 0.0
            same = (a["diff"] > neutral) == (b["diff"] > neutral)
            return ("same" if same else "other") + " direction, untested"
        return "untested"
    if wa == wb:
        return "undecided at both" if wa == UNDECIDED else "holds"
    if wa in decided and wb in decided:
        return "reversed"
    if {wa, wb} <= {*decided, EQUIVALENT}:
        first, second = names if wa in decided else names[::-1]
        return f"decided in {first}, equivalent in {second}"
    first = names[0] if wb == UNDECIDED else names[1]
    return f"{'decided' if (wa if wb == UNDECIDED else wb) in decided else 'equivalent'} in {first} only"


def depends_on_scale(verdict: str) -> bool:
    """Whether a verdict of ``holds`` says the finding changes with scale: reversed, or decided
    at one scale and equivalent at the other."""
    return verdict == "reversed" or ", equivalent in " in verdict


def findings(a, b, retrieval_a=None, retrieval_b=None) -> list[dict]:
    """The comparisons the report states of study ``a`` (``pipelines.results.Study``), each with its
    verdict at ``b`` from ``b``'s own tables: every LM row against the LM reference, the masked-LM
    question against each scheme it is tested against, and retrieval against its reference at 4L
    and the longest length (read from ``retrieval_a`` / ``retrieval_b`` when given: studies with
    more retrieval seeds). [{"finding", "a", "b" (tests), "verdict"}]."""
    names = (a.name, b.name)
    rows = []

    def add(finding: str, ta, tb) -> None:
        if ta and tb:
            verdict = holds(ta, tb, names)
            rows.append({"finding": finding, "a": ta, "b": tb, "verdict": verdict, "changes": depends_on_scale(verdict),
                         "one_only": verdict.endswith(" only")})

    top = a.top

    def lm_test(study, s):
        return (((study.lm.get(s) or {}).get("tests") or {}).get("ratio") or {}).get(str(study.top))

    for s in sorted(a.lm):
        t = lm_test(a, s)
        if t and "+" not in s:
            add(f"LM: `{s}`'s ppl({top}L) / ppl(L) against `{t['against']}`'s", t, lm_test(b, s))
    q = a.mlm.get("question")
    for o, t in (a.mlm.get("tests") or {}).items():
        if b.mlm.get("question") == q:
            add(f"MLM: `{q}`'s accuracy against `{o}`'s", t, (b.mlm.get("tests") or {}).get(o))
    ra, rb = (retrieval_a or a).retrieval.get("schemes", {}), (retrieval_b or b).retrieval.get("schemes", {})
    for m in sorted({4, top}):
        for s, e in sorted(ra.items()):
            t = (e["lengths"].get(str(m)) or {}).get("vs")
            if t and "+" not in s:
                other = ((rb.get(s) or {}).get("lengths", {}).get(str(m)) or {}).get("vs")
                add(f"retrieval: `{s}`'s exact match at {m}L against `{t['against']}`'s", t, other)
    return rows
