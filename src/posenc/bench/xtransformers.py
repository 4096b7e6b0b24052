"""The x-transformers twins of the posenc models (optional ``[bench]`` extra).

x-transformers (``pip install x-transformers``; skipped with a note when
missing or with ``--no-xtransformers``). ``TransformerWrapper`` + ``Decoder``
with the same dim, depth, heads, head dim, ff inner width (``ff_mult = d_ff /
d_model``), vocabulary, causal attention and an untied output layer; PyTorch
SDPA (``attn_flash=True``) wherever x-transformers allows it (it refuses it
for the T5 bias). Shared schemes, by name: none (``use_abs_pos_emb=False``),
sinusoidal (``scaled_sinu_pos_emb=True``: x-transformers' only fixed sinusoid,
with one learned scale), learned (``use_abs_pos_emb=True``), rope
(``rotary_pos_emb``, ``rotary_emb_dim`` = the rotated width of posenc's rope),
xpos (``rotary_xpos``), alibi (``alibi_pos_bias``), t5_bias (``rel_pos_bias``
with the same buckets). Remaining differences: x-transformers projects q, k, v
separately, without biases, and its LayerNorm has no bias; posenc fuses qkv.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def xtransformers_version() -> str | None:
    try:
        from importlib.metadata import version

        import x_transformers  # noqa: F401

        return version("x-transformers")
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return None


#: the x-transformers twins exist for these configs, when they still name these classes
XT_SHARED = {
    "none": "NoPE",
    "sinusoidal": "Sinusoidal",
    "learned": "Learned",
    "rope": "RoPE",
    "xpos": "XPos",
    "alibi": "ALiBi",
    "t5_bias": "T5Bias",
}


def xt_kwargs(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any]) -> tuple[dict, dict] | None:
    """(wrapper kwargs, decoder kwargs) of the x-transformers twin, None if not shared."""
    if scheme not in XT_SHARED or str(enc.get("_target_", "")).rsplit(".", 1)[-1] != XT_SHARED[scheme]:
        return None
    head_dim = model_cfg["d_model"] // model_cfg["n_heads"]
    wrap, layers = {"use_abs_pos_emb": False}, {"attn_flash": True}
    if scheme == "none":
        pass
    elif scheme == "sinusoidal":
        wrap = {"use_abs_pos_emb": True, "scaled_sinu_pos_emb": True}
    elif scheme == "learned":
        wrap = {"use_abs_pos_emb": True}
    elif scheme == "rope":
        rot = round(head_dim * float(enc.get("fraction", 1.0)))
        layers.update(rotary_pos_emb=True, rotary_emb_dim=rot)
    elif scheme == "xpos":
        layers.update(
            rotary_xpos=True, rotary_emb_dim=head_dim, rotary_xpos_scale_base=float(enc.get("scale_base", 512))
        )
    elif scheme == "alibi":
        layers.update(alibi_pos_bias=True)
    elif scheme == "t5_bias":
        layers.update(
            rel_pos_bias=True,
            rel_pos_num_buckets=int(enc.get("num_buckets", 32)),
            rel_pos_max_distance=int(enc.get("max_distance", 128)),
            attn_flash=False,  # x-transformers refuses flash with the T5 bias
        )
    else:
        return None
    return wrap, layers


def build_xt(scheme: str, enc: dict[str, Any], model_cfg: dict[str, Any], vocab_size: int) -> nn.Module:
    from x_transformers import Decoder, TransformerWrapper

    kw = xt_kwargs(scheme, enc, model_cfg)
    if kw is None:
        raise ValueError(f"x-transformers has no counterpart of {scheme}")
    wrap, layers = kw
    d, ff = model_cfg["d_model"], model_cfg["d_ff"]
    dec = Decoder(
        dim=d,
        depth=model_cfg["n_layers"],
        heads=model_cfg["n_heads"],
        attn_dim_head=d // model_cfg["n_heads"],
        ff_mult=ff / d,
        verbose=False,
        **layers,
    )
    return TransformerWrapper(
        num_tokens=vocab_size, max_seq_len=model_cfg["max_len"], attn_layers=dec, tie_embedding=False, **wrap
    )
