"""Model presets: published architectures with their real dimensions.

Each preset is the ``[model]`` table a user would otherwise write by hand, with the keys of
:class:`dlmspec.spec.models.ModelSpec` (Megatron-LM's argument names). Explicit keys in a spec
override the preset's. ``PUBLISHED`` holds the parameter counts the authors publish, with
their source, so ``tests/unit/spec/test_presets.py`` can check our parameter counter against them.

Sources are the models' ``config.json`` files on the Hugging Face hub (and their papers);
the dict keys below are the ``config.json`` values renamed to Megatron's names:
``num_hidden_layers -> num_layers``, ``intermediate_size -> ffn_hidden_size``,
``num_key_value_heads -> num_query_groups``, ``head_dim -> kv_channels``,
``rope_theta -> rotary_base``, ``rms_norm_eps -> layernorm_epsilon``,
``tie_word_embeddings -> not untie_embeddings_and_output_weights``.
"""

from __future__ import annotations

from typing import Any

_QWEN3_COMMON: dict[str, Any] = {
    "kv_channels": 128,
    "vocab_size": 151936,
    "normalization": "RMSNorm",
    "layernorm_epsilon": 1e-6,
    "activation": "swiglu",
    "qk_layernorm": True,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "position_embedding_type": "rope",
    "rotary_base": 1_000_000,
    "max_position_embeddings": 40960,
}

_LLAMA3_COMMON: dict[str, Any] = {
    "vocab_size": 128256,
    "normalization": "RMSNorm",
    "layernorm_epsilon": 1e-5,
    "activation": "swiglu",
    "qk_layernorm": False,
    "add_bias_linear": False,
    "add_qkv_bias": False,
    "position_embedding_type": "rope",
    "rotary_base": 500_000,
    "max_position_embeddings": 8192,
    "untie_embeddings_and_output_weights": True,
}

_QWEN25_7B: dict[str, Any] = {
    "num_layers": 28,
    "hidden_size": 3584,
    "ffn_hidden_size": 18944,
    "num_attention_heads": 28,
    "num_query_groups": 4,
    "kv_channels": 128,
    "vocab_size": 152064,
    "normalization": "RMSNorm",
    "layernorm_epsilon": 1e-6,
    "activation": "swiglu",
    "qk_layernorm": False,
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "position_embedding_type": "rope",
    "rotary_base": 1_000_000,
    "max_position_embeddings": 131072,
    "untie_embeddings_and_output_weights": True,
}

#: Preset id -> ``[model]`` keys. Ids are lowercase, as users type them.
PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {
        **_QWEN3_COMMON,
        "num_layers": 28,
        "hidden_size": 1024,
        "ffn_hidden_size": 3072,
        "num_attention_heads": 16,
        "num_query_groups": 8,
        "untie_embeddings_and_output_weights": False,
    },
    "qwen3-1.7b": {
        **_QWEN3_COMMON,
        "num_layers": 28,
        "hidden_size": 2048,
        "ffn_hidden_size": 6144,
        "num_attention_heads": 16,
        "num_query_groups": 8,
        "untie_embeddings_and_output_weights": False,
    },
    "qwen3-8b": {
        **_QWEN3_COMMON,
        "num_layers": 36,
        "hidden_size": 4096,
        "ffn_hidden_size": 12288,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "untie_embeddings_and_output_weights": True,
    },
    "qwen2.5-7b": dict(_QWEN25_7B),
    "llama-3-8b": {
        **_LLAMA3_COMMON,
        "num_layers": 32,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_query_groups": 8,
    },
    "llama-3-70b": {
        **_LLAMA3_COMMON,
        "num_layers": 80,
        "hidden_size": 8192,
        "ffn_hidden_size": 28672,
        "num_attention_heads": 64,
        "num_query_groups": 8,
    },
    # LLaDA-8B (Nie et al. 2025, GSAI-ML/LLaDA-8B-Base config.json): Llama-like, MHA, mask id 126336.
    "llada-8b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "ffn_hidden_size": 12288,
        "num_attention_heads": 32,
        "num_query_groups": 32,
        "vocab_size": 126464,
        "normalization": "RMSNorm",
        "layernorm_epsilon": 1e-5,
        "activation": "swiglu",
        "qk_layernorm": False,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "position_embedding_type": "rope",
        "rotary_base": 500_000,
        "max_position_embeddings": 4096,
        "untie_embeddings_and_output_weights": True,
    },
    # Dream-7B (Ye et al. 2025): Qwen2.5-7B weights adapted to masked diffusion; mask id 151666.
    "dream-7b": dict(_QWEN25_7B),
    "mixtral-8x7b": {
        "num_layers": 32,
        "hidden_size": 4096,
        "ffn_hidden_size": 14336,
        "num_attention_heads": 32,
        "num_query_groups": 8,
        "vocab_size": 32000,
        "normalization": "RMSNorm",
        "layernorm_epsilon": 1e-5,
        "activation": "swiglu",
        "qk_layernorm": False,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "position_embedding_type": "rope",
        "rotary_base": 1_000_000,
        "max_position_embeddings": 32768,
        "untie_embeddings_and_output_weights": True,
        "num_experts": 8,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 14336,
    },
    "qwen3-30b-a3b": {
        **_QWEN3_COMMON,
        "num_layers": 48,
        "hidden_size": 2048,
        "ffn_hidden_size": 6144,
        "num_attention_heads": 32,
        "num_query_groups": 4,
        "untie_embeddings_and_output_weights": True,
        "num_experts": 128,
        "moe_router_topk": 8,
        "moe_ffn_hidden_size": 768,
    },
    # MegaDLMs' examples/dlm_training/dlm_pretrain_1.7b.sh: Qwen3-1.7B shape, MHA, GPT-NeoX
    # tokenizer (vocab 50289, mask id 50277), rope base 10000, untied embeddings.
    "megadlms-1.7b": {
        "num_layers": 28,
        "hidden_size": 2048,
        "ffn_hidden_size": 6144,
        "num_attention_heads": 16,
        "num_query_groups": 16,
        "kv_channels": 128,
        "vocab_size": 50289,
        "normalization": "RMSNorm",
        "layernorm_epsilon": 1e-6,
        "activation": "swiglu",
        "qk_layernorm": True,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "position_embedding_type": "rope",
        "rotary_base": 10_000,
        "max_position_embeddings": 2048,
        "untie_embeddings_and_output_weights": True,
    },
}

#: Mask token ids the published diffusion models use (``[objective] mask_token_id`` default).
MASK_TOKEN_IDS: dict[str, int] = {
    "llada-8b": 126336,
    "dream-7b": 151666,
    "megadlms-1.7b": 50277,
}

#: Published parameter counts: ``(total, active, source)``. A string keeps the published
#: rounding ("1.7B" means anything that rounds to it); an int is an exact published count.
PUBLISHED: dict[str, tuple[int | str, int | str, str]] = {
    "qwen3-0.6b": ("0.6B", "0.6B", "Qwen3-0.6B model card: 0.6B parameters (0.44B non-embedding)"),
    "qwen3-1.7b": ("1.7B", "1.7B", "Qwen3-1.7B model card: 1.7B parameters (1.4B non-embedding)"),
    "qwen3-8b": ("8.2B", "8.2B", "Qwen3-8B model card: 8.2B parameters"),
    "qwen2.5-7b": (7_615_616_512, 7_615_616_512, "Qwen2.5-7B safetensors index: 7.61B"),
    "llama-3-8b": (8_030_261_248, 8_030_261_248, "Meta-Llama-3-8B safetensors: 8,030,261,248"),
    "llama-3-70b": (70_553_706_496, 70_553_706_496, "Meta-Llama-3-70B safetensors: 70,553,706,496"),
    "llada-8b": ("8.02B", "8.02B", "LLaDA-8B-Base on the hub: 8.02B parameters"),
    "dream-7b": ("7.62B", "7.62B", "Dream-v0-Base-7B on the hub: 7.62B parameters"),
    "mixtral-8x7b": ("46.7B", "12.9B", "Mixtral of Experts (Jiang et al. 2024): 46.7B total, 12.9B active"),
    "qwen3-30b-a3b": ("30.5B", "3.3B", "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "megadlms-1.7b": ("1.7B", "1.7B", "MegaDLMs dlm_pretrain_1.7b.sh: a 1.7B DLM"),
}


def preset_names() -> list[str]:
    """All preset ids, sorted."""
    return sorted(PRESETS)


def get_preset(name: str) -> dict[str, Any]:
    """Return a copy of preset ``name``'s ``[model]`` keys.

    Raises:
        KeyError: ``name`` is not a preset id (see :func:`preset_names`).
    """
    return dict(PRESETS[name])
