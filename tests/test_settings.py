"""Every setting that cannot work is refused before anything is written, settings that only
cost time are warned about, and a resume never mixes two runs' settings or loses what a run
measured.

The ranges are declared once (``posenc.config.numeric_ranges``: the model schema's field
metadata and ``RANGES``); the property tests here try values just outside every declared
range and check that every numeric setting the configs have is declared, so a new setting
cannot go unchecked."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from posenc import tracking
from posenc.config import check_config, compose, cost_warnings, numeric_ranges
from posenc.errors import ConfigError
from posenc.resume import IDENTITY_KEYS, RESUMABLE
from posenc.train import train

from .conftest import FAST, cli_overrides
from .test_train import _cli, runs_of
from .test_user_path import snapshot

#: the options a declared setting needs before the config has it
NEEDS = {"task.mask_prob": ["task=mlm"], "task.digits": ["task=retrieval"], "task.needles": ["task=retrieval"],
         "trainer.num_nodes": ["trainer=ddp"], "criterion.value": ["task=retrieval", "criterion.metric=val/exact"],
         "data.corpus.split_fractions.validation": ["data=tinyshakespeare"],
         "data.corpus.split_fractions.test": ["data=tinyshakespeare"]}


def _cases():
    return [(key, value) for key, rng in numeric_ranges().items() for value in rng.outside()]


@pytest.mark.parametrize("key,value", _cases(), ids=lambda v: str(v))
def test_no_value_outside_a_declared_range_passes_the_checks(tmp_path, data_root, cache_dir, key, value):
    """Through the command line's own path: the override either does not compose (a schema's
    type refuses it: ``model.d_model=2.5``) or ``check_config`` refuses it, naming the setting."""
    from posenc.cli import composition_error, early_refusal

    overrides = [f"paths.root={tmp_path}", f"paths.data_dir={data_root}", f"paths.cache_dir={cache_dir}", *FAST,
                 *NEEDS.get(key, []), f"{key}={value}"]
    message = composition_error(overrides)
    if message is not None:
        assert message.startswith(f"error: {key}"), message
        return
    cfg = compose(overrides)
    with pytest.raises(ConfigError, match=rf"^{key}={value}(\.0)? must be ") as refused:  # a float schema: 1 as 1.0
        check_config(cfg)
    # the command line refuses it in the same words before it imports the trainer
    assert early_refusal(cfg) == f"error: {refused.value}"


def _numeric_leaves(cfg) -> set[str]:
    flat = tracking.flatten(OmegaConf.to_container(cfg, resolve=True))
    return {k for k, v in flat.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


@pytest.mark.parametrize("options", [["task=lm"], ["task=mlm"], ["task=retrieval"], ["trainer=ddp"], ["trainer=gpu"],
                                     ["data=wikitext2", "model=base"], ["criterion.metric=val/loss"]])
def test_every_numeric_setting_has_a_declared_range(options):
    """A numeric setting of any config is in the model schema's ranges or in ``RANGES``, but for
    a scheme's own settings (its constructor checks them, and ``check_config`` builds it),
    a copy that interpolates another setting (``data.seed``) and
    ``trainer.devices`` (checked against the machine by ``check_device``)."""
    cfg = compose(options + ["criterion.value=0.5"] * ("criterion.metric=val/loss" in options))
    exempt = ("encoding.", "data.seed", "trainer.devices")
    undeclared = {k for k in _numeric_leaves(cfg) if not k.startswith(exempt)} - set(numeric_ranges())
    assert not undeclared, f"numeric settings without a declared range: {sorted(undeclared)}"


def test_a_window_past_max_len_and_a_run_of_hours_are_warned_about(make_cfg):
    """Not refused (a scheme not bound by ``model.max_len`` can run past it), but one line each,
    naming the cost and the choice. (The tests' 20-step runs warm up for 5 steps here: the
    default 50-step warm-up longer than the run is warned about too, in tests/test_run_edges.py.)"""
    short = "optim.warmup_steps=5"
    assert cost_warnings(make_cfg(short), None) == []
    (window,) = check_config(make_cfg("encoding=rope", "model.max_len=64", "data.seq_len=256", short))
    assert window.startswith("data.seq_len=256 is past model.max_len=64: rope is not bound by it") and "16x" in window
    (hours,) = check_config(make_cfg("model=base", "model.d_model=512", "model.d_ff=2048", "model.n_heads=8",
                                     "data.seq_len=512", "trainer.max_steps=20000", "data.batch_size=32"))
    assert "PFLOP of training" in hours and "hour(s) on a CPU" in hours and "trainer=gpu" in hours
    with pytest.raises(ConfigError, match="learned"):  # a bound scheme is refused, not warned about
        check_config(make_cfg("encoding=learned", "model.max_len=64", "data.seq_len=256"))


@pytest.mark.parametrize("bad, says", [
    ("trainer=gpu", "trainer=gpu needs a CUDA GPU and torch sees none here; train on the CPU with trainer=cpu"),
    ("trainer.max_steps=0", "trainer.max_steps=0 must be a whole number at least 1"),
    ("trainer.max_steps=-5", "trainer.max_steps=-5 must be a whole number at least 1"),
    ("trainer.max_steps=-1", "trainer.max_steps=-1 must be a whole number at least 1"),
    ("data.batch_size=0", "data.batch_size=0 must be a whole number at least 1"),
    ("model.n_layers=0", "model.n_layers=0 must be a whole number at least 1"),
    ("trainer.val_check_interval=0.5", "trainer.val_check_interval=0.5 must be a whole number at least 1"),
])
@pytest.mark.may_skip(reason="the GPU case is refused only where torch sees no GPU")
@pytest.mark.slow
def test_the_settings_that_used_to_start_a_run_are_refused_in_one_line(tmp_path, data_root, cache_dir, bad, says):
    import torch

    if bad == "trainer=gpu" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _cli(tmp_path, data_root, cache_dir, *cli_overrides(cache_dir), bad, wrapper=SAYS_IF_LIGHTNING)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [f"error: {says}"]
    assert [p for p in tmp_path.rglob("*")] == []  # no run folder, no cache folder, no MLflow store
    # refused before the trainer was imported (Lightning and MLflow: most of a run's start-up)
    assert r.stdout.strip() == "imported: lightning False, mlflow False", r.stdout


#: ``python train.py <args>`` that says at its exit whether Lightning and MLflow were imported
SAYS_IF_LIGHTNING = """
import atexit, runpy, sys
atexit.register(lambda: print(f"imported: lightning {'lightning' in sys.modules}, mlflow {'mlflow' in sys.modules}"))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_sweep_with_a_refused_point_writes_nothing(tmp_path, data_root, cache_dir):
    r = _cli(tmp_path, data_root, cache_dir, "-m", *cli_overrides(cache_dir), "model.n_layers=2,0")
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "error: sweep point 2 of 2 (model.n_layers=0): model.n_layers=0 must be a whole number at least 1"]
    assert list(tmp_path.iterdir()) == []  # no outputs/multirun folder


def test_the_identity_and_what_a_resume_may_change_are_apart():
    """Every setting of the config is in the identity a resume must match, in the short list
    of what a resume may change, or is how the run is stored and logged (paths, logger, run
    name, callbacks, Hydra): a new setting has to be put in one of them."""
    cfg = compose(["task=retrieval", "trainer=ddp"])
    flat = tracking.flatten(OmegaConf.to_container(cfg, resolve=False))
    storage = ("paths.", "logger.", "run_name", "callbacks", "init_from", "hydra", "data.cache_dir", "data.corpus.",
               "data._target_", "data._convert_", "data.seed", "trainer._target_", "trainer.deterministic",
               "trainer.check_val_every_n_epoch", "trainer.use_distributed_sampler", "encoding.name")
    placed = lambda k: any(k == p or k.startswith(p + ".") for p in (*IDENTITY_KEYS, *RESUMABLE))  # noqa: E731
    unplaced = [k for k in flat if not placed(k) and not k.startswith(storage)]
    assert not unplaced, f"settings neither in the identity nor resumable: {unplaced}"
    assert not set(IDENTITY_KEYS) & set(RESUMABLE)


RUN = [*FAST, "trainer.max_steps=6", "trainer.val_check_interval=3", "encoding=alibi"]


def test_a_resume_at_another_window_is_refused_naming_both_values(make_cfg, tmp_path):
    train(make_cfg(*RUN))
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").glob("**/run.json")]
    files, (before,) = snapshot(run_dir), runs_of(tmp_path)
    for setting, have, now in [("data.seq_len", 32, 64), ("data.batch_size", 8, 4), ("optim.lr", 0.001, 0.003)]:
        with pytest.raises(ConfigError, match=rf"{setting}: {have} in the checkpoint, {now} now"):
            train(make_cfg(*RUN, f"{setting}={now}", "trainer.max_steps=9", "ckpt_path=last"))
    assert snapshot(run_dir) == files
    (after,) = runs_of(tmp_path)
    assert (after.info.status, after.info.end_time, after.data.params) == (
        before.info.status, before.info.end_time, before.data.params)


def test_a_resume_with_nothing_left_to_do_is_refused_and_changes_nothing(make_cfg, tmp_path):
    metrics = train(make_cfg(*RUN))
    (run_dir,) = [p.parent for p in (tmp_path / "outputs").glob("**/run.json")]
    files, (before,) = snapshot(run_dir), runs_of(tmp_path)
    with pytest.raises(ConfigError, match=r"is already at step 6, and trainer.max_steps=6: nothing to train"):
        train(make_cfg(*RUN, "ckpt_path=last"))
    assert snapshot(run_dir) == files
    assert json.loads((run_dir / "metrics.json").read_text())["val/loss"] == pytest.approx(metrics["val/loss"])
    (after,) = runs_of(tmp_path)
    assert (after.info.end_time, after.data.metrics) == (before.info.end_time, before.data.metrics)


def test_a_run_at_its_criterion_has_nothing_left_to_do(make_cfg, tmp_path):
    criterion = ["task=retrieval", "criterion.metric=val/exact", "criterion.value=-1"]
    train(make_cfg(*RUN, *criterion))  # stops at its first validation, step 3
    with pytest.raises(ConfigError, match=r"stopped at its criterion .* at step 3: nothing to train"):
        train(make_cfg(*RUN, *criterion, "trainer.max_steps=12", "ckpt_path=last"))


@pytest.mark.slow
def test_an_extended_resume_says_so_and_no_lightning_warning_about_its_folder(tmp_path, data_root, cache_dir):
    base = [*cli_overrides(cache_dir), "encoding=alibi", "trainer.max_steps=4", "trainer.val_check_interval=2"]
    first = _cli(tmp_path, data_root, cache_dir, *base)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _cli(tmp_path, data_root, cache_dir, *base[:-2], "trainer.max_steps=6", "trainer.val_check_interval=2",
                 "ckpt_path=last")
    assert again.returncode == 0, again.stderr[-2000:]
    out = again.stdout + again.stderr
    assert "past its 4-step schedule: it trains on at the schedule's final learning rate" in out
    assert "exists and is not empty" not in out
