"""[eval.generation] runs on the training model: the sampler's CUDA graphs (kept on the model object,
backends/generate/cuda_graphs.py) must not outlive an evaluation, or their memory pool would stay
taken from training (which `plan` counts without it)."""

from __future__ import annotations

import json

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from cuda_graph_kit import ReplayBackend
from generation_eval_kit import EOS, MASK, WordTokenizer, addition_rows, tiny_gpt

from dlmspec.backends.generate import cuda_graphs
from dlmspec.backends.megatron.generation_eval import GenerationEvalConfig, GenerationEvaluator


def test_an_evaluation_drops_the_graphs_kept_on_the_training_model_and_keeps_its_mode(tmp_path, tmp_path_factory):
    prompts = tmp_path / "test.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in addition_rows([(12, 34), (5, 7), (99, 1)])))
    cfg = GenerationEvalConfig(prompts=str(prompts), every=2, max_prompts=3, batch_size=2,
                               generate=dict(gen_length=4, steps=4, block_length=4, cuda_graph=True))
    evaluator = GenerationEvaluator(cfg, kind="mdm", mask_token_id=MASK, eos_token_id=EOS, tokenizer=WordTokenizer())
    assert evaluator.config.cuda_graph is True  # the spec's [generate] cuda_graph reaches the sampler
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        model = tiny_gpt()
        model.train()
        kept = cuda_graphs.model_graph_cache(model, ReplayBackend())  # as a GPU evaluation's sampler leaves it
        assert model.__dict__.get(cuda_graphs.MODEL_ATTRIBUTE) is kept
        record = evaluator.run([model], device=torch.device("cpu"))
        assert cuda_graphs.MODEL_ATTRIBUTE not in model.__dict__
        assert model.training
    assert record["generation_count"] == 3
    assert record["generation_settings"]["cuda_graph"] is True
