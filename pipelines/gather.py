"""What every summary stage does with the per-scheme files it gathers: the study's
scheme list, the files present (a missing one is reported, never fatal), and the
check that they were made with the same shared code and settings.

Summaries (``tables``, ``figures``, ``correlations``) read only committed
per-scheme files (``results/runs/<scheme>.json``, ``results/extrapolation/<scheme>.csv``,
``results/correlations/<scheme>.json``) and write only their own outputs: they
never delete or rewrite another scheme's files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path


def study_schemes(params: str | Path) -> list[str]:
    """The schemes of a study: the keys under ``schemes:`` in its params file, in order."""
    import yaml

    doc = yaml.safe_load(Path(params).read_text()) or {}
    schemes = doc.get("schemes")
    if not isinstance(schemes, dict) or not schemes:
        raise SystemExit(f"{params}: no schemes: section naming the study's schemes")
    return [str(s) for s in schemes]


def per_scheme(files: Iterable[str | Path], schemes: list[str] | None, what: str) -> dict[str, Path]:
    """{scheme: file} for files named ``<scheme>.<ext>``. With ``schemes`` (the study's), a
    scheme without a file is reported on stderr and left out (the summary is built from
    what is there), and a file of a scheme outside the study is ignored, saying so."""
    found = {Path(f).name.split(".")[0]: Path(f) for f in files if Path(f).is_file()}
    if schemes is None:
        return dict(sorted(found.items()))
    for s in schemes:
        if s not in found:
            print(f"note: no {what} for scheme {s} of the study: left out of this summary "
                  f"(`dvc repro study@{s}` makes them)", file=sys.stderr)
    for s in sorted(set(found) - set(schemes)):
        print(f"note: {found[s]} belongs to no scheme of the study: ignored", file=sys.stderr)
    return {s: found[s] for s in schemes if s in found}


def check_provenance(run_files: dict[str, Path]) -> None:
    """Refuse to summarise results made with different shared code or settings.

    Every ``results/runs/<scheme>.json`` records (``provenance``) the digest of the
    shared code (``posenc.fingerprint.study_core``) and of the study's settings its
    runs were made with. Results reused from an earlier run of the study (a scheme
    added later, a stage run with ``-s``) are comparable only when both agree."""
    groups: dict[tuple, list[str]] = {}
    for scheme, path in run_files.items():
        prov = json.loads(Path(path).read_text()).get("provenance") or {}
        groups.setdefault((prov.get("core"), prov.get("settings")), []).append(scheme)
    if len(groups) <= 1:
        return
    lines = ["error: these results were made with different shared code or study settings and cannot share a table:"]
    for (core, settings), schemes in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  code {str(core)[:12]}, settings {str(settings)[:12]}: {', '.join(schemes)}")
    lines.append("Re-run the stages of the schemes made with other code (`dvc repro --force study@<scheme>`), "
                 "or return to the code and params.yaml the others were made with.")
    raise SystemExit("\n".join(lines))
