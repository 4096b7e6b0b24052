"""Training: ``train(cfg)`` is a plain function; ``posenc.cli.main`` is the Hydra wrapper.

Order of work, so that bad input fails before anything is written:
config checks -> data preparation -> model -> MLflow run -> fit -> artifacts.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
import shutil
import time
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from . import tracking
from .attention import use_route
from .callbacks import GracefulInterrupt, RunRecord, StepProgressBar, ValidateAtEnd, quiet_lightning_tips
from .config import build_model, check_config
from .errors import ConfigError
from .files import write_json, write_text
from .module import LMModule
from .runs import RunFolder, load_state, run_info, stored_run
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


def build_module(cfg: DictConfig, task, vocab_size: int) -> tuple[LMModule, dict]:
    """The run's module (seeded first) with its starting weights (``init_from``), compiled
    where ``compile`` asks; and the resolved config it was built from."""
    L.seed_everything(cfg.seed, workers=True)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    module = LMModule(build_model(cfg, vocab_size), task, resolved["optim"], cfg.data.seq_len)
    if cfg.get("init_from"):
        initial_weights(module, cfg.init_from)
    if cfg.get("compile"):
        module.model.compile()
    return module, resolved


def run_folder(cfg: DictConfig, ckpt: Path | None, out_dir: str | Path | None) -> RunFolder:
    """The run's folder: the resumed run's own, ``out_dir``, or Hydra's (``run_dir``)."""
    if ckpt:
        out = RunFolder.of(ckpt).path
        continue_in(out)
    elif out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
    else:
        out = run_dir(cfg)
    return RunFolder(out)


def build_callbacks(cfg: DictConfig, run: RunFolder, record: RunRecord) -> tuple[list, ModelCheckpoint,
                                                                                 GracefulInterrupt, Any]:
    """The trainer's callbacks: the run's record, the checkpoints (best and last), the graceful
    interrupt, validation at the end, the criterion, the progress bar and the config's own;
    and the checkpoint, interrupt and criterion callbacks among them."""
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
    callbacks = [record, checkpoint, interrupt, ValidateAtEnd(), *([criterion] if criterion else [])]
    if cfg.trainer.get("enable_progress_bar", True):
        callbacks.append(StepProgressBar())
    callbacks += [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    return callbacks, checkpoint, interrupt, criterion


def after_fit(cfg: DictConfig, trainer, module: LMModule, datamodule, logger, run: RunFolder,
              checkpoint: ModelCheckpoint, criterion, resumed: bool) -> dict[str, float]:
    """The metrics of a fit, and what follows it: the routes taken, the criterion's step, the
    test split (``test_at_end``), the files logged to MLflow."""
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    record_routes(logger, run, module.model, resumed=resumed)
    if criterion is not None and criterion.stopping_reason == EarlyStoppingReason.STOPPING_THRESHOLD:
        metrics["criterion_step"] = trainer.global_step
        if logger is not None and trainer.is_global_zero:
            logger.log_metrics({"criterion_step": trainer.global_step}, step=trainer.global_step)
    if cfg.get("test_at_end", False):  # the final weights on the test split
        (scores,) = trainer.test(module, datamodule=datamodule, verbose=False)
        metrics.update({k: float(v) for k, v in scores.items()})
    if logger is not None:
        log_run_end(
            logger, run, datamodule.prepared.tokenizer_path, checkpoint.best_model_path,
            bool(cfg.get("log_checkpoint", True)),
        )
    return metrics


def train(cfg: DictConfig, out_dir: str | Path | None = None) -> dict[str, float]:
    """Train one model as ``cfg`` says; returns the final callback metrics.

    ``out_dir``: the run folder (default: Hydra's output folder, or a fresh one under
    ``paths.output_dir`` when called through the compose API). Every check that can refuse the
    run (settings, data, the checkpoint to resume) comes before anything is written; a refusal
    raises ``ConfigError`` or ``DataError``."""
    task = build_task(cfg.task)  # one object for the checks, the data and the module
    for warning in check_config(cfg, task):
        log.warning(warning)
    use_route(cfg.attention.route)
    datamodule = instantiate(cfg.data, task=task)
    datamodule.prepare_data()  # errors about data surface here, before any run exists
    identity = run_identity(cfg, datamodule.prepared.meta["tokens_sha256"])
    ckpt, resumed_meta = resolve_resume(cfg, identity)
    cfg.optim.schedule_steps = schedule_steps(cfg, ckpt, resumed_meta)
    if ckpt is not None and cfg.trainer.max_steps > cfg.optim.schedule_steps:  # as the MLflow description says
        log.info("extending %s past its %d-step schedule: it trains on at the schedule's final learning rate "
                 "(optim.lr x optim.min_lr_ratio = %g) to step %d", RunFolder.of(ckpt).path, cfg.optim.schedule_steps,
                 cfg.optim.lr * cfg.optim.min_lr_ratio, cfg.trainer.max_steps)
    vocab_size = datamodule.tokenizer_vocab_size
    module, resolved = build_module(cfg, task, vocab_size)
    run = run_folder(cfg, ckpt, out_dir)
    logger = build_logger(cfg, resumed_meta.get("mlflow_run_id"))
    callbacks, checkpoint, interrupt, criterion = build_callbacks(cfg, run, RunRecord(resolved, vocab_size, identity))
    quiet_lightning_tips()
    trainer = instantiate(cfg.trainer, logger=logger or False, callbacks=callbacks)
    run_id = None
    try:
        if logger is not None:
            run_id = logger.run_id
            log_run_start(logger, cfg, module, resumed=bool(ckpt), prepared=datamodule.prepared)
        if trainer.is_global_zero:
            write_text(run.config, OmegaConf.to_yaml(cfg, resolve=True))
            meta = {"run_name": cfg.run_name, "mlflow_run_id": run_id, "encoding": cfg.encoding.name,
                    "identity": identity, "schedule_steps": cfg.optim.schedule_steps}
            write_json(run.run_json, meta)
        with warnings.catch_warnings():
            if ckpt is not None:  # continuing in the run's own folder is what a resume does, not a mistake
                warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None, weights_only=True)
        metrics = after_fit(cfg, trainer, module, datamodule, logger, run, checkpoint, criterion, bool(ckpt))
    except BaseException as e:
        if logger is not None and run_id is not None and trainer.is_global_zero:
            # SystemExit: submitit's handler ends a preempted job's process from within the step
            interrupted = isinstance(e, (SIGTERMException, KeyboardInterrupt, SystemExit))
            tracking.end_run(cfg.logger.tracking_uri, run_id, "KILLED" if interrupted else "FAILED")
        if interrupt.saved is not None:
            raise interrupt.saved from e
        raise
    metrics["global_step"] = trainer.global_step
    if trainer.is_global_zero:
        write_json(run.metrics, {"run_name": cfg.run_name, "encoding": cfg.encoding.name,
                                 "task": cfg.task.name, "seed": cfg.seed, **metrics})
        log.info("finished %s in %s: %s", cfg.run_name, run.path, metrics)
        if logger is not None:
            log.info("MLflow run %s: %s", run_id, tracking.how_to_open(cfg.logger.tracking_uri, logger.experiment_id, run_id))
    return metrics
