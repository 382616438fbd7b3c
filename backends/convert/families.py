"""Hugging Face <-> megatron-core name and config mapping, per model family.

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dlmspec.backends.convert import layout
from dlmspec.backends.convert.dims import MOE_FAMILIES, ModelDims, padded_vocab_size
from dlmspec.backends.convert.errors import ConversionError

SPECS = ("local", "te")

#: HF ``model_type`` -> dlmspec family.
MODEL_TYPES: dict[str, str] = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "mixtral": "mixtral",
    "llada": "llada",
    "Dream": "dream",
    "dream": "dream",
}

#: ``architectures`` entry written into config.json per family.
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "llada": "LLaDAModelLM",
    "dream": "DreamModel",
}

#: Families whose config class ships with ``transformers`` (others are remote code).
TRANSFORMERS_FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral"})

#: Suffixes of non-parameter buffers some older HF checkpoints carry; ignored on read.
_IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


def detect_family(config: Mapping[str, Any]) -> str:
    """The dlmspec family of a Hugging Face ``config.json`` dict.

    Raises:
        ConversionError: ``model_type`` missing or not one of :data:`MODEL_TYPES`.
    """
    if not isinstance(config, Mapping):
        check_hf_config(config)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise ConversionError(
            f"unknown model family: config model_type={model_type!r} "
            f"(architectures={config.get('architectures')}); known: {sorted(MODEL_TYPES)}",
            tensor="model_type",
            expected=sorted(MODEL_TYPES),
        )
    return MODEL_TYPES[model_type]


def _check_spec(spec: str) -> None:
    if spec not in SPECS:
        raise ConversionError(f"unknown layer spec {spec!r}", tensor="spec", expected=SPECS)


# ======================================================================================
# Names
def _hf_global(dims: ModelDims) -> dict[str, str]:
    if dims.family == "llada":
        return {
            "embed": "model.transformer.wte.weight",
            "final_norm": "model.transformer.ln_f.weight",
            "lm_head": "model.transformer.ff_out.weight",
        }
    return {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight", "lm_head": "lm_head.weight"}


def _hf_layer(dims: ModelDims, i: int) -> dict[str, str]:
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
    _check_spec(spec)
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
    g = _hf_global(dims)
    shapes: dict[str, tuple[int, ...]] = {g["embed"]: (dims.vocab_size, h), g["final_norm"]: (h,)}
    if not dims.tied:
        shapes[g["lm_head"]] = (dims.vocab_size, h)
    for i in range(dims.num_layers):
        n = _hf_layer(dims, i)
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


def check_tensors(
    tensors: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    what: str,
    *,
    ignore: tuple[str, ...] = (),
    optional: frozenset[str] = frozenset(),
) -> None:
    """Raise on the first missing, unexpected or wrongly shaped tensor.

    Args:
        tensors: name -> tensor (anything with ``.shape``) or a lazy mapping whose values
            are only read through ``shape_of`` below (``.shape`` on a tensor, or a
            ``get_shape(name)`` method of the mapping).
        expected: name -> shape.
        what: a description of the checkpoint for the message ("Hugging Face llama").
        ignore: name suffixes that may be present and are skipped.
        optional: names that may be absent or present.

    Raises:
        ConversionError: naming the tensor and the expected shape (or that none was expected).
    """
    names = [n for n in tensors.keys() if not (ignore and n.endswith(ignore))]
    for name in expected:
        if name not in tensors and name not in optional:
            raise ConversionError(
                f"{what} checkpoint is missing tensor {name!r} (expected shape {expected[name]})",
                tensor=name,
                expected=expected[name],
            )
    for name in sorted(names):
        if name not in expected and name not in optional:
            raise ConversionError(
                f"{what} checkpoint has unexpected tensor {name!r} "
                f"(shape {_shape_of(tensors, name)}); no such tensor in the target config",
                tensor=name,
                expected=None,
            )
    for name, shape in expected.items():
        if name not in tensors:
            continue
        got = _shape_of(tensors, name)
        if tuple(got) != tuple(shape):
            raise ConversionError(
                f"{what} tensor {name!r} has shape {tuple(got)}, expected {tuple(shape)} "
                f"from the target config",
                tensor=name,
                expected=tuple(shape),
            )


def _shape_of(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    get_shape = getattr(tensors, "get_shape", None)
    if get_shape is not None:
        return tuple(get_shape(name))
    return tuple(tensors[name].shape)


def _layer_prefix(dims: ModelDims) -> str:
    return "model.transformer.blocks." if dims.family == "llada" else "model.layers."


def check_layer_count(hf: Mapping[str, Any], dims: ModelDims) -> None:
    """Refuse ``dims.num_layers`` larger than the layers a Hugging Face checkpoint holds.

    Runs before anything loops over the layers, so ``num_hidden_layers: 1000000000`` is an error
    at once, not an hour of building expected names. (More layers in the checkpoint than in the
    config are reported as unexpected tensors by :func:`check_tensors`.)

    Raises:
        ConversionError: naming the config key, its value and the layer count found.
    """
    prefix = _layer_prefix(dims)
    held = set()
    for name in hf.keys():
        if name.startswith(prefix):
            index = name[len(prefix):].split(".", 1)[0]
            if index.isdigit():
                held.add(int(index))
    if dims.num_layers <= len(held):
        return
    key = config_key(dims.family, "layers")
    path = getattr(hf, "path", None)
    where = f"{path / 'config.json'}: " if path is not None else ""
    span = f" ({prefix}{min(held)} to {prefix}{max(held)})" if held else ""
    raise ConversionError(
        f"{where}{key} = {dims.num_layers}, but the checkpoint holds {len(held)} layers{span}. "
        f"Fix: set {key} = {len(held)}",
        tensor=key,
        expected=len(held),
    )


def check_hf_checkpoint(hf: Mapping[str, Any], dims: ModelDims) -> None:
    """Check a Hugging Face checkpoint's tensor names and shapes against ``dims`` (header only
    for a :class:`dlmspec.backends.convert.hf_io.SafetensorsReader`).

    Raises:
        ConversionError: too few layers (:func:`check_layer_count`), or a missing, unexpected or
            wrongly shaped tensor (:func:`check_tensors`).
    """
    check_layer_count(hf, dims)
    g = _hf_global(dims)
    optional = frozenset({g["lm_head"]}) if dims.tied else frozenset()
    check_tensors(hf, expected_hf_shapes(dims), f"Hugging Face {dims.family}", ignore=_IGNORED_HF_SUFFIXES,
                  optional=optional)


#: Elements per ``isfinite`` pass (bounds the temporary mask to 16 MiB).
_FINITE_CHUNK = 1 << 24


def check_dtype(name: str, dtype: torch.dtype, where: str) -> None:
    """Refuse a weight dtype that is not floating point (int8, uint8, bool: a quantized checkpoint).

    Raises:
        ConversionError: naming the file (``where``), the tensor and its dtype.
    """
    if dtype.is_floating_point:
        return
    raise ConversionError(
        f"{where}: tensor {name!r} has dtype {str(dtype).removeprefix('torch.')}; the converter converts "
        "floating-point weights (float32, bfloat16, float16), not integer or quantized ones. Fix: convert an "
        "unquantized floating-point copy of the checkpoint",
        tensor=name,
        expected="a floating-point dtype",
    )


def check_weight(name: str, tensor: torch.Tensor, where: str) -> None:
    """Refuse a weight that is not floating point (int8, a quantized checkpoint) or holds NaN/Inf.

    Args:
        name: the tensor's name, for the message.
        tensor: the weight.
        where: the file or checkpoint it was read from, for the message.

    Raises:
        ConversionError: naming the file, the tensor, its dtype or its non-finite values.
    """
    check_dtype(name, tensor.dtype, where)
    flat = tensor.reshape(-1)
    if all(bool(torch.isfinite(chunk).all()) for chunk in flat.split(_FINITE_CHUNK)):
        return
    counts = [(int(torch.isnan(flat).sum()), "NaN"), (int(torch.isinf(flat).sum()), "Inf")]
    found = " and ".join(f"{n} {what}" for n, what in counts if n)
    raise ConversionError(
        f"{where}: tensor {name!r} holds non-finite values ({found} of {flat.numel()}), a diverged run or a "
        "corrupt file. Fix: convert an earlier checkpoint, or a fresh copy of the original",
        tensor=name,
        expected="finite values",
    )


class _CheckedWeights(Mapping[str, torch.Tensor]):
    """``hf`` whose tensors pass :func:`check_weight` the first time each is read."""

    def __init__(self, hf: Mapping[str, torch.Tensor]):
        self._hf = hf
        self._checked: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._hf[name]
        if name not in self._checked:
            file_of = getattr(self._hf, "file_of", None)
            check_weight(name, tensor, str(file_of(name)) if file_of else "the Hugging Face state dict")
            self._checked.add(name)
        return tensor

    def __iter__(self):
        return iter(self._hf)

    def __len__(self) -> int:
        return len(self._hf)

    def __contains__(self, name: object) -> bool:
        return name in self._hf


# ======================================================================================
# State-dict conversion
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
    _check_spec(spec)
    g = _hf_global(dims)
    check_hf_checkpoint(hf, dims)
    hf = _CheckedWeights(hf)
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
        n = _hf_layer(dims, i)
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
    _check_spec(spec)
    check_tensors(mcore, expected_mcore_shapes(dims, spec), f"megatron-core {dims.family}", ignore=("_extra_state",))
    g = _hf_global(dims)
    out: dict[str, torch.Tensor] = {
        g["embed"]: layout.unpad_vocab(mcore["embedding.word_embeddings.weight"], dims.vocab_size),
        g["final_norm"]: mcore["decoder.final_layernorm.weight"],
    }
    if not dims.tied:
        out[g["lm_head"]] = layout.unpad_vocab(mcore["output_layer.weight"], dims.vocab_size, "output_layer.weight")
    H, G, d = dims.num_attention_heads, dims.num_query_groups, dims.kv_channels
    for i in range(dims.num_layers):
        n = _hf_layer(dims, i)
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


# ======================================================================================
# Configs
def _fail(key: str, message: str, expected: object) -> ConversionError:
    return ConversionError(message, tensor=key, expected=expected)


def _rope_from_parameters(rope: Mapping[str, Any] | None, fallback_theta: float | None) -> tuple[float, float | None]:
    """(rope theta, llama3 scaling factor or None) from a ``rope_parameters`` dict."""
    rope = dict(rope or {})
    theta = rope.get("rope_theta", fallback_theta)
    if theta is None:
        raise _fail("rope_theta", "config has no rope_theta", "a float")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type == "llama3":
        wanted = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
        for key, value in wanted.items():
            if float(rope.get(key, value)) != float(value):
                raise _fail(
                    f"rope_scaling.{key}",
                    f"llama3 rope scaling with {key}={rope.get(key)} cannot be represented: "
                    f"megatron-core's RotaryEmbedding hard-codes {key}={value}",
                    value,
                )
        return float(theta), float(rope.get("factor", 8.0))
    raise _fail("rope_scaling", f"rope scaling type {rope_type!r} is not supported", ("default", "llama3"))


#: What each ``config.json`` key the converter reads must hold, per family group:
#: key -> (kind, what it is). Kinds: ``int`` (positive integer), ``int?`` (positive integer or
#: null), ``num`` (positive finite number), ``bool``, ``dict?`` (an object or null). Keys absent
#: from the file are not checked (``transformers`` fills its defaults; the required keys of the
#: remote-code families are in :data:`_REQUIRED_KEYS`).
_CONFIG_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "transformers": {
        "hidden_size": ("int", "the model width"),
        "intermediate_size": ("int", "the MLP width"),
        "num_hidden_layers": ("int", "the number of decoder layers"),
        "num_attention_heads": ("int", "the number of query heads"),
        "num_key_value_heads": ("int?", "the number of key/value heads"),
        "head_dim": ("int?", "the width of one attention head"),
        "vocab_size": ("int", "the rows of the embedding table"),
        "max_position_embeddings": ("int", "the longest sequence the model is configured for"),
        "rms_norm_eps": ("num", "the RMSNorm epsilon"),
        "rope_theta": ("num", "the RoPE base"),
        "rope_parameters": ("dict?", "the RoPE settings"),
        "rope_scaling": ("dict?", "the RoPE scaling settings"),
        "tie_word_embeddings": ("bool", "whether the output layer shares the embedding"),
        "attention_bias": ("bool", "whether the attention projections have biases"),
        "mlp_bias": ("bool", "whether the MLP projections have biases"),
        "num_experts": ("int", "the number of routed experts"),
        "num_local_experts": ("int", "the number of routed experts"),
        "num_experts_per_tok": ("int", "the experts chosen per token"),
        "moe_intermediate_size": ("int", "the width of one expert"),
        "decoder_sparse_step": ("int", "the MoE layer frequency"),
        "norm_topk_prob": ("bool", "whether the top-k router probabilities are renormalised"),
    },
    "llada": {
        "d_model": ("int", "the model width"),
        "n_layers": ("int", "the number of decoder layers"),
        "n_heads": ("int", "the number of query heads"),
        "n_kv_heads": ("int?", "the number of key/value heads"),
        "mlp_hidden_size": ("int?", "the MLP width"),
        "mlp_ratio": ("int?", "the MLP width as a multiple of d_model"),
        "vocab_size": ("int", "the tokenizer's vocabulary"),
        "embedding_size": ("int?", "the rows of the embedding table"),
        "max_sequence_length": ("int", "the longest sequence the model is configured for"),
        "rope_theta": ("num", "the RoPE base"),
        "rms_norm_eps": ("num", "the RMSNorm epsilon"),
        "weight_tying": ("bool", "whether the output layer shares the embedding"),
        "include_qkv_bias": ("bool", "whether q/k/v have biases"),
    },
    "dream": {
        "hidden_size": ("int", "the model width"),
        "intermediate_size": ("int", "the MLP width"),
        "num_hidden_layers": ("int", "the number of decoder layers"),
        "num_attention_heads": ("int", "the number of query heads"),
        "num_key_value_heads": ("int?", "the number of key/value heads"),
        "head_dim": ("int?", "the width of one attention head"),
        "vocab_size": ("int", "the rows of the embedding table"),
        "max_position_embeddings": ("int", "the longest sequence the model is configured for"),
        "rms_norm_eps": ("num", "the RMSNorm epsilon"),
        "rope_theta": ("num", "the RoPE base"),
        "rope_parameters": ("dict?", "the RoPE settings"),
        "tie_word_embeddings": ("bool", "whether the output layer shares the embedding"),
    },
}

#: MoE keys, checked for the MoE families only.
_MOE_KEYS = frozenset({"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                       "decoder_sparse_step", "norm_topk_prob"})

#: Keys the remote-code families' configs must have (they have no ``transformers`` defaults).
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "llada": ("d_model", "n_layers", "n_heads", "vocab_size"),
    "dream": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size"),
}

#: The ``config.json`` keys holding head counts, width and layers, per family group.
_SHAPE_KEYS: dict[str, dict[str, str]] = {
    "transformers": {"heads": "num_attention_heads", "groups": "num_key_value_heads", "hidden": "hidden_size",
                     "head_dim": "head_dim", "layers": "num_hidden_layers"},
    "llada": {"heads": "n_heads", "groups": "n_kv_heads", "hidden": "d_model", "head_dim": "", "layers": "n_layers"},
    "dream": {"heads": "num_attention_heads", "groups": "num_key_value_heads", "hidden": "hidden_size",
              "head_dim": "head_dim", "layers": "num_hidden_layers"},
}

_KIND_TEXT = {"int": "a positive integer", "int?": "a positive integer or null", "num": "a positive number",
              "bool": "true or false", "dict?": "an object or null"}


def _group(family: str) -> str:
    return family if family in ("llada", "dream") else "transformers"


def config_key(family: str, what: str) -> str:
    """The ``config.json`` key of ``family`` holding ``what`` (``"layers"``, ``"heads"``, ``"groups"``,
    ``"hidden"``, ``"head_dim"``), for messages."""
    return _SHAPE_KEYS[_group(family)][what]


def _value_ok(kind: str, value: Any) -> bool:
    if kind in ("int", "int?"):
        if value is None:
            return kind == "int?"
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if kind == "num":
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
                and value != float("inf"))
    if kind == "bool":
        return isinstance(value, bool)
    return value is None or isinstance(value, dict)


def check_hf_config(config: Any, family: str | None = None) -> None:
    """Refuse a ``config.json`` whose values the converter would misread or crash on.

    Checks the top level is an object, each key of :data:`_CONFIG_KEYS` present for the family
    has the right type and range (``hidden_size: "big"``, ``num_attention_heads: 0``,
    ``num_hidden_layers: 1e9``, ``head_dim: 0``, ``max_position_embeddings: -5`` are refused),
    the remote-code families' required keys are there, the key/value heads divide the query heads,
    and, without ``head_dim``, the heads divide the width.

    Args:
        config: the parsed ``config.json``.
        family: its dlmspec family (default: from ``model_type``).

    Raises:
        ConversionError: naming the key, its value, why and a value that works.
    """
    if not isinstance(config, Mapping):
        raise _fail("config.json", f"the top level is a {type(config).__name__}, expected a JSON object ({{...}}) "
                    "with model_type and the model's sizes. Fix: restore config.json from the original checkpoint",
                    "a JSON object")
    family = family or detect_family(config)
    group = _group(family)
    for key in _REQUIRED_KEYS.get(group, ()):
        if key not in config:
            kind, what = _CONFIG_KEYS[group][key]
            raise _fail(key, f"config.json has no {key} ({what}), which a {family} config needs. "
                        f"Fix: add {key} = {_KIND_TEXT[kind]}", _KIND_TEXT[kind])
    for key, (kind, what) in _CONFIG_KEYS[group].items():
        if key in _MOE_KEYS and family not in MOE_FAMILIES:
            continue
        if key in config and not _value_ok(kind, config[key]):
            value = config[key]
            hint = f"set {key} to the checkpoint's value ({_KIND_TEXT[kind]})"
            if kind.endswith("?"):
                hint += ", or remove it"
            why = "is not an integer" if kind.startswith("int") and isinstance(value, float) else f"must be {_KIND_TEXT[kind]}"
            raise _fail(key, f"{key} = {value!r} {why} ({what}). Fix: {hint}", _KIND_TEXT[kind])
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key) or {}
        for sub in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            if sub in rope and not _value_ok("num", rope[sub]):
                raise _fail(f"{key}.{sub}", f"{key}.{sub} = {rope[sub]!r} must be a positive number. "
                            f"Fix: restore {key} from the original checkpoint", "a positive number")
    names = _SHAPE_KEYS[group]
    heads = config.get(names["heads"])
    groups = config.get(names["groups"]) or heads
    if isinstance(heads, int) and isinstance(groups, int) and heads % groups:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise _fail(names["groups"], f"{names['groups']} = {groups} does not divide {names['heads']} = {heads} "
                    f"(each key/value head serves a whole group of query heads). Fix: one of "
                    f"{', '.join(map(str, divisors))}", divisors)
    hidden = config.get(names["hidden"])
    if (isinstance(hidden, int) and isinstance(heads, int) and hidden % heads
            and not (names["head_dim"] and config.get(names["head_dim"]))):
        raise _fail(names["hidden"], f"{names['hidden']} = {hidden} is not divisible by {names['heads']} = {heads} "
                    f"and the config sets no head width. Fix: set {names['head_dim'] or names['heads']} to the "
                    "checkpoint's value", "a multiple of the head count")


def dims_from_hf_config(
    config: Mapping[str, Any],
    *,
    make_vocab_size_divisible_by: int = 128,
    tp: int = 1,
    padded_vocab: int | None = None,
    source: str | None = None,
) -> ModelDims:
    """:class:`ModelDims` from a Hugging Face ``config.json`` dict.

    Args:
        config: the parsed ``config.json`` (checked first, :func:`check_hf_config`).
        make_vocab_size_divisible_by: Megatron's vocabulary padding multiple.
        tp: tensor-parallel size used for padding.
        padded_vocab: explicit padded vocabulary size (overrides the two above).
        source: the file ``config`` was read from; every message then starts with it.

    Returns:
        The dimensions; ``vocab_size`` is the HF table's row count (LLaDA:
        ``embedding_size`` when set).

    Raises:
        ConversionError: unknown family (``model_type``), a value of the wrong type or range
            (:func:`check_hf_config`), or a config feature megatron's GPT layout here cannot
            represent (named by key): biases on ``o_proj``/MLP, mixed dense/MoE layers,
            unsupported rope scaling, LLaDA non-llama blocks, etc.
    """
    try:
        check_hf_config(config)
        family = detect_family(config)
        if family in TRANSFORMERS_FAMILIES:
            fields = _fields_from_transformers(family, config)
        elif family == "llada":
            fields = _fields_from_llada(config)
        else:
            fields = _fields_from_dream(config)
        vocab = fields["vocab_size"]
        fields["padded_vocab_size"] = (
            padded_vocab if padded_vocab is not None else padded_vocab_size(vocab, make_vocab_size_divisible_by, tp)
        )
        return ModelDims(family=family, **fields)
    except ConversionError as exc:
        if source is None:
            raise
        raise ConversionError(f"{source}: {exc}", tensor=exc.tensor, expected=exc.expected) from None


def _transformers_config_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError]
    try:
        from huggingface_hub.errors import StrictDataclassError

        errors.append(StrictDataclassError)
    except ImportError:  # older huggingface_hub: transformers raises the built-in types above
        pass
    return tuple(errors)


#: What ``AutoConfig.for_model`` raises for values it refuses (after :func:`check_hf_config`).
_TRANSFORMERS_CONFIG_ERRORS = _transformers_config_errors()


def _fields_from_transformers(family: str, config: Mapping[str, Any]) -> dict[str, Any]:
    from transformers import AutoConfig

    cfg_dict = {k: v for k, v in config.items() if k not in ("model_type", "transformers_version")}
    try:
        cfg = AutoConfig.for_model(config["model_type"], **cfg_dict)
    except _TRANSFORMERS_CONFIG_ERRORS as exc:
        detail = " ".join(str(exc).split())
        raise _fail("config.json", f"transformers refuses it as a {family} config: {detail}. Fix: restore "
                    "config.json from the original checkpoint", "a config transformers loads") from None
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if getattr(cfg, "mlp_bias", False):
        raise _fail("mlp_bias", "mlp_bias=True is not supported (megatron add_bias_linear)", False)
    if family in ("llama", "qwen3", "qwen3_moe") and getattr(cfg, "attention_bias", False):
        raise _fail(
            "attention_bias",
            f"{family} with attention_bias=True has an o_proj bias; megatron add_qkv_bias covers q/k/v only",
            False,
        )
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise _fail("hidden_act", f"hidden_act={cfg.hidden_act!r} is not supported", "silu")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    theta, factor = _rope_from_parameters(rope, getattr(cfg, "rope_theta", None))
    fields: dict[str, Any] = dict(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        ffn_hidden_size=cfg.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=getattr(cfg, "num_key_value_heads", None) or heads,
        kv_channels=head_dim,
        vocab_size=cfg.vocab_size,
        tied=bool(cfg.tie_word_embeddings),
        qk_layernorm=family in ("qwen3", "qwen3_moe"),
        add_qkv_bias=family == "qwen2",
        rotary_base=theta,
        rope_scaling_factor=factor,
        norm_epsilon=float(cfg.rms_norm_eps),
        max_position_embeddings=int(cfg.max_position_embeddings),
    )
    if family == "qwen3_moe":
        if cfg.decoder_sparse_step != 1 or list(cfg.mlp_only_layers or []):
            raise _fail(
                "mlp_only_layers",
                f"qwen3_moe with dense layers (decoder_sparse_step={cfg.decoder_sparse_step}, "
                f"mlp_only_layers={cfg.mlp_only_layers}) is not supported; every layer must be MoE",
                "decoder_sparse_step=1, mlp_only_layers=[]",
            )
        fields.update(
            num_experts=cfg.num_experts,
            moe_ffn_hidden_size=cfg.moe_intermediate_size,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_router_norm_topk=bool(cfg.norm_topk_prob),
        )
    elif family == "mixtral":
        fields.update(
            num_experts=cfg.num_local_experts,
            moe_ffn_hidden_size=cfg.intermediate_size,
            moe_router_topk=cfg.num_experts_per_tok,
            moe_router_norm_topk=True,
        )
    return fields


def _fields_from_llada(config: Mapping[str, Any]) -> dict[str, Any]:
    must = {
        "block_type": "llama",
        "activation_type": "silu",
        "include_bias": False,
        "alibi": False,
        "rope": True,
        "attention_layer_norm": False,
        "input_emb_norm": False,
        "scale_logits": False,
        "layer_norm_type": "rms",
    }
    for key, value in must.items():
        if key in config and config[key] != value:
            raise _fail(key, f"LLaDA config {key}={config[key]!r} is not supported", value)
    heads = int(config["n_heads"])
    d_model = int(config["d_model"])
    mlp = config.get("mlp_hidden_size") or int(config.get("mlp_ratio", 4)) * d_model
    return dict(
        num_layers=int(config["n_layers"]),
        hidden_size=d_model,
        ffn_hidden_size=int(mlp),
        num_attention_heads=heads,
        num_query_groups=int(config.get("n_kv_heads") or heads),
        kv_channels=d_model // heads,
        vocab_size=int(config.get("embedding_size") or config["vocab_size"]),
        tied=bool(config.get("weight_tying", False)),
        add_qkv_bias=bool(config.get("include_qkv_bias", False)),
        rotary_base=float(config.get("rope_theta", 10000.0)),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-5)),
        max_position_embeddings=int(config.get("max_sequence_length", 4096)),
    )


def _fields_from_dream(config: Mapping[str, Any]) -> dict[str, Any]:
    if config.get("rope_scaling"):
        raise _fail("rope_scaling", f"Dream rope_scaling={config['rope_scaling']!r} is not supported", None)
    if config.get("hidden_act", "silu") != "silu":
        raise _fail("hidden_act", f"hidden_act={config['hidden_act']!r} is not supported", "silu")
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    rope = config.get("rope_parameters") or {}
    return dict(
        num_layers=int(config["num_hidden_layers"]),
        hidden_size=hidden,
        ffn_hidden_size=int(config["intermediate_size"]),
        num_attention_heads=heads,
        num_query_groups=int(config.get("num_key_value_heads") or heads),
        kv_channels=int(config.get("head_dim") or hidden // heads),
        vocab_size=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        add_qkv_bias=True,
        rotary_base=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
        norm_epsilon=float(config.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
    )


def hf_config_from_dims(dims: ModelDims, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A ``config.json`` dict for ``dims``.

    For families in ``transformers`` the dict comes from the family's config class
    (``AutoConfig.for_model(...).to_dict()``), so ``AutoModelForCausalLM.from_pretrained``
    loads it. LLaDA and Dream (remote-code models) get their own key sets. ``base`` (for
    example the source checkpoint's config) supplies everything the dimensions do not
    (token ids, ``auto_map``, ...); the dimensions always win.

    Raises:
        ConversionError: ``base`` belongs to another family, or ``transformers`` refuses its values.
    """
    base = dict(base or {})
    if base and detect_family(base) != dims.family:
        raise ConversionError(
            f"base config is {detect_family(base)!r}, dims are {dims.family!r}",
            tensor="model_type",
            expected=dims.family,
        )
    for key in ("transformers_version", "_name_or_path", "model_type"):
        base.pop(key, None)
    base["architectures"] = base.get("architectures") or [ARCHITECTURES[dims.family]]
    if dims.family == "llada":
        base.update(
            model_type="llada",
            d_model=dims.hidden_size,
            n_layers=dims.num_layers,
            n_heads=dims.num_attention_heads,
            n_kv_heads=dims.num_query_groups,
            mlp_hidden_size=dims.ffn_hidden_size,
            vocab_size=min(int(base.get("vocab_size", dims.vocab_size)), dims.vocab_size),
            embedding_size=dims.vocab_size,
            weight_tying=dims.tied,
            include_bias=False,
            include_qkv_bias=dims.add_qkv_bias,
            rope=True,
            rope_theta=dims.rotary_base,
            rms_norm_eps=dims.norm_epsilon,
            max_sequence_length=dims.max_position_embeddings,
            block_type="llama",
            activation_type="silu",
            layer_norm_type="rms",
        )
        return base
    if dims.family == "dream":
        base.update(
            model_type="Dream",
            hidden_size=dims.hidden_size,
            num_hidden_layers=dims.num_layers,
            num_attention_heads=dims.num_attention_heads,
            num_key_value_heads=dims.num_query_groups,
            intermediate_size=dims.ffn_hidden_size,
            vocab_size=dims.vocab_size,
            tie_word_embeddings=dims.tied,
            rope_theta=dims.rotary_base,
            rms_norm_eps=dims.norm_epsilon,
            max_position_embeddings=dims.max_position_embeddings,
            hidden_act="silu",
        )
        return base
    from transformers import AutoConfig

    for key in ("rope_parameters", "rope_scaling", "rope_theta"):
        base.pop(key, None)
    base.update(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.moe_ffn_hidden_size if dims.family == "mixtral" else dims.ffn_hidden_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_query_groups,
        head_dim=dims.kv_channels,
        tie_word_embeddings=dims.tied,
        rms_norm_eps=dims.norm_epsilon,
        max_position_embeddings=dims.max_position_embeddings,
        rope_theta=dims.rotary_base,
    )
    if dims.rope_scaling_factor is not None:
        base["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": dims.rope_scaling_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    if dims.family == "qwen3_moe":
        base.update(
            num_experts=dims.num_experts,
            moe_intermediate_size=dims.moe_ffn_hidden_size,
            num_experts_per_tok=dims.moe_router_topk,
            norm_topk_prob=dims.moe_router_norm_topk,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    elif dims.family == "mixtral":
        base.update(num_local_experts=dims.num_experts, num_experts_per_tok=dims.moe_router_topk)
    model_type = {"qwen3_moe": "qwen3_moe"}.get(dims.family, dims.family)
    try:
        return AutoConfig.for_model(model_type, **base).to_dict()
    except _TRANSFORMERS_CONFIG_ERRORS as exc:
        detail = " ".join(str(exc).split())
        raise _fail("hf_config", f"the base config.json does not load as a {dims.family} config: {detail}",
                    "a config transformers loads") from None

