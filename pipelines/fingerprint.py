"""The fingerprint of every scheme of the study: one file each, which its study stage depends on.

    python -m pipelines.fingerprint --params params.yaml --out-dir results/fingerprints [--check]

First, every scheme must take every task it is listed for (``posenc.tasks.misfits``: a
causal-only scheme in a bidirectional task is refused, naming the scheme, the task and the
fix), so that a misfit stops the pipeline before any run trains. Then, for each scheme
under ``schemes:`` in the params file, writes
``<out-dir>/<scheme>.json`` (``posenc.fingerprint.scheme_fingerprint``: the
scheme's config and the digest of every function and class of the project its
class reaches), and says per scheme whether it is new, unchanged or changed and
what changed. A file whose content is unchanged is not rewritten, so
``study@<scheme>`` re-runs only when its own scheme's code or config changed;
files of schemes no longer in the study are removed. ``--check`` writes nothing
and exits 1 when a fingerprint would change: which study stages the next
``dvc repro`` re-runs for their scheme (``dvc status`` shows only that this
stage's inputs changed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from posenc.errors import ConfigError
from posenc.files import write_text
from posenc.fingerprint import changed_parts, scheme_fingerprint
from posenc.tasks import misfits

from .gather import study_schemes


def render(doc: dict) -> str:
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.fingerprint", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", default="params.yaml", help="the study's params file (its schemes: are fingerprinted)")
    p.add_argument("--out-dir", default="results/fingerprints")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a fingerprint would change")
    a = p.parse_args(argv)
    out = Path(a.out_dir)
    schemes = study_schemes(a.params)
    # every scheme takes every task it is listed for: refused here, the first stage, before any training
    params = yaml.safe_load(Path(a.params).read_text())
    try:
        refused = [m for name in schemes for m in misfits(name, str(params["schemes"][name].get("tasks", "")).split())]
    except (ConfigError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"error: {a.params}: {e}", file=sys.stderr)
        return 2
    if refused:
        print("\n".join(f"error: {m}" for m in refused), file=sys.stderr)
        return 2
    try:
        planned = plan(schemes, out)
    except SchemeError as e:
        print(f"error: scheme {e.scheme} of {a.params}: {e.__cause__}", file=sys.stderr)
        return 2
    changed = 0
    for name, (what, doc) in planned.items():
        path = out / f"{name}.json"
        if what == "unchanged":
            print(f"{name}: unchanged")
            continue
        changed += 1
        if doc is None:
            print(f"{name}: no longer in {a.params}" + ("" if a.check else f", {path} removed"))
            if not a.check:
                path.unlink()
            continue
        print(f"{name}: {what}" + ("" if a.check else f" -> {path}"))
        if not a.check:
            write_text(path, render(doc))
    return 1 if a.check and changed else 0


class SchemeError(Exception):
    """A scheme whose fingerprint cannot be computed (its config or class cannot be found or read)."""

    def __init__(self, scheme: str):
        super().__init__(f"scheme {scheme}: no fingerprint")
        self.scheme = scheme


def plan(schemes: list[str], out: Path) -> dict[str, tuple[str, dict | None]]:
    """What the stage would do with each scheme's fingerprint file under ``out``, reading only:
    {scheme: ("unchanged" | "new" | "changed: <parts>", its fingerprint)}, and for each file of a
    scheme no longer in the study ("no longer in the study", None). ``python -m pipelines.fanout
    --dry-run`` and ``python -m pipelines.status`` ask it which study stages a new or edited
    scheme makes stale, since ``dvc status`` cannot see that before this stage has run."""
    planned: dict[str, tuple[str, dict | None]] = {}
    for name in schemes:
        try:
            doc = scheme_fingerprint(name)
        except (FileNotFoundError, ValueError, ImportError, AttributeError) as e:
            raise SchemeError(name) from e
        path = out / f"{name}.json"
        old = json.loads(path.read_text()) if path.is_file() else None
        if old is not None and old.get("digest") == doc["digest"] and path.read_text() == render(doc):
            planned[name] = ("unchanged", doc)
        else:
            planned[name] = ("new" if old is None else "changed: " + ", ".join(changed_parts(old, doc) or ["file layout"]),
                             doc)
    for stale in sorted(out.glob("*.json")) if out.is_dir() else []:
        if stale.stem not in schemes:
            planned[stale.stem] = ("no longer in the study", None)
    return planned


if __name__ == "__main__":
    sys.exit(main())
