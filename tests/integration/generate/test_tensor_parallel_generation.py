"""Tensor-parallel generation on CPU: a runtime checkpoint loaded at TP = 2 (two gloo processes)
samples exactly what it samples at TP = 1.

One tiny runtime checkpoint (tests/kits/tiny_ckpt.py, weights perturbed so that predictions differ
by position and threshold decoding commits several tokens a step) is written once; it is loaded
through the loader ``dlmspec generate`` uses (:func:`dlmspec.backends.generate.load.load_model`:
``dist_checkpointing`` reads the TP = 1 file into each rank's shard) once in one process at TP = 1
and once in two processes at TP = 2 (``cpu_world_kit.spawn_world``, gloo, a file store in
``tmp_path``). Each world runs the same cases and saves what it got; the tests compare:

* the masked-diffusion sampler's tokens for no cache, the prefix and the dual cache, low-confidence,
  threshold and factor decoding, temperature 0 (the vocabulary-parallel argmax path), on left-padded
  prompts of different lengths; and at temperature > 0 and with guidance (the block's gathered logits);
* the same at TP = 2 with megatron-core's sequence parallelism (a training model's layout), on a
  canvas whose length TP does not divide;
* the vocabulary-parallel argmax and confidence
  (:func:`~dlmspec.backends.generate.block_cache.vocab_parallel_greedy` through
  ``GPTBlockLogits.greedy``) against ``sample_tokens`` on the gathered logits of the same block,
  and against TP = 1;
* which logits are computed at TP = 2: the output layer's output and every gather of the
  vocabulary shards cover the current block's columns only (no ``[b, L, V]``);
* the whole-canvas logits (:func:`~dlmspec.backends.generate.models.gpt_logits_fn`'s gather) and
  AR decoding with megatron-core's KV cache (``GPTKVCacheStep``) at TP = 2 against TP = 1.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest
import torch

# two-process gloo worlds: one after another under pytest-xdist (tests/conftest.py's group)
pytestmark = pytest.mark.xdist_group("exclusive")

PROMPTS = [[464, 2068, 7586], [21831, 18045, 625, 262, 16931]]  # left-padded to P = 5
GEN, BLOCK, STEPS = 16, 8, 16

#: (name, GenerateConfig keywords) run in both worlds.
CASES = [
    (f"{cache}-{remasking}", dict(cache=cache, remasking=remasking))
    for cache in ("none", "prefix", "dual")
    for remasking in ("low_confidence", "threshold", "factor")
] + [
    ("dual-refresh2-threshold", dict(cache="dual", remasking="threshold", cache_refresh=2)),
    ("none-temperature", dict(cache="none", temperature=0.7, seed=3)),
    ("prefix-temperature", dict(cache="prefix", temperature=0.7, seed=3)),
    ("dual-guidance", dict(cache="dual", cfg_scale=1.0)),
]

#: cases also run at TP = 2 with sequence parallelism (a canvas of 21 columns: not a multiple of TP).
SEQUENCE_PARALLEL_CASES = ["none-low_confidence", "prefix-threshold", "none-temperature"]


def _config(mask: int, **kw):
    from dlmspec.backends.generate.config import GenerateConfig

    base = dict(gen_length=GEN, steps=STEPS, block_length=BLOCK, mask_token_id=mask, temperature=0.0,
                threshold=0.7, factor=1.0)
    base.update(kw)
    return GenerateConfig(**base)


def _canvas(mask: int):
    """The sampler's first canvas of :data:`PROMPTS` (left-padded) and its key-padding mask."""
    from dlmspec.backends.generate.sampler import left_pad

    tokens, attn, _ = left_pad(PROMPTS, 0, None)
    canvas = torch.cat([tokens, torch.full((len(PROMPTS), GEN), mask)], dim=1)
    canvas[0, -3] = 2068  # a committed token in the generated region
    attn = torch.cat([attn, torch.ones(len(PROMPTS), GEN, dtype=torch.bool)], dim=1)
    return canvas, attn


def _worker(rank: int, world: int, store: str, mdm: str, ar: str, out: str) -> None:
    """One rank: load both checkpoints at TP = ``world`` and save what every case gives."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel import mappings

    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.generate.sampler import generate, generate_ar, sample_tokens

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    gathers: list = []
    plain_gather = mappings.gather_from_tensor_model_parallel_region

    def counting_gather(x):  # what GPTBlockLogits gathers (it looks the function up when built)
        gathers.append(tuple(x.shape))
        return plain_gather(x)

    mappings.gather_from_tensor_model_parallel_region = counting_gather
    result: dict = {"generate": {}, "greedy": {}, "logit_shapes": {}, "gathers": {}}
    try:
        lm = load_model(mdm, device="cpu", tensor_model_parallel_size=world)
        mask = lm.mask_token_id
        logit_shapes: list = []
        hook = lm.model.output_layer.register_forward_hook(
            lambda module, args, output: logit_shapes.append(tuple((output[0] if isinstance(output, tuple)
                                                                    else output).shape)))
        for name, kw in CASES:
            logit_shapes.clear()
            gathers.clear()
            res = generate(lm.logits_fn, PROMPTS, _config(mask, **kw))
            result["generate"][name] = (res.sequences, res.forward_passes, res.cache, res.cache_fallback)
            result["logit_shapes"][name] = list(logit_shapes)
            result["gathers"][name] = list(gathers)
        hook.remove()

        canvas, attn = _canvas(mask)
        start = len(PROMPTS[1])
        for cache in ("none", "prefix", "dual"):
            block_fn, _ = lm.logits_fn.block_logits(_config(mask, cache=cache))
            greedy = block_fn.greedy(canvas, attn, start, start + BLOCK, refresh=True, exclude=mask)
            gathered = block_fn(canvas, attn, start, start + BLOCK, refresh=True)
            if mask < gathered.shape[-1]:  # the sampler's rule: the mask token is never an output
                gathered[..., mask] = float("-inf")
            # a cached step after the refresh (the block's columns only, the keys of the rest cached)
            cached = block_fn.greedy(canvas, attn, start, start + BLOCK, refresh=False, exclude=mask)
            result["greedy"][cache] = {
                "vocab_parallel": block_fn.vocab_parallel, "greedy": greedy,
                "gathered": sample_tokens(gathered, temperature=0.0), "cached": cached,
            }
        result["full_logits"] = lm.logits_fn(canvas, attn)
        lm.close()

        if world > 1:  # the same weights with megatron-core's sequence parallelism (a training model's layout)
            from dlmspec.backends.generate import load

            plain_config = load.build_transformer_config

            def sequence_parallel_config(*args, **kwargs):
                config = plain_config(*args, **kwargs)
                config.sequence_parallel = True
                return config

            load.build_transformer_config = sequence_parallel_config
            try:
                sp_lm = load_model(mdm, device="cpu", tensor_model_parallel_size=world)
            finally:
                load.build_transformer_config = plain_config
            assert sp_lm.model.config.sequence_parallel
            result["sequence_parallel"] = {}
            for name in SEQUENCE_PARALLEL_CASES:
                try:  # both ranks fail alike (the same shapes), so the others' cases still run
                    res = generate(sp_lm.logits_fn, PROMPTS, _config(mask, **dict(CASES)[name]))
                    result["sequence_parallel"][name] = (res.sequences, res.cache, res.cache_fallback)
                except Exception as exc:  # recorded for the test to show
                    result["sequence_parallel"][name] = f"{type(exc).__name__}: {exc}"
            sp_lm.close()

        ar_lm = load_model(ar, device="cpu", tensor_model_parallel_size=world)
        step_fn = ar_lm.ar_step_fn(GEN)
        ar_config = GenerateConfig(kind="ar", gen_length=GEN)
        res = generate_ar(ar_lm.logits_fn, PROMPTS, ar_config, step_fn=step_fn)
        plain = generate_ar(ar_lm.logits_fn, PROMPTS, ar_config)
        result["ar"] = (res.sequences, plain.sequences, ar_lm.kv_cache_fallback, step_fn.incremental_calls)
        ar_lm.close()
    finally:
        mappings.gather_from_tensor_model_parallel_region = plain_gather
        if dist.is_initialized():
            dist.destroy_process_group()
    torch.save(result, f"{out}.tp{world}.rank{rank}")


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """``{1: [rank 0's results], 2: [rank 0's, rank 1's]}`` of :func:`_worker`."""
    from cpu_world_kit import megatron_cpu_world, spawn_world
    from tiny_ckpt import write_runtime_checkpoint

    root = tmp_path_factory.mktemp("tp")
    with pytest.MonkeyPatch.context() as monkey, megatron_cpu_world(tmp_path_factory, monkey):
        write_runtime_checkpoint(root / "mdm", "mdm", seed=0, perturb=1.0)
        write_runtime_checkpoint(root / "ar", "ar", seed=1, perturb=1.0)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = str(root / "result")
    results = {}
    for world in (1, 2):
        spawn_world(_worker, args=(world, str(root / f"store{world}"), str(root / "mdm"), str(root / "ar"), out),
                    nprocs=world)
        results[world] = [torch.load(f"{out}.tp{world}.rank{rank}", weights_only=False) for rank in range(world)]
    return results


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_tensor_parallel_sampling_gives_the_single_rank_tokens(worlds, name):
    ref, passes, cache, fallback = worlds[1][0]["generate"][name]
    assert cache == dict(CASES)[name]["cache"] and fallback is None
    for rank in worlds[2]:
        got, got_passes, got_cache, got_fallback = rank["generate"][name]
        assert torch.equal(got, ref), f"{name}: TP = 2 {got.tolist()} != TP = 1 {ref.tolist()}"
        assert (got_passes, got_cache, got_fallback) == (passes, cache, fallback)


def test_the_cases_decode_differently_enough_to_tell_tensor_parallel_errors(worlds):
    """The fixture is not degenerate: rows differ, and threshold decoding commits several tokens a step."""
    seqs = {name: worlds[1][0]["generate"][name][0] for name, _ in CASES}
    generated = seqs["none-low_confidence"][:, len(PROMPTS[1]):]
    assert len(set(generated.flatten().tolist())) >= 6
    assert worlds[1][0]["generate"]["none-threshold"][1] < STEPS  # fewer passes than one token a step


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_vocabulary_parallel_argmax_and_confidence_equal_the_gathered_ones(worlds, cache):
    one = worlds[1][0]["greedy"][cache]
    assert not one["vocab_parallel"]
    for rank in worlds[2]:
        r = rank["greedy"][cache]
        assert r["vocab_parallel"]  # the sampler takes this path at temperature 0
        tokens, confidence = r["greedy"]
        ref_tokens, ref_confidence = r["gathered"]
        assert torch.equal(tokens, ref_tokens)
        assert torch.allclose(confidence, ref_confidence, rtol=1e-9, atol=0)
        # and what one rank with the whole vocabulary gives
        assert torch.equal(tokens, one["greedy"][0])
        assert torch.allclose(confidence, one["greedy"][1], rtol=1e-4, atol=0)
        assert torch.equal(r["cached"][0], one["cached"][0])
        assert torch.allclose(r["cached"][1], one["cached"][1], rtol=1e-4, atol=0)
    assert float(one["greedy"][1].max()) > 0.5  # confident predictions: the comparison is not of ties


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_tensor_parallel_sampling_computes_only_the_current_blocks_logits(worlds, name):
    vocab_shard = None
    for rank in worlds[2]:
        shapes = rank["logit_shapes"][name]
        assert shapes, "the output layer never ran"
        # megatron-core's output layer gives [s, b, V / TP]: s is the block's columns at every step
        assert {s[0] for s in shapes} == {BLOCK}, shapes
        vocab_shard = {s[2] for s in shapes}
        assert len(vocab_shard) == 1
        gathers = rank["gathers"][name]
        case = dict(CASES)[name]
        if case.get("temperature", 0.0) == 0 and case.get("cfg_scale", 0.0) == 0:
            assert gathers == []  # the argmax and confidence come from the shards (three [b, s] all-reduces)
        else:
            assert gathers and {g[1] for g in gathers} == {BLOCK} and {g[2] for g in gathers} == vocab_shard
    one = worlds[1][0]["logit_shapes"][name]
    assert {s[2] for s in one} == {2 * next(iter(vocab_shard))}  # TP = 2 holds half the vocabulary each


def test_tensor_parallel_whole_canvas_logits_equal_the_single_rank_ones(worlds):
    ref = worlds[1][0]["full_logits"]
    for rank in worlds[2]:
        got = rank["full_logits"]
        assert got.shape == ref.shape
        assert torch.allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_tensor_parallel_ar_decoding_with_the_kv_cache_gives_the_single_rank_tokens(worlds):
    ref_cached, ref_plain, fallback, incremental = worlds[1][0]["ar"]
    assert fallback is None and incremental > 0
    assert torch.equal(ref_cached, ref_plain)
    for rank in worlds[2]:
        cached, plain, got_fallback, got_incremental = rank["ar"]
        assert got_fallback is None and got_incremental == incremental
        assert torch.equal(cached, ref_cached) and torch.equal(plain, ref_plain)


@pytest.mark.parametrize("name", SEQUENCE_PARALLEL_CASES)
def test_sequence_parallel_sampling_of_a_canvas_not_divisible_by_tp_gives_the_single_rank_tokens(worlds, name):
    """megatron-core's sequence parallelism splits the canvas over the TP ranks and asserts its length
    divides by TP; the prompts' canvas (5 + 16 columns) does not, so it is padded with hidden columns."""
    ref = worlds[1][0]["generate"][name][0]
    assert (len(PROMPTS[1]) + GEN) % 2 == 1
    for rank in worlds[2]:
        outcome = rank["sequence_parallel"][name]
        assert not isinstance(outcome, str), f"{name} at TP = 2 with sequence parallelism raised {outcome}"
        got, cache, fallback = outcome
        assert torch.equal(got, ref), f"{name}: TP = 2 with sequence parallelism {got.tolist()} != {ref.tolist()}"
        assert cache == "none"
        if dict(CASES)[name]["cache"] != "none":
            assert fallback and "sequence parallelism" in fallback
