"""Callbacks: the run's record in its checkpoints, a recoverable run, validation at its end,
a step progress bar; and for a sweep, Hydra's callback that ends it with MLflow's compare link."""

from __future__ import annotations

import logging
import signal
import warnings
from pathlib import Path

import lightning as L
from hydra.experimental.callback import Callback as HydraCallback
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities.exceptions import SIGTERMException

from . import tracking
from .runs import RECORD, RunFolder

log = logging.getLogger(__name__)


class RunRecord(L.Callback):
    """Writes the run's record into every checkpoint it saves: the resolved config, the
    vocabulary size and the identity a resume must match (``posenc.runs.stored_run`` reads it),
    so a checkpoint alone rebuilds its model."""

    def __init__(self, cfg: dict, vocab_size: int, identity: dict):
        self.record = {"cfg": cfg, "vocab_size": int(vocab_size), "identity": identity}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        checkpoint[RECORD] = self.record


class RunInterrupted(SIGTERMException):
    """A run stopped by SIGTERM or a first Ctrl-C after saving ``last.ckpt``.

    A ``SystemExit`` (as Lightning's ``SIGTERMException`` is) with code 130,
    the exit status shells give a process stopped by Ctrl-C, so ``python
    train.py`` and the study's stages exit 130, never 0, when interrupted.
    """

    def __init__(self, step: int, checkpoint: str | Path):
        super().__init__(130)
        self.step, self.checkpoint = step, Path(checkpoint)

    def __reduce__(self):  # picklable, for the study's worker processes
        return type(self), (self.step, str(self.checkpoint))

    def __str__(self) -> str:
        return (f"interrupted at step {self.step}: saved {self.checkpoint}; "
                "continue with the same command and ckpt_path=last")


class GracefulInterrupt(L.Callback):
    """Stop cleanly on SIGTERM or a first Ctrl-C, and keep a resumable checkpoint.

    Lightning already turns SIGTERM into a stop at the next batch boundary; this
    callback does the same for the first SIGINT (a second one interrupts at
    once) and, when such a stop happens, saves ``last.ckpt`` in ``dirpath`` so
    that ``ckpt_path=last`` continues from the step where the run stopped. Other
    exceptions (a NaN loss, a bug) save nothing: the last good checkpoint stays.
    """

    def __init__(self, dirpath: str | Path):
        self.dirpath = Path(dirpath)
        self._previous = None
        self.saved: RunInterrupted | None = None  # set when an interrupt saved last.ckpt

    def on_fit_start(self, trainer, pl_module):
        connector = trainer._signal_connector

        def first_interrupt(signum, frame):
            log.warning("interrupt received: stopping after the current batch (press Ctrl-C again to abort)")
            connector.received_sigterm = True
            signal.signal(signal.SIGINT, signal.default_int_handler)

        try:
            self._previous = signal.signal(signal.SIGINT, first_interrupt)
        except ValueError:  # not the main thread: keep the default behaviour
            self._previous = None

    def _restore(self):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def on_fit_end(self, trainer, pl_module):
        self._restore()

    def on_exception(self, trainer, pl_module, exception):
        self._restore()
        if isinstance(exception, SIGTERMException):
            path = self.dirpath / RunFolder.LAST
            trainer.save_checkpoint(path)
            log.warning("stopped at step %d; saved %s (resume with ckpt_path=last)", trainer.global_step, path)
            self.saved = RunInterrupted(trainer.global_step, path)


class ValidateAtEnd(L.Callback):
    """Validate after the last step whatever ``val_check_interval`` says.

    Training is one endless epoch that stops at ``trainer.max_steps``, so a
    run shorter than the interval would end without a validation metric.
    Asking the loop to stop at the last step makes Lightning validate then
    (once, also when the interval falls on that step), and the checkpoint
    callback sees the final validation loss.
    """

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.max_steps and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class StepProgressBar(TQDMProgressBar):
    """Lightning's bar, counting optimiser steps of the whole run.

    Training reads an endless stream, so the epoch Lightning would show is
    meaningless (``Epoch 0/-2``); this bar shows ``step n/max_steps`` and
    starts at the resumed step.
    """

    def on_train_epoch_start(self, trainer, *_):
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = trainer.global_step
        bar.set_description("step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar = self.train_progress_bar
        if bar is not None and self._should_update(trainer.global_step, bar.total):
            bar.n = trainer.global_step
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))


class CompareSweep(HydraCallback):
    """Hydra callback: the last line of a sweep (``-m``) is the link to MLflow's compare view of
    its runs (``compare_url``), from the ``run.json`` of each run under the sweep's folder."""

    def on_multirun_end(self, config, **kwargs) -> None:
        infos = [run.info() for run in RunFolder.under(config.hydra.sweep.dir)]
        runs = [i["mlflow_run_id"] for i in infos if i.get("mlflow_run_id")]
        if not runs:
            return
        experiments = sorted({str(i["mlflow_experiment_id"]) for i in infos if i.get("mlflow_experiment_id")})
        print(f"sweep: {len(runs)} runs in {config.hydra.sweep.dir}; compare them in MLflow: "
              f"{tracking.compare_url(runs, experiments)}", flush=True)


class _DropTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


#: third-party warnings every run would print that say nothing about the run, each by the module
#: it is raised from, its category and the start of its message: torch's deprecation of
#: ``LeafSpec``, which Lightning's own ``_pytree`` still checks for (Lightning 2.6, torch 2.13)
KNOWN_WARNINGS = (
    (r"lightning\.pytorch\.utilities\._pytree", FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
)


def quiet_known_warnings() -> None:
    """Filter the warnings of ``KNOWN_WARNINGS`` (each by its category and message; call it
    inside ``warnings.catch_warnings`` to keep the filters to a block) and drop Lightning's
    advertisement for its cloud logger (printed on every run)."""
    for module, category, message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    target = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropTips) for f in target.filters):
        target.addFilter(_DropTips())
