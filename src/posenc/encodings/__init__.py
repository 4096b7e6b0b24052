"""Positional-encoding schemes behind one interface (see ``base``)."""

from .absolute import Learned, NoPE, Sinusoidal, sinusoid, sinusoidal_table
from .base import TERM_NAMES, PositionalScheme, distance_range, is_contiguous, relative_positions, toeplitz
from .position_bias import FIRE, ALiBi, Kerple, T5Bias, alibi_slopes, t5_relative_bucket
from .cape import CAPE
from .content_bias import (
    FixedBidirectional,
    Shaw,
    SkewRelative,
    TransformerXL,
    aligned_positions,
    relative_logits,
    relative_shift,
    relative_shift_future,
    relative_shift_two_sided,
    skew,
)
from .rotary import RoPE, XPos, rotate_pairs
from .tupe import TUPE

__all__ = [
    "TERM_NAMES",
    "ALiBi",
    "CAPE",
    "FIRE",
    "FixedBidirectional",
    "Kerple",
    "Learned",
    "NoPE",
    "PositionalScheme",
    "RoPE",
    "Shaw",
    "Sinusoidal",
    "SkewRelative",
    "T5Bias",
    "TUPE",
    "TransformerXL",
    "XPos",
    "aligned_positions",
    "alibi_slopes",
    "is_contiguous",
    "relative_logits",
    "distance_range",
    "relative_positions",
    "relative_shift",
    "relative_shift_future",
    "relative_shift_two_sided",
    "rotate_pairs",
    "sinusoid",
    "sinusoidal_table",
    "skew",
    "t5_relative_bucket",
    "toeplitz",
]
