"""The whole of train() with SftStage on CPU (test_runtime_loop's one-process gloo world, a tiny
megatron-core GPTModel, the CUDA-only optimizer and schedule replaced by its fakes): padded and
packed conversations, the per-sequence loss normalisation, and an SFT run started from a
pre-training run's checkpoint (checkpoint.init_from = "mcore:...")."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from dlmspec.backends.megatron.config import CheckpointConfig, ObjectiveConfig, RunConfig
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.sft import SftConfig, SftStage
from sft_files import write_sft
from runtime_loop_kit import EOD, MASK, SEQ, VOCAB, _config, _events, _run, cpu_train  # noqa: F401 (fixture)
from runtime_loop_kit import _train as _train_loop


def _data(tmp_path: Path) -> str:
    rows = [([5 + i, 6, 7, 8][: 1 + i % 4], [9 + i % 50, 10, 11][: 1 + i % 3]) for i in range(24)]
    return write_sft(str(tmp_path / "chat_text_document"), rows, eod=EOD, vocab_size=VOCAB)


def _sft_run(tmp_path: Path, prefix: str, normalization: str, **checkpoint) -> RunConfig:
    base = _run(tmp_path / "sft")
    return dataclasses.replace(
        base,
        objective=ObjectiveConfig(kind="mdm", mask_token_id=MASK, loss_normalization=normalization),
        data=DataConfig(seq_length=SEQ, vocab_size=VOCAB, eod_id=EOD, blend=[(prefix, 1.0)], split="80,20,0",
                        num_workers=0, cache_dir=str(tmp_path / "cache")),
        checkpoint=dataclasses.replace(base.checkpoint, **checkpoint),
    )


def _train(run: RunConfig, stage, per_token: bool):
    import runtime_loop_kit

    original = runtime_loop_kit._config
    runtime_loop_kit._config = lambda: dataclasses.replace(original(), calculate_per_token_loss=per_token)
    try:
        return _train_loop(run, stage)
    finally:
        runtime_loop_kit._config = original


@pytest.mark.parametrize("packed", [False, True])
def test_train_runs_sft_and_records_it(tmp_path, cpu_train, packed: bool) -> None:
    run = _sft_run(tmp_path, _data(tmp_path), "sequence")
    result = _train(run, SftStage(run, SftConfig(packed_sequence=packed)), per_token=False)
    assert (result.iteration, result.exit_reason) == (4, "completed")
    events = _events(run)
    assert events[0]["objective"] == "sft-mdm"
    losses = [e["loss"] for e in events if e["event"] in ("train", "valid")]
    assert losses and all(math.isfinite(x) and 0 < x < 50 for x in losses)
    meta = json.loads((Path(run.checkpoint.save_dir) / "iter_0000004" / "dlmspec.json").read_text())
    assert meta["sft"]["packed_sequence"] is packed and meta["objective"]["loss_normalization"] == "sequence"


def test_sft_starts_from_a_pretraining_checkpoint(tmp_path, cpu_train) -> None:
    pretrain = _run(tmp_path / "pre")
    _train_loop(pretrain)
    run = _sft_run(tmp_path, _data(tmp_path), "global_token", init_from=f"mcore:{pretrain.checkpoint.save_dir}")
    result = _train(run, SftStage(run, SftConfig()), per_token=True)
    assert result.iteration == 4 and result.resumed_from is None
    start = _events(run)[0]
    assert start["weights"]["from"] == "init_from" and start["weights"]["kind"] == "mcore", start["weights"]


def test_train_runs_ar_sft(tmp_path, cpu_train) -> None:
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    from dlmspec.backends.megatron import training
    from dlmspec.backends.megatron.layers import build_layer_spec

    run = _sft_run(tmp_path, _data(tmp_path), "global_token")
    run = dataclasses.replace(run, objective=ObjectiveConfig(kind="ar"))
    result = training.train(
        run, transformer_config=_config(), layer_spec=build_layer_spec(attention="causal", use_transformer_engine=False),
        model_kwargs=dict(vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000),
        ddp_config=DistributedDataParallelConfig(use_distributed_optimizer=False),
        optimizer_config=OptimizerConfig(lr=1e-3, min_lr=1e-4, use_distributed_optimizer=False),
        stage=SftStage(run, SftConfig(packed_sequence=True, pad_eos_tokens=0)),
    )
    assert result.iteration == 4 and _events(run)[0]["objective"] == "sft-ar"
    assert math.isfinite(result.last_train_loss)


def test_the_demo_evaluation_loads_both_checkpoints_through_the_runtime(tmp_path, cpu_train) -> None:
    """bench/gpu/sft_eval.py's compare(): each checkpoint loaded into one model, scored on the same
    masks; a model against itself differs by exactly 0, another (here: the loop's fake optimizer
    never updates, so another seed's initial weights) by something."""
    import torch
    from megatron.core import parallel_state

    from bench_scripts import load_script
    from dlmspec.backends.megatron.layers import build_layer_spec, build_model
    from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
    from dlmspec.backends.megatron.sft import SftDataset, SftForwardStep

    evaluation = load_script("bench/gpu/sft_eval.py", "sft_eval_loop")
    pretrain = _run(tmp_path / "pre")
    _train_loop(pretrain)
    other = dataclasses.replace(_run(tmp_path / "other"), seed=6)
    _train_loop(other)
    prefix = _data(tmp_path)
    parallel_state.initialize_model_parallel()
    model = build_model(_config(), layer_spec=build_layer_spec(attention="bidirectional", use_transformer_engine=False),
                        vocab_size=VOCAB, max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000)
    ds = SftDataset.from_prefixes([prefix], seq_length=SEQ, eod_id=EOD, autoregressive=False, config=SftConfig())
    feed = evaluation.batches(ds, 8, 4)
    step = SftForwardStep(MaskedDiffusionObjective(MASK), seed=1, data_parallel_rank=0, eod_id=EOD,
                          device=torch.device("cpu"), loss_normalization="sequence")
    same = evaluation.compare(model, {"base": pretrain.checkpoint.save_dir, "tuned": pretrain.checkpoint.save_dir},
                              step, feed, 2, EOD)
    assert same["base_minus_tuned_sft"]["mean"] == 0 and same["base"]["sft"]["n"] == 8
    apart = evaluation.compare(model, {"base": pretrain.checkpoint.save_dir, "tuned": other.checkpoint.save_dir},
                               step, feed, 2, EOD)
    assert apart["base_minus_tuned_sft"]["mean"] != 0 and apart["base_minus_tuned_answer"]["mean"] != 0
    assert apart["tuned"]["checkpoint"] == str(Path(other.checkpoint.save_dir) / "iter_0000004")
