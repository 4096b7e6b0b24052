"""A small pre-LN transformer (causal decoder or bidirectional encoder)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .attention import Attention, AttentionPlan, plan_attention
from .encodings.base import PositionalScheme
from .ranges import Range


@dataclass
class ModelSize:
    """What the ``model`` config group sets; also its Hydra schema, so a wrong
    type fails at composition, naming the key, and its fields' ``range`` the values
    ``posenc.config.check_config`` accepts."""

    d_model: int = field(default=128, metadata={"range": Range(1)})
    n_layers: int = field(default=2, metadata={"range": Range(1)})
    n_heads: int = field(default=4, metadata={"range": Range(1)})
    d_ff: int = field(default=512, metadata={"range": Range(1)})
    max_len: int = field(default=1024, metadata={"range": Range(1)})
    dropout: float = field(default=0.0, metadata={"range": Range(0, 1, whole=False, high_open=True)})


@dataclass
class ModelConfig(ModelSize):
    """A model: its size plus what the data and task decide."""

    vocab_size: int = 0
    causal: bool = True

    def __post_init__(self):
        if self.vocab_size < 1:
            raise ValueError(f"ModelConfig needs a vocabulary size of at least 1, got {self.vocab_size}")


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, scheme: PositionalScheme):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg.d_model, cfg.n_heads, scheme, cfg.causal, cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model), nn.Dropout(cfg.dropout)
        )

    def forward(self, x: Tensor, pos: Tensor, plan: AttentionPlan | None = None, last: int | None = None,
                attention: list[Tensor] | None = None) -> Tensor:
        """x (B, T, D) -> (B, T, D), or (B, last, D) for the last ``last`` positions alone;
        ``attention``: a list the layer appends its attention probabilities to."""
        if last is None:
            x = x + self.attn(self.ln1(x), pos, plan, attention)
        else:
            x = x[:, x.shape[1] - last :] + self.attn.last_rows(self.ln1(x), pos, last, attention)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Token embedding (x sqrt(d), Vaswani et al.) + scheme.embed, pre-LN blocks,
    final LayerNorm, an output layer of its own (``lm_head``).

    Why the output layer is not tied to the token embedding: the embedding rows
    start with norm ~1 and enter the residual stream x sqrt(d), so at
    initialisation the final LayerNorm returns roughly the input token's own
    row times sqrt(d), and a tied head gave that token a logit of ~sqrt(d): the
    first loss was ~2 ln V, not ln V (10.6 against ln 260 = 5.56 at d = 128).
    Scaling the tied head by 1/sqrt(d) (as Mesh TensorFlow's T5 does) fixed the
    start but slowed learning (quick start: validation perplexity 11.1 against
    6.87 tied); an untied head initialised with std 0.02 (GPT-2's init) starts
    every scheme at ln V to within 1% (``tests/test_train.py``) and learns as
    fast (6.91).

    ``scheme_factory(d_model=, n_heads=, max_len=, causal=)`` builds a scheme; a
    scheme with ``shared_across_layers`` is built once and handed to every layer
    (T5, TUPE), otherwise each layer gets its own.
    """

    def __init__(self, cfg: ModelConfig, scheme_factory: Callable[..., PositionalScheme]):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(
                f"model.d_model={cfg.d_model} is not divisible by model.n_heads={cfg.n_heads}"
            )
        self.cfg = cfg
        dims = dict(d_model=cfg.d_model, n_heads=cfg.n_heads, max_len=cfg.max_len, causal=cfg.causal)
        first = scheme_factory(**dims)
        schemes = [first] + [
            first if first.shared_across_layers else scheme_factory(**dims) for _ in range(cfg.n_layers - 1)
        ]
        self.scheme = first  # the input-level scheme (embed); layers hold theirs
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.tok.weight, std=cfg.d_model**-0.5)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, s) for s in schemes)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.lm_head.weight, std=0.02)  # logits start near 0: first loss ~ ln V
        #: the attention routes the forwards took, in the order first taken: "training" (grad
        #: mode on) and "evaluation" (off); what a run records (``attention_routes``)
        self.routes_taken: dict[str, list[str]] = {}

    def positional_parameters(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for m in [self.scheme] + [b.attn.scheme for b in self.blocks]:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def attention_routes(self) -> dict[str, str]:
        """The routes the forwards took, "training" and "evaluation": one name, or several in the
        order first taken ("flex, then masked": a route refused itself on the way, and warned)."""
        return {mode: ", then ".join(names) for mode, names in self.routes_taken.items()}

    def num_parameters(self) -> dict[str, int]:
        total = sum(p.numel() for p in self.parameters())
        positional = sum(p.numel() for p in self.positional_parameters())
        return {"total": total, "positional": positional}

    def check_length(self, length: int) -> None:
        if length < 1:
            raise ValueError(f"sequence length must be at least 1, got {length}")
        for b in self.blocks:
            b.attn.scheme.check_length(length)
        self.scheme.check_length(length)

    def embed(self, idx: Tensor, pos: Tensor) -> tuple[Tensor, Tensor | None]:
        """Word and position parts of the input, (B, T, D) each (position may be None)."""
        word = self.tok(idx) * math.sqrt(self.cfg.d_model)
        posn = self.scheme.embed(word, pos)
        return word, posn

    def forward(self, idx: Tensor, pos: Tensor | None = None, last: int | None = None,
                attention: list[Tensor] | None = None) -> Tensor:
        """idx (B, T) token ids -> logits (B, T, V). pos defaults to 0..T-1.

        ``attention``: a list that every layer appends its attention probabilities of
        this forward to, (B, H, T, T) in layer order (the top layer's (B, H, last, T)
        with ``last``): what analysis reads of the model (``analysis.reach``), so that
        it measures the model's own attention, from the same forward.

        ``last``: the logits of the last ``last`` positions alone, (B, last, V): the top
        block then computes queries, feed-forward and output for those positions only
        (every block below, and the top block's keys and values, see every position),
        which is all a loss on a suffix needs (the retrieval task's answer), at about
        half the cost for the study's 2-layer model. Equal to the full forward's last
        rows to float rounding (the top block takes the reference path); checked for
        every scheme, values and gradients, in test_last_positions_equal_the_full_forward."""
        B, T = idx.shape
        if last is not None and not 1 <= last <= T:
            raise ValueError(f"last={last}: choose between 1 and the sequence length {T}")
        if pos is None:
            pos = torch.arange(T, device=idx.device)
        word, posn = self.embed(idx, pos)
        x = self.drop(word if posn is None else word + posn)
        plan = plan_attention([b.attn for b in self.blocks], x, pos)  # route and shared masks, once
        *below, top = self.blocks
        for block in below:
            x = block(x, pos, plan, attention=attention)
        x = top(x, pos, plan, last, attention)
        self._took(plan, len(self.blocks) - (last is not None))
        return self.lm_head(self.ln_f(x))

    def _took(self, plan: AttentionPlan, layers: int) -> None:
        """Adds the routes the ``layers`` that used ``plan`` took to ``routes_taken``: the plan's,
        unless every one of them gave up on it, and those they took instead."""
        taken = self.routes_taken.setdefault("training" if torch.is_grad_enabled() else "evaluation", [])
        for name in ([plan.name] if len(plan.instead) < layers else []) + plan.instead:
            if name not in taken:
                taken.append(name)

    @torch.no_grad()
    def first_layer_terms(self, idx: Tensor, pos: Tensor | None = None) -> dict[str, Tensor]:
        """First-layer logit terms (B, H, T, T) after splitting LN1(word + position).

        LayerNorm is affine given the statistics of the full input x = w + p:
        LN(x) = g (x - mu) / sigma + b = [g (w - mu_w) / sigma + b] + [g (p - mu_p) / sigma],
        with mu = mu_w + mu_p, so the two parts sum exactly to the real input.
        """
        B, T = idx.shape
        if pos is None:
            pos = torch.arange(T, device=idx.device)
        word, posn = self.embed(idx, pos)
        x = word if posn is None else word + posn
        ln = self.blocks[0].ln1
        sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps)
        h_word = ln.weight * (word - word.mean(-1, keepdim=True)) / sigma + ln.bias
        h_posn = None
        if posn is not None:
            posn = posn.expand_as(word)
            h_posn = ln.weight * (posn - posn.mean(-1, keepdim=True)) / sigma
        return self.blocks[0].attn.terms(h_word, h_posn, pos)
