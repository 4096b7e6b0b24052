"""The ``flex`` route (FlexAttention, CUDA's route for position-only biases) without a GPU.

FlexAttention on the CPU runs a forward, and a backward only to the tensors ``score_mod``
reads, and only compiled (``torch.compile(flex_attention, backend="aot_eager")``: dynamo and
AOTAutograd, the path CUDA's Inductor takes) with q, k and v detached. So the route is checked
in parts that together cover it:

* the kernel's forward: ``flex_attend`` through the real FlexAttention equals a dense
  evaluation of the same ``score_mod`` and ``mask_mod`` (``flexkit.dense_flex``), and every
  scheme's parts through it give the dense reference's logits;
* the kernel's backward to what ``score_mod`` reads: through the compiled kernel's own
  backward (``aot_eager``), gradients equal to the dense reference's (here for FIRE's score;
  tests/test_routes.py for every scheme), a view read in ``score_mod`` getting none (the
  pitfall, and that no scheme hands the kernel one), and Inductor's check of the backward's
  joint graph run on the real graph;
* the backward to q and k (the appended factors): ``dense_flex`` in place of the kernel
  (a stand-in, said where it is used);
* the route's decisions: the probe with the real kernel, the recompilation limit lowered until
  it is hit, the causal block mask against ``create_block_mask``.

What runs without compiling is in tests/test_attention.py, where the mutation run can judge
with it: the gates, each scheme's table, factors and score function on index grids, the fixed
encoding's content factors, and the route itself with ``dense_flex`` in place of the kernel (a
layer and the model against the dense formula, the setting ``attention.route``, the probe with
a right kernel and with planted failing ones). The GPU check (``python -m posenc.gpu_check``) runs
the compiled kernel on CUDA.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import posenc.attention.flex as flex_module
import posenc.attention.flex_kernel as flex_kernel
import posenc.compiling as compiling
from posenc.attention import (FLEX, FLEX_ROUTE, MASKED, RECOMPUTED, Attention, FlexFallback, FlexParts, bias_score_mod,
                              causal_block_mask, flex_attend, flex_parts, plan_attention)
from posenc.attention.flex_kernel import causal_mask_mod

from .flexkit import (closure_tensors, dense_flex, fresh_flex_route, joint_graph_checking_backend,  # noqa: F401
                      lift_score_rule, real_kernel, use_kernel)
from .references import dense_attention, dense_model
from .test_attention import FORMED, D, H, V, assert_same_gradients, perturbed_model, scheme_of


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T", [7, 200])
def test_the_flex_kernel_equals_the_dense_evaluation_of_its_score_function(causal, T):
    """The real FlexAttention (forward, CPU) with a relative table, low-rank factors and a score
    function, at a length below and one not a multiple of its 128-token blocks, against
    ``dense_flex``, and the table and the score against the logits written out."""
    torch.manual_seed(0)
    B, Dh, r = 2, 16, 8
    q, k, v = (torch.randn(B, H, T, Dh) for _ in range(3))
    parts = FlexParts(torch.randn(H, 2 * T - 1), (torch.randn(H, T, r), torch.randn(H, T, r)))
    w, col = torch.randn(H), torch.randn(T)
    score = FlexParts(parts.table, None, lambda h, i, j: w[h] * torch.relu(col[j] - 0.1 * i))
    for p in (parts, FlexParts(parts.table, None), FlexParts(None, parts.factors), score):
        got = flex_attend(q, k, v, p, causal, 0.3)
        a, b = p.factors if p.factors is not None else (torch.zeros(H, T, 0),) * 2
        qq, kk = torch.cat([q, a.expand(B, -1, -1, -1)], -1), torch.cat([k, b.expand(B, -1, -1, -1)], -1)
        want = dense_flex(qq, kk, v, bias_score_mod(p), causal_block_mask(T, q.device) if causal else None, 0.3)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # and the relative table is the Toeplitz layout of the scheme interface
        if p.table is not None and p.factors is None:
            i = torch.arange(T)
            logits = (q @ k.transpose(-1, -2)) * 0.3 + p.table[:, i[None, :] - i[:, None] + T - 1]
            if p.score is not None:
                logits = logits + w[:, None, None] * torch.relu(col[None, None, :] - 0.1 * i[None, :, None])
            if causal:
                logits = logits.masked_fill(i[None, :] > i[:, None], float("-inf"))
            torch.testing.assert_close(got, logits.softmax(-1) @ v, atol=1e-5, rtol=1e-5)


def _model_on_the_real_kernel(name, causal, extra, monkeypatch, kernel, shapes=((2, 40),), d_model=D):
    """The model's logits on the flex route with ``kernel`` as FlexAttention (no gradients)
    against the dense reference, at each (batch, length)."""
    use_kernel(monkeypatch, kernel)
    torch.manual_seed(2)
    model = perturbed_model(name, causal, extra, max_len=max(T for _, T in shapes) + 16, d_model=d_model)
    with torch.no_grad():
        for B, T in shapes:
            idx, pos = torch.randint(0, V, (B, T)), torch.arange(T)
            torch.testing.assert_close(model(idx, pos), dense_model(model, idx, pos), atol=5e-5, rtol=5e-5)
    assert model.attention_routes() == {"evaluation": FLEX}


@pytest.mark.parametrize("name,causal,extra", FORMED)
def test_every_score_function_runs_in_the_real_kernel(name, causal, extra, monkeypatch, fresh_flex_route):
    """Each scheme's own parts (its table, factors and score function, FIRE's piecewise-linear
    one included) through the real FlexAttention (eager, CPU forward), against the dense
    reference."""
    from torch.nn.attention.flex_attention import flex_attention

    _model_on_the_real_kernel(name, causal, extra, monkeypatch, flex_attention)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t5_bias", "tupe", "fixed_bidirectional"])
def test_the_compiled_kernel_takes_every_kind_of_part(name, monkeypatch, fresh_flex_route):
    """The compiled FlexAttention, as CUDA runs it, here compiled by Inductor for the CPU
    (forward): a relative table (T5) and factors (TUPE's absolute part, the fixed bidirectional
    term) trace and compile (FIRE's score function: the next test), and give the dense reference's logits
    at the lengths and batch sizes an evaluation asks for. Past the first shapes the sizes turn
    dynamic (torch compiles apart only batch 1 against more, and one 128-token block against
    more), so further lengths and batches compile nothing: a few graphs per scheme and grad
    mode, far below the route's limit (``posenc.compiling.RECOMPILE_LIMIT``). Heads of 32:
    Inductor's CPU kernel gives wrong values at heads of 8 and NaN at 16 on this project's
    machines (torch 2.13), where the GPU's Triton kernel needs 16 or more anyway."""
    from torch._dynamo.utils import counters

    counters.clear()
    kernel = flex_kernel.compiled_flex()
    kinds = ((2, 40), (2, 72), (1, 100), (3, 130), (1, 257), (4, 64))  # batch 1 or more x one block or more
    _model_on_the_real_kernel(name, True, {}, monkeypatch, kernel, kinds, d_model=4 * 32)
    first = counters["stats"]["unique_graphs"]
    assert 0 < first <= 8
    _model_on_the_real_kernel(name, True, {}, monkeypatch, kernel, ((2, 200), (5, 96), (1, 513), (3, 90), (1, 33)),
                              d_model=4 * 32)
    assert counters["stats"]["unique_graphs"] == first


@pytest.mark.slow
def test_a_kernel_that_fails_to_compile_leaves_the_route_with_one_warning(monkeypatch, fresh_flex_route):
    """A real failure, not a planted one. Inductor's CPU kernel (torch 2.13) compiles FIRE's
    score function at the first size it sees and gives the dense reference's logits there, but
    its C++ code for the sizes made dynamic does not compile (``CppCompileError``: the casts of
    the segment count; Triton's GPU code is another compiler, which the GPU check tries). Under
    ``auto`` (its gates passed: no GPU here) the probe, whose second call has the sizes made
    dynamic, meets that failure: one warning naming FIRE and the error, and the evaluation on the
    float-mask route, with the dense reference's logits."""
    from torch._inductor.exc import InductorError

    use_kernel(monkeypatch, flex_kernel.compiled_flex())
    torch.manual_seed(2)
    model = perturbed_model("fire", True, {"init_threshold": 4.0}, max_len=300, d_model=4 * 32)
    idx, idx72 = torch.randint(0, V, (2, 40)), torch.randint(0, V, (2, 72))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), dense_model(model, idx, torch.arange(40)), atol=5e-5, rtol=5e-5)
        with pytest.raises(RuntimeError, match="CppCompileError") as e:  # attention.route=flex: the error itself
            model(idx72)
        assert isinstance(e.value.__cause__, InductorError)
    FLEX_ROUTE.reset()
    torch._dynamo.reset()
    use_kernel(monkeypatch, flex_kernel.compiled_flex(), setting="auto")
    monkeypatch.setattr(flex_module, "device_gate", lambda device, qk, v: None)
    model.routes_taken.clear()
    with torch.no_grad(), pytest.warns(FlexFallback, match="FIRE takes a float-mask route.*CppCompileError"):
        y = model(idx72)
    torch.testing.assert_close(y, dense_model(model, idx72, torch.arange(72)), atol=5e-5, rtol=5e-5)
    assert model.attention_routes() == {"evaluation": MASKED}


# ------------------------------------------------------------------ gradients through the kernel


def test_a_view_read_in_score_mod_gets_no_gradient_from_the_compiled_kernel():
    """The pitfall, as torch has it (2.6 to 2.13): through the compiled kernel's own backward, a
    tensor read in ``score_mod`` that is a view of one with a graph (``emb(buckets).T``) leaves
    the embedding without a gradient, and no error says so; a copy (``.clone()``, what
    ``flex_kernel.fresh`` makes) gets the gradient of the dense evaluation. Should torch give the
    view its gradient one day, the first assertion fails and this test says so."""
    from torch.nn.attention.flex_attention import flex_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    buckets = torch.randint(0, 10, (127,))
    grads = {}
    for form in ("view", "clone"):
        torch._dynamo.reset()
        emb = nn.Embedding(10, 4)
        table = emb(buckets).T
        table = table.clone() if form == "clone" else table

        def score_mod(s, b, h, i, j):
            return s + table[h, j - i + 63]

        want = torch.autograd.grad(dense_flex(q, k, v, score_mod, None, 16**-0.5).sum(), emb.weight,
                                   retain_graph=True)[0]
        torch.compile(flex_attention, backend="aot_eager")(q, k, v, score_mod=score_mod).sum().backward()
        grads[form] = emb.weight.grad
    assert grads["view"] is None
    torch.testing.assert_close(grads["clone"], want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("name,causal,extra", FORMED)
def test_no_tensor_a_score_function_reads_is_a_view(name, causal, extra, grad, monkeypatch):
    """For every scheme on the route, with gradients on (the score rule lifted: FIRE's too) and
    off: the relative table and every tensor the score function reads (through its closures)
    is a fresh tensor, never a view the kernel's backward would leave without a gradient."""
    lift_score_rule(monkeypatch)
    sch = scheme_of(name, causal, extra, max_len=64)
    with torch.set_grad_enabled(grad):
        parts = flex_parts(sch, torch.arange(40))
        read = closure_tensors(bias_score_mod(parts)) if bias_score_mod(parts) is not None else []
    assert (parts.table is not None or parts.score is not None) == bool(read)
    views = [tuple(t.shape) for t in read if t._base is not None]
    assert views == [], f"{name}: score_mod reads views of shapes {views}"
    if grad and any(p.requires_grad for p in sch.parameters()) and (parts.table is not None or parts.score is not None):
        assert any(t.requires_grad for t in read)


def _fire_layer(monkeypatch, T=60):
    lift_score_rule(monkeypatch)
    torch.manual_seed(0)
    sch = scheme_of("fire", True, {"init_threshold": 24.0}, max_len=T + 8)  # rows on both sides of L
    return Attention(D, H, sch, True).train(), torch.randn(2, T, D), torch.arange(T)


def test_fire_score_gets_the_dense_gradients_through_the_kernel_backward(monkeypatch, fresh_flex_route):
    """FIRE's score in its piecewise-linear form on the flex route (the rule lifted), one layer
    in training through the compiled kernel's own backward (``aot_eager``; q, k, v detached, as
    the CPU kernel needs): the output and the gradient of every parameter of FIRE (the MLP's,
    c and L, all read in ``score_mod``) equal the dense reference's (``tests/references.py``,
    the paper's formula with the MLP itself)."""
    attn, h, pos = _fire_layer(monkeypatch)
    use_kernel(monkeypatch, real_kernel())
    plan = plan_attention([attn], h, pos)
    assert plan.name == FLEX
    y, ref = attn(h, pos, plan), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    named = {n: p for n, p in attn.scheme.named_parameters()}
    assert set(named) == {"c", "threshold", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
    got = torch.autograd.grad(y, list(named.values()), torch.randn_like(y), retain_graph=True, allow_unused=True)
    assert all(g is not None for g in got)
    assert_same_gradients(y, ref, named, atol=2e-5, rtol=2e-4)


@pytest.mark.slow
def test_inductor_refuses_fires_old_score_and_accepts_the_new(monkeypatch, fresh_flex_route):
    """Inductor's check of a FlexAttention backward (``validate_joint_graph``, run on the joint
    graph AOTAutograd makes on the CPU, ``flexkit.joint_graph_checking_backend``) refuses FIRE's
    former score, the MLP unrolled over its 32 units (w1, b1 and W2 indexed once a unit), and
    accepts the piecewise-linear one, which indexes each tensor with a graph once."""
    from torch.nn.attention.flex_attention import flex_attention

    attn, h, pos = _fire_layer(monkeypatch)
    sch = attn.scheme
    lin1, lin2 = sch.mlp[0], sch.mlp[2]
    w1, b1, w2, b2 = lin1.weight[:, 0].clone(), lin1.bias, lin2.weight, lin2.bias
    new = sch.absolute_score(pos, pos)
    numer = sch.numerator(-torch.arange(1 - len(pos), len(pos)).float())
    row = sch.psi(torch.maximum(pos.float(), sch.threshold.abs())) + sch.eps
    col = sch.psi(pos.float()) + sch.eps

    def old(h_, i, j):  # the former absolute_score's inner function
        x = numer[j - i + row.shape[0] - 1] / torch.maximum(row[i], col[j])
        out = b2[h_]
        for unit in range(w1.shape[0]):
            out = out + w2[h_, unit] * torch.relu(w1[unit] * x + b1[unit])
        return out

    q, k, v = (t.detach() for t in attn.project(h))
    checked = []
    kernel = torch.compile(flex_attention, backend=joint_graph_checking_backend(checked))
    score = kernel(q, k, v, score_mod=bias_score_mod(FlexParts(None, None, new)))
    score.sum().backward()
    assert len(checked) == 1 and sch.mlp[0].weight.grad is not None
    torch._dynamo.reset()
    with pytest.raises(Exception, match="multiple indexing operations on the same tensor"):
        kernel(q, k, v, score_mod=bias_score_mod(FlexParts(None, None, old))).sum().backward()


# ------------------------------------------------------------------ gates, probe, limits


def test_the_probe_passes_with_the_real_kernel_and_fails_where_it_cannot_train(monkeypatch, fresh_flex_route):
    """The probe with the compiled kernel's own backward (``aot_eager``): T5's table, read in
    ``score_mod``, gets its gradient, so T5 passes with gradients on and off and takes the route;
    TUPE's absolute part needs the kernel's backward for q and k, which the CPU kernel lacks:
    its probe fails with gradients on (a warning with torch's reason) and passes without."""
    use_kernel(monkeypatch, flex_kernel.compiled_flex("aot_eager"), setting="auto")
    monkeypatch.setattr(flex_module, "device_gate", lambda device, qk, v: None)
    x, pos = torch.zeros(1, 16, D), torch.arange(16)
    t5 = Attention(D, H, scheme_of("t5_bias", True, {}, max_len=64), True)
    tupe = Attention(D, H, scheme_of("tupe", True, {}, max_len=256), True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlexFallback)
        assert t5.route(x, pos) == FLEX
        with torch.no_grad():
            assert t5.route(x, pos) == FLEX and tupe.route(x, pos) == FLEX
    with pytest.warns(FlexFallback, match="TUPE takes a float-mask route.*gradients on.*backward"):
        assert tupe.route(x, pos) == RECOMPUTED
    assert len(FLEX_ROUTE.verdicts) == 4


def test_the_recompile_limit_sends_the_route_to_the_float_mask_routes_not_the_unfused_kernel(monkeypatch,
                                                                                           fresh_flex_route):
    """The real compiled kernel (``aot_eager``) under a limit lowered to one graph: ALiBi at 24
    positions compiles it; T5 at 40 needs a second graph (another length), and torch fails
    instead of running the kernel unfused (``posenc.compiling``): one warning, T5's forward on
    the float-mask route (the dense reference's logits), and every later call, ALiBi's too,
    there at once."""
    calls = []
    use_kernel(monkeypatch, real_kernel(calls))
    monkeypatch.setattr(compiling, "RECOMPILE_LIMIT", 1)
    torch.manual_seed(0)
    alibi, t5 = (perturbed_model(name, True, {}, max_len=64) for name in ("alibi", "t5_bias"))
    idx, idx40 = torch.randint(0, V, (2, 24)), torch.randint(0, V, (2, 40))
    with torch.no_grad():
        torch.testing.assert_close(alibi(idx), dense_model(alibi, idx, torch.arange(24)), atol=5e-5, rtol=5e-5)
        assert len(calls) == 2 and alibi.attention_routes() == {"evaluation": FLEX}
        with pytest.warns(FlexFallback, match="limit of 1 compiled graphs") as seen:
            y = t5(idx40)
        assert len([w for w in seen if issubclass(w.category, FlexFallback)]) == 1
        torch.testing.assert_close(y, dense_model(t5, idx40, torch.arange(40)), atol=5e-5, rtol=5e-5)
        assert len(calls) == 3  # the one call that hit the limit; its layer and the next planned again
        with warnings.catch_warnings():
            warnings.simplefilter("error", FlexFallback)
            alibi(idx), t5(idx40)
    assert len(calls) == 3
    assert t5.attention_routes() == {"evaluation": MASKED}  # no layer of T5 attended on the flex route
    assert alibi.attention_routes() == {"evaluation": f"{FLEX}, then {MASKED}"}


@pytest.mark.parametrize("T", [7, 128, 200, 256, 300, 1000])
def test_the_causal_block_mask_is_create_block_masks_without_a_t_by_t_tensor(T):
    """``causal_block_mask`` (from the blocks alone) against ``create_block_mask(causal_mask_mod)``
    at lengths that are and are not multiples of 128: the same counts of partial and whole key
    blocks per query block, the same blocks, the same transposed (query) blocks, and the same
    output of FlexAttention with either; and no tensor of T x T entries or more is made."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    from torch.utils._python_dispatch import TorchDispatchMode

    class Sizes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    causal_block_mask.__wrapped__.cache_clear()
    with Sizes() as sizes:
        mine = causal_block_mask(T, torch.device("cpu"))
    assert sizes.largest < T * T or T < 16
    ref = create_block_mask(causal_mask_mod, None, None, T, T, device="cpu")
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        a, b = getattr(mine, num), getattr(ref, num)
        assert torch.equal(a, b), num
        for m, n in enumerate(a.flatten().tolist()):
            got, want = getattr(mine, idx)[0, 0, m, :n], getattr(ref, idx)[0, 0, m, :n]
            assert sorted(got.tolist()) == sorted(want.tolist()), f"{idx} of block {m}"
    assert mine.seq_lengths == ref.seq_lengths and mine.BLOCK_SIZE == ref.BLOCK_SIZE
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, T, 16) for _ in range(3))
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=mine), flex_attention(q, k, v, block_mask=ref),
                               atol=0, rtol=0)


def test_the_causal_block_mask_is_built_outside_compiled_graphs():
    """Inside a compiled function the block mask is not traced (``torch.compiler.disable``: dynamo
    would ignore its cache and rebuild it at every step): no graph dynamo makes holds an op of it."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(x):
        return x * causal_block_mask(300, x.device).kv_num_blocks.sum()

    torch._dynamo.reset()
    torch.compile(step, backend=backend)(torch.ones(3))
    ops = [str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"]
    assert ops and not any(op for op in ops if "arange" in op or "remainder" in op or "expand" in op), ops
    torch._dynamo.reset()
