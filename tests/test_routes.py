"""The attention routes as objects: every scheme trained a step on every route that serves it,
each parameter's gradient against the dense reference; the setting ``attention.route``; and the
routes a run took, in its ``run.json`` and its MLflow params.

On the flex route the CPU allows the kernel's own backward only to what ``score_mod`` reads,
and only with q, k and v detached (``flexkit.real_kernel``: compiled with ``aot_eager``). So a
scheme on that route is trained twice: through the real kernel, where every parameter read in
``score_mod`` (T5's and TUPE's relative tables, KERPLE's r1 and r2) must get the dense
reference's gradient and every parameter reached only through q and k (TUPE's position table
and projections, the appended factors) none; and with ``flexkit.dense_flex`` in place of the
kernel (the stand-in for its backward to q and k), where every parameter must get the dense
reference's gradient.
"""

from __future__ import annotations

import json

import pytest
import torch

import posenc.attention.flex_gates as flex_gates
from posenc.attention import FLEX, ROUTES, Attention, bias_score_mod, flex_parts
from posenc.config import check_config
from posenc.errors import ConfigError
from posenc.runs import RunFolder

from .flexkit import closure_tensors, dense_flex, fresh_flex_route, graph_leaves, real_kernel, use_kernel  # noqa: F401
from .references import dense_attention
from .test_attention import CASES, D, H, scheme_of
from .test_train import runs_of


def _step(attn: Attention, route, h: torch.Tensor, pos: torch.Tensor, up: torch.Tensor) -> dict:
    """One training step's forward and backward of one layer on ``route`` (its plan made for
    the layer alone, as a forward makes it): every trainable parameter's ``.grad`` (None where
    the step gave it none), the input's included."""
    for p in attn.parameters():
        p.grad = None
    h = h.detach().requires_grad_()
    plan = route.plan([attn], h, pos)
    (attn(h, pos, plan) * up).sum().backward()
    return {"input": h.grad, **{n: p.grad for n, p in attn.named_parameters() if p.requires_grad}}


def _reference(attn: Attention, h: torch.Tensor, pos: torch.Tensor, up: torch.Tensor) -> dict:
    """The dense reference's gradients, None for a parameter the layer does not reach (a scheme's
    input embedding: the layer's scheme is the model's)."""
    h = h.detach().requires_grad_()
    named = {"input": h, **{n: p for n, p in attn.named_parameters() if p.requires_grad}}
    got = torch.autograd.grad((dense_attention(attn, h, pos) * up).sum(), list(named.values()), allow_unused=True)
    return dict(zip(named, got))


def _score_and_factor_parameters(attn: Attention, pos: torch.Tensor) -> tuple[set[str], set[str]]:
    """The scheme's parameters that ``score_mod`` reads (through the relative table or the
    score function's tensors) and those that only the factors appended to q and k reach."""
    parts = flex_parts(attn.scheme, pos)
    mod = bias_score_mod(parts)
    read = graph_leaves(closure_tensors(mod)) if mod is not None else set()
    factors = graph_leaves(parts.factors) if parts.factors is not None else set()
    named = {n: id(p) for n, p in attn.named_parameters() if n.startswith("scheme.")}
    return {n for n, i in named.items() if i in read}, {n for n, i in named.items() if i in factors and i not in read}


@pytest.mark.parametrize("T", [13, 150])
@pytest.mark.parametrize("name,causal,extra", CASES)
def test_a_training_step_on_every_route_gives_every_parameter_the_dense_gradient(name, causal, extra, T, monkeypatch,
                                                                               fresh_flex_route):
    """One layer in training mode, one step on each route that serves its scheme (``ROUTES``:
    fused, flex, recomputed, probabilities, masked; the flex route with its rules, so FIRE's score
    only without gradients): the gradient of the input and of every parameter equals the dense
    reference's (``tests/references.py``), and no parameter is left without one. On the flex
    route, through the real kernel's backward for the parameters read in ``score_mod`` and
    through the dense stand-in for the rest (the module docstring)."""
    torch.manual_seed(0)
    sch = scheme_of(name, causal, extra, max_len=T + 16)
    attn = Attention(D, H, sch, causal).train()
    h, pos = torch.randn(2, T, D), torch.arange(T) + 5
    up = torch.randn(2, T, D)
    want = _reference(attn, h, pos, up)
    routes = [r for r in ROUTES if r.serves(sch)]
    assert routes, f"no route serves {name}"
    unreached = {n for n, g in want.items() if g is None}  # an input embedding's: the model's, not the layer's
    assert not unreached or sch.defines("embed"), f"{name}: the reference reaches no {unreached}"
    for route in routes:
        kernels = [("kernel", real_kernel())] if route.name == FLEX else []
        kernels.append(("stand-in", dense_flex))
        for label, kernel in kernels:
            use_kernel(monkeypatch, kernel)
            got = _step(attn, route, h, pos, up)
            assert [n for n in unreached if got[n] is not None] == [], f"{name} on {route.name}: gradients from nowhere"
            checked = set(got) - unreached
            if label == "kernel":  # q, k, v detached: the input, qkv and the factors' parameters get nothing
                score, factors = _score_and_factor_parameters(attn, pos)
                unreached = {n for n in got if n.startswith("scheme.")} - score - factors
                assert not unreached, f"{name}: parameters neither read in score_mod nor by the factors: {unreached}"
                assert all(got[n] is None for n in ("input", "qkv.weight", "qkv.bias", *factors)), route.name
                checked = {"out.weight", "out.bias", *score}
            for n in checked:
                where = f"{name} on {route.name} ({label}): {n}"
                assert got[n] is not None, f"{where} gets no gradient"
                torch.testing.assert_close(got[n], want[n], atol=2e-5, rtol=2e-4, msg=lambda m, w=where: f"{w}: {m}")


def test_every_scheme_is_served_by_the_routes_its_parts_allow(fresh_flex_route):
    """Which routes serve which kind of scheme, read from the parts it defines: the fused
    route no bias, the masked route any bias without a value term, the recomputed route any
    bias or value term, the probabilities route every scheme, the flex route a position-only
    bias or a low-rank content bias with a form (not TUPE with [CLS] untied; FIRE's score only
    without gradients)."""
    served = {}
    for case in CASES:
        name, causal, extra = case.values
        sch = scheme_of(name, causal, extra, max_len=32)
        with torch.no_grad():
            off = {r.name for r in ROUTES if r.serves(sch)}
        served[case.id] = ({r.name for r in ROUTES if r.serves(sch)}, off)
    assert served["none-causal"] == ({"fused", "probabilities"},) * 2
    assert served["t5_bias-causal"] == ({"flex", "recomputed", "probabilities", "masked"},) * 2
    assert served["tupe-causal-untie_cls"][0] == {"recomputed", "probabilities", "masked"}
    assert served["fire-causal"] == ({"recomputed", "probabilities", "masked"},
                                     {"flex", "recomputed", "probabilities", "masked"})
    assert served["fixed_bidirectional-bidir"][0] == {"flex", "recomputed", "probabilities", "masked"}
    assert served["shaw-causal"][0] == {"recomputed", "probabilities"}
    assert served["transformer_xl-causal"][0] == {"recomputed", "probabilities", "masked"}


@pytest.mark.parametrize("bad,says", [
    ("attention.route=sometimes", "attention.route=sometimes must be one of auto, flex, masked"),
    ("attention.route=flex", "attention.route=flex trains through FlexAttention, which has no backward on the CPU"),
])  # fmt: skip
def test_a_route_setting_that_cannot_work_is_refused_in_one_line(make_cfg, bad, says):
    with pytest.raises(ConfigError) as e:
        check_config(make_cfg(bad))
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_a_run_records_the_routes_it_took(make_cfg, tmp_path, monkeypatch):
    """T5 on the CPU: its training steps take the recomputed route and its validation the
    masked one; ``run.json`` and the MLflow params say so. ``attention.route=masked`` is the
    setting the run applies (the flex route refused even where it was forced before)."""
    from posenc.train import train

    monkeypatch.setattr(flex_gates, "_setting", ["flex"])
    cfg = make_cfg("encoding=t5_bias", "trainer.max_steps=4", "trainer.val_check_interval=4", "attention.route=masked")
    out = tmp_path / "run"
    train(cfg, out_dir=out)
    assert flex_gates.route_setting() == "masked"
    routes = {"training": "recomputed", "evaluation": "masked"}
    assert json.loads(RunFolder(out).run_json.read_text())["attention_routes"] == routes
    (run,) = runs_of(tmp_path)
    assert run.data.params["attention.route"] == "masked"
    assert {k: v for k, v in run.data.params.items() if k.startswith("attention.route_taken.")} == {
        f"attention.route_taken.{mode}": route for mode, route in routes.items()}
