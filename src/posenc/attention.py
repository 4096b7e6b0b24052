"""Multi-head self-attention that consults a positional scheme."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encodings.base import PositionalScheme


def causal_mask(q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor:
    """(Tq, Tk) float mask: 0 where key position <= query position, -inf elsewhere."""
    allowed = k_pos[None, :] <= q_pos[:, None]
    return torch.zeros(allowed.shape, dtype=dtype, device=q_pos.device).masked_fill(~allowed, float("-inf"))


class Attention(nn.Module):
    """Pre-projection multi-head attention; positions enter only through ``scheme``.

    Without a bias or value term it calls ``scaled_dot_product_attention`` with
    ``is_causal`` and no mask; with a bias the bias (plus the causal mask) goes
    in as a float mask; with a value term it computes the probabilities itself.
    """

    def __init__(self, d_model: int, n_heads: int, scheme: PositionalScheme, causal: bool, dropout: float = 0.0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.scheme = scheme

    def project(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v  # each (B, H, T, Dh)

    def logits(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """The pre-mask attention logits (B, H, Tq, Tk) the reference path uses."""
        q, k = self.scheme.rotate(q, k, q_pos, k_pos)
        att = q @ k.transpose(-1, -2) * self.scheme.logit_scale()
        b = self.scheme.bias(q, k, q_pos, k_pos)
        return att if b is None else att + b

    def position_mask(self, pos: Tensor, dtype: torch.dtype) -> Tensor:
        """Float attention mask of a position-only bias scheme, causal mask included."""
        mask = self.scheme.bias(None, None, pos, pos).to(dtype)
        return mask + causal_mask(pos, pos, dtype) if self.causal else mask

    def forward(self, h: Tensor, pos: Tensor, mask: Tensor | None = None) -> Tensor:
        """h (B, T, D) at positions pos (T,). ``mask``: a precomputed ``position_mask``
        (the model shares it between layers that share a scheme)."""
        B, T, D = h.shape
        q, k, v = self.project(h)
        sch = self.scheme
        drop = self.dropout if self.training else 0.0
        if mask is None and sch.position_only_bias:
            mask = self.position_mask(pos, q.dtype)
        if mask is not None:
            q, k = sch.rotate(q, k, pos, pos)
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask.to(q.dtype), dropout_p=drop, scale=sch.logit_scale()
            )
        elif sch.uses_value_term:
            att = self.logits(q, k, pos, pos)
            if self.causal:
                att = att + causal_mask(pos, pos, att.dtype)
            probs = F.dropout(att.softmax(-1), drop, self.training)
            y = probs @ v + sch.value_term(probs, pos, pos)
        else:
            q, k = sch.rotate(q, k, pos, pos)
            b = sch.bias(q, k, pos, pos)
            if b is None:
                y = F.scaled_dot_product_attention(
                    q, k, v, dropout_p=drop, is_causal=self.causal, scale=sch.logit_scale()
                )
            else:
                mask = b.to(q.dtype)
                if self.causal:
                    mask = mask + causal_mask(pos, pos, q.dtype)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=drop, scale=sch.logit_scale())
        return self.out(y.transpose(1, 2).reshape(B, T, D))

    def terms(self, h_word: Tensor, h_posn: Tensor | None, pos: Tensor) -> dict[str, Tensor]:
        """Named logit terms for an input split as h = h_word + h_posn.

        The projection bias goes with the word part, so the terms sum to
        ``logits`` of the full input.
        """
        q_w, k_w, _ = self.project(h_word)
        if h_posn is None:
            return self.scheme.terms(q_w, k_w, None, None, pos, pos)
        w = self.qkv.weight
        B, T, _ = h_posn.shape
        qk_p = (h_posn @ w.T).view(B, T, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return self.scheme.terms(q_w, k_w, qk_p[0], qk_p[1], pos, pos)
