"""The GPU check's timed parts: the benchmark in its own process (on the default routes, on the
float-mask routes, at the paper profile's settings, compiled), and the long evaluation."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from .common import VOCAB, failure


def run_bench(a: argparse.Namespace, work: Path, timeout: float | None, name: str = "bench", model: str | None = None,
              lengths: list[int] | None = None, extra: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """``posenc.bench`` in its own process (with ``env`` added to this process's environment),
    its summary read back."""
    out = work / name
    cmd = [sys.executable, "-m", "posenc.bench", "--device", a.device, "--no-xtransformers", "--no-progress",
           "--out-dir", str(out), "--repeats", str(a.bench_repeats), "--model", model or a.model, "--lengths",
           *map(str, lengths or a.bench_lengths), *extra]  # fmt: skip
    if a.device == "cpu":
        cmd += ["--tiny", "--max-memory-gb", "0"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=None if env is None else os.environ | env)
    if proc.returncode != 0:
        raise RuntimeError(f"posenc.bench exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    res = json.loads((out / "bench.json").read_text())
    keep = ("scheme", "class", "T", "batch", "train_s_min", "train_tok_s", "step_ratio", "mem_train_bytes",
            "mem_ratio", "flop_share", "train_peak_fraction")  # fmt: skip
    rows = [{k: r.get(k) for k in keep} for r in res["summary"] if r["impl"] == "posenc"]
    return {"seconds": round(time.perf_counter() - t, 1), "rows": rows,
            "command": " ".join(cmd[1:]).replace(str(work), "<tmp>"),  # no path of this machine in the record
            "peak_flops_per_s": res["peak"]["flops_per_s"], "model": res["meta"].get("model")}


def long_evaluation(a: argparse.Namespace, schemes: list[str], model: str, tokens: int) -> dict:
    """Each scheme's forward at ``tokens`` tokens, batch 1, no gradients, random weights, on the
    route ``attention.route=auto`` gives it (recorded per scheme)."""
    from ..config import compose_configs
    from ..models import build_posenc

    model_cfg, encodings = compose_configs(model, schemes, tokens, tiny=a.device != "cuda")
    rows = []
    for scheme in schemes:
        row: dict = {"scheme": scheme, "tokens": tokens}
        net = None
        try:
            net = build_posenc(scheme, encodings[scheme], model_cfg, VOCAB).to(a.device).eval()
            row.update(_long_forward(net, a.device, tokens))
            row["route"] = net.attention_routes().get("evaluation")
        except Exception as e:  # noqa: BLE001 -- out of memory is a result; the other schemes go on
            row["error"] = failure(e)
        finally:
            del net
            if a.device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
    return {"model": model, "tokens": tokens, "rows": rows}


def _long_forward(net: torch.nn.Module, device: str, tokens: int) -> dict:
    """Two forwards of ``net`` at ``tokens`` tokens (the second timed: the first may compile):
    seconds, peak memory above what was held before (CUDA), and whether the logits are finite."""
    from ..models import autocast, sync

    cuda = device == "cuda"
    idx = torch.randint(0, VOCAB, (1, tokens), device=device)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    for _ in range(2):
        t = time.perf_counter()
        with torch.no_grad(), autocast(device):
            logits = net(idx)
        sync(device)
    return {"seconds": round(time.perf_counter() - t, 3),
            "peak_bytes": torch.cuda.max_memory_allocated() - before if cuda else None,
            "finite": bool(torch.isfinite(logits.float()).all())}
