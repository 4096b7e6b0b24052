"""A study's results, read as the report's templates and the summary stages ask for them:
``Study`` reads each file of ``FILES`` (one table: the name a template uses, the file it
reads) when it is first asked for, and refuses a missing file, naming it. The default study
sits at the project root, a profile under ``profiles/<name>/``. ``pipelines.report`` renders
from these; nothing here computes a statistic.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import yaml

from pipelines.pipeline import STAGES
from pipelines.stages import read_by_name
from posenc.tasks import CausalLM, MaskedLM, Retrieval, load, multipliers

ROOT = Path(__file__).resolve().parents[1]


#: a study's results files, by the name a template reads them with (``study.lm``): its params, and
#: each output its stage declares the report reads by a name (``pipelines.pipeline``)
FILES = {"params": "params.yaml", **read_by_name(STAGES)}


#: the papers' tables of ``FILES`` and the class of the task whose runs make each: the causal
#: LM's extrapolation rows, the masked LM's runs, the retrieval grid. A template asks a study for
#: a table's task (``Study.task``, ``spec``, ``seeds``) by the table, never by a task's name.
MADE_BY = {"lm": CausalLM, "mlm": MaskedLM, "retrieval": Retrieval}


def read_yaml(text: str):
    """YAML as ``yaml.safe_load`` reads it, with libyaml's parser where PyYAML has it (the
    report reads a params file per study: the pure-Python parser alone took a second)."""
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class Credit:
    """The commits credited with a study's results: ``commits`` ({commit: the schemes it made}),
    each the one the scheme's study stage recorded (``results/runs/<scheme>.json``, ``git.commit``:
    ``pipelines.commits.made_at``), or, for a record older than that field, the one the
    ``publish`` stage recorded (``results/mlflow_study.json``); ``changed``, the files of the study's
    code those stages found changed and not committed; ``shown`` and ``source``, their words."""

    def __init__(self, runs: dict[str, dict], published: dict | None):
        self.commits: dict[str, list[str]] = {}
        self._by_stage, legacy = set(), []
        changed: set[str] = set()
        for scheme, record in runs.items():
            made = record.get("git") or {}
            if made.get("commit"):
                self.commits.setdefault(made["commit"], []).append(scheme)
                self._by_stage.add(made["commit"])
                changed.update(made.get("changed") or [])
            else:
                legacy.append(scheme)
        if legacy:
            if published is None:
                raise ReportError(f"{', '.join(legacy)}: their records name no commit, and no publish record does")
            self.commits.setdefault(published["git_commit"], []).extend(legacy)
            changed.update(published.get("code_changed") or [])
        self.changed = sorted(changed)
        stages, publish = "the study stages, `results/runs/<scheme>.json`", "the `publish` stage, `results/mlflow_study.json`"
        self.source = "recorded by " + (publish if not self._by_stage else stages if not legacy else
                                        f"{stages}, and for the schemes whose records predate it by {publish}")

    def recorded(self, commit: str) -> bool:
        """Whether a study stage recorded ``commit`` (not the publish stage)."""
        return commit in self._by_stage

    @property
    def shown(self) -> str:
        """```a32a7670a1```, or each commit with the schemes it made when there are several."""
        if len(self.commits) == 1:
            return f"`{next(iter(self.commits))[:10]}`"
        return ", ".join(f"`{c[:10]}` ({', '.join(s)})" for c, s in self.commits.items())


class ReportError(Exception):
    """A result a template needs is missing, or a generated file is out of date."""


class Study:
    """The results of one study (the default one at the project root, or a profile under
    ``profiles/<name>/``): each file of ``FILES`` read when a template first asks for it."""

    def __init__(self, root: Path, name: str = "default"):
        self.root, self.name = Path(root), name

    def __getattr__(self, key: str):
        if key not in FILES:
            raise AttributeError(key)
        path = self.path(FILES[key])
        value = read_yaml(path.read_text()) if path.suffix == ".yaml" else json.loads(path.read_text())
        setattr(self, key, value)  # read once
        return value

    def path(self, rel: str) -> Path:
        p = self.root / rel
        if not p.exists():
            raise ReportError(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: no such results file "
                              f"(run the study: dvc repro)")
        return p

    def has(self, key: str) -> bool:
        return (self.root / FILES[key]).exists()

    @functools.cached_property
    def runs(self) -> dict[str, dict]:
        """{scheme: its study stage's record} for the study's schemes."""
        return {s: json.loads(self.path(f"results/runs/{s}.json").read_text()) for s in self.params["schemes"]}

    @property
    def top(self) -> int:
        """The longest evaluation length, as a multiple of L."""
        return max(m for t in self.params["tasks"].values() for m in multipliers(t["evaluate"]))

    @property
    def rate(self) -> str | None:
        """The learning rate of the study's causal-LM runs (``rate_of("lm")``)."""
        return self.rate_of("lm")

    def rate_of(self, table: str) -> str | None:
        """The learning rate of the runs that make ``table`` (lm, mlm, retrieval): ``optim.lr=<rate>``
        in their task's ``overrides``, else in the study's ``common`` overrides, as written there;
        None when both leave it to each run's config."""
        for overrides in (self.params["tasks"].get(self.task(table), {}).get("overrides") or "", self.params["common"]):
            for word in overrides.split():
                if word.startswith("optim.lr="):
                    return word[len("optim.lr="):]
        return None

    def task(self, table: str) -> str:
        """The name of the study's task whose runs make the table ``table`` (``MADE_BY``)."""
        names = [n for n in self.params["tasks"] if isinstance(load(n), MADE_BY[table])]
        if len(names) != 1:
            raise ReportError(f"{self.name} study: {len(names)} tasks of class {MADE_BY[table].__name__} "
                              f"({', '.join(names) or 'none'}) for the table {table!r}, which needs one")
        return names[0]

    def spec(self, table: str) -> dict:
        """The params entry of the task that makes ``table`` (its seeds, lengths, steps, ...)."""
        return self.params["tasks"][self.task(table)]

    def seeds(self, table: str) -> list[str]:
        """The seeds of the runs that make ``table``."""
        return str(self.spec(table)["seeds"]).split()

    def link(self, rel: str) -> str:
        """A relative link from ``docs/`` to one of this study's files (figures, tables)."""
        where = self.root.relative_to(self.root.parent.parent) if self.name != "default" else Path(".")
        return (Path("..") / where / rel).as_posix()

    def table(self, name: str) -> str:
        """A generated Markdown table (``figures/<name>.md``), as the stage wrote it."""
        return self.path(f"figures/{name}.md").read_text().rstrip("\n")

    @functools.cached_property
    def times(self) -> dict[str, dict]:
        """{stage: {started, finished, seconds}} of every stage that recorded its time."""
        folder = self.path("results/times")
        return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}

    @functools.cached_property
    def wall(self) -> dict:
        """The repro's wall time from the stages' records (``pipelines.timed.wall``)."""
        from pipelines.timed import wall

        if not self.times:
            raise ReportError(f"{self.root / 'results/times'}: no stage recorded its time")
        return wall(self.times)

    @functools.cached_property
    def machines(self) -> list[dict]:
        """The distinct machines the study stages recorded (one, when a repro made them all)."""
        seen: list[dict] = []
        for record in self.runs.values():
            m = record.get("machine")
            if m and m not in seen:
                seen.append(m)
        return seen

    @functools.cached_property
    def credit(self) -> Credit:
        """The commits credited with the results (``Credit``): what the study stages recorded."""
        if all((r.get("git") or {}).get("commit") for r in self.runs.values()):
            return Credit(self.runs, None)
        return Credit(self.runs, self.mlflow)

    @functools.cached_property
    def code(self) -> list[str]:
        """The distinct digests of the shared code the study stages recorded."""
        return sorted({(r.get("provenance") or {}).get("core", "not recorded") for r in self.runs.values()})

    @property
    def margins(self) -> dict:
        return {"lm": self.params["lm_table"]["margin"], "retrieval": self.params["retrieval_table"]["margin"]}


def studies(root: Path = ROOT) -> tuple[Study, list[Study]]:
    """The default study and the profiles that have results (``profiles/<name>/results``), less
    the trials (``trial: true`` in their params.yaml, such as ``smoke``: a try of the pipeline)."""
    profiles = [Study(p.parent, p.parent.name) for p in sorted((root / "profiles").glob("*/results"))]
    return Study(root), [p for p in profiles if not p.params.get("trial")]
