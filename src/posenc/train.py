"""Training: ``train(cfg)`` is a plain function; ``posenc.cli.main`` is the Hydra wrapper.

Four steps, in this order, so that bad input fails before anything is written:

* ``prepare``: the settings' checks, the data, and the checkpoint a resume continues (the
  resume and identity policy is ``posenc.resume``); nothing is written yet.
* ``build``: the model, the run folder, the MLflow logger, the callbacks and the trainer.
* ``fit``: the MLflow run's start, training (to ``trainer.max_steps`` or the criterion), the
  test split, the artifacts; an interrupt saves ``last.ckpt`` and marks the run KILLED, any
  other failure FAILED.
* ``record``: ``metrics.json`` and the run's closing line.

The whole run writes through ``posenc.streams.pipe_safe``: a standard stream whose reader has
gone (``python train.py | tee log`` and Ctrl-C) cannot break it.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .attention import use_route
from .callbacks import GracefulInterrupt, RunRecord, StepProgressBar, ValidateAtEnd, quiet_known_warnings
from .config import build_model, check_config
from .errors import ConfigError
from .files import write_json, write_text
from .module import LMModule
from .resume import continue_in, resolve_resume, run_identity, schedule_steps
from .runs import RunFolder, load_state
from .streams import pipe_safe
from .tasks import build as build_task

log = logging.getLogger(__name__)


def run_dir(cfg: DictConfig) -> Path:
    """Hydra's output folder, or a fresh one under paths.output_dir (compose API)."""
    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        d = Path(cfg.paths.output_dir) / "runs" / f"{stamp}_{cfg.run_name}_{os.getpid()}"
        d.mkdir(parents=True, exist_ok=True)
        return d


def initial_weights(module: LMModule, path: str | Path) -> None:
    """``init_from``: the model starts from a checkpoint's weights (fine-tuning);
    refused when they do not fit the model these settings build."""
    state = load_state(path)
    try:
        module.load_state_dict(state["state_dict"])
    except (KeyError, RuntimeError) as e:
        raise ConfigError(
            f"init_from={path}: its weights do not fit the model of these settings ({str(e).splitlines()[0][:200]}); "
            "give a checkpoint of the same model and vocabulary"
        ) from e


def build_logger(cfg: DictConfig, run_id: str | None):
    if cfg.get("logger") is None:
        return None
    kw = {"run_id": run_id} if run_id else {}
    if "tracking_uri" in cfg.logger:
        tracking.ensure_experiment(cfg.logger.tracking_uri, cfg.logger.experiment_name, cfg.logger.get("artifact_location"))
    return instantiate(cfg.logger, **kw)


#: settings logged as tags (which a resume updates), not as params (which MLflow never changes)
TAG_KEYS = ("trainer.max_steps", "ckpt_path")


def run_note(cfg: DictConfig, overrides: str) -> str:
    """One paragraph that tells a run apart in the MLflow run list (says when a resume
    trained past the run's LR schedule, or stopped before its end)."""
    m, d = cfg.model, cfg.data
    steps, schedule = int(cfg.trainer.max_steps), int(cfg.optim.schedule_steps or cfg.trainer.max_steps)
    budget = f"{steps} steps of {d.batch_size}"
    if steps > schedule:
        budget += f" (extended by a resume: a {schedule}-step schedule, at its final LR after step {schedule})"
    elif steps < schedule:
        budget += f" (of a {schedule}-step schedule)"
    return (
        f"{cfg.encoding.name} on {d.corpus.name} (vocabulary {d.vocab_size}, {d.seq_len}-token windows), "
        f"{cfg.task.name}, model d={m.d_model} x {m.n_layers} layers x {m.n_heads} heads, "
        f"{budget}, seed {cfg.seed}. Overrides: {overrides or '(none)'}"
    )


def _overrides() -> str:
    try:
        return " ".join(HydraConfig.get().overrides.task)
    except ValueError:
        return ""


@rank_zero_only
def log_run_start(logger, cfg: DictConfig, module: LMModule, resumed: bool, prepared) -> None:
    """Params, tags, description and dataset of a new run; on a resume only
    what a resume may change (the step budget and its own overrides), so the
    earlier run's record stays as it was."""
    exp, run_id = logger.experiment, logger.run_id
    overrides = _overrides()
    tags = {"trainer.max_steps": str(cfg.trainer.max_steps)}
    if resumed:
        tags["resume_overrides"] = overrides or "(none)"
        original = tracking.run_or_none(exp, run_id).data.tags.get("overrides", "")
        tags["mlflow.note.content"] = run_note(cfg, original)
    else:
        resolved = tracking.flatten(OmegaConf.to_container(cfg, resolve=True))
        counts = module.model.num_parameters()  # params, not a one-point metric chart
        resolved.update({"parameters.total": counts["total"], "parameters.positional": counts["positional"]})
        logger.log_hyperparams({k: str(v)[:6000] for k, v in resolved.items() if k not in TAG_KEYS})
        meta = prepared.meta
        tags.update({
            "encoding": cfg.encoding.name, "task": cfg.task.name, "data": cfg.data.corpus.name,
            "overrides": overrides or "(none)", "mlflow.note.content": run_note(cfg, overrides),
            "data_source": meta["source"], "data_root": str(meta.get("root")),
            "data_tokens_sha256": meta["tokens_sha256"], "data_cache": prepared.directory.name,
            **tracking.git_state(cfg.paths.root), **tracking.library_versions(),
        })
        tracking.log_dataset(exp, run_id, cfg.data.corpus.name, meta)
    tracking.log_tags(exp, run_id, tags)


@rank_zero_only
def log_run_end(logger, run: RunFolder, tokenizer: Path, best_ckpt: str | None, log_checkpoint: bool) -> None:
    exp, run_id = logger.experiment, logger.run_id
    tracking.log_files(exp, run_id, [run.config, tokenizer])
    if log_checkpoint:
        tracking.log_files(exp, run_id, sorted({best_ckpt, str(run.last) if run.last.exists() else None} - {None, ""}),
                           RunFolder.CHECKPOINTS)


@rank_zero_only
def record_routes(logger, run: RunFolder, model, resumed: bool) -> None:
    """The attention routes the run's forwards took (``Transformer.attention_routes``: in
    training and in evaluation) into its ``run.json`` and into MLflow, as the params
    ``attention.route_taken.<mode>`` of a new run (as tags on a resume: MLflow keeps a run's
    params as they were, and a resume may take another route, on another device)."""
    routes = model.attention_routes()
    write_json(run.run_json, run.info() | {"attention_routes": routes})
    if logger is None:
        return
    named = {f"attention.route_taken.{mode}": route for mode, route in routes.items()}
    if resumed:
        tracking.log_tags(logger.experiment, logger.run_id, named)
    else:
        logger.log_hyperparams(named)


def criterion_callback(cfg: DictConfig) -> EarlyStopping | None:
    """Lightning's ``EarlyStopping`` on its threshold alone: stop at the first validation
    where ``criterion.metric`` passes ``criterion.value`` (``patience`` never runs out, so a
    run that has not got there trains on to ``trainer.max_steps``, the cap)."""
    c = cfg.get("criterion") or {}
    if not c.get("metric"):
        return None
    return EarlyStopping(monitor=c.metric, mode=c.get("mode", "max"), stopping_threshold=float(c.value),
                         patience=2**62, check_on_train_epoch_end=False, check_finite=False)



@dataclass
class Plan:
    """What ``prepare`` decided before anything was written: the run's task object, its data
    module (prepared), its identity, and the checkpoint it resumes with that run's ``run.json``
    (``ckpt`` None and ``resumed`` empty for a fresh run)."""

    task: Any
    datamodule: Any
    identity: dict
    ckpt: Path | None
    resumed: dict


@dataclass
class Built:
    """What ``build`` made for ``fit``: the module, the run folder, the MLflow logger (None
    with ``logger=null``), the trainer, and the callbacks whose outcome ``fit`` reads."""

    module: LMModule
    run: RunFolder
    logger: Any
    trainer: L.Trainer
    checkpoint: ModelCheckpoint
    interrupt: GracefulInterrupt
    criterion: EarlyStopping | None


def train(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, float]:
    """Train one model as ``cfg`` says; returns the final callback metrics.

    ``out_dir``: the run folder (default: Hydra's output folder, or a fresh one
    under ``paths.output_dir`` when called through the compose API). Every
    check that can refuse the run (settings, data, the checkpoint to resume)
    comes before anything is written; a refusal raises ``ConfigError`` or
    ``DataError``.
    """
    started = time.perf_counter()
    with pipe_safe(), warnings.catch_warnings():
        quiet_known_warnings()
        plan = prepare(cfg)
        built = build(cfg, plan, out_dir)
        metrics = fit(cfg, plan, built)
        record(cfg, built, metrics, time.perf_counter() - started)
    return metrics


def prepare(cfg: DictConfig) -> Plan:
    """The checks that may refuse the run, before anything is written: the settings (their
    warnings logged), the data (prepared, or refused with ``DataError``) and the checkpoint a
    resume continues (``posenc.resume.resolve_resume``). Sets ``optim.schedule_steps``: a
    resume keeps the schedule of the run it continues."""
    task = build_task(cfg.task)  # one object for the checks, the data and the module
    for warning in check_config(cfg, task):
        log.warning(warning)
    use_route(cfg.attention.route)
    datamodule = instantiate(cfg.data, task=task)
    datamodule.prepare_data()  # errors about data surface here, before any run exists
    identity = run_identity(cfg, datamodule.prepared.meta["tokens_sha256"])
    ckpt, resumed = resolve_resume(cfg, identity)
    cfg.optim.schedule_steps = schedule_steps(cfg, ckpt, resumed)
    if ckpt is not None and cfg.trainer.max_steps > cfg.optim.schedule_steps:  # as the MLflow description says
        log.info("extending %s past its %d-step schedule: it trains on at the schedule's final learning rate "
                 "(optim.lr x optim.min_lr_ratio = %g) to step %d", RunFolder.of(ckpt).path, cfg.optim.schedule_steps,
                 cfg.optim.lr * cfg.optim.min_lr_ratio, cfg.trainer.max_steps)
    return Plan(task, datamodule, identity, ckpt, resumed)


def run_folder(cfg: DictConfig, ckpt: Path | None, out_dir: str | Path | None) -> Path:
    """Where the run writes: the folder of the run a resume continues (Hydra's folder for this
    command folded into it), else ``out_dir``, else Hydra's folder or a fresh one."""
    if ckpt:
        folder = RunFolder.of(ckpt).path
        continue_in(folder)
        return folder
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return Path(out_dir)
    return run_dir(cfg)


def build(cfg: DictConfig, plan: Plan, out_dir: str | Path | None) -> Built:
    """The seeded model (from ``init_from``'s weights, compiled when asked), the run folder, the
    MLflow logger (the resumed run's MLflow run, on a resume), the callbacks and the trainer."""
    L.seed_everything(cfg.seed, workers=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    vocab_size = plan.datamodule.tokenizer_vocab_size
    module = LMModule(build_model(cfg, vocab_size), plan.task, resolved["optim"], cfg.data.seq_len)
    if cfg.get("init_from"):
        initial_weights(module, cfg.init_from)
    if cfg.get("compile"):
        # a fresh cache: torch compiles a function at most 8 times a process and then runs it
        # eagerly, silently; a process that trains run after run (a multirun's basic launcher,
        # the tests) would reach that with its ninth model
        torch._dynamo.reset()
        module.model.compile()
    run = RunFolder(run_folder(cfg, plan.ckpt, out_dir))
    logger = build_logger(cfg, plan.resumed.get("mlflow_run_id"))
    checkpoint = ModelCheckpoint(
        dirpath=run.checkpoints,
        filename="best-{step}",
        monitor="val/loss",
        mode="min",
        save_top_k=1,
        save_last=True,
        enable_version_counter=False,  # a resume overwrites last.ckpt (an interrupt wrote it) with the final one
    )
    interrupt = GracefulInterrupt(run.checkpoints)
    criterion = criterion_callback(cfg)
    callbacks = [RunRecord(resolved, vocab_size, plan.identity), checkpoint, interrupt, ValidateAtEnd(),
                 *([criterion] if criterion else [])]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(StepProgressBar())
    callbacks += [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    trainer = instantiate(cfg.trainer, logger=logger or False, callbacks=callbacks)
    return Built(module, run, logger, trainer, checkpoint, interrupt, criterion)


def fit(cfg: DictConfig, plan: Plan, b: Built) -> dict[str, float]:
    """The MLflow run's start, the run folder's config and ``run.json``, training, then what
    follows it (``finish``). An interrupt (SIGTERM, Ctrl-C, a preempted job's exit) marks the
    MLflow run KILLED and raises ``RunInterrupted`` naming the saved ``last.ckpt``; any other
    failure marks it FAILED and is raised as it is."""
    run_id = None
    try:
        if b.logger is not None:
            run_id = b.logger.run_id
            log_run_start(b.logger, cfg, b.module, resumed=bool(plan.ckpt), prepared=plan.datamodule.prepared)
        if b.trainer.is_global_zero:
            write_text(b.run.config, OmegaConf.to_yaml(cfg, resolve=True))
            write_json(b.run.run_json, {"run_name": cfg.run_name, "mlflow_run_id": run_id,
                                        "mlflow_experiment_id": b.logger.experiment_id if b.logger else None,
                                        "encoding": cfg.encoding.name, "identity": plan.identity,
                                        "schedule_steps": cfg.optim.schedule_steps})
        with warnings.catch_warnings():
            if plan.ckpt is not None:  # continuing in the run's own folder is what a resume does, not a mistake
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            b.trainer.fit(b.module, datamodule=plan.datamodule, ckpt_path=str(plan.ckpt) if plan.ckpt else None,
                          weights_only=True)
        return finish(cfg, plan, b)
    except BaseException as e:
        if b.logger is not None and run_id is not None and b.trainer.is_global_zero:
            # SystemExit: submitit's handler ends a preempted job's process from within the step
            interrupted = isinstance(e, (SIGTERMException, KeyboardInterrupt, SystemExit))
            tracking.end_run(cfg.logger.tracking_uri, run_id, "KILLED" if interrupted else "FAILED")
        if b.interrupt.saved is not None:
            raise b.interrupt.saved from e
        raise


def finish(cfg: DictConfig, plan: Plan, b: Built) -> dict[str, float]:
    """After training: the final metrics, the step the criterion stopped at, the test split's
    scores (``test_at_end``) and the run's files among its MLflow artifacts."""
    trainer = b.trainer
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    record_routes(b.logger, b.run, b.module.model, resumed=bool(plan.ckpt))
    if b.criterion is not None and b.criterion.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD:
        metrics["criterion_step"] = trainer.global_step
        if b.logger is not None and trainer.is_global_zero:
            b.logger.log_metrics({"criterion_step": trainer.global_step}, step=trainer.global_step)
    if cfg.get("test_at_end", False):  # the final weights on the test split
        (scores,) = trainer.test(b.module, datamodule=plan.datamodule, verbose=False)
        metrics.update({k: float(v) for k, v in scores.items()})
    if b.logger is not None:
        log_run_end(b.logger, b.run, plan.datamodule.prepared.tokenizer_path, b.checkpoint.best_model_path,
                    bool(cfg.get("log_checkpoint", True)))
    return metrics


def record(cfg: DictConfig, b: Built, metrics: dict[str, float], seconds: float) -> None:
    """``metrics.json`` in the run folder, and the run's closing line (``closing_line``) with how
    to open its MLflow run."""
    metrics["global_step"] = b.trainer.global_step
    if not b.trainer.is_global_zero:
        return
    write_json(b.run.metrics, {"run_name": cfg.run_name, "encoding": cfg.encoding.name, "task": cfg.task.name,
                               "seed": cfg.seed, **metrics})
    log.info(closing_line(cfg.run_name, metrics, seconds, b.run.path))
    if b.logger is not None:
        log.info("MLflow run %s: %s", b.logger.run_id,
                 tracking.how_to_open(cfg.logger.tracking_uri, b.logger.experiment_id, b.logger.run_id))


#: the validation metrics a closing line names, when the task has them, and how it prints each
SHOWN = (("val/ppl", "val ppl {:.3f}"), ("val/acc", "val acc {:.1%}"), ("val/exact", "val exact {:.1%}"))


def closing_line(name: str, metrics: dict[str, float], seconds: float, folder: str | Path) -> str:
    """``finished alibi-lm-tinyshakespeare-s0: val ppl 9.228, step 600, 46 s -> <run folder>``: the
    run's validation scores (``SHOWN``), its last step and its seconds, as the study prints a run."""
    shown = [fmt.format(metrics[key]) for key, fmt in SHOWN if key in metrics] + [f"step {int(metrics['global_step'])}"]
    where = os.path.relpath(folder)
    return f"finished {name}: {', '.join(shown)}, {seconds:.0f} s -> {folder if where.startswith('..') else where}"
