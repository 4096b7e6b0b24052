"""The results report (pipelines.report): rendered from the committed results, it quotes
them (a changed value changes the sentence and the table that quote it), a result a
template names that does not exist fails it, ``--check`` names the first line that
differs from what the results give, and the report only renders: no template calls a
function that computes a statistic, and rendering imports no statistics library."""

from __future__ import annotations

import json
import shutil

import pytest
from scipy import stats

from pipelines import report

from .conftest import REPO

#: what the report reads, relative to the project root
INPUTS = ("params.yaml", "README.md", "docs/templates", "docs/literature.yaml", "docs/measured", "docs/results.md",
          "docs/profiles", "results", "figures", "profiles")


def _skipped(folder, names):
    """Left out of the copy: a profile's training runs (profiles/<name>/runs) and images."""
    from pathlib import Path

    in_profile = Path(folder).parent.name == "profiles"
    return [n for n in names if (n == "runs" and in_profile) or n.endswith((".npz", ".png", ".svg"))]


def project_copy(tmp_path):
    """The report's inputs and outputs as committed, in a folder of their own."""
    for rel in INPUTS:
        src, dst = REPO / rel, tmp_path / rel
        if src.is_dir():
            shutil.copytree(src, dst, ignore=_skipped)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return tmp_path


def test_the_committed_report_and_readme_blocks_are_what_the_results_give():
    """What CI runs: the committed docs/results.md and README.md blocks equal a fresh rendering."""
    assert report.main(["--check"]) == 0


def test_a_changed_result_changes_the_sentence_and_the_table_that_quote_it(tmp_path):
    """A changed result: the report quotes it as it is in its file, and the papers stage, run
    again on it, carries it into the claim that reads it (the report computes nothing itself)."""
    from pipelines import papers

    root = project_copy(tmp_path)
    before = report.render(root)[report.REPORT]
    minilm = root / "results" / "pretrained_minilm.json"
    doc = json.loads(minilm.read_text())
    terms = doc["models"]["minilm_l6_v2"]["terms"]
    old = terms["position-position"]["band_score"]
    terms["position-position"]["band_score"] = 9.87
    minilm.write_text(json.dumps(doc))
    assert papers.main(["--root", str(root), "--literature", str(root / "docs" / "literature.yaml"),
                        "--out", str(root / "results" / "papers.json")]) == 0
    after = report.render(root)[report.REPORT]
    row = next(line for line in after.splitlines() if line.startswith("| position-position |"))
    assert row.endswith("| +9.87 |")
    assert "all-MiniLM-L6-v2 +9.87" in after and f"all-MiniLM-L6-v2 {old:+.2f}" in before
    changed = [a for a, b in zip(after.splitlines(), before.splitlines()) if a != b]
    assert len(changed) == 2  # the table row and the row of Ke et al.'s claim, nothing else


def _retrieval_file(root):
    """The retrieval summary the report reads: the seeds profile's when it has results."""
    path = root / "profiles" / "retrieval-seeds" / "results" / "retrieval_table.json"
    return path if path.exists() else root / "results" / "retrieval_table.json"


def _plant(root, none: list[float], zero_seeds: int) -> dict:
    """Plant the case a reviewer found worded "level with": at the longest length, NoPE's seeds
    ``none`` and sinusoidal at 0% in ``zero_seeds`` seeds; the family of that length is
    recomputed as the summary stage computes it (``analysis.stats.against``), and the table the
    report includes written again from it (``analysis.retrieval.table_markdown``)."""
    from analysis.retrieval import table_markdown
    from analysis.stats import against

    path = _retrieval_file(root)
    doc = json.loads(path.read_text())
    top = str(max(int(m) for e in doc["schemes"].values() for m in e["lengths"]))
    cells = {s: e["lengths"][top] for s, e in doc["schemes"].items() if top in e["lengths"]}
    cells["none"].update(values=none, mean=sum(none) / len(none), n=len(none))
    cells["sinusoidal"].update(values=[0.0] * zero_seeds, mean=0.0, sd=0.0, n=zero_seeds)
    for s, c in cells.items():
        c.pop("vs", None)
        c["values"] = c["values"] if s in ("none", "sinusoidal") else c["values"][:1] * len(none)
    for s, t in against({s: c["values"] for s, c in cells.items()}, doc["against"], "points", doc["margin"]).items():
        cells[s]["vs"] = t
    path.write_text(json.dumps(doc))
    (path.parent.parent / "figures" / "retrieval_table.md").write_text(table_markdown(
        {s: {**e, "lengths": {int(m): c for m, c in e["lengths"].items()}} for s, e in doc["schemes"].items()}))
    return cells["sinusoidal"]["vs"]


def test_the_planted_case_is_never_called_level(tmp_path):
    """NoPE at 76, 20 and 46% against sinusoidal at 0% in three seeds: the report words it
    *undecided* and says that no gap within the possible range is detectable, never "level
    with" or "equivalent"; with ten seeds as spread as NoPE's, it says sinusoidal retrieves less."""
    root = project_copy(tmp_path)
    t = _plant(root, [0.76, 0.20, 0.46], 3)
    text = report.render(root)[report.REPORT]
    assert t["verdict"] == "undecided" and "level with" not in text
    line = next(x for x in text.splitlines() if x.startswith("undecided: ") and "`sinusoidal` (0%" in x)
    assert "`sinusoidal` (0% ± 0; no gap within the possible range is detectable)" in line
    sin_row = next(x for x in text.splitlines() if x.startswith("| `sinusoidal` |") and "pt (" in x)
    assert sin_row.endswith("| undecided (detects no gap in range) |")
    root = project_copy(tmp_path / "ten")
    t = _plant(root, [0.76, 0.20, 0.46, 0.62, 0.35, 0.55, 0.28, 0.70, 0.41, 0.52], 10)
    assert t["verdict"] == "behind"
    text = report.render(root)[report.REPORT]
    assert any(x.startswith("`sinusoidal` (0% ± 0)") and x.endswith("retrieve less;") for x in text.splitlines())


def test_the_words_of_every_table_row_are_those_of_its_test():
    """No row of the LM, MLM or retrieval table says a verdict its test did not give: each
    verdict cell is ``analysis.stats.verdict_cell`` of the test the results file holds (the LM
    table's every test, by length, on the ratio and on the perplexity)."""
    from analysis.stats import verdict_cell

    text = report.render(REPO)[report.REPORT]
    lm = json.loads((REPO / "results" / "lm_table.json").read_text())
    for s, e in lm.items():
        for k, t in (e.get("tests") or {}).get("ratio", {}).items():
            label = "L" if k == "1" else f"{k}L"
            row = next(x for x in text.splitlines() if x.startswith(f"| `{s}` | `{t['against']}` | {label} |"))
            ppl = e["tests"]["ppl"][k]
            assert f"| {verdict_cell(t)} |" in row and row.endswith(f"| {verdict_cell(ppl)} |"), (s, k)
    mlm = json.loads((REPO / "results" / "mlm_table.json").read_text())
    for s, e in mlm["summary"].items():
        if "vs_reference" in e:
            row = next(x for x in text.splitlines() if x.startswith(f"| `{s}` |") and "% ±" in x)
            assert row.endswith(f"| {verdict_cell(e['vs_reference'])} |"), s
    assert "level with" not in text


def test_a_missing_result_fails_the_report_naming_it(tmp_path, capsys):
    root = project_copy(tmp_path)
    (root / "results" / "lm_table.json").unlink()
    assert report.main(["--root", str(root)]) == 1
    assert "results/lm_table.json: no such results file" in capsys.readouterr().err
    root = project_copy(tmp_path / "again")
    template = root / "docs" / "templates" / "results.md.j2"
    template.write_text(template.read_text() + "\n{{ study.lm.alibi.no_such_number }}\n")
    assert report.main(["--root", str(root)]) == 1
    assert "no_such_number" in capsys.readouterr().err


def test_check_names_the_first_difference_and_rendering_mends_it(tmp_path, capsys):
    root = project_copy(tmp_path)
    path = root / report.REPORT
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if line.startswith("| day |"))
    lines[n] = "| day | 1999-01-01 |"
    path.write_text("\n".join(lines) + "\n")
    assert report.main(["--root", str(root), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"docs/results.md:{n + 1}: committed '| day | 1999-01-01 |'" in err
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("<!-- end generated -->", "a hand-typed 99%\n<!-- end generated -->", 1))
    assert report.main(["--root", str(root)]) == 0
    assert report.main(["--root", str(root), "--check"]) == 0
    assert "hand-typed" not in readme.read_text()


def test_every_generated_file_and_block_starts_with_the_stamp():
    rendered = report.render(REPO)
    assert rendered[report.REPORT].startswith(report.STAMP)
    pages = [rel for rel in rendered if rel.startswith(report.PROFILES + "/")]
    assert pages and all(rendered[rel].startswith(report.STAMP) for rel in pages)
    block = rendered[report.README].split("<!-- generated: summary -->\n", 1)[1]
    assert block.startswith(report.STAMP)


def test_every_committed_profile_pipeline_is_made_from_the_current_dvc_yaml():
    from pipelines import profile

    assert profile.main(["--check"]) == 0


def test_a_profile_pipeline_writes_under_its_folder_and_leaves_out_what_it_does_not_change():
    """The profile's pipeline, made from the project's: every stage at the project root with the
    profile's params, every output (results, figures, stage records, runs) under its folder, its
    MLflow runs in an experiment of its own, no benchmark, MiniLM or report stage."""
    import yaml

    from pipelines import profile

    made = yaml.safe_load(profile.render("demo"))
    stages = made["stages"]
    assert set(stages) == set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]) - set(profile.LEFT_OUT)
    for name, spec in stages.items():
        body = spec.get("do", spec)
        assert body["wdir"] == "../.."
        for out in body.get("outs", []) + body.get("metrics", []):
            path = next(iter(out)) if isinstance(out, dict) else out
            assert path.startswith("profiles/demo/"), (name, path)
        for p in body.get("params", []):
            assert set(p) == {"profiles/demo/params.yaml"}, (name, p)
        assert " results/" not in body["cmd"] and " figures/" not in body["cmd"] and "figures/bench" not in body["cmd"]
    study = stages["study"]["do"]["cmd"]
    assert "--runs-dir profiles/demo/runs/${key}" in study and "logger.experiment_name=posenc-study-demo" in study
    assert "--params profiles/demo/params.yaml" in stages["tables"]["cmd"]
    assert "pretrained" not in stages["publish"]["cmd"] and "--experiment posenc-study-demo" in stages["publish"]["cmd"]
    assert all(p.startswith("profiles/demo/figures/") for p in made["plots"])


def test_a_trial_profile_is_left_out_of_the_report_and_its_summaries(tmp_path, capsys, monkeypatch):
    """A profile whose params.yaml says ``trial: true`` (``smoke``) is no study to report:
    ``pipelines.results.studies`` leaves it out (the report's pages, the summaries that read the
    profiles), and ``python -m pipelines.profile`` runs none of the summaries after its repro."""
    import yaml

    from pipelines import profile
    from pipelines.results import studies

    for name, params in (("kept", "common: ''\n"), ("trial", "common: ''\ntrial: true\n")):
        (tmp_path / "profiles" / name / "results").mkdir(parents=True)
        (tmp_path / "profiles" / name / "params.yaml").write_text(params)
    assert [p.name for p in studies(tmp_path)[1]] == ["kept"]

    smoke = yaml.safe_load((REPO / "profiles/smoke/params.yaml").read_text())
    assert smoke["trial"] is True
    project = tmp_path / "project"  # the profile's pipeline is written here, not into the checkout
    (project / "profiles/smoke").mkdir(parents=True)
    shutil.copy(REPO / "profiles/smoke/params.yaml", project / "profiles/smoke/params.yaml")
    calls = []
    monkeypatch.setattr(profile, "ROOT", project)
    monkeypatch.setattr(profile.subprocess, "call", lambda cmd, **kw: calls.append(cmd) or 0)
    monkeypatch.setattr(profile, "render", lambda name, root=None: "stages: {}\n")
    assert profile.main(["smoke"]) == 0
    assert calls == [["dvc", "repro", "profiles/smoke/dvc.yaml"]], calls
    assert "leave it out" in capsys.readouterr().out
    ignored = (REPO / ".gitignore").read_text().splitlines()
    assert {"profiles/smoke/results/", "profiles/smoke/figures/"} <= set(ignored)


def test_flat_schemes_are_compared_with_the_fixed_reference_after_holm():
    """``analysis.findings.flat_retrieval``: only schemes whose perplexity ratio is flat (upper
    95% bound at most 1 + margin) and that have a retrieval row at the length take part; each
    is tested against the reference fixed in params (never the best of them), Holm over them."""
    from analysis.findings import flat_retrieval
    from analysis.stats import against

    flat_ratio = {"ratio_longest": {"values": [1.0, 1.01, 0.99]}}
    lm = {"a": flat_ratio, "b": flat_ratio, "c": flat_ratio, "steep": {"ratio_longest": {"values": [2.0, 2.5, 3.0]}},
          "no_row": flat_ratio}

    def row(v):
        return {"lengths": {"16": {"values": v}}}

    t = {"schemes": {"a": row([0.9, 0.85, 0.95]), "b": row([0.5, 0.55, 0.45]), "c": row([0.8, 0.7, 0.9]),
                     "steep": row([0.0, 0.0, 0.1])}}
    f = flat_retrieval(lm, t, 16, "b", 0.05, 0.1)
    assert f["flats"] == ["a", "b", "c"] and f["reference"] == "b"
    assert f["tests"] == against({s: t["schemes"][s]["lengths"]["16"]["values"] for s in "abc"}, "b", "points", 0.1)
    assert f["tests"]["a"]["m"] == 2 and f["tests"]["a"]["verdict"] == "ahead"
    assert flat_retrieval(lm, t, 16, "steep", 0.05, 0.1)["tests"] == {}  # the reference is not flat: no family


def test_docs_that_quote_counts_of_runs_are_checked(tmp_path):
    """``--check`` also fails when a page of docs/ quotes a count of runs or seeds that the
    params no longer give (``quoted_counts``)."""
    root = project_copy(tmp_path)
    assert report.quoted_counts(root) == []
    page = root / "docs" / "reproduce.md"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("It trains 45 retrieval runs (15 schemes × 3 seeds).\n")
    wrong = report.quoted_counts(root)
    assert len(wrong) == 1 and "45 retrieval runs" in wrong[0]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation but hyphens dropped,
    spaces to hyphens."""
    import re

    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_report_opens_with_the_summary_and_its_contents_lead_to_every_section():
    """results.md opens with the summary table (a row per scheme of the study), then its
    contents, whose every link is a heading of the page; every profile with results (but a trial,
    such as smoke) has a page of its own, linked from results.md and from the README."""
    import re

    import yaml

    rendered = report.render(REPO)
    text = rendered[report.REPORT]
    headings = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]
    assert headings[1:3] == ["Summary", "Contents"]
    summary = text.split("## Summary", 1)[1].split("## Contents", 1)[0]
    schemes = yaml.safe_load((REPO / "params.yaml").read_text())["schemes"]
    assert {re.match(r"\| `([^`]+)` \|", x).group(1) for x in summary.splitlines() if x.startswith("| `")} == set(schemes)
    contents = text.split("## Contents", 1)[1].split("\n## ", 1)[0]
    anchors = re.findall(r"\]\(#([^)]+)\)", contents)
    assert len(anchors) > 10 and set(anchors) <= {_slug(h) for h in headings}
    names = sorted(p.parent.name for p in (REPO / "profiles").glob("*/results")  # a trial (smoke) has no page
                   if not yaml.safe_load((p.parent / "params.yaml").read_text()).get("trial"))
    assert sorted(rel for rel in rendered if rel.startswith(report.PROFILES + "/")) == sorted(
        [f"{report.PROFILES}/{n}.md" for n in names] + [f"{report.PROFILES}/README.md"])  # and their index
    assert all(f"({n}.md)" in rendered[f"{report.PROFILES}/README.md"] for n in names)
    for n in names:
        assert f"(profiles/{n}.md)" in text and f"(docs/profiles/{n}.md)" in rendered[report.README]


def test_check_fails_on_a_page_of_no_profile_and_rendering_removes_it(tmp_path, capsys):
    root = project_copy(tmp_path)
    (root / report.PROFILES / "gone.md").write_text("an old page\n")
    assert report.main(["--root", str(root), "--check"]) == 1
    assert "docs/profiles/gone.md: a page of no profile with results" in capsys.readouterr().err
    assert report.main(["--root", str(root)]) == 0 and not (root / report.PROFILES / "gone.md").exists()


def _calls(node) -> list[str]:
    """The names every call in a Jinja template's syntax tree calls: ``f(...)``, ``x.m(...)``
    (as "x.m"), and the filters and tests it applies (as "|f" and "is t")."""
    from jinja2 import nodes

    out = []
    for n in node.find_all((nodes.Call, nodes.Filter, nodes.Test)):
        if isinstance(n, nodes.Filter):
            out.append(f"|{n.name}")
        elif isinstance(n, nodes.Test):
            out.append(f"is {n.name}")
        elif isinstance(n.node, nodes.Name):
            out.append(n.node.name)
        elif isinstance(n.node, nodes.Getattr):
            out.append(f"{getattr(n.node.node, 'name', '?')}.{n.node.attr}")
        else:
            out.append("?")
    return out


def test_no_template_calls_a_function_that_computes_a_statistic():
    """The report only renders: what the templates can call is ``analysis.words`` (formats and
    the words of the verdict ids), Jinja's own filters and tests, their own macros, and the
    methods of a study that read its files; nothing from ``analysis.stats``, ``papers``,
    ``findings`` or ``scales`` is exposed to them, and every call in every template's syntax tree
    is one of those."""
    import inspect

    from jinja2 import nodes

    from analysis import words

    env = report.environment(REPO)
    exposed = {k: v for k, v in {**report.HELPERS, **report.FILTERS}.items() if callable(v)}
    for name, fn in exposed.items():
        assert inspect.getmodule(fn) is words, name
    reading = {"spec", "seeds", "rate_of", "table", "link", "has", "get", "items", "keys", "values", "update", "split",
               "startswith", "append", "join", "endswith"}
    builtin_filters = {"length", "join", "map", "list", "select", "selectattr", "rejectattr", "sum", "unique",
                       "sort", "dictsort", "int", "string", "first", "capitalize", "truncate", "default", "upper", "max"}
    builtin_tests = {"defined", "none", "string", "number", "sameas", "eq", "ne", "in", "gt", "equalto"}
    unexpected = []
    for path in sorted((REPO / "docs" / "templates").glob("*.j2")):
        tree = env.parse(path.read_text())
        macros = {m.name for m in tree.find_all(nodes.Macro)} | {"caller", "loop.cycle"}
        for call in _calls(tree):
            name = call.split(".")[-1]
            ok = (call.startswith("|") and call[1:] in builtin_filters | set(report.FILTERS)) or \
                 (call.startswith("is ") and call[3:] in builtin_tests | set(env.tests)) or \
                 call in macros or call in exposed or ("." in call and name in reading)
            if not ok:
                unexpected.append(f"{path.name}: {call}")
    assert unexpected == []


@pytest.mark.slow
def test_rendering_imports_no_statistics_library():
    """Rendering the whole report (results.md, every profile's page, the README's block) in a
    fresh interpreter imports neither scipy nor statsmodels: it computes no test."""
    import subprocess
    import sys

    code = ("import sys; from pipelines import report; report.render(); "
            "print(sorted(m for m in ('scipy', 'statsmodels', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr
