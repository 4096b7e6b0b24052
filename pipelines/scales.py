"""The scales stage: how far the default study's orderings and findings move in the profiles
that change the scale or the corpus (``analysis.scales``), written once for the report.

    python -m pipelines.scales --profiles scale wikitext-bytes --retrieval retrieval-seeds \
        --kendall scale --out results/scales.json

For each profile of ``--profiles`` that has results, the comparisons the default study states
beside the same comparisons in the profile's own tables (``analysis.scales.findings``); for
each of ``--kendall``, also Kendall's τ of every table's ordering with its bootstrap interval
(``analysis.scales.kendall_tables``). The default side's retrieval is read from the profile
``--retrieval`` when it has results (it trains more retrieval seeds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from posenc.files import write_json

from analysis import scales

from .results import ROOT, Study


def samples(study: Study, retrieval: Study | None = None) -> dict:
    """Every table of ``analysis.scales.TABLES`` of a study as {scheme: per-seed values}; the
    retrieval table from ``retrieval`` when given."""
    reach_rows = pd.read_csv(study.path("results/reach.csv")).to_dict("records")
    return scales.samples(study.lm, study.mlm, (retrieval or study).retrieval, reach_rows, study.correlations, study.top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.scales", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", nargs="*", default=["scale", "wikitext-bytes"],
                   help="profiles whose findings are compared with the default study's")
    p.add_argument("--kendall", nargs="*", default=["scale"], help="profiles whose orderings are compared too")
    p.add_argument("--retrieval", default="retrieval-seeds", help="the profile the default study's retrieval is read from")
    p.add_argument("--out", default="results/scales.json")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests run it on a copy
    a = p.parse_args(argv)
    root = Path(a.root)
    study = Study(root)
    seeds = Study(root / "profiles" / a.retrieval, a.retrieval)
    retrieval = seeds if seeds.has("retrieval") else study
    out = {"retrieval": retrieval.name, "profiles": {}}
    mine = samples(study, retrieval) if a.kendall else None
    for name in a.profiles:
        prof = Study(root / "profiles" / name, name)
        if not prof.has("lm"):
            continue
        entry = {"findings": scales.findings(study, prof, retrieval)}
        if name in a.kendall:
            entry["kendall"] = scales.kendall_tables(mine, samples(prof), study.top)
        out["profiles"][name] = entry
    write_json(a.out, out)
    print(f"wrote {a.out}: {', '.join(out['profiles']) or 'no profile with results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
