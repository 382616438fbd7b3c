"""Tiny megatron-core GPTModels on CPU for the block-cache tests (local layer spec, fp32)."""

from __future__ import annotations

from typing import Optional

import torch

VOCAB, MASK, EOS = 64, 63, 62


def tiny_gpt(attention: str, *, block_size: Optional[int] = None, position: str = "rope", seed: int = 0):
    """A 2-layer ``GPTModel`` (GQA, qk-norm, RMSNorm) in eval mode; needs ``megatron_cpu_world``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
        kv_channels=8, normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
    )
    spec = build_layer_spec(attention=attention, block_size=block_size, qk_layernorm=True, use_transformer_engine=False)
    (model,) = build_model(config, layer_spec=spec, vocab_size=VOCAB, max_sequence_length=64,
                           position_embedding_type=position)
    return model.eval()


def plain(logits_fn):
    """``logits_fn`` without its block path: the sampler runs the whole canvas through it (no cache)."""
    return lambda tokens, attention_mask=None: logits_fn(tokens, attention_mask)
