"""FlexAttention as the ``flex`` route calls it: a scheme's bias in the form the kernel reads
(``FlexParts``), the score function, the causal block mask, and the kernel itself, compiled
under a recompilation limit that fails loudly (``posenc.compiling``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..compiling import RecompileLimitHit, recompile_limit
from ..encodings.base import PositionalScheme, distance_range

#: FlexAttention's block of queries and keys (``_DEFAULT_SPARSE_BLOCK_SIZE``)
BLOCK = 128


def fresh(t: Tensor | None) -> Tensor | None:
    """``t``, or a copy of it where it is a view of another tensor. A tensor that ``score_mod``
    reads and that is a view of one with a graph (``emb(idx).T``, ``w[:, 0]``) gets no gradient
    from the compiled kernel's backward, and no error says so (torch 2.6 to 2.13, measured with
    ``backend="aot_eager"`` in tests/test_flex.py); ``.contiguous()`` does not help, a copy does."""
    return t.clone() if t is not None and t._base is not None else t


@dataclass(frozen=True)
class FlexParts:
    """A position-only bias in the form the ``flex`` route reads: ``table`` (H, 2T - 1),
    the relative part on the distances 1 - T .. T - 1, read inside the kernel at
    [h, j - i + T - 1]; the absolute part either as ``factors`` (a, b), (H, T, r) each,
    ``logit_scale * a @ b^T``, appended to the queries and keys, or as ``score``, a function
    of (h, i, j) evaluated inside the kernel (``bias_score_mod``). Any may be None. All
    carry their graph: the kernel's backward gives the tensors the table and the score read
    their gradients, and q and k theirs, and autograd takes them on to the scheme's parameters.
    No tensor the score function reads is a view (``fresh``)."""

    table: Tensor | None
    factors: tuple[Tensor, Tensor] | None
    score: Callable | None = None


def flex_parts(scheme: PositionalScheme, pos: Tensor) -> FlexParts | None:
    """The parts of ``scheme``'s position-only bias at contiguous positions ``pos`` for
    the ``flex`` route, or None where the scheme has an absolute part in neither form
    (TUPE with [CLS] untied): it then takes a float-mask route. A scheme gets the route by
    what it defines (``relative_bias``, ``absolute_factors``, ``absolute_score``), with no
    branch here. The relative table is made ``fresh``: T5's and TUPE's are views of their
    embeddings' output (``.T``)."""
    factors = score = None
    if scheme.defines("absolute_bias"):
        factors = scheme.absolute_factors(pos, pos)
        score = scheme.absolute_score(pos, pos) if factors is None else None
        if factors is None and score is None:
            return None
    return FlexParts(fresh(scheme.relative_bias(distance_range(pos, pos))), factors, score)


def bias_score_mod(parts: FlexParts) -> Callable | None:
    """FlexAttention's ``score_mod``: the scaled logit of query i and key j plus
    ``table[h, j - i + T - 1]`` (the relative part laid out as ``toeplitz`` lays it out, T the
    length) and ``score(h, i, j)``, whichever the parts have; None without either."""
    table, score = parts.table, parts.score
    if table is None and score is None:
        return None

    def score_mod(s, b, h, q_idx, kv_idx):
        if table is not None:  # the offset T - 1 read from the table's shape: no constant to recompile for
            s = s + table[h, kv_idx - q_idx + (table.shape[-1] - 1) // 2]
        if score is not None:
            s = s + score(h, q_idx, kv_idx)
        return s

    return score_mod


def causal_mask_mod(b, h, q_idx, kv_idx):
    """FlexAttention's ``mask_mod`` of causal attention: key j is seen from query i when j <= i."""
    return kv_idx <= q_idx


@torch.compiler.disable
@functools.lru_cache(maxsize=16)
def causal_block_mask(T: int, device: torch.device):
    """The causal ``BlockMask`` of T queries and keys, from its blocks alone: query block m sees
    key blocks 0 .. m - 1 whole and block m in part (the blocks above the diagonal are skipped,
    not masked); where T is not a multiple of ``BLOCK``, the last query block sees every key
    block in part, as ``create_block_mask`` has it (its padded queries are masked there). Nothing
    of T x T is built (``create_block_mask`` evaluates the mask at every pair first: 2.6 GB and
    7.9 s at T = 16,384 on a CPU), and never inside a compiled graph (``torch.compiler.disable``:
    dynamo ignores the cache and would rebuild it at every step); built once per length and device,
    shared by every layer and forward. Equal to ``create_block_mask(causal_mask_mod, ...)``, blocks
    and outputs, in tests/test_flex.py."""
    from torch.nn.attention.flex_attention import BlockMask

    n = -(-T // BLOCK)
    rows = torch.arange(n, device=device, dtype=torch.int32)
    partial = torch.ones(n, dtype=torch.int32, device=device)  # the diagonal block
    whole = rows.clone()  # blocks 0 .. m - 1
    if T % BLOCK:  # the last block holds padded queries and keys: every block of its row in part
        partial[-1], whole[-1] = n, 0
    partial_idx = (rows[None, :] + rows[:, None]) % n  # row m: m first, then the others
    whole_idx = rows[None, :].expand(n, n).contiguous()
    return BlockMask.from_kv_blocks(partial[None, None], partial_idx[None, None], whole[None, None],
                                    whole_idx[None, None], BLOCK_SIZE=BLOCK, mask_mod=causal_mask_mod,
                                    seq_lengths=(T, T))


@functools.cache
def compiled_flex(backend: str = "inductor") -> Callable:
    """FlexAttention compiled once per process and backend (``inductor`` on CUDA; the tests
    compile it with ``aot_eager`` on the CPU: dynamo and AOTAutograd as Inductor uses them,
    with the kernel's own backward). A second length or batch makes the changed sizes dynamic
    (torch.compile's automatic dynamic shapes), so evaluating at many lengths compiles a few
    graphs, not one per length."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, backend=backend)


def flex_kernel(device: torch.device) -> Callable:
    """FlexAttention for ``device``: compiled on CUDA (it must be to be fast), eager
    elsewhere (the CPU: its forward only, unfused; the route takes it there only when
    ``attention.route=flex`` asks for it, or in the tests)."""
    if device.type == "cuda":
        return compiled_flex()
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


def flex_attend(q: Tensor, k: Tensor, v: Tensor, parts: FlexParts, causal: bool, scale: float,
                content: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Attention with a bias through FlexAttention: the absolute factors, and a layer's
    ``content`` factors (the fixed bidirectional encoding's), appended to q and k (one fused
    product gives the content logits and these parts, all at ``scale``), the relative
    table and an absolute score read in ``score_mod``, and causality as a ``BlockMask``.
    Nothing of size T^2 is built. Positions are contiguous. The kernel runs under
    ``recompile_limit``: past it ``RecompileLimitHit`` is raised, never the unfused kernel
    run (inside a model compiled whole, ``compile=true``, the model's compilation holds it)."""
    B, T = q.shape[0], q.shape[-2]
    for factors in (parts.factors, content):
        if factors is not None:
            a, b = (f.to(q.dtype).expand(B, -1, -1, -1) for f in factors)
            q, k = torch.cat([q, a], -1), torch.cat([k, b], -1)
    mask = causal_block_mask(T, q.device) if causal else None
    kernel = flex_kernel(q.device)
    if torch.compiler.is_compiling():
        return kernel(q, k, v, score_mod=bias_score_mod(parts), block_mask=mask, scale=scale)
    try:
        with recompile_limit():
            return kernel(q, k, v, score_mod=bias_score_mod(parts), block_mask=mask, scale=scale)
    except (torch.OutOfMemoryError, RecompileLimitHit):
        raise
    except Exception as e:
        raise RuntimeError(f"the flex route (FlexAttention on {q.device.type}) failed: {type(e).__name__}: {e}; "
                           "attention.route=masked sends every scheme to the float-mask routes") from e
