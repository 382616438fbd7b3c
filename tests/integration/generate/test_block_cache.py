"""Block KV caches of semi-autoregressive decoding on megatron-core GPTModels (backends/generate/block_cache.py):
on causal and block-causal models every cache gives exactly the no-cache tokens; at ``cache_refresh = 1`` on
any model too; the cached keys and values equal those of a full forward at each refresh; batched prompts of
different lengths decode as one at a time; the output layer runs on the current block's columns only; a
model the cache cannot run falls back to no cache with the reason recorded."""

from __future__ import annotations

import pytest
import torch

from block_cache_kit import EOS, MASK, VOCAB, plain, tiny_gpt
from cpu_world_kit import megatron_cpu_world

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]  # P = 8: on the blocks of 4


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield {
            "causal": tiny_gpt("causal"),
            "causal-learned": tiny_gpt("causal", position="learned_absolute", seed=1),
            "block_causal": tiny_gpt("block_causal", block_size=4, seed=2),
            "bidirectional": tiny_gpt("bidirectional", seed=3),
        }


def _config(**kw):
    from dlmspec.backends.generate.config import GenerateConfig

    base = dict(gen_length=16, steps=8, block_length=4, mask_token_id=MASK, temperature=0.0)
    base.update(kw)
    return GenerateConfig(**base)


@pytest.mark.parametrize("which", ["causal", "causal-learned", "block_causal"])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("remasking", ["low_confidence", "threshold", "factor"])
def test_every_cache_gives_the_no_cache_tokens_on_causal_and_block_causal_models(world, which, cache, remasking):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world[which])
    kw = dict(remasking=remasking, threshold=0.3, factor=2.0)
    reference = generate(plain(fn), PROMPTS, _config(**kw))
    out = generate(fn, PROMPTS, _config(cache=cache, **kw))
    assert out.cache == cache and out.cache_fallback is None
    assert out.config["cache"] == cache and out.config["cache_refresh"] is None
    assert torch.equal(out.sequences, reference.sequences)
    assert out.forward_passes == reference.forward_passes
    assert out.forward_passes_per_row == reference.forward_passes_per_row


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_steps_use_the_cache_between_refreshes(world, cache):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world["causal"])
    made = []

    def factory(config):
        block_fn, why = fn.block_logits(config)
        made.append(block_fn)
        return block_fn, why

    wrapped = plain(fn)
    wrapped.block_logits = factory
    config = _config(cache=cache, cache_refresh=3)  # 2 steps a block: refresh at step 0 only
    generate(wrapped, PROMPTS, config)
    (block_fn,) = made
    assert isinstance(block_fn, GPTBlockLogits)
    assert (block_fn.refreshes, block_fn.cached_steps) == (4, 4)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_refresh_every_step_gives_the_no_cache_tokens_on_a_bidirectional_model(world, cache):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world["bidirectional"])
    reference = generate(plain(fn), PROMPTS, _config())
    out = generate(fn, PROMPTS, _config(cache=cache, cache_refresh=1))
    assert torch.equal(out.sequences, reference.sequences)
    # refreshed at each block's first step only: Fast-dLLM's approximation runs and is recorded
    approx = generate(fn, PROMPTS, _config(cache=cache))
    assert approx.cache == cache and approx.config["cache_refresh"] is None
    assert not (approx.sequences[:, 8:] == MASK).any()


def _recorded_keys(model, tokens, attention_mask):
    """Every core attention's (key, value) of a plain full forward, captured by forward pre-hooks."""
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.generate.models import gpt_logits_fn

    cores = [m.core_attention for m in unwrap_model(model).modules() if hasattr(m, "core_attention")]
    seen = []
    handles = [c.register_forward_pre_hook(lambda mod, args: seen.append((args[1].clone(), args[2].clone())))
               for c in cores]
    try:
        gpt_logits_fn(model)(tokens, attention_mask)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cached_keys_and_values_equal_the_recomputed_ones_at_each_refresh(world, cache):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = world["bidirectional"]
    fn = gpt_logits_fn(model)
    checked = []

    def factory(config):
        block_fn, why = fn.block_logits(config)

        def call(tokens, attention_mask, start, end, *, refresh):
            logits = block_fn(tokens, attention_mask, start, end, refresh=refresh)
            if refresh:
                expected = _recorded_keys(model, tokens, attention_mask)
                assert len(expected) == len(block_fn.keys) == 2
                for (k, v), ck, cv in zip(expected, block_fn.keys, block_fn.values):
                    assert ck.shape == (tokens.shape[1], tokens.shape[0], 2, 8)
                    assert torch.allclose(ck, k, atol=1e-6) and torch.allclose(cv, v, atol=1e-6)
                checked.append(start)
            return logits

        call.cache = block_fn.cache
        return call, why

    wrapped = plain(fn)
    wrapped.block_logits = factory
    generate(wrapped, PROMPTS, _config(cache=cache, steps=16, cache_refresh=2))  # 4 steps a block: 2 refreshes
    assert checked == [8, 8, 12, 12, 16, 16, 20, 20]


@pytest.mark.parametrize("which", ["causal", "bidirectional"])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_batched_prompts_of_different_lengths_give_the_tokens_of_one_at_a_time(world, which, cache):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world[which])
    config = _config(cache=cache)
    batched = generate(fn, PROMPTS, config)
    for row, prompt in enumerate(PROMPTS):
        alone = generate(fn, [prompt], config)
        assert alone.generated[0] == batched.generated[row]


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_only_the_current_blocks_logits_are_computed(world, cache):
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = world["causal"]
    rows = []
    handle = unwrap_model(model).output_layer.register_forward_hook(lambda mod, args, out: rows.append(tuple(out[0].shape)))
    try:
        out = generate(gpt_logits_fn(model), PROMPTS, _config(cache=cache))
    finally:
        handle.remove()
    assert len(rows) == out.forward_passes == 8
    assert set(rows) == {(4, 3, VOCAB)}  # logits [block_length, batch, V], never the canvas' 24 columns


def test_a_core_attention_the_cache_cannot_run_falls_back_to_no_cache_with_the_reason(world):
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    class OtherCore(torch.nn.Module):  # stands for a Transformer Engine core attention
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args, **kwargs):
            return self.inner(*args, **kwargs)

    model = world["causal"]
    layers = [m for m in unwrap_model(model).modules() if hasattr(m, "core_attention")]
    originals = [m.core_attention for m in layers]
    try:
        for m in layers:
            m.core_attention = OtherCore(m.core_attention)
        fn = gpt_logits_fn(model)
        out = generate(fn, PROMPTS, _config(cache="dual"))
        reference = generate(plain(fn), PROMPTS, _config())
    finally:
        for m, core in zip(layers, originals):
            m.core_attention = core
    assert out.cache == "none" and "OtherCore" in out.cache_fallback and "Transformer Engine" in out.cache_fallback
    assert out.to_dict()["cache_fallback"] == out.cache_fallback
    assert torch.equal(out.sequences, reference.sequences)


def test_a_logits_function_without_a_block_path_runs_without_cache_and_says_so(world):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = plain(gpt_logits_fn(world["causal"]))
    out = generate(fn, PROMPTS, _config(cache="prefix"))
    assert out.cache == "none" and "megatron-core GPTModel" in out.cache_fallback


def test_compile_is_off_by_default_and_reaches_the_model_when_set_without_a_cache(world):
    from dlmspec.backends.generate.models import gpt_logits_fn

    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world["causal"])
    block_fn, _ = fn.block_logits(_config())
    assert block_fn.compile is False and block_fn._forward is world["causal"]
    compiled, _ = fn.block_logits(_config(compile=True))
    assert compiled.compile is True and compiled._forward is not world["causal"]
    assert isinstance(compiled._forward, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled._forward._orig_mod is world["causal"] and compiled.compile_fallback is None
    # with a block cache compile is not run, and the output says why
    cached, _ = fn.block_logits(_config(cache="dual", compile=True))
    assert cached.compile is False and cached._forward is world["causal"] and "CUDA-graph" in cached.compile_fallback
    out = generate(fn, PROMPTS, _config(cache="dual", compile=True))
    assert out.cache == "dual" and "CUDA-graph" in out.to_dict()["compile_fallback"]
    assert generate(fn, PROMPTS, _config(cache="dual")).compile_fallback is None


@pytest.mark.parametrize("cache", ["none", "dual"])
def test_the_vocabulary_parallel_greedy_path_gives_the_tokens_of_the_gathered_logits(world, cache):
    from dlmspec.backends.generate.load import _columns
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    # the loaded model's column selection: 60 tokenizer ids, a chat token at 61, id 60 blocked
    fn, _, width = _columns(gpt_logits_fn(world["causal"]), 60, {61: "<|chat|>"})
    assert width == 62
    used = []

    def factory(config):
        block_fn, why = fn.block_logits(config)
        block_fn.vocab_parallel = True  # as at TP > 1: the sampler asks greedy() of the shard (here all of V)
        original = block_fn.greedy

        def greedy(*args, **kwargs):
            used.append(kwargs["exclude"])
            return original(*args, **kwargs)

        block_fn.greedy = greedy
        return block_fn, why

    forced = plain(fn)
    forced.block_logits = factory
    config = _config(cache=cache, remasking="threshold", threshold=0.2)
    out = generate(forced, PROMPTS, config)
    reference = generate(plain(fn), PROMPTS, _config(remasking="threshold", threshold=0.2))
    assert used and set(used) == {MASK}
    assert torch.equal(out.sequences, reference.sequences)
    assert not ((out.sequences[:, 8:] >= 60) & (out.sequences[:, 8:] != 61)).any()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_guided_decoding_with_a_cache_gives_the_no_cache_tokens_on_a_causal_model(world, cache):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(world["causal"])
    reference = generate(plain(fn), PROMPTS, _config(cfg_scale=1.5))
    out = generate(fn, PROMPTS, _config(cfg_scale=1.5, cache=cache))
    assert out.cache == cache and torch.equal(out.sequences, reference.sequences)
