"""The RL chain's summary (bench/sampling/rl_chain.py) from the files a GPU call writes, made here:
held-out accuracy before and after with the interval criterion, the reward and KL curve, planned
against measured step time (start-up and the interval beside the starting model's scoring left out),
and a call whose steps failed (files missing or cut mid-line) still summarised."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sampling" / "rl_chain.py"
sys.path.insert(0, str(SCRIPT.parent))
import rl_chain  # noqa: E402


def eval_envelope(accuracy: float, low: float, high: float, n: int = 1000) -> dict:
    """What ``dlmspec eval --task FILE --json`` prints (the task result inside the envelope)."""
    return {"ok": True, "command": "eval", "result": {"model": {"kind": "mdm"}, "task": {
        "file": "t.jsonl", "n": n, "correct": round(accuracy * n), "accuracy": accuracy, "interval_95": [low, high],
        "settings": {"temperature": 0.0, "steps": 8, "gen_length": 8}, "seconds": 1.5}}}


def rl_metrics(start: float, step_s: float, intervals: int, every: int = 2) -> list:
    """``train`` records as the RL stage logs them every ``every`` steps, ``time`` at each log."""
    rows = [{"event": "start", "iteration": 0, "time": start}]
    t = start + 30.0  # start-up
    for k in range(1, intervals + 1):
        first = k == 1
        t += every * (step_s * 3 if first else step_s)
        rows.append({"event": "train", "iteration": k * every, "time": t, "loss": 0.1,
                     "step_time_s": step_s * 3 if first else step_s, "rl/reward_mean": 0.4 + 0.01 * k,
                     "rl/kl": 1e-3 * k, "rl/accuracy": 0.4 + 0.01 * k, "rl/clip_fraction": 0.0,
                     "rl/rollout_tokens_per_s": 5000.0, "rl/rollout_seconds": 0.2 if first else 0.1})
    return rows


def write_call(logs: Path, *, before=(0.40, 0.37, 0.43), after=(0.55, 0.52, 0.58), step_s=0.3, planned=0.27,
               eval_before_end=None) -> Path:
    logs.mkdir(parents=True)
    (logs / "eval-before.json").write_text(json.dumps(eval_envelope(*before)))
    (logs / "eval-after.json").write_text(json.dumps(eval_envelope(*after)))
    rows = rl_metrics(1000.0, step_s, 10)
    (logs / "metrics-rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (logs / "plan-rl.json").write_text(json.dumps({"gpu": {"id": "h100"}, "time": {
        "step_seconds": planned, "breakdown_seconds": {"rl_rollout": 0.08, "rl_scoring": 0.006}},
        "rl": {"rollout_seconds": 0.16, "estimator": "one-step", "estimator_passes": 1}}))
    end = eval_before_end if eval_before_end is not None else 1020.0
    (logs / "steps.tsv").write_text(f"train-sft\t0\t900\t1000\neval-before\t0\t1000\t{end}\ntrain-rl\t0\t1000\t1040\n")
    return logs


def test_after_above_before_with_intervals_apart_meets_the_criterion(tmp_path) -> None:
    s = rl_chain.summarize(write_call(tmp_path / "logs"), "diffu-grpo")
    assert s["heldout"]["criterion_met"] is True and s["heldout"]["intervals_overlap"] is False
    assert s["heldout"]["difference"] == pytest.approx(0.15) and s["heldout"]["same_sampler"] is True
    assert s["heldout_before"]["temperature"] == 0.0 and s["heldout_after"]["n"] == 1000


@pytest.mark.parametrize("after, met", [((0.44, 0.41, 0.47), False), ((0.35, 0.32, 0.38), False)])
def test_overlapping_or_lower_accuracy_after_rl_does_not_meet_it(tmp_path, after, met) -> None:
    s = rl_chain.summarize(write_call(tmp_path / "logs", after=after), "grpo")
    assert s["heldout"]["criterion_met"] is met


def test_reward_and_kl_curve_per_logged_step(tmp_path) -> None:
    s = rl_chain.summarize(write_call(tmp_path / "logs"), "diffu-grpo")
    assert s["rl_steps_logged"] == 10 and [c["iteration"] for c in s["rl_curve"]] == list(range(2, 21, 2))
    assert s["reward_first"] == pytest.approx(0.41) and s["reward_last"] == pytest.approx(0.50)
    assert s["kl_last"] == pytest.approx(0.01) and s["rl_logged_rollout_tokens_per_s"] == 5000.0
    assert s["rl_logged_rollout_seconds"] == pytest.approx(0.1)  # the first (start-up) interval left out


def test_measured_step_time_leaves_out_start_up_and_the_scoring_beside_it(tmp_path) -> None:
    # the first interval (3x slower: start-up, to 1031.8) is left out; the scoring of the starting model ended at
    # 1032.3, inside the second interval (1031.8 .. 1032.4): the second is left out too, the third (from 1032.4) kept
    s = rl_chain.summarize(write_call(tmp_path / "logs", eval_before_end=1032.3), "diffu-grpo")
    measured = s["step_time"]["measured"]
    assert measured["median_s"] == pytest.approx(0.3) and measured["intervals"] == 8 and measured["left_out"] == 2
    assert s["step_time"]["planned_over_measured"] == pytest.approx(0.9)
    assert s["step_time"]["within_tolerance"] is True


def test_a_plan_off_by_more_than_fifteen_percent_is_outside_the_tolerance(tmp_path) -> None:
    s = rl_chain.summarize(write_call(tmp_path / "logs", planned=0.2), "diffu-grpo")
    assert s["step_time"]["relative_error"] == pytest.approx(1 / 3) and s["step_time"]["within_tolerance"] is False


def test_a_call_whose_steps_failed_is_summarised_with_what_is_there(tmp_path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "eval-before.json").write_text("Traceback (most recent call last):\n  ...")  # eval crashed
    (logs / "metrics-rl.jsonl").write_text(json.dumps({"event": "train", "iteration": 2, "step_time_s": 0.3,
                                                        "rl/reward_mean": 0.5}) + "\n{\"event\": \"tra")  # cut
    (logs / "steps.tsv").write_text("train-rl\t124\t1\t2\nbroken line\n")
    s = rl_chain.summarize(logs, "coupled-grpo")
    assert s["heldout"] == {"criterion_met": None, "why": "a held-out score is missing"}
    assert s["rl_steps_logged"] == 1 and s["step_time"]["measured"]["median_s"] is None
    assert s["step_time"]["planned"] == {"step_s": None} and s["steps"]["train-rl"]["exit"] == "124"
    assert s["rollout_bench"] is None


def test_the_command_writes_the_summary_with_the_calls_settings(tmp_path) -> None:
    logs = write_call(tmp_path / "logs")
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "summary", "--logs", str(logs), "--algo", "diffu-grpo", "--out", str(out),
                           "--field", "gpu=h100", "--field", "rl_iters_run=20", "--field", "rl_lr=spec",
                           "--field", 'task=", "x": {"y'],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["gpu"] == "h100" and doc["rl_iters_run"] == 20 and doc["rl_lr"] == "spec"
    assert doc["task"] == '", "x": {"y' and "x" not in doc  # text stays text
    assert doc["heldout"]["criterion_met"] is True
    assert json.loads(proc.stdout)["step_time"]["planned_s"] == 0.27
    bad = subprocess.run([sys.executable, str(SCRIPT), "summary", "--logs", str(logs), "--algo", "x", "--out", str(out),
                          "--field", "no-equals-sign"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--field 'no-equals-sign'" in bad.stderr


def scored_run(root: Path, scores: dict, saved: set) -> Path:
    """A run folder whose metrics.jsonl scores ``{iteration: accuracy}`` in training and whose
    checkpoints folder holds the ``saved`` iterations."""
    rows = [{"event": "valid", "iteration": it, "loss": 1.0, "generation_accuracy": acc} for it, acc in scores.items()]
    root.mkdir(parents=True)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for it in saved:
        (root / "checkpoints" / f"iter_{it:07d}").mkdir(parents=True)
        (root / "checkpoints" / f"iter_{it:07d}" / "dlmspec.json").write_text("{}")
    return root


def test_rl_starts_from_the_latest_checkpoint_with_room_above_it(tmp_path) -> None:
    run = scored_run(tmp_path / "r", {250: 0.1, 500: 0.5, 750: 0.7, 1000: 0.9, 1250: 0.6}, {250, 500, 750, 1000})
    choice = rl_chain.pick_start(run, 0.75)
    # 1250 (0.6) has no checkpoint; 1000 is above 0.75: the latest within is 750
    assert choice["iteration"] == 750 and choice["checkpoint"].endswith("checkpoints/iter_0000750")
    assert [c["iteration"] for c in choice["candidates"]] == [250, 500, 750, 1000]


def test_pick_start_command_prints_the_checkpoint_and_refuses_a_cap_outside_zero_one(tmp_path) -> None:
    run = scored_run(tmp_path / "r", {10: 0.3}, {10})
    out = tmp_path / "start.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "pick-start", "--run", str(run), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("iter_0000010")
    assert json.loads(out.read_text())["accuracy"] == 0.3
    bad = subprocess.run([sys.executable, str(SCRIPT), "pick-start", "--run", str(run), "--out", str(out),
                          "--max-accuracy", "75"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--max-accuracy 75.0" in bad.stderr


def test_the_plan_at_the_hosts_launch_time_is_compared_beside_the_typical_hosts(tmp_path) -> None:
    logs = write_call(tmp_path / "logs", planned=0.45, step_s=0.3)  # the typical host's plan: 1.5x measured
    rows = rl_metrics(1000.0, 0.3, 10) + [{"event": "host_launch", "host_launch_us": us} for us in (7.0, 7.2, 9.9)]
    (logs / "metrics-rl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rl_chain.host_launch_us(rows) == 7.2  # the median of the run's measurements
    (logs / "plan-rl-host.json").write_text(json.dumps({"ok": True, "command": "plan", "result": {
        "gpu": {"id": "h100"}, "time": {"step_seconds": 0.31, "breakdown_seconds": {}}, "rl": {}}}))
    s = rl_chain.summarize(logs, "grpo")
    assert s["host_launch_us"] == 7.2
    assert s["step_time"]["within_tolerance"] is False
    host = s["step_time"]["at_host_launch"]
    assert host["planned"]["step_s"] == 0.31 and host["within_tolerance"] is True
    assert host["planned_over_measured"] == pytest.approx(0.31 / 0.3)
    proc = subprocess.run([sys.executable, str(SCRIPT), "host-launch", "--metrics", str(logs / "metrics-rl.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "7.20"
    none = subprocess.run([sys.executable, str(SCRIPT), "host-launch", "--metrics", str(tmp_path / "missing.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert none.returncode == 1 and none.stdout == ""
