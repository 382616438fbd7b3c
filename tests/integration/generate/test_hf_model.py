"""A transformers model under the sampler (backends/generate/hf_model.py): AR decoding with its KV
cache gives the tokens full recomputation gives, on left-padded prompts of different lengths, with
one prefill and one single-column forward per later token; a diffusion LM's config refuses the cache."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dlmspec.backends.generate.config import GenerateConfig  # noqa: E402
from dlmspec.backends.generate.hf_model import HFKVCacheStep, hf_logits_fn  # noqa: E402
from dlmspec.backends.generate.sampler import full_recompute, generate_ar  # noqa: E402


def _model(**overrides):
    config = transformers.AutoConfig.for_model("llama", vocab_size=40, hidden_size=32, intermediate_size=48,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=64, **overrides)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # logits far from uniform, so argmax ties cannot hide a difference
    return model


def test_the_kv_cache_decodes_what_full_recompute_decodes() -> None:
    model = _model()
    prompts = [[3, 4, 5, 6], [7, 8]]
    config = GenerateConfig(kind="ar", gen_length=6, pad_token_id=0)
    step = HFKVCacheStep(model)
    cached = generate_ar(None, prompts, config, step_fn=step)
    full = generate_ar(None, prompts, config, step_fn=full_recompute(hf_logits_fn(model)))
    assert cached.generated == full.generated
    assert (step.full_calls, step.incremental_calls) == (1, 5)
    # each row as it would decode alone (left padding hidden, positions from 0)
    alone = generate_ar(None, [prompts[1]], config, step_fn=HFKVCacheStep(model))
    assert alone.generated[0] == cached.generated[1]
    # sampled decoding: same draws from the same seed
    sampled = GenerateConfig(kind="ar", gen_length=6, temperature=1.0, seed=5)
    assert (generate_ar(None, prompts, sampled, step_fn=HFKVCacheStep(model)).generated
            == generate_ar(None, prompts, sampled, step_fn=full_recompute(hf_logits_fn(model))).generated)


def test_a_reused_step_starts_over_on_a_new_sequence() -> None:
    model = _model()
    step = HFKVCacheStep(model)
    config = GenerateConfig(kind="ar", gen_length=3)
    first = generate_ar(None, [[1, 2, 3]], config, step_fn=step)
    again = generate_ar(None, [[1, 2, 3]], config, step_fn=step)
    assert first.generated == again.generated and step.full_calls == 2


def test_a_diffusion_lm_refuses_the_cache() -> None:
    with pytest.raises(ValueError, match="is_causal = false"):
        HFKVCacheStep(_model(is_causal=False))
