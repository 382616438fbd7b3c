"""AR decoding of a megatron-core GPTModel with megatron-core's KV cache (backends/generate/models.py
``GPTKVCacheStep``): on a tiny CPU model in fp32 the cached decode gives exactly the tokens of the full
recompute (greedy and sampled, left-padded prompts), one prefill then one single-column call per token;
models the cache cannot decode are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from cpu_world_kit import megatron_cpu_world

VOCAB, EOS = 64, 62


def _model(attention: str, position_embedding_type: str = "rope", seed: int = 0):
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
    (model,) = build_model(
        config, layer_spec=build_layer_spec(attention=attention, qk_layernorm=True, use_transformer_engine=False),
        vocab_size=VOCAB, max_sequence_length=64, position_embedding_type=position_embedding_type,
    )
    return model.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield {"causal": _model("causal"), "learned": _model("causal", "learned_absolute", seed=1),
               "bidirectional": _model("bidirectional", seed=2)}


PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]


@pytest.mark.parametrize("which", ["causal", "learned"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_decode_gives_the_tokens_of_the_full_recompute(world, which, temperature):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.models import GPTKVCacheStep, gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate_ar

    model = world[which]
    config = GenerateConfig(kind="ar", gen_length=12, temperature=temperature, seed=3)
    full = generate_ar(gpt_logits_fn(model), PROMPTS, config)
    step = GPTKVCacheStep(model, max_new_tokens=config.gen_length)
    cached = generate_ar(None, PROMPTS, config, step_fn=step)
    assert cached.generated == full.generated
    assert torch.equal(cached.sequences, full.sequences)
    assert (step.full_calls, step.incremental_calls) == (1, config.gen_length - 1)
    # the attention modes are restored after every single-column call
    assert all(core.mode == "causal" for core in step._cores)


def test_cached_logits_match_the_full_forward_and_a_new_batch_starts_over(world):
    from dlmspec.backends.generate.models import GPTKVCacheStep, gpt_logits_fn
    from dlmspec.backends.generate.sampler import full_recompute, left_pad

    model = world["causal"]
    tokens, mask, _ = left_pad(PROMPTS, 0)
    step, full = GPTKVCacheStep(model, max_new_tokens=2), full_recompute(gpt_logits_fn(model))
    for extra in ([20, 21, 22], [23, 24, 25], [26, 27, 28]):  # the third column overflows the context: starts over
        assert torch.allclose(step(tokens, mask), full(tokens, mask), atol=1e-5)
        tokens = torch.cat([tokens, torch.tensor(extra).unsqueeze(1)], dim=1)
        mask = torch.cat([mask, torch.ones(3, 1, dtype=torch.bool)], dim=1)
    assert torch.allclose(step(tokens, mask), full(tokens, mask), atol=1e-5)
    assert (step.full_calls, step.incremental_calls) == (2, 2)
    # another batch (one row) starts over too
    assert torch.allclose(step(tokens[:1, 3:], None), full(tokens[:1, 3:], None), atol=1e-5)
    assert step.full_calls == 3


def test_a_bidirectional_model_is_refused_with_the_reason(world):
    from dlmspec.backends.generate.models import GPTKVCacheStep, kv_cache_unsupported

    assert kv_cache_unsupported(world["causal"]) is None
    why = kv_cache_unsupported(world["bidirectional"])
    assert why is not None and "bidirectional" in why
    with pytest.raises(ValueError, match="full_recompute"):
        GPTKVCacheStep(world["bidirectional"])

