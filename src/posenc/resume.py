"""Resume and identity: which checkpoint a run continues, and whether it may.

A run's identity (``run_identity``) is every setting that changes what is trained plus the
checksum of its data's tokens; a checkpoint is resumed only by a run of the same identity
(``resolve_resume``: ``ckpt_path=last`` or a path), and only when something is left to train
(``nothing_left``). A resume keeps the learning-rate schedule of the run it continues
(``schedule_steps``) and continues in that run's folder (``continue_in``). Every refusal is a
``ConfigError`` raised before anything is written, naming what differs and which runs would fit.
``posenc.train`` asks these questions in its first step; nothing here trains.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .errors import ConfigError
from .runs import RunFolder, load_state, run_info, stored_run


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def run_identity(cfg: DictConfig | dict, tokens_sha256: str | None) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it: every setting that
    changes what is trained (``IDENTITY_KEYS``: the scheme, the model, the task, the data's
    corpus, vocabulary, window and batch, the optimiser and its schedule, the seed, the
    precision and gradient settings) and the checksum of the data's tokens, which changes
    with the files and with the tokenizer. What a resume may change is ``RESUMABLE``."""
    cfg = OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg
    identity = {key: _plain(OmegaConf.select(cfg, key)) for key in IDENTITY_KEYS}
    identity["data.tokens_sha256"] = tokens_sha256
    return tracking.flatten(identity)


#: settings a checkpoint must share with the run that resumes it (plus the token checksum)
IDENTITY_KEYS = ("encoding", "model", "task", "data.corpus.name", "data.vocab_size", "data.min_frequency",
                 "data.seq_len", "data.batch_size", "optim", "seed", "trainer.precision",
                 "trainer.accumulate_grad_batches", "trainer.gradient_clip_val")
#: what a resume may change, the rest being the run's identity or how it is logged and stored:
#: the step budget (to extend a run), the criterion, the intervals of validation and logging,
#: the share of the validation and test splits scored, the device, the console's output, compilation,
#: the attention route (the same values on every route, to float rounding)
RESUMABLE = ("trainer.max_steps", "criterion", "trainer.val_check_interval", "trainer.log_every_n_steps",
             "trainer.limit_val_batches", "trainer.limit_test_batches", "trainer.accelerator", "trainer.devices",
             "trainer.strategy", "trainer.num_nodes", "trainer.enable_progress_bar", "trainer.enable_model_summary",
             "data.eval_batch_size", "data.num_workers", "test_at_end", "log_checkpoint", "ckpt_path", "compile",
             "attention.route")


def identity_differences(have: dict, want: dict) -> list[str]:
    """``key: X in the checkpoint, Y now`` for every setting that differs."""
    out = []
    other_scheme = have.get("encoding.name") != want.get("encoding.name")
    for key in sorted(set(have) | set(want)):
        if other_scheme and key.startswith("encoding.") and key != "encoding.name":
            continue  # another scheme: its settings differ too, the name says enough
        if have.get(key) != want.get(key):
            shown = [("not recorded" if v is None else v) for v in (have.get(key), want.get(key))]
            if key == "data.tokens_sha256":
                shown = [v if v == "not recorded" else str(v)[:12] for v in shown]
                key = "data (token checksum: other files or another tokenizer)"
            out.append(f"{key}: {shown[0]} in the checkpoint, {shown[1]} now")
    return out


def checkpoint_identity(ckpt: Path, info: dict) -> dict:
    """The identity a checkpoint was trained with: from its run's ``run.json``
    (``info``) when that records one (no checkpoint is read), else from the
    checkpoint itself (older checkpoints lack the token checksum)."""
    if info.get("identity"):
        return dict(info["identity"])
    hp = stored_run(load_state(ckpt), ckpt)
    if hp.get("identity"):
        return dict(hp["identity"])
    return run_identity(hp["cfg"], None)


def earlier_runs(output_dir: str | Path) -> list[tuple[Path, dict]]:
    """(``last.ckpt``, ``run.json``) of every run under ``output_dir`` that has one, newest first."""
    found = [(run.last, run.info()) for run in RunFolder.under(output_dir) if run.last.exists()]
    return sorted(found, key=lambda item: item[0].stat().st_mtime, reverse=True)


def _fitting_runs(runs: list[tuple[Path, dict]], want: dict) -> str:
    fits = [f"{RunFolder.of(ckpt).path} ({info.get('run_name')})" for ckpt, info in runs if info.get("identity") == want]
    if fits:
        return "runs that fit these settings: " + ", ".join(fits[:3])
    return "no earlier run fits these settings: start a fresh run (ckpt_path=null)"


def resolve_resume(cfg: DictConfig, want: dict) -> tuple[Path | None, dict]:
    """(checkpoint to resume from, run.json of the run that wrote it), checked
    against ``want`` (this run's identity) before anything is written.

    ``ckpt_path=last`` takes the newest run with this run name whose identity
    (read from its ``run.json``) is ``want``; a refusal names what differs and
    which runs would fit. The chosen checkpoint is checked to be readable here
    and is loaded once, by Lightning.
    """
    if cfg.ckpt_path in (None, ""):
        return None, {}
    runs = earlier_runs(cfg.paths.output_dir)
    if cfg.ckpt_path == "last":
        named = [(c, info) for c, info in runs if info.get("run_name") == cfg.run_name]
        if not named:
            raise ConfigError(
                f"ckpt_path=last: no run named {cfg.run_name!r} with a last.ckpt under {cfg.paths.output_dir}; "
                "give ckpt_path=<path to a .ckpt> or start a fresh run (ckpt_path=null)"
            )
        diffs = [(ckpt, info, identity_differences(checkpoint_identity(ckpt, info), want)) for ckpt, info in named]
        fitting = [(ckpt, info) for ckpt, info, diff in diffs if not diff]
        if not fitting:
            ckpt, _, diff = diffs[0]
            raise ConfigError(
                f"ckpt_path=last: no run named {cfg.run_name!r} fits this run; the newest, "
                f"{RunFolder.of(ckpt).path}, differs in {'; '.join(diff)}; {_fitting_runs(runs, want)}"
            )
        ckpt, info = fitting[0]
        nothing_left(cfg, ckpt)
    else:
        ckpt = Path(cfg.ckpt_path)
        load_state(ckpt, mmap=True)  # there and readable, before its identity is read
        info = run_info(ckpt)
        diff = identity_differences(checkpoint_identity(ckpt, info), want)
        if diff:
            raise ConfigError(
                f"checkpoint {ckpt} does not fit this run: {'; '.join(diff)}; {_fitting_runs(runs, want)}"
            )
        nothing_left(cfg, ckpt)
    return ckpt, info


def nothing_left(cfg: DictConfig, ckpt: Path) -> None:
    """Refuse a resume that would train nothing: the checkpoint is at ``trainer.max_steps`` or
    past it, or its run stopped at its criterion. Reads the checkpoint's step (memory-mapped,
    so a truncated file is refused here too), and touches nothing."""
    step = int(load_state(ckpt, mmap=True).get("global_step", 0))
    folder = RunFolder.of(ckpt).path
    if step >= int(cfg.trainer.max_steps):
        raise ConfigError(f"{folder} is already at step {step}, and trainer.max_steps={cfg.trainer.max_steps}: nothing "
                          f"to train; give a larger trainer.max_steps to extend it (the run is left as it was)")
    done = RunFolder(folder).metrics
    if done.exists() and "criterion_step" in json.loads(done.read_text()) and cfg.get("criterion", {}).get("metric"):
        raise ConfigError(f"{folder} stopped at its criterion ({cfg.criterion.metric} past {cfg.criterion.value}) at "
                          f"step {step}: nothing to train; criterion.metric=null trains it on to trainer.max_steps")


def schedule_steps(cfg: DictConfig, ckpt: Path | None, info: dict) -> int:
    """Length of the run's LR schedule (warm-up + cosine). A fresh run: ``optim.schedule_steps``,
    else ``trainer.max_steps``. A resume keeps the schedule of the run it continues (from its
    ``run.json``, or from the checkpoint's config for runs that predate the record), so a run
    extended past it trains on at the schedule's final LR rather than warming up again."""
    if ckpt is None:
        return int(cfg.optim.get("schedule_steps") or cfg.trainer.max_steps)
    if info.get("schedule_steps"):
        return int(info["schedule_steps"])
    old = stored_run(load_state(ckpt, mmap=True), ckpt)["cfg"]
    return int(old.get("optim", {}).get("schedule_steps") or old["trainer"]["max_steps"])


def continue_in(run_folder: Path) -> None:
    """A resume continues in the folder of the run it resumes: Hydra's fresh job folder
    for this command is folded into it, so no second folder with the same run name is
    left. Hydra's config of the resume goes to ``<run>/.hydra/resume-<time>/``, and its log
    is appended to ``<run>/train.log`` (the lines so far, then the rest of the run). Under
    DDP every rank points its own log handler there; rank 0 alone moves files."""
    try:
        job = Path(HydraConfig.get().runtime.output_dir)
    except ValueError:  # compose API: no Hydra folder
        return
    if not job.is_dir() or job.resolve() == run_folder.resolve():
        return
    first = rank_zero_only.rank == 0
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == job:
            handler.close()  # reopened lazily, appending, at the run's own log
            written, target = Path(handler.baseFilename), run_folder / Path(handler.baseFilename).name
            if first and written.exists():
                with open(target, "a") as out:
                    out.write(written.read_text())
                written.unlink()
            handler.baseFilename, handler.mode = str(target), "a"
    if first:
        if (job / ".hydra").is_dir():
            resumed = run_folder / ".hydra" / f"resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}"
            shutil.move(str(job / ".hydra"), str(resumed))
        if not any(job.iterdir()):
            job.rmdir()
