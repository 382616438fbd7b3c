"""The summary of one RL chain GPU call (bench/devbox/gpu/task_rl.sh): held-out accuracy before and
after RL with their intervals, the reward and KL per logged step, planned against measured RL step
time, and the rollout benchmark beside d1's loop (bench/sampling/d1_rollout.py).

Reads only what the call wrote (each file may be missing: the summary then says so, it never fails):

- ``eval-before.json`` / ``eval-after.json``: ``dlmspec eval RUN --task FILE --json`` of the model RL
  starts from (the SFT model for the masked-diffusion algorithms, the pre-trained AR model for
  ``grpo``) and of the RL run, both greedy (the task spec's ``[generate]`` through ``--spec``);
- ``metrics-*.jsonl``: the runs' ``metrics.jsonl`` (``train`` records: ``step_time_s`` per log
  interval, ``rl/...``; ``generation_accuracy`` records of the task model's training);
- ``plan-rl.json``: the compiled RL job's ``plan.json`` (``time.step_seconds``, ``rl.*``);
- ``plan-rl-host.json``: ``dlmspec plan --json`` of the same job at the host's measured kernel-launch
  time (``--set cluster.host_launch_us=``, the median of the RL run's ``host_launch`` events: a small
  model's step is launch-bound and follows the host; ``host-launch`` prints that median);
- ``rollout-bench.json``: ``d1_rollout.py report``;
- ``steps.tsv``: ``name, exit code, start, end`` (epoch seconds) of every step the script ran.

Planned against measured step time: the plan's ``time.step_seconds`` (the mean step, a rollout batch
spread over its ``grpo_iterations`` steps, as the runtime's ``step_time_s`` averages a log interval)
and the median ``step_time_s`` of the RL run's ``train`` records, leaving out the first interval
(start-up, first kernels) and any interval that began before the held-out scoring of the starting
model (run beside the RL run's start) ended. Target: within 15 %. ``step_time.at_host_launch`` is the
same comparison for ``plan-rl-host.json``.

The model RL starts from (``pick-start``): of the starting run's checkpoints that have an in-training
held-out score on the *validation* prompts (``[eval.generation]``, greedy; the test prompts are kept
for the scoring before and after RL), the latest whose accuracy lies in ``[--min-accuracy,
--max-accuracy]`` (0.2 and 0.75): RL needs completions that are sometimes right (a group whose
rewards all agree has no advantage: from a start near 0 % almost every group is all wrong, and RL
learns nothing) and room above the start. When no scored checkpoint lies there the command writes
the candidates, says on stderr what to change (score the run more often) and exits 3; the chain
then stops rather than train RL from a start that cannot show a gain.

    python bench/sampling/rl_chain.py summary --logs LOGS --algo diffu-grpo --out OUT/summary.json
    python bench/sampling/rl_chain.py pick-start --run runs/task-addition-ar --min-accuracy 0.2 --max-accuracy 0.75 --out LOGS/start.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

#: Planned RL step time within this share of the measured one: the issue's target.
STEP_TIME_TOLERANCE = 0.15


def load_json(path: Path) -> Any:
    """The JSON document at ``path``, or ``None`` when it is missing or not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _dicts(doc: Any) -> Iterator[Dict[str, Any]]:
    todo = [doc]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            yield item
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


def heldout(path: Path) -> Optional[Dict[str, Any]]:
    """The ``dlmspec eval --task`` result in ``path`` (the object holding ``accuracy`` and
    ``interval_95``, wherever the JSON envelope nests it): accuracy, correct, n, interval, file and
    the sampler's temperature and steps."""
    for d in _dicts(load_json(path)):
        if "accuracy" in d and "interval_95" in d:
            settings = d.get("settings") or {}
            return {**{k: d.get(k) for k in ("accuracy", "correct", "n", "interval_95", "file", "seconds")},
                    "temperature": settings.get("temperature"), "steps": settings.get("steps"),
                    "gen_length": settings.get("gen_length")}
    return None


def intervals_overlap(a: List[float], b: List[float]) -> bool:
    """Whether the closed intervals ``[a0, a1]`` and ``[b0, b1]`` share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def compare_heldout(before: Optional[Dict[str, Any]], after: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Accuracy after RL against before: the difference, whether the 95 % intervals overlap and
    whether the issue's criterion holds (after above before, intervals apart)."""
    if not before or not after:
        return {"criterion_met": None, "why": "a held-out score is missing"}
    overlap = intervals_overlap(before["interval_95"], after["interval_95"])
    better = after["accuracy"] > before["accuracy"]
    return {"difference": after["accuracy"] - before["accuracy"], "intervals_overlap": overlap,
            "after_above_before": better, "criterion_met": better and not overlap,
            "same_sampler": (before.get("temperature"), before.get("steps")) == (after.get("temperature"), after.get("steps"))}


def rl_curve(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per logged RL step: iteration, mean reward, rollout exact-match share, KL, clip fraction,
    step time, rollout tokens/s, and the seconds of the interval's rollouts and of its last update
    (``rl/rollout_seconds``, ``rl/update_seconds``: where a step's time goes)."""
    keys = {"reward": "rl/reward_mean", "accuracy": "rl/accuracy", "kl": "rl/kl", "clip": "rl/clip_fraction",
            "step_time_s": "step_time_s", "rollout_tokens_per_s": "rl/rollout_tokens_per_s",
            "rollout_seconds": "rl/rollout_seconds", "update_seconds": "rl/update_seconds"}
    return [{"iteration": r.get("iteration"), **{k: r.get(v) for k, v in keys.items()}}
            for r in rows if r.get("event") == "train" and "rl/reward_mean" in r]


def train_intervals(rows: List[Dict[str, Any]]) -> List[Tuple[Dict[str, Any], Optional[int]]]:
    """``(record, steps)`` of each ``train`` record with a ``step_time_s``, in order, ``steps`` the
    iterations since the record before (``None`` for the first and where unknown). The first record's
    interval holds the start-up and first kernels: measurements leave it out."""
    train = [r for r in rows if r.get("event") == "train" and isinstance(r.get("step_time_s"), (int, float))]
    out, previous = [], None
    for r in train:
        iteration = r.get("iteration")
        out.append((r, (iteration - previous) if isinstance(iteration, int) and isinstance(previous, int) else None))
        previous = iteration if isinstance(iteration, int) else previous
    return out


def measured_step_seconds(rows: List[Dict[str, Any]], *, not_before: Optional[float] = None) -> Dict[str, Any]:
    """The median ``step_time_s`` of the ``train`` records, leaving out the first (start-up) and any
    whose interval (``time - steps x step_time_s``, to ``time``) began before ``not_before``."""
    intervals = train_intervals(rows)
    kept = []
    for r, steps in intervals[1:]:
        began = r.get("time") - steps * r["step_time_s"] if steps and isinstance(r.get("time"), (int, float)) else None
        if not_before is not None and (began is None or began < not_before):
            continue
        kept.append(float(r["step_time_s"]))
    return {"median_s": statistics.median(kept) if kept else None, "intervals": len(kept),
            "left_out": len(intervals) - len(kept), "values": kept}


def planned_step(plan: Any) -> Dict[str, Any]:
    """The plan's step time and its RL terms (``None`` where the plan is missing)."""
    if not isinstance(plan, dict):
        return {"step_s": None}
    time_ = plan.get("time") or {}
    rl = plan.get("rl") or {}
    parts = time_.get("breakdown_seconds") or {}
    return {"step_s": time_.get("step_seconds"), "gpu": (plan.get("gpu") or {}).get("id"),
            "rollout_s_per_step": parts.get("rl_rollout"), "scoring_s_per_step": parts.get("rl_scoring"),
            "rollout_batch_s": rl.get("rollout_seconds"), "rollout_share": rl.get("rollout_share"),
            "estimator": rl.get("estimator"), "estimator_passes": rl.get("estimator_passes")}


def step_times(plan: Any, rows: List[Dict[str, Any]], not_before: Optional[float]) -> Dict[str, Any]:
    """Planned against measured RL step time and whether they agree within :data:`STEP_TIME_TOLERANCE`
    (``|planned - measured| / measured``)."""
    planned, measured = planned_step(plan), measured_step_seconds(rows, not_before=not_before)
    out: Dict[str, Any] = {"planned": planned, "measured": measured, "tolerance": STEP_TIME_TOLERANCE}
    p, m = planned.get("step_s"), measured.get("median_s")
    if p and m:
        out["planned_over_measured"] = p / m
        out["relative_error"] = abs(p - m) / m
        out["within_tolerance"] = out["relative_error"] <= STEP_TIME_TOLERANCE
    return out


def host_launch_us(rows: List[Dict[str, Any]]) -> Optional[float]:
    """The median ``host_launch_us`` of the run's ``host_launch`` events (microseconds per eager kernel
    launch on the run's host, backends/megatron/metrics.py), ``None`` without one."""
    values = [float(r["host_launch_us"]) for r in rows
              if r.get("event") == "host_launch" and _finite(r.get("host_launch_us"))]
    return statistics.median(values) if values else None


def steps_table(path: Path) -> Dict[str, Dict[str, Any]]:
    """``steps.tsv`` as ``{name: {"exit", "start", "end", "seconds"}}`` (the last line of a name)."""
    out: Dict[str, Dict[str, Any]] = {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        cells = line.split("\t")
        if len(cells) != 4:
            continue
        name, code, start, end = cells
        try:
            s, e = float(start), float(end)
        except ValueError:
            continue
        out[name] = {"exit": code, "start": s, "end": e, "seconds": e - s}
    return out


def training(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A training run's last iteration, last train and validation loss, median step time, and its
    in-training generation accuracy per evaluation (``[eval.generation]``)."""
    train = [r for r in rows if r.get("event") == "train"]
    valid = [r for r in rows if r.get("event") == "valid" and isinstance(r.get("loss"), (int, float))]
    gens = [{"iteration": r.get("iteration"), "accuracy": r["generation_accuracy"],
             "interval_95": r.get("generation_interval_95")} for r in rows if "generation_accuracy" in r]
    exits = [r for r in rows if r.get("event") == "exit"]
    times = [r["step_time_s"] for r in train[1:] if isinstance(r.get("step_time_s"), (int, float))]
    return {"last_iteration": train[-1].get("iteration") if train else None,
            "train_iters": train[-1].get("train_iters") if train else None,
            "last_loss": train[-1].get("loss") if train else None,
            "last_valid_loss": valid[-1]["loss"] if valid else None,
            "median_step_time_s": statistics.median(times) if times else None,
            "generation_accuracy": gens, "exit": exits[-1].get("reason") if exits else None}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _median(values: List[Any]) -> Optional[float]:
    kept = [float(v) for v in values if _finite(v)]
    return statistics.median(kept) if kept else None


def summarize(logs: Path, algo: str, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The summary of the call whose files are in ``logs`` (module docstring)."""
    logs = Path(logs)
    steps = steps_table(logs / "steps.tsv")
    before, after = heldout(logs / "eval-before.json"), heldout(logs / "eval-after.json")
    rl_rows = common.read_metrics(logs / "metrics-rl.jsonl")
    curve = rl_curve(rl_rows)
    not_before = (steps.get("eval-before") or {}).get("end")
    bench = load_json(logs / "rollout-bench.json")
    summary: Dict[str, Any] = {
        "algorithm": algo,
        "heldout_before": before, "heldout_after": after, "heldout": compare_heldout(before, after),
        "rl_steps_logged": len(curve),
        "reward_first": curve[0]["reward"] if curve else None, "reward_last": curve[-1]["reward"] if curve else None,
        "kl_last": curve[-1]["kl"] if curve else None,
        "rl_curve": curve,
        "step_time": step_times(load_json(logs / "plan-rl.json"), rl_rows, not_before),
        "host_launch_us": host_launch_us(rl_rows),
        "rollout_bench": None if not isinstance(bench, dict) else {
            k: bench.get(k) for k in ("tokens_per_second", "ratios", "fastest_d1", "ratio_over_fastest_d1", "target",
                                      "target_met", "rollout_exact_match", "greedy_agreement", "rows", "settings",
                                      "sides", "error")},
        "rl_logged_rollout_seconds": _median([c["rollout_seconds"] for c in curve[1:]]),
        "rl_logged_rollout_tokens_per_s": statistics.median([c["rollout_tokens_per_s"] for c in curve
                                                             if _finite(c["rollout_tokens_per_s"])])
        if any(_finite(c["rollout_tokens_per_s"]) for c in curve) else None,
        "training": {name: training(common.read_metrics(logs / f"metrics-{name}.jsonl")) for name in ("task", "sft", "rl")
                     if (logs / f"metrics-{name}.jsonl").exists()},
        "start": load_json(logs / "start.json"),
        "steps": steps,
    }
    host_plan = load_json(logs / "plan-rl-host.json")
    if isinstance(host_plan, dict) and isinstance(host_plan.get("result"), dict):  # dlmspec plan --json's envelope
        summary["step_time"]["at_host_launch"] = step_times(host_plan["result"], rl_rows, not_before)
    if extra:
        summary.update(extra)
    return summary


def field_value(text: str) -> Any:
    """A ``--field`` value: a JSON number, ``true``, ``false`` or ``null`` as such, any other text as
    the string it is (never parsed as an object or list)."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if value is None or isinstance(value, (bool, int, float)) else text


#: ``pick-start``'s exit status when no scored checkpoint lies in the range.
NO_START = 3


def scored_checkpoints(run_dir: Path) -> List[Dict[str, Any]]:
    """``[{"iteration", "accuracy"}, ...]`` by iteration: the run's checkpoints (``iter_*/dlmspec.json``)
    that have an in-training ``generation_accuracy`` record (a resume's later record wins)."""
    root = Path(run_dir) / "checkpoints"
    scored: Dict[int, float] = {}
    for r in common.read_metrics(Path(run_dir)):
        it, acc = r.get("iteration"), r.get("generation_accuracy")
        if isinstance(it, int) and _finite(acc) and (root / f"iter_{it:07d}" / "dlmspec.json").is_file():
            scored[it] = float(acc)
    return [{"iteration": it, "accuracy": scored[it]} for it in sorted(scored)]


def best_checkpoint(run_dir: Path) -> Dict[str, Any]:
    """The run's checkpoint with the highest in-training validation accuracy (the latest of equals):
    ``{"checkpoint", "iteration", "accuracy", "rule", "candidates"}``; ``checkpoint`` is the run's
    checkpoints folder (its latest) when none is scored. The model the fast-sampling suite measures."""
    root = Path(run_dir) / "checkpoints"
    candidates = scored_checkpoints(run_dir)
    if not candidates:
        return {"checkpoint": str(root), "iteration": None, "accuracy": None, "candidates": [],
                "rule": "no checkpoint with an in-training score: the run's latest"}
    chosen = max(reversed(candidates), key=lambda c: c["accuracy"])
    return {"checkpoint": str(root / f"iter_{chosen['iteration']:07d}"), **chosen,
            "rule": "the highest validation accuracy (the latest of equals)", "candidates": candidates}


def pick_start(run_dir: Path, max_accuracy: float, min_accuracy: float = 0.2) -> Dict[str, Any]:
    """The checkpoint RL starts from (module docstring): ``{"checkpoint", "iteration", "accuracy",
    "rule", "min_accuracy", "max_accuracy", "candidates"}``; ``checkpoint`` is an ``iter_*`` folder, or
    ``None`` when no scored checkpoint (``candidates``: every one with an in-training score) has an
    accuracy in ``[min_accuracy, max_accuracy]`` (``rule`` then says why)."""
    run_dir = Path(run_dir)
    root = run_dir / "checkpoints"
    candidates = scored_checkpoints(run_dir)
    base = {"min_accuracy": min_accuracy, "max_accuracy": max_accuracy, "candidates": candidates}
    within = [c for c in candidates if min_accuracy <= c["accuracy"] <= max_accuracy]
    if not within:
        seen = ", ".join(f"{c['iteration']}: {c['accuracy']:.3f}" for c in candidates) or "none"
        return {"checkpoint": None, "iteration": None, "accuracy": None, **base,
                "rule": f"no checkpoint of {run_dir} scored in training lies in [{min_accuracy}, {max_accuracy}] "
                        f"(iteration: validation accuracy, {seen})"}
    chosen = within[-1]
    return {"checkpoint": str(root / f"iter_{chosen['iteration']:07d}"), **chosen,
            "rule": f"the latest with validation accuracy in [{min_accuracy}, {max_accuracy}]", **base}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "pick-start":
        q = argparse.ArgumentParser(prog="rl_chain.py pick-start", description=pick_start.__doc__.splitlines()[0])
        q.add_argument("--run", required=True, help="the starting run's folder (metrics.jsonl, checkpoints/)")
        q.add_argument("--min-accuracy", type=float, default=0.2)
        q.add_argument("--max-accuracy", type=float, default=0.75)
        q.add_argument("--out", required=True, help="the choice as JSON")
        a = q.parse_args(argv[1:])
        for flag, value, example in (("--min-accuracy", a.min_accuracy, "0.2"), ("--max-accuracy", a.max_accuracy, "0.75")):
            if not 0.0 <= value <= 1.0:
                q.error(f"{flag} {value}: a share in [0, 1], e.g. {example}")
        if a.min_accuracy > a.max_accuracy:
            q.error(f"--min-accuracy {a.min_accuracy} is above --max-accuracy {a.max_accuracy}; e.g. 0.2 and 0.75")
        choice = pick_start(Path(a.run), a.max_accuracy, a.min_accuracy)
        Path(a.out).write_text(json.dumps(choice, indent=1) + "\n")
        if choice["checkpoint"] is None:
            print(f"rl_chain.py pick-start: {choice['rule']}: RL from such a start cannot show a gain. Score the run "
                  f"more often (a smaller save and eval interval) or train it less, or widen the range "
                  f"(--min-accuracy / --max-accuracy)", file=sys.stderr)
            return NO_START
        print(choice["checkpoint"])
        return 0
    if argv and argv[0] == "host-launch":
        q = argparse.ArgumentParser(prog="rl_chain.py host-launch", description=host_launch_us.__doc__.splitlines()[0])
        q.add_argument("--metrics", required=True, help="the RL run's metrics.jsonl")
        a = q.parse_args(argv[1:])
        value = host_launch_us(common.read_metrics(Path(a.metrics))) if Path(a.metrics).is_file() else None
        if value is None:
            return 1
        print(f"{value:.2f}")
        return 0
    if argv and argv[0] == "summary":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="rl_chain.py summary", description=__doc__.splitlines()[0])
    p.add_argument("--logs", required=True, help="the folder task_rl.sh wrote its files into")
    p.add_argument("--algo", required=True, help="diffu-grpo, coupled-grpo or grpo")
    p.add_argument("--out", required=True, help="summary.json to write")
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting of the call added to the summary (VALUE: a JSON number, true, false or null, "
                        "else the text as written)")
    args = p.parse_args(argv)
    extra: Dict[str, Any] = {}
    for item in args.field:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--field {item!r}: KEY=VALUE, e.g. --field gpu=h100")
        extra[key] = field_value(value)
    summary = summarize(Path(args.logs), args.algo, extra)
    Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")
    brief = {k: summary[k] for k in ("algorithm", "heldout_before", "heldout_after", "heldout", "reward_first",
                                     "reward_last", "kl_last")}
    brief["step_time"] = {k: summary["step_time"].get(k) for k in ("planned_over_measured", "within_tolerance")}
    brief["step_time"]["planned_s"] = summary["step_time"]["planned"].get("step_s")
    brief["step_time"]["measured_s"] = summary["step_time"]["measured"].get("median_s")
    host = summary["step_time"].get("at_host_launch")
    if host:
        brief["step_time"]["at_host_launch"] = {"host_launch_us": summary["host_launch_us"],
                                                "planned_s": host["planned"].get("step_s"),
                                                "planned_over_measured": host.get("planned_over_measured"),
                                                "within_tolerance": host.get("within_tolerance")}
    if summary["rollout_bench"]:
        brief["rollout_bench"] = {k: summary["rollout_bench"].get(k) for k in ("tokens_per_second", "ratio_over_fastest_d1",
                                                                               "target_met")}
    print(json.dumps(brief, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
