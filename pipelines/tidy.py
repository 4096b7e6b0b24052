"""Concatenate per-run extrapolation tables into one tidy CSV (for `dvc plots`).

    python -m pipelines.tidy results/extrapolation/*.csv --out results/extrapolation.csv

Rows whose perplexity is not applicable (empty, e.g. a learned table past its
length) are kept with an empty ``ppl``; ``dvc plots`` skips them.
"""

from __future__ import annotations

import argparse
import csv
import io

from posenc.files import write_text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m pipelines.tidy", description=__doc__)
    p.add_argument("files", nargs="+")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    rows, fields = [], []
    for f in sorted(a.files):
        with open(f, newline="") as fh:
            reader = csv.DictReader(fh)
            fields = fields or list(reader.fieldnames or [])
            rows.extend(reader)
    if not rows:
        raise SystemExit("no rows in " + " ".join(a.files))
    rows.sort(key=lambda r: (r.get("scheme", ""), int(r.get("seed") or 0), int(r.get("eval_len") or 0)))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    write_text(a.out, buf.getvalue())


if __name__ == "__main__":
    main()
