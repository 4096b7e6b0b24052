"""Callbacks the tests inject through the ``callbacks`` config group, and the
language-modelling loss of a bare model."""

import os
import signal

import lightning as L
import torch.nn.functional as F


def lm_loss(model, idx, targets, ignore_index: int = -100):
    """Cross-entropy of a ``posenc.model.Transformer`` on targets, as ``LMModule`` scores it."""
    return F.cross_entropy(model(idx).flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)


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
