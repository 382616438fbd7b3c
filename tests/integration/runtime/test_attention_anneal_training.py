"""Attention annealing trains through the runtime on CPU: a spec's objective.attention_anneal_iters
reaches the compiled ObjectiveConfig, the mdm objective built from it hands each layer of a tiny
megatron-core GPTModel the step's annealed mask during the annealing steps and no mask after, on
the SDPA and the FlexAttention layers, and training.train finishes with finite losses."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from block_diffusion_kit import EOD, MASK, SEQ, VOCAB, cpu_train_world, tiny_transformer_config
from dlmspec.backends.megatron import masks
from dlmspec.backends.megatron.attention import FlexCoreAttention, SDPACoreAttention
from dlmspec.backends.megatron.config import (CheckpointConfig, LoggingConfig, ObjectiveConfig, RunConfig,
                                              ScheduleConfig)
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.objectives.mdm import MaskedDiffusionObjective
from dlmspec.backends.megatron.stage import PretrainStage
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import spec_file

K = 3  # annealing steps: steps 0 and 1 masked (ratios 1/3, 2/3), step 2 on full attention


def _compiled_objective(tmp_path: Path) -> dict:
    path = spec_file(tmp_path, {"objective.attention_anneal_iters": 40, "checkpoint.init_from": "mcore:ar",
                                "model.transformer_impl": "local", "model.attention_backend": "sdpa"})
    text = render(resolve(load(path).spec), "spec.toml")["train.py"]
    (call,) = [n for n in ast.walk(ast.parse(text))
               if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ObjectiveConfig"]
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def test_the_compiled_spec_carries_the_annealing_steps(tmp_path: Path) -> None:
    got = _compiled_objective(tmp_path)
    assert got["kind"] == "mdm" and got["options"] == {"attention_anneal_iters": 40}


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_an_annealed_mdm_run_trains_with_the_steps_masks_then_full_attention(tmp_path: Path, monkeypatch,
                                                                            backend) -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec

    calls = []  # (step's ratio, the mask the layer got)
    def spy(cls):
        inner = cls.forward

        def spied(self, query, key, value, attention_mask, *args, **kwargs):
            calls.append((stage.objective.attention_anneal_ratio, attention_mask))
            return inner(self, query, key, value, attention_mask, *args, **kwargs)
        monkeypatch.setattr(cls, "forward", spied)

    spy(FlexCoreAttention if backend == "flex" else SDPACoreAttention)
    run = RunConfig(
        objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK, variable_length_prob=0.0,
                                  options={"attention_anneal_iters": K}),
        data=DataConfig(seq_length=SEQ, vocab_size=VOCAB, eod_id=EOD, mock=True, num_workers=0,
                        cache_dir=str(tmp_path / "cache")),
        schedule=ScheduleConfig(micro_batch_size=2, global_batch_size=4, train_iters=4, eval_interval=None),
        checkpoint=CheckpointConfig(save_dir=str(tmp_path / "ckpt"), save_interval=100, exit_signals=()),
        logging=LoggingConfig(run_dir=str(tmp_path / "run"), log_interval=1, tensorboard=False, console="plain"),
        seed=5,
    )
    stage = PretrainStage(run)
    with cpu_train_world(tmp_path, monkeypatch):
        result = training.train(
            run, transformer_config=tiny_transformer_config(),
            layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False, attention_backend=backend),
            model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                              rotary_base=10000),
            ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
            optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False), stage=stage)
    assert (result.iteration, result.exit_reason) == (4, "completed")
    assert isinstance(stage.objective, MaskedDiffusionObjective) and stage.objective.attention_anneal_iters == K
    # 4 steps x 2 micro-batches x 2 layers; steps 0, 1 annealed (ratios 1/3, 2/3), steps 2, 3 full attention
    assert [r for r, _ in calls] == [1 / 3] * 4 + [2 / 3] * 4 + [1.0] * 8
    for ratio, mask in calls:
        if ratio < 1.0:
            assert isinstance(mask, masks.AnnealedCausal) and mask.ratio == ratio
        else:
            assert mask is None
    # the two layers of one micro-batch got the same mask object (one draw, one BlockMask)
    assert calls[0][1] is calls[1][1] and calls[0][1] is not calls[2][1]
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e.get("event") == "train"]
    assert len(losses) == 4 and all(math.isfinite(x) and x > 0 for x in losses)
