"""What a block-diffusion training step does beyond its 2L tokens, checked on CPU: the block mask's
BlockMask is built once per shape for the whole run (not per micro-batch, step or layer), and the
loss carries weight only on the masked positions of the x_t half (the fused output projection then
projects no row of the clean half)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from block_diffusion_kit import EOD, MASK, SEQ, VOCAB, cpu_train_world, tiny_transformer_config
from dlmspec.backends.megatron import masks
from dlmspec.backends.megatron.config import (CheckpointConfig, LoggingConfig, ObjectiveConfig, RunConfig,
                                              ScheduleConfig)
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.backends.megatron.stage import PretrainStage


def test_the_block_mask_is_built_once_for_every_micro_batch_step_and_layer(tmp_path: Path, monkeypatch) -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec

    built = []
    build = masks._build_block_mask
    monkeypatch.setattr(masks, "_build_block_mask", lambda *a, **k: built.append(a[2:4]) or build(*a, **k))
    masks.clear_block_mask_cache()
    run = RunConfig(
        objective=ObjectiveConfig(kind="bd3lm", mask_token_id=MASK,
                                  options={"block_size": 8, "noise_range": [1e-3, 1.0], "ar_loss_weight": 0.0}),
        data=DataConfig(seq_length=SEQ, vocab_size=VOCAB, eod_id=EOD, mock=True, num_workers=0,
                        cache_dir=str(tmp_path / "cache")),
        schedule=ScheduleConfig(micro_batch_size=2, global_batch_size=4, train_iters=3, eval_interval=None),
        checkpoint=CheckpointConfig(save_dir=str(tmp_path / "ckpt"), save_interval=100, exit_signals=()),
        logging=LoggingConfig(run_dir=str(tmp_path / "run"), log_interval=1, tensorboard=False, console="plain"),
        seed=5,
    )
    with cpu_train_world(tmp_path, monkeypatch):
        result = training.train(
            run, transformer_config=tiny_transformer_config(),
            layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False, attention_backend="flex"),
            model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                              rotary_base=10000),
            ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
            optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False),
            stage=PretrainStage(run))
    assert result.iteration == 3
    # 3 steps x 2 micro-batches x 2 layers = 12 attention calls, one BlockMask of 2L x 2L
    assert built == [(2 * SEQ, 2 * SEQ)], built


def test_only_masked_positions_of_the_noised_half_carry_loss() -> None:
    objective = BlockDiffusionObjective(MASK, block_size=8)
    tokens = torch.randint(0, MASK, (4, SEQ), generator=torch.Generator().manual_seed(0))
    ob = objective.prepare({"tokens": tokens}, torch.Generator().manual_seed(1))
    carries = ob.loss_weights != 0
    assert not bool(carries[:, SEQ:].any())  # the clean half: no loss row to project
    assert torch.equal(carries[:, :SEQ], ob.masked[:, :SEQ])
    assert math.isclose(float(carries.float().mean()), float(ob.masked.float().mean()))
