"""Helpers shared by tests (moved from runtime_loop_kit.py): EOD, MASK, SEQ, VOCAB, _Optimizer, _config, _events, _forward_backward, _run, _train, cpu_train, cpu_train_world."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.transformer_config import TransformerConfig
from dlmspec.backends.megatron import checks, training
from dlmspec.backends.megatron.config import CheckpointConfig, LoggingConfig, ObjectiveConfig, RunConfig, ScheduleConfig
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.layers import build_layer_spec


VOCAB, SEQ, EOD, MASK = 128, 32, 127, 126


class _Optimizer:
    """What the loop and ``OptimizerParamScheduler`` use of a megatron optimizer."""

    def __init__(self, update_ok: bool = True, grad_norm=1.5) -> None:
        self.param_groups = [{"params": [], "lr": 0.0}]
        self.update_ok, self.grad_norm = update_ok, grad_norm
        self.zeroed = self.steps = 0

    def zero_grad(self) -> None:
        self.zeroed += 1

    def step(self):
        self.steps += 1
        return self.update_ok, self.grad_norm, None

    def scale_loss(self, loss):
        return loss

    def sharded_state_dict(self, state, is_loading=False, metadata=None):
        return {}

    def load_state_dict(self, state) -> None:
        """Nothing to restore: this stand-in optimizer keeps no state (its sharded_state_dict is empty)."""


def _forward_backward(*, forward_step_func, data_iterator, model, num_microbatches, seq_length, micro_batch_size,
                      decoder_seq_length, forward_only, calls=None):
    """megatron-core's ``forward_backward_no_pipelining`` without its CUDA tensors: per
    microbatch the forward step, its loss function, the backward; the loss reports back."""
    if calls is not None:
        calls.append(dict(num_microbatches=num_microbatches, seq_length=seq_length,
                          micro_batch_size=micro_batch_size, forward_only=forward_only))
    chunk = model[0] if isinstance(model, list) else model
    reports = []
    for _ in range(num_microbatches):
        output, loss_func = forward_step_func(data_iterator, chunk)
        loss_sum, num_tokens, report = loss_func(output)
        if not forward_only:
            loss_sum.backward()
        reports.append(report)
    return reports


def _config() -> TransformerConfig:
    return TransformerConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, calculate_per_token_loss=True,
    )


def _run(tmp_path: Path | None = None, **schedule) -> RunConfig:
    root = tmp_path or Path("unused")
    return RunConfig(
        objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK),
        data=DataConfig(seq_length=SEQ, vocab_size=VOCAB, eod_id=EOD, mock=True, num_workers=0,
                        cache_dir=str(root / "cache")),
        schedule=ScheduleConfig(**{**dict(micro_batch_size=2, global_batch_size=4, train_iters=4, eval_interval=2,
                                          eval_iters=1), **schedule}),
        checkpoint=CheckpointConfig(save_dir=str(root / "ckpt"), save_interval=2, exit_signals=()),
        logging=LoggingConfig(run_dir=str(root / "run"), log_interval=2, tensorboard=False, console="plain"),
        seed=5,
    )


@contextlib.contextmanager
def cpu_train_world(tmp_path_factory, monkeypatch):
    """A gloo world of one process without megatron-core's parallel state (train() makes it),
    CUDA calls pointed at the CPU, and the optimizer and schedule replaced by the fakes."""
    created = False
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("pg") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        created = True
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    monkeypatch.setattr(checks, "cuda_problem", lambda **kwargs: None)
    monkeypatch.setattr(training, "prestart_checkpoint_helpers", lambda: None)  # tests/integration/runtime/test_runtime_signals_moe.py
    monkeypatch.setattr(training, "get_megatron_optimizer", lambda config, model: _Optimizer())
    monkeypatch.setattr(training, "get_forward_backward_func", lambda: _forward_backward)
    try:
        yield
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        if created:
            dist.destroy_process_group()


@pytest.fixture()
def cpu_train(tmp_path_factory, monkeypatch):
    """:func:`cpu_train_world` for one test."""
    with cpu_train_world(tmp_path_factory, monkeypatch):
        yield


def _train(run: RunConfig, stage=None):
    return training.train(
        run, transformer_config=_config(),
        layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False),
        model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope",
                          rotary_base=10000),
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
        optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False), stage=stage,
    )


def _events(run: RunConfig):
    return [json.loads(line) for line in (Path(run.logging.run_dir) / "metrics.jsonl").read_text().splitlines()]
