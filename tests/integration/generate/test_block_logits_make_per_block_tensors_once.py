"""What is the same at every denoising step of a block is made once per block, not once per step (or per
layer): GPTBlockLogits' position ids and key-padding mask, the cached steps' key pattern (once for every
layer), the vocabulary-shard mask of the greedy path, and the column selection's blocked ids (no host
tensor copied to the device at every step)."""

from __future__ import annotations

import pytest
import torch

from block_cache_kit import EOS, MASK, tiny_gpt
from cpu_world_kit import megatron_cpu_world

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def causal(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield tiny_gpt("causal")


def _op_counts(fn, *args, **kw):
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict = {}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            counts[name] = counts.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    with Count():
        out = fn(*args, **kw)
    return out, counts


def _config(**kw):
    from dlmspec.backends.generate.config import GenerateConfig

    return GenerateConfig(gen_length=8, steps=8, block_length=4, mask_token_id=MASK, eos_token_id=EOS, **kw)


def test_position_ids_of_left_padded_prompts_are_made_once_not_at_every_step(causal):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    out, counts = _op_counts(generate, gpt_logits_fn(causal), PROMPTS, _config())
    assert out.forward_passes == 8
    # position ids = cumsum of the key-padding mask: once per attention-mask tensor (one for the
    # call while no row leaves the batch), not once per forward pass
    assert counts.get("cumsum", 0) <= 2, counts.get("cumsum")


def test_a_cached_step_builds_the_key_pattern_once_for_all_layers(causal, monkeypatch):
    from dlmspec.backends.generate import block_cache
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    calls = []
    real = block_cache.allowed_keys

    def counting(*args, **kwargs):
        calls.append(args[:2])
        return real(*args, **kwargs)

    monkeypatch.setattr(block_cache, "allowed_keys", counting)
    out = generate(gpt_logits_fn(causal), PROMPTS, _config(cache="dual"))
    layers = len(block_cache.core_attentions(causal))
    assert layers == 2 and out.cache == "dual"
    # 2 blocks x 3 cached steps x 2 layers = 12 calls when made per layer and step; once per block here
    assert len(calls) == 2, calls


def test_greedy_on_a_vocabulary_shard_makes_its_id_mask_once(causal):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits

    def columns(out):
        return out

    columns.width, columns.blocked = 60, (58, 59)
    fn = GPTBlockLogits(causal, columns=columns)
    tokens = torch.tensor([[5, 6, 7, MASK, MASK, MASK]])
    first, counts_first = _op_counts(fn.greedy, tokens, None, 3, 6, refresh=True, exclude=MASK)
    second, counts_second = _op_counts(fn.greedy, tokens, None, 3, 6, refresh=True, exclude=MASK)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert counts_first.get("isin", 0) == 1
    # the second step builds no id range, no host tensor of blocked ids, no isin
    assert all(counts_second.get(op, 0) == 0 for op in ("isin", "lift_fresh")), counts_second
    # ids >= width, the blocked ids and the mask token are never picked
    logits = fn(tokens, None, 3, 6, refresh=True).double()
    logits[..., 58:] = float("-inf")
    logits[..., MASK] = float("-inf")
    assert torch.equal(first[0], logits.argmax(-1))


def test_the_column_selection_copies_its_blocked_ids_to_the_device_once():
    from dlmspec.backends.generate.load import _columns

    def base(tokens, attention_mask=None):
        return torch.arange(tokens.numel() * 10, dtype=torch.float32).reshape(*tokens.shape, 10)

    _, select, width = _columns(base, 6, {7: "<|im_end|>"})
    assert width == 8 and select.blocked == (6,)
    logits = base(torch.zeros(2, 3, dtype=torch.int64))
    _, first = _op_counts(select, logits)
    out, second = _op_counts(select, logits)
    assert first.get("lift_fresh", 0) == 1 and second.get("lift_fresh", 0) == 0, (first, second)
    assert out.shape == (2, 3, 8)
    assert torch.isinf(out[..., 6]).all() and torch.equal(out[..., 7], logits[..., 7]) and torch.equal(out[..., :6], logits[..., :6])
