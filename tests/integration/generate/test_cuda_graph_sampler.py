"""The sampler with the model's forward replayed as CUDA graphs (``[generate] cuda_graph``), on tiny
megatron-core GPTModels on the CPU through a stand-in capture backend with a real graph's memory semantics
(tests/kits/cuda_graph_kit.py): the replays give exactly the eager tokens with every cache, left padding
and EOS (rows leaving the batch); a greedy step's commit is replayed as a graph of its own (one per
step, none when sampling at a temperature or with an on_step callback); one graph serves every block of
a canvas; graphs outlive one generate call; fp32 logits handed out are never overwritten by the next
replay; on the CPU the switch is a no-op with its reason recorded."""

from __future__ import annotations

import pytest
import torch

from block_cache_kit import EOS, MASK, tiny_gpt
from cpu_world_kit import megatron_cpu_world
from cuda_graph_kit import ReplayBackend

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield {"bidirectional": tiny_gpt("bidirectional", seed=3), "causal": tiny_gpt("causal", seed=4)}


def _config(**kw):
    from dlmspec.backends.generate.config import GenerateConfig

    base = dict(gen_length=16, steps=8, block_length=4, mask_token_id=MASK, temperature=0.0)
    base.update(kw)
    return GenerateConfig(**base)


def _graphed(model, backend, max_graphs=None):
    """``gpt_logits_fn(model)`` whose block path runs its forwards through ``backend``'s graphs."""
    from dlmspec.backends.generate.block_cache import GPTBlockLogits
    from dlmspec.backends.generate.models import gpt_logits_fn

    fn = gpt_logits_fn(model)

    def block_logits(config, columns=None):
        return GPTBlockLogits(model, cache=config.cache, cuda_graph=config.cuda_graph, graph_backend=backend,
                              max_graphs=max_graphs), None

    fn.block_logits = block_logits
    return fn


@pytest.fixture
def fresh(world):
    from dlmspec.backends.generate.cuda_graphs import release_model_graphs

    for model in world.values():
        release_model_graphs(model)
    yield world
    for model in world.values():
        release_model_graphs(model)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("remasking,temperature", [("low_confidence", 0.0), ("threshold", 0.0),
                                                   ("low_confidence", 1.0)])
def test_graph_replays_give_exactly_the_eager_tokens(fresh, cache, remasking, temperature):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = fresh["bidirectional"]
    kw = dict(cache=cache, remasking=remasking, threshold=0.3, temperature=temperature, cache_refresh=2)
    eager = generate(gpt_logits_fn(model), PROMPTS, _config(cuda_graph=False, **kw))
    backend = ReplayBackend()
    out = generate(_graphed(model, backend), PROMPTS, _config(**kw))
    assert torch.equal(out.sequences, eager.sequences)
    assert out.forward_passes == eager.forward_passes and out.cuda_graph_fallback is None
    graphs, commits = model.__dict__["_dlmspec_cuda_graphs"], model.__dict__["_dlmspec_cuda_commit_graphs"]
    assert graphs.fallback is None and graphs.replays == out.forward_passes
    assert graphs.captures < out.forward_passes and commits.fallback is None
    # greedy: every step's commit is a replay (one capture: one block shape); sampled: eager
    assert commits.replays == (out.forward_passes if temperature == 0 else 0)
    assert commits.captures == (1 if temperature == 0 else 0)
    assert backend.captures == graphs.captures + commits.captures


def test_rows_leaving_the_batch_at_eos_get_the_eager_tokens_and_a_graph_per_batch_size(fresh):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = fresh["causal"]
    kw = dict(eos_token_id=EOS, temperature=1.0, seed=3)
    eager = generate(gpt_logits_fn(model), PROMPTS * 2, _config(cuda_graph=False, **kw))
    out = generate(_graphed(model, ReplayBackend()), PROMPTS * 2, _config(**kw))
    assert torch.equal(out.sequences, eager.sequences) and out.generated == eager.generated


def test_one_graph_serves_every_block_of_a_canvas_and_outlives_the_generate_call(fresh):
    from dlmspec.backends.generate.sampler import generate

    model = fresh["bidirectional"]
    backend = ReplayBackend()
    first = generate(_graphed(model, backend), PROMPTS, _config())
    # 4 blocks, 2 steps each: one shape, so one forward graph and one commit graph
    assert backend.captures == 2 and first.forward_passes == 8
    second = generate(_graphed(model, backend), PROMPTS, _config())
    assert backend.captures == 2 and torch.equal(second.sequences, first.sequences)
    assert model.__dict__["_dlmspec_cuda_graphs"].replays == 16
    assert model.__dict__["_dlmspec_cuda_commit_graphs"].replays == 16


def test_fp32_logits_handed_out_are_not_overwritten_by_the_next_replay(fresh):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits

    model = fresh["bidirectional"]
    block_fn = GPTBlockLogits(model, cuda_graph=True, graph_backend=ReplayBackend())
    a = torch.randint(0, 60, (2, 12))
    b = torch.randint(0, 60, (2, 12))
    first = block_fn(a, None, 8, 12, refresh=True)
    kept = first.clone()
    block_fn(b, None, 8, 12, refresh=True)
    assert first.dtype == torch.float32 and torch.equal(first, kept)
    eager = GPTBlockLogits(model)(a, None, 8, 12, refresh=True)
    assert torch.equal(first, eager)


def test_on_the_cpu_the_switch_is_a_no_op_with_its_reason_recorded(fresh):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = fresh["bidirectional"]
    off = generate(gpt_logits_fn(model), PROMPTS, _config(cuda_graph=False))
    on = generate(gpt_logits_fn(model), PROMPTS, _config())
    assert torch.equal(on.sequences, off.sequences)
    assert on.config["cuda_graph"] is True and off.config["cuda_graph"] is False
    assert "not on a CUDA device" in on.cuda_graph_fallback and off.cuda_graph_fallback is None
    assert on.to_dict()["cuda_graph_fallback"] == on.cuda_graph_fallback
    assert "_dlmspec_cuda_graphs" not in model.__dict__


def test_a_logits_function_without_a_block_path_records_why_it_runs_eager(fresh):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    fn = gpt_logits_fn(fresh["bidirectional"])
    out = generate(lambda t, m=None: fn(t, m), PROMPTS, _config())
    assert "needs a megatron-core GPTModel" in out.cuda_graph_fallback


def test_compile_and_cuda_graph_together_run_compile_and_say_why(fresh):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits

    block_fn = GPTBlockLogits(fresh["bidirectional"], compile=True, cuda_graph=True, graph_backend=ReplayBackend())
    assert block_fn.graphs is None and "torch.compile" in block_fn.cuda_graph_fallback


def test_a_cached_step_whose_refresh_graph_was_evicted_runs_eager_with_the_eager_tokens(fresh):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = fresh["bidirectional"]
    eager = generate(gpt_logits_fn(model), PROMPTS, _config(cache="dual", cuda_graph=False))
    fn = gpt_logits_fn(model)
    # a cap of one graph: every cached step's capture evicts the refresh graph it read
    fn.block_logits = lambda config, columns=None: (GPTBlockLogits(model, cache="dual", cuda_graph=True,
                                                                   graph_backend=ReplayBackend(), max_graphs=1), None)
    out = generate(fn, PROMPTS, _config(cache="dual"))
    assert torch.equal(out.sequences, eager.sequences)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_a_later_sampler_capturing_after_a_kept_refresh_graph_reads_the_keys_that_graph_wrote(fresh, cache):
    # two graphs kept: the second call's sampler replays the kept refresh graph (no Python of its capture
    # runs for it) and captures each block's step graph again (evicted), reading the cached keys and
    # values, which only the refresh graph's entry can give it
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    model = fresh["bidirectional"]
    kw = dict(cache=cache)
    eager = generate(gpt_logits_fn(model), PROMPTS, _config(cuda_graph=False, **kw))
    backend = ReplayBackend()
    first = generate(_graphed(model, backend, max_graphs=2), PROMPTS, _config(**kw))
    graphs = model.__dict__["_dlmspec_cuda_graphs"]
    refresh_captures = sum(1 for k in graphs.keys() if k[0] == "full")
    second = generate(_graphed(model, backend, max_graphs=2), PROMPTS, _config(**kw))
    assert refresh_captures == 1 and graphs.evictions > 0 and graphs.fallback is None
    assert torch.equal(first.sequences, eager.sequences) and torch.equal(second.sequences, eager.sequences)
