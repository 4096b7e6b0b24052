"""A new user's path through runs: refused resumes and settings leave nothing
changed, own data reads only its folder, short runs validate, runs tell
themselves apart in MLflow, and the console says what it should."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from posenc.data import DataError
from posenc.train import ConfigError, train

from .conftest import REPO, cli_env, cli_overrides
from .test_train import _cli, runs_of


def snapshot(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` with the hash of its contents."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def two_folders(tmp_path, data_root):
    """Two folders of own text with the same (byte) vocabulary and different contents."""
    a, b = tmp_path / "books-a", tmp_path / "books-b"
    a.mkdir()
    b.mkdir()
    (a / "a.txt").write_text((data_root / "tinyshakespeare" / "input.txt").read_text()[:200_000])
    (b / "b.txt").write_text((data_root / "gutenberg" / "carroll-alice.txt").read_text()[:200_000])
    return a, b


OWN = ["data=text", "data.vocab_size=260", "trainer.max_steps=4", "trainer.val_check_interval=2"]


def test_refused_resume_on_other_data_leaves_the_earlier_run_as_it_was(make_cfg, tmp_path, two_folders):
    a, b = two_folders
    train(make_cfg(*OWN, f"data.corpus.root={a}"))
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").glob("**/run.json")]
    files, (before,) = snapshot(run_dir), runs_of(tmp_path)

    with pytest.raises(ConfigError, match="token checksum") as err:
        train(make_cfg(*OWN, f"data.corpus.root={b}", "trainer.max_steps=8", "ckpt_path=last"))
    assert "no earlier run fits" in str(err.value)
    assert snapshot(run_dir) == files
    (after,) = runs_of(tmp_path)
    assert after.info.status == "FINISHED" == before.info.status
    assert after.data.tags == before.data.tags and after.data.params == before.data.params

    # another scheme: the message names the run that would fit
    with pytest.raises(ConfigError, match=r"encoding.name: .*rope.* in the checkpoint, alibi now") as err:
        train(make_cfg(*OWN, f"data.corpus.root={a}", "encoding=alibi", f"ckpt_path={run_dir}/checkpoints/last.ckpt"))
    assert f"runs that fit these settings: {run_dir}" not in str(err.value)  # it is rope: none fits alibi
    assert snapshot(run_dir) == files

    # the same data resumes, and the run's record follows the new step budget
    resumed = train(make_cfg(*OWN, f"data.corpus.root={a}", "trainer.max_steps=8", "ckpt_path=last"))
    assert resumed["global_step"] == 8
    (run,) = runs_of(tmp_path)
    assert run.info.status == "FINISHED" and run.data.tags["trainer.max_steps"] == "8"
    assert "trainer.max_steps" not in run.data.params
    assert run.data.tags["data_root"] == before.data.tags["data_root"]


def test_wrong_folder_names_the_run_that_fits(make_cfg, tmp_path, two_folders):
    a, _ = two_folders
    train(make_cfg(*OWN, f"data.corpus.root={a}", "run_name=mine"))
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").glob("**/run.json")]
    train(make_cfg(*OWN, f"data.corpus.root={a}", "encoding=alibi", "run_name=other"))
    other = [p for p in (tmp_path / "outputs").glob("**/checkpoints/last.ckpt") if p.parent.parent != run_dir][0]
    with pytest.raises(ConfigError, match=f"runs that fit these settings: {run_dir} \\(mine\\)"):
        train(make_cfg(*OWN, f"data.corpus.root={a}", f"ckpt_path={other}"))


def test_own_data_needs_its_folder(make_cfg, tmp_path):
    cfg = make_cfg("data=text")
    assert cfg.data.corpus.root is None  # not the data directory of the other corpora
    with pytest.raises(DataError, match=r"data.corpus.root=<folder of .txt files>"):
        train(cfg)
    assert runs_of(tmp_path) == [] and not (tmp_path / "outputs").exists()


def test_short_run_validates_at_its_end_logs_lr_and_test(make_cfg, tmp_path):
    metrics = train(make_cfg("trainer.max_steps=6", "trainer.val_check_interval=200", "test_at_end=true"))
    assert metrics["global_step"] == 6
    assert {"val/loss", "val/ppl", "test/loss", "test/ppl"} <= set(metrics)
    (run,) = runs_of(tmp_path)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(client.get_metric_history(run.info.run_id, "val/loss")) == 1  # once, at the end
    assert "test/ppl" in run.data.metrics
    assert len(client.get_metric_history(run.info.run_id, "train/lr")) == 3  # every 2nd of 6 steps
    assert list(tmp_path.glob("outputs/runs/*/checkpoints/best-step=6.ckpt"))


def test_runs_tell_themselves_apart(make_cfg, tmp_path):
    train(make_cfg("trainer.max_steps=2"))
    train(make_cfg("trainer.max_steps=2", "data=wikitext2", "data.vocab_size=260"))
    runs = runs_of(tmp_path)
    # the MLflow name is short (the runs table cuts long names off); the corpus is the Dataset column
    assert [r.info.run_name for r in runs] == ["rope-lm-s0", "rope-lm-s0"]
    assert sorted(r.data.tags["data"] for r in runs) == ["tinyshakespeare", "wikitext2"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    # the UI opens the experiment on its runs ("Model training"), not on GenAI traces
    assert client.get_experiment(runs[0].info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    for r in runs:
        (inp,) = client.get_run(r.info.run_id).inputs.dataset_inputs
        assert inp.dataset.name == r.data.tags["data"]
        assert inp.dataset.digest == r.data.tags["data_tokens_sha256"][:12]
        note = r.data.tags["mlflow.note.content"]
        assert f"on {r.data.tags['data']}" in note and "d=32 x 2 layers" in note


@pytest.mark.parametrize("bad, setting", [
    ("data.seq_len=-5", "data.seq_len"),
    ("ckpt_path=last", "ckpt_path=last"),
    ("paths.data_dir=/no/such/folder", "paths.data_dir"),
    ("encoding.scheme.fraction=0.3", "encoding.scheme.fraction"),
    ("optim.lr=-0.001", "optim.lr=-0.001 must be a number at least 0"),
    ("optim.lr=abc", "optim.lr=abc must be a number at least 0"),
    ("optim.betas=[0.9,1.5]", "optim.betas"),
    ("seed=x", "seed=x must be a whole number"),
    ("encoding=xyz", "encoding=xyz is not an option; available: alibi, cape,"),
    ("model.d_model=abc", "model.d_model: Value 'abc' of type 'str' could not be converted to Integer"),
    ("encoding=alibii", "encoding=alibii is not an option; did you mean 'alibi'? available: alibi,"),
    ("encoding=RoPE", "did you mean 'rope'?"),
    ("trainer.max_steps=1e3", "trainer.max_steps=1000.0 must be a whole number at least 1, written as one: 1000"),
    ("executor=gpus", "executor=gpus: executor is no setting of a run: where the study's jobs run"),
    ("+executor=gpus", "+executor=gpus: executor is no setting of a run"),
])
@pytest.mark.slow
def test_refused_settings_are_one_line_and_leave_nothing(tmp_path, data_root, cache_dir, bad, setting):
    r = _cli(tmp_path, data_root, cache_dir, *cli_overrides(cache_dir), bad)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr + r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and setting in errors[0], r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == errors  # nothing but the one line
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # no run folder, no MLflow store


@pytest.mark.slow
def test_misspelt_setting_gets_the_closest_one(tmp_path, data_root, cache_dir):
    r = _cli(tmp_path, data_root, cache_dir, "trainer.max_step=10")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [  # Hydra's own report is not printed before it
        "error: trainer.max_step is not a setting; did you mean trainer.max_steps? "
        "(to add a new key, write +trainer.max_step=10)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_logger_null_trains_without_mlflow(tmp_path, data_root, cache_dir):
    r = _cli(tmp_path, data_root, cache_dir, *cli_overrides(cache_dir), "logger=null", "trainer.max_steps=2",
             "trainer.val_check_interval=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "mlflow.db").exists()
    assert len(list(tmp_path.glob("outputs/runs/*/checkpoints/last.ckpt"))) == 1


def test_own_folder_missing_names_only_its_setting(make_cfg, tmp_path):
    with pytest.raises(DataError) as err:
        train(make_cfg("data=text", f"data.corpus.root={tmp_path / 'nowhere'}"))
    assert "data.corpus.root" in str(err.value) and "hub" not in str(err.value)


def test_refused_corpus_leaves_no_cache_folder_or_lock(make_cfg, tmp_path):
    """A corpus too small to split is refused; its half-made cache folder and lock go."""
    own = tmp_path / "tiny"
    own.mkdir()
    (own / "t.txt").write_text("one line\ntwo lines\nthree lines\n")
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match="leave an empty split of 3 lines"):
        train(make_cfg("data=text", f"data.corpus.root={own}", "data.vocab_size=260", f"paths.cache_dir={cache}"))
    assert list(cache.iterdir()) == []


@pytest.mark.slow
def test_console_says_steps_and_where_the_run_is(tmp_path, data_root, cache_dir):
    args = [o for o in cli_overrides(cache_dir) if not o.startswith("trainer.enable_")]
    r = _cli(tmp_path, data_root, cache_dir, *args, "trainer.max_steps=4", "trainer.val_check_interval=2")
    out = r.stdout + r.stderr
    assert r.returncode == 0, r.stderr[-3000:]
    assert "litlogger" not in out and "Epoch 0/-" not in out
    assert "step" in out and "4/4" in out  # the bar counts optimiser steps of the run
    flops = [line for line in out.splitlines() if "Total FLOPs" in line]
    assert flops and not flops[0].rstrip().endswith(" 0"), flops
    (run,) = runs_of(tmp_path)
    assert f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}" in out
    # the runs table, not MLflow 3's GenAI view, which opens without the workflow type
    assert f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}?workflowType=machine_learning" in out
    assert f"/runs/{run.info.run_id}?workflowType=machine_learning" in out
    assert "mlflow ui --backend-store-uri sqlite:///" in out
    meta = json.loads(next((tmp_path / "outputs").glob("**/run.json")).read_text())
    assert meta["identity"]["data.corpus.name"] == "tinyshakespeare"


@pytest.mark.slow
def test_a_scheme_outside_the_tree_trains_from_the_command_line(tmp_path, data_root, cache_dir):
    """`python train.py hydra.searchpath=[file://<root>] encoding=<name>`: the one-line check of
    the overrides composes with the same search path, so the scheme is an option (and an
    unknown name lists it among them) instead of being refused."""
    root, src = tmp_path / "mine" / "conf", tmp_path / "mine" / "src"
    (root / "encoding").mkdir(parents=True)
    src.mkdir()
    (src / "my_scheme.py").write_text(
        "from posenc.encodings.base import PositionalScheme\n\n\n"
        "class Mine(PositionalScheme):\n    \"\"\"No positions at all.\"\"\"\n")
    (root / "encoding" / "mine.yaml").write_text("name: mine\nscheme:\n  _target_: my_scheme.Mine\n  _partial_: true\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    search = f"hydra.searchpath=[file://{root}]"

    def cli(*args):
        env = cli_env(run_dir, data_root, cache_dir) | {"PYTHONPATH": str(src)}
        return subprocess.run([sys.executable, str(REPO / "train.py"), search, *args], cwd=run_dir, env=env,
                              capture_output=True, text=True, timeout=600)

    unknown = cli("encoding=minee")
    assert unknown.returncode == 2, unknown.stderr[-2000:]
    assert unknown.stderr.strip().startswith("error: encoding=minee is not an option; did you mean 'mine'? available: ")
    assert ", mine, " in unknown.stderr
    shown = cli("encoding=mine", "--help")  # the help composes with the same search path
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert ", mine, " in shown.stdout and "name: mine" in shown.stdout
    r = cli(*cli_overrides(cache_dir), "encoding=mine", "logger=null", "trainer.max_steps=2",
            "trainer.val_check_interval=2")
    assert r.returncode == 0, r.stderr[-3000:]
    (metrics,) = run_dir.glob("outputs/runs/*mine-lm-*/metrics.json")
    assert json.loads(metrics.read_text())["encoding"] == "mine"


@pytest.mark.slow
def test_help_lists_the_groups_a_run_takes(tmp_path, data_root, cache_dir):
    """``--help`` names every group a run takes, with its options, and the composed config;
    not the study's executors nor the model schema, which a run does not take."""
    r = _cli(tmp_path, data_root, cache_dir, "encoding=alibi", "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    groups = dict(line.split(": ", 1) for line in r.stdout.split("== Config ==")[0].splitlines()
                  if ": " in line and not line.startswith("python"))
    assert set(groups) == {"data", "encoding", "experiment", "logger", "model", "paths", "task", "trainer"}
    assert "alibi" in groups["encoding"].split(", ") and "t5_bias" in groups["encoding"].split(", ")
    assert "_target_: posenc.encodings.ALiBi" in r.stdout.split("== Config ==")[1]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_pipelines_pin_mkl_for_every_stage_and_job():
    """``import pipelines`` (every stage command does) sets MKL's instruction set for the
    stage and what it starts, unless the environment chose one."""
    code = "import os, pipelines; print(os.environ['MKL_ENABLE_INSTRUCTIONS'])"
    env = {k: v for k, v in os.environ.items() if k != "MKL_ENABLE_INSTRUCTIONS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AVX2"
    env["MKL_ENABLE_INSTRUCTIONS"] = "AVX512"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AVX512"


#: ``python train.py`` with Hydra's composition and the settings' checks counted
COUNTED = """
import atexit, runpy, sys
from hydra._internal import config_loader_impl
import posenc.config, posenc.tasks, posenc.train
count = {"composed": 0, "checked": 0, "tasks": 0}
load, check = config_loader_impl.ConfigLoaderImpl.load_configuration, posenc.config.check_config
def counted_load(self, *a, **k):
    count["composed"] += 1
    return load(self, *a, **k)
def counted_check(cfg, task=None):
    count["checked"] += 1
    return check(cfg, task)
task_init = posenc.tasks.Task.__init__
def counted_task(self, *a, **k):
    count["tasks"] += 1
    task_init(self, *a, **k)
posenc.tasks.Task.__init__ = counted_task
config_loader_impl.ConfigLoaderImpl.load_configuration = counted_load
posenc.config.check_config = posenc.train.check_config = counted_check
atexit.register(lambda: print(f"COUNTED {count['composed']} {count['checked']} {count['tasks']}", file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_run_composes_its_config_once_and_checks_it_once(tmp_path, data_root, cache_dir):
    """``python train.py encoding=alibi``: Hydra composes the config once (its config loader
    is called once), the checks run once (``check_config``; the cheap ones that need no scheme,
    task or data also ran before the trainer was imported, ``posenc.cli.early_refusal``) and
    one task object serves the checks, the data and the module; the run trains and its folder holds Hydra's record of that config. (Before:
    four compositions, the one-line refusals' two and Hydra's wrapper's two, one of them to
    read the mode; two checks; three task objects.)"""
    r = _cli(tmp_path, data_root, cache_dir, "encoding=alibi", *cli_overrides(cache_dir), "logger=null",
             "trainer.max_steps=2", "trainer.val_check_interval=2", wrapper=COUNTED)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "COUNTED 1 1 1" in r.stderr.splitlines(), r.stderr[-1000:]
    (run,) = [p.parent for p in tmp_path.rglob("metrics.json")]
    assert "name: alibi" in (run / ".hydra" / "config.yaml").read_text()
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 2
