"""dlmspec.backends.megatron.hostbench: the host launch micro-benchmark and its metrics.jsonl event (CPU:
CUDA is monkeypatched where the measurement itself is not what is tested)."""

import json
import types

import pytest
import torch

from dlmspec.backends.megatron import hostbench
from dlmspec.backends.megatron.hostbench import HostLaunch, measure_host_launch, record_host_launch


class _Logger:
    def __init__(self):
        self.events = []

    def record(self, event, values, step=None):
        self.events.append((event, values))


def test_no_cuda_measures_and_logs_nothing(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measure_host_launch() is None
    logger = _Logger()
    assert record_host_launch(logger, "start", 0) is None
    assert logger.events == []


def test_refuses_empty_loops():
    with pytest.raises(ValueError):
        measure_host_launch(launches=0)
    with pytest.raises(ValueError):
        measure_host_launch(repeats=0)


def _fake_cuda(monkeypatch):
    """Run the loop on CPU tensors: CUDA calls become no-ops."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake")
    real_zeros = torch.zeros
    monkeypatch.setattr(hostbench.torch, "zeros", lambda *a, device=None, **k: real_zeros(*a, **k))


def test_measurement_shape_and_units(monkeypatch):
    _fake_cuda(monkeypatch)
    result = measure_host_launch(launches=50, repeats=3, warmup=5)
    assert isinstance(result, HostLaunch)
    assert len(result.repeats_seconds_per_launch) == 3 and result.launches == 50
    assert result.seconds_per_launch == sorted(result.repeats_seconds_per_launch)[1]
    assert 0 < result.seconds_per_launch < 1e-2  # a CPU add: microseconds
    rec = result.to_record()
    assert rec["host_launch_us"] == pytest.approx(result.seconds_per_launch * 1e6)
    assert len(rec["host_launch_repeats_us"]) == 3 and rec["device"] == "fake"


def test_event_written_through_the_logger(monkeypatch):
    fixed = HostLaunch(7e-6, [7e-6, 8e-6, 6e-6], 100, 1e-5, "fake")
    monkeypatch.setattr(hostbench, "measure_host_launch", lambda **kw: fixed)
    monkeypatch.setattr(hostbench.dist, "is_initialized", lambda: False)
    logger = _Logger()
    record = record_host_launch(logger, "end", 40)
    assert logger.events == [("host_launch", record)]
    assert record["phase"] == "end" and record["iteration"] == 40 and record["ranks"] == 1
    assert record["host_launch_us"] == pytest.approx(7.0) and record["host_launch_us_max"] == pytest.approx(7.0)
    json.dumps(record)


def test_event_in_metrics_jsonl(monkeypatch, tmp_path):
    """The runtime's MetricsLogger writes the event as one JSON line."""
    from dlmspec.backends.megatron.metrics import MetricsLogger

    fixed = HostLaunch(5e-6, [5e-6], 10, 0.0, "fake")
    monkeypatch.setattr(hostbench, "measure_host_launch", lambda **kw: fixed)
    monkeypatch.setattr(hostbench.dist, "is_initialized", lambda: False)
    config = types.SimpleNamespace(run_dir=str(tmp_path), console="plain", tensorboard=False)
    logger = MetricsLogger(config, enabled=True)
    record_host_launch(logger, "start", 0)
    logger.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "host_launch" and lines[0]["host_launch_us"] == pytest.approx(5.0)


def test_ranks_are_averaged(monkeypatch):
    """Two ranks: the mean and the max over ranks (the all_reduce stands in for both ranks)."""
    fixed = HostLaunch(4e-6, [4e-6], 10, 0.0, "fake")
    monkeypatch.setattr(hostbench, "measure_host_launch", lambda **kw: fixed)
    monkeypatch.setattr(hostbench.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(hostbench.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    other = 8.0  # the other rank's microseconds

    def all_reduce(t, op=None):
        t.copy_(t + other if op == hostbench.dist.ReduceOp.SUM else torch.maximum(t, torch.full_like(t, other)))

    monkeypatch.setattr(hostbench.dist, "all_reduce", all_reduce)
    logger = _Logger()
    record = record_host_launch(logger, "start", 0)
    assert record["host_launch_us"] == pytest.approx(6.0)
    assert record["host_launch_us_max"] == pytest.approx(8.0)
    assert record["host_launch_us_this_rank"] == pytest.approx(4.0) and record["ranks"] == 2
