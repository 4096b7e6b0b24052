"""RoPE context extension (``encoding.scheme.scaling``: pi, ntk, yarn) against
Hugging Face transformers' reference functions (``modeling_rope_utils``), plus
the properties the rules must keep. Run: ``pytest -q tests/test_rope_scaling.py``
(a few seconds)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from transformers import PretrainedConfig  # the dev extra's transformers>=5: the reference
from transformers import modeling_rope_utils as rope_utils

from posenc.attention import Attention
from posenc.encodings import RoPE, rotate_pairs
from posenc.model import ModelConfig, Transformer

CONF = Path(__file__).resolve().parents[1] / "conf" / "encoding"
D, H, L = 64, 2, 64  # d_model, heads (head_dim 32), training length L
RULES = ["pi", "ntk", "yarn"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def factory(**overrides):
    """The partial a model gets from conf/encoding/rope.yaml, with overrides."""
    cfg = OmegaConf.load(CONF / "rope.yaml")
    for key, value in overrides.items():
        cfg.scheme[key] = value
    return instantiate(cfg.scheme)


def build(causal: bool = True, **overrides) -> RoPE:
    return factory(**overrides)(d_model=D, n_heads=H, max_len=4 * L, causal=causal)


def hf_reference(rope_type: str, rotary_dim: int, fraction: float, T: int, alpha=1.0, beta=32.0, L=L):
    """(inv_freq, attention factor) of transformers' ROPE_INIT_FUNCTIONS at length T."""
    s = max(1.0, T / L)
    params = {"rope_type": rope_type, "rope_theta": 10000.0, "partial_rotary_factor": fraction}
    params["factor"] = 1.0 if rope_type == "dynamic" else s
    if rope_type == "yarn":
        params.update(original_max_position_embeddings=L, beta_fast=beta, beta_slow=alpha)
    head_dim = int(round(rotary_dim / fraction))
    config = PretrainedConfig(
        hidden_size=head_dim * H, num_attention_heads=H, head_dim=head_dim, max_position_embeddings=L,
        rope_parameters=params,
    )
    inv_freq, factor = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=T)
    assert inv_freq.shape == (rotary_dim // 2,)
    return inv_freq, factor


HF_NAME = {"pi": "linear", "ntk": "dynamic", "yarn": "yarn"}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("rotary_dim,fraction", [(16, 0.5), (32, 1.0)])
@pytest.mark.parametrize("T", [128, 256, 1024])
def test_frequencies_and_factor_match_transformers(rule, rotary_dim, fraction, T):
    sch = build(scaling=rule, original_len=L, fraction=fraction)
    assert sch.rotary_dim == rotary_dim
    inv_freq, factor = sch.scaled(torch.arange(T // 2), torch.arange(T))  # T from the key positions
    ref_freq, ref_factor = hf_reference(HF_NAME[rule], rotary_dim, fraction, T)
    torch.testing.assert_close(inv_freq, ref_freq, rtol=2e-6, atol=0)
    assert (1.0 if factor is None else factor.item()) == pytest.approx(ref_factor, rel=1e-6)
    if rule == "yarn":
        assert ref_factor == pytest.approx(0.1 * math.log(T / L) + 1)
        # the highest frequencies extrapolate (unchanged), the lowest interpolate (/ s)
        assert inv_freq[0] == sch.inv_freq[0]
        assert float(inv_freq[-1]) == pytest.approx(float(sch.inv_freq[-1]) * L / T, rel=1e-6)
    # rotate uses them: pairs rotated by pos * inv_freq, then q and k times the factor (float32
    # angles up to ~1000 rad: the ulps of inv_freq move them by up to ~1e-4)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, H, 5, D // H, generator=g), torch.randn(1, H, 7, D // H, generator=g)
    q_pos, k_pos = torch.tensor([0, 3, 50, 99, T - 1]), torch.arange(7) * (T // 7)
    for got, x, pos in zip(sch.rotate(q, k, q_pos, k_pos), (q, k), (q_pos, k_pos)):
        ref = rotate_pairs(x, pos.float()[:, None] * ref_freq) * ref_factor
        torch.testing.assert_close(got, ref, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("alpha,beta,original_len", [
    (1.0, 32.0, L), (2.0, 8.0, L), (0.5, 64.0, L),
    (0.25, 1.0, L),  # the ramp starts above pair 0 and ends below the last pair
    (1.0, 2.0, 10**9),  # both ends clipped to the last pair: a zero-width ramp, widened by 0.001
    (1.0, 2.0, 4),  # both ends clipped to pair 0: a zero-width ramp where it matters
    (1e-8, 32.0, L),  # the end past the last pair, clipped to d - 1
])  # fmt: skip
def test_yarn_ramp_settings_match_transformers(alpha, beta, original_len):
    sch = build(scaling="yarn", original_len=original_len, yarn_alpha=alpha, yarn_beta=beta)
    T = 3 * original_len  # s = 3: the ramp blends interpolation and extrapolation
    ends = torch.tensor([0, T - 1])
    inv_freq, _ = sch.scaled(ends, ends)
    ref, _ = hf_reference("yarn", 32, 1.0, T, alpha, beta, L=original_len)
    torch.testing.assert_close(inv_freq, ref, rtol=2e-6, atol=0)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("T", [1, 40, L])
def test_plain_rope_up_to_training_length(rule, T):
    plain, scaled = build(), build(scaling=rule, original_len=L)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, H, T, D // H, generator=g), torch.randn(2, H, T, D // H, generator=g)
    pos = torch.arange(T)
    for got, ref in zip(scaled.rotate(q, k, pos, pos), plain.rotate(q, k, pos, pos)):
        assert torch.equal(got, ref)
    # with queries at the end of the window too
    for got, ref in zip(scaled.rotate(q[..., -1:, :], k, pos[-1:], pos), plain.rotate(q[..., -1:, :], k, pos[-1:], pos)):
        assert torch.equal(got, ref)


def test_default_is_plain_rope():
    # every new setting is null in the config: a run identity recorded before they existed
    # (missing keys read as null) still matches, so old rope checkpoints resume
    scheme = OmegaConf.load(CONF / "rope.yaml").scheme
    assert all(scheme[key] is None for key in ("scaling", "original_len", "yarn_alpha", "yarn_beta"))
    sch = build()
    assert sch.scaling is None and sch.original_len is None
    assert sch.yarn_alpha == 1.0 and sch.yarn_beta == 32.0
    pos = torch.arange(5 * L)  # far past L: still no scaling
    inv_freq, factor = sch.scaled(pos, pos)
    assert inv_freq is sch.inv_freq and factor is None
    # no new persistent state: a checkpoint's state dict is unchanged
    for rule in RULES:
        assert build(scaling=rule, original_len=L).state_dict().keys() == sch.state_dict().keys() == set()


@pytest.mark.parametrize("rule", ["pi", "ntk"])
def test_product_depends_only_on_difference_at_fixed_length(rule):
    sch = build(scaling=rule, original_len=L)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, D // H, generator=g), torch.randn(1, 1, 1, D // H, generator=g)
    T = 3 * L
    anchor = torch.tensor([T - 1])  # a far position fixes T (and so s) for every call
    for m, n in [(0, 0), (5, 2), (40, 3), (3, 9), (100, 1)]:
        dots = []
        for shift in (0, 13, 60):
            q_pos = torch.tensor([m + shift])
            k_pos = torch.cat((torch.tensor([n + shift]), anchor))
            qm, kn = sch.rotate(q, k.expand(1, 1, 2, -1), q_pos, k_pos)
            dots.append(float(qm[0, 0, 0].double() @ kn[0, 0, 0].double()))
        assert max(dots) - min(dots) < 1e-4, (rule, m, n, dots)


@pytest.mark.parametrize("rule", RULES)
def test_tiny_model_runs_at_four_times_training_length(rule):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=L, causal=True)
    model = Transformer(cfg, factory(scaling=rule, original_len=L)).eval()
    plain = Transformer(cfg, factory()).eval()
    plain.load_state_dict(model.state_dict())  # same weights, the checkpoint loads unchanged
    idx = torch.randint(0, 256, (2, 4 * L))
    with torch.no_grad():
        y, y0 = model(idx), plain(idx)
        short = model(idx[:, :L])
    assert y.shape == (2, 4 * L, 256) and torch.isfinite(y).all()
    assert not torch.allclose(y, y0)  # the rule changes something past L ...
    torch.testing.assert_close(short, y0[:, :L], atol=1e-5, rtol=1e-5)  # ... and nothing up to L (causal)


@pytest.mark.parametrize("causal", [True, False])
def test_yarn_terms_sum_to_logits_past_training_length(causal):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, d_model=D, n_layers=2, n_heads=H, d_ff=64, max_len=L, causal=causal)
    model = Transformer(cfg, factory(scaling="yarn", original_len=L)).eval()
    T = 3 * L
    idx = torch.randint(0, 256, (2, T))
    pos = torch.arange(T)
    terms = model.first_layer_terms(idx, pos)
    assert set(terms) == {"word-word", "position-position"}
    with torch.no_grad():
        word, _ = model.embed(idx, pos)
        attn: Attention = model.blocks[0].attn
        q, k, _ = attn.project(model.blocks[0].ln1(word))
        ref = attn.logits(q, k, pos, pos)
        # the temperature is in the logits: (0.1 ln s + 1)^2 times those of the rotation alone
        inv_freq, factor = attn.scheme.scaled(pos, pos)
        qr, kr = (rotate_pairs(x, attn.scheme.angles(pos, inv_freq)) for x in (q, k))
        unscaled = qr @ kr.transpose(-1, -2) * attn.scheme.logit_scale()
        assert factor.item() == pytest.approx(0.1 * math.log(T / L) + 1)
        torch.testing.assert_close(ref, unscaled * factor**2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sum(terms.values()), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"scaling": "yarn"}, "encoding.scheme.original_len"),
        ({"scaling": "pi", "original_len": 0}, "encoding.scheme.original_len"),
        ({"scaling": "linear", "original_len": L}, "pi, pi_dynamic, ntk, yarn"),
        ({"scaling": "pi_dynamic", "original_len": L, "factor": 2.0}, "with scaling=pi only"),
        ({"scaling": "ntk", "original_len": L, "factor": 2.0}, "with scaling=pi only"),
        ({"factor": 2.0}, r"scaling=None"),
        ({"scaling": "pi", "original_len": L, "factor": 0.5}, "a fixed factor of at least 1"),
        ({"scaling": "yarn", "original_len": L, "yarn_alpha": 32.0, "yarn_beta": 1.0}, "yarn_alpha"),
        ({"scaling": "yarn", "original_len": L, "yarn_alpha": 0.0}, "yarn_alpha"),
    ],
)
def test_bad_settings_raise(overrides, match):
    with pytest.raises(ValueError, match=match):
        build(**overrides)


@pytest.mark.parametrize("s", [1.0, 1.5, 2.0])
def test_every_fixed_factor_of_at_least_1_is_taken(s):
    assert build(scaling="pi", original_len=L, factor=s).factor == s


def test_ntk_needs_more_than_one_pair():
    with pytest.raises(ValueError, match="ntk"):
        factory(scaling="ntk", original_len=L, fraction=1 / 16)(d_model=D, n_heads=H)


@pytest.mark.parametrize("s", [1.0, 4.0])
@pytest.mark.parametrize("T", [L // 2, L, 3 * L])
def test_static_pi_is_plain_rope_at_positions_divided_by_its_factor_at_every_length(T, s):
    """Chen et al.'s position interpolation with a fixed factor s (their f'(x, m) = f(x, m L / L'),
    section 2.2): the rotation at position m is plain RoPE's at m / s, within L as past it; and
    its frequencies are transformers' "linear" rule at that factor, whatever T; at 1, plain RoPE."""
    static, plain = build(scaling="pi", original_len=L, factor=s), build()
    pos = torch.arange(T)
    q, k = torch.randn(2, H, T, D // H), torch.randn(2, H, T, D // H)
    got = static.rotate(q, k, pos, pos)
    want = plain.rotate(q, k, pos / s, pos / s)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    inv_freq, factor = static.scaled(pos, pos)
    config = PretrainedConfig(hidden_size=D, num_attention_heads=H, max_position_embeddings=L,
                              rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": s})
    torch.testing.assert_close(inv_freq, rope_utils.ROPE_INIT_FUNCTIONS["linear"](config, "cpu")[0])
    assert factor is None


@pytest.mark.parametrize("T", [L // 2, L, 2 * L, 3 * L])
def test_zero_shot_pi_reads_a_window_at_its_own_factor_and_pi_dynamic_is_the_same(T):
    """Without a factor, ``pi`` scales a window of T read from position 0 by max(1, T / L): the
    static rule at that window's factor (plain RoPE within L), bit for bit; ``pi_dynamic`` is
    the same rule."""
    pos = torch.arange(T)
    q, k = torch.randn(1, H, T, D // H), torch.randn(1, H, T, D // H)
    zero_shot = build(scaling="pi", original_len=L).rotate(q, k, pos, pos)
    dynamic = build(scaling="pi_dynamic", original_len=L).rotate(q, k, pos, pos)
    fixed = build(scaling="pi", original_len=L, factor=T / L).rotate(q, k, pos, pos) if T > L \
        else build().rotate(q, k, pos, pos)
    for a, b, c in zip(zero_shot, dynamic, fixed):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_static_factor_keeps_the_rotation_of_a_short_window_where_the_dynamic_rule_does_not():
    """What the static factor changes for a run fine-tuned at 4L: within L, ``pi`` with factor 4
    still rotates by m / 4 where ``pi_dynamic`` (and zero-shot ``pi``) is plain RoPE."""
    pos = torch.arange(L)
    q, k = torch.randn(1, H, L, D // H), torch.randn(1, H, L, D // H)
    static = build(scaling="pi", original_len=L, factor=4.0).rotate(q, k, pos, pos)
    dynamic = build(scaling="pi_dynamic", original_len=L).rotate(q, k, pos, pos)
    plain = build().rotate(q, k, pos, pos)
    assert torch.equal(dynamic[0], plain[0]) and not torch.allclose(static[0], plain[0], atol=1e-3)
