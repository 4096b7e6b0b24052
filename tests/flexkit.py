"""What the tests of the flex route share: FlexAttention evaluated densely (the stand-in of its
backward for q and k), the compiled kernel with its own backward on the CPU (``aot_eager``,
q, k and v detached as the CPU kernel needs), the tensors a score function reads, the leaves a
tensor's graph reaches, and Inductor's check of a backward's joint graph run on the CPU."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

import posenc.attention.flex as flex_module
import posenc.attention.flex_gates as flex_gates
import posenc.attention.flex_kernel as flex_kernel
from posenc.attention import FLEX_ROUTE


def index_grids(B: int, H: int, Tq: int, Tk: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The batch, head, query and key indices FlexAttention hands ``score_mod`` and ``mask_mod``,
    as tensors that broadcast to (B, H, Tq, Tk)."""
    return (torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
            torch.arange(Tq)[None, None, :, None], torch.arange(Tk)[None, None, None, :])


def dense_flex(q, k, v, score_mod=None, block_mask=None, scale=None):
    """FlexAttention evaluated densely: the scaled logits of every pair, ``score_mod`` applied
    to index grids of batch, head, query and key, ``block_mask``'s ``mask_mod`` as -inf, softmax.
    As the kernel does, it computes in float32 (or float64) and returns q's dtype. Autograd
    through it is the stand-in for the kernel's backward to q and k, which the CPU kernel does not
    have."""
    out_dtype, acc = q.dtype, torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(acc), k.to(acc), v.to(acc)
    s = (q @ k.transpose(-1, -2)) * scale
    b, h, qi, kv = index_grids(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if block_mask is not None:
        s = s.masked_fill(~block_mask.mask_mod(b, h, qi, kv), float("-inf"))
    return (s.softmax(-1) @ v).to(out_dtype)


def real_kernel(calls: list | None = None) -> Callable:
    """The compiled FlexAttention with its own backward on the CPU (dynamo and AOTAutograd, as
    Inductor uses them, ``backend="aot_eager"``), given q, k and v detached: the CPU kernel has
    no backward for them, so only the tensors ``score_mod`` reads get gradients through it.
    ``calls`` collects one entry per call."""
    compiled = flex_kernel.compiled_flex("aot_eager")

    def kernel(q, k, v, **kw):
        if calls is not None:
            calls.append(q.shape)
        return compiled(q.detach(), k.detach(), v.detach(), **kw)

    return kernel


def use_kernel(monkeypatch, kernel: Callable, setting: str = "flex") -> None:
    """``kernel`` as FlexAttention on every device, and ``attention.route=setting``."""
    monkeypatch.setattr(flex_kernel, "flex_kernel", lambda device: kernel)
    monkeypatch.setattr(flex_gates, "_setting", [setting])


@pytest.fixture
def fresh_flex_route():
    """The flex route as a new process has it (no verdict, no refusal, dynamo's caches empty),
    before and after the test."""
    FLEX_ROUTE.reset()
    torch._dynamo.reset()
    yield FLEX_ROUTE
    FLEX_ROUTE.reset()
    torch._dynamo.reset()


def lift_score_rule(monkeypatch) -> None:
    """Let a score function (FIRE's) take the flex route with gradients on, as a GPU measurement
    would (``SCORE_TRAINS``)."""
    monkeypatch.setattr(flex_module, "SCORE_TRAINS", True)


def closure_tensors(fn, seen: set | None = None) -> list[Tensor]:
    """Every tensor ``fn`` reads from its closure, and from the closures of the functions it
    closes over (a score function inside ``score_mod``)."""
    seen = set() if seen is None else seen
    out: list[Tensor] = []
    if id(fn) in seen or not callable(fn):
        return out
    seen.add(id(fn))
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, Tensor):
                out.append(v)
            elif callable(v):
                out += closure_tensors(v, seen)
    return out


def graph_leaves(tensors) -> set[int]:
    """The ids of the leaf tensors (parameters) the graphs of ``tensors`` reach."""
    found, stack, visited = set(), [t.grad_fn for t in tensors if t is not None and t.grad_fn is not None], set()
    for t in tensors:
        if t is not None and t.grad_fn is None and t.requires_grad:
            found.add(id(t))
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        if hasattr(node, "variable"):
            found.add(id(node.variable))
        stack += [n for n, _ in node.next_functions]
    return found


def joint_graph_checking_backend(checked: list):
    """A torch.compile backend that runs a graph as ``aot_eager`` does, after handing the joint
    graph of every FlexAttention backward in it to Inductor's own check,
    ``validate_joint_graph`` (what Inductor runs before it lowers one); ``checked`` collects the
    joint graphs it passed."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.kernel.flex.flex_attention import validate_joint_graph

    def check(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and node.target is torch.ops.higher_order.flex_attention_backward:
                joint = copy.deepcopy(getattr(gm, node.args[8].target))
                joint.graph.eliminate_dead_code()  # as Inductor does first
                validate_joint_graph(joint.graph)
                checked.append(joint)
        return boxed_nop(gm, example_inputs)

    return aot_autograd(fw_compiler=check, bw_compiler=check)
