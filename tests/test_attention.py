"""Every scheme's attention, on whatever route it takes, against its dense reference.

The reference (``tests/references.py``) is written from each paper's formula: it
reads the scheme's parameters but calls neither the scheme's methods nor
``Attention``'s, so a wrong bias, rotation or value term fails here even when the
scheme agrees with itself. Each test runs with gradients on (the training
routes: ``fused``, ``masked``, ``recomputed`` with its blockwise backward,
``probabilities``) and compares the output and the gradient of every input and
parameter, at a short length and at T = 256 (several row blocks of the
recomputing backward), for causal and bidirectional attention where the scheme
allows both, and for the whole model (the shared position masks, the embeddings)
as well as one layer.

A scheme class without a reference (a new one, found through its YAML) is still
tested, against its own ``rotate`` and ``bias``: that tests how attention uses
them, and its docstring names the test that checks the bias itself.

The last section holds the parts of the ``flex`` route that run without compiling
anything (tests/test_flex.py has the kernel): the gates of ``auto`` on stated values and on
this process's facts, every position-only scheme's table, factors and score function
evaluated eagerly on index grids (what FlexAttention's ``score_mod`` sees) against the
scheme's own bias, values and gradients, and the fixed bidirectional encoding's content
factors against its shift-built bias. They are here, not in tests/test_flex.py, because they
need neither dynamo nor a block mask, so the mutation run (``python -m tests.mutation``) can
judge with them: dynamo cannot trace the wrapper mutmut puts around every function, and
``create_block_mask`` reads a mask function's signature, which the wrapper hides.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager

import pytest
import torch

import torch.utils._triton as torch_triton

import posenc.attention.flex as flex_module
import posenc.attention.flex_gates as flex_gates
import posenc.attention.layer as layer_module
import posenc.model as model_module
from posenc.attention import blocks
from posenc.attention import (FLEX, FLEX_ROUTE, FUSED, MASKED, PROBABILITIES, RECOMPUTED, Attention, FlexFallback,
                              bias_score_mod, flex_attend, flex_parts, plan_attention)
from posenc.attention.flex_gates import device_gate, gate
from posenc.encodings import ALiBi, PositionalScheme
from posenc.model import ModelConfig, Transformer

from .flexkit import dense_flex, fresh_flex_route, index_grids, lift_score_rule, use_kernel  # noqa: F401
from .references import dense_attention, dense_model
from .schemes import discover, factory

CONFIGS, _ = discover()
D, H, V = 32, 4, 64  # width, heads, vocabulary
#: settings of one scheme that reach more of its code than its defaults
EXTRA = {"fire": [{"init_threshold": 4.0}], "tupe": [{"untie_cls": True}, {"max_distance": 6, "num_buckets": 8}],
         "rope": [{"fraction": 0.5}, {"fraction": 0.25}], "t5_bias": [{"max_distance": 6, "num_buckets": 8}],
         "sinusoidal": [{"base": 500.0}], "fixed_bidirectional": [{"base": 500.0}],
         "transformer_xl": [{"base": 500.0}], "xpos": [{"base": 500.0, "gamma": 0.8, "scale_base": 16.0}]}


def _cases():
    out = []
    for name, cfg in CONFIGS.items():
        modes = [True] if cfg.cls is not None and cfg.cls.causal_only else [True, False]
        for causal in modes:
            for extra in [{}] + EXTRA.get(name, []):
                tag = f"{name}-{'causal' if causal else 'bidir'}" + ("-" + ",".join(extra) if extra else "")
                out.append(pytest.param(name, causal, extra, id=tag))
    return out


CASES = _cases()


def scheme_of(name: str, causal: bool, extra: dict, max_len: int):
    sch = factory(name, **extra)(d_model=D, n_heads=H, max_len=max_len, causal=causal)
    with torch.no_grad():  # away from the (often zero) initial values, so every term counts
        for p in sch.parameters():
            if p.dim() > 0:
                p.add_(torch.randn_like(p) * 0.3)
    return sch


def grads(out: torch.Tensor, upstream: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    got = torch.autograd.grad(out, tensors, upstream, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(tensors, got)]


def assert_same_gradients(y: torch.Tensor, ref: torch.Tensor, named: dict[str, torch.Tensor], atol: float,
                          rtol: float) -> None:
    """The gradient of each tensor of ``named`` through ``y`` equals the one through ``ref``,
    for one random upstream gradient (a tensor ``y`` does not reach counts as zero)."""
    upstream, tensors = torch.randn_like(y), list(named.values())
    for n, a, b in zip(named, grads(y, upstream, tensors), grads(ref, upstream, tensors)):
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol, msg=lambda m, n=n: f"gradient of {n}: {m}")


def trained_layer_gradients(attn: Attention, h: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors a layer's gradient check covers: its input and every trainable parameter."""
    return {"input": h, **{n: p for n, p in attn.named_parameters() if p.requires_grad}}


def perturbed_model(name: str, causal: bool, extra: dict, max_len: int, d_model: int = D) -> Transformer:
    """The two-layer test model of a scheme (``d_model`` wide, ``H`` heads), in evaluation mode,
    its positional tensors moved away from their (often zero) initial values so that every term
    counts (scalar settings, FIRE's c and L, left alone)."""
    cfg = ModelConfig(vocab_size=V, d_model=d_model, n_layers=2, n_heads=H, d_ff=64, max_len=max_len, causal=causal)
    model = Transformer(cfg, factory(name, **extra)).eval()
    with torch.no_grad():
        for p in model.positional_parameters():
            if p.dim() > 0:
                p.add_(torch.randn_like(p) * 0.3)
    return model


EXPECTED_ROUTE = {  # what a training call with contiguous positions takes, by what the scheme is
    "fused": FUSED, "masked": MASKED, "recomputed": RECOMPUTED, "probabilities": PROBABILITIES,
}


def expected_route(scheme) -> str:
    if not (scheme.has_bias or scheme.uses_value_term):
        return FUSED
    trainable = any(p.requires_grad for p in scheme.parameters())
    return RECOMPUTED if (scheme.uses_value_term or not scheme.position_only_bias or trainable) else MASKED


@pytest.mark.parametrize("T,positions", [(13, "offset"), (13, "gapped"), (256, "offset")])
@pytest.mark.parametrize("name,causal,extra", CASES)
def test_attention_layer_equals_dense_reference(name, causal, extra, T, positions, monkeypatch):
    """Output and gradients (input, projections, every parameter of the scheme) of one layer in
    training mode against the dense formula. Contiguous positions (offset by 5) take the
    scheme's training route; gapped ones the masked route. At T = 256 the recomputing backward
    runs in blocks of 32 query rows."""
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * T * 32)
    torch.manual_seed(0)
    sch = scheme_of(name, causal, extra, max_len=T + 16)
    attn = Attention(D, H, sch, causal).train()
    h = torch.randn(3, T, D, requires_grad=True)
    pos = torch.arange(T) + 5 if positions == "offset" else torch.cumsum(torch.randint(1, 3, (T,)), 0)
    if positions == "offset":
        assert attn.route(h, pos) == expected_route(sch)
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("T", [12, 256])
@pytest.mark.parametrize("name,causal,extra", CASES)
def test_model_equals_dense_reference(name, causal, extra, T, monkeypatch):
    """The whole model (the embedding, a position-only bias built once per forward and shared by
    the layers of a shared scheme, two layers) in evaluation mode with gradients on: logits
    and the gradient of every parameter against the dense formula; and with gradients off
    (a layer's own bias a block of 64 rows at a time), the logits."""
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 2 * H * T * 32)
    monkeypatch.setattr(blocks, "FORWARD_BLOCK_ROWS", 64)
    torch.manual_seed(1)
    model = perturbed_model(name, causal, extra, max_len=T + 16)
    idx = torch.randint(0, V, (2, T))
    pos = torch.arange(T)
    y, ref = model(idx, pos), dense_model(model, idx, pos)
    torch.testing.assert_close(y, ref, atol=5e-5, rtol=5e-5)
    with torch.no_grad():
        torch.testing.assert_close(model(idx, pos), ref, atol=5e-5, rtol=5e-5)
    assert_same_gradients(y, ref, {n: p for n, p in model.named_parameters() if p.requires_grad}, atol=5e-5, rtol=5e-4)


@pytest.mark.parametrize("name,causal,extra", [c for c in CASES if not c.values[2]])
def test_model_in_float64_equals_dense_reference(name, causal, extra):
    """The whole model in float64 (``model.double()``: every parameter, buffer and activation),
    as numerical checks run it: each scheme builds its tables, masks and biases in the dtype
    of the activations or of its parameters, never a fixed float32 (a float32 mask or table
    meeting float64 activations is refused by the kernels), and the logits equal the float64
    dense formula (to 1e-6: tables built in float32 at construction, such as RoPE's
    frequencies, keep their float32 rounding)."""
    torch.manual_seed(2)
    T = 12
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=T + 16, causal=causal)
    model = Transformer(cfg, factory(name, **extra)).eval().double()
    with torch.no_grad():
        for p in model.positional_parameters():
            if p.dim() > 0:
                p.add_(torch.randn_like(p) * 0.3)
    idx, pos = torch.randint(0, V, (2, T)), torch.arange(T)
    for grad in (False, True):  # the masked and the training routes
        with torch.set_grad_enabled(grad):
            y, ref = model(idx, pos), dense_model(model, idx, pos)
        assert y.dtype == torch.float64
        assert ref.dtype == torch.float64
        torch.testing.assert_close(y, ref, atol=1e-6, rtol=1e-6)
    h = torch.randn(2, T, D, dtype=torch.float64)
    for layer in (model.blocks[0].attn.eval(), model.blocks[1].attn.train()):  # a layer called alone
        y = layer(h, pos)
        assert y.dtype == torch.float64
        torch.testing.assert_close(y, dense_attention(layer, h, pos), atol=1e-6, rtol=1e-6)


def test_causal_mask_values_and_dtype():
    """0 where the key is at or before the query, -inf after, in the dtype asked for."""
    from posenc.attention import causal_mask

    q_pos, k_pos = torch.tensor([3, 5]), torch.tensor([2, 3, 4, 6])
    for dtype in (torch.float64, torch.bfloat16, torch.float32):
        m = causal_mask(q_pos, k_pos, dtype)
        assert m.dtype == dtype
        inf = float("-inf")
        assert m.tolist() == [[0.0, 0.0, inf, inf], [0.0, 0.0, 0.0, inf]]


class _ScaledALiBi(PositionalScheme):
    """ALiBi times a learned per-head factor, written as a content bias (it reads neither q
    nor k): its bias has batch size 1, which the recomputing backward must broadcast."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.alibi = ALiBi(**kw)
        self.factor = torch.nn.Parameter(torch.linspace(0.5, 1.5, self.n_heads))

    def content_bias(self, q, k, q_pos, k_pos):
        return self.alibi.position_bias(q_pos, k_pos) * self.factor[None, :, None, None]


def trains_as_the_distance_formula(sch, causal: bool, per_head, params: list) -> tuple:
    """One layer of ``sch`` in training mode at 24 positions, over several row blocks of the
    recomputing backward (the route it must take): its output and the gradients of its
    input, its projections and ``params`` equal autograd through the formula written here,
    q·k / sqrt(d) - per_head()_h |i - j|. Returns (layer, input, positions, formula logits)."""
    attn = Attention(D, H, sch, causal).train()
    h = torch.randn(3, 24, D, requires_grad=True)
    pos = torch.arange(24)
    assert attn.route(h, pos) == RECOMPUTED
    y = attn(h, pos)
    from .references import dense_qkv

    q, k, v = dense_qkv(attn, h)
    dist = (pos[None, :] - pos[:, None]).abs().float()
    formula = q @ k.mT / math.sqrt(D // H) - per_head()[:, None, None] * dist
    masked = formula.masked_fill(pos[None, :] > pos[:, None], float("-inf")) if causal else formula
    ref = (masked.softmax(-1) @ v).transpose(1, 2).reshape(3, 24, D) @ attn.out.weight.T + attn.out.bias
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    named = {"input": h, "qkv.weight": attn.qkv.weight, **{f"parameter {i}": p for i, p in enumerate(params)}}
    assert_same_gradients(y, ref, named, atol=2e-5, rtol=2e-4)
    return attn, h, pos, formula



@pytest.mark.parametrize("causal", [True, False])
def test_a_scheme_of_ones_own_with_its_own_logit_scale_takes_the_fused_route_at_that_scale(causal):
    """A scheme with no bias whose logit scale is not 1/sqrt(head dim) (TUPE's kind of change)
    takes the fused route, at its own scale: output and every gradient against the dense formula."""

    class Scaled(PositionalScheme):
        def logit_scale(self):
            return 0.7

    torch.manual_seed(0)
    attn = Attention(D, H, Scaled(d_model=D, n_heads=H, max_len=32, causal=causal), causal).train()
    h, pos = torch.randn(2, 10, D, requires_grad=True), torch.arange(10)
    assert attn.route(h, pos) == FUSED
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)

@pytest.mark.parametrize("causal", [True, False])
def test_a_content_bias_of_batch_one_trains_right(causal, monkeypatch):
    """A scheme declared content-dependent whose bias has batch size 1 takes the recomputing
    backward; its gradients (input, projections, the factor) equal autograd through the
    formula -factor_h m_h |i - j| written here, over several row blocks."""
    from .references import alibi_slope

    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * 24 * 5)
    torch.manual_seed(3)
    sch = _ScaledALiBi(d_model=D, n_heads=H, max_len=64, causal=causal)
    slopes = torch.tensor([alibi_slope(i, H) for i in range(H)])
    trains_as_the_distance_formula(sch, causal, lambda: sch.factor * slopes, [sch.factor])


class _OnlyABias(PositionalScheme):
    """-w_h |i - j| / 4 from positions, with a learned w per head, and nothing else: no
    flag says that it has a bias, what kind, or how attention should compute it."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, self.n_heads))

    def absolute_bias(self, q_pos, k_pos):
        dist = (k_pos[None, :] - q_pos[:, None]).abs().to(self.w.dtype)
        return -self.w[None, :, None, None] * dist / 4


@pytest.mark.parametrize("causal", [True, False])
def test_a_scheme_that_defines_only_a_bias_trains_with_it_and_its_logits_and_terms_agree(causal, monkeypatch):
    """What a scheme is follows from the parts it defines: a class with a bias and no flags
    trains with its bias (the recomputing route, output and gradients equal to the
    formula written here over several row blocks), ``logits`` holds the same bias, and
    its terms sum to those logits with the bias as position-position."""
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * 24 * 5)
    assert _OnlyABias.has_bias and _OnlyABias.position_only_bias and not _OnlyABias.uses_value_term
    assert _OnlyABias.family() == "position bias"
    torch.manual_seed(4)
    sch = _OnlyABias(d_model=D, n_heads=H, max_len=64, causal=causal)
    attn, h, pos, formula = trains_as_the_distance_formula(sch, causal, lambda: sch.w / 4, [sch.w])
    dist = (pos[None, :] - pos[:, None]).abs().float()
    with torch.no_grad():
        logits = attn.logits(*attn.project(h)[:2], pos, pos)
        torch.testing.assert_close(logits, formula, atol=1e-5, rtol=1e-5)
        terms = attn.terms(h, None, pos)
        assert set(terms) == {"word-word", "position-position"}
        torch.testing.assert_close(sum(terms.values()), logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(terms["position-position"][0], (-sch.w[:, None, None] * dist / 4), atol=1e-6,
                                   rtol=1e-6)


def test_a_scheme_that_sets_what_its_parts_decide_is_refused_when_its_class_is_made():
    """Flags that must agree with the parts, or the composite bias, cannot be set by a
    class: the mismatch the old flags allowed (a bias that training ignores) cannot be written."""
    with pytest.raises(TypeError, match="_Flagged defines has_bias.*relative_bias"):
        class _Flagged(PositionalScheme):
            has_bias = True

    with pytest.raises(TypeError, match="_OldStyle defines bias.*absolute_bias"):
        class _OldStyle(PositionalScheme):
            def bias(self, q, k, q_pos, k_pos):
                return None

    with pytest.raises(ValueError, match="'bias' is not a part"):
        PositionalScheme.defines("bias")


@pytest.mark.parametrize("name,instances,gapped", [("t5_bias", 1, 1), ("kerple", 0, 3), ("shaw", 0, 0), ("rope", 0, 0)])
def test_attention_is_planned_once_per_forward_and_handed_down(name, instances, gapped, monkeypatch):
    """The model plans a forward once (``plan_attention``: one route, one whole mask per
    position-only scheme instance that needs one: T5's one shared table; KERPLE's one per
    layer only at positions that are not contiguous, a block at a time otherwise; none for a
    content bias or no bias) and hands the plan to every layer; a layer called alone plans
    for itself with the same planner, and its output is the same as inside the model."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=3, n_heads=H, d_ff=64, max_len=64)
    model = Transformer(cfg, factory(name)).eval()
    calls = {"route": 0, "mask": 0}
    plan, mask = layer_module.plan_attention, Attention.position_mask

    def counted_plan(*a, **kw):
        calls["route"] += 1
        return plan(*a, **kw)

    def counted_mask(self, *a, **kw):
        calls["mask"] += 1
        return mask(self, *a, **kw)

    for module in (layer_module, model_module):  # the planner as the layer and the model call it
        monkeypatch.setattr(module, "plan_attention", counted_plan)
    monkeypatch.setattr(Attention, "position_mask", counted_mask)
    idx, pos = torch.randint(0, V, (2, 16)), torch.arange(16)
    seen = []
    hook = model.blocks[1].attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        model(idx)
    hook.remove()
    assert calls == {"route": 1, "mask": instances}
    (h, inside), = seen
    with torch.no_grad():
        alone = model.blocks[1].attn(h, pos)
    assert calls["route"] == 2  # the layer alone planned for itself
    torch.testing.assert_close(alone, inside, rtol=0, atol=0)
    with torch.no_grad():
        model(idx, torch.arange(16) * 2)
    assert calls == {"route": 3, "mask": instances + gapped}


@pytest.mark.parametrize("name,causal,extra", CASES)
def test_last_positions_equal_the_full_forward(name, causal, extra):
    """``Transformer.forward(last=k)`` (the top block's queries, feed-forward and output for
    the last k positions alone) equals the last k rows of the full forward, in values and in
    the gradient of every parameter for a loss on those rows, for every scheme and mode, at
    offset positions (eval mode: CAPE's training draws would differ between the two calls;
    gradients on, so the full forward takes the training routes)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=64, causal=causal)
    model = Transformer(cfg, factory(name, **extra)).eval()
    with torch.no_grad():
        for p in model.positional_parameters():
            p.add_(torch.randn_like(p) * 0.3)
    idx, pos = torch.randint(0, V, (2, 20)), torch.arange(20) + 3
    full = model(idx, pos)[:, -5:]
    part = model(idx, pos, last=5)
    torch.testing.assert_close(part, full, atol=2e-5, rtol=2e-5)
    params = [p for p in model.parameters() if p.requires_grad]
    upstream = torch.randn_like(full)
    for a, b in zip(grads(part, upstream, params), grads(full, upstream, params)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-4)
    with pytest.raises(ValueError, match="last=0"):
        model(idx, last=0)


@pytest.mark.parametrize("name", ["alibi", "t5_bias", "kerple", "fire", "transformer_xl", "shaw"])
def test_skipping_later_keys_changes_no_value(name, monkeypatch):
    """Causal attention skips the keys after a block's last row (the blocked forward, the
    recomputing backward, a value term's blockwise forward) unless ``SKIP_LATER_KEYS`` is off, as the benchmark's FLOP count
    runs it; outputs and gradients are the same either way."""
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * 256 * 32)
    monkeypatch.setattr(blocks, "FORWARD_BLOCK_ROWS", 64)
    torch.manual_seed(0)
    extra = {"init_threshold": 100.0} if name == "fire" else {}  # rows on both sides of FIRE's threshold
    attn = Attention(D, H, scheme_of(name, True, extra, max_len=272), True).train()
    h, pos = torch.randn(3, 256, D, requires_grad=True), torch.arange(256)
    upstream = torch.randn(3, 256, D)
    params = [h, *[p for p in attn.parameters() if p.requires_grad]]
    out = {}
    for skip in (True, False):
        monkeypatch.setattr(blocks, "SKIP_LATER_KEYS", skip)
        y = attn(h, pos)
        out[skip] = (y, grads(y, upstream, params))
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=1e-5)
    for a, b in zip(out[True][1], out[False][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def class_of(case) -> type[PositionalScheme] | None:
    """The scheme class of a ``CASES`` entry (None when its ``_target_`` does not import)."""
    return CONFIGS[case.values[0]].cls


@contextmanager
def saved_for_backward():
    """A list, filled inside the block, of (entries, storage address) of every tensor
    autograd saves for the backward (its saved-tensor hooks). Entries are those of its
    storage, which is what it holds in memory: an expanded view counts once, a view of a
    larger tensor keeps all of it."""
    seen = []

    def pack(t):
        storage = t.untyped_storage()
        seen.append((storage.nbytes() // t.element_size(), storage.data_ptr()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield seen


POSITION_ONLY = [c for c in CASES if class_of(c) is not None and class_of(c).position_only_bias]


@pytest.mark.parametrize("name,causal,extra", POSITION_ONLY)
def test_a_position_block_is_its_part_of_the_whole_mask(name, causal, extra):
    """``position_block`` (the mask of query rows r0:r1 and keys :c1 that the ``recomputed``
    route builds from the relative part on the 2T - 1 distances and the block's absolute
    part) equals that part of the whole mask, ``with_causal(position_bias)``, for blocks on,
    below and across the diagonal (one of two rows: a single key after its first row), at
    positions offset from 0."""
    torch.manual_seed(0)
    T = 40
    sch = scheme_of(name, causal, extra, max_len=T + 8)
    pos = torch.arange(T) + 3
    with torch.no_grad():
        whole = blocks.with_causal(sch.position_bias(pos, pos), pos, pos, causal)
        rel_vals, parts = blocks.position_parts(sch, pos)
        for r0, r1, c1 in [(0, 40, 40), (0, 7, 7), (8, 24, 24), (8, 24, 40), (30, 40, 33), (39, 40, 40), (10, 12, 12)]:
            absolute = sch.absolute_block(parts, pos, pos, slice(r0, r1), slice(0, c1))
            block = blocks.position_block(sch, rel_vals, absolute, pos, r0, r1, c1, causal)
            torch.testing.assert_close(block, whole[..., r0:r1, :c1], atol=1e-6, rtol=1e-6,
                                       msg=lambda m, b=(r0, r1, c1): f"rows {b[0]}:{b[1]}, keys :{b[2]}: {m}")


BIAS_RECOMPUTED = [c for c in CASES if not c.values[2] and class_of(c) is not None
                   and (class_of(c).has_bias or class_of(c).uses_value_term)]


@pytest.mark.parametrize("name,causal,extra", BIAS_RECOMPUTED)
def test_the_recomputed_route_keeps_nothing_of_size_t_squared_for_the_backward(name, causal, extra):
    """A bias scheme, or one with a value term, that trains on the ``recomputed`` route saves
    no tensor of T x T entries or more per head between forward and backward (its mask, and a
    value term's probabilities, are rebuilt there a block at a time); its memory grows with T,
    not T^2. The saved tensors are seen through autograd's
    saved-tensor hooks; a fixed bias (ALiBi) takes the ``masked`` route and is left out."""
    torch.manual_seed(0)
    T = 96
    sch = scheme_of(name, causal, extra, max_len=T + 8)
    attn = Attention(D, H, sch, causal).train()
    h, pos = torch.randn(1, T, D, requires_grad=True), torch.arange(T)
    if attn.route(h, pos) != RECOMPUTED:
        assert not any(p.requires_grad for p in sch.parameters()) and sch.position_only_bias
        return
    with saved_for_backward() as saved:  # the forward: what it keeps for the backward
        y = attn(h, pos)
    y.sum().backward()
    sizes = [n for n, _ in saved]
    assert sizes and max(sizes) < H * T * T, f"{name}: a saved tensor of {max(sizes)} entries (H T^2 = {H * T * T})"


@pytest.mark.parametrize("name,shared", [("t5_bias", True), ("tupe", True), ("kerple", False), ("fire", False)])
def test_in_training_only_a_mask_that_layers_share_is_built_whole_and_kept(name, shared, monkeypatch):
    """On the ``recomputed`` route the plan builds the mask of a position-only scheme that
    several layers share (T5, TUPE) once and every layer keeps that one for its backward;
    a layer's own (KERPLE, FIRE) is never built whole: no plan mask and no saved tensor of
    H T^2 entries."""
    torch.manual_seed(0)
    T = 64
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=3, n_heads=H, d_ff=64, max_len=T)
    model = Transformer(cfg, factory(name)).train()
    built, mask = [], Attention.position_mask
    monkeypatch.setattr(Attention, "position_mask", lambda self, *a, **kw: built.append(1) or mask(self, *a, **kw))
    with saved_for_backward() as saved:
        loss = model(torch.randint(0, V, (1, T))).sum()
    loss.backward()
    big = {storage for n, storage in saved if n >= H * T * T}
    assert len(built) == (1 if shared else 0)
    assert len(big) == (1 if shared else 0), f"{len(big)} saved tensors of H T^2 entries or more"


def test_a_new_flex_route_on_the_cpu_keeps_the_gates_reason_once_per_kind_of_call():
    """A route made here (the process's own is made at import): it serves ALiBi, refuses nothing
    yet, and on the CPU its verdict for a call is the device gate's reason, kept under the call's
    kind (scheme class, dtype, q/k and v head dims, causal, grad mode, device), so ``auto`` takes
    a float-mask route; a reset forgets it."""
    from posenc.attention.flex import FlexRoute
    from posenc.attention.flex_gates import device_gate

    route, sch = FlexRoute(), ALiBi(d_model=D, n_heads=H)
    attn = Attention(D, H, sch, True)
    x = torch.randn(1, 5, D)
    assert route.serves(sch) and route.refused is None and route.verdicts == {}
    reason = route.verdict(attn, x)
    assert reason == device_gate(x.device, D // H, D // H) and reason.startswith("not a CUDA device")
    assert route.verdicts == {(ALiBi, torch.float32, D // H, D // H, True, True, "cpu"): reason}
    assert not route.applies(attn, x, torch.arange(5)) and route.refused is None
    route.reset()
    assert route.verdicts == {}


@pytest.mark.parametrize("expand", [True, False], ids=["full-shaped", "broadcast over rows"])
def test_a_scheme_of_ones_own_with_a_key_bias_and_a_value_term_is_recomputed_as_the_dense_formula(monkeypatch,
                                                                                                  expand):
    """A bias that reads the keys (k_j · w) beside a value term (each row's mass times a learned
    vector) sends training through the recomputing route, whose blocks must hand the bias the
    keys of their columns: output and every gradient against the dense formula, in blocks of 4 rows,
    with the bias given full-shaped (B, H, Tq, Tk) or broadcast over the query rows (B, H, 1, Tk)."""

    class KeyScoreValue(PositionalScheme):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.w = torch.nn.Parameter(torch.randn(self.head_dim))
            self.u = torch.nn.Parameter(torch.randn(self.head_dim))

        def content_bias(self, q, k, q_pos, k_pos):
            b = (k @ self.w.to(k.dtype))[..., None, :]
            return b.expand(*k.shape[:-2], q.shape[-2], k.shape[-2]) if expand else b

        def value_term(self, probs, q_pos, k_pos):
            return (probs * (k_pos[None, :] % 3).to(probs.dtype)).sum(-1, keepdim=True) * self.u.to(probs.dtype)

    T = 12
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * T * 4)
    torch.manual_seed(0)
    attn = Attention(D, H, KeyScoreValue(d_model=D, n_heads=H, max_len=32), True).train()
    h, pos = torch.randn(3, T, D, requires_grad=True), torch.arange(T) + 5
    assert attn.route(h, pos) == RECOMPUTED
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("causal", [True, False])
def test_a_scheme_of_ones_own_with_a_value_term_alone_is_recomputed_as_the_dense_formula(monkeypatch, causal, dtype):
    """A value term (each row's mass times a learned vector) and no bias: the recomputing route's
    blocks carry the causal mask alone (or none; in the logits' dtype), in blocks of 4 rows;
    output and every gradient against the dense formula, in float32 and float64."""

    class ValueOnly(PositionalScheme):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.u = torch.nn.Parameter(torch.randn(self.head_dim))

        def value_term(self, probs, q_pos, k_pos):
            return (probs * (k_pos[None, :] % 3).to(probs.dtype)).sum(-1, keepdim=True) * self.u.to(probs.dtype)

    T = 12
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 3 * H * T * 4)
    torch.manual_seed(0)
    attn = Attention(D, H, ValueOnly(d_model=D, n_heads=H, max_len=32, causal=causal), causal).to(dtype).train()
    h, pos = torch.randn(3, T, D, dtype=dtype, requires_grad=True), torch.arange(T) + 5
    assert attn.route(h, pos) == RECOMPUTED
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)

# ------------------------------------------------ the flex route's parts, compiling nothing
#: the position-only schemes, and FIRE with one hidden unit (a single break point, no loop over
#: the others in its score)
GRID_CASES = [*POSITION_ONLY, pytest.param("fire", True, {"mlp_width": 1, "init_threshold": 4.0},
                                           id="fire-causal-one_unit")]


def bias_on_grids(sch, parts, T: int) -> torch.Tensor:
    """(1, H, T, T): what the flex route adds to the scaled logit of query i and key j, evaluated
    as FlexAttention's ``score_mod`` sees it (broadcast index tensors of batch, head, query and
    key), plus the appended factors' product at the logit scale (``flex_attend`` appends them
    to q and k)."""
    grid = torch.zeros(1, sch.n_heads, T, T)
    mod = bias_score_mod(parts)
    if mod is not None:
        grid = mod(grid, *index_grids(1, sch.n_heads, T, T))
    if parts.factors is not None:
        a, c = parts.factors
        grid = grid + sch.logit_scale() * (a @ c.transpose(-1, -2))
    return grid


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("name,causal,extra", GRID_CASES)
def test_each_schemes_flex_parts_give_its_bias_and_gradients_on_index_grids(name, causal, extra, offset):
    """Every position-only scheme's ``flex_parts`` (its relative table read at
    ``j - i + T - 1``, its absolute factors, FIRE's piecewise-linear score function; none where
    its absolute part has neither form, which the route then leaves alone), evaluated
    eagerly on index grids, equal the scheme's own ``bias`` (the float-mask routes'; each
    scheme's ``bias`` is checked against its paper's formula in tests/test_references.py), on
    every pair the route attends to (causal: key at or before the query), at positions from 0
    and from 5 (FIRE's normalisers read absolute positions; with its threshold at 4, rows on both
    sides of it), and so do the gradients of every parameter for one random upstream gradient."""
    torch.manual_seed(0)
    T = 20
    sch = scheme_of(name, causal, extra, max_len=T + offset + 8)
    pos = torch.arange(T) + offset
    parts = flex_parts(sch, pos)
    if parts is None:  # an absolute part in neither form (TUPE with [CLS] untied, a scheme of one's own)
        assert sch.absolute_factors(pos, pos) is None and sch.absolute_score(pos, pos) is None
        return
    assert parts.table is not None or parts.factors is not None or parts.score is not None
    got, want = bias_on_grids(sch, parts, T), sch.bias(None, None, pos, pos).expand(1, -1, -1, -1)
    seen = (pos[None, :] <= pos[:, None]) if causal else torch.ones(T, T, dtype=torch.bool)
    torch.testing.assert_close(got[..., seen], want[..., seen], atol=1e-5, rtol=1e-5)
    named = {n: p for n, p in sch.named_parameters() if p.requires_grad}
    if not named:
        return
    up = torch.randn(1, sch.n_heads, T, T) * seen
    have = torch.autograd.grad(got, list(named.values()), up, allow_unused=True, retain_graph=True)
    ref = torch.autograd.grad(want, list(named.values()), up, allow_unused=True)
    for n, a, r in zip(named, have, ref):
        assert (a is None) == (r is None), n
        if r is not None:
            torch.testing.assert_close(a, r, atol=1e-5, rtol=1e-4, msg=lambda m, n=n: f"gradient of {n}: {m}")


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



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("head_dim", [8, 7])
def test_content_factors_are_the_angle_sum_in_float64_and_come_in_the_inputs_dtype(head_dim, dtype):
    """The fixed bidirectional encoding's factors against the sum written out in float64,
    sum over slots s of q_sin(s) sin((i - j) w_s) + q_cos(s) cos((i - j) w_s), w_s = 10000^(-2s/d)
    (no cosine slot past an odd head dim), at positions up to 400: a @ b^T to float64's rounding
    for float64 inputs (angles computed in float64), to float32's for float32; a in q's dtype,
    b in k's, shaped (B, H, T, 2 slots) and (1, H, T, 2 slots)."""
    torch.manual_seed(0)
    sch = factory("fixed_bidirectional")(d_model=head_dim * 2, n_heads=2, max_len=512, causal=False)
    q, k = torch.randn(3, 2, 6, head_dim, dtype=dtype), torch.randn(3, 2, 6, head_dim, dtype=dtype)
    pos = torch.tensor([0, 3, 17, 120, 255, 400])
    a, b = sch.content_factors(q, k, pos, pos)
    half = (head_dim + 1) // 2
    assert (a.dtype, b.dtype, a.shape, b.shape) == (dtype, dtype, (3, 2, 6, 2 * half), (1, 2, 6, 2 * half))
    w = 10000.0 ** (-2.0 * torch.arange(half, dtype=torch.float64) / head_dim)
    ang = (pos[:, None] - pos[None, :]).double()[..., None] * w  # (i, j, s)
    qd = q.double()
    want = (qd[..., 0::2][:, :, :, None, :] * ang.sin()).sum(-1)
    want = want + (qd[..., 1::2][:, :, :, None, :] * ang.cos()[..., : head_dim // 2]).sum(-1)
    tol = {torch.float64: 1e-10, torch.float32: 1e-4}[dtype]
    torch.testing.assert_close((a.double() @ b.double().transpose(-1, -2)), want, atol=tol, rtol=tol)

_SLOW_GPU = "(FlexAttention runs ~10x slower than SDPA on a V100 and not at all on an RTX 2080 Ti)"


@pytest.mark.parametrize("version,capability,qk,v,triton,dynamo,says", [
    ("2.13.0+cu130", (9, 0), 128, 64, True, True, None),
    ("2.8.0", (8, 0), 48, 16, True, True, None),
    ("2.5.1+cu124", (9, 0), 64, 64, True, True,
     "torch 2.5.1+cu124 is older than 2.6, whose compiled FlexAttention gives score_mod's tensors their gradient"),
    ("2.6.0", (9, 0), 64, 64, True, True, None),
    ("2.6.0+cu124", (9, 0), 64, 64, True, True, None),
    ("2.6.0+cu124", (9, 0), 96, 64, True, True,
     "a q/k head dim of 96 is not a power of two, which torch 2.6.0+cu124 needs (2.8 does not)"),
    ("2.7.1", (8, 6), 64, 48, True, True,
     "a v head dim of 48 is not a power of two, which torch 2.7.1 needs (2.8 does not)"),
    ("2.10.0", (8, 9), 8, 64, True, True, "a q/k head dim of 8 is below 16, Triton's least"),
    ("2.10.0", (8, 9), 64, 8, True, True, "a v head dim of 8 is below 16, Triton's least"),
    ("2.13.0", (7, 0), 64, 64, True, True, "compute capability 7.0 is below 8.0 " + _SLOW_GPU),
    ("2.13.0", (7, 5), 64, 64, True, True, "compute capability 7.5 is below 8.0 " + _SLOW_GPU),
    ("2.13.0+cpu", None, 64, 64, False, True,
     "not a CUDA device: FlexAttention has no backward for q, k, v on the CPU, and an unfused forward"),
    ("2.13.0", (9, 0), 64, 64, False, True, "Triton is not available: the compiled FlexAttention is a Triton kernel"),
    ("2.13.0", (9, 0), 64, 64, True, False, "torch.compile (dynamo) does not support this Python"),
])  # fmt: skip
def test_the_gates_of_auto_on_stated_values(version, capability, qk, v, triton, dynamo, says):
    """``gate`` from a torch version string (2.6 itself let through), a compute capability
    (8.0 itself let through), the q/k and v head dims (powers of two before 2.8, at least 16),
    Triton and dynamo: None, or the reason, word for word (the route's warning shows it)."""
    assert gate(version, capability, qk, v, triton, dynamo) == says


@pytest.mark.parametrize("capability,qk,v,triton,dynamo,says", [
    (None, 64, 64, True, True, "not a CUDA device"),
    ((9, 0), 64, 64, True, True, None),
    ((7, 5), 64, 64, True, True, "compute capability 7.5"),
    ((9, 0), 64, 64, False, True, "Triton is not available"),
    ((9, 0), 64, 64, True, False, "dynamo"),
    ((9, 0), 8, 64, True, True, "q/k head dim of 8"),
    ((9, 0), 64, 8, True, True, "v head dim of 8"),
])  # fmt: skip
def test_the_device_gate_hands_the_gate_this_process_and_the_devices_facts(capability, qk, v, triton, dynamo, says,
                                                                              monkeypatch):
    """``device_gate`` on a CUDA device whose capability, Triton and dynamo are set here (a
    ``cuda`` device object needs no GPU until it is used), and on the CPU (no capability read):
    each fact reaches ``gate`` in its place, with this torch's version."""
    monkeypatch.setattr(torch_triton, "has_triton", lambda: triton)
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: dynamo)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: asked.append(d) or capability)
    device = torch.device("cpu" if capability is None else "cuda")
    reason = device_gate(device, qk, v)
    assert asked == ([] if capability is None else [device])
    assert reason == gate(str(torch.__version__), capability, qk, v, triton, dynamo)
    assert (reason is None) == (says is None), reason
    if says is not None:
        assert says in reason


def test_the_device_gate_reads_this_process_torch_version(monkeypatch):
    """``device_gate`` hands ``gate`` the version of the torch it runs under (set here to one
    before 2.6), on an Ampere device with Triton and dynamo."""
    monkeypatch.setattr(torch_triton, "has_triton", lambda: True)
    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: (8, 0))
    monkeypatch.setattr(torch, "__version__", "2.5.1+cu124")
    assert device_gate(torch.device("cuda"), 64, 64) == gate("2.5.1+cu124", (8, 0), 64, 64, True, True)
    assert "torch 2.5.1+cu124 is older than 2.6" in device_gate(torch.device("cuda"), 64, 64)


def test_tupe_with_cls_untied_hands_the_flex_route_no_parts():
    """TUPE with [CLS] untied has no low-rank form of its absolute part (its [CLS] rows and
    column are separate), so it gives no factors and no flex parts: it takes a float-mask route."""
    sch = scheme_of("tupe", True, {"untie_cls": True}, max_len=24)
    pos = torch.arange(16)
    assert sch.absolute_factors(pos, pos) is None and flex_parts(sch, pos) is None
    assert scheme_of("tupe", True, {}, max_len=24).absolute_factors(pos, pos) is not None


# ------------------------------------- the flex route with a dense stand-in for its kernel
# FlexAttention evaluated densely (``flexkit.dense_flex``) in place of the kernel: the route's
# planning, attend, probe and fallback run as they do on a GPU, with nothing compiled (the real
# kernel's forward and backward are checked in tests/test_flex.py)

def serves_flex(cls: type[PositionalScheme] | None) -> bool:
    """Whether the flex route serves a scheme class: a position-only bias, or a content bias with
    a low-rank form, and no value term (from the class: nothing is built at collection)."""
    return cls is not None and (cls.position_only_bias or cls.factors_content()) and not cls.uses_value_term


#: the position-only schemes and those with a low-rank content part, without a value term: those
#: the route serves, or hands on
FLEX_CASES = [c for c in CASES if serves_flex(class_of(c))]
#: the cases whose bias has the route's form (TUPE with [CLS] untied has none)
FORMED = [c for c in FLEX_CASES if not c.values[2].get("untie_cls")]


def takes_flex(name: str, extra: dict, grad: bool) -> bool:
    """Whether a scheme's bias has a form the route reads (TUPE's with [CLS] untied has none),
    and, with gradients on, not a score function (FIRE's trains on a float-mask route until a
    GPU has measured its backward: ``SCORE_TRAINS``)."""
    return not extra.get("untie_cls") and not (grad and name == "fire")


@pytest.fixture
def flex_on_cpu(monkeypatch, fresh_flex_route):
    """The route wherever a scheme's bias has its form (``attention.route=flex``), with
    ``dense_flex`` in place of the kernel: the stand-in of its backward to q and k."""
    use_kernel(monkeypatch, dense_flex)


@pytest.mark.parametrize("T", [13, 150])
@pytest.mark.parametrize("name,causal,extra", FLEX_CASES)
def test_a_layer_on_the_flex_route_equals_the_dense_reference(name, causal, extra, T, flex_on_cpu):
    """One layer in training mode at contiguous offset positions, with ``dense_flex`` as the
    kernel: the route where the scheme's bias has its form (a float-mask route otherwise),
    output and the gradient of the input, the projections and every parameter of the scheme
    against the dense formula."""
    torch.manual_seed(0)
    sch = scheme_of(name, causal, extra, max_len=T + 16)
    attn = Attention(D, H, sch, causal).train()
    h = torch.randn(2, T, D, requires_grad=True)
    pos = torch.arange(T) + 5
    plan = plan_attention([attn], h, pos)
    formed = flex_parts(sch, pos) is not None  # a scheme of one's own may have no flex form: a float-mask route
    assert (plan.name == FLEX) == (takes_flex(name, extra, grad=True) and formed)
    y, ref = attn(h, pos, plan), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("name,causal,extra", FORMED)
def test_the_model_on_the_flex_route_equals_the_dense_reference(name, causal, extra, flex_on_cpu, monkeypatch):
    """The whole model (two layers; a shared scheme's parts built once and read by both) in
    evaluation mode with ``dense_flex`` as the kernel and the score rule lifted (FIRE's score
    on the route with gradients on): logits and the gradient of every parameter against the
    dense formula."""
    lift_score_rule(monkeypatch)
    torch.manual_seed(1)
    T = 40
    model = perturbed_model(name, causal, extra, max_len=T + 16)
    if flex_parts(model.blocks[0].attn.scheme, torch.arange(T)) is None:  # one's own scheme with no flex form
        assert not FLEX_ROUTE.serves(model.blocks[0].attn.scheme)
        return
    built = []
    parts = flex_module.flex_parts
    monkeypatch.setattr(flex_module, "flex_parts", lambda s, pos: (len(pos) == T and built.append(s)) or parts(s, pos))
    idx = torch.randint(0, V, (2, T))
    pos = torch.arange(T)
    y, ref = model(idx, pos), dense_model(model, idx, pos)
    instances = {b.attn.scheme for b in model.blocks}
    assert len(built) == len(instances)  # once per scheme instance and forward
    assert model.attention_routes() == {"training": FLEX}
    torch.testing.assert_close(y, ref, atol=5e-5, rtol=5e-5)
    assert_same_gradients(y, ref, {n: p for n, p in model.named_parameters() if p.requires_grad}, atol=5e-5, rtol=5e-4)


def test_the_route_is_taken_only_where_the_setting_and_the_call_allow_it(monkeypatch, fresh_flex_route):
    """``auto`` (the default) keeps the CPU on the float-mask routes (its gate: no CUDA device);
    ``flex`` takes the route wherever a scheme's bias has its form, but not with attention
    dropout in training (FlexAttention has none), not at positions that are not contiguous, not
    for a content bias without a low-rank form or a value term, and FIRE's score function only
    without gradients; ``masked`` never takes it."""
    x, pos = torch.zeros(1, 8, D), torch.arange(8)

    def attn(name, dropout=0.0):
        return Attention(D, H, factory(name)(d_model=D, n_heads=H, max_len=64, causal=True), True, dropout)

    assert attn("alibi").route(x, pos) != FLEX
    monkeypatch.setattr("posenc.attention.flex_gates._setting", ["flex"])
    assert attn("alibi").route(x, pos) == FLEX
    assert attn("t5_bias").eval().route(x, pos) == FLEX
    assert attn("alibi", dropout=0.1).train().route(x, pos) != FLEX
    assert attn("alibi", dropout=0.1).eval().route(x, pos) == FLEX
    assert attn("alibi").route(x, torch.tensor([0, 1, 3, 4, 5, 6, 7, 8])) != FLEX
    assert attn("fixed_bidirectional").route(x, pos) == FLEX
    assert attn("fire").route(x, pos) == RECOMPUTED
    with torch.no_grad():
        assert attn("fire").route(x, pos) == FLEX
    for name in ("transformer_xl", "skew", "shaw", "rope", "none"):
        assert attn(name).route(x, pos) != FLEX
    monkeypatch.setattr("posenc.attention.flex_gates._setting", ["masked"])
    with torch.no_grad():
        assert attn("t5_bias").route(x, pos) == MASKED and attn("fire").route(x, pos) == MASKED


def _planted(kind):
    """A kernel that fails: one that raises, one that gives other values, one whose output has
    no graph to the tensors ``score_mod`` reads (each fails the probe), and one that raises only
    at a length the probe does not try (it fails the run's call instead)."""
    def kernel(q, k, v, score_mod=None, block_mask=None, scale=None):
        if kind == "raises" or (kind == "later" and q.shape[-2] not in (200, 136)):
            raise RuntimeError("planted kernel failure")
        out = dense_flex(q, k, v, score_mod, block_mask, scale)
        if kind in ("off", "later"):
            return out * (1.5 if kind == "off" else 1.0)
        with torch.no_grad():
            out = dense_flex(q, k, v, score_mod, block_mask, scale)
        return out + torch.zeros((), requires_grad=True)
    return kernel


@pytest.mark.parametrize("kind,reason", [("raises", "RuntimeError: planted kernel failure"),
                                         ("off", "its output differs from the float-mask route's by 5.0e-01 (relative; "
                                                "0.001 allowed in torch.float32)"),
                                         ("no gradient", "parameter table.weight gets no gradient"),
                                         ("later", "RuntimeError: the flex route (FlexAttention on cpu) failed")])
def test_a_failing_probe_warns_once_and_sends_the_scheme_to_the_float_mask_route(kind, reason, monkeypatch,
                                                                                fresh_flex_route):
    """With ``auto``'s gates passed (planted: no GPU here) and a planted kernel, the probe of the
    first call fails (or, for a kernel that fails only at a length the probe did not try, the
    call itself): one warning naming the scheme and the reason, the call on the float-mask
    route; the next calls of that kind take it at once, without a second probe or warning."""
    calls = []
    planted = _planted(kind)
    use_kernel(monkeypatch, lambda *a, **kw: calls.append(1) or planted(*a, **kw), setting="auto")
    monkeypatch.setattr(flex_module, "device_gate", lambda device, qk, v: None)
    torch.manual_seed(0)
    model = perturbed_model("t5_bias", True, {}, max_len=64).train()
    idx = torch.randint(0, V, (2, 24))
    with pytest.warns(FlexFallback) as seen:
        y = model(idx)
    seen = [w for w in seen if issubclass(w.category, FlexFallback)]
    assert len(seen) == 1
    message = str(seen[0].message)
    assert message.startswith("T5Bias takes a float-mask route, not FlexAttention, on cpu") and reason in message
    assert model.attention_routes() == {"training": RECOMPUTED}
    torch.testing.assert_close(y, dense_model(model, idx, torch.arange(24)), atol=5e-5, rtol=5e-5)
    probed = len(calls)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FlexFallback)
        model(idx)
    assert len(calls) == probed and model.attention_routes() == {"training": RECOMPUTED}


@pytest.mark.parametrize("grad,dtype", [(True, torch.float32), (False, torch.float32), (False, torch.float64),
                                       (False, torch.bfloat16)],
                         ids=["grad-float32", "no_grad-float32", "no_grad-float64", "no_grad-bfloat16"])
@pytest.mark.parametrize("name,causal,extra", FORMED)
def test_the_probe_passes_a_kernel_that_is_right(name, causal, extra, grad, dtype, fresh_flex_route, monkeypatch):
    """The probe of every scheme whose bias has the route's form, with ``dense_flex`` as the kernel
    (right by construction: the dense formula), passes with gradients on and off in float32, and
    for calls in float64 and bfloat16 (q, k, v and the factors cast to the call's dtype) without
    gradients:
    it finds no reason, on both of its calls, so a scheme is not sent off the route by a probe
    that is wrong. Its random inputs come from a generator of its own: the process's random
    state is untouched. (With gradients in float64 the probe holds the gradients to float64's
    tolerance, 1e-6, against its float32 reference, which FIRE and causal KERPLE miss by a few
    1e-6: such a run would leave the route with a warning; a known defect of the probe.)"""
    use_kernel(monkeypatch, dense_flex, setting="auto")
    calls = []

    def recorded(q, *a, **kw):
        calls.append((q.shape, q.dtype))
        return flex_attend(q, *a, **kw)

    monkeypatch.setattr(flex_module, "flex_attend", recorded)
    attn = Attention(D, H, scheme_of(name, causal, extra, max_len=256), causal)
    if flex_parts(attn.scheme, torch.arange(2)) is None:  # one's own scheme with no flex form: never probed
        assert not FLEX_ROUTE.serves(attn.scheme)
        return
    x = torch.zeros(1, 4, D, dtype=dtype)
    state = torch.get_rng_state()
    with torch.set_grad_enabled(grad):
        assert FLEX_ROUTE.probe(attn, x, torch.arange(1)) is None
    assert [(s[0], s[2], d) for s, d in calls] == [(b, n, dtype) for b, n in flex_gates.PROBE_SHAPES]
    assert torch.equal(torch.get_rng_state(), state)


class _Scaled(torch.autograd.Function):
    """The identity forward; the backward multiplies the gradient by ``factor`` (a kernel whose
    backward is wrong by that much), or raises where ``factor`` is None."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if ctx.factor is None:
            raise RuntimeError("planted backward failure")
        return g * ctx.factor, None


def test_the_probes_gradient_check_names_each_way_a_gradient_can_be_wrong():
    """``probe_gradients`` on T5's table (the float-mask route's output ``want`` against the flex
    route's ``got``, the same values with a backward of its own): None where the gradients agree
    or the scheme has no trainable parameter; else the parameter and what is wrong with it, word
    for word, at the relative error the backward planted (1.5 x: 5.0e-01)."""
    sch = scheme_of("t5_bias", True, {}, max_len=32)
    pos = torch.arange(12)

    def want():
        return sch.position_bias(pos, pos).softmax(-1)

    def check(factor, tol=1e-3):
        g = torch.Generator().manual_seed(0)
        return flex_gates.probe_gradients(sch, _Scaled.apply(want(), factor), want(), tol, g)

    name = next(n for n, p in sch.named_parameters() if p.requires_grad)
    assert check(1.0) is None
    assert check(1.5) == f"the gradient of parameter {name} differs from the float-mask route's by 5.0e-01 (relative)"
    assert check(1.5, tol=0.501) is None and check(1.5, tol=0.499) is not None
    assert check(float("nan")) == f"parameter {name} gets a gradient that is not finite"
    assert check(None) == "its backward failed: RuntimeError: planted backward failure"
    detached = want().detach() + torch.zeros((), requires_grad=True)
    assert flex_gates.probe_gradients(sch, detached, want(), 1e-3, torch.Generator()) == (
        f"parameter {name} gets no gradient")
    alibi = scheme_of("alibi", True, {}, max_len=32)
    out = alibi.position_bias(pos, pos).requires_grad_()
    assert flex_gates.probe_gradients(alibi, out * 2, out, 1e-3, torch.Generator()) is None  # nothing trainable


def test_relative_errors_on_stated_values():
    """``relative_error``: ||a - b|| / max(||b||, floor), the plain norm of a - b where both are 0;
    ``gradient_errors``: each gradient over the larger of its own norm and the norm all of ``want``
    would give it spread evenly (here ||want|| = 5 over 5 entries, so 5 * sqrt(2 / 5) for a
    2-entry gradient), names missing or None on either side left out."""
    t = torch.tensor
    assert flex_gates.relative_error(t([3.0, 4.0]), t([0.0, 0.0])) == 5.0
    assert flex_gates.relative_error(t([1.0, 0.0]), t([0.0, 0.0]), floor=2.0) == 0.5
    assert flex_gates.relative_error(t([3.0, 5.0]), t([3.0, 4.0])) == pytest.approx(0.2)
    assert flex_gates.relative_error(t([3.0, 5.0]), t([3.0, 4.0]), floor=10.0) == pytest.approx(0.1)
    assert flex_gates.relative_error(t([3.0, 5.0]), t([3.0, 4.0]), floor=1.0) == pytest.approx(0.2)
    half = 5.0 * (2 / 5) ** 0.5
    got = flex_gates.gradient_errors({"a": t([3.0, 5.0]), "b": t([0.1, 0.0]), "c": t([1.0]), "d": None},
                                     {"a": t([3.0, 4.0]), "b": t([0.0, 0.0]), "c": None, "d": t([0.0])})
    assert set(got) == {"a", "b"}
    assert got["a"] == pytest.approx(0.2) and got["b"] == pytest.approx(0.1 / half)
    assert flex_gates.gradient_errors({"a": t([1.0])}, {"a": t([0.0])}) == {"a": 1.0}
    assert flex_gates.gradient_errors({}, {}) == {}


def test_a_forced_route_is_the_one_every_call_names_and_plans_the_innermost_while_nested():
    """``forced_route``: inside it every call names and plans that route whether it applies or
    not; nested, the innermost holds; outside, the routes decide again."""
    from posenc.attention.layer import ROUTES, forced_route

    by_name = {r.name: r for r in ROUTES}
    attn = Attention(D, H, factory("alibi")(d_model=D, n_heads=H, max_len=32, causal=True), True)
    x, pos = torch.zeros(1, 8, D), torch.arange(8)
    free = attn.route(x, pos)
    assert free not in (PROBABILITIES, FUSED)
    with forced_route(by_name[PROBABILITIES]):
        assert attn.route(x, pos) == PROBABILITIES and plan_attention([attn], x, pos).route.name == PROBABILITIES
        with forced_route(by_name[FUSED]):
            assert attn.route(x, pos) == FUSED and plan_attention([attn], x, pos).route.name == FUSED
        assert attn.route(x, pos) == PROBABILITIES
    assert attn.route(x, pos) == free


def test_which_routes_train_on_which_device_and_serve_which_scheme():
    """Each route's ``trains_on`` and ``serves`` (what the GPU check's steps ask of them): the
    flex route trains on CUDA alone (the CPU kernel has no backward for q, k, v), the recomputed
    route on the CPU alone (CUDA's fused kernels keep a mask that requires grad themselves), the
    others anywhere; the probabilities route serves every scheme."""
    from posenc.attention.layer import ROUTES

    assert [r.name for r in ROUTES] == [FUSED, FLEX, RECOMPUTED, PROBABILITIES, MASKED]
    assert [r.name for r in ROUTES if r.trains_on("cpu")] == [FUSED, RECOMPUTED, PROBABILITIES, MASKED]
    assert [r.name for r in ROUTES if r.trains_on("cuda")] == [FUSED, FLEX, PROBABILITIES, MASKED]
    for name, serving in (("none", [FUSED, PROBABILITIES]), ("shaw", [RECOMPUTED, PROBABILITIES]),
                          ("alibi", [FLEX, RECOMPUTED, PROBABILITIES, MASKED])):
        sch = factory(name)(d_model=D, n_heads=H, max_len=32, causal=True)
        assert [r.name for r in ROUTES if r.serves(sch)] == serving, name


class _Long(torch.autograd.Function):
    """The identity forward; a backward that raises with a message of 300 characters."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("a long reason " + "x" * 286)


def test_the_probes_gradient_check_skips_what_the_float_mask_route_does_not_train_and_cuts_long_reasons():
    """A parameter the float-mask route's output does not reach (``a`` here, first in order) has
    nothing to be held to: the check goes on to the next (``b``, whose planted backward is 1.5 x);
    a parameter neither route reaches is no error; a failing backward's reason is cut at 200
    characters."""

    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.arange(3.0))

    sch = Two()
    g = torch.Generator().manual_seed(0)

    def want():
        return (sch.b * 2).softmax(-1)

    assert flex_gates.probe_gradients(sch, _Scaled.apply(want(), 1.5), want(), 1e-3, g) == (
        "the gradient of parameter b differs from the float-mask route's by 5.0e-01 (relative)")
    assert flex_gates.probe_gradients(sch, _Scaled.apply(want(), 1.0), want(), 1e-3, g) is None
    reason = flex_gates.probe_gradients(sch, _Long.apply(want()), want(), 1e-3, g)
    assert reason == "its backward failed: RuntimeError: " + ("a long reason " + "x" * 286)[:200]


def test_relative_errors_below_a_norm_of_one():
    """The relative error of a small reference is over its own norm, not over 1: ||(0, 0.1)|| /
    ||(0.3, 0.4)|| = 0.2, and with a floor above that norm, over the floor."""
    t = torch.tensor
    assert flex_gates.relative_error(t([0.3, 0.5]), t([0.3, 0.4])) == pytest.approx(0.2)
    assert flex_gates.relative_error(t([0.3, 0.5]), t([0.3, 0.4]), floor=0.8) == pytest.approx(0.125)


def test_the_kernel_is_handed_the_block_mask_of_the_call_and_its_scale(fresh_flex_route, monkeypatch):
    """What FlexAttention gets from the route for a causal layer of T5 at 13 positions: q, k and v
    of the call, the scheme's score function, a block mask of 13 x 13 queries and keys, and the
    scheme's logit scale; on the CPU the kernel is torch's ``flex_attention`` (here the dense
    stand-in put in its place), on CUDA the compiled one."""
    import torch.nn.attention.flex_attention as torch_flex

    import posenc.attention.flex_kernel as flex_kernel

    seen = []

    def kernel(q, k, v, score_mod=None, block_mask=None, scale=None):
        seen.append((q.shape, k.shape, v.shape, score_mod is not None, block_mask.seq_lengths, scale))
        return dense_flex(q, k, v, score_mod, block_mask, scale)

    monkeypatch.setattr(torch_flex, "flex_attention", kernel)
    monkeypatch.setattr(flex_gates, "_setting", ["flex"])
    torch.manual_seed(0)
    attn = Attention(D, H, scheme_of("t5_bias", True, {}, max_len=32), True).eval()
    h, pos = torch.randn(2, 13, D), torch.arange(13)
    with torch.no_grad():
        y = attn(h, pos)
    torch.testing.assert_close(y, dense_attention(attn, h, pos), atol=2e-5, rtol=2e-5)
    dh = D // H
    assert seen == [((2, H, 13, dh), (2, H, 13, dh), (2, H, 13, dh), True, (13, 13), attn.scheme.logit_scale())]
    assert flex_kernel.flex_kernel(torch.device("cpu")) is kernel
    monkeypatch.setattr(flex_kernel, "compiled_flex", lambda: "compiled")
    assert flex_kernel.flex_kernel(torch.device("cuda")) == "compiled"


def test_inside_a_compiled_model_the_kernel_is_called_as_it_is_outside(fresh_flex_route, monkeypatch):
    """Inside a model compiled whole (``torch.compiler.is_compiling()``, here set) the route calls
    the kernel with the same arguments, outside the recompilation limit's guard (the model's
    compilation holds it): the same output as outside, for a scheme with factors (TUPE) and one
    with a table (T5), causal and not."""
    use_kernel(monkeypatch, dense_flex)
    torch.manual_seed(0)
    for name, causal in (("tupe", True), ("t5_bias", False)):
        attn = Attention(D, H, scheme_of(name, causal, {}, max_len=64), causal).eval()
        h, pos = torch.randn(2, 11, D), torch.arange(11)
        with torch.no_grad():
            outside = attn(h, pos)
            with monkeypatch.context() as m:
                m.setattr(torch.compiler, "is_compiling", lambda: True)
                q, k, v = (torch.randn(2, H, 11, D // H) for _ in range(3))
                parts = flex_parts(attn.scheme, pos)
                inside = flex_attend(q, k, v, parts, causal, 0.3)
            want = flex_attend(q, k, v, parts, causal, 0.3)
        torch.testing.assert_close(inside, want, atol=0, rtol=0)
        torch.testing.assert_close(outside, dense_attention(attn, h, pos), atol=2e-5, rtol=2e-5)


def test_a_kernel_past_its_recompile_limit_sends_every_later_call_to_the_float_mask_routes(fresh_flex_route,
                                                                                            monkeypatch):
    """A kernel that raises ``RecompileLimitHit`` (here planted): one warning naming the scheme and
    the limit, the call on a float-mask route (the dense formula's output), the reason kept as the
    route's refusal, and every later call, of any scheme, planned off the route at once."""
    from posenc.compiling import RecompileLimitHit

    def kernel(*a, **kw):
        raise RecompileLimitHit("a limit of 1 compiled graphs")

    use_kernel(monkeypatch, kernel)
    torch.manual_seed(0)
    model = perturbed_model("t5_bias", True, {}, max_len=64)
    idx = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        with pytest.warns(FlexFallback, match="^T5Bias and every scheme after it take the float-mask routes from here "
                                              "on, not FlexAttention: a limit of 1 compiled graphs$"):
            y = model(idx)
        torch.testing.assert_close(y, dense_model(model, idx, torch.arange(24)), atol=5e-5, rtol=5e-5)
        assert FLEX_ROUTE.refused == "a limit of 1 compiled graphs"
        alibi = Attention(D, H, scheme_of("alibi", True, {}, max_len=64), True)
        assert alibi.route(torch.zeros(1, 8, D), torch.arange(8)) != FLEX


def test_a_long_failure_is_cut_at_200_characters_in_the_reason(fresh_flex_route, monkeypatch):
    """A kernel whose failure says more than 200 characters: the probe's reason, and the reason a
    kind of call keeps when the kernel fails later, are its type and the first 200 characters."""
    long = "a long reason " + "x" * 286

    def kernel(q, k, v, score_mod=None, block_mask=None, scale=None):
        if q.shape[-2] != 24:
            return dense_flex(q, k, v, score_mod, block_mask, scale)
        raise ValueError(long)

    use_kernel(monkeypatch, kernel, setting="auto")
    monkeypatch.setattr(flex_module, "device_gate", lambda device, qk, v: None)
    torch.manual_seed(0)
    model = perturbed_model("t5_bias", True, {}, max_len=64)
    with torch.no_grad(), pytest.warns(FlexFallback):
        model(torch.randint(0, V, (2, 24)))
    wrapped = f"the flex route (FlexAttention on cpu) failed: ValueError: {long}; attention.route=masked sends " \
              "every scheme to the float-mask routes"
    (reason,) = FLEX_ROUTE.verdicts.values()
    assert reason == "RuntimeError: " + wrapped[:200]
    FLEX_ROUTE.reset()

    def raising(q, k, v, score_mod=None, block_mask=None, scale=None):
        raise ValueError(long)

    use_kernel(monkeypatch, raising, setting="auto")
    attn = Attention(D, H, scheme_of("t5_bias", True, {}, max_len=256), True)
    assert FLEX_ROUTE.probe(attn, torch.zeros(1, 4, D), torch.arange(1)) == "RuntimeError: " + wrapped[:200]


class _RotatedALiBi(ALiBi):
    """ALiBi with queries and keys scaled by their positions (a rotation of one's own that reads
    them), so the flex route must hand ``rotate`` the call's positions."""

    def rotate(self, q, k, q_pos, k_pos):
        return q * (1 + 0.01 * q_pos[:, None]).to(q.dtype), k * (1 - 0.01 * k_pos[:, None]).to(k.dtype)


class _KeyScore(PositionalScheme):
    """A content bias that reads the keys alone, k_j · w, in the low-rank form the flex route
    appends to q and k: a = 1 / scale (one dimension), b = k_j · w."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.w = torch.nn.Parameter(torch.randn(self.head_dim))

    def content_bias(self, q, k, q_pos, k_pos):
        return (k @ self.w.to(k.dtype))[..., None, :].expand(*k.shape[:-2], q.shape[-2], k.shape[-2])

    def content_factors(self, q, k, q_pos, k_pos):
        a = torch.full((*q.shape[:-1], 1), 1 / self.logit_scale(), dtype=q.dtype)
        return a, (k @ self.w.to(k.dtype))[..., None]


@pytest.mark.parametrize("kind", [_RotatedALiBi, _KeyScore])
def test_schemes_of_ones_own_that_rotate_or_read_the_keys_on_the_flex_route(kind, fresh_flex_route, monkeypatch):
    """A position-only scheme whose rotation reads the positions, and a content bias that reads
    the keys in a low-rank form: on the flex route (``dense_flex`` as the kernel) a layer gives
    the dense formula's output and gradients, and the probe passes with gradients on and off."""
    use_kernel(monkeypatch, dense_flex)
    torch.manual_seed(0)
    attn = Attention(D, H, kind(d_model=D, n_heads=H, max_len=256, causal=True), True).train()
    h, pos = torch.randn(2, 13, D, requires_grad=True), torch.arange(13) + 5
    assert plan_attention([attn], h, pos).name == FLEX
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert FLEX_ROUTE.probe(attn, torch.zeros(1, 4, D), torch.arange(1)) is None


@pytest.mark.parametrize("name", ["t5_bias", "kerple"])
def test_the_recomputed_route_trains_under_bfloat16_autocast_with_its_blocks_in_the_calls_dtype(name):
    """Under the CPU's bfloat16 autocast (``trainer.precision=bf16-mixed``) q and k are bfloat16
    while the scheme's bias is float32: the recomputed route casts each block of the mask to the
    call's dtype, forward and backward, and trains: output in bfloat16 within bfloat16's rounding
    of the dense formula in float32, and every gradient within 3% of it (relative, of the norm)."""
    torch.manual_seed(0)
    attn = Attention(D, H, scheme_of(name, True, {}, max_len=64), True).train()
    h, pos = torch.randn(2, 20, D, requires_grad=True), torch.arange(20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attn.route(h, pos) == RECOMPUTED
        y = attn(h, pos)
    assert y.dtype == torch.bfloat16
    ref = dense_attention(attn, h, pos)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)
    wrt = trained_layer_gradients(attn, h)
    up = torch.randn_like(ref)
    got = grads(y.float(), up, list(wrt.values()))
    want = grads(ref, up, list(wrt.values()))
    for n, a, b in zip(wrt, got, want):
        assert flex_gates.relative_error(a, b) < 3e-2, n


@pytest.mark.parametrize("name", ["tupe", "t5_bias"])
def test_a_bfloat16_layer_on_the_flex_route_gives_bfloat16(name, fresh_flex_route, monkeypatch):
    """A layer held in bfloat16 (no autocast) on the flex route, ``dense_flex`` as the kernel (which
    returns q's dtype, as FlexAttention does): TUPE's absolute factors and T5's table are cast to
    the call's dtype, the output is bfloat16 and within bfloat16's rounding of the dense formula."""
    use_kernel(monkeypatch, dense_flex)
    torch.manual_seed(0)
    attn = Attention(D, H, scheme_of(name, True, {}, max_len=64), True).eval().to(torch.bfloat16)
    h, pos = torch.randn(2, 13, D, dtype=torch.bfloat16), torch.arange(13)
    with torch.no_grad():
        assert attn.route(h, pos) == FLEX
        y = attn(h, pos)
        ref = dense_attention(attn.float(), h.float(), pos)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=3e-2)


def _tupe_with_keys(**kw):
    """TUPE with ``_KeyScore``'s content bias besides: absolute factors and content factors both."""
    from posenc.encodings import TUPE

    class TupeWithKeys(TUPE):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.w = torch.nn.Parameter(torch.randn(self.head_dim))

        content_bias = _KeyScore.content_bias
        content_factors = _KeyScore.content_factors

    return TupeWithKeys(**kw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kind_of_call_a_verdict_holds_for_counts_the_appended_dimensions(dtype, fresh_flex_route):
    """The key of a verdict: the scheme's class, the call's dtype, the q/k head dim with the
    dimensions the route appends (the absolute factors' rank, read here at 7 positions, plus the
    content factors', 2 per sine/cosine slot for the fixed encoding), the v head dim, causality,
    grad mode and device."""
    cpu = torch.device("cpu")
    dh = D // H

    def key(sch, grad=True):
        with torch.set_grad_enabled(grad):
            return FLEX_ROUTE.key(Attention(D, H, sch, True), dtype, cpu)

    t5 = scheme_of("t5_bias", True, {}, max_len=32)
    assert key(t5) == (type(t5), dtype, dh, dh, True, True, "cpu")
    assert key(t5, grad=False) == (type(t5), dtype, dh, dh, True, False, "cpu")
    tupe = scheme_of("tupe", True, {}, max_len=32)
    r = flex_parts(tupe, torch.arange(7)).factors[0].shape[-1]
    assert r not in (1, H) and key(tupe)[2] == dh + r
    fixed = factory("fixed_bidirectional")(d_model=D, n_heads=H, max_len=32, causal=True)
    assert 2 * ((dh + 1) // 2) not in (1, H) and key(fixed)[2] == dh + 2 * ((dh + 1) // 2)
    both = _tupe_with_keys(d_model=D, n_heads=H, max_len=32, causal=True)
    assert key(both)[2] == dh + flex_parts(both, torch.arange(7)).factors[0].shape[-1] + 1


@pytest.mark.parametrize("positions", [[0, 1, 1, 2, 3, 3, 4, 5, 6, 7], [0, 5, 3, 4, 9, 6, 7, 8, 12, 10]],
                         ids=["repeated", "out_of_order"])
def test_the_masked_route_skips_later_keys_only_where_positions_increase(positions, monkeypatch):
    """Causal attention on the masked route skips the keys after a block's last row only where
    positions strictly increase: at repeated positions (a later key at the same position is
    attended) and out of order (a later key at an earlier position is), a block of 2 rows at a
    time gives the dense formula's output, with gradients on and off."""
    monkeypatch.setattr(blocks, "FORWARD_BLOCK_ROWS", 2)
    monkeypatch.setattr("posenc.attention.flex_gates._setting", ["masked"])
    torch.manual_seed(0)
    attn = Attention(D, H, scheme_of("alibi", True, {}, max_len=32), True).eval()
    h, pos = torch.randn(2, 10, D), torch.tensor(positions)
    assert attn.route(h, pos) == MASKED
    ref = dense_attention(attn, h, pos)
    torch.testing.assert_close(attn(h, pos), ref, atol=2e-5, rtol=2e-5)
    with torch.no_grad():
        torch.testing.assert_close(attn(h, pos), ref, atol=2e-5, rtol=2e-5)


def test_the_masked_route_rotates_at_the_calls_positions(monkeypatch):
    """A scheme with a bias and a rotation that reads the positions (``_RotatedALiBi``) on the
    masked route: the dense formula's output and gradients."""
    monkeypatch.setattr("posenc.attention.flex_gates._setting", ["masked"])
    torch.manual_seed(0)
    attn = Attention(D, H, _RotatedALiBi(d_model=D, n_heads=H, max_len=64, causal=True), True).eval()
    h, pos = torch.randn(2, 13, D, requires_grad=True), torch.arange(13) + 5
    assert attn.route(h, pos) == MASKED
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)


def test_the_recomputed_plan_builds_a_shared_mask_without_a_graph_and_trains_under_autocast():
    """On the recomputed route (training, CPU) the mask that T5's layers share is built without a
    graph (the route trains the bias in its own backward, so no lookup index of T^2 entries is
    kept), and under bfloat16 autocast each layer's backward reads it in the call's dtype: the
    whole model trains, every gradient within 3% (relative, of the norm) of float32's."""
    torch.manual_seed(0)
    T = 24
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=T)
    model = Transformer(cfg, factory("t5_bias")).train()
    x, pos = torch.randn(1, T, D), torch.arange(T)
    plan = plan_attention([b.attn for b in model.blocks], x, pos)
    assert plan.route.name == RECOMPUTED
    (mask,) = plan.masks.values()
    assert mask.shape == (1, H, T, T) and mask.grad_fn is None and not mask.requires_grad
    idx = torch.randint(0, V, (2, T))
    params = [p for p in model.parameters() if p.requires_grad]
    want = torch.autograd.grad(model(idx).sum(), params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(idx).float().sum()
    got = torch.autograd.grad(loss, params)
    for (n, _), a, b in zip(((n, p) for n, p in model.named_parameters() if p.requires_grad), got, want):
        assert flex_gates.relative_error(a, b) < 3e-2, n


def test_the_recomputed_route_rotates_at_the_calls_positions():
    """KERPLE (a trained position-only bias) with ``_RotatedALiBi``'s rotation, in training on the
    recomputed route: the dense formula's output and gradients (the rotation reads the call's
    positions)."""
    kerple = type(factory("kerple")(d_model=D, n_heads=H, max_len=64, causal=True))
    rotated = type("RotatedKerple", (kerple,), {"rotate": _RotatedALiBi.rotate})
    torch.manual_seed(0)
    attn = Attention(D, H, rotated(d_model=D, n_heads=H, max_len=64, causal=True), True).train()
    h, pos = torch.randn(2, 13, D, requires_grad=True), torch.arange(13) + 5
    assert attn.route(h, pos) == RECOMPUTED
    y, ref = attn(h, pos), dense_attention(attn, h, pos)
    torch.testing.assert_close(y, ref, atol=2e-5, rtol=2e-5)
    assert_same_gradients(y, ref, trained_layer_gradients(attn, h), atol=2e-5, rtol=2e-4)


def test_attention_route_masked_keeps_off_the_flex_route_even_where_the_gates_and_probe_pass(fresh_flex_route,
                                                                                               monkeypatch):
    """``attention.route=masked`` never takes the flex route, not even where ``auto`` would (the
    gates passed, as on a GPU, and a right kernel that passes the probe): the float-mask routes,
    without a probe."""
    use_kernel(monkeypatch, dense_flex, setting="auto")
    monkeypatch.setattr(flex_module, "device_gate", lambda device, qk, v: None)
    attn = Attention(D, H, scheme_of("t5_bias", True, {}, max_len=256), True)
    x, pos = torch.zeros(1, 8, D), torch.arange(8)
    assert attn.route(x, pos) == FLEX
    FLEX_ROUTE.reset()
    monkeypatch.setattr(flex_gates, "_setting", ["masked"])
    probes = []
    monkeypatch.setattr(flex_module.FlexRoute, "probe", lambda self, *a: probes.append(1))
    assert attn.route(x, pos) != FLEX and probes == []


def test_fresh_copies_a_view_and_hands_anything_else_on():
    """``fresh``: a view (the kernel's backward would give it no gradient) becomes a copy, equal and
    no view, whose gradient reaches the tensor it viewed; a tensor that is no view, and None, are
    handed on as they are; and T5's relative table, a view of its embedding's output, comes fresh
    out of ``flex_parts``."""
    from posenc.attention.flex_kernel import fresh

    w = torch.randn(3, 4, requires_grad=True)
    view = w.T
    copy = fresh(view)
    assert view._base is not None and copy._base is None and torch.equal(copy, view)
    copy.sum().backward()
    assert torch.equal(w.grad, torch.ones(3, 4))
    plain = torch.randn(3)
    assert fresh(plain) is plain and fresh(None) is None
    sch = scheme_of("t5_bias", True, {}, max_len=32)
    assert sch.relative_bias(torch.arange(-7, 8))._base is not None
    assert flex_parts(sch, torch.arange(8)).table._base is None


def test_a_scheme_with_absolute_factors_hands_the_route_no_score_function_too(monkeypatch):
    """A scheme whose absolute part has both forms (factors, and a score function) gets the
    factors alone on the flex route: the part is added once."""
    sch = scheme_of("tupe", True, {}, max_len=32)
    monkeypatch.setattr(type(sch), "absolute_score", lambda self, q_pos, k_pos: lambda h, i, j: i * 0.0 + 1.0,
                        raising=False)
    parts = flex_parts(sch, torch.arange(8))
    assert parts.factors is not None and parts.score is None


def test_a_forced_route_plans_with_the_calls_layers_input_and_positions():
    """``forced_route`` with the masked route: the plan of T5's two layers holds the one mask they
    share, built from the call's positions (the whole mask at those positions)."""
    from posenc.attention.layer import ROUTES, forced_route

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=32)
    model = Transformer(cfg, factory("t5_bias")).eval()
    layers = [b.attn for b in model.blocks]
    x, pos = torch.randn(1, 9, D), torch.arange(9) + 3
    with forced_route({r.name: r for r in ROUTES}[MASKED]), torch.no_grad():
        plan = plan_attention(layers, x, pos)
    assert plan.route.name == MASKED
    (mask,) = plan.masks.values()
    torch.testing.assert_close(mask, layers[0].position_mask(pos, x.dtype))


def test_fire_in_bfloat16_takes_the_portable_path_and_gives_its_float32_bias():
    """FIRE's bias in bfloat16 on the CPU (the compiled block kernel serves float32 and float64
    alone): within bfloat16's rounding of the float32 bias."""
    torch.manual_seed(0)
    sch = scheme_of("fire", True, {}, max_len=64)
    pos = torch.arange(40)
    want = sch.position_bias(pos, pos)
    got = sch.to(torch.bfloat16).position_bias(pos, pos)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("name,causal,extra", POSITION_ONLY)
def test_a_position_bias_at_any_positions_is_the_whole_matrix_at_those_rows_and_keys(name, causal, extra):
    """A position-only bias at queries and keys that are not both contiguous (one contiguous and
    the other gapped, either way round; both gapped; a single query) equals the bias of every
    position 0 .. 30 at those rows and columns: a bias of positions i and j alone."""
    torch.manual_seed(0)
    sch = scheme_of(name, causal, extra, max_len=40)
    whole = sch.position_bias(torch.arange(31), torch.arange(31))
    gapped, run = torch.tensor([0, 2, 3, 7, 11, 12, 20, 30]), torch.arange(5, 13)
    for q, k in ((run, gapped), (gapped, run), (gapped, gapped), (torch.tensor([9]), gapped)):
        want = whole[..., q, :][..., k]
        torch.testing.assert_close(sch.position_bias(q, k).expand_as(want), want, atol=1e-5, rtol=1e-5,
                                   msg=lambda m, q=q, k=k: f"queries {q.tolist()}, keys {k.tolist()}: {m}")


class _AbsoluteOnly(PositionalScheme):
    """An absolute part alone, (1, H, Tq, Tk) = w_h * sin(i) * cos(j): no relative part."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.w = torch.nn.Parameter(torch.randn(self.n_heads))

    def absolute_bias(self, q_pos, k_pos):
        return (self.w[:, None, None] * q_pos.float().sin()[:, None] * k_pos.float().cos()[None, :])[None]


def test_a_scheme_of_an_absolute_part_alone_and_one_of_both_kinds_of_bias():
    """A scheme with no relative part: its position bias is its absolute part, at contiguous and
    at gapped positions. ALiBi with ``_KeyScore``'s content bias besides: its bias is the
    position bias plus the content bias."""
    torch.manual_seed(0)
    sch = _AbsoluteOnly(d_model=D, n_heads=H, max_len=32, causal=True)
    for pos in (torch.arange(6) + 2, torch.tensor([0, 3, 4, 9])):
        torch.testing.assert_close(sch.position_bias(pos, pos), sch.absolute_bias(pos, pos))
    both = type("ALiBiWithKeys", (ALiBi,), {"content_bias": _KeyScore.content_bias})(d_model=D, n_heads=H,
                                                                                      max_len=32, causal=True)
    both.w = torch.nn.Parameter(torch.randn(D // H))
    q, k, pos = torch.randn(2, H, 6, D // H), torch.randn(2, H, 6, D // H), torch.arange(6)
    want = both.position_bias(pos, pos) + both.content_bias(q, k, pos, pos)
    torch.testing.assert_close(both.bias(q, k, pos, pos), want)


@pytest.mark.parametrize("name", ["alibi", "t5_bias", "shaw"])
def test_the_masked_route_trains_under_bfloat16_autocast(name, monkeypatch):
    """On the masked route (``attention.route=masked``) under the CPU's bfloat16 autocast the
    float mask is cast to the call's dtype: output in bfloat16 within its rounding of the dense
    formula in float32, every gradient within 3% (relative, of the norm)."""
    monkeypatch.setattr("posenc.attention.flex_gates._setting", ["masked"])
    torch.manual_seed(0)
    attn = Attention(D, H, scheme_of(name, True, {}, max_len=64), True).train()
    h, pos = torch.randn(2, 20, D, requires_grad=True), torch.arange(20)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(h, pos)
    assert y.dtype == torch.bfloat16
    ref = dense_attention(attn, h, pos)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)
    wrt = trained_layer_gradients(attn, h)
    up = torch.randn_like(ref)
    for n, a, b in zip(wrt, grads(y.float(), up, list(wrt.values())), grads(ref, up, list(wrt.values()))):
        assert flex_gates.relative_error(a, b) < 3e-2, n
