"""The retrieval summary: every scheme's exact-match grid, how fast it learned the task
and how far it attends, gathered into figures, tables and tidy files (``analysis.retrieval``).

    python -m pipelines.retrieval_summary results/retrieval/*.csv --runs results/runs/*.json \
        --reach results/reach/*.csv --extrapolation results/extrapolation/*.csv --params params.yaml \
        --out-dir figures/retrieval --md-dir figures --json results/retrieval_table.json \
        --tidy results/retrieval.csv --reach-tidy results/reach.csv --reach-json results/reach_summary.json

Writes ``<out-dir>/grid``, ``curves``, ``steps`` and ``reach`` (.png and .svg),
``<md-dir>/retrieval_table.md``, ``retrieval_steps.md`` and ``reach_table.md``, the
summary (``--json``: per scheme and length the seeds' values, their mean, sd and the
test against ``--against``, every scheme at one length a family (``analysis.stats``); per
scheme the steps to the criterion, and each scheme's place by them with its bootstrap
interval, ``ranks``), the tidy CSVs and how far each scheme attends at each multiple
(``--reach-json``: {scheme: {multiple: mean distance and entropy over layers, heads and
seeds, their sd over seeds, uniform attention's}}, ``analysis.reach.summary``).
"""

from __future__ import annotations

import argparse
import sys

import json
from pathlib import Path

from posenc.files import write_json, write_text

from .gather import per_scheme, study_schemes


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m pipelines.retrieval_summary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="results/retrieval/<scheme>.csv files of the study stages")
    p.add_argument("--runs", nargs="+", required=True,
                   help="results/runs/<scheme>.json files: the criterion step of every retrieval run")
    p.add_argument("--criterion", type=float, default=0.9,
                   help="the exact match at L the retrieval runs were trained to (figure and table labels)")
    p.add_argument("--against", default="none", help="the scheme every other is tested against at the longest length")
    p.add_argument("--margin", type=float, default=0.1,
                   help="two schemes' exact match is equivalent when it differs by less than this (a share)")
    p.add_argument("--cap", type=int, help="the step cap of the retrieval runs (default: the most steps a run trained)")
    p.add_argument("--json", required=True, help="the summary as JSON")
    p.add_argument("--reach", nargs="+", required=True, help="results/reach/<scheme>.csv files")
    p.add_argument("--extrapolation", nargs="+", required=True, help="results/extrapolation/<scheme>.csv files")
    p.add_argument("--params", help="the study's params file: its schemes only, missing ones reported")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--md-dir", required=True)
    p.add_argument("--tidy", required=True, help="every grid row in one CSV")
    p.add_argument("--reach-tidy", required=True, help="every attention distance / entropy row in one CSV")
    p.add_argument("--reach-json", required=True, help="how far each scheme attends at each multiple of L, as JSON")
    return p.parse_args(argv)


def write_reach(a: argparse.Namespace, schemes) -> tuple[str, list[Path]]:
    """How far each scheme attends: the figure, the table and the tidy rows."""
    from analysis import reach, retrieval

    reach_rows = retrieval.read_csvs(list(per_scheme(a.reach, schemes, "attention reach").values()))
    summary = reach.summary(reach_rows.to_dict("records"))
    written = retrieval.plot_reach(summary, f"{a.out_dir}/reach")
    reach_table = retrieval.reach_markdown(summary)
    written.append(write_text(f"{a.md_dir}/reach_table.md", reach_table))
    written.append(write_text(a.reach_tidy, reach_rows.sort_values(["scheme", "seed", "length", "layer", "head"]).to_csv(
        index=False, lineterminator="\n")))
    by_scheme: dict = {}
    for r in summary.to_dict("records"):
        by_scheme.setdefault(r["scheme"], {})[str(int(r["multiple"]))] = {
            k: (int(v) if k in ("length", "seeds") else float(v)) for k, v in r.items() if k not in ("scheme", "multiple")}
    written.append(write_json(a.reach_json, by_scheme))
    return reach_table, written


def write_grids(a: argparse.Namespace, schemes, every) -> tuple[dict, dict, str, str, list[Path]]:
    """The grids, the curves, the steps to the criterion and their tables, from every grid row."""
    from analysis import retrieval

    studies = [json.loads(Path(f).read_text()) for f in per_scheme(a.runs, schemes, "runs").values()]
    runs = retrieval.per_run(every, retrieval.run_records(studies))
    t = retrieval.summary(runs, a.against, a.cap, a.margin)
    chosen = retrieval.used(runs)[["scheme", "seed"]].drop_duplicates()
    grids = every[every["trials"] > 0].merge(chosen, on=["scheme", "seed"])  # the runs used, the lengths a model has
    extrapolation = retrieval.read_csvs(list(per_scheme(
        [f for f in a.extrapolation if str(f).endswith(".csv")], schemes, "extrapolation results").values()))
    written = retrieval.plot_grid(grids, f"{a.out_dir}/grid", [s for s, e in t.items() if e["marked"]])
    written += retrieval.plot_curves(t, extrapolation, f"{a.out_dir}/curves")
    criterion = f"exact match at L above {100 * a.criterion:g}%"
    written += retrieval.plot_steps(t, f"{a.out_dir}/steps", criterion)
    written.append(write_text(a.tidy, every.sort_values(["scheme", "seed", "length", "depth"]).to_csv(
        index=False, lineterminator="\n")))
    return t, retrieval.step_ranks(t), retrieval.table_markdown(t), retrieval.steps_markdown(t, criterion), written


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from analysis import retrieval

    schemes = study_schemes(a.params) if a.params else None
    reach_table, written = write_reach(a, schemes)
    files = list(per_scheme(a.results, schemes, "retrieval results").values())
    try:
        every = retrieval.read_csvs(files)
    except ValueError:  # a study without the retrieval task: its tables say so, no grid to draw
        every = None
    if every is None:
        table = steps = "No scheme of this study has retrieval runs.\n"
        t, ranks = {}, {}
        written += [write_text(a.tidy, "")]
    else:
        t, ranks, table, steps, more = write_grids(a, schemes, every)
        written += more
    written += [write_text(f"{a.md_dir}/retrieval_table.md", table), write_text(f"{a.md_dir}/retrieval_steps.md", steps),
                write_json(a.json, {"criterion": a.criterion, "against": a.against, "margin": a.margin,
                                    "ranks": ranks, "schemes": t})]
    print(table)
    print(steps)
    print(reach_table)
    print("\n".join(map(str, written)))
    return 0

if __name__ == "__main__":
    sys.exit(main())
