"""Hugging Face <-> megatron-core tensor names and shapes, per model family.

Megatron-side names are those of ``GPTModel.state_dict()`` at TP=1 (megatron-core 0.16.1):

=====================================================  ==================================
local spec (``get_gpt_layer_local_spec``)              Transformer Engine spec
=====================================================  ==================================
``decoder.layers.N.input_layernorm.weight``            ``...self_attention.linear_qkv.layer_norm_weight``
``decoder.layers.N.pre_mlp_layernorm.weight`` (dense)  ``...mlp.linear_fc1.layer_norm_weight``
``decoder.layers.N.pre_mlp_layernorm.weight`` (MoE)    ``...pre_mlp_layernorm.weight``
=====================================================  ==================================

and, for both specs, ``embedding.word_embeddings.weight`` ``[Vp, h]``,
``decoder.layers.N.self_attention.linear_qkv.{weight,bias}`` (fused, see
:mod:`dlmspec.backends.convert.layout`), ``...self_attention.{q,k}_layernorm.weight`` ``[d]``,
``...self_attention.linear_proj.weight`` ``[h, H*d]``, ``...mlp.linear_fc1.weight``
``[2*ffn, h]`` (``[gate; up]``), ``...mlp.linear_fc2.weight`` ``[h, ffn]``, MoE
``...mlp.router.weight`` ``[E, h]``, ``...mlp.experts.local_experts.E.linear_fc{1,2}.weight``
(sequential experts), ``...mlp.shared_experts.linear_fc{1,2}.weight``,
``decoder.final_layernorm.weight`` and ``output_layer.weight`` ``[Vp, h]`` (untied only).

Hugging Face names are the on-disk checkpoint names (what ``save_pretrained`` writes, i.e. the
per-expert layout for MoE models, and LLaDA-8B's own ``model.transformer.*`` names).

Reading and writing ``config.json`` is :mod:`dlmspec.backends.convert.hf_config`; the checks of a
checkpoint's tensors are :mod:`dlmspec.backends.convert.checks`; the state-dict conversion built on these
names is :mod:`dlmspec.backends.convert.state_dict`.
"""


from __future__ import annotations

from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError

SPECS = ("local", "te")

#: Suffixes of non-parameter buffers some older HF checkpoints carry; ignored on read.
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def check_spec(spec: str) -> None:
    """Raise :class:`ConversionError` unless ``spec`` is one of :data:`SPECS`."""
    if spec not in SPECS:
        raise ConversionError(f"unknown layer spec {spec!r}", tensor="spec", expected=SPECS)


# ======================================================================================
# Names
def hf_global_names(dims: ModelDims) -> dict[str, str]:
    """Logical slot (``embed``, ``final_norm``, ``lm_head``) -> HF name of the tensors outside the
    layers."""
    if dims.family == "llada":
        return {
            "embed": "model.transformer.wte.weight",
            "final_norm": "model.transformer.ln_f.weight",
            "lm_head": "model.transformer.ff_out.weight",
        }
    return {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def hf_layer_names(dims: ModelDims, i: int) -> dict[str, str]:
    """Logical slot -> HF name for layer ``i`` (only the slots the family has)."""
    if dims.family == "llada":
        p = f"model.transformer.blocks.{i}."
        names = {
            "input_norm": p + "attn_norm.weight",
            "q": p + "q_proj.weight",
            "k": p + "k_proj.weight",
            "v": p + "v_proj.weight",
            "o": p + "attn_out.weight",
            "post_norm": p + "ff_norm.weight",
            "gate": p + "ff_proj.weight",
            "up": p + "up_proj.weight",
            "down": p + "ff_out.weight",
        }
        if dims.add_qkv_bias:
            names.update(q_bias=p + "q_proj.bias", k_bias=p + "k_proj.bias", v_bias=p + "v_proj.bias")
        return names
    p = f"model.layers.{i}."
    names = {
        "input_norm": p + "input_layernorm.weight",
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "post_norm": p + "post_attention_layernorm.weight",
    }
    if dims.add_qkv_bias:
        names.update(
            q_bias=p + "self_attn.q_proj.bias",
            k_bias=p + "self_attn.k_proj.bias",
            v_bias=p + "self_attn.v_proj.bias",
        )
    if dims.qk_layernorm:
        names.update(q_norm=p + "self_attn.q_norm.weight", k_norm=p + "self_attn.k_norm.weight")
    if dims.family == "mixtral":
        m = p + "block_sparse_moe."
        names["router"] = m + "gate.weight"
        for e in range(dims.num_experts):
            names[f"gate.{e}"] = f"{m}experts.{e}.w1.weight"
            names[f"up.{e}"] = f"{m}experts.{e}.w3.weight"
            names[f"down.{e}"] = f"{m}experts.{e}.w2.weight"
    elif dims.family == "qwen3_moe":
        m = p + "mlp."
        names["router"] = m + "gate.weight"
        for e in range(dims.num_experts):
            names[f"gate.{e}"] = f"{m}experts.{e}.gate_proj.weight"
            names[f"up.{e}"] = f"{m}experts.{e}.up_proj.weight"
            names[f"down.{e}"] = f"{m}experts.{e}.down_proj.weight"
    else:
        names.update(
            gate=p + "mlp.gate_proj.weight", up=p + "mlp.up_proj.weight", down=p + "mlp.down_proj.weight"
        )
    return names


def mcore_layer_names(dims: ModelDims, i: int, spec: str = "local") -> dict[str, str]:
    """Logical slot -> megatron GPTModel state-dict name for layer ``i``.

    Slots: ``input_norm``, ``qkv``, ``qkv_bias``, ``q_norm``, ``k_norm``, ``proj``,
    ``pre_mlp_norm``, and dense ``fc1``/``fc2`` or MoE ``router``, ``fc1.E``/``fc2.E``,
    ``shared_fc1``/``shared_fc2``.

    Raises:
        ConversionError: unknown ``spec``.
    """
    check_spec(spec)
    p = f"decoder.layers.{i}."
    a = p + "self_attention."
    names = {
        "input_norm": p + "input_layernorm.weight"
        if spec == "local"
        else a + "linear_qkv.layer_norm_weight",
        "qkv": a + "linear_qkv.weight",
        "proj": a + "linear_proj.weight",
    }
    if dims.add_qkv_bias:
        names["qkv_bias"] = a + "linear_qkv.bias"
    if dims.qk_layernorm:
        names["q_norm"] = a + "q_layernorm.weight"
        names["k_norm"] = a + "k_layernorm.weight"
    if dims.is_moe:
        names["pre_mlp_norm"] = p + "pre_mlp_layernorm.weight"
        names["router"] = p + "mlp.router.weight"
        for e in range(dims.num_experts):
            names[f"fc1.{e}"] = f"{p}mlp.experts.local_experts.{e}.linear_fc1.weight"
            names[f"fc2.{e}"] = f"{p}mlp.experts.local_experts.{e}.linear_fc2.weight"
        if dims.shared_expert_ffn_hidden_size:
            names["shared_fc1"] = p + "mlp.shared_experts.linear_fc1.weight"
            names["shared_fc2"] = p + "mlp.shared_experts.linear_fc2.weight"
    else:
        names["pre_mlp_norm"] = (
            p + "pre_mlp_layernorm.weight" if spec == "local" else p + "mlp.linear_fc1.layer_norm_weight"
        )
        names["fc1"] = p + "mlp.linear_fc1.weight"
        names["fc2"] = p + "mlp.linear_fc2.weight"
    return names


# ======================================================================================
# Expected shapes
def expected_hf_shapes(dims: ModelDims) -> dict[str, tuple[int, ...]]:
    """Every tensor a Hugging Face checkpoint of ``dims`` must hold, with its shape.

    ``lm_head`` (or LLaDA's ``model.transformer.ff_out``) is listed only when untied.

    Raises:
        ConversionError: ``dims`` asks for something the family's HF layout cannot hold
            (shared experts).
    """
    if dims.shared_expert_ffn_hidden_size:
        raise ConversionError(
            f"family {dims.family!r} has no shared experts on the Hugging Face side, but "
            f"shared_expert_ffn_hidden_size={dims.shared_expert_ffn_hidden_size}",
            tensor="shared_expert_ffn_hidden_size",
            expected=0,
        )
    h, d = dims.hidden_size, dims.kv_channels
    g = hf_global_names(dims)
    shapes: dict[str, tuple[int, ...]] = {g["embed"]: (dims.vocab_size, h), g["final_norm"]: (h,)}
    if not dims.tied:
        shapes[g["lm_head"]] = (dims.vocab_size, h)
    for i in range(dims.num_layers):
        n = hf_layer_names(dims, i)
        shapes[n["input_norm"]] = (h,)
        shapes[n["post_norm"]] = (h,)
        shapes[n["q"]] = (dims.q_rows, h)
        shapes[n["k"]] = (dims.kv_rows, h)
        shapes[n["v"]] = (dims.kv_rows, h)
        shapes[n["o"]] = (h, dims.q_rows)
        if dims.add_qkv_bias:
            shapes[n["q_bias"]] = (dims.q_rows,)
            shapes[n["k_bias"]] = (dims.kv_rows,)
            shapes[n["v_bias"]] = (dims.kv_rows,)
        if dims.qk_layernorm:
            shapes[n["q_norm"]] = (d,)
            shapes[n["k_norm"]] = (d,)
        if dims.is_moe:
            f = dims.moe_ffn_hidden_size
            shapes[n["router"]] = (dims.num_experts, h)
            for e in range(dims.num_experts):
                shapes[n[f"gate.{e}"]] = (f, h)
                shapes[n[f"up.{e}"]] = (f, h)
                shapes[n[f"down.{e}"]] = (h, f)
        else:
            f = dims.ffn_hidden_size
            shapes[n["gate"]] = (f, h)
            shapes[n["up"]] = (f, h)
            shapes[n["down"]] = (h, f)
    return shapes


def expected_mcore_shapes(dims: ModelDims, spec: str = "local") -> dict[str, tuple[int, ...]]:
    """Every parameter of megatron's GPTModel for ``dims`` at TP=1, with its shape.

    Vocabulary tensors have ``padded_vocab_size`` rows; ``output_layer.weight`` is listed
    only when untied. ``_extra_state`` entries are not parameters and are not listed.

    Raises:
        ConversionError: unknown ``spec``.
    """
    h, d = dims.hidden_size, dims.kv_channels
    shapes: dict[str, tuple[int, ...]] = {
        "embedding.word_embeddings.weight": (dims.padded_vocab_size, h),
        "decoder.final_layernorm.weight": (h,),
    }
    if not dims.tied:
        shapes["output_layer.weight"] = (dims.padded_vocab_size, h)
    for i in range(dims.num_layers):
        n = mcore_layer_names(dims, i, spec)
        shapes[n["input_norm"]] = (h,)
        shapes[n["qkv"]] = (dims.qkv_rows, h)
        shapes[n["proj"]] = (h, dims.q_rows)
        shapes[n["pre_mlp_norm"]] = (h,)
        if dims.add_qkv_bias:
            shapes[n["qkv_bias"]] = (dims.qkv_rows,)
        if dims.qk_layernorm:
            shapes[n["q_norm"]] = (d,)
            shapes[n["k_norm"]] = (d,)
        if dims.is_moe:
            f = dims.moe_ffn_hidden_size
            shapes[n["router"]] = (dims.num_experts, h)
            for e in range(dims.num_experts):
                shapes[n[f"fc1.{e}"]] = (2 * f, h)
                shapes[n[f"fc2.{e}"]] = (h, f)
            if dims.shared_expert_ffn_hidden_size:
                s = dims.shared_expert_ffn_hidden_size
                shapes[n["shared_fc1"]] = (2 * s, h)
                shapes[n["shared_fc2"]] = (h, s)
        else:
            shapes[n["fc1"]] = (2 * dims.ffn_hidden_size, h)
            shapes[n["fc2"]] = (h, dims.ffn_hidden_size)
    return shapes
