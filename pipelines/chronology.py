"""The chronology stage: which analysis choices came after which results, from git.

    python -m pipelines.chronology --out results/chronology.json

For every choice of ``CHOICES`` (a table's reference, margin, named comparisons, its seeds,
the primary hypotheses) it finds, in the committed history of the file that sets it, the
commit that set its current value: walking back from the newest commit that touched the file,
the oldest of the commits in a row that all give the current value (a key may have had another
name before, ``CHOICES`` lists them; comments and other keys do not count), and the value the
commit before it gave. For every table it
finds the first commit that added one of its results files (``RESULTS``). A choice is
*before* its table's results when its commit is an ancestor of that first results commit,
*the same commit* when it is that commit, and *after* otherwise. Only committed history counts:
commit ``params.yaml`` before running this stage.

``plan`` says whether the study is confirmatory: its analysis plan (``PLAN``, a YAML file whose
``fixes`` maps params.yaml keys to the values the plan fixes: references, margins, seeds,
lengths, the primary hypotheses, the rate and the budget) is committed; params.yaml holds every
value the plan fixes; and every study stage's runs were made in a checkout whose HEAD
(``git.head`` of ``results/runs/<scheme>.json``) is the plan's last commit or comes after it. A
plan changed after the runs has a later last commit, so those runs fail the last check. Where
any check fails the study is exploratory, and the problems say why.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from posenc.files import write_json

ROOT = Path(__file__).resolve().parents[1]

#: (what, the file that sets it, its key paths: the current name first, then earlier ones, the table);
#: ``{task}`` in a key is the name of the task whose runs make the table (``pipelines.results.Study.task``)
CHOICES = (
    ("the LM table's reference", "params.yaml", ("lm_table.reference",), "lm"),
    ("the LM table's margin", "params.yaml", ("lm_table.margin",), "lm"),
    ("the LM pairs the papers read", "params.yaml", ("lm_table.pairs",), "lm"),
    ("causal-LM seeds", "params.yaml", ("tasks.{task}.seeds", "seeds"), "lm"),
    ("the masked-LM reference", "params.yaml", ("mlm_table.reference",), "mlm"),
    ("the masked-LM question", "params.yaml", ("mlm_table.question",), "mlm"),
    ("the schemes the question is tested against", "params.yaml", ("mlm_table.against",), "mlm"),
    ("the masked-LM margin", "params.yaml", ("mlm_table.margin",), "mlm"),
    ("masked-LM seeds", "params.yaml", ("tasks.{task}.seeds", "mlm.seeds", "seeds"), "mlm"),
    ("the retrieval reference", "params.yaml", ("retrieval_table.reference",), "retrieval"),
    ("the retrieval margin", "params.yaml", ("retrieval_table.margin",), "retrieval"),
    ("retrieval seeds (profile retrieval-seeds)", "profiles/retrieval-seeds/params.yaml",
     ("tasks.{task}.seeds", "retrieval.seeds"), "retrieval"),
    ("the primary hypotheses", "params.yaml", ("primary",), "lm"),
)
#: the results files of each table: the first commit that added any of them is its first results
RESULTS = {
    "lm": ("results/lm_table.json", "figures/lm_table.md", "results/extrapolation.csv"),
    "mlm": ("results/mlm_table.json", "figures/mlm_table.md"),
    "retrieval": ("results/retrieval_table.json", "figures/retrieval_table.md",
                  "profiles/retrieval-seeds/results/retrieval_table.json"),
}
MISSING = object()
#: the analysis plan of a confirmatory study, committed before its first run (``plan``)
PLAN = "plan.yaml"


def git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


def has_commit(root: Path = ROOT) -> bool:
    """Whether the project's repository has a commit (HEAD names one)."""
    return subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True).returncode == 0


def _commit(line: str) -> dict:
    sha, date, subject = line.split("\x00", 2)
    return {"sha": sha, "date": date[:10], "subject": subject}


def history(path: str, root: Path = ROOT) -> list[tuple[dict, str]]:
    """The commits that touched ``path`` (following renames), newest first, each with the
    file's path at that commit."""
    out = git("log", "--follow", "--name-only", "--format=%x01%H%x00%aI%x00%s", "--", path, root=root)
    commits = []
    for block in out.split("\x01")[1:]:
        head, *names = [x for x in block.split("\n") if x]
        commits.append((_commit(head), names[-1] if names else path))
    return commits


def lookup(doc, keys: Sequence[str]):
    """The value of the first of ``keys`` (dotted paths) the YAML document holds, or ``MISSING``."""
    for key in keys:
        node = doc
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                node = MISSING
                break
            node = node[part]
        if node is not MISSING:
            return node
    return MISSING


def value_at(sha: str, path: str, keys: Sequence[str], root: Path = ROOT):
    """The choice's value in the file as committed at ``sha`` (``MISSING`` if the file is absent)."""
    try:
        text = git("show", f"{sha}:{path}", root=root)
    except subprocess.CalledProcessError:
        return MISSING
    return lookup(yaml.safe_load(text) or {}, keys)


def set_by(path: str, keys: Sequence[str], root: Path = ROOT) -> tuple[dict | None, object, object]:
    """The commit that set the choice's current value (see the module doc), that value, and the
    value before it (``MISSING`` when the key was not there)."""
    commits = history(path, root)
    if not commits:
        return None, MISSING, MISSING
    current = value_at(commits[0][0]["sha"], commits[0][1], keys, root)
    found, before = None, MISSING
    for commit, name in commits:
        value = value_at(commit["sha"], name, keys, root)
        if current is MISSING or value != current:
            before = value
            break
        found = commit
    return found, current, before


def first_results(paths: Sequence[str], root: Path = ROOT) -> dict | None:
    """The first commit that added any of ``paths``."""
    lines = git("log", "--diff-filter=A", "--format=%H%x00%aI%x00%s", "--", *paths, root=root).splitlines()
    return _commit(lines[-1]) if lines else None


def relation(choice: dict | None, results: dict | None, root: Path = ROOT) -> str:
    """``before``, ``same commit`` or ``after`` (see the module doc); ``after`` when either is unknown."""
    if not choice or not results:
        return "after"
    if choice["sha"] == results["sha"]:
        return "same commit"
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", choice["sha"], results["sha"]], cwd=root)
    return "before" if ancestor.returncode == 0 else "after"


def resolved(keys: Sequence[str], table: str, study) -> tuple[str, ...]:
    """A choice's key paths with ``{task}`` the name of the study's task that makes ``table``."""
    return tuple(k.format(task=study.task(table)) if "{task}" in k else k for k in keys)


def chronology(root: Path = ROOT) -> dict:
    """Every table's first results and every choice's commit and relation to them."""
    from .results import Study

    if not has_commit(root):
        return {"results": {}, "choices": [], "after": 0, "of": 0}  # no committed history yet: nothing to date
    results = {table: first_results(paths, root) for table, paths in RESULTS.items()}
    choices = []
    for what, path, keys, table in CHOICES:
        if not (root / path).exists():  # a profile this project does not have
            continue
        keys = resolved(keys, table, Study((root / path).parent))
        commit, value, before = set_by(path, keys, root)
        if value is MISSING:
            continue
        choices.append({"what": what, "file": path, "key": keys[0], "value": value, "table": table, "set": commit,
                        "before": None if before is MISSING else before,
                        "relation": relation(commit, results[table], root)})
    return {"results": results, "choices": choices,
            "after": sum(c["relation"] != "before" for c in choices), "of": len(choices)}


def plan(root: Path = ROOT, params: str = "params.yaml") -> dict:
    """The analysis plan's commit and whether the study is confirmatory (the module's docstring):
    {"file", "commit" (sha, date, subject; None when not committed), "fixes" (how many keys),
    "runs" (study records checked), "confirmatory", "problems": [why not, one line each]}."""
    from .commits import is_ancestor

    out = {"file": PLAN, "commit": None, "fixes": 0, "runs": 0, "confirmatory": False, "problems": []}
    problems = out["problems"]
    if not has_commit(root):
        problems.append("the project has no commit: nothing can date a plan or a run")
        return out
    last = git("log", "-1", "--format=%H%x00%aI%x00%s", "--", PLAN, root=root).strip()
    if not last:
        problems.append(f"no analysis plan ({PLAN}) is committed")
        return out
    out["commit"] = _commit(last)
    if git("status", "--porcelain", "--", PLAN, root=root).strip():
        problems.append(f"{PLAN} has changes not committed: the plan is not the committed one")
    fixes = (yaml.safe_load(git("show", f"{out['commit']['sha']}:{PLAN}", root=root)) or {}).get("fixes") or {}
    out["fixes"] = len(fixes)
    if not fixes:
        problems.append(f"{PLAN} fixes no setting (its `fixes:` is empty)")
    settings = yaml.safe_load((root / params).read_text()) or {}
    for key, planned in fixes.items():
        value = lookup(settings, (key,))
        if value is MISSING or value != planned:
            problems.append(f"{params}'s {key} is {'not set' if value is MISSING else repr(value)}, the plan fixes "
                            f"{planned!r}")
    for scheme in settings.get("schemes") or {}:
        record = root / (Path(params).parent / "results" / "runs" / f"{scheme}.json")
        if not record.exists():
            problems.append(f"study@{scheme} has no record ({record.relative_to(root)}): its runs are not made")
            continue
        out["runs"] += 1
        head = (json.loads(record.read_text()).get("git") or {}).get("head")
        if not head or not is_ancestor(root, out["commit"]["sha"], head):
            problems.append(f"study@{scheme}'s runs were made at {head[:10] if head else 'no commit'}, not at or after "
                            f"the plan's commit {out['commit']['sha'][:10]}")
    out["confirmatory"] = not problems
    return out


def record(root: Path = ROOT) -> dict:
    """What the stage writes: the chronology and the plan's check."""
    return chronology(root) | {"plan": plan(root)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.chronology", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="results/chronology.json")
    a = p.parse_args(argv)
    out = record()
    write_json(a.out, out)
    print(f"wrote {a.out}: {out['after']} of {out['of']} choices set after (or with) their table's first results; "
          f"the study is {'confirmatory' if out['plan']['confirmatory'] else 'exploratory'}"
          + "".join(f"\n  {p}" for p in out["plan"]["problems"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
