"""Rotary schemes: queries and keys are rotated by their positions."""

from __future__ import annotations

import functools
import math
import warnings

import torch
from torch import Tensor

from ..compiling import RecompileLimitHit, recompile_limit
from .base import PositionalScheme


def rotate_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate consecutive pairs (x[2i], x[2i+1]) of the last dim by angles (..., Dr/2).

    Only the first 2 * angles.shape[-1] features are rotated; the rest pass through.
    On CUDA the elementwise work (about a dozen kernels eagerly) runs as one compiled
    kernel (``_rotate_compiled``), under a recompilation limit no run reaches
    (``posenc.compiling``); should one reach it anyway, the rotation warns once and runs
    eagerly from then on. Elsewhere, and inside a model compiled whole, eagerly. The same
    function either way, checked against each other in tests/test_compile.py.
    """
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if x.device.type in COMPILED_ON and not _EAGER and not torch.compiler.is_compiling():
        try:
            with recompile_limit():
                return _rotate_compiled()(x, cos, sin)
        except RecompileLimitHit as e:
            _EAGER.append(str(e))
            warnings.warn(f"the compiled rotation runs eagerly from here on: {e}", stacklevel=2)
    return _rotate(x, cos, sin)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    dr = cos.shape[-1] * 2
    xr, rest = x[..., :dr], x[..., dr:]
    x1, x2 = xr[..., 0::2], xr[..., 1::2]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1)


#: the devices whose rotation runs compiled
COMPILED_ON = ("cuda",)
#: why the compiled rotation is not used any more (its recompilation limit), once it is not
_EAGER: list[str] = []


@functools.cache
def _rotate_compiled():
    return torch.compile(_rotate)


class RoPE(PositionalScheme):
    """Rotary position embedding (Su et al. 2021, RoFormer, eq. 34), with optional
    context-extension rules for evaluation beyond the training length.

    Pair i of a head's first ``rotary_dim`` = d features is rotated by angle
    m * inv_freq[i], inv_freq[i] = base^(-2i / d), at position m, so q_m . k_n
    depends only on m - n (checked in the tests by shifting both positions).

    ``scaling`` rescales the frequencies at every call by s = max(1, T / L),
    T = the largest query or key position + 1 and L = ``original_len`` (the
    training length); at T <= L every rule is plain RoPE, bit for bit. With
    ``factor`` (``pi`` only) s is that number at every call instead, whatever T:

    * ``pi``, position interpolation (Chen et al. 2023, "Extending Context Window
      of Large Language Models via Positional Interpolation"): inv_freq / s,
      i.e. angle (m / s) * inv_freq. Chen et al. fix s = L' / L for a model
      extended to a window of L' (their section 2.2): a run fine-tuned at 4L has
      ``factor`` 4 and keeps it at every length, within L too. Without ``factor``,
      s is the window's own max(1, T / L), which for a window read from position 0
      is the static factor T / L of that window: the zero-shot form.
    * ``pi_dynamic``: inv_freq / max(1, T / L) at every call, also for a run
      fine-tuned with it (so off within L, where a fine-tuned ``pi`` is not).
    * ``ntk``, NTK-aware scaling (bloc97 2023, as written up in Peng et al. 2023,
      section 3.1): base -> base * s^(d / (d - 2)), i.e. inv_freq[i] * s^(-2i / (d - 2)).
    * ``yarn``, YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension
      of Large Language Models"): inv_freq * (1 - w_i (1 - 1/s)), a blend of
      interpolation (inv_freq / s, weight w_i) and extrapolation (inv_freq), and
      q and k each multiplied by 0.1 ln s + 1, so the logits by (0.1 ln s + 1)^2
      (the paper's 1/t). The ``terms`` decomposition goes through ``rotate``, so
      this factor lands in the position-position term and the terms still sum
      to the logits. The weight follows the reference code (the authors' and
      Hugging Face transformers' ``_compute_yarn_parameters``): w_i ramps
      linearly in the pair index i from 0 at floor(i(beta)) to 1 at
      ceil(i(alpha)), where i(r) = d ln(L / (2 pi r)) / (2 ln base) is the pair
      that turns r times over L (upper end clamped at d - 1 as there). With
      r_i = L / wavelength_i = L inv_freq[i] / (2 pi), exponential in i, this is
      the paper's gamma(r) = 1 - w made linear in ln r instead of in r:
      gamma = (ln r - ln alpha) / (ln beta - ln alpha), clamped to [0, 1], with
      the ends rounded outwards to whole pairs; both keep pairs with r > beta
      unchanged and interpolate those with r < alpha fully.

    Checked against the formula evaluated with complex numbers, and for
    q_m . k_n depending only on m - n, in
    test_rotary_product_depends_only_on_difference; the frequencies and the YaRN
    factor of each rule against Hugging Face transformers'
    ``ROPE_INIT_FUNCTIONS`` ("linear" with factor s, "dynamic" with factor 1 at
    seq_len T, "yarn" with factor s) in
    test_frequencies_and_factor_match_transformers and
    test_yarn_ramp_settings_match_transformers (``tests/test_rope_scaling.py``).

    Args:
        base: the wavelength base (10000 in the paper).
        fraction: the share of each head's features that rotate (1.0 = all,
            0.25 as in GPT-NeoX); the rotated count must be even.
        scaling: None (plain RoPE), ``"pi"``, ``"pi_dynamic"``, ``"ntk"`` or ``"yarn"``.
        original_len: L, the training length; required with ``scaling``.
        factor: ``pi``'s fixed s (at least 1); None: the window's max(1, T / L).
        yarn_alpha, yarn_beta: YaRN's ramp ends, in turns over L (None: 1 and 32).
    """

    SCALINGS = ("pi", "pi_dynamic", "ntk", "yarn")
    # plain RoPE; with a scaling rule the factor s follows the largest position, so a
    # shift past L changes the logits (the rules are evaluation settings)
    relative = True

    def __init__(
        self,
        *,
        base: float = 10000.0,
        fraction: float = 1.0,
        scaling: str | None = None,
        original_len: int | None = None,
        yarn_alpha: float | None = None,
        yarn_beta: float | None = None,
        factor: float | None = None,
        **kw,
    ):
        super().__init__(**kw)
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"encoding.scheme.fraction={fraction} must be in (0, 1]")
        rotary_dim = int(round(self.head_dim * fraction))
        if rotary_dim % 2 or rotary_dim == 0:
            raise ValueError(
                f"rotary dim {rotary_dim} (head_dim={self.head_dim} x fraction={fraction}) must be "
                "even and positive; change encoding.scheme.fraction or model.d_model / model.n_heads"
            )
        self.base = base
        self.rotary_dim = d = rotary_dim
        two_i = torch.arange(0, d, 2, dtype=torch.float32)
        self.register_buffer("inv_freq", base ** (-two_i / d), persistent=False)
        self.scaling, self.original_len, self.factor = scaling, original_len, factor
        if factor is not None and (scaling != "pi" or not factor >= 1):
            raise ValueError(f"encoding.scheme.factor={factor}: a fixed factor of at least 1, with scaling=pi only "
                             f"(scaling={scaling})")
        # null = the paper's 1 and 32 (null in the config keeps old runs' identity)
        self.yarn_alpha = yarn_alpha = 1.0 if yarn_alpha is None else yarn_alpha
        self.yarn_beta = yarn_beta = 32.0 if yarn_beta is None else yarn_beta
        if scaling is None:
            return
        if scaling not in self.SCALINGS:
            raise ValueError(f"encoding.scheme.scaling={scaling!r} is not one of null, {', '.join(self.SCALINGS)}")
        if original_len is None or original_len < 1:
            raise ValueError(
                f"encoding.scheme.original_len={original_len}: scaling={scaling} needs the training length "
                "L (a positive integer) to scale by max(1, T / L)"
            )
        if scaling == "ntk":
            if d <= 2:
                raise ValueError(f"scaling=ntk needs a rotary dim above 2, got {d}: raise encoding.scheme.fraction")
            self.register_buffer("ntk_power", -two_i / (d - 2), persistent=False)
        if scaling == "yarn":
            if not 0 < yarn_alpha < yarn_beta:
                raise ValueError(
                    f"encoding.scheme.yarn_alpha={yarn_alpha} and yarn_beta={yarn_beta} need 0 < alpha < beta"
                )

            def pair(turns: float) -> float:  # the pair index that turns `turns` times over L
                return d * math.log(original_len / (2 * math.pi * turns)) / (2 * math.log(base))

            lo, hi = max(math.floor(pair(yarn_beta)), 0), min(math.ceil(pair(yarn_alpha)), d - 1)
            hi = hi if hi != lo else hi + 0.001  # as the reference, against a zero-width ramp
            ramp = ((torch.arange(d // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
            self.register_buffer("yarn_ramp", ramp, persistent=False)

    def scaled(self, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor | None]:
        """The inverse frequencies (Dr/2,) for this call and the factor on q and k
        (None: 1), from ``factor`` or s = max(1, T / L) kept on the device (no host sync)."""
        if self.scaling is None:
            return self.inv_freq, None
        if self.factor is not None:
            return self.inv_freq / self.factor, None
        T = torch.maximum(q_pos.max(), k_pos.max()).to(torch.float32) + 1
        s = (T / self.original_len).clamp(min=1.0)
        if self.scaling in ("pi", "pi_dynamic"):
            return self.inv_freq / s, None
        if self.scaling == "ntk":
            return self.inv_freq * s**self.ntk_power, None
        # yarn; at s = 1 both the blend (1 - w * 0) and the factor (0.1 * 0 + 1) are exactly 1
        return self.inv_freq * (1 - self.yarn_ramp * (1 - 1 / s)), 0.1 * s.log() + 1

    def angles(self, pos: Tensor, inv_freq: Tensor | None = None) -> Tensor:
        inv_freq = self.inv_freq if inv_freq is None else inv_freq
        return pos.to(torch.float32)[:, None] * inv_freq  # (T, Dr/2)

    def rotate(self, q, k, q_pos, k_pos):
        inv_freq, factor = self.scaled(q_pos, k_pos)
        q_angles = self.angles(q_pos, inv_freq)  # self-attention: the keys' angles are the queries'
        k_angles = q_angles if k_pos is q_pos else self.angles(k_pos, inv_freq)
        q, k = rotate_pairs(q, q_angles), rotate_pairs(k, k_angles)
        if factor is None:
            return q, k
        return q * factor.to(q.dtype), k * factor.to(k.dtype)

    def extra_repr(self) -> str:
        out = super().extra_repr()
        if self.scaling is None:
            return out
        return out + f", scaling={self.scaling}, original_len={self.original_len}" + (
            f", factor={self.factor}" if self.factor is not None else "")


class XPos(PositionalScheme):
    """Rotary embedding with an exponential scale, xPos (Sun et al. 2022, "A
    Length-Extrapolatable Transformer", section 3.2).

    Queries and keys are rotated as in RoPE (pair i, angle m * base^(-2i/d)) and
    pair i is scaled by zeta_i^(m / scale_base) for a query at position m and
    by zeta_i^(-n / scale_base) for a key at n, with
    zeta_i = (2i/d + gamma) / (1 + gamma) in (0, 1). The product then carries
    zeta_i^((m - n) / scale_base): it decays with distance for keys before the
    query and would grow without bound for keys after it, so xPos is defined
    for causal attention only (``causal_only``). Positions are centred on the
    middle key before scaling (the factors cancel exactly in q_m . k_n) to keep
    the factors near 1 at long lengths. Checked against a direct evaluation of
    the formula with complex numbers, and for q_m . k_n depending only on
    m - n, in test_rotary_product_depends_only_on_difference.

    Args:
        base: the rotation wavelength base (10000).
        gamma: zeta's offset (0.4 in the paper).
        scale_base: the exponent's divisor (512 in the paper).
    """

    causal_only = True
    relative = True

    def __init__(self, *, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0, **kw):
        super().__init__(**kw)
        if self.head_dim % 2:
            raise ValueError(f"xpos needs an even head_dim, got {self.head_dim}")
        if scale_base <= 0:
            raise ValueError(f"encoding.scheme.scale_base={scale_base} must be positive")
        self.base = base
        self.gamma = gamma
        self.scale_base = scale_base
        half = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim  # 2i/d
        self.register_buffer("inv_freq", base ** (-half), persistent=False)
        self.register_buffer("zeta", (half + gamma) / (1 + gamma), persistent=False)

    def scale(self, pos: Tensor, center: Tensor, sign: float) -> Tensor:
        """(T, Dh) factor zeta^(sign * (pos - center) / scale_base), repeated per pair."""
        expo = sign * (pos - center).to(torch.float32)[:, None] / self.scale_base
        return (self.zeta**expo).repeat_interleave(2, dim=-1)

    def rotate(self, q, k, q_pos, k_pos):
        center = k_pos[0] + k_pos.shape[0] // 2
        q = rotate_pairs(q, q_pos.to(torch.float32)[:, None] * self.inv_freq)
        k = rotate_pairs(k, k_pos.to(torch.float32)[:, None] * self.inv_freq)
        return q * self.scale(q_pos, center, 1.0).to(q.dtype), k * self.scale(k_pos, center, -1.0).to(k.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", gamma={self.gamma}, scale_base={self.scale_base}"
