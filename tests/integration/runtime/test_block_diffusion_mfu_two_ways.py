"""A block-diffusion run's train records state MFU two ways, as the planner does: ``mfu`` and
``tflops_per_gpu`` with the step's model FLOPs per data token (2L positions at the mask's density:
the planner's ``mfu``), and ``data_mfu`` / ``data_tflops_per_gpu`` with the data tokens' own FLOPs
(what an MDM step over the same tokens counts: the planner's ``data_mfu``); a run whose input is its
data records only the first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron.config import LoggingConfig, TrainState
from dlmspec.backends.megatron.metrics import IntervalMeter, MetricsLogger


def _record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **meter) -> dict:
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), console="plain"), enabled=True)
    m = IntervalMeter(torch.device("cpu"), tokens_per_step=1000, world_size=2, peak_tflops=100.0, **meter)
    m.add(torch.tensor([2.0, 1.0]), True, 1.0)
    m.start -= 0.5  # the step took half a second: 2000 data tokens/s
    try:
        m.log(logger, TrainState(iteration=1), train_iters=4, lr=0.1)
    finally:
        logger.close()
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]


def test_block_diffusion_records_the_step_mfu_and_the_data_token_mfu(tmp_path: Path, monkeypatch) -> None:
    rec = _record(tmp_path, monkeypatch, flops_per_token=3_000_000_000_000, data_flops_per_token=2_000_000_000_000)
    tokens_per_s = rec["tokens_per_s"]
    assert rec["tflops_per_gpu"] == pytest.approx(3.0 * tokens_per_s / 2)
    assert rec["data_tflops_per_gpu"] == pytest.approx(2.0 * tokens_per_s / 2)
    assert rec["mfu"] == pytest.approx(rec["tflops_per_gpu"] / 100.0)
    assert rec["data_mfu"] == pytest.approx(rec["data_tflops_per_gpu"] / 100.0)


def test_a_run_whose_input_is_its_data_records_one_mfu(tmp_path: Path, monkeypatch) -> None:
    rec = _record(tmp_path, monkeypatch, flops_per_token=3_000_000_000_000)
    assert "data_mfu" not in rec and "data_tflops_per_gpu" not in rec and rec["mfu"] > 0
