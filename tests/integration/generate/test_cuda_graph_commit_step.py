"""A greedy denoising step's commit (argmax, confidence, the remasking rule, the write into the block)
replayed as a CUDA graph of its own beside the forward's (``sampler.commit_graphs``), on tiny
megatron-core GPTModels on the CPU through the stand-in capture backend (tests/kits/cuda_graph_kit.py):
the tokens are the eager ones for every graphed rule, also when rows leave the batch at EOS (a graph
per batch size); an ``on_step`` callback, which reads the step's commit mask, keeps the commit eager;
a commit capture that fails leaves the forward's graphs running and says why in the output; a step
whose logits are too large to keep a graph's copy of commits eager; releasing a model's graphs drops
the commit graphs too."""

from __future__ import annotations

import pytest
import torch

from block_cache_kit import EOS, MASK, tiny_gpt
from cpu_world_kit import megatron_cpu_world
from cuda_graph_kit import ReplayBackend

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield tiny_gpt("bidirectional", seed=5)


@pytest.fixture
def fresh(model):
    from dlmspec.backends.generate.cuda_graphs import release_model_graphs

    release_model_graphs(model)
    yield model
    release_model_graphs(model)


def _config(**kw):
    from dlmspec.backends.generate.config import GenerateConfig

    base = dict(gen_length=16, steps=8, block_length=4, mask_token_id=MASK, temperature=0.0)
    base.update(kw)
    return GenerateConfig(**base)


def _graphed(model, backend):
    from dlmspec.backends.generate.block_cache import GPTBlockLogits
    from dlmspec.backends.generate.models import gpt_logits_fn

    fn = gpt_logits_fn(model)
    fn.block_logits = lambda config, columns=None: (
        GPTBlockLogits(model, cache=config.cache, cuda_graph=config.cuda_graph, graph_backend=backend), None)
    return fn


def _commits(model):
    return model.__dict__["_dlmspec_cuda_commit_graphs"]


@pytest.mark.parametrize("remasking", ["low_confidence", "threshold", "factor"])
def test_rows_leaving_the_batch_at_eos_get_the_eager_tokens_with_a_commit_graph_per_batch_size(fresh, remasking):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    kw = dict(remasking=remasking, threshold=0.3, factor=1.0, eos_token_id=EOS, cache="prefix")
    eager = generate(gpt_logits_fn(fresh), PROMPTS * 2, _config(cuda_graph=False, **kw))
    out = generate(_graphed(fresh, ReplayBackend()), PROMPTS * 2, _config(**kw))
    assert torch.equal(out.sequences, eager.sequences) and out.generated == eager.generated
    assert out.cuda_graph_fallback is None
    commits = _commits(fresh)
    assert commits.replays == out.forward_passes
    # one capture per batch size the blocks ran at (rows leave at EOS): the keys hold the logits' shape
    sizes = {key[-3][0] for key in commits.keys()}
    assert commits.captures == len(sizes) >= 1


def test_an_on_step_callback_keeps_the_commit_eager_and_sees_every_step(fresh):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    eager = generate(gpt_logits_fn(fresh), PROMPTS, _config(cuda_graph=False))
    seen = []
    out = generate(_graphed(fresh, ReplayBackend()), PROMPTS, _config(), on_step=lambda e: seen.append(e.committed.sum()))
    assert torch.equal(out.sequences, eager.sequences) and len(seen) == out.steps
    assert _commits(fresh).captures == 0 and _commits(fresh).replays == 0
    assert fresh.__dict__["_dlmspec_cuda_graphs"].replays == out.forward_passes  # the forward still replays


class _FailSecondCapture(ReplayBackend):
    """Captures the first graph (the forward's), refuses the second (the commit step's)."""

    def capture(self, fn):
        if self.captures == 1:
            raise RuntimeError("operation not permitted when stream is capturing")
        return super().capture(fn)


def test_a_failed_commit_capture_runs_the_commit_eager_and_says_why(fresh):
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    eager = generate(gpt_logits_fn(fresh), PROMPTS, _config(cuda_graph=False))
    out = generate(_graphed(fresh, _FailSecondCapture()), PROMPTS, _config())
    assert torch.equal(out.sequences, eager.sequences)
    assert "capture failed" in out.cuda_graph_fallback and "operation not permitted" in out.cuda_graph_fallback
    assert out.cuda_graph_fallback.endswith("the sampler's commit step runs eager")
    assert fresh.__dict__["_dlmspec_cuda_graphs"].fallback is None  # the forward's graphs kept running
    assert fresh.__dict__["_dlmspec_cuda_graphs"].replays == out.forward_passes


def test_releasing_a_models_graphs_drops_the_commit_graphs_too(fresh):
    from dlmspec.backends.generate.cuda_graphs import release_model_graphs
    from dlmspec.backends.generate.sampler import generate

    generate(_graphed(fresh, ReplayBackend()), PROMPTS, _config())
    assert _commits(fresh).captures == 1
    assert release_model_graphs(fresh)
    assert "_dlmspec_cuda_commit_graphs" not in fresh.__dict__ and "_dlmspec_cuda_graphs" not in fresh.__dict__


def test_a_step_above_the_commit_graph_memory_cap_commits_eager(fresh, monkeypatch):
    from dlmspec.backends.generate import sampler
    from dlmspec.backends.generate.models import gpt_logits_fn

    eager = sampler.generate(gpt_logits_fn(fresh), PROMPTS, _config(cuda_graph=False))
    # the float64 copy of a step's logits here: 3 rows x 4 columns x 64 x 8 bytes = 6,144 bytes
    monkeypatch.setattr(sampler, "COMMIT_GRAPH_MAX_BYTES", 6143)
    out = sampler.generate(_graphed(fresh, ReplayBackend()), PROMPTS, _config())
    assert torch.equal(out.sequences, eager.sequences) and _commits(fresh).captures == 0
    monkeypatch.setattr(sampler, "COMMIT_GRAPH_MAX_BYTES", 6144)
    sampler.generate(_graphed(fresh, ReplayBackend()), PROMPTS, _config())
    assert _commits(fresh).captures == 1
