"""Callbacks that keep a run recoverable."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


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
            path = self.dirpath / "last.ckpt"
            trainer.save_checkpoint(path)
            log.warning("stopped at step %d; saved %s (resume with ckpt_path=last)", trainer.global_step, path)
