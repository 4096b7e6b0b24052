"""Masked-LM results of every scheme: mean and spread over seeds.

    python -m pipelines.mlm_table runs/mlm --json results/mlm_table.json --md figures/mlm_table.md

Reads the ``metrics.json`` that training writes in each run folder (final
validation loss, perplexity over masked targets and accuracy) and writes the
table as JSON (for ``dvc metrics``) and Markdown (for the README).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .common import write_atomic, write_json


def collect(runs_dir: str | Path) -> list[dict]:
    rows = []
    for path in sorted(Path(runs_dir).glob("*/metrics.json")):
        m = json.loads(path.read_text())
        if m.get("task") != "mlm":
            continue
        rows.append({"scheme": m["encoding"], "seed": m["seed"], "ppl": m["val/ppl"], "acc": m["val/acc"],
                     "loss": m["val/loss"], "steps": m["global_step"]})
    if not rows:
        raise SystemExit(f"no masked-LM runs (metrics.json with task mlm) under {runs_dir}")
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Per scheme: mean, sample standard deviation (0 for one seed), min and max."""
    out = []
    for scheme in sorted({r["scheme"] for r in rows}):
        rs = [r for r in rows if r["scheme"] == scheme]
        entry = {"scheme": scheme, "seeds": sorted(r["seed"] for r in rs), "steps": rs[0]["steps"]}
        for key in ("ppl", "acc"):
            vals = [r[key] for r in rs]
            mean = sum(vals) / len(vals)
            sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
            entry.update({f"{key}_mean": mean, f"{key}_sd": sd, f"{key}_min": min(vals), f"{key}_max": max(vals)})
        out.append(entry)
    return sorted(out, key=lambda e: e["ppl_mean"])


def markdown(table: list[dict]) -> str:
    lines = ["| scheme | masked-token perplexity | accuracy | seeds |", "| --- | ---: | ---: | ---: |"]
    for e in table:
        lines.append(f"| `{e['scheme']}` | {e['ppl_mean']:.1f} ± {e['ppl_sd']:.1f} | "
                     f"{100 * e['acc_mean']:.2f}% ± {100 * e['acc_sd']:.2f} | {len(e['seeds'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(prog="python -m pipelines.mlm_table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir")
    p.add_argument("--json", required=True)
    p.add_argument("--md", required=True)
    a = p.parse_args(argv)
    rows = collect(a.runs_dir)
    table = summarise(rows)
    summary = {e["scheme"]: {k: v for k, v in e.items() if k != "scheme"} for e in table}
    write_json(a.json, {"summary": summary, "runs": rows})
    write_atomic(a.md, markdown(table))
    print(markdown(table))
    return table


if __name__ == "__main__":
    main()
