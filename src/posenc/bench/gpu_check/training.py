"""Part 1 of the GPU check: every scheme trains, its first block's numerics are checked against
float64, and its checkpoint is evaluated at L and 4L."""

from __future__ import annotations

import argparse
import copy
import math
import time
from pathlib import Path

import lightning as L
import torch

from .common import BF16_TOL, FP32_TOL, VOCAB


class RecordLosses(L.Callback):
    """A Lightning callback (``callbacks.<name>._target_``) that keeps every training loss of the run."""

    losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        RecordLosses.losses.append(float(loss.detach().float().cpu()))


def overrides(scheme: str, a: argparse.Namespace, work: Path) -> list[str]:
    """The Hydra overrides of one scheme's run in the check."""
    return [
        f"encoding={scheme}", f"model={a.model}", f"trainer={'gpu' if a.device == 'cuda' else 'cpu'}",
        "data=tinyshakespeare", f"data.vocab_size={VOCAB}", f"data.seq_len={a.seq_len}", f"data.batch_size={a.batch_size}",
        f"model.max_len={max(4 * a.seq_len, 2048)}", f"trainer.max_steps={a.steps}",
        f"trainer.val_check_interval={a.steps}", f"optim.warmup_steps={max(1, a.steps // 5)}", "trainer.limit_val_batches=4", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", "trainer.log_every_n_steps=10", "~logger", "log_checkpoint=false",
        f"paths.output_dir={work / 'outputs'}", *([f"paths.cache_dir={a.cache_dir}"] if a.cache_dir else []),
        f"+callbacks.losses._target_={RecordLosses.__module__}.RecordLosses",
    ]  # fmt: skip


def first_block_errors(model: torch.nn.Module, idx: torch.Tensor, device: str) -> dict[str, float]:
    """Relative error of the first block's output (bf16 autocast, float32) against float64 on the CPU."""
    captured: list[torch.Tensor] = []

    def run(m: torch.nn.Module, x: torch.Tensor, autocast: bool) -> torch.Tensor:
        captured.clear()
        hook = m.blocks[0].register_forward_hook(lambda mod, args, out: captured.append(out.detach()))
        try:
            with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
                m(x)
        finally:
            hook.remove()
        return captured[0].double().cpu()

    ref_model = copy.deepcopy(model).double().cpu().eval()
    ref = run(ref_model, idx.cpu(), False)
    model = model.float().to(device).eval()
    out = {}
    for name, autocast in (("bf16", True), ("fp32", False)):
        y = run(model, idx.to(device), autocast)
        out[name] = float((y - ref).norm() / ref.norm())
    return out


def check_scheme(scheme: str, a: argparse.Namespace, work: Path) -> dict:
    """Train, compare and evaluate one scheme (part 1), on the routes ``attention.route=auto``
    gives it here; the routes its training and its validation took, as its ``run.json`` records them."""
    from ... import evaluate as ev
    from ...config import compose
    from ...runs import RunFolder, load_state, module_from_state
    from ...train import train

    row: dict = {"scheme": scheme}
    run_dir = work / "runs" / scheme
    RecordLosses.losses = []
    t = time.perf_counter()
    metrics = train(compose(overrides(scheme, a, work)), out_dir=run_dir)
    if a.device == "cuda":
        torch.cuda.synchronize()
    row["train_s"] = round(time.perf_counter() - t, 2)
    losses, ln_v = RecordLosses.losses, math.log(VOCAB)
    row.update(steps=len(losses), first_loss=losses[0], last_loss=losses[-1], ln_v=ln_v,
               val_loss=float(metrics["val/loss"]))  # fmt: skip
    row["loss_ok"] = (abs(losses[0] - ln_v) <= 0.1 * ln_v
                      and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0])  # fmt: skip
    routes = RunFolder(run_dir).info().get("attention_routes", {})
    row.update(route=routes.get("training"), eval_route=routes.get("evaluation"))

    ckpt = RunFolder(run_dir).last
    module = module_from_state(load_state(ckpt), ckpt, "cpu")
    idx = torch.randint(0, VOCAB, (2, a.seq_len), generator=torch.Generator().manual_seed(0))
    row.update(first_block_errors(module.model, idx, a.device))
    row["numerics_ok"] = row["bf16"] <= BF16_TOL and row["fp32"] <= FP32_TOL

    t = time.perf_counter()
    rows, _ = ev.evaluate_checkpoint(run_dir, ev.Settings(
        lengths=[a.seq_len, 4 * a.seq_len], methods=("nonoverlapping",), max_tokens=8 * 4 * a.seq_len, device=a.device,
        log_mlflow=False, progress=False, cache_dir=a.cache_dir))  # fmt: skip
    row["eval_s"] = round(time.perf_counter() - t, 2)
    row["ppl_L"] = rows[0]["ppl"]
    row["ppl_4L"] = rows[1]["ppl"]
    row["eval_note"] = rows[1].get("note") or ""
    return row
