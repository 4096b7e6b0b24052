"""The LightningModule: loss, metrics, optimiser and schedule."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.text import Perplexity

from .model import Transformer
from .targets import IGNORE
from .taskbase import Task


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, then cosine decay to ``min_ratio`` at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class LMModule(L.LightningModule):
    """Causal or masked language modelling with any positional scheme.

    Perplexity is over scored tokens only (targets other than ``IGNORE``: all tokens
    for ``task=lm``, the masked targets for ``task=mlm``, the answer digits for
    ``task=retrieval``). The task (``posenc.tasks``) says what else validation
    reports: accuracy (``Task.accuracy``), and exact match, the share of windows
    whose every scored target is the argmax (``Task.exact_match``, ``val/exact``,
    which a criterion can stop the run on).

    It takes what it uses: the ``model`` (``posenc.config.build_model``), the run's
    ``task`` object, the ``optim`` settings and the training window's ``seq_len``.
    What a checkpoint needs to rebuild the run (its whole config, vocabulary size and
    identity) is the run's record, written by ``posenc.callbacks.RunRecord`` and read
    by ``posenc.runs.stored_run``.
    """

    def __init__(self, model: Transformer, task: Task, optim: Mapping[str, Any], seq_len: int):
        super().__init__()
        self.model = model
        self.optim = dict(optim)
        # one window: Lightning's model summary counts FLOPs with it
        self.example_input_array = torch.zeros(1, int(seq_len), dtype=torch.long)
        self.val_ppl = Perplexity(ignore_index=IGNORE)
        self.test_ppl = Perplexity(ignore_index=IGNORE)
        self.with_accuracy, self.with_exact = task.accuracy, task.exact_match
        # a task that scores a suffix of every window (retrieval: the answers of its queries):
        # the model computes the top layer for that suffix alone (``Transformer.forward(last=)``)
        self.scored_suffix = task.scored_suffix(int(seq_len))
        if self.with_accuracy:
            vocab_size = model.cfg.vocab_size
            acc = lambda: MulticlassAccuracy(vocab_size, average="micro", ignore_index=IGNORE)  # noqa: E731
            self.val_acc, self.test_acc = acc(), acc()
        if self.with_exact:
            self.val_exact, self.test_exact = MeanMetric(), MeanMetric()
        self._t0: float | None = None

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _step(self, batch, metric: Perplexity | None, stage: str):
        x, y = batch
        if self.scored_suffix is not None:
            y = y[:, -self.scored_suffix :]
        logits = self.model(x, last=self.scored_suffix).float()  # (B, T or the scored suffix, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite {stage} loss {loss.item()} at step {self.global_step} "
                f"with the scheme {type(self.model.scheme).__name__}"
            )
        if stage == "train":  # one batch: its perplexity is exp(loss), no metric state needed
            # no train/ppl: exp(loss) of single batches spans ~260 -> ~7 and flattens its chart;
            # one LR (every parameter group follows the same schedule)
            self.log("train/loss", loss, on_step=True, prog_bar=True)
            self.log("train/lr", self.lr_schedulers().get_last_lr()[0], on_step=True)
            return loss
        metric(logits.detach(), y)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log(f"{stage}/ppl", metric, on_epoch=True, prog_bar=True)
        if self.with_accuracy:
            acc = self.val_acc if stage == "val" else self.test_acc
            acc(logits.detach().flatten(0, 1), y.flatten())
            self.log(f"{stage}/acc", acc, on_epoch=True, prog_bar=True)
        if self.with_exact:  # a window counts when every scored target is the argmax
            exact = self.val_exact if stage == "val" else self.test_exact
            exact(((logits.detach().argmax(-1) == y) | (y == IGNORE)).all(-1).float())
            self.log(f"{stage}/exact", exact, on_epoch=True, prog_bar=True)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, None, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, self.val_ppl, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, self.test_ppl, "test")

    # dropout and any other torch randomness continue exactly after a resume
    def on_save_checkpoint(self, checkpoint):
        checkpoint["torch_rng_state"] = torch.get_rng_state()

    def on_load_checkpoint(self, checkpoint):
        if "torch_rng_state" in checkpoint:
            torch.set_rng_state(checkpoint["torch_rng_state"])

    # tokens/s over the optimiser step, measured between batch start and end
    def on_train_batch_start(self, batch, batch_idx):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._t0 is not None:
            n = batch[0].numel() * self.trainer.world_size
            self.log("train/tokens_per_s", n / (time.perf_counter() - self._t0), on_step=True, prog_bar=True)

    def configure_optimizers(self):
        o = self.optim
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.dim() >= 2 and "scheme" not in name else no_decay).append(p)
        # fused where torch has the kernel (CPU, CUDA); elsewhere (MPS) the loop over parameters
        fused = bool(o.get("fused", False)) and all(p.device.type in ("cpu", "cuda") for p in decay + no_decay)
        # under mixed precision (bf16 too) Lightning refuses to clip the gradients of an optimizer that
        # unscales them itself, as the fused one does: there the loop over parameters (the same update)
        trainer = self._trainer
        if trainer is not None and "mixed" in str(trainer.precision) and trainer.gradient_clip_val:
            fused = False
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": o["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=o["lr"],
            betas=tuple(o["betas"]),
            fused=fused or None,
        )
        total = o.get("schedule_steps") or (
            self.trainer.max_steps if self.trainer.max_steps and self.trainer.max_steps > 0 else 10_000
        )
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, o["warmup_steps"], total, o["min_lr_ratio"])
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
