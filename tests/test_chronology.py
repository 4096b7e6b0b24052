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
    return chronology.chronology(REPO)


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
