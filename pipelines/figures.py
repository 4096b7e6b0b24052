"""The study's extrapolation figure and its tidy table, from the per-scheme results.

    python -m pipelines.figures results/extrapolation/*.csv --runs results/runs/*.json --params params.yaml \
        --out figures/extrapolation --tidy results/extrapolation.csv

With ``--params``, only the study's schemes are drawn and a study scheme without
its results is reported and left out. Results made with other shared code or
settings than the rest (the ``provenance`` their ``--runs`` files record) stop
the stage before anything is written. Draws ``analysis.extrapolation`` (the
Press et al. figure, ``<out>.png`` and ``.svg``) and writes every row of every
scheme, seed and length to one CSV (``--tidy``; rows whose perplexity is not
applicable, e.g. a learned table past its length, keep an empty ``ppl``).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from posenc.files import write_text

from .gather import check_provenance, per_scheme, study_schemes


def tidy(files: list[Path]) -> str:
    """The rows of every results CSV in one table, sorted by scheme, seed and length."""
    rows, fields = [], []
    for f in files:
        with open(f, newline="") as fh:
            reader = csv.DictReader(fh)
            fields = fields or list(reader.fieldnames or [])
            rows.extend(reader)
    if not rows:
        raise SystemExit("no rows in " + " ".join(map(str, files)))
    rows.sort(key=lambda r: (r.get("scheme", ""), int(r.get("seed") or 0), int(r.get("eval_len") or 0)))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.figures", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="results/extrapolation/<scheme>.csv files")
    p.add_argument("--runs", nargs="*", default=[], help="results/runs/<scheme>.json (their provenance is checked)")
    p.add_argument("--params", help="the study's params file: draw its schemes only, report missing ones")
    p.add_argument("--method", default="nonoverlapping", choices=["nonoverlapping", "sliding"])
    p.add_argument("--out", required=True, help="figure stem: writes <out>.png and <out>.svg")
    p.add_argument("--tidy", required=True, help="the tidy CSV of every row")
    p.add_argument("--reference", default="none", help="the scheme drawn in every panel: the tests' reference")
    p.add_argument("--reference-label", default="reference", help="what the legend calls the reference")
    a = p.parse_args(argv)
    from analysis.extrapolation import plot

    schemes = study_schemes(a.params) if a.params else None
    check_provenance(per_scheme(a.runs, schemes, "runs"))
    files = list(per_scheme([f for f in a.results if str(f).endswith(".csv")], schemes,
                            "extrapolation results").values())
    if not files:
        raise SystemExit("error: no extrapolation results to draw")
    fig, written = plot(files, a.out, a.method, reference=a.reference, reference_label=a.reference_label)
    write_text(a.tidy, tidy(files))
    print("\n".join(map(str, [*written, a.tidy])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
