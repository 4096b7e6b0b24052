"""The paper profile (``profiles/paper``: WikiText-103, L = 512, ``model=base``, three tasks,
RoPE's context-extension rules) composes and runs end to end: every job of its pipeline for
one step, on CPU, so that whoever has the GPUs it is sized for can start it knowing it works.
It runs as the README runs a whole study: ``python -m pipelines.fanout paper`` (every study
stage's jobs on one pool), then ``dvc repro`` of the profile's pipeline for the rest.

Only what cannot run here is changed, and the test says which: the trainer (CPU), the
counts (one step, one seed, batches of one or two, few evaluation tokens and trials, lengths
L and 2L for both the causal LM and the retrieval grid, the fine-tune rule's 200 steps cut to 1) and the corpus, which is not on this
machine: WikiText-2's first lines stand in for WikiText-103 under its name and file layout.
The training length, the vocabulary size, the learning rates, the heads and the schemes with
their tasks and rules are the paper profile's own. Two things more are cut for a CPU and its
disk: one validation and one test batch of one window, and the model's width and depth
(``NARROW``: 47 runs of ``model=base`` write over 40 GB of checkpoints). So every job of
every scheme and task is also composed with the profile's full settings and ``model=base``,
and checked (``check_config``), without training.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from .conftest import REPO
from .test_dvc import _copy_project, _dvc, _python

#: what this test changes in profiles/paper/params.yaml, and nothing else
ONE_STEP = {
    "trainer": "cpu",
    "workers": 2,
    "threads": 1,
    "tasks": {"lm": {"seeds": "0", "steps": 1, "validate_every": 1, "batch_size": 1,
                     "evaluate": {"multipliers": "1 2", "max_tokens": 1024}},
              "mlm": {"seeds": "0", "steps": 1, "validate_every": 1, "batch_size": 2},
              "retrieval": {"seeds": "0", "steps": 1, "validate_every": 1, "batch_size": 1,
                            "evaluate": {"multipliers": "1 2", "trials": 1, "attention_trials": 1}}},
    "correlations": {"batches": 1},
}
#: appended to the profile's own `common` overrides: one validation and one test batch of one
#: window, and a narrow model of `model=base`'s kind (its 47 runs at full size write over 40 GB of
#: checkpoints); the full `model=base` of every job is composed and checked apart
ONE_BATCH = " trainer.limit_val_batches=1 trainer.limit_test_batches=1 data.eval_batch_size=1"
NARROW = " model.d_model=64 model.d_ff=128 model.n_layers=2"


def _merged(base: dict, change: dict) -> dict:
    return {**base, **{k: _merged(base[k], v) if isinstance(v, dict) else v for k, v in change.items()}}


def _one_step(paper: dict) -> dict:
    out = _merged(json.loads(json.dumps(paper)), ONE_STEP)
    one = lambda rules: re.sub(r"@(\d+)x\d+", r"@\1x1", rules)  # noqa: E731 -- <rule>@<m>x<n>: one step, not n
    for spec in out["schemes"].values():
        spec["extensions"] = one(spec["extensions"])
    retrieval = out["tasks"]["retrieval"]
    retrieval["evaluate"]["extensions"] = one(retrieval["evaluate"]["extensions"])
    retrieval["overrides"] = retrieval["overrides"].replace("data.eval_batch_size=640", "data.eval_batch_size=2")
    out["common"] += ONE_BATCH + NARROW
    return out


@pytest.mark.slow
def test_every_job_of_the_paper_profile_composes_with_its_own_settings_and_passes_the_checks():
    from posenc.config import check_config, compose

    from posenc.tasks import load

    paper = yaml.safe_load((REPO / "profiles/paper/params.yaml").read_text())
    own = {task: load(task).run_overrides(spec) for task, spec in paper["tasks"].items()}
    checked = 0
    for scheme, spec in paper["schemes"].items():
        for task in spec["tasks"].split():
            cfg = compose([f"encoding={scheme}", f"task={task}", f"data={paper['data']}",
                           f"data.vocab_size={paper['vocab_size']}", f"model={paper['model']}", "trainer=cpu",
                           *paper["common"].split(), *own[task], *spec["overrides"].split()])
            check_config(cfg)
            assert (cfg.model.d_model, cfg.model.n_layers, cfg.data.corpus.name) == (512, 8, "wikitext103")
            checked += 1
    assert checked == sum(len(s["tasks"].split()) for s in paper["schemes"].values()) == 44


@pytest.mark.slow
def test_the_paper_profile_runs_one_step_of_every_job_on_cpu(tmp_path, data_root, monkeypatch):
    paper = yaml.safe_load((REPO / "profiles/paper/params.yaml").read_text())
    project = tmp_path / "project"
    project.mkdir()
    _copy_project(project)
    (project / "profiles/paper").mkdir(parents=True)
    (project / "profiles/paper/params.yaml").write_text(yaml.safe_dump(_one_step(paper), sort_keys=False))
    # WikiText-103's layout, with a slice of WikiText-2 in it
    corpus = tmp_path / "data" / "wikitext-103"
    corpus.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        lines = (data_root / "wikitext-2" / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (corpus / f"{split}.txt").write_text("".join(lines[: 3000 if split == "train" else 400]), encoding="utf-8")
    monkeypatch.setenv("POSENC_DATA_DIR", str(tmp_path / "data"))

    # as the README runs a whole study: every study stage's jobs at once (the fan-out writes the
    # profile's pipeline, brings prepare and fingerprint up to date and records each stage in
    # dvc.lock), then `dvc repro` for the rest, which must find no study stage left to run
    fanned = _python(project, "pipelines.fanout", "paper")
    assert fanned.returncode == 0, fanned.stdout[-6000:] + fanned.stderr[-4000:]
    assert fanned.stdout.count("written and recorded in its dvc.lock") == len(paper["schemes"]), fanned.stdout
    run = _dvc(project, "repro", "profiles/paper/dvc.yaml")
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-4000:]
    ran = "Running stage 'profiles/paper/dvc.yaml:"
    assert f"{ran}tables'" in run.stdout and f"{ran}study@" not in run.stdout, run.stdout

    base = project / "profiles/paper"
    schemes = set(paper["schemes"])
    assert {p.stem for p in (base / "results/runs").glob("*.json")} == schemes
    lm = json.loads((base / "results/lm_table.json").read_text())
    assert schemes <= {s.split("+")[0] for s in lm} and {"rope+pi", "rope+ntk", "rope+yarn", "rope+pi+ft4L"} <= set(lm)
    mlm = json.loads((base / "results/mlm_table.json").read_text())
    assert set(mlm["summary"]) == {s for s, e in paper["schemes"].items() if "mlm" in e["tasks"].split()}
    retrieval = json.loads((base / "results/retrieval_table.json").read_text())
    assert schemes <= set(retrieval["schemes"])
    for f in ("figures/extrapolation.png", "figures/retrieval/grid.png", "figures/correlations/overview.png",
              "results/correlations.json", "results/reach.csv", "results/mlflow_study.json"):
        assert (base / f).stat().st_size > 0, f
    # the runs are the paper profile's, narrowed: L = 512 on the 16k-token vocabulary, base's heads
    cfg = yaml.safe_load((base / "runs/alibi/lm-s0/config.yaml").read_text())
    assert (cfg["model"]["n_heads"], cfg["model"]["d_model"], cfg["data"]["seq_len"]) == (8, 64, 512)
    assert cfg["data"]["corpus"]["name"] == "wikitext103" and cfg["data"]["vocab_size"] == 16384
    assert cfg["optim"]["lr"] == pytest.approx(6.0e-4)
