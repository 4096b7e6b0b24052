"""Callbacks the tests inject through the ``callbacks`` config group, and the
language-modelling loss of a bare model."""

from __future__ import annotations

import os
import signal

import lightning as L
import torch.nn.functional as F


def lm_loss(model, idx, targets, ignore_index: int = -100):
    """Cross-entropy of a ``posenc.model.Transformer`` on targets, as ``LMModule`` scores it."""
    return F.cross_entropy(model(idx).flatten(0, 1).float(), targets.flatten(), ignore_index=ignore_index)


class SignalAt(L.Callback):
    """Send ``signum`` to this process after optimizer step ``step``; with ``once`` (a file's
    path), only if that file is not there, and it is made first: a resumed run passes the step
    again without a second signal."""

    def __init__(self, step: int, signum: str = "SIGTERM", once: str | None = None):
        self.step, self.signum, self.once = step, getattr(signal, signum), once

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        if self.once is not None:
            if os.path.exists(self.once):
                return
            open(self.once, "w").close()
        os.kill(os.getpid(), self.signum)


class SignalWhenReaderGone(L.Callback):
    """Send SIGINT to this process after optimizer step ``step``, once its standard output has
    no reader (``python train.py | head -c 100``: ``head`` has read its bytes and exited): the
    descriptor is a pipe that ``poll`` reports an error on, or already pointed at /dev/null by
    ``posenc.streams``. Waits for that (60 s at most), so the interrupt always finds the pipe
    closed, whatever the order the two processes were scheduled in."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import select
        import stat
        import time

        if trainer.global_step != self.step:
            return
        for _ in range(600):
            if not stat.S_ISFIFO(os.fstat(1).st_mode):
                break
            poller = select.poll()
            poller.register(1, 0)
            if any(events & select.POLLERR for _, events in poller.poll(0)):
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)


def preempted_each_time() -> None:
    """A job's call that its cluster preempts at once, each time it starts (submitit's signal)."""
    import time

    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(60)


class NanAt(L.Callback):
    """Poison the weights after optimizer step ``step`` so the next loss is NaN."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            for p in pl_module.parameters():
                p.data.fill_(float("nan"))


#: a task entry of a study's params file, small enough for a test (``posenc.tasks.STUDY_KEYS``)
TASK_ENTRY = {"seeds": "0", "seq_len": 16, "batch_size": 4, "steps": 3, "validate_every": 3, "criterion": None,
              "overrides": "", "evaluate": {}}
#: what each of the project's tasks is scored with in such a study
EVALUATE = {"lm": {"multipliers": "1", "max_tokens": 64, "extensions": "all"},
            "retrieval": {"multipliers": "1 2", "trials": 4, "attention_trials": 1, "extensions": ""}, "mlm": {}}


def study_params(folder, **tasks) -> str:
    """Write ``<folder>/params.yaml`` with a ``tasks:`` entry per keyword (its keys over
    ``TASK_ENTRY``; ``evaluate`` over the task's ``EVALUATE``) and return its path, for
    ``python -m pipelines.study --params``."""
    from pathlib import Path

    import yaml

    entries = {name: {**TASK_ENTRY, **keys, "evaluate": {**EVALUATE.get(name, {}), **keys.get("evaluate", {})}}
               for name, keys in tasks.items()}
    path = Path(folder) / "params.yaml"
    path.write_text(yaml.safe_dump({"tasks": entries}))
    return str(path)


def datamodule(cfg):
    """The data module of a composed run config with the run's task object, as training makes it."""
    from hydra.utils import instantiate

    from posenc.tasks import build

    return instantiate(cfg.data, task=build(cfg.task))
