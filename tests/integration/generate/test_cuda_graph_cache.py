"""The shape-keyed CUDA-graph cache of the sampler's model forward (backends/generate/cuda_graphs.py), on the
CPU with a stand-in backend that has a real graph's memory semantics (tests/kits/cuda_graph_kit.py): a key is
captured once and replayed after; static inputs are reused and written by copy; the least recently used
graph is evicted beyond the cap; a replay overwrites the previous output (why consumers clone); what the
capture reads from outside is kept alive; a failed capture runs eager and says why; the checks that refuse
graphs name their reason."""

from __future__ import annotations

import pytest
import torch

from cuda_graph_kit import ReplayBackend


def _cache(max_graphs=8, backend=None):
    from dlmspec.backends.generate.cuda_graphs import GraphCache

    return GraphCache(backend or ReplayBackend(), max_graphs=max_graphs)


def _affine(weight):
    return lambda x, bias: x @ weight + bias


def test_a_key_is_captured_once_and_replayed_at_every_call_after():
    weight = torch.randn(3, 2)
    fn = _affine(weight)
    cache = _cache()
    outs = []
    for seed in range(3):
        x, bias = torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)), torch.randn(2)
        out = cache.run(("k", 4, 3), fn, [x, bias])
        torch.testing.assert_close(out, fn(x, bias), rtol=0, atol=0)
        outs.append(out)
    assert cache.captures == 1 and cache.replays == 3 and cache.backend.warmups == 1
    assert outs[0] is outs[1] is outs[2]  # the static output: one tensor for every replay


def test_static_inputs_are_reused_and_filled_by_copy_never_aliased_to_the_callers_tensor():
    cache = _cache()
    fn = _affine(torch.eye(3))
    x = torch.ones(2, 3)
    cache.run("k", fn, [x, torch.zeros(3)])
    entry = cache.get("k")
    static = list(entry.inputs)
    assert static[0] is not x
    y = torch.full((2, 3), 5.0)
    out = cache.run("k", fn, [y, torch.zeros(3)])
    assert entry.inputs[0] is static[0] and torch.equal(static[0], y)
    y.fill_(-1.0)  # the caller's tensor changes after the call: the graph's input does not
    assert torch.equal(static[0], torch.full((2, 3), 5.0)) and torch.equal(out, torch.full((2, 3), 5.0))


def test_a_replay_overwrites_the_output_of_the_previous_replay():
    cache = _cache()
    fn = _affine(torch.eye(2))
    first = cache.run("k", fn, [torch.ones(1, 2), torch.zeros(2)])
    kept = first.clone()
    second = cache.run("k", fn, [torch.full((1, 2), 7.0), torch.zeros(2)])
    assert second is first and torch.equal(first, torch.full((1, 2), 7.0)) and not torch.equal(first, kept)


def test_the_least_recently_used_graph_is_evicted_beyond_the_cap():
    cache = _cache(max_graphs=2)
    fn = _affine(torch.eye(2))
    for key in ("a", "b", "a", "c"):
        cache.run(key, fn, [torch.ones(1, 2), torch.zeros(2)])
    assert cache.keys() == ["a", "c"] and cache.evictions == 1 and cache.captures == 3
    cache.run("b", fn, [torch.ones(1, 2), torch.zeros(2)])  # evicted: captured again
    assert cache.captures == 4 and cache.keys() == ["c", "b"]


def test_a_key_whose_input_shapes_changed_is_captured_again():
    cache = _cache()
    fn = _affine(torch.eye(2))
    cache.run("same", fn, [torch.ones(1, 2), torch.zeros(2)])
    out = cache.run("same", fn, [torch.ones(3, 2), torch.zeros(2)])
    assert cache.captures == 2 and out.shape == (3, 2)


def test_tensors_the_capture_reads_from_outside_its_inputs_are_kept_alive():
    table = torch.arange(6.0).view(3, 2)  # e.g. a rotary table an lru_cache may drop later
    cache = _cache()
    cache.run("k", lambda x: x @ table, [torch.ones(1, 3)])
    assert any(t is table for t in cache.get("k").held)


def test_a_failed_capture_runs_the_callable_eagerly_and_says_why():
    backend = ReplayBackend(fail=RuntimeError("operation not permitted when stream is capturing"))
    cache = _cache(backend=backend)
    fn = _affine(torch.eye(2))
    x = torch.full((1, 2), 3.0)
    out = cache.run("k", fn, [x, torch.zeros(2)])
    assert torch.equal(out, x) and len(cache) == 0
    assert "capture failed" in cache.fallback and "stream is capturing" in cache.fallback
    again = cache.run("k", fn, [x * 2, torch.zeros(2)])
    assert torch.equal(again, x * 2) and backend.warmups == 1  # eager from then on, no new attempt


def test_a_cap_below_one_graph_is_refused():
    from dlmspec.backends.generate.cuda_graphs import GraphCache

    with pytest.raises(ValueError, match="max_graphs must be >= 1"):
        GraphCache(ReplayBackend(), max_graphs=0)


def test_a_model_on_the_cpu_is_refused_with_its_reason():
    from dlmspec.backends.generate.cuda_graphs import cuda_graph_unsupported

    why = cuda_graph_unsupported(torch.nn.Linear(2, 2))
    assert "not on a CUDA device" in why and "eager" in why


def test_tensor_parallelism_and_parameter_gathers_by_hooks_are_refused_with_their_reasons():
    from types import SimpleNamespace

    from dlmspec.backends.generate.cuda_graphs import cuda_graph_unsupported

    assert "tensor_model_parallel_size = 2" in cuda_graph_unsupported(torch.nn.Linear(2, 2), tensor_model_parallel_size=2)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)
            self.ddp_config = SimpleNamespace(overlap_param_gather=True)

    assert "overlap_param_gather" in cuda_graph_unsupported(Wrapper())

    class FullyShardedDataParallel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(2, 2)

    assert "sharded parameters" in cuda_graph_unsupported(FullyShardedDataParallel())


def test_the_graph_cache_is_kept_on_the_model_across_samplers_and_released_on_request():
    from dlmspec.backends.generate.cuda_graphs import model_graph_cache, release_model_graphs

    model = torch.nn.Linear(2, 2)
    backend = ReplayBackend()
    first = model_graph_cache(model, backend)
    assert model_graph_cache(model) is first and model_graph_cache(model, backend) is first
    assert model_graph_cache(model, ReplayBackend()) is not first  # another backend: a new cache
    assert release_model_graphs(model) and not release_model_graphs(model)
    assert "_dlmspec_cuda_graphs" not in dict(model.named_buffers()) and "_dlmspec_cuda_graphs" not in model.state_dict()
