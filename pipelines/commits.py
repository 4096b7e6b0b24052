"""Which commit made a study's results, recorded where they are made and checked against git.

A study stage records, beside its results (``results/runs/<scheme>.json``, ``git``), what git
says as its runs are made (``made_at``): ``commit``, the last commit that changed the study's
code or settings (``study_code``: the dependencies of the study and fingerprint stages in
``dvc.yaml``, and the study's params file) as of HEAD; ``head``, HEAD itself; and ``changed``,
the files of the study's code with changes git has not committed. The report credits
``commit`` (``pipelines.results.Study.credit``): the commit whose code made the results, never
HEAD at render time, so that a clone that renders the report again credits what the trainer
credited.

``credit_problems`` is what ``python -m pipelines.report --check`` asks of each study: every
credited commit is an ancestor of HEAD; no credited commit came after the commit that committed
the study's records (a clone that re-published at its HEAD would credit a commit that trained
nothing); a commit a study stage recorded changed the study's code; and the study run's record
(``results/mlflow_study.json``) links at least one training run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml


def git(root: Path, *args: str) -> str | None:
    """git's output in ``root`` (less its last newline), or None where git fails (not a
    checkout, an unknown commit)."""
    try:
        r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.removesuffix("\n") if r.returncode == 0 else None


def study_code(root: Path, params: str) -> list[str]:
    """The study's code and settings, as paths relative to ``root``: the dependencies of the
    ``study`` and ``fingerprint`` stages of ``root/dvc.yaml`` (the code every run goes through,
    and the schemes' own code and configs), less the results they read, with ``params``."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    deps = {d for name in ("study", "fingerprint") for d in (stages[name].get("do", stages[name]).get("deps") or [])
            if isinstance(d, str) and not d.startswith("results/")}
    return sorted(deps | {params})


def made_at(root: Path, params: str) -> dict:
    """What a study stage records of git (``commit``, ``head``, ``changed``: the module's
    docstring); every value None, and no change, outside a git checkout or before its first commit."""
    head = git(root, "rev-parse", "HEAD")
    if not head:
        return {"commit": None, "head": None, "changed": []}
    paths = study_code(root, params)
    commit = git(root, "log", "-1", "--format=%H", "HEAD", "--", *paths) or head
    status = git(root, "status", "--porcelain", "--untracked-files=all", "--", *paths) or ""
    return {"commit": commit, "head": head, "changed": sorted(line[3:] for line in status.splitlines())}


def is_ancestor(root: Path, commit: str, of: str = "HEAD") -> bool:
    """Whether ``commit`` is ``of`` or one of its ancestors."""
    return git(root, "merge-base", "--is-ancestor", commit, of) is not None


def credit_problems(root: Path, study, params: str) -> list[str]:
    """Why the commits ``study`` credits (``Study.credit``) cannot have made its results, one line
    each (the module's docstring); none when they can. ``params``: the study's params file."""
    name = "the default study" if study.name == "default" else f"profile {study.name}"
    where = study.root.relative_to(root) if study.root != root else Path(".")
    out = []
    if int(study.mlflow.get("linked_runs") or 0) == 0:
        out.append(f"{name}: {where / 'results/mlflow_study.json'} links no training run (linked_runs 0): it was "
                   f"published where the runs are not; restore the committed record (git checkout -- that file)")
    if git(root, "rev-parse", "HEAD") is None:
        return out + [f"{name}: {root} is no git checkout with a commit: the credited commits cannot be checked"]
    records = (where / "results/runs").as_posix()
    committed = None if git(root, "status", "--porcelain", "--", records) else git(root, "log", "-1", "--format=%H",
                                                                                    "--", records)
    code = study_code(root, params)
    for commit, schemes in study.credit.commits.items():
        shown = f"{name}: the credited commit {commit[:10]} ({', '.join(schemes)})"
        if not is_ancestor(root, commit):
            out.append(f"{shown} is not an ancestor of HEAD: the results were made from other code")
        elif committed and not is_ancestor(root, commit, committed):
            out.append(f"{shown} came after {committed[:10]}, the commit of its records ({records}): the credit goes "
                       "to the commit the study stages recorded, never the HEAD of a later checkout")
        elif study.credit.recorded(commit) and not git(root, "diff-tree", "--root", "-m", "--no-commit-id",
                                                          "--name-only", "-r", commit, "--", *code):  # -m: a merge too
            out.append(f"{shown} changed none of the study's code or settings ({', '.join(code[:4])}, ...)")
    return out
