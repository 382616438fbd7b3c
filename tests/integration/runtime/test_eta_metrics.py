"""Progress, tokens seen and time left in the training line; the masked-diffusion scalars (loss by
noise-level bucket, the realised mask ratio) and the timed phases of a start."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from dlmspec.backends.megatron.config import LoggingConfig, TrainState
from dlmspec.backends.megatron.metrics import (
    DLM_REPORT,
    DLM_SUMS,
    IntervalMeter,
    MetricsLogger,
    dlm_loss_sums,
    dlm_record,
    eta_seconds,
    format_count,
    format_duration,
    phase,
)
from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
from dlmspec.backends.megatron.stage import _fused_loss_func, _loss_func


def test_eta_is_the_steps_left_at_the_measured_step_time() -> None:
    assert eta_seconds(100, 300, 0.5) == 100.0
    assert eta_seconds(300, 300, 0.5) == 0.0
    assert eta_seconds(310, 300, 0.5) == 0.0  # never negative


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45.9, "45s"), (60, "1m00s"), (185, "3m05s"), (3600, "1h00m"), (7620, "2h07m"),
    (86400 * 3 + 3600 * 4 + 59, "3d04h"), (-1, "?"), (float("nan"), "?"), (float("inf"), "?"),
])
def test_durations_read_at_a_glance(seconds, text) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("n, text", [(950, "950"), (12_345, "12.3K"), (4_560_000, "4.56M"),
                                     (1_200_000_000, "1.2B"), (345_000_000_000, "345B"), (3.4e12, "3.4T")])
def test_counts_get_si_suffixes(n, text) -> None:
    assert format_count(n) == text


def test_the_train_line_and_record_carry_progress_tokens_and_eta(tmp_path, tmp_path_factory, monkeypatch, capsys):
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), tensorboard=False, console="plain"), enabled=True)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        meter = IntervalMeter(torch.device("cpu"), tokens_per_step=4096, flops_per_token=1000, world_size=1,
                              peak_tflops=None)
        clock = iter([14.0, 14.0])  # the interval started at 10 s, is logged at 14 s: 4 steps, 1 s each
        monkeypatch.setattr("dlmspec.backends.megatron.metrics.now", lambda: next(clock))
        meter.start = 10.0
        for _ in range(4):
            meter.add(torch.tensor([8.0, 4.0]), True, 1.0)
        meter.log(logger, TrainState(iteration=100, consumed_train_samples=400), train_iters=400, lr=1e-3)
    logger.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step_time_s"] == pytest.approx(1.0)
    assert record["eta_s"] == pytest.approx(300.0)  # 300 steps left at 1 s
    assert record["tokens_seen"] == 100 * 4096 and record["train_iters"] == 400
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "iter     100/400 (25%)" in line and "410K tokens" in line and line.endswith("ETA 5m00s")


def _mdm_batch(rows=4, seq=8):
    """An MDM batch of the objective's own masking (noise levels drawn per row)."""
    tokens = torch.arange(rows * seq).reshape(rows, seq) % 50
    return MaskedDiffusionObjective(mask_token_id=99).prepare({"tokens": tokens}, torch.Generator().manual_seed(0))


def test_loss_by_t_bucket_and_the_realised_mask_ratio() -> None:
    t = torch.tensor([0.1, 0.3, 0.9])
    masked = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    token_mask = torch.ones(3, 4, dtype=torch.bool)
    per_token = torch.tensor([[2.0, 9.0, 9.0, 9.0], [1.0, 3.0, 9.0, 9.0], [4.0, 5.0, 6.0, 9.0]])
    weights = masked.float() / t.unsqueeze(1)
    sums = dlm_loss_sums(per_token, weights, t, masked, token_mask)
    assert sums.shape == (DLM_SUMS,)
    record = dlm_record(sums + sums)  # summed over two microbatches: the same means
    assert record == {"loss_t0.00-0.25": pytest.approx(2.0), "loss_t0.25-0.50": pytest.approx(2.0),
                      "loss_t0.75-1.00": pytest.approx(5.0), "mask_ratio": pytest.approx(6 / 12)}
    # padding does not count; t = 1 falls in the last bucket
    token_mask[2, 3] = False
    record = dlm_record(dlm_loss_sums(per_token, weights, torch.tensor([0.1, 0.3, 1.0]), masked, token_mask))
    assert record["mask_ratio"] == pytest.approx(6 / 11) and record["loss_t0.75-1.00"] == pytest.approx(5.0)


def test_a_context_parallel_slice_counts_the_weighted_positions() -> None:
    t = torch.tensor([0.5])
    masked_full = torch.tensor([[1, 0, 1, 1]], dtype=torch.bool)  # the full sequence, before the CP slice
    weights = torch.tensor([[2.0, 0.0]])  # this rank's half
    sums = dlm_loss_sums(torch.tensor([[3.0, 7.0]]), weights, t, masked_full, torch.ones(1, 2, dtype=torch.bool))
    assert dlm_record(sums) == {"loss_t0.50-0.75": pytest.approx(3.0), "mask_ratio": pytest.approx(0.5)}


def test_the_loss_functions_report_the_dlm_sums() -> None:
    ob = _mdm_batch()
    per_token = torch.full(ob.loss_weights.shape, 2.0)
    _, _, report = _loss_func(ob, per_token)
    record = dlm_record(report[DLM_REPORT])
    expected_ratio = float(ob.masked.sum() / ob.token_mask.sum())
    assert record["mask_ratio"] == pytest.approx(expected_ratio)
    assert all(v == pytest.approx(2.0) for k, v in record.items() if k.startswith("loss_t"))
    assert sum(1 for k in record if k.startswith("loss_t")) >= 1
    # the fused output loss has no per-token loss: the mask ratio only
    weight = torch.randn(100, 16)
    _, _, report = _fused_loss_func(ob, weight, "torch", torch.randn(*ob.labels.shape, 16))
    assert set(dlm_record(report[DLM_REPORT])) == {"mask_ratio"}


def test_the_meter_logs_the_dlm_scalars(tmp_path, tmp_path_factory, monkeypatch) -> None:
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), tensorboard=False, console="plain"), enabled=True)
    t, masked = torch.tensor([0.6]), torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    sums = dlm_loss_sums(torch.tensor([[1.0, 3.0, 5.0, 5.0]]), masked.float() / 0.6, t, masked,
                         torch.ones(1, 4, dtype=torch.bool))
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        meter = IntervalMeter(torch.device("cpu"), tokens_per_step=4, flops_per_token=1, world_size=1,
                              peak_tflops=None)
        meter.add(torch.tensor([1.0, 1.0]), True, 1.0, sums)
        meter.add(torch.tensor([1.0, 1.0]), True, 1.0, sums)
        meter.log(logger, TrainState(iteration=2), train_iters=4, lr=0.1)
    logger.close()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["loss_t0.50-0.75"] == pytest.approx(2.0) and record["mask_ratio"] == pytest.approx(0.5)
    assert "loss_t0.00-0.25" not in record  # no sequence in that bucket


def test_a_phase_says_what_it_does_and_how_long_it_took(tmp_path, capsys) -> None:
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), tensorboard=False, console="plain"), enabled=True)
    timings: dict = {}
    with phase(logger, "building the datasets", timings, "build_data"):
        pass
    logger.close()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[dlmspec] building the datasets ..."
    assert out[1].startswith("[dlmspec] building the datasets: ") and out[1].endswith(" s")
    assert set(timings) == {"build_data"} and timings["build_data"] >= 0 and math.isfinite(timings["build_data"])


def test_a_rich_train_line_stays_one_line_in_a_log_file(tmp_path, tmp_path_factory, monkeypatch, capsys):
    """console = "auto"/"rich" into a file or pipe (SLURM logs, `| tee`): rich's 80-column default
    must not wrap the train line (it did on the H200: ETA on a third line, grep finds half)."""
    logger = MetricsLogger(LoggingConfig(run_dir=str(tmp_path), tensorboard=False, console="rich"), enabled=True)
    with megatron_cpu_world(tmp_path_factory, monkeypatch):
        meter = IntervalMeter(torch.device("cpu"), tokens_per_step=4096, flops_per_token=1000, world_size=1,
                              peak_tflops=None)
        clock = iter([14.0, 14.0])
        monkeypatch.setattr("dlmspec.backends.megatron.metrics.now", lambda: next(clock))
        meter.start = 10.0
        for _ in range(4):
            meter.add(torch.tensor([8.0, 4.0]), True, 1.0)
        meter.log(logger, TrainState(iteration=100, consumed_train_samples=400), train_iters=400, lr=1e-3)
    logger.close()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    [line] = [ln for ln in lines if "iter" in ln]
    assert len(line) > 80 and line.rstrip().endswith("ETA 5m00s")
