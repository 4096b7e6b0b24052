"""The ``flex`` route (FlexAttention, the route of position-only biases on CUDA) without a GPU.

FlexAttention has no backward on CPU, so the route is checked in two halves that
together cover it:

* the kernel: ``flex_route_attention`` through the real FlexAttention (its CPU
  forward) equals a dense evaluation of the same ``score_mod`` and ``mask_mod``
  (``dense_flex``: every logit, the score function applied to index grids, the
  mask, softmax);
* everything around the kernel: with "cpu" among ``FLEX_DEVICES`` and ``dense_flex``
  in place of the kernel, a layer and the whole model on the route (the parts each
  scheme declares, the relative table read at j - i, the low-rank absolute factors
  appended to q and k, the causal block mask, the gradients autograd carries from
  the table and the factors to the scheme's parameters) equal the dense reference
  of ``tests/references.py``, output and every gradient.

The GPU check (``python -m posenc.gpu_check``) runs the compiled kernel on CUDA.
"""

from __future__ import annotations

import pytest
import torch

import posenc.attention as attention_module
from posenc.attention import FLEX, Attention, FlexParts, causal_block_mask, flex_route_attention, plan_attention

from .references import dense_attention, dense_model
from .schemes import factory
from .test_attention import (CASES, D, H, V, assert_same_gradients, perturbed_model, scheme_of,
                             trained_layer_gradients)


def dense_flex(q, k, v, score_mod=None, block_mask=None, scale=None):
    """FlexAttention evaluated densely: the scaled logits of every pair, ``score_mod`` applied
    to index grids of batch, head, query and key, ``block_mask``'s ``mask_mod`` as -inf, softmax."""
    B, Hh, Tq, Tk = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(Hh)[None, :, None, None]
    qi, kv = torch.arange(Tq)[None, None, :, None], torch.arange(Tk)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if block_mask is not None:
        s = s.masked_fill(~block_mask.mask_mod(b, h, qi, kv), float("-inf"))
    return s.softmax(-1) @ v


def flex_cases():
    """The position-only schemes and those with a low-rank content part, without a value
    term: those the route serves, or hands on."""
    out = []
    for case in CASES:
        name, causal, extra = case.values
        sch = scheme_of(name, causal, extra, max_len=32)
        if (sch.position_only_bias or sch.factors_content()) and not sch.uses_value_term:
            out.append(case)
    return out


FLEX_CASES = flex_cases()


def takes_flex(name: str, extra: dict) -> bool:
    """Whether a scheme's bias has a form the route reads: TUPE's with [CLS] untied has none."""
    return not extra.get("untie_cls")


@pytest.fixture
def flex_on_cpu(monkeypatch):
    monkeypatch.setattr(attention_module, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(attention_module, "flex_kernel", lambda device: dense_flex)


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
        got = flex_route_attention(q, k, v, p, causal, 0.3)
        a, b = p.factors if p.factors is not None else (torch.zeros(H, T, 0),) * 2
        qq, kk = torch.cat([q, a.expand(B, -1, -1, -1)], -1), torch.cat([k, b.expand(B, -1, -1, -1)], -1)
        want = dense_flex(qq, kk, v, attention_module.bias_score_mod(p),
                          causal_block_mask(T, q.device) if causal else None, 0.3)
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


@pytest.mark.parametrize("T", [13, 150])
@pytest.mark.parametrize("name,causal,extra", FLEX_CASES)
def test_a_layer_on_the_flex_route_equals_the_dense_reference(name, causal, extra, T, flex_on_cpu):
    """One layer in training mode at contiguous offset positions: the route where the scheme's
    bias has its form (the masked or recomputed one otherwise), output and the gradient of the
    input, the projections and every parameter of the scheme against the dense formula."""
    torch.manual_seed(0)
    sch = scheme_of(name, causal, extra, max_len=T + 16)
    attn = Attention(D, H, sch, causal).train()
    h = torch.randn(2, T, D, requires_grad=True)
    pos = torch.arange(T) + 5
    plan = plan_attention([attn], h, pos)
    assert (plan.route == FLEX) == takes_flex(name, extra)
    y, ref = attn(h, pos, plan), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("name,causal,extra", [c for c in FLEX_CASES if takes_flex(c.values[0], c.values[2])])
def test_the_model_on_the_flex_route_equals_the_dense_reference(name, causal, extra, flex_on_cpu, monkeypatch):
    """The whole model (two layers; a shared scheme's parts built once and read by both) in
    evaluation mode: logits and the gradient of every parameter against the dense formula."""
    torch.manual_seed(1)
    T = 40
    model = perturbed_model(name, causal, extra, max_len=T + 16)
    built = []
    parts = attention_module.flex_parts
    monkeypatch.setattr(attention_module, "flex_parts", lambda s, pos: built.append(s) or parts(s, pos))
    idx = torch.randint(0, V, (2, T))
    pos = torch.arange(T)
    y, ref = model(idx, pos), dense_model(model, idx, pos)
    instances = {b.attn.scheme for b in model.blocks}
    assert len(built) == len(instances)  # once per scheme instance and forward
    torch.testing.assert_close(y, ref, atol=5e-5, rtol=5e-5)
    assert_same_gradients(y, ref, {n: p for n, p in model.named_parameters() if p.requires_grad}, atol=5e-5, rtol=5e-4)


def test_the_flex_route_is_taken_only_where_it_applies(monkeypatch):
    """Not on a device outside ``FLEX_DEVICES`` (CPU by default), not with attention dropout
    in training (FlexAttention has none), not at positions that are not contiguous, not for a
    content bias or a value term."""
    x, pos = torch.zeros(1, 8, D), torch.arange(8)

    def attn(name, dropout=0.0):
        return Attention(D, H, factory(name)(d_model=D, n_heads=H, max_len=64, causal=True), True, dropout)

    assert attention_module.FLEX_DEVICES == ("cuda",)
    assert attn("alibi").route(x, pos) != FLEX
    monkeypatch.setattr(attention_module, "FLEX_DEVICES", ("cpu",))
    assert attn("alibi").route(x, pos) == FLEX
    assert attn("t5_bias").eval().route(x, pos) == FLEX
    assert attn("t5_bias").route(x, pos, flex=False) != FLEX
    assert attn("alibi", dropout=0.1).train().route(x, pos) != FLEX
    assert attn("alibi", dropout=0.1).eval().route(x, pos) == FLEX
    assert attn("alibi").route(x, torch.tensor([0, 1, 3, 4, 5, 6, 7, 8])) != FLEX
    assert attn("fixed_bidirectional").route(x, pos) == FLEX
    for name in ("transformer_xl", "skew", "shaw", "rope", "none"):
        assert attn(name).route(x, pos) != FLEX


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", [8, 7])
def test_content_factors_give_the_content_bias(causal, head_dim):
    """The fixed bidirectional encoding's angle-addition factors against its shift-built
    ``content_bias``, at contiguous and at gapped positions, for an even and an odd head
    dimension (no last cosine slot), in float64 (``sinusoid`` returns its table in float32, the
    default dtype: agreement to float32's rounding of the table is what can be asked)."""
    torch.manual_seed(0)
    sch = factory("fixed_bidirectional")(d_model=head_dim * 2, n_heads=2, max_len=512, causal=causal)
    assert sch.factors_content()
    q, k = torch.randn(2, 2, 20, head_dim, dtype=torch.float64), torch.randn(2, 2, 20, head_dim, dtype=torch.float64)
    for pos in (torch.arange(20) + 100, torch.cumsum(torch.randint(1, 9, (20,)), 0)):
        a, b = sch.content_factors(q, k, pos, pos)
        got = sch.logit_scale() * a @ b.transpose(-1, -2)
        want = sch.content_bias(q, k, pos, pos)
        if causal:  # content_bias leaves the pairs the causal mask removes at 0
            got = got.masked_fill(pos[None, :] > pos[:, None], 0.0)
        torch.testing.assert_close(got, want.expand_as(got), atol=1e-6, rtol=1e-5)


def _model_on_the_real_kernel(name, causal, extra, monkeypatch, kernel, shapes=((2, 40),)):
    """The model's logits on the flex route with ``kernel`` as FlexAttention (no gradients:
    FlexAttention has no CPU backward) against the dense reference, at each (batch, length)."""
    monkeypatch.setattr(attention_module, "FLEX_DEVICES", ("cpu",))
    monkeypatch.setattr(attention_module, "flex_kernel", lambda device: kernel)
    torch.manual_seed(2)
    model = perturbed_model(name, causal, extra, max_len=max(T for _, T in shapes) + 16)
    with torch.no_grad():
        for B, T in shapes:
            idx, pos = torch.randint(0, V, (B, T)), torch.arange(T)
            torch.testing.assert_close(model(idx, pos), dense_model(model, idx, pos), atol=5e-5, rtol=5e-5)


@pytest.mark.parametrize("name,causal,extra", [c for c in FLEX_CASES if takes_flex(c.values[0], c.values[2])])
def test_every_score_function_runs_in_the_real_kernel(name, causal, extra, monkeypatch):
    """Each scheme's own parts (its table, factors and score function, FIRE's unrolled MLP
    included) through the real FlexAttention (eager, CPU forward), against the dense reference."""
    from torch.nn.attention.flex_attention import flex_attention

    _model_on_the_real_kernel(name, causal, extra, monkeypatch, flex_attention)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fire", "t5_bias", "tupe", "fixed_bidirectional"])
def test_the_compiled_kernel_takes_every_kind_of_part(name, monkeypatch):
    """The compiled FlexAttention, as CUDA runs it, here compiled for the CPU (forward): a
    relative table (T5), factors (TUPE's absolute part, the fixed bidirectional term) and a
    score function (FIRE) trace and compile, and give the dense reference's logits at the
    lengths and batch sizes an evaluation asks for. Past the first shapes the sizes turn dynamic
    (torch compiles apart only batch 1 against more, and one 128-token block against more), so
    further lengths and batches compile nothing: an evaluation at many lengths stays within
    torch's limit of recompilations, past which it would fall back to the unfused kernel."""
    from torch._dynamo.utils import counters

    counters.clear()
    extra = {"init_threshold": 4.0} if name == "fire" else {}
    kernel = attention_module._compiled_flex_attention()
    kinds = ((2, 40), (2, 72), (1, 100), (3, 130), (1, 257), (4, 64))  # batch 1 or more x one block or more
    _model_on_the_real_kernel(name, True, extra, monkeypatch, kernel, kinds)
    first = counters["stats"]["unique_graphs"]
    assert 0 < first < torch._dynamo.config.recompile_limit
    _model_on_the_real_kernel(name, True, extra, monkeypatch, kernel, ((2, 200), (5, 96), (1, 513), (3, 90), (1, 33)))
    assert counters["stats"]["unique_graphs"] == first
