"""One megatron-core ``TransformerConfig`` from a model record, for inference and conversion.

A *record* is the flat ``{"model.hidden_size": 768, ...}`` dict a runtime checkpoint holds (the
spec record of ``dlmspec.json``, :mod:`dlmspec.backends.megatron.spec_record`), or the one
:func:`record_from_dims` derives from a converted model's :class:`~dlmspec.backends.convert.dims.ModelDims`.
:func:`transformer_config_from_record` builds the config both ``generate`` / ``eval``
(:mod:`dlmspec.backends.generate.load`) and ``convert`` (:mod:`dlmspec.backends.convert.mcore_model`)
run: the model's shape as train.py's ``build_configs`` writes it (templates/train.py.j2), with no
dropout and no fusion that needs CUDA kernels, so logits compare across devices.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch

from dlmspec import objectives
from dlmspec.names import AR

#: ``[precision] dtype`` -> the parameters' torch dtype.
PARAMS_DTYPES: Dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class RecordValueError(ValueError):
    """A record value no config can be built from.

    Attributes:
        key: the record key (``"model.activation"``).
        why: what is wrong with its value.
        fix: what would work.
    """

    def __init__(self, key: str, why: str, fix: str) -> None:
        super().__init__(f"{key}: {why}; {fix}")
        self.key, self.why, self.fix = key, why, fix


def activation_func(name: str) -> Any:
    """The activation function of ``model.activation`` as the record spells it (``silu``: SwiGLU
    with ``gated_linear_unit``, ``gelu``, ``relu``, ``squared_relu``).

    Raises:
        RecordValueError: another name.
    """
    import torch.nn.functional as F

    if name == "squared_relu":
        from megatron.core.activations import squared_relu

        return squared_relu
    table = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}
    if name not in table:
        raise RecordValueError("model.activation", f"the record's activation function {name!r} is not known to the loader",
                               "one of silu (swiglu), gelu, relu, squared_relu")
    return table[name]


def record_from_dims(dims: Any, kind: str = AR, mask_token_id: Optional[int] = None,
                     eos: Optional[int] = None) -> Dict[str, Any]:
    """The record of a converted model (``ModelDims``): the Hugging Face families' shape
    (RMSNorm, SwiGLU, no linear biases except optional q/k/v biases, RoPE), sampled as ``kind``
    with the default attention its registration names (:mod:`dlmspec.objectives`). MoE routers keep their order of
    top-k and softmax (``model.moe_router_pre_softmax``: softmax first when the top-k
    probabilities are not renormalised)."""
    moe = bool(dims.num_experts)
    return {
        "objective.kind": kind, "objective.mask_token_id": mask_token_id,
        "objective.attention_mask": objectives.get(kind).attention, "objective.block_size": None,
        "model.family": dims.family, "model.num_layers": dims.num_layers, "model.hidden_size": dims.hidden_size,
        "model.ffn_hidden_size": dims.ffn_hidden_size, "model.num_attention_heads": dims.num_attention_heads,
        "model.num_query_groups": dims.num_query_groups, "model.kv_channels": dims.kv_channels,
        "model.normalization": "RMSNorm", "model.activation": "silu", "model.gated_linear_unit": True,
        "model.add_bias_linear": False, "model.add_qkv_bias": dims.add_qkv_bias, "model.qk_layernorm": dims.qk_layernorm,
        "model.num_experts": dims.num_experts or 0, "model.moe_ffn_hidden_size": dims.moe_ffn_hidden_size or None,
        "model.moe_router_topk": dims.moe_router_topk or None,
        "model.moe_router_pre_softmax": (not dims.moe_router_norm_topk) if moe else None,
        "model.moe_shared_expert_intermediate_size": (dims.shared_expert_ffn_hidden_size or None) if moe else None,
        "model.vocab_size": dims.vocab_size,
        "model.padded_vocab_size": dims.padded_vocab_size, "model.position_embedding_type": "rope",
        "model.untie_embeddings_and_output_weights": not dims.tied,
        "model.max_position_embeddings": dims.max_position_embeddings, "model.rotary_base": dims.rotary_base,
        "model.rotary_percent": 1.0, "model.layernorm_epsilon": dims.norm_epsilon, "data.eod_id": eos,
    }


def transformer_config_kwargs_from_record(record: Dict[str, Any], *, tp: int = 1,
                                          params_dtype: torch.dtype = torch.float32, cpu: bool = True,
                                          moe_token_dispatcher: Optional[str] = None) -> Dict[str, Any]:
    """Keyword arguments of ``TransformerConfig`` for ``record``.

    Args:
        record: the model record (keys ``model.*``).
        tp: tensor-parallel size (pipeline parallelism is 1).
        params_dtype: parameter dtype (bf16 / fp16 switch with it).
        cpu: build parameters on CPU (``use_cpu_initialization``).
        moe_token_dispatcher: megatron-core's MoE token dispatcher; default ``"allgather"`` on CPU
            (it creates no CUDA streams), ``"alltoall"`` on GPUs.

    Raises:
        RecordValueError: an activation the loader does not know.
        KeyError: a required ``model.*`` key is missing.
    """
    r = record
    kw: Dict[str, Any] = dict(
        num_layers=r["model.num_layers"], hidden_size=r["model.hidden_size"],
        # an all-MoE model (no dense FFN) gives its expert FFN size
        ffn_hidden_size=r["model.ffn_hidden_size"] or r.get("model.moe_ffn_hidden_size"),
        num_attention_heads=r["model.num_attention_heads"],
        num_query_groups=r["model.num_query_groups"], kv_channels=r["model.kv_channels"],
        normalization=r["model.normalization"], layernorm_epsilon=r.get("model.layernorm_epsilon") or 1e-5,
        gated_linear_unit=bool(r["model.gated_linear_unit"]), activation_func=activation_func(r["model.activation"]),
        add_bias_linear=bool(r["model.add_bias_linear"]), add_qkv_bias=bool(r["model.add_qkv_bias"]),
        qk_layernorm=bool(r["model.qk_layernorm"]), hidden_dropout=0.0, attention_dropout=0.0,
        bf16=params_dtype == torch.bfloat16, fp16=params_dtype == torch.float16, params_dtype=params_dtype,
        pipeline_dtype=params_dtype, tensor_model_parallel_size=tp, pipeline_model_parallel_size=1,
        use_cpu_initialization=cpu, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    if r.get("model.num_experts"):
        kw.update(num_moe_experts=r["model.num_experts"], moe_ffn_hidden_size=r["model.moe_ffn_hidden_size"],
                  moe_router_topk=r["model.moe_router_topk"], moe_layer_freq=r.get("model.moe_layer_freq") or 1,
                  moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                  moe_token_dispatcher_type=moe_token_dispatcher or ("allgather" if cpu else "alltoall"))
        if r.get("model.moe_shared_expert_intermediate_size"):
            kw["moe_shared_expert_intermediate_size"] = r["model.moe_shared_expert_intermediate_size"]
        if r.get("model.moe_router_pre_softmax") is not None:
            kw["moe_router_pre_softmax"] = bool(r["model.moe_router_pre_softmax"])
    return kw


def transformer_config_from_record(record: Dict[str, Any], **options: Any) -> Any:
    """megatron-core's ``TransformerConfig`` for ``record`` (options: those of
    :func:`transformer_config_kwargs_from_record`).

    Raises:
        RecordValueError, KeyError: as :func:`transformer_config_kwargs_from_record`; megatron-core's
            own ``ValueError`` / ``AssertionError`` for sizes it refuses.
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(**transformer_config_kwargs_from_record(record, **options))
