"""The RL step-time call's summary (bench/sampling/rl_step_time.py) from files made here: per algorithm the
plan at the calibration's and at the host's launch time against the median measured step (start-up left
out), the rollout and the update apart, and one verdict over all algorithms; missing files summarised, not fatal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sampling" / "rl_step_time.py"
sys.path.insert(0, str(SCRIPT.parent))
import rl_step_time  # noqa: E402


def metrics(step_s: float, rollout_s: float, intervals: int = 6, host_us: float = 7.0) -> list:
    """An RL run's records: a host_launch event, then a train record every 2 steps (the first slow)."""
    rows = [{"event": "start", "iteration": 0, "time": 0.0},
            {"event": "host_launch", "phase": "start", "host_launch_us": host_us}]
    for k in range(1, intervals + 1):
        slow = 3.0 if k == 1 else 1.0
        rows.append({"event": "train", "iteration": 2 * k, "time": 10.0 * k, "step_time_s": step_s * slow,
                     "rl/rollout_seconds": rollout_s * slow, "rl/reward_seconds": 0.01 * k})
    return rows


def plan(step_s: float, rollout_per_step: float, mu: int = 2) -> dict:
    return {"gpu": {"id": "h100"}, "time": {"step_seconds": step_s, "breakdown_seconds": {"rl_rollout": rollout_per_step}},
            "rl": {"rollout_seconds": rollout_per_step * mu, "estimator": "one-step", "estimator_passes": 1}}


def write_algo(logs: Path, algo: str, *, step_s: float, rollout_s: float, planned: float, planned_host: float) -> None:
    folder = logs / algo
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics(step_s, rollout_s)))
    (folder / "plan.json").write_text(json.dumps(plan(planned, 0.02)))
    (folder / "plan-host.json").write_text(json.dumps({"ok": True, "result": plan(planned_host, 0.02)}))


def test_each_algorithm_is_compared_at_the_host_launch_time_and_parts_are_apart(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_algo(logs, "diffu-grpo", step_s=0.2, rollout_s=0.05, planned=0.25, planned_host=0.19)
    write_algo(logs, "grpo", step_s=0.5, rollout_s=0.2, planned=0.7, planned_host=0.52)
    s = rl_step_time.summarize(logs, ["diffu-grpo", "grpo"], {"gpu": "h100"})
    d = s["algorithms"]["diffu-grpo"]
    assert d["host_launch_us"] == 7.0
    assert d["step_time"]["measured"]["median_s"] == pytest.approx(0.2)  # the slow first interval left out
    assert d["step_time"]["planned_over_measured"] == pytest.approx(1.25)
    assert d["at_host_launch"]["planned_over_measured"] == pytest.approx(0.95)
    # update per step: (2 x 0.2 - 0.05) / 2; planned: 0.19 - 0.02
    assert d["parts"]["measured"]["update_s_per_step"] == pytest.approx(0.175)
    assert d["parts"]["measured"]["reward_batch_s"] == pytest.approx(0.04)  # median of 0.02 ... 0.06
    assert d["parts"]["planned_at_host_launch"]["update_s_per_step"] == pytest.approx(0.17)
    assert d["parts"]["rollout_batch_s_planned_at_host_over_measured"] == pytest.approx(0.04 / 0.05)
    assert s["all_within_tolerance_at_host_launch"] is True
    write_algo(logs, "coupled-grpo", step_s=0.4, rollout_s=0.05, planned=0.3, planned_host=0.3)  # 0.75: outside
    s = rl_step_time.summarize(logs, ["diffu-grpo", "coupled-grpo", "grpo"], {})
    assert s["algorithms"]["coupled-grpo"]["at_host_launch"]["within_tolerance"] is False
    assert s["all_within_tolerance_at_host_launch"] is False


def test_a_run_that_wrote_nothing_is_summarised_without_a_verdict(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "diffu-grpo").mkdir(parents=True)
    (logs / "diffu-grpo" / "plan.json").write_text(json.dumps(plan(0.2, 0.02)))
    out = tmp_path / "s.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--logs", str(logs), "--algos", "diffu-grpo coupled-grpo",
                           "--gpu", "h100", "--out", str(out), "--field", "dry=1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    s = json.loads(out.read_text())
    assert s["dry"] == 1 and s["all_within_tolerance_at_host_launch"] is False
    assert s["algorithms"]["diffu-grpo"]["step_time"]["measured"]["median_s"] is None
    assert s["algorithms"]["coupled-grpo"]["at_host_launch"] is None
