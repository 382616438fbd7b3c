"""Parameter counts of a megatron-core GPTModel, from its dimensions alone.

Counts follow the modules megatron-core builds (``megatron.core.models.gpt.GPTModel`` with
``TransformerLayer``: ``linear_qkv``, ``linear_proj``, ``q_layernorm``/``k_layernorm``,
``mlp.linear_fc1``/``linear_fc2`` or ``MoELayer`` with ``router`` and experts), so they equal
``sum(p.numel() for p in model.parameters())`` of the built model when ``vocab_size`` is the
padded one. Published figures use the tokenizer's vocabulary, so :func:`count_parameters`
takes the vocabulary to count with as an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dlmspec.spec.models import ModelSpec


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts (number of scalars, not bytes).

    Attributes:
        total: every parameter (tied embeddings counted once).
        active: parameters one token passes through (MoE: top-k routed experts plus shared).
        embedding: input embedding (+ untied output layer, + learned positions).
        dense_layer: one dense transformer layer.
        moe_layer: one MoE transformer layer, all experts (0 for dense models).
        expert: one routed expert's MLP (0 for dense models).
        num_moe_layers: how many layers are MoE.
    """

    total: int
    active: int
    embedding: int
    dense_layer: int
    moe_layer: int
    expert: int
    num_moe_layers: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


def moe_layer_pattern(model: ModelSpec) -> list[int]:
    """1 for each MoE layer, 0 for each dense one (megatron-core ``moe_layer_freq`` semantics:
    an int N means layers 0, N, 2N, ... are MoE; a list gives the pattern)."""
    if model.num_experts is None:
        return [0] * model.num_layers
    freq = model.moe_layer_freq
    if isinstance(freq, list):
        return list(freq)
    return [1 if i % freq == 0 else 0 for i in range(model.num_layers)]


def _norm(model: ModelSpec, width: int) -> int:
    return width * (2 if model.normalization == "LayerNorm" else 1)


def mlp_params(model: ModelSpec, ffn: int) -> int:
    """One MLP (``linear_fc1`` + ``linear_fc2``): gated activations fuse gate and up into
    ``linear_fc1`` of shape ``[2*ffn, hidden]``."""
    gated = model.activation in ("swiglu", "geglu")
    fc1 = model.hidden_size * ffn * (2 if gated else 1)
    fc2 = ffn * model.hidden_size
    bias = (ffn * (2 if gated else 1) + model.hidden_size) if model.add_bias_linear else 0
    return fc1 + fc2 + bias


def attention_params(model: ModelSpec) -> int:
    """``linear_qkv`` ``[(heads + 2*groups) * kv, hidden]`` + ``linear_proj``
    ``[hidden, heads * kv]`` + q/k norms over ``kv`` + biases."""
    kv = model.kv_channels or model.hidden_size // model.num_attention_heads
    groups = model.num_query_groups or model.num_attention_heads
    qkv_out = (model.num_attention_heads + 2 * groups) * kv
    params = model.hidden_size * qkv_out + model.num_attention_heads * kv * model.hidden_size
    if model.add_qkv_bias or model.add_bias_linear:
        params += qkv_out
    if model.add_bias_linear:
        params += model.hidden_size
    if model.qk_layernorm:
        params += 2 * _norm(model, kv)
    return params


def count_parameters(model: ModelSpec, vocab_size: int | None = None) -> ParamCounts:
    """Count parameters of the model described by ``model``.

    Args:
        model: the (preset-filled) model spec.
        vocab_size: vocabulary to count embeddings with; default ``model.vocab_size``
            (pass the padded size to match the built megatron-core model).
    """
    vocab = vocab_size or model.vocab_size
    h = model.hidden_size
    layer_norms = 2 * _norm(model, h)  # input_layernorm + pre_mlp_layernorm
    attn = attention_params(model)
    dense_layer = attn + layer_norms + mlp_params(model, model.ffn_hidden_size)
    pattern = moe_layer_pattern(model)
    num_moe = sum(pattern)
    expert = moe_layer = shared = 0
    topk = 0
    if model.num_experts:
        expert = mlp_params(model, model.moe_ffn_hidden_size or model.ffn_hidden_size)
        shared = (
            mlp_params(model, model.moe_shared_expert_intermediate_size)
            if model.moe_shared_expert_intermediate_size
            else 0
        )
        router = model.num_experts * h
        moe_layer = attn + layer_norms + router + model.num_experts * expert + shared
        topk = model.moe_router_topk
    embedding = vocab * h
    if model.untie_embeddings_and_output_weights:
        embedding += vocab * h
    if model.position_embedding_type == "learned_absolute":
        embedding += model.max_position_embeddings * h
    final_norm = _norm(model, h)
    num_dense = model.num_layers - num_moe
    total = embedding + final_norm + num_dense * dense_layer + num_moe * moe_layer
    active = total - num_moe * (model.num_experts - topk) * expert if model.num_experts else total
    return ParamCounts(
        total=total,
        active=active,
        embedding=embedding,
        dense_layer=dense_layer,
        moe_layer=moe_layer,
        expert=expert,
        num_moe_layers=num_moe,
    )
