"""Tasks as components (``posenc.tasks``): the DataModule, the LightningModule, the config
checks and the study ask the task, so a new task is one class and one YAML. The toy task
here, used by no other code, shows it: the last position of a window names its first token.
And a scheme a task cannot take is refused before anything trains, naming both and the fix."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from torch.utils.data import Dataset

from posenc import CONFIG_DIR
from posenc.config import check_config, compose
from posenc.errors import ConfigError
from posenc.targets import IGNORE
from posenc.tasks import CausalLM, MaskedLM, Retrieval, Task, build, load, misfits

from .conftest import REPO
from .helpers import study_params


class _FirstToken(Dataset):
    def __init__(self, windows):
        self.windows = windows

    def __len__(self):
        return len(self.windows)

    def __getitem__(self, i):
        x, _ = self.windows[i]
        y = torch.full_like(x, IGNORE)
        y[-1] = x[0]
        return x, y


class FirstToken(Task):
    """Toy task: at the last position of a window, name the window's first token."""

    accuracy = True
    exact_match = True

    def dataset(self, dm, windows, split):
        return _FirstToken(windows)

    def scored_suffix(self, seq_len):
        return 1

    def check(self, cfg):
        if int(cfg.data.seq_len) < 2:
            raise ConfigError(f"task={self.name} needs windows of 2 tokens or more, not data.seq_len={cfg.data.seq_len}")


TOY_YAML = "# toy: the last position names the first token\n_target_: tests.test_tasks.FirstToken\nname: first\n" \
           "causal: true\ncls: false\n"


@pytest.fixture()
def conf(tmp_path):
    """The project's config folder with one more task: ``conf/task/first.yaml``, and a
    bidirectional twin of it that a causal-only scheme cannot take."""
    root = tmp_path / "conf"
    shutil.copytree(CONFIG_DIR, root)
    (root / "task" / "first.yaml").write_text(TOY_YAML)
    (root / "task" / "first_bi.yaml").write_text(TOY_YAML.replace("name: first", "name: first_bi")
                                                  .replace("causal: true", "causal: false"))
    return root


def test_each_task_config_names_its_class_and_the_classes_say_what_validation_logs():
    assert [type(load(t)) for t in ("lm", "mlm", "retrieval")] == [CausalLM, MaskedLM, Retrieval]
    assert build(compose(["task=lm"]).task).validated() == ["val/loss", "val/ppl"]
    assert build(compose(["task=mlm"]).task).validated() == ["val/loss", "val/ppl", "val/acc"]
    assert build(compose(["task=retrieval"]).task).validated() == ["val/loss", "val/ppl", "val/acc", "val/exact"]
    assert load("retrieval").scored_suffix(64) == 5 and load("lm").scored_suffix(64) is None
    assert [load(t).results for t in ("lm", "mlm", "retrieval")] == ["extrapolation", None, "retrieval"]


def test_the_config_of_a_run_made_before_tasks_were_classes_still_builds():
    old = {"name": "mlm", "objective": "mlm", "causal": False, "cls": True, "mask_prob": 0.2}
    task = build(old)
    assert type(task) is MaskedLM and task.mask_prob == 0.2
    with pytest.raises(ConfigError, match="names no class"):
        build({"name": "odd", "causal": True})


def test_a_new_task_is_one_class_and_one_yaml(conf, data_root, tmp_path):
    from posenc.train import train

    base = ["task=first", "encoding=alibi", "model=micro", "data=tinyshakespeare", "data.vocab_size=260",
            "data.seq_len=16", "model.max_len=16", "data.batch_size=4", "trainer.max_steps=3",
            "trainer.val_check_interval=3", "trainer.limit_val_batches=2", "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false", "log_checkpoint=false",
            f"logger.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}", "criterion.metric=val/exact",
            "criterion.value=0.99"]
    cfg = compose(base, config_dir=str(conf))
    assert type(build(cfg.task)) is FirstToken
    with pytest.raises(ConfigError, match="2 tokens or more"):
        check_config(compose([*base, "data.seq_len=1"], config_dir=str(conf)))
    metrics = train(cfg, out_dir=str(tmp_path / "run"))
    assert {"val/loss", "val/ppl", "val/acc", "val/exact"} <= set(metrics)
    # the scored suffix is the one target: accuracy and exact match are one count
    assert metrics["val/acc"] == pytest.approx(metrics["val/exact"])


def test_a_scheme_a_task_cannot_take_is_refused_naming_both_and_the_fix(conf):
    assert misfits("xpos", ["lm", "retrieval"]) == []
    (refusal,) = misfits("xpos", ["lm", "mlm"])
    assert refusal.startswith("scheme xpos cannot take task mlm: XPos") and "causal attention only" in refusal
    assert "schemes: xpos: tasks:" in refusal
    assert misfits("xpos", ["first"], conf_dir=conf) == []
    assert misfits("xpos", ["first_bi"], conf_dir=conf)[0].startswith("scheme xpos cannot take task first_bi")
    with pytest.raises(ConfigError, match="no .*nope.yaml; the tasks are"):
        load("nope")


@pytest.mark.slow
def test_the_first_stage_refuses_a_misfit_before_any_run_and_writes_nothing(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["schemes"] = {"none": {"tasks": "lm mlm", "overrides": "", "extensions": ""},
                         "xpos": {"tasks": "lm mlm retrieval", "overrides": "", "extensions": ""}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = tmp_path / "fingerprints"
    r = subprocess.run([sys.executable, "-m", "pipelines.fingerprint", "--params", str(tmp_path / "params.yaml"),
                        "--out-dir", str(out)], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and not out.exists()
    assert "scheme xpos cannot take task mlm" in r.stderr and "tasks:" in r.stderr


@pytest.mark.slow
def test_a_study_stage_refuses_a_misfit_before_any_run(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "kept").write_text("an earlier run")
    r = subprocess.run([sys.executable, "-m", "pipelines.study", "xpos", "--params", study_params(tmp_path, lm={}, mlm={}),
                        "--tasks", "lm", "mlm", "--workers", "1", "--runs-dir", str(runs), "--results-dir",
                        str(tmp_path / "results")], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "study refused, nothing was run" in r.stderr and "scheme xpos cannot take task mlm" in r.stderr
    assert (runs / "kept").read_text() == "an earlier run" and not (tmp_path / "results").exists()


def test_a_task_entry_of_the_params_file_is_refused_naming_its_key():
    """Every entry of ``tasks:`` has the same keys; a missing or extra one, a count that is no
    whole number, or ``evaluate`` settings the task cannot score with are refused by name."""
    from posenc.tasks import STUDY_KEYS, check_spec

    from .helpers import EVALUATE, TASK_ENTRY

    check_spec("lm", {**TASK_ENTRY, "evaluate": EVALUATE["lm"]})
    with pytest.raises(ConfigError, match=r"^tasks: lm: lacks seeds \(the keys of every task: seeds, "):
        check_spec("lm", {k: v for k, v in TASK_ENTRY.items() if k != "seeds"})
    with pytest.raises(ConfigError, match="has no key cap"):
        check_spec("retrieval", {**TASK_ENTRY, "cap": 4000})
    with pytest.raises(ConfigError, match="steps must be a whole number at least 1"):
        check_spec("lm", {**TASK_ENTRY, "steps": 2.5})
    with pytest.raises(ConfigError, match="criterion must be null or"):
        check_spec("lm", {**TASK_ENTRY, "criterion": 0.9})
    assert list(STUDY_KEYS) == list(TASK_ENTRY)
    with pytest.raises(ConfigError, match=r"tasks: mlm: evaluate: has no key multipliers \(this task takes split\)"):
        load("mlm").check_evaluate("mlm", {"multipliers": "1 2"})
    with pytest.raises(ConfigError, match="evaluate: lacks trials"):
        load("retrieval").check_evaluate("retrieval", {"multipliers": "1", "attention_trials": 0})
    with pytest.raises(ConfigError, match="attention_trials between 0 and trials, not 4 and 5"):
        load("retrieval").check_evaluate("retrieval", {"multipliers": "1", "trials": 4, "attention_trials": 5})
    with pytest.raises(ConfigError, match="multipliers must be whole numbers at least 1"):
        load("lm").check_evaluate("lm", {"multipliers": "0 2"})
    for name, entry in (("lm", {"multipliers": "1"}), ("mlm", {}),
                        ("retrieval", {"multipliers": "1", "trials": 1, "attention_trials": 0})):
        for split in ("validation", "test"):
            load(name).check_evaluate(name, {**entry, "split": split})
        with pytest.raises(ConfigError, match=f"tasks: {name}: evaluate: split must be one of validation, test, "
                                              "not 'train'"):
            load(name).check_evaluate(name, {**entry, "split": "train"})
    load("lm").check_evaluate("lm", {"multipliers": "1", "passages": 3})
    for bad in (0, 2.5, "4"):
        with pytest.raises(ConfigError, match=f"passages must be a whole number of at least 1, not {bad!r}"):
            load("lm").check_evaluate("lm", {"multipliers": "1", "passages": bad})


@pytest.mark.parametrize("entry, tasks, says", [
    ({"steps": 0}, ["lm"], "tasks: lm: steps must be a whole number at least 1"),
    ({}, ["lm", "mlm"], "task mlm has no entry in "),
])
def test_a_study_refuses_a_bad_task_entry_in_one_line_before_anything_runs(tmp_path, capsys, entry, tasks, says):
    from pipelines import study

    params = study_params(tmp_path, lm=entry)
    with pytest.raises(SystemExit) as stop:
        study.main(["none", "--params", params, "--tasks", *tasks, "--runs-dir", str(tmp_path / "runs"),
                    "--results-dir", str(tmp_path / "results")])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"study refused, nothing was run: {says}")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
