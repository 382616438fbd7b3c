"""State-dict conversion between Hugging Face and megatron-core ``GPTModel`` (TP=1), per the
names of :mod:`dlmspec.backends.convert.families` and the fused layouts of :mod:`dlmspec.backends.convert.layout`;
every tensor is checked first (:mod:`dlmspec.backends.convert.checks`)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from dlmspec.backends.convert import layout
from dlmspec.backends.convert.checks import CheckedWeights, check_hf_checkpoint, check_tensors
from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.families import check_spec, hf_global_names, hf_layer_names, expected_mcore_shapes, mcore_layer_names


def hf_to_mcore_state_dict(
    hf: Mapping[str, torch.Tensor], dims: ModelDims, spec: str = "local"
) -> dict[str, torch.Tensor]:
    """Megatron GPTModel state dict (TP=1) from a Hugging Face one.

    Args:
        hf: HF name -> tensor (a dict or a lazy reader such as
            :class:`dlmspec.backends.convert.hf_io.SafetensorsReader`).
        dims: target dimensions; every tensor is checked against them first.
        spec: ``"local"`` or ``"te"`` megatron layer-norm naming.

    Returns:
        name -> tensor with the shapes of :func:`expected_mcore_shapes`; dtypes unchanged;
        vocabulary tables zero-padded to ``padded_vocab_size``.

    Raises:
        ConversionError: fewer layers than ``dims`` says, a missing, unexpected or wrongly
            shaped tensor (named), a weight that is not floating point or not finite
            (:func:`check_weight`), a tied model whose checkpoint carries an ``lm_head`` that
            differs from the embedding.
    """
    check_spec(spec)
    g = hf_global_names(dims)
    check_hf_checkpoint(hf, dims)
    hf = CheckedWeights(hf)
    if dims.tied and g["lm_head"] in hf:
        lm_head = hf[g["lm_head"]]
        if tuple(lm_head.shape) != (dims.vocab_size, dims.hidden_size) or not torch.equal(
            lm_head, hf[g["embed"]]
        ):
            raise ConversionError(
                f"tied model, but {g['lm_head']!r} differs from {g['embed']!r}",
                tensor=g["lm_head"],
                expected=f"equal to {g['embed']}",
            )

    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": layout.pad_vocab(hf[g["embed"]], dims.padded_vocab_size, g["embed"]),
        "decoder.final_layernorm.weight": hf[g["final_norm"]],
    }
    if not dims.tied:
        out["output_layer.weight"] = layout.pad_vocab(hf[g["lm_head"]], dims.padded_vocab_size, g["lm_head"])
    H, G, d = dims.num_attention_heads, dims.num_query_groups, dims.kv_channels
    for i in range(dims.num_layers):
        n = hf_layer_names(dims, i)
        m = mcore_layer_names(dims, i, spec)
        out[m["input_norm"]] = hf[n["input_norm"]]
        out[m["qkv"]] = layout.fuse_qkv(hf[n["q"]], hf[n["k"]], hf[n["v"]], H, G, d)
        if dims.add_qkv_bias:
            out[m["qkv_bias"]] = layout.fuse_qkv(hf[n["q_bias"]], hf[n["k_bias"]], hf[n["v_bias"]], H, G, d)
        if dims.qk_layernorm:
            out[m["q_norm"]] = hf[n["q_norm"]]
            out[m["k_norm"]] = hf[n["k_norm"]]
        out[m["proj"]] = hf[n["o"]]
        out[m["pre_mlp_norm"]] = hf[n["post_norm"]]
        if dims.is_moe:
            out[m["router"]] = hf[n["router"]]
            for e in range(dims.num_experts):
                out[m[f"fc1.{e}"]] = layout.fuse_gate_up(hf[n[f"gate.{e}"]], hf[n[f"up.{e}"]])
                out[m[f"fc2.{e}"]] = hf[n[f"down.{e}"]]
        else:
            out[m["fc1"]] = layout.fuse_gate_up(hf[n["gate"]], hf[n["up"]])
            out[m["fc2"]] = hf[n["down"]]
    return out


def mcore_to_hf_state_dict(
    mcore: Mapping[str, torch.Tensor], dims: ModelDims, spec: str = "local"
) -> dict[str, torch.Tensor]:
    """Hugging Face state dict from a megatron GPTModel one (TP=1); inverse of
    :func:`hf_to_mcore_state_dict`.

    Args:
        mcore: megatron name -> full tensor. ``_extra_state`` entries are ignored.
        dims: dimensions; every tensor is checked against :func:`expected_mcore_shapes`.
        spec: layer-norm naming of ``mcore`` (``"local"`` or ``"te"``).

    Returns:
        HF name -> tensor (vocabulary unpadded to ``vocab_size``; no ``lm_head`` when tied).

    Raises:
        ConversionError: a missing, unexpected or wrongly shaped tensor (named).
    """
    check_spec(spec)
    check_tensors(mcore, expected_mcore_shapes(dims, spec), f"megatron-core {dims.family}", ignore=("_extra_state",))
    g = hf_global_names(dims)
    out: dict[str, torch.Tensor] = {
        g["embed"]: layout.unpad_vocab(mcore["embedding.word_embeddings.weight"], dims.vocab_size),
        g["final_norm"]: mcore["decoder.final_layernorm.weight"],
    }
    if not dims.tied:
        out[g["lm_head"]] = layout.unpad_vocab(mcore["output_layer.weight"], dims.vocab_size, "output_layer.weight")
    H, G, d = dims.num_attention_heads, dims.num_query_groups, dims.kv_channels
    for i in range(dims.num_layers):
        n = hf_layer_names(dims, i)
        m = mcore_layer_names(dims, i, spec)
        out[n["input_norm"]] = mcore[m["input_norm"]]
        out[n["q"]], out[n["k"]], out[n["v"]] = layout.split_qkv(mcore[m["qkv"]], H, G, d)
        if dims.add_qkv_bias:
            out[n["q_bias"]], out[n["k_bias"]], out[n["v_bias"]] = layout.split_qkv(mcore[m["qkv_bias"]], H, G, d)
        if dims.qk_layernorm:
            out[n["q_norm"]] = mcore[m["q_norm"]]
            out[n["k_norm"]] = mcore[m["k_norm"]]
        out[n["o"]] = mcore[m["proj"]]
        out[n["post_norm"]] = mcore[m["pre_mlp_norm"]]
        if dims.is_moe:
            out[n["router"]] = mcore[m["router"]]
            for e in range(dims.num_experts):
                out[n[f"gate.{e}"]], out[n[f"up.{e}"]] = layout.split_gate_up(mcore[m[f"fc1.{e}"]])
                out[n[f"down.{e}"]] = mcore[m[f"fc2.{e}"]]
        else:
            out[n["gate"]], out[n["up"]] = layout.split_gate_up(mcore[m["fc1"]])
            out[n["down"]] = mcore[m["fc2"]]
    return out
