"""The chronology (``pipelines.chronology``): which analysis choices came after which results,
checked against git itself, not against a sentence: every choice's commit gives its current
value and the commit before it does not; every table's first results commit adds its file and
no earlier commit did; the relation is git's ancestry. The committed ``results/chronology.json``
is what git gives now, and no file of the tree says a choice was made before the data where the
chronology shows otherwise."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from pipelines import chronology

from .conftest import REPO


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def made():
    if git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.fail("the chronology needs the whole history: a shallow clone has not got it (git fetch --unshallow)")
    return chronology.record(REPO)


def _value(sha: str, path: str, keys):
    """The value a choice's keys give in the file as committed at ``sha`` (None if absent)."""
    shown = subprocess.run(["git", "show", f"{sha}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    doc = yaml.safe_load(shown.stdout) or {}
    for key in keys:
        node = doc
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return node
    return None


def test_each_choice_was_set_by_the_commit_it_names(made):
    """The value at the commit named, the same as the newest commit's; and the commit that
    touched the file before it (``git log -1 <sha>^ -- <file>``) gave another value, or none."""
    from pipelines.results import Study

    keys = {what: chronology.resolved(k, table, Study((REPO / path).parent)) for what, path, k, table in chronology.CHOICES}
    assert made["choices"] and made["of"] == len(made["choices"])
    for c in made["choices"]:
        k = keys[c["what"]]
        newest = git("log", "-1", "--format=%H", "--", c["file"]).strip()
        assert _value(c["set"]["sha"], c["file"], k) == c["value"] == _value(newest, c["file"], k), c["what"]
        earlier = git("log", "-1", "--format=%H", f"{c['set']['sha']}^", "--", c["file"]).strip()
        if earlier:
            assert _value(earlier, c["file"], k) != c["value"], c["what"]
            assert _value(earlier, c["file"], k) == c["before"], c["what"]


def test_each_tables_first_results_are_the_first_commit_that_added_them(made):
    for table, paths in chronology.RESULTS.items():
        first = made["results"][table]
        added = git("show", "--format=", "--name-only", "--diff-filter=A", first["sha"]).split()
        assert set(added) & set(paths), table
        assert git("log", "--diff-filter=A", "--format=%H", f"{first['sha']}^", "--", *paths).strip() == "", table


def test_the_relation_is_gits_ancestry(made):
    for c in made["choices"]:
        r = made["results"][c["table"]]
        ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", c["set"]["sha"], r["sha"]], cwd=REPO)
        want = "same commit" if c["set"]["sha"] == r["sha"] else "before" if ancestor.returncode == 0 else "after"
        assert c["relation"] == want, c["what"]


def test_the_committed_chronology_is_what_git_gives(made):
    assert json.loads((REPO / "results" / "chronology.json").read_text()) == json.loads(json.dumps(made))


UNSUPPORTED = ("before the data", "named before", "fixed before", "before any data", "chosen before")


def test_no_file_claims_a_choice_before_the_data_that_the_chronology_does_not_support(made):
    """Where any choice came after its table's first results, no tracked file (docs, README,
    params, templates, the literature file, code) says the choices were made before the data."""
    if all(c["relation"] == "before" for c in made["choices"]):
        pytest.skip("every choice preceded its table's results: the phrase would be true")  # not so today
    pattern = "|".join(UNSUPPORTED)
    found = subprocess.run(["git", "grep", "-n", "-i", "-E", pattern, "--", ".", ":!tests/test_chronology.py"],
                           cwd=REPO, capture_output=True, text=True).stdout
    assert found == ""


def _repo(tmp_path):
    """A project in a git repository of its own, two schemes, nothing committed yet."""
    def run(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                              capture_output=True, text=True).stdout.strip()

    run("init", "-q")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"schemes": {"a": {}, "b": {}}, "lm_table": {"reference": "a", "margin": 0.05}}))
    return run


def _commit(run, message: str) -> str:
    run("add", "-A")
    run("commit", "-qm", message)
    return run("rev-parse", "HEAD")


def _records(root, head: str) -> None:
    """Both study stages' records, as made in a checkout at ``head`` (``pipelines.commits.made_at``)."""
    (root / "results" / "runs").mkdir(parents=True, exist_ok=True)
    for s in ("a", "b"):
        (root / "results" / "runs" / f"{s}.json").write_text(json.dumps({"git": {"head": head, "commit": head}}))


def test_a_study_is_confirmatory_only_with_a_plan_committed_before_every_run_and_held_by_params(tmp_path):
    """``plan``: checked against the git history of a project made here. No plan: exploratory.
    A plan committed, then runs made after it: confirmatory. The plan changed after the runs, a
    run made before it, a planned setting params.yaml no longer holds, a plan edited and not
    committed: each makes the study exploratory, and says so."""
    run = _repo(tmp_path)
    start = _commit(run, "the project")
    _records(tmp_path, start)
    none = chronology.plan(tmp_path)
    assert not none["confirmatory"] and none["commit"] is None and "no analysis plan" in none["problems"][0]

    (tmp_path / chronology.PLAN).write_text(yaml.safe_dump({"fixes": {"lm_table.reference": "a",
                                                                      "lm_table.margin": 0.05}}))
    planned = _commit(run, "the plan")
    before = chronology.plan(tmp_path)  # the records are still those made at the first commit
    assert not before["confirmatory"] and before["commit"]["sha"] == planned and before["fixes"] == 2
    assert before["problems"] == [(f"study@{s}'s runs were made at {start[:10]}, not at or after the plan's commit "
                                   f"{planned[:10]}") for s in ("a", "b")]

    _records(tmp_path, planned)  # the study run at the plan's commit, its records committed after it
    _commit(run, "the study")
    good = chronology.plan(tmp_path)
    assert good["confirmatory"] and good["problems"] == [] and good["runs"] == 2

    (tmp_path / "params.yaml").write_text(yaml.safe_dump(
        {"schemes": {"a": {}, "b": {}}, "lm_table": {"reference": "b", "margin": 0.05}}))
    moved = chronology.plan(tmp_path)
    assert not moved["confirmatory"] and moved["problems"] == ["params.yaml's lm_table.reference is 'b', the plan "
                                                               "fixes 'a'"]
    run("checkout", "--", "params.yaml")

    (tmp_path / chronology.PLAN).write_text(yaml.safe_dump({"fixes": {"lm_table.reference": "a"}}))
    assert "plan.yaml has changes not committed" in chronology.plan(tmp_path)["problems"][0]
    changed = _commit(run, "the plan changed after the runs")
    late = chronology.plan(tmp_path)
    assert not late["confirmatory"] and late["commit"]["sha"] == changed
    assert all(p.startswith(("study@a", "study@b")) and changed[:10] in p for p in late["problems"])


def test_the_study_of_record_ran_after_its_plan(made):
    """The default study is confirmatory, checked against git (``chronology.plan``): plan.yaml is
    committed and unchanged since, params.yaml holds every value it fixes, and the HEAD recorded
    by every study stage's runs is the plan's last commit or a descendant of it. The plan fixes
    fresh seeds: none of them was used by a run of an earlier commit's study (the seeds of every
    earlier params.yaml's tasks, from git)."""
    plan = made["plan"]
    assert plan["confirmatory"], plan["problems"]
    assert plan["runs"] == len(yaml.safe_load((REPO / "params.yaml").read_text())["schemes"])
    fixes = yaml.safe_load((REPO / chronology.PLAN).read_text())["fixes"]
    planned = set().union(*(str(fixes[f"tasks.{t}.seeds"]).split() for t in ("lm", "mlm", "retrieval")))
    assert planned and all(int(s) >= 100 for s in planned)

    def seeds(node) -> set[str]:  # every `seeds:` value of a params file, in any of its past layouts
        if isinstance(node, dict):
            return set().union(set(str(node["seeds"]).split()) if "seeds" in node else set(),
                               *(seeds(v) for k, v in node.items() if k != "seeds"))
        return set()

    earlier = git("log", "--format=%H", f"{plan['commit']['sha']}^", "--", "params.yaml").split()
    assert earlier  # the exploratory study's history is there to check
    for sha in earlier:
        used = seeds(yaml.safe_load(git("show", f"{sha}:params.yaml")) or {})
        assert not used & planned, (sha[:10], used & planned)
