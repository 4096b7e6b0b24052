"""Absolute schemes: added to the token embeddings at the input."""

from __future__ import annotations


import torch
from torch import Tensor, nn

from .base import PositionalScheme


def sinusoid(pos: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Sinusoidal encodings of (possibly fractional) positions pos (...,) -> (..., dim).

    PE(p, 2i) = sin(p / base^(2i/dim)), PE(p, 2i+1) = cos(p / base^(2i/dim))
    (Vaswani et al. 2017, section 3.5). An odd ``dim`` drops the last cosine.
    """
    half = (dim + 1) // 2
    inv_freq = base ** (-torch.arange(half, dtype=torch.float64, device=pos.device) * 2 / dim)
    angles = pos.to(torch.float64)[..., None] * inv_freq  # (..., half)
    out = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., :dim]
    return out.to(torch.get_default_dtype())


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """(num_positions, dim) table: sin at even indices, cos at odd ones.

    Checked against the formula of Vaswani et al. evaluated element by element
    in ``tests/test_encodings.py``, and against the translation property
    PE(p + k) = T(k) PE(p) with T(k) block-diagonal 2x2 rotations.
    """
    return sinusoid(torch.arange(num_positions), dim, base)


class NoPE(PositionalScheme):
    """No positional information (Kazemnejad et al. 2023, "NoPE").

    A causal model can still infer positions from the mask; a bidirectional
    one sees a bag of words. Checked against that bag-of-words property
    (permuting the input tokens of a bidirectional model permutes its outputs)
    in test_nope_bidirectional_model_is_permutation_equivariant.
    """

    relative = True  # no position at all: nothing changes under a shift


class Sinusoidal(PositionalScheme):
    """Fixed absolute sinusoids added to the input (Vaswani et al. 2017).

    Checked against the paper's formula evaluated element by element, inside
    the table and past it, in test_sinusoidal_embed_vs_formula, and the table it
    reads against the formula and the translation property PE(p + k) = T(k) PE(p)
    in test_sinusoidal_table_formula_and_translation.
    """

    def __init__(self, *, base: float = 10000.0, **kw):
        super().__init__(**kw)
        self.base = base
        self.register_buffer("table", sinusoidal_table(self.max_len, self.d_model, base), persistent=False)

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        if int(pos.max()) < self.table.shape[0] and int(pos.min()) >= 0:
            return self.table[pos].to(x.dtype)
        return sinusoid(pos, self.d_model, self.base).to(x.dtype)


class Learned(PositionalScheme):
    """A learned table of absolute position vectors (GPT, Radford et al. 2018;
    BERT, Devlin et al. 2019).

    Positions at or past ``max_len`` have no vector: the scheme refuses them
    rather than wrapping or clipping. Checked against direct indexing of the
    table (row pos[t] for token t, distinct rows for distinct positions) in
    test_learned_embed_is_table_row, and the refusal in
    test_learned_refuses_sequences_longer_than_max_len.
    """

    def __init__(self, *, init_std: float = 1.0, **kw):
        super().__init__(**kw)
        self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * init_std)

    def check_length(self, length: int) -> None:
        if length > self.max_len:
            raise ValueError(
                f"encoding=learned has a table of model.max_len={self.max_len} positions and "
                f"cannot represent a sequence of {length}; raise model.max_len (and retrain) "
                "or use a relative scheme"
            )

    def embed(self, x: Tensor, pos: Tensor) -> Tensor:
        self.check_length(int(pos.max()) + 1)
        if int(pos.min()) < 0:
            raise ValueError("encoding=learned got a negative position")
        return self.table[pos].to(x.dtype)
