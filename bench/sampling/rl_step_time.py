"""The summary of the RL step-time call (bench/devbox/gpu/rl_step_time.sh): per algorithm, the planned RL
step (``dlmspec plan``: at the calibration's kernel-launch time and at the host's, measured by the run)
against the median measured step, and its two parts apart, the rollout and the update.

Reads, under ``--logs``, one folder per algorithm (each file may be missing: the summary then says so, it
never fails):

- ``ALGO/plan.json``: the compiled RL job's plan (``time.step_seconds``, ``time.breakdown_seconds``, ``rl.*``);
- ``ALGO/plan-host.json``: ``dlmspec plan --json`` of the same job at the host's measured launch time
  (``--set cluster.host_launch_us=``, the median of the run's ``host_launch`` events);
- ``ALGO/metrics.jsonl``: the run's ``train`` records (``step_time_s`` per log interval of 2 steps, a
  rollout batch and its two updates; ``rl/rollout_seconds`` of the interval's rollout batch, and
  ``rl/reward_seconds``, its detokenisation and reward scoring, where the run logs it).

Measured step: the median ``step_time_s`` leaving out the first interval (start-up, first kernels;
bench/sampling/rl_chain.py ``train_intervals``). Parts, per interval: the rollout is
``rl/rollout_seconds`` (one batch), the update per step is ``(steps x step_time_s - rollout) / steps``;
planned, the rollout batch is ``rl.rollout_seconds`` and the update per step ``time.step_seconds -
breakdown_seconds.rl_rollout``. The measured update holds the reward scoring, which the plan does not
price: ``reward_batch_s`` (the median ``rl/reward_seconds``) says how much of it that is. Target (the RL
stage's): planned within 15 % of measured, at the host's launch time, for every algorithm.

    python bench/sampling/rl_step_time.py --logs LOGS --algos "diffu-grpo coupled-grpo grpo" --gpu h100 --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from rl_chain import (STEP_TIME_TOLERANCE, field_value, host_launch_us, load_json, planned_step,  # noqa: E402
                      step_times, train_intervals)


def _plan_result(doc: Any) -> Optional[Dict[str, Any]]:
    """A plan dict from ``plan.json`` (the plan itself) or ``dlmspec plan --json`` (its envelope's ``result``)."""
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        return doc["result"]
    return doc if isinstance(doc, dict) and "time" in doc else None


def measured_parts(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Median rollout batch, its reward scoring (``None`` where the run does not log it) and update per
    step over the ``train`` records after the first (module docstring)."""
    rollouts, rewards, updates = [], [], []
    for r, steps in train_intervals(rows)[1:]:
        roll = r.get("rl/rollout_seconds")
        if not steps or not isinstance(roll, (int, float)):
            continue
        rollouts.append(float(roll))
        updates.append((steps * float(r["step_time_s"]) - float(roll)) / steps)
        if isinstance(r.get("rl/reward_seconds"), (int, float)):
            rewards.append(float(r["rl/reward_seconds"]))
    return {"rollout_batch_s": statistics.median(rollouts) if rollouts else None,
            "reward_batch_s": statistics.median(rewards) if rewards else None,
            "update_s_per_step": statistics.median(updates) if updates else None, "intervals": len(updates)}


def planned_parts(plan: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The plan's rollout batch and update per step (module docstring), ``None`` without a plan."""
    step = planned_step(plan)
    if step.get("step_s") is None:
        return {"rollout_batch_s": None, "update_s_per_step": None}
    return {"rollout_batch_s": step.get("rollout_batch_s"),
            "update_s_per_step": step["step_s"] - float(step.get("rollout_s_per_step") or 0.0)}


def summarize_algorithm(folder: Path) -> Dict[str, Any]:
    """One algorithm's comparison (module docstring)."""
    rows = common.read_metrics(folder / "metrics.jsonl") if (folder / "metrics.jsonl").is_file() else []
    plan, host_plan = _plan_result(load_json(folder / "plan.json")), _plan_result(load_json(folder / "plan-host.json"))
    measured = measured_parts(rows)
    out: Dict[str, Any] = {"host_launch_us": host_launch_us(rows), "step_time": step_times(plan, rows, None),
                           "at_host_launch": step_times(host_plan, rows, None) if host_plan else None,
                           "parts": {"measured": measured, "planned": planned_parts(plan),
                                     "planned_at_host_launch": planned_parts(host_plan)}}
    for part in ("rollout_batch_s", "update_s_per_step"):
        p, m = out["parts"]["planned_at_host_launch"].get(part), measured.get(part)
        out["parts"][f"{part}_planned_at_host_over_measured"] = p / m if p and m else None
    return out


def summarize(logs: Path, algos: List[str], extra: Dict[str, Any]) -> Dict[str, Any]:
    """The call's summary: each algorithm's comparison and whether all are within the tolerance at the host's launch time."""
    per = {a: summarize_algorithm(logs / a) for a in algos}
    verdicts = [(p.get("at_host_launch") or {}).get("within_tolerance") for p in per.values()]
    return {"suite": "rl-step-time", "tolerance": STEP_TIME_TOLERANCE, **extra,
            "all_within_tolerance_at_host_launch": all(v is True for v in verdicts) if verdicts else None,
            "algorithms": per}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="rl_step_time.py", description=__doc__.splitlines()[0])
    p.add_argument("--logs", required=True, help="the folder rl_step_time.sh wrote into (one sub-folder per algorithm)")
    p.add_argument("--algos", required=True, help='the algorithms run, space-separated, e.g. "diffu-grpo coupled-grpo grpo"')
    p.add_argument("--gpu", required=True, help="the GPU the jobs were compiled for (h100, h200)")
    p.add_argument("--out", required=True, help="the summary JSON to write")
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the call added to the summary (VALUE: a JSON number, true, false or null, else text)")
    a = p.parse_args(argv)
    extra: Dict[str, Any] = {"gpu": a.gpu}
    for item in a.field:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--field {item!r}: KEY=VALUE, e.g. --field rl_iters=40")
        extra[key] = field_value(value)
    summary = summarize(Path(a.logs), a.algos.split(), extra)
    Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    for algo, s in summary["algorithms"].items():
        host = s["at_host_launch"] or {}
        print(f"{algo}: measured {s['step_time']['measured'].get('median_s')} s a step; planned "
              f"{s['step_time']['planned'].get('step_s')} s ({s['step_time'].get('planned_over_measured')}), at the host's "
              f"{s['host_launch_us']} us a launch {(host.get('planned') or {}).get('step_s')} s "
              f"({host.get('planned_over_measured')}); parts {json.dumps(s['parts'])}")
    print(f"all within {STEP_TIME_TOLERANCE:.0%} at the host's launch time: {summary['all_within_tolerance_at_host_launch']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
