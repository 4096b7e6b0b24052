"""The retrieval summary: every scheme's exact-match grid and how far it attends,
gathered into figures, tables and tidy files (``analysis.retrieval``).

    python -m pipelines.retrieval_summary results/retrieval/*.csv --reach results/reach/*.csv \
        --extrapolation results/extrapolation/*.csv --params params.yaml --out-dir figures/retrieval \
        --tidy results/retrieval.csv --reach-tidy results/reach.csv --md-dir figures

Writes ``<out-dir>/grid``, ``curves`` and ``reach`` (.png and .svg),
``<md-dir>/retrieval_table.md`` and ``reach_table.md``, and the tidy CSVs.
"""

from __future__ import annotations

import argparse
import sys

from posenc.files import write_text

from .gather import per_scheme, study_schemes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.retrieval_summary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="results/retrieval/<scheme>.csv files of the study stages")
    p.add_argument("--reach", nargs="+", required=True, help="results/reach/<scheme>.csv files")
    p.add_argument("--extrapolation", nargs="+", required=True, help="results/extrapolation/<scheme>.csv files")
    p.add_argument("--params", help="the study's params file: its schemes only, missing ones reported")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--md-dir", required=True)
    p.add_argument("--tidy", required=True, help="every grid row in one CSV")
    p.add_argument("--reach-tidy", required=True, help="every attention distance / entropy row in one CSV")
    a = p.parse_args(argv)
    from analysis import reach, retrieval

    schemes = study_schemes(a.params) if a.params else None
    every = retrieval.read_csvs(list(per_scheme(a.results, schemes, "retrieval results").values()))
    grids = every[every["trials"] > 0]  # not the lengths a model cannot represent (a learned table past L)
    reach_rows = retrieval.read_csvs(list(per_scheme(a.reach, schemes, "attention reach").values()))
    extrapolation = retrieval.read_csvs(list(per_scheme(
        [f for f in a.extrapolation if str(f).endswith(".csv")], schemes, "extrapolation results").values()))
    written = retrieval.plot_grid(grids, f"{a.out_dir}/grid")
    written += retrieval.plot_curves(grids, extrapolation, f"{a.out_dir}/curves")
    summary = reach.summary(reach_rows.to_dict("records"))
    written += retrieval.plot_reach(summary, f"{a.out_dir}/reach")
    table, reach_table = retrieval.table_markdown(grids), retrieval.reach_markdown(summary)
    written += [write_text(f"{a.md_dir}/retrieval_table.md", table),
                write_text(f"{a.md_dir}/reach_table.md", reach_table)]
    written += [write_text(a.tidy, every.sort_values(["scheme", "seed", "length", "depth"]).to_csv(
                    index=False, lineterminator="\n")),
                write_text(a.reach_tidy, reach_rows.sort_values(["scheme", "seed", "length", "layer", "head"]).to_csv(
                    index=False, lineterminator="\n"))]
    print(table)
    print(reach_table)
    print("\n".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
