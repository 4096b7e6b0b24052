"""`dvc repro` on a reduced study: every figure and result is built, a second repro
with nothing changed runs nothing, a fresh clone (without the trained runs) runs nothing
and keeps its provenance, and on that clone a scheme added as the README says (one class,
one YAML, one line in params.yaml) is previewed without a file written, then trained and put
into every table and figure with nothing else retrained and no other scheme's output touched."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO
from .test_tasks import TOY_YAML

REDUCED = {
    "data": "tinyshakespeare",
    "vocab_size": 260,
    "model": "micro",
    "trainer": "cpu",
    "workers": 2,
    "threads": 1,
    "common": "model.d_model=32 model.n_heads=2",
    "tasks": {
        "lm": {"seeds": "0 1", "seq_len": 32, "batch_size": 8, "steps": 20, "validate_every": 20, "criterion": None,
               "overrides": "", "evaluate": {"multipliers": "1 2 4", "max_tokens": 1024, "extensions": "all"}},
        "mlm": {"seeds": "0 1", "seq_len": 16, "batch_size": 8, "steps": 20, "validate_every": 20, "criterion": None,
                "overrides": "optim.lr=2e-3", "evaluate": {}},
        "retrieval": {"seeds": "0", "seq_len": 32, "batch_size": 8, "steps": 20, "validate_every": 10,
                      "criterion": {"metric": "val/exact", "value": 0.9},
                      "overrides": "data.eval_batch_size=16 trainer.limit_val_batches=1 trainer.limit_test_batches=1",
                      "evaluate": {"multipliers": "1 2 4", "trials": 4, "attention_trials": 2, "extensions": ""}},
        # a task the project does not have, added by its class, its YAML and this entry alone (TOY_TASK)
        "first": {"seeds": "0 1", "seq_len": 16, "batch_size": 8, "steps": 10, "validate_every": 10, "criterion": None,
                  "overrides": "", "evaluate": {}},
    },
    "schemes": {"none": {"tasks": "lm mlm retrieval first", "overrides": "", "extensions": ""},
                "alibi": {"tasks": "lm mlm retrieval first", "overrides": "", "extensions": ""},
                "xpos": {"tasks": "lm retrieval", "overrides": "", "extensions": ""}},
    "lm_table": {"reference": "alibi", "margin": 0.05, "margin_reason": "a test's", "pairs": {"p": "xpos:none"}},
    "mlm_table": {"reference": "none", "question": "alibi", "against": "none", "margin": 0.02,
                  "margin_reason": "a test's"},
    "retrieval_table": {"reference": "none", "margin": 0.1, "margin_reason": "a test's"},
    "primary": [{"name": "extrapolation", "family": "lm_reference", "quantity": "ratio", "multiple": 4,
                 "what": "every scheme's ratio", "why": "a test's"}],
    "report": {"bucket_control": {"plain": "t5_bias", "variant": "t5_bias_scaled"}, "budget_minutes": 60, "rules_of": "rope",
               "reach": {"near": "alibi", "spread": "rope"}},
    "correlations": {"batches": 1, "pretrained_sentences": 4, "pretrained_length": 32},
    "bench": {"args": "--tiny --no-memory --no-xtransformers --schemes none alibi t5_bias"},
}


#: a task the project does not have, as a researcher adds one: a class in a module of their own
#: (``tests.test_tasks.FirstToken``: at the last position, name the window's first token) and a YAML
#: naming it; the params entry is REDUCED's ``tasks: first:``
TOY_TASK = {"conf/task/first.yaml": TOY_YAML}


def _copy_project(dst: Path, results: bool = False) -> None:
    """The working tree as it is (tracked files and new ones git does not ignore), less
    profiles (pipelines of their own) and, unless ``results``, the committed results (which
    a reduced study has not made)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    left_out = ("profiles/",) if results else ("results/", "figures/", "profiles/")
    for f in files:
        if (REPO / f).is_file() and not f.startswith(left_out):
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dst / f)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    _git(dst, "add", "-A")
    _git(dst, "commit", "-qm", "the project")  # a study stage records the commit its code is at


def _dvc(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    # the copy's own package and configs, as after `pip install -e .` in a clone (the test's
    # environment has the repository's src/ installed editable, which PYTHONPATH precedes)
    env["PYTHONPATH"] = str(cwd / "src")
    env.pop("POSENC_ROOT", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # set in this process by earlier tests (MLflow keeps its URI there)
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=1800)


def study_commit(root: Path) -> str:
    return json.loads((root / "results/mlflow_study.json").read_text())["git_commit"] or ""


def _check_study_run(root: Path) -> None:
    """The publish stage: the figures and tables are artifacts of the study run, read
    back through the MLflow API, and every training run links to that run."""
    import mlflow

    study = json.loads((root / "results/mlflow_study.json").read_text())
    assert study["tracking_uri"] == "sqlite:///mlflow.db"
    client = mlflow.MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    run = client.get_run(study["run_id"])
    sha = hashlib.sha256((root / "params.yaml").read_bytes()).hexdigest()
    assert run.info.run_name == f"study-{sha[:8]}" == study["run_name"] and run.info.status == "FINISHED"
    assert run.data.tags["params_sha256"] == sha and "dvc repro" in run.data.tags["mlflow.note.content"]
    # the study's runs have an experiment of their own, apart from ad-hoc runs
    assert client.get_experiment(run.info.experiment_id).name == study["experiment"] == "posenc-study"

    def listed(path: str) -> set[str]:
        return {a.path for a in client.list_artifacts(study["run_id"], path)}

    assert {"figures/extrapolation.png", "figures/extrapolation.svg", "figures/lm_table.md", "figures/mlm_table.md",
            "figures/correlations_table.md", "figures/correlations", "figures/pretrained",
            "figures/bench"} <= listed("figures")
    assert {"results/lm_table.json", "results/mlm_table.json", "results/correlations.json",
            "results/timing.json"} <= listed("results")
    heatmaps = {p.name for p in (root / "figures/correlations").iterdir()}
    assert {Path(p).name for p in listed("figures/correlations")} == heatmaps and "overview.png" in heatmaps
    assert "bench.png" in {Path(p).name for p in listed("figures/bench")}

    metas = sorted(root.glob("runs/*/*/run.json"))  # runs/<scheme>/<task>-s<seed>/run.json
    # causal and masked LM and the toy task of none and alibi, xpos's causal LM (2 seeds), a retrieval run of each
    assert len(metas) == 2 * 2 + 2 * 2 + 2 * 2 + 2 + 3 and study["linked_runs"] == len(metas)
    for meta in metas:
        linked = client.get_run(json.loads(meta.read_text())["mlflow_run_id"])
        assert linked.info.experiment_id == run.info.experiment_id, meta
        tags = linked.data.tags
        assert tags["study_run_id"] == study["run_id"], meta
        if meta.parent.name.startswith("lm-"):  # extrapolation metrics: step = evaluation length
            assert tags["extrapolation.step"].startswith("evaluation length"), meta


@pytest.mark.slow
def test_dvc_repro_builds_every_figure_then_runs_nothing(tmp_path, data_root):
    from analysis.pretrained import model_path

    model_path()  # the pretrained stage needs the [pretrained] extra: without it, fail here and say so
    _copy_project(tmp_path)
    for rel, text in TOY_TASK.items():
        (tmp_path / rel).write_text(text.lstrip())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(REDUCED))
    # the page that quotes the study's counts, quoting the reduced study's (checked by report --check below)
    (tmp_path / "docs/reproduce.md").write_text(
        "6 causal-LM runs (3 schemes × 2 seeds), 4 masked-LM runs (2 schemes × 2 seeds) and "
        "3 retrieval runs (3 schemes × 1 seed).\n")
    first = _dvc(tmp_path, "repro")
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]

    prepared = json.loads((tmp_path / "results/prepare.json").read_text())
    assert prepared["source"] == "local" and prepared["root"] == os.path.relpath(data_root.resolve(), tmp_path)
    for f in ["figures/extrapolation.png", "figures/extrapolation.svg", "figures/mlm_table.md", "figures/lm_table.md",
              "figures/correlations_table.md",
              "results/extrapolation.csv", "results/mlm_table.json", "results/lm_table.json", "results/timing.json",
              "results/correlations.json", "results/pretrained_minilm.json", "figures/bench/bench.json",
              "figures/bench/bench.png", "figures/retrieval/grid.png", "figures/retrieval/curves.png",
              "figures/retrieval/reach.png", "figures/retrieval/steps.png", "figures/retrieval_table.md",
              "figures/retrieval_steps.md", "results/retrieval_table.json", "figures/reach_table.md", "docs/results.md"]:
        assert (tmp_path / f).stat().st_size > 0, f
    # retrieval: one run per scheme, 3 lengths x 5 depths each; reach: every causal-LM run,
    # 3 lengths x 2 layers x 2 heads
    grid = (tmp_path / "results/retrieval.csv").read_text().splitlines()
    assert len(grid) == 1 + 3 * 3 * 5 and {r.split(",")[0] for r in grid[1:]} == {"none", "alibi", "xpos"}
    assert len((tmp_path / "results/reach.csv").read_text().splitlines()) == 1 + 3 * 2 * 3 * 2 * 2
    assert all(f"`{s}`" in (tmp_path / "figures/retrieval_table.md").read_text() for s in ("none", "alibi", "xpos"))
    rows = (tmp_path / "results/extrapolation.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * 2 * 3  # header + schemes x seeds x lengths
    # masked-LM runs of none and alibi, xpos (causal only) from its LM run, per seed; seed 0 drawn
    corr = json.loads((tmp_path / "results/correlations.json").read_text())
    labels = {v["label"] for v in corr["models"].values()}
    assert labels == {"none (mlm)", "alibi (mlm)", "xpos (lm)"}, labels
    assert len(corr["models"]) == 6
    assert corr["schemes"]["alibi (mlm)"]["terms"]["position-position"]["n"] == 2
    drawn = {r.split("/")[0]: json.loads((tmp_path / f"runs/{r}-s0/run.json").read_text())["run_name"]
             for r in ("none/mlm", "alibi/mlm", "xpos/lm")}  # figures named by run, a folder per scheme
    assert {p.relative_to(tmp_path / "figures/correlations").as_posix()
            for p in (tmp_path / "figures/correlations").rglob("*.png")} == {
        f"{scheme}/{name}{h}.png" for scheme, name in drawn.items() for h in ("", "_heads")} | {"overview.png"}
    assert {p.name for p in (tmp_path / "results/correlations").iterdir()} == {
        f"{s}.{ext}" for s in drawn for ext in ("json", "npz")}
    assert list((tmp_path / "figures/pretrained").glob("*.png"))
    table = json.loads((tmp_path / "results/mlm_table.json").read_text())
    assert set(table["summary"]) == {"none", "alibi"} and table["summary"]["alibi"]["n"] == 2
    assert set(table["tests"]) == {"none"}
    lm = json.loads((tmp_path / "results/lm_table.json").read_text())
    assert set(lm) == {"none", "alibi", "xpos"} and lm["alibi"]["ratio_longest"]["n"] == 2
    assert lm["none"]["tests"]["ratio"]["4"]["against"] == "alibi" and "tests" not in lm["alibi"]
    timing = json.loads((tmp_path / "results/timing.json").read_text())
    assert timing["total"]["runs"] == 2 * 2 + 2 * 2 + 2 * 2 + 2 + 3
    assert set(timing["total"]["task_s"]) == {"lm", "mlm", "retrieval", "first"}
    # the toy task, added by its class, its YAML and its params entry alone: trained for both
    # schemes that list it, and its table is in the tables and the report
    toy = json.loads((tmp_path / "results/tasks_table.json").read_text())["first"]
    assert toy["class"] == "tests.test_tasks.FirstToken" and toy["metrics"] == ["val/loss", "val/ppl", "val/acc", "val/exact"]
    assert set(toy["schemes"]) == {"none", "alibi"} and toy["schemes"]["none"]["seeds"] == [0, 1]
    assert "**`first`** (`tests.test_tasks.FirstToken`)" in (tmp_path / "docs/results.md").read_text()
    # committed results name no absolute path of the machine that made them
    for f in ("results/prepare.json", "results/correlations.json", "results/extrapolation.csv",
              "results/runs/alibi.json", "results/pretrained_minilm.json", "results/mlflow_study.json"):
        assert str(tmp_path) not in (tmp_path / f).read_text(), f
    _check_study_run(tmp_path)
    # the report stage ran last: its page and the README's block come from this study's files
    results_md = (tmp_path / "docs/results.md").read_text()
    assert study_commit(tmp_path)[:10] in results_md and "`none`" in results_md
    check = subprocess.run([sys.executable, "-m", "pipelines.report", "--check"], cwd=tmp_path, capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path / "src")))
    assert check.returncode == 0, check.stderr[-2000:]

    second = _dvc(tmp_path, "repro")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Running stage" not in second.stdout, second.stdout
    status = _dvc(tmp_path, "status")
    assert "up to date" in status.stdout.lower(), status.stdout

    plots = _dvc(tmp_path, "plots", "show", "--json")
    assert plots.returncode == 0, plots.stderr[-2000:]
    # the views: one short row per scheme in `dvc metrics show`; `dvc plots show` draws the
    # study's figures as images, with no script to fetch from the internet (it works offline)
    metrics = _dvc(tmp_path, "metrics", "show")
    assert metrics.returncode == 0, metrics.stderr[-2000:]
    rows = metrics.stdout.strip().splitlines()
    assert len(rows) == 1 + 3 and max(map(len, rows)) < 120, metrics.stdout
    longest = f"ppl_{max(int(m) for m in str(REDUCED['tasks']['lm']['evaluate']['multipliers']).split())}L"
    assert rows[0].split() == ["Path", "mlm_acc", longest, "ppl_L", "ratio"], rows[0]
    html = _dvc(tmp_path, "plots", "show", "--out", "dvc_plots")
    assert html.returncode == 0, html.stderr[-2000:]
    page = (tmp_path / "dvc_plots" / "index.html").read_text()
    assert "<script" not in page and page.count("<img") == 7, page[:2000]
    assert "dvc_plots/" in (REPO / ".gitignore").read_text().splitlines()

    _check_adding_a_scheme(tmp_path, tmp_path.parent / f"{tmp_path.name}-clone")


# A throwaway scheme as the README's "Add your scheme" says: one class in its own module
# under src/posenc/encodings/, one YAML naming it, one line in params.yaml.
NEW_SCHEME = {
    "src/posenc/encodings/penalty.py": '''
import torch
from torch import nn

from .base import PositionalScheme


class DistancePenalty(PositionalScheme):
    """-softplus(w_h) |i - j| / 8 on the logits: a throwaway scheme for a test.

    Checked against nothing: it exists to be added to a study, not to be right.
    """

    relative = True

    def __init__(self, *, init: float = 0.0, **kw):
        super().__init__(**kw)
        self.w = nn.Parameter(torch.full((self.n_heads,), init))

    def relative_bias(self, rel):
        return -nn.functional.softplus(self.w)[:, None] * rel.abs().to(self.w.dtype)[None] / 8
''',
    "conf/encoding/penalty.yaml": "name: penalty\nscheme:\n  _target_: posenc.encodings.penalty.DistancePenalty\n"
                                  "  _partial_: true\n  init: 0.5\n",
}
#: what adding a scheme may change: its own stages and the summaries (bench: every scheme, side by side)
ROUTE_STAGES = {"fingerprint", "study@penalty", "heatmaps@penalty", "correlations", "tables", "buckets", "figures", "retrieval",
                "bench", "findings", "publish", "report"}
#: what the route runs: the stages it lists, and the summaries across tables that read their new results
RAN_STAGES = ROUTE_STAGES | {"papers", "scales", "chronology"}  # chronology: it reads the new scheme's record
SUMMARY_OUTPUTS = {"dvc.lock", "params.yaml", "figures/correlations/overview.png", "figures/correlations/overview.svg",
                   "figures/correlations_table.md", "figures/extrapolation.png", "figures/extrapolation.svg",
                   "figures/lm_table.md", "figures/mlm_table.md", "results/correlations.json",
                   "results/extrapolation.csv", "results/lm_table.json", "results/mlm_table.json",
                   "results/timing.json", "results/mlflow_study.json", "figures/retrieval/grid.png",
                   "figures/retrieval/grid.svg", "figures/retrieval/curves.png", "figures/retrieval/curves.svg",
                   "figures/retrieval/reach.png", "figures/retrieval/reach.svg", "figures/retrieval_table.md",
                   "figures/reach_table.md", "results/retrieval.csv", "results/reach.csv",
                   "figures/retrieval/steps.png", "figures/retrieval/steps.svg", "figures/retrieval_steps.md",
                   "results/retrieval_table.json", "results/tasks_table.json", "figures/tasks_table.md", "docs/results.md",
                   "README.md", "results/lm_pairs.json", "results/reach_summary.json", "results/papers.json",
                   "results/findings.json", "results/scales.json", "figures/fairness.png", "figures/fairness.svg", "figures/budget.png",
                   "figures/budget.svg", "figures/budget_order.png", "figures/budget_order.svg",
                   "results/chronology.json"} | {
                      f"results/times/{s}.json" for s in RAN_STAGES - {"report"}}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def _tree(root: Path) -> dict[str, bytes]:
    """Every file of a checkout but git's own and DVC's scratch (``.dvc/tmp``), by path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and ".git" not in p.parts and "__pycache__" not in p.parts
            and not p.relative_to(root).as_posix().startswith(".dvc/tmp/")}


def _python(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m <args>`` in a copy of the project, with its own package (as ``_dvc``)."""
    env = dict(os.environ, PYTHONPATH=str(cwd / "src"), OMP_NUM_THREADS="1",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("POSENC_ROOT", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)


def _check_a_fresh_clone_keeps_its_provenance(clone: Path) -> None:
    """A fresh clone has the committed results but not the trained runs (``runs/`` is not
    committed) nor the store: ``dvc status`` lists nothing, ``dvc repro`` runs nothing, and
    README.md, docs/results.md and results/mlflow_study.json are as committed, byte for byte
    (the whole checkout is); ``report --check`` passes there, crediting the commit the study
    stages recorded."""
    assert not (clone / "runs").exists() or not any((clone / "runs").rglob("run.json"))
    before = _tree(clone)
    status = _dvc(clone, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout or "{}") == {}, status.stdout + status.stderr[-2000:]
    repro = _dvc(clone, "repro")
    assert repro.returncode == 0, repro.stdout[-3000:] + repro.stderr[-3000:]
    assert "Running stage" not in repro.stdout, repro.stdout
    after = _tree(clone)
    for f in ("README.md", "docs/results.md", "results/mlflow_study.json", "dvc.lock"):
        assert after[f] == before[f], f
    assert after == before
    check = _python(clone, "pipelines.report", "--check")
    assert check.returncode == 0, check.stderr[-2000:]


def _check_adding_a_scheme(study: Path, clone: Path) -> None:
    """On a fresh clone of the committed study (no runs/, no token cache), the README's
    route is previewed without a file written (the fan-out's dry run and the status command,
    each exit 0), then trains the new scheme only and leaves every other scheme's output as it
    was."""
    _git(study, "add", "-A")
    _git(study, "commit", "-qm", "reduced study")
    _git(study, "clone", "-q", str(study), str(clone))
    _check_a_fresh_clone_keeps_its_provenance(clone)
    before = {p.relative_to(clone).as_posix(): p.read_bytes() for p in clone.rglob("*")
              if p.is_file() and ".git" not in p.parts}
    for rel, text in NEW_SCHEME.items():
        (clone / rel).write_text(text.lstrip())
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["schemes"]["penalty"] = {"tasks": "lm mlm retrieval", "overrides": "", "extensions": ""}
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    added = _tree(clone)
    dry = _python(clone, "pipelines.fanout", "--dry-run")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    runs = 2 + 2 + 1  # penalty's causal-LM and masked-LM seeds and its retrieval run
    assert f"dvc.yaml: 1 stale study stage(s), {runs} runs: study@penalty ({runs})" in dry.stdout, dry.stdout
    assert any(line.lstrip().startswith("study@penalty") and "new: no entry in dvc.lock yet" in line
               for line in dry.stdout.splitlines()), dry.stdout
    explained = _python(clone, "pipelines.status", "dvc.yaml")
    assert explained.returncode == 0, explained.stderr[-3000:]
    lines = [line.split()[0] for line in explained.stdout.splitlines() if line.startswith("  ")]
    assert sorted(lines) == sorted(ROUTE_STAGES), explained.stdout
    assert _tree(clone) == added  # neither wrote a file

    status = _dvc(clone, "status")
    listed = {line[:-1] for line in status.stdout.splitlines() if line and not line[0].isspace()}
    assert listed == ROUTE_STAGES, status.stdout
    route = _dvc(clone, "repro")
    assert route.returncode == 0, route.stdout[-4000:] + route.stderr[-4000:]
    ran = {line.split("'")[1] for line in route.stdout.splitlines() if line.startswith("Running stage")}
    assert ran == RAN_STAGES, route.stdout

    changed = _git(clone, "status", "--porcelain", "--untracked-files=all").splitlines()
    deleted = [line for line in changed if line[:2].strip().startswith("D")]
    assert not deleted, deleted
    modified = {line[3:] for line in changed if not line.startswith("??")}
    assert modified <= SUMMARY_OUTPUTS | {f for f in before if f.startswith(("figures/bench/", "results/metrics/"))}
    for f, data in before.items():  # every per-scheme file of the other schemes, byte for byte
        if f.startswith(("results/runs/", "results/extrapolation/", "results/correlations/", "results/fingerprints/",
                         "results/metrics/", "results/retrieval/", "results/reach/", "figures/correlations/",
                         "results/times/study@", "results/times/heatmaps@")) \
                and "/overview." not in f:
            assert (clone / f).read_bytes() == data, f
    # the new scheme is in both tables, both figures' data and the heatmaps
    assert "penalty" in json.loads((clone / "results/lm_table.json").read_text())
    assert "penalty" in json.loads((clone / "results/mlm_table.json").read_text())["summary"]
    assert "penalty (mlm)" in json.loads((clone / "results/correlations.json").read_text())["schemes"]
    assert "\npenalty,0," in (clone / "results/extrapolation.csv").read_text()
    assert "\npenalty," in (clone / "results/retrieval.csv").read_text()
    assert "\npenalty," in (clone / "results/reach.csv").read_text()
    assert list((clone / "figures/correlations/penalty").glob("*_heads.png"))
    assert (clone / "results/metrics/penalty.json").is_file()


@pytest.mark.slow
def test_the_committed_lock_is_what_the_committed_code_and_params_make():
    """``dvc status`` of the default pipeline lists no stage whose code, configs or params
    changed since its committed ``dvc.lock`` was written: the committed results come from the
    committed code. The trained runs (``runs/``, read by ``publish``) are not committed, so a
    clone lacks them: that change alone is allowed."""
    status = _dvc(REPO, "status", "--json", "dvc.yaml")  # the default pipeline, not the profiles'
    assert status.returncode == 0, status.stderr[-2000:]
    stale = {}
    for stage, changes in json.loads(status.stdout or "{}").items():
        for change in changes:
            if isinstance(change, dict):
                for kind, paths in change.items():
                    moved = {p: what for p, what in paths.items() if p != "runs"} if isinstance(paths, dict) else paths
                    if moved:
                        stale.setdefault(stage, {})[kind] = moved
            else:
                stale.setdefault(stage, {})[change] = True
    assert stale == {}, f"dvc.lock does not match the code: run `dvc repro` and commit the lock it writes: {stale}"


def _stages_listed(root: Path) -> set[str]:
    status = _dvc(root, "status", "--json", "dvc.yaml")
    assert status.returncode == 0, status.stderr[-2000:]
    return set(json.loads(status.stdout or "{}"))


@pytest.mark.slow
def test_editing_the_executor_plans_no_study_stage(tmp_path):
    """The executor decides where a job runs, not what it computes: it is no dependency of
    a result. In a copy of the project with its committed results, an edit of
    ``pipelines/executors.py`` lists no stage in ``dvc status`` that was not listed before
    (none, when the lock is current); an edit of the shared core lists every study stage."""
    _copy_project(tmp_path, results=True)
    before = _stages_listed(tmp_path)
    with (tmp_path / "pipelines/executors.py").open("a") as f:
        f.write("\nEDITED = True\n")
    assert _stages_listed(tmp_path) == before
    with (tmp_path / "src/posenc/model.py").open("a") as f:
        f.write("\nEDITED = True\n")
    schemes = yaml.safe_load((tmp_path / "params.yaml").read_text())["schemes"]
    assert {f"study@{s}" for s in schemes} <= _stages_listed(tmp_path)


@pytest.mark.slow
def test_rewording_a_verdict_reruns_the_report_alone(tmp_path):
    """The verdicts are stored as ids; their words are ``analysis.words``, a dependency of the
    report stage alone. In a copy of the project with its committed results, rewording a
    verdict's phrase in ``analysis/words.py`` lists the report in ``dvc status`` and no other
    stage that was not listed before (no table stage, no summary)."""
    _copy_project(tmp_path, results=True)
    # the report's record made current in the copy, so that its listing below is the edit's
    # alone (test_the_committed_lock_is_what_the_committed_code_and_params_make checks the lock)
    committed = _dvc(tmp_path, "commit", "--force", "report")
    assert committed.returncode == 0, committed.stderr[-2000:]
    before = _stages_listed(tmp_path)
    words = tmp_path / "analysis/words.py"
    text = words.read_text()
    assert '"ahead": ("ahead of", "ahead")' in text
    words.write_text(text.replace('"ahead": ("ahead of", "ahead")', '"ahead": ("better than", "better")'))
    assert _stages_listed(tmp_path) - before == {"report"} and "report" not in before


@pytest.mark.slow
def test_a_refused_study_stage_leaves_the_committed_results_as_they_were(tmp_path):
    """DVC deletes a stage's outputs before its command runs, unless they persist. A study
    stage refused for its executor (a misspelt ``POSENC_EXECUTOR``; with no CUDA device,
    the ``gpus`` preset) fails in one line naming the cause, and every committed file of
    the project is as it was, byte for byte."""
    _copy_project(tmp_path, results=True)
    before = _tree(tmp_path)
    assert "results/runs/alibi.json" in before and "results/extrapolation/alibi.csv" in before
    cases = {"gpu": "POSENC_EXECUTOR=gpu: unknown executor 'gpu': did you mean 'gpus'?"}
    import torch

    if not torch.cuda.is_available():
        cases["gpus"] = "CUDA device(s) are visible"
    for value, said in cases.items():
        os.environ["POSENC_EXECUTOR"] = value
        try:
            out = _dvc(tmp_path, "repro", "--force", "-s", "study@alibi")
        finally:
            del os.environ["POSENC_EXECUTOR"]
        assert out.returncode != 0
        refusal = [line for line in out.stderr.splitlines() if line.startswith("study refused")]
        assert len(refusal) == 1 and said in refusal[0], out.stderr[-2000:]
        assert "usage:" not in out.stderr
        assert _tree(tmp_path) == before
