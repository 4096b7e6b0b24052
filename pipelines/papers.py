"""The papers stage: the study against the papers, claim by claim (``analysis.papers``), written
once for the report.

    python -m pipelines.papers --literature docs/literature.yaml --retrieval retrieval-seeds \
        --out results/papers.json

Reads the default study's tables (the LM table, its named pairs, the correlations and MiniLM),
the retrieval table of the profile ``--retrieval`` when it has results (else the default
study's), and each profile a claim's control names. Writes every claim with its tests read at
every multiple, its verdict and its reason, the tally of the claims the papers made, and the
schemes whose word-position term carries a band (``carried``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from posenc.files import write_json

from analysis import papers

from .results import ROOT, Study


def carried(correlations: dict, banded: float) -> list[dict]:
    """The schemes whose word-position term carries a band: its 95% interval over seeds
    (``analysis.papers.interval``) above ``banded``, where Ke et al. find none in BERT's."""
    out = []
    for label, e in sorted(correlations.get("schemes", {}).items()):
        term = e["terms"].get("word-position")
        ci = papers.interval(term["values"]) if term else None
        if ci and ci[0] > banded:
            out.append({"scheme": label.split()[0], "band_mean": term["band_mean"], "ci": list(ci)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.papers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--literature", default="docs/literature.yaml")
    p.add_argument("--retrieval", default="retrieval-seeds", help="the profile the retrieval claims read")
    p.add_argument("--out", default="results/papers.json")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)  # tests run it on a copy
    a = p.parse_args(argv)
    root = Path(a.root)
    literature = yaml.safe_load(Path(a.literature).read_text())
    study = Study(root)
    seeds = Study(root / "profiles" / a.retrieval, a.retrieval)
    retrieval = seeds if seeds.has("retrieval") else study
    default = SimpleNamespace(lm=study.lm, lm_pairs=study.lm_pairs, retrieval=retrieval.retrieval,
                              correlations=study.correlations, minilm=study.minilm, params=study.params)
    named = {c["study"] for claim in literature["claims"] for c in claim.get("controls", [])}
    profiles = {n: Study(root / "profiles" / n, n) for n in sorted(named)}
    profiles = {n: prof for n, prof in profiles.items() if prof.has("lm")}
    rows = papers.against_papers(literature, default, profiles)
    write_json(a.out, {"retrieval": retrieval.name, "claims": rows, "tally": papers.tally(rows),
                       "carried": carried(study.correlations, literature["band"]["banded"])})
    t = papers.tally(rows)
    print(f"wrote {a.out}: {t['claims']} claims tallied ({t['counts']}), {t['outside']} outside the tally")
    return 0


if __name__ == "__main__":
    sys.exit(main())
