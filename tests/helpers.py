"""Callbacks the tests inject through the ``callbacks`` config group."""

import os
import signal

import lightning as L


class SignalAt(L.Callback):
    """Send ``signum`` to this process after optimizer step ``step``."""

    def __init__(self, step: int, signum: str = "SIGTERM"):
        self.step, self.signum = step, getattr(signal, signum)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class NanAt(L.Callback):
    """Poison the weights after optimizer step ``step`` so the next loss is NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            for p in pl_module.parameters():
                p.data.fill_(float("nan"))
