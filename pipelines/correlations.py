"""The Ke et al. heatmaps of every scheme in one place: the overview, the band-score
table and one JSON, gathered from the per-scheme files of ``pipelines.heatmaps``.

    python -m pipelines.correlations results/correlations/*.json --params params.yaml \
        --out-dir figures/correlations --json results/correlations.json --md figures/correlations_table.md

Reads each scheme's summary (``results/correlations/<scheme>.json``) and saved
maps (its ``.npz``), draws the overview (one row per scheme, in name order) and
writes the table of every term's band score over seeds and the gathered JSON.
With ``--params``, only the study's schemes are gathered and a study scheme
without its files is reported and left out. It reads no checkpoint and writes
nothing of any one scheme: the per-scheme figures stay as their stages made them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from posenc.encodings.base import TERM_NAMES
from posenc.files import portable_path, write_json, write_text

from .gather import per_scheme, study_schemes


def band_markdown(schemes: dict[str, dict]) -> str:
    """The band score of every term, mean ± sd over seeds, one row per scheme."""
    lines = ["| scheme | " + " | ".join(TERM_NAMES) + " | seeds |", "| --- |" + " ---: |" * (len(TERM_NAMES) + 1)]
    for label, e in schemes.items():
        cells = [f"{e['terms'][t]['band_mean']:+.2f} ± {e['terms'][t]['band_sd']:.2f}" if t in e["terms"] else "—"
                 for t in TERM_NAMES]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {len(e['seeds'])} |")
    return "\n".join(lines) + "\n"


def gather(files: dict[str, Path]) -> tuple[list, dict[str, dict], dict[str, dict], int, int]:
    """(drawn maps, {run stem: summary}, {label: spread over seeds}, band width, sampling seed)
    of the per-scheme files, in scheme-name order."""
    from analysis.terms import TermMaps

    maps, models, spread, widths, seeds = [], {}, {}, set(), set()
    for scheme in sorted(files):
        doc = json.loads(files[scheme].read_text())
        maps_file = Path(doc["maps"])
        if not maps_file.is_file():
            raise SystemExit(f"error: {files[scheme]} names its maps {maps_file}, which is missing: "
                             f"`dvc repro heatmaps@{scheme}` writes both")
        maps.append(TermMaps.load(maps_file))
        models.update(doc["models"])
        spread.update(doc["schemes"])
        widths.add(doc["band_width"])
        seeds.add(doc.get("seed"))
    if len(widths) > 1 or len(seeds) > 1:
        raise SystemExit(f"error: the per-scheme summaries differ in band width {sorted(widths)} or sampling seed "
                         f"{sorted(seeds)}: re-run their heatmaps stages")
    return maps, models, spread, widths.pop(), seeds.pop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.correlations", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("summaries", nargs="+", help="results/correlations/<scheme>.json files of pipelines.heatmaps")
    p.add_argument("--params", help="the study's params file: gather its schemes only, report missing ones")
    p.add_argument("--out-dir", required=True, help="where the overview goes")
    p.add_argument("--json", required=True)
    p.add_argument("--md", help="Markdown table of the band scores over seeds")
    a = p.parse_args(argv)
    from analysis.overview import plot_overview
    from analysis.terms import summary_document

    files = per_scheme(a.summaries, study_schemes(a.params) if a.params else None, "heatmaps")
    if not files:
        raise SystemExit("error: no per-scheme heatmap summaries to gather")
    maps, models, spread, width, seed = gather(files)
    overview = plot_overview(maps, Path(a.out_dir) / "overview", width)
    doc = summary_document(models, width, seed=seed, overview=[portable_path(p) for p in overview],
                           schemes=dict(sorted(spread.items())))
    write_json(a.json, doc, allow_nan=False)
    if a.md:
        write_text(a.md, band_markdown(doc["schemes"]))
    print(f"{len(files)} schemes: {a.json}, {overview[0]}" + (f", {a.md}" if a.md else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
