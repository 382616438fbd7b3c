"""Tiny randomly initialised Hugging Face checkpoints for every family (tests and benches).

Families in ``transformers`` are real ``*ForCausalLM`` models saved with
``save_pretrained``. LLaDA and Dream are remote-code models, so their checkpoints are built
from a same-math ``transformers`` model (Llama for LLaDA, Qwen2 for Dream) whose weights are
renamed to LLaDA-8B's own module names by the table below (written independently of
:mod:`dlmspec.backends.convert.families`) and saved with their own ``config.json`` keys. The returned
reference model computes the logits the converted checkpoint must reproduce (causal
attention).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from dlmspec.backends.convert.errors import ConversionError

_BASE = dict(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)

#: Per family: (transformers model type used to build it, config overrides).
TINY_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", dict(rope_theta=500000.0)),
    "mistral": ("mistral", dict(num_key_value_heads=1, head_dim=16, rope_theta=1e6)),
    "qwen2": ("qwen2", dict(num_key_value_heads=4, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen3": ("qwen3", dict(head_dim=24, rope_theta=1e6)),
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48)),
    "llada": ("llama", dict(num_key_value_heads=4, rope_theta=500000.0, rms_norm_eps=1e-5)),
    "dream": ("qwen2", dict(rope_theta=1e6)),
}


def llada_name(llama_name: str) -> str:
    """LLaDA-8B's module name for a ``LlamaForCausalLM`` parameter name."""
    table = {
        "model.embed_tokens.weight": "model.transformer.wte.weight",
        "model.norm.weight": "model.transformer.ln_f.weight",
        "lm_head.weight": "model.transformer.ff_out.weight",
    }
    if llama_name in table:
        return table[llama_name]
    layer = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "q_proj",
        "self_attn.k_proj": "k_proj",
        "self_attn.v_proj": "v_proj",
        "self_attn.o_proj": "attn_out",
        "post_attention_layernorm": "ff_norm",
        "mlp.gate_proj": "ff_proj",
        "mlp.up_proj": "up_proj",
        "mlp.down_proj": "ff_out",
    }
    _, _, idx, rest = llama_name.split(".", 3)
    module, param = rest.rsplit(".", 1)
    return f"model.transformer.blocks.{idx}.{layer[module]}.{param}"


def _randomise(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.08 * noise)


def make_tiny_hf(
    family: str, dst: str | os.PathLike[str], *, seed: int = 0, **overrides: Any
) -> tuple[Path, torch.nn.Module]:
    """Write a tiny random checkpoint of ``family`` to ``dst``.

    Args:
        family: a dlmspec family.
        dst: directory to create.
        seed: parameter RNG seed (every parameter, norms included, is random).
        overrides: config keys to change (transformers names, e.g. ``tie_word_embeddings``).

    Returns:
        ``(dst, reference)`` where ``reference`` is the fp32 ``transformers`` model holding the
        same weights (Llama for LLaDA, Qwen2 for Dream).

    Raises:
        ConversionError: unknown family.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    if family not in TINY_CONFIGS:
        raise ConversionError(f"unknown model family {family!r}", tensor="family", expected=sorted(TINY_CONFIGS))
    model_type, extra = TINY_CONFIGS[family]
    kwargs = {**_BASE, **extra, **overrides}
    config = AutoConfig.for_model(model_type, **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomise(model, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    dst = Path(dst)
    if family not in ("llada", "dream"):
        model.save_pretrained(dst)
        return dst, model
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    if family == "llada":
        state = {llada_name(k): v for k, v in state.items()}
        cfg = {
            "model_type": "llada", "architectures": ["LLaDAModelLM"],
            "d_model": config.hidden_size, "n_layers": config.num_hidden_layers,
            "n_heads": config.num_attention_heads, "n_kv_heads": config.num_key_value_heads,
            "mlp_hidden_size": config.intermediate_size, "vocab_size": config.vocab_size,
            "embedding_size": config.vocab_size, "weight_tying": bool(config.tie_word_embeddings),
            "rope_theta": config.rope_parameters["rope_theta"], "rms_norm_eps": config.rms_norm_eps,
            "max_sequence_length": config.max_position_embeddings, "include_bias": False,
            "include_qkv_bias": False, "activation_type": "silu", "block_type": "llama",
            "layer_norm_type": "rms", "rope": True, "alibi": False, "attention_layer_norm": False,
            "mask_token_id": config.vocab_size - 1,
        }
    else:
        cfg = {
            "model_type": "Dream", "architectures": ["DreamModel"],
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
            "tie_word_embeddings": bool(config.tie_word_embeddings),
            "rope_theta": config.rope_parameters["rope_theta"], "rms_norm_eps": config.rms_norm_eps,
            "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
            "mask_token_id": config.vocab_size - 1,
        }
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return dst, model
