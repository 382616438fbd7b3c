"""Block diffusion trains through the runtime on CPU: the compiled demo-bd3lm ``ObjectiveConfig``
builds the objective, a tiny megatron-core GPTModel reads the 2L input (its RoPE repeated for the
two halves) under the block-diffusion mask on FlexAttention, and ``training.train`` runs its steps
with a finite loss."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import torch

from block_diffusion_kit import EOD, MASK, SEQ, VOCAB, cpu_train_world, tiny_transformer_config
from dlmspec.backends.megatron.config import (CheckpointConfig, LoggingConfig, ObjectiveConfig, RunConfig,
                                              ScheduleConfig)
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective, RepeatedHalvesRotary
from dlmspec.backends.megatron.stage import PretrainStage
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]


def _compiled_options() -> dict:
    text = render(resolve(load(ROOT / "specs" / "demo-bd3lm.toml").spec), "spec.toml")["train.py"]
    (call,) = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ObjectiveConfig"]
    return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}


def test_the_compiled_spec_carries_the_block_diffusion_options() -> None:
    got = _compiled_options()
    assert got["kind"] == "bd3lm"
    assert got["options"] == {"block_size": 16, "noise_range": [1e-3, 1.0], "ar_loss_weight": 0.0}


def test_block_diffusion_trains_a_few_steps_on_cpu(tmp_path: Path, monkeypatch) -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec

    options = _compiled_options()["options"]
    options["block_size"] = 8  # the tiny model's sequence of 32: four blocks
    run = RunConfig(
        objective=ObjectiveConfig(kind="bd3lm", mask_token_id=MASK, options=options),
        data=DataConfig(seq_length=SEQ, vocab_size=VOCAB, eod_id=EOD, mock=True, num_workers=0,
                        cache_dir=str(tmp_path / "cache")),
        schedule=ScheduleConfig(micro_batch_size=2, global_batch_size=4, train_iters=3, eval_interval=None),
        checkpoint=CheckpointConfig(save_dir=str(tmp_path / "ckpt"), save_interval=100, exit_signals=()),
        logging=LoggingConfig(run_dir=str(tmp_path / "run"), log_interval=1, tensorboard=False, console="plain"),
        seed=5,
    )
    seen, stage = [], PretrainStage(run)
    with cpu_train_world(tmp_path, monkeypatch, seen=seen):
        result = training.train(
            run, transformer_config=tiny_transformer_config(),
            layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False, attention_backend="flex"),
            model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                              rotary_base=10000),
            ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
            optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False), stage=stage)
    assert (result.iteration, result.exit_reason) == (3, "completed")
    assert isinstance(stage.objective, BlockDiffusionObjective) and stage.objective.block_size == 8
    # per-token loss over the x_t half only (no AR loss: the decoder passes the first half on), RoPE
    # repeated for the two halves
    assert stage.objective.noised_half_loss
    assert seen and all(got == ((2, SEQ), "RepeatedHalvesRotary") for got in seen), seen
    import json
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e.get("event") == "train"]
    assert len(losses) == 3 and all(math.isfinite(x) and x > 0 for x in losses)



def test_rope_of_the_doubled_input_repeats_the_first_halfs_angles(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # megatron-core's get_emb asks for it
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    inner = RotaryEmbedding(kv_channels=16, rotary_percent=1.0, rotary_base=10000, use_cpu_initialization=True)
    wrapped = RepeatedHalvesRotary(inner)
    got, half = wrapped(2 * 12), inner(12)
    assert torch.equal(got, torch.cat([half, half], dim=0)) and got.shape[0] == 24
    assert not torch.equal(inner(24), got)  # without the wrapper, x_0 would sit at positions 12..23
