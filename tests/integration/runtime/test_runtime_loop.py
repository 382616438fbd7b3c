"""The training loop and its stage seam, on CPU.

``train()`` is the loop; a :class:`~dlmspec.backends.megatron.stage.Stage` supplies the data, the
objective and the per-step work (pre-training today). Here a fake stage runs through the loop's
step function and evaluation, and through the whole of ``train()``: a tiny megatron-core
GPTModel in a one-process gloo world, with the two pieces of megatron-core that need CUDA
replaced by fakes (the optimizer, ``MixedPrecisionOptimizer`` allocates on ``cuda``, and the
schedule, ``forward_backward_no_pipelining`` does too: :func:`_forward_backward` calls the
forward step per microbatch as megatron's no-pipelining schedule does).
"""

from __future__ import annotations

import ast
import contextlib
import functools
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
from dlmspec.backends.megatron.config import (
    CheckpointConfig,
    LoggingConfig,
    ObjectiveConfig,
    RunConfig,
    ScheduleConfig,
)
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.layers import build_layer_spec
from dlmspec.backends.megatron.microbatches import MicrobatchFeed
from dlmspec.backends.megatron.rng import TRAIN_STREAM, VALID_STREAM
from dlmspec.backends.megatron.stage import PretrainStage, Stage, StageContext, StageData
from dlmspec.backends.megatron.training import StepParts, evaluate, train_step

from runtime_loop_kit import (  # noqa: F401 (fixtures among them)
    EOD,
    MASK,
    SEQ,
    VOCAB,
    _Optimizer,
    _config,
    _events,
    _forward_backward,
    _run,
    _train,
    cpu_train,
    cpu_train_world,
)

ROOT = Path(__file__).resolve().parents[3]


# ------------------------------------------------------------------------------------------
# the shape of the loop


def test_train_is_under_150_lines() -> None:
    tree = ast.parse((ROOT / "backends" / "megatron" / "training.py").read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert node.end_lineno - node.lineno + 1 < 150


def test_the_loop_calls_the_stage_not_the_pretraining_code() -> None:
    tree = ast.parse((ROOT / "backends" / "megatron" / "training.py").read_text())
    imported = {alias.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for alias in n.names}
    pretraining = {"build_objective", "build_datasets", "build_dataloader", "ObjectiveForwardStep", "reduce_loss"}
    assert not imported & pretraining
    assert isinstance(PretrainStage(_run()), Stage)


# ------------------------------------------------------------------------------------------
# fakes


class _Chunk(torch.nn.Module):
    """A model chunk as the step sees it: megatron DDP's ``zero_grad_buffer`` and GPTModel's
    forward arguments; the output is ``weight * input_ids``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(2.0))
        self.zeroed = 0

    def zero_grad_buffer(self) -> None:
        self.zeroed += 1

    def forward(self, input_ids, position_ids, attention_mask, labels=None):
        return self.weight * input_ids.float()




class _Scheduler:
    def __init__(self) -> None:
        self.increments = []

    def step(self, increment: int) -> None:
        self.increments.append(increment)




def _tokens(value: int) -> dict:
    return {"tokens": torch.full((2, SEQ), value, dtype=torch.long)}


class FakeStage:
    """A stage of the seam's shape: its own batches (``tokens``, one id each), the model's
    output summed as the loss (GPTModel's per-token cross entropy, or :class:`_Chunk`'s)."""

    kind = "fake"

    def __init__(self, batches=None, valid_batches=None) -> None:
        self.calls = []
        self.batches = batches if batches is not None else [_tokens(i) for i in range(64)]
        self.valid_batches = valid_batches

    def setup(self, ctx, *, layer_spec, model_kwargs) -> None:
        self.calls.append(("setup", ctx.data_parallel_rank, ctx.data_parallel_size))

    def build_data(self, *, consumed_samples, num_chunks) -> StageData:
        self.calls.append(("build_data", consumed_samples, num_chunks))
        valid = None
        if self.valid_batches is not None:
            valid = lambda: MicrobatchFeed(self.valid_batches, num_chunks, VALID_STREAM)  # noqa: E731
        return StageData(train=MicrobatchFeed(self.batches, num_chunks, TRAIN_STREAM), valid=valid)

    def prepare_model(self, model) -> str:
        self.calls.append(("prepare_model", len(model)))
        return "fake"

    def before_step(self, iteration, model) -> None:
        self.calls.append(("before_step", iteration))

    def forward_step(self, data_iterator, model):
        item = next(data_iterator)
        self.calls.append(("forward", item.stream, item.iteration, item.index))
        tokens = item.batch["tokens"]
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)
        return model(tokens, positions, None, labels=tokens), self._loss

    @staticmethod
    def _loss(output):
        loss_sum = output.sum()
        num_tokens = torch.tensor(output.numel(), dtype=torch.int)
        return loss_sum, num_tokens, {"lm loss": torch.stack([loss_sum.detach(), num_tokens.float()])}

    def checkpoint_metadata(self):
        return {"objective": {"kind": self.kind}}


def _parts(model, optimizer, scheduler, num_microbatches=2, calls=None) -> StepParts:
    return StepParts(model=model, optimizer=optimizer, scheduler=scheduler,
                     forward_backward=functools.partial(_forward_backward, calls=calls),
                     num_microbatches=num_microbatches, micro_batch_size=2, seq_length=SEQ,
                     device=torch.device("cpu"))


# ------------------------------------------------------------------------------------------
# the step function and evaluation with a fake stage


def test_a_fake_stage_runs_through_the_step_function() -> None:
    stage, chunk, optimizer, scheduler, calls = FakeStage(), _Chunk(), _Optimizer(), _Scheduler(), []
    feed = stage.build_data(consumed_samples=0, num_chunks=1).train
    out = train_step(_parts([chunk], optimizer, scheduler, calls=calls), stage, feed, iteration=3)
    assert stage.calls[1:] == [("before_step", 3), ("forward", TRAIN_STREAM, 3, 0), ("forward", TRAIN_STREAM, 3, 1)]
    # microbatches 0 and 1 are the batches of ids 0 and 1 (2 x 32 each), times the weight 2
    assert out.loss.tolist() == [128.0, 128.0] and out.update_ok and out.grad_norm == 1.5
    assert calls == [dict(num_microbatches=2, seq_length=SEQ, micro_batch_size=2, forward_only=False)]
    assert (chunk.zeroed, optimizer.zeroed, optimizer.steps, scheduler.increments) == (1, 1, 1, [1])
    assert float(chunk.weight.grad) == 64.0  # the backward ran through the stage's loss: d/dw sum(w * x)


def test_a_skipped_update_does_not_step_the_scheduler() -> None:
    stage, scheduler = FakeStage(), _Scheduler()
    feed = stage.build_data(consumed_samples=0, num_chunks=1).train
    out = train_step(_parts([_Chunk()], _Optimizer(update_ok=False, grad_norm=None), scheduler), stage, feed, 0)
    assert not out.update_ok and out.grad_norm != out.grad_norm  # NaN without a norm
    assert scheduler.increments == []


def test_evaluation_runs_the_stages_validation_feed_forward_only() -> None:
    valid = [_tokens(1), _tokens(3)] * 3
    stage, chunk, calls = FakeStage(valid_batches=valid), _Chunk(), []
    data = stage.build_data(consumed_samples=0, num_chunks=1)
    chunk.train()
    loss = evaluate(_parts([chunk], _Optimizer(), _Scheduler(), calls=calls), stage, data.valid, eval_iters=3)
    assert loss == pytest.approx(4.0)  # every step: 2 * (1 + 3) * 64 / 128
    assert [c[:3] for c in stage.calls[1:]] == [("forward", VALID_STREAM, i) for i in range(3) for _ in range(2)]
    assert all(c["forward_only"] for c in calls) and chunk.weight.grad is None
    assert chunk.training  # back in training mode afterwards
    assert evaluate(_parts([chunk], _Optimizer(), _Scheduler()), stage, None, eval_iters=3) is None


# ------------------------------------------------------------------------------------------
# the whole of train() on CPU














def test_train_runs_a_fake_stage(tmp_path, cpu_train) -> None:
    run = _run(tmp_path, eval_interval=None)
    stage = FakeStage()
    result = _train(run, stage)
    assert stage.calls[:3] == [("setup", 0, 1), ("build_data", 0, 1), ("prepare_model", 1)]
    steps = [c[1] for c in stage.calls if c[0] == "before_step"]
    assert steps == [0, 1, 2, 3]
    forwards = [c[2:] for c in stage.calls if c[0] == "forward"]
    assert forwards == [(i, m) for i in range(4) for m in range(2)]  # 4 / (2 * 1 rank) microbatches per step
    assert (result.iteration, result.consumed_train_samples, result.exit_reason) == (4, 16, "completed")
    events = _events(run)
    assert [e["event"] for e in events] == ["start", "train", "checkpoint", "train", "checkpoint", "exit"]
    assert events[0]["objective"] == "fake" and events[0]["cross_entropy"] == "fake"
    meta = json.loads((Path(run.checkpoint.save_dir) / "iter_0000004" / "dlmspec.json").read_text())
    assert meta["objective"] == {"kind": "fake"} and meta["reason"] == "interval"


def test_train_pretrains_with_the_default_stage(tmp_path, cpu_train) -> None:
    run = _run(tmp_path)
    result = _train(run)
    assert (result.iteration, result.consumed_train_samples, result.exit_reason) == (4, 16, "completed")
    assert result.checkpoint == str(tmp_path / "ckpt" / "iter_0000004")
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "iter_0000004"
    events = _events(run)
    assert [e["event"] for e in events] == ["start", "train", "valid", "checkpoint", "train", "valid",
                                            "checkpoint", "exit"]
    start = events[0]
    assert start["objective"] == "mdm" and start["attention"] == "bidirectional" and start["num_microbatches"] == 2
    assert start["weights"] == {"from": "random", "seed": 5} and start["cross_entropy"] == "megatron"
    train_losses = [e["loss"] for e in events if e["event"] == "train"]
    assert all(abs(loss - torch.log(torch.tensor(float(VOCAB)))) < 1.5 for loss in train_losses)  # untrained
    assert result.last_train_loss == train_losses[-1] and result.last_valid_loss == events[5]["loss"]
    status = json.loads((tmp_path / "run" / "exit_status.json").read_text())
    assert status == {"reason": "completed", "iteration": 4, "checkpoint": result.checkpoint, "signal": None}
    meta = json.loads((tmp_path / "ckpt" / "iter_0000004" / "dlmspec.json").read_text())
    assert meta["objective"]["kind"] == "mdm" and meta["consumed_train_samples"] == 16
    assert not parallel_state.model_parallel_is_initialized()  # train() tore its parallel state down


def test_train_resumes_and_stops_at_iteration(tmp_path, cpu_train, monkeypatch) -> None:
    _train(_run(tmp_path))
    from dlmspec.backends.megatron import checkpointing

    load = checkpointing.dist_checkpointing.load
    # the fake optimizer's empty state is dropped by megatron's loader: hand it back
    monkeypatch.setattr(checkpointing.dist_checkpointing, "load",
                        lambda *a, **k: {**load(*a, **k), "optimizer": {}})
    run = _run(tmp_path, train_iters=10, stop_at_iteration=6)
    result = _train(run)
    assert (result.resumed_from, result.iteration, result.exit_reason) == (4, 6, "stop_at_iteration")
    assert result.consumed_train_samples == 24
    events = _events(run)
    resume = [e for e in events if e["event"] == "resume"]
    assert resume and resume[0]["iteration"] == 4 and resume[0]["consumed_train_samples"] == 16
    assert [e["iteration"] for e in events if e["event"] == "checkpoint"][-1] == 6


def test_pretrain_stage_refuses_an_objective_the_layers_cannot_train() -> None:
    ctx = StageContext(run=_run(), device=torch.device("cpu"), data_parallel_rank=0, data_parallel_size=1,
                       context_parallel_size=1)
    kwargs = dict(vocab_size=VOCAB, max_sequence_length=SEQ)
    causal = build_layer_spec(attention="causal", use_transformer_engine=False)
    with pytest.raises(ValueError, match="needs attention in"):
        PretrainStage(_run()).setup(ctx, layer_spec=causal, model_kwargs=kwargs)
    bidirectional = build_layer_spec(attention="bidirectional", use_transformer_engine=False)
    with pytest.raises(ValueError, match="mask_token_id 126 outside the model vocabulary"):
        PretrainStage(_run()).setup(ctx, layer_spec=bidirectional, model_kwargs=dict(kwargs, vocab_size=100))
    with pytest.raises(ValueError, match="exceeds model max_sequence_length"):
        PretrainStage(_run()).setup(ctx, layer_spec=bidirectional, model_kwargs=dict(kwargs, max_sequence_length=16))
    stage = PretrainStage(_run())
    stage.setup(ctx, layer_spec=bidirectional, model_kwargs=kwargs)
    assert stage.kind == "mdm" and stage.checkpoint_metadata()["objective"]["mask_token_id"] == MASK


def test_microbatches_per_step_refuses_an_uneven_global_batch() -> None:
    assert checks.microbatches_per_step(ScheduleConfig(micro_batch_size=2, global_batch_size=16), 4) == 2
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
        checks.microbatches_per_step(ScheduleConfig(micro_batch_size=2, global_batch_size=10), 4)
