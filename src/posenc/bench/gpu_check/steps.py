"""Part 2 of the GPU check: one training step of every scheme on each route it can take here,
at two lengths, from the same weights and batch: the loss, and every parameter's gradient
present, finite and close across the routes; and the graphs torch.compile made for it."""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.nn.functional as F

from ...attention import ROUTES, forced_route
from ...attention.flex_gates import gradient_errors
from .common import VOCAB, compiled_graphs, failure

#: the step's lengths: a multiple of the kernels' 128-token blocks, and one that is not (where bf16
#: with a block mask has given NaN in FlexAttention's backward)
STEP_LENGTHS = (256, 1000)
#: tokens per step (batch 16 at 256, 4 at 1000)
STEP_TOKENS = 4096
#: relative differences allowed between two routes' steps from the same weights and batch: the
#: loss, and each parameter's gradient (of the norm); bf16 autocast rounds each route its own way
STEP_TOL = {"loss": 1e-2, "grad": 5e-2}


def routes_here(scheme, device: str) -> list:
    """The routes that can train ``scheme`` on ``device`` (``Route.serves``, ``Route.trains_on``)."""
    return [r for r in ROUTES if r.serves(scheme) and r.trains_on(device)]


def route_steps(a: argparse.Namespace, schemes: list[str]) -> dict:
    """Every scheme's steps (``scheme_steps``), one row per (scheme, length, route)."""
    rows = []
    for scheme in schemes:
        try:
            rows += scheme_steps(a, scheme)
        except Exception as e:  # noqa: BLE001 -- recorded, the other schemes go on
            rows.append({"scheme": scheme, "error": failure(e)})
    return {"lengths": list(STEP_LENGTHS), "tokens": STEP_TOKENS, "model": a.model, "rows": rows,
            "graphs": compiled_graphs()}


def scheme_steps(a: argparse.Namespace, scheme: str) -> list[dict]:
    """One training step (bf16 autocast on CUDA) of ``scheme``'s model (``--model``) at each of
    ``STEP_LENGTHS`` on each route that can train it here (``forced_route``), from the same
    weights and batch; each route's loss and gradients against the float-mask route's (``masked``,
    where it serves the scheme; else the first route's)."""
    from ..config import compose_configs
    from ..models import build_posenc

    model_cfg, encodings = compose_configs(a.model, [scheme], max(STEP_LENGTHS), tiny=a.device != "cuda")
    torch.manual_seed(0)
    net = build_posenc(scheme, encodings[scheme], model_cfg, VOCAB).to(a.device).train()
    rows = []
    for T in STEP_LENGTHS:
        g = torch.Generator().manual_seed(T)
        x, y = (torch.randint(VOCAB, (max(1, STEP_TOKENS // T), T), generator=g).to(a.device) for _ in range(2))
        steps = {r.name: one_step(net, r, x, y, a.device) for r in routes_here(net.blocks[0].attn.scheme, a.device)}
        ref = next((steps[n] for n in ("masked", *steps) if n in steps and "error" not in steps[n]), None)
        rows += [{"scheme": scheme, "T": T, "route": n, **compare(step, ref)} for n, step in steps.items()]
    return rows


def one_step(net: torch.nn.Module, route, x: torch.Tensor, y: torch.Tensor, device: str) -> dict:
    """The loss and every trainable parameter's gradient (None where it got none) of one
    training step of ``net`` on ``route``, from the same random state on every route (CAPE
    draws its shifts in training); the graphs torch.compile made for it."""
    net.zero_grad(set_to_none=True)
    torch.manual_seed(x.shape[-1])
    before = compiled_graphs()
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    try:
        with forced_route(route), autocast:
            logits = net(x)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
    except Exception as e:  # noqa: BLE001 -- the route's failure is the result
        return {"error": failure(e), "graphs": compiled_graphs() - before}
    grads = {n: None if p.grad is None else p.grad.detach().float().clone()
             for n, p in net.named_parameters() if p.requires_grad}  # fmt: skip
    return {"loss": float(loss.detach()), "grads": grads, "graphs": compiled_graphs() - before}


def compare(step: dict, first: dict | None) -> dict:
    """A step's row: its loss; the parameters without a gradient or with one not finite; its
    largest relative difference from ``first`` (the reference route's step), loss and gradients
    (``gradient_errors``: a gradient zero in exact arithmetic measured against the scale of all
    of them); and whether all of it is within ``STEP_TOL``."""
    if "error" in step:
        return {"error": step["error"], "graphs": step["graphs"], "ok": False}
    grads = step["grads"]
    missing = sorted(n for n, g in grads.items() if g is None)
    nonfinite = sorted(n for n, g in grads.items() if g is not None and not bool(torch.isfinite(g).all()))
    row = {"loss": step["loss"], "graphs": step["graphs"], "missing": missing, "nonfinite": nonfinite}
    loss_diff = abs(step["loss"] - first["loss"]) / abs(first["loss"]) if first else 0.0
    errors = gradient_errors(grads, first["grads"]) if first else {}
    worst_name = max(errors, key=errors.get, default=None)
    row.update(loss_diff=loss_diff, grad_diff=errors.get(worst_name, 0.0), grad_diff_at=worst_name)
    worst = row["grad_diff"]
    row["ok"] = (not missing and not nonfinite and torch.isfinite(torch.tensor(step["loss"])).item()
                 and loss_diff <= STEP_TOL["loss"] and worst <= STEP_TOL["grad"])
    return row
