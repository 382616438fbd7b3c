"""Two result builders that read a run's ``metrics.jsonl`` through bench/common.py's ``read_metrics``
give the numbers they gave with their own loops (the expected values below are what the code
before the shared reader computed on the same fixture run folder, bench_tests/metrics_kit.py):
the scaling suite's member row (bench/scaling/run.py ``run_member``: train, validation loss of the
run's last ``valid``/``eval`` record, evaluation) and the RL chain's summary and start pick
(bench/sampling/rl_chain.py). Both fixtures end with a line cut mid-record, as a killed run leaves."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "bench" / "scaling", ROOT / "bench" / "sampling", Path(__file__).resolve().parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import metrics_kit  # noqa: E402

ENVELOPE = {"ok": True, "command": "eval", "result": {"elbo": {"count": {
    "nll_per_token": 2.5, "stderr_per_token": 0.01, "num_samples": 4, "num_sequences": 8, "num_tokens": 1024}}}}


def _load(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scaling_member(tmp_path: Path) -> dict:
    """``run_member`` of one member whose training writes the kit's run (cut last line) and whose
    evaluation prints an ELBO envelope; the seconds (wall clock) left out."""
    scaling = _load("scaling_run_for_reader_test", ROOT / "bench" / "scaling" / "run.py")
    source = metrics_kit.write_run_folder(tmp_path / "source")
    name = "kit-member"
    work, data = tmp_path / "work", tmp_path / "data"
    (work / "logs").mkdir(parents=True)
    data.mkdir()
    train = ("train", [sys.executable, "-c", "import os, shutil, sys; os.makedirs(sys.argv[2], exist_ok=True); "
                       "shutil.copy(sys.argv[1], os.path.join(sys.argv[2], 'metrics.jsonl'))",
                       str(source), f"runs/{name}"], {})
    ev = ("eval", [sys.executable, "-c", f"print({json.dumps(json.dumps(ENVELOPE))})"], {})
    out = scaling.run_member({"name": name}, train, ev, work, data, time.monotonic() + 120, threading.Lock())
    for part in ("train", "eval"):
        out[part].pop("seconds")
    return out


def test_the_scaling_member_row_keeps_its_validation_loss_and_evaluation(tmp_path) -> None:
    row = scaling_member(tmp_path)
    assert row == {
        "train": {"returncode": 0},
        "valid_loss": 0.75,
        "eval": {"returncode": 0},
        "eval_scores": {"kind": "elbo_count", "nll_per_token": 2.5, "stderr_per_token": 0.01, "num_samples": 4,
                        "num_sequences": 8, "num_tokens": 1024},
    }


def test_the_scaling_last_valid_loss_is_none_without_a_metrics_file(tmp_path) -> None:
    scaling = _load("scaling_run_for_reader_test", ROOT / "bench" / "scaling" / "run.py")
    assert scaling.last_valid_loss(tmp_path / "runs" / "never" / "metrics.jsonl") is None


def rl_logs(tmp_path: Path) -> Path:
    """A GPU call's logs folder with only the three runs' metrics (each cut mid-line)."""
    logs = tmp_path / "logs"
    metrics_kit.write_run_folder(logs, name="metrics-rl.jsonl", rl=True)
    metrics_kit.write_run_folder(logs, name="metrics-task.jsonl")
    metrics_kit.write_run_folder(logs, name="metrics-sft.jsonl")
    return logs


def test_the_rl_chain_summary_keeps_its_curve_step_time_and_training_rows(tmp_path) -> None:
    rl_chain = _load("rl_chain_for_reader_test", ROOT / "bench" / "sampling" / "rl_chain.py")
    s = rl_chain.summarize(rl_logs(tmp_path), "diffu-grpo")
    assert s["rl_steps_logged"] == 12
    assert s["reward_first"] == pytest.approx(0.41) and s["reward_last"] == pytest.approx(0.52)
    assert s["kl_last"] == pytest.approx(0.012)
    assert [c["iteration"] for c in s["rl_curve"]] == list(range(1, 13))
    assert s["rl_curve"][3] == {"iteration": 4, "reward": pytest.approx(0.44), "accuracy": pytest.approx(0.38),
                                "kl": pytest.approx(0.004), "clip": 0.0, "step_time_s": 0.101,
                                "rollout_tokens_per_s": 5004.0, "rollout_seconds": 0.05, "update_seconds": 0.04}
    assert s["step_time"] == {"planned": {"step_s": None}, "measured": {
        "median_s": 0.101, "intervals": 11, "left_out": 1,
        "values": pytest.approx([0.102, 0.1, 0.101, 0.102, 0.1, 0.101, 0.102, 0.1, 0.101, 0.102, 0.1])},
        "tolerance": 0.15}
    assert s["rl_logged_rollout_seconds"] == 0.05 and s["rl_logged_rollout_tokens_per_s"] == 5006.5
    expected_training = {"last_iteration": 12, "train_iters": 12, "last_loss": 0.833333, "last_valid_loss": 1.125,
                         "median_step_time_s": 0.101, "exit": "done",
                         "generation_accuracy": [{"iteration": 4, "accuracy": 0.1, "interval_95": None},
                                                 {"iteration": 8, "accuracy": 0.2, "interval_95": None},
                                                 {"iteration": 12, "accuracy": 0.30000000000000004,
                                                  "interval_95": None}]}
    assert s["training"] == {"task": expected_training, "sft": expected_training, "rl": expected_training}


def test_the_rl_chain_start_pick_keeps_its_scored_checkpoints(tmp_path) -> None:
    rl_chain = _load("rl_chain_for_reader_test", ROOT / "bench" / "sampling" / "rl_chain.py")
    run = tmp_path / "run"
    metrics_kit.write_run_folder(run)
    for it in (4, 8):
        (run / "checkpoints" / f"iter_{it:07d}").mkdir(parents=True)
        (run / "checkpoints" / f"iter_{it:07d}" / "dlmspec.json").write_text("{}")
    picked = rl_chain.pick_start(run, 0.15, 0.05)
    assert picked == {"checkpoint": str(run / "checkpoints" / "iter_0000004"), "iteration": 4, "accuracy": 0.1,
                      "rule": "the latest with validation accuracy in [0.05, 0.15]", "min_accuracy": 0.05,
                      "max_accuracy": 0.15,
                      "candidates": [{"iteration": 4, "accuracy": 0.1}, {"iteration": 8, "accuracy": 0.2}]}
