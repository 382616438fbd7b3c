"""megatron-core's uneven pipeline splits on two GPUs: the compiled demo model on PP 2, split each way
dlmspec's ``[parallel]`` keys allow, trained a few steps, its measured peak memory and step time
against the plan's.

Each configuration is ``specs/demo-dlm.toml`` on megatron's mock data (NullTokenizer) with ``--set``
overrides (:data:`CONFIGS`): the even split (12 layers, 6 + 6), both accounting flags (14 layers, 7 +
7), a first-stage count (12 layers, 4 + 8), an explicit layout with interleaving (12 layers,
``Et*2|t*4|t*4|t*2L`` on PP 2 x VPP 2: 2 + 4 and 4 + 2) and the accounting flags with interleaving (14
layers, PP 2 x VPP 2: 3 + 4 and 4 + 3).

    python3 bench/gpu/uneven_pipeline.py --dry [--dest DIR]        # CPU: compile, check train.py, build configs
    python3 bench/gpu/uneven_pipeline.py OUT [--dest DIR] [--gpu h100]   # 2 GPUs: the same, then run them

``--dry`` compiles every configuration into ``--dest`` (default ``.device/uneven``), checks that its
train.py passes the split keywords to TransformerConfig (:func:`compiled_runs.flags_wrong`) and runs
its ``build_configs()`` (megatron-core's ``__post_init__``). Without ``--dry`` each configuration
then runs (``bash DEST/NAME/launch.sh``, one at a time, killed at ``--budget-s``) and ``OUT/NAME.json``
records the command, the exit code, the losses, the measured peak allocated / reserved memory (the
maximum over both ranks: the runtime's metrics record) and the median step time of the steps after
the first five, beside the plan's (plan.json: the heaviest rank's ``peak_allocated_bytes`` and
``peak_bytes``, ``step_seconds``) and their relative errors; ``OUT/uneven_pipeline.json`` the summary.
Exit code 0 when every configuration compiled (and ran, with finite losses), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

from compiled_runs import call_train_py, compile_in_process, flags_wrong, kill_tree, versions  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402  (bench/common.py: read_metrics)

SPEC = "specs/demo-dlm.toml"
RUNS = "runs/uneven"
STEPS = 30
#: The demo model on megatron's mock data, 2 GPUs, 8 microbatches of 4 per step.
COMMON: Dict[str, Any] = {
    "data.mock": True, "data.train": [], "data.valid": [], "data.tokenizer": {"type": "NullTokenizer", "vocab_size": 50256},
    "cluster.gpus_per_node": 2, "train.micro_batch_size": 4, "train.global_batch_size": 32,
    "train.train_iters": STEPS, "train.lr_warmup_iters": 5, "train.eval_interval": 1000, "logging.log_interval": 1,
    "checkpoint.save_at_end": False, "checkpoint.save_interval": 1000, "objective.variable_length_prob": 0.0,
    "model.transformer_impl": "local", "parallel.pipeline_model_parallel_size": 2,
}
P = "parallel."
#: name -> (overrides, the keywords train.py must pass: None = absent)
CONFIGS: Dict[str, tuple] = {
    "even-pp2": ({}, {"account_for_embedding_in_pipeline_split": None, "num_layers_in_first_pipeline_stage": None,
                      "pipeline_model_parallel_layout": None}),
    "accounting-pp2": ({"model.num_layers": 14, P + "account_for_embedding_in_pipeline_split": True,
                        P + "account_for_loss_in_pipeline_split": True},
                       {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
    "first-stage-pp2": ({P + "num_layers_in_first_pipeline_stage": 4}, {"num_layers_in_first_pipeline_stage": 4}),
    "layout-pp2-vpp2": ({P + "virtual_pipeline_model_parallel_size": 2,
                         P + "pipeline_model_parallel_layout": "Et*2|t*4|t*4|t*2L"},
                        {"pipeline_model_parallel_layout": "Et*2|t*4|t*4|t*2L"}),
    "accounting-pp2-vpp2": ({"model.num_layers": 14, P + "virtual_pipeline_model_parallel_size": 2,
                             P + "account_for_embedding_in_pipeline_split": True,
                             P + "account_for_loss_in_pipeline_split": True},
                            {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}),
}


def overrides(name: str, gpu: str) -> List[str]:
    """The ``--set`` strings of a configuration (TOML values)."""
    run = f"{RUNS}/{name}"
    sets = {**COMMON, **CONFIGS[name][0], "name": f"uneven-{name}", "cluster.gpu": gpu, "logging.run_dir": run,
            "logging.tensorboard_dir": f"{run}/tensorboard", "checkpoint.save": f"{run}/checkpoints"}
    out = []
    for key, value in sets.items():
        if isinstance(value, dict):
            out += [f"{key}.{k}={json.dumps(v)}" for k, v in value.items()]
        else:
            out.append(f"{key}={json.dumps(value)}")
    return out


def prepare(name: str, dest: Path, gpu: str) -> Dict[str, Any]:
    """Compile ``name`` into ``dest/name``, check its train.py keywords and build its configs."""
    code, text = compile_in_process(SPEC, dest / name, overrides(name, gpu))
    row: Dict[str, Any] = {"name": name, "sets": overrides(name, gpu), "compile_exit": code}
    if code != 0:
        row["problem"] = text[-2000:]
        return row
    train = (dest / name / "train.py").read_text(encoding="utf-8")
    row["flags_wrong"] = flags_wrong(CONFIGS[name][1], train)
    try:
        call_train_py(dest / name / "train.py", f"uneven_{name.replace('-', '_')}", "build_configs")
        row["megatron_config_checks"] = "passed"
    except Exception as exc:  # megatron-core's __post_init__ refused it: record, do not raise
        row["megatron_config_checks"] = f"{type(exc).__name__}: {exc}"
    plan = json.loads((dest / name / "plan.json").read_text(encoding="utf-8"))
    row["planned"] = {"peak_allocated_gib": plan["memory"]["peak_allocated_bytes"] / 2**30,
                      "peak_gib": plan["memory"]["peak_bytes"] / 2**30, "peak_stage": plan["memory"]["peak_stage"],
                      "layers_per_stage": [s["dense_layers"] + s["moe_layers"] for s in plan["memory"]["per_stage"]],
                      "step_seconds": plan["time"]["step_seconds"]}
    return row


def records(name: str) -> List[Dict[str, Any]]:
    """The run's train records (``RUNS/name/metrics.jsonl``, :func:`common.read_metrics`; [] when
    there is none; a record without ``event`` counts as one)."""
    return [rec for rec in common.read_metrics(ROOT / RUNS / name / "metrics.jsonl")
            if rec.get("event", "train") == "train" and "iteration" in rec]


def run(name: str, dest: Path, out: Path, budget: float) -> Dict[str, Any]:
    """Launch ``dest/name/launch.sh`` and wait (killed at ``budget`` seconds); the run's measures."""
    subprocess.run(["rm", "-rf", str(ROOT / RUNS / name)], check=False)
    cmd = ["bash", str(dest / name / "launch.sh")]
    with open(out / f"{name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        start = time.time()
        while proc.poll() is None and time.time() - start < budget:
            time.sleep(2)
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()
    recs = records(name)
    losses = {int(r["iteration"]): r.get("loss") for r in recs}
    times = [r["step_time_s"] for r in recs if r.get("iteration", 0) > 5 and r.get("step_time_s")]
    measured = {
        "exit": proc.returncode, "seconds": round(time.time() - start, 1), "command": cmd, "losses": losses,
        "finite": bool(losses) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses.values()),
        "peak_allocated_gib": max((r.get("peak_mem_gib") or 0.0 for r in recs), default=None),
        "peak_reserved_gib": max((r.get("peak_reserved_gib") or 0.0 for r in recs), default=None),
        "step_seconds": statistics.median(times) if times else None,
    }
    return measured


def relative(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    """``(predicted - measured) / measured`` (None when either is missing)."""
    if not predicted or not measured:
        return None
    return (predicted - measured) / measured


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="results folder ($OUT); not with --dry")
    p.add_argument("--dry", action="store_true", help="compile and check only (CPU)")
    p.add_argument("--dest", default=".device/uneven", help="compiled configurations (default .device/uneven)")
    p.add_argument("--gpu", default="h100", help="cluster.gpu the plans are made for (default h100)")
    p.add_argument("--only", default=None, help="comma-separated configuration names")
    p.add_argument("--budget-s", type=float, default=240, help="kill each launch after this many seconds")
    args = p.parse_args(argv)
    if not args.dry and not args.out:
        p.error("give OUT (the results folder), or --dry")
    names = args.only.split(",") if args.only else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    dest = (ROOT / args.dest).resolve()
    rows = {name: prepare(name, dest, args.gpu) for name in names}
    ok = all(r["compile_exit"] == 0 and not r.get("flags_wrong") and r.get("megatron_config_checks") == "passed"
             for r in rows.values())
    for name, row in rows.items():
        print(f"{name}: compile {row['compile_exit']}, flags wrong {row.get('flags_wrong')}, "
              f"megatron config checks {row.get('megatron_config_checks')}, planned {row.get('planned')}")
        print(f"  command: bash {dest / name / 'launch.sh'}")
    if args.dry:
        return 0 if ok else 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, row in rows.items():
        if row["compile_exit"] == 0:
            row["measured"] = run(name, dest, out, args.budget_s)
            planned, measured = row["planned"], row["measured"]
            row["error"] = {"peak_allocated": relative(planned["peak_allocated_gib"], measured["peak_allocated_gib"]),
                            "peak_reserved": relative(planned["peak_gib"], measured["peak_reserved_gib"]),
                            "step_seconds": relative(planned["step_seconds"], measured["step_seconds"])}
            ok = ok and measured["exit"] == 0 and measured["finite"]
        (out / f"{name}.json").write_text(json.dumps(row, indent=1, sort_keys=True), encoding="utf-8")
    summary = {"versions": versions(), "configurations": {n: {k: r.get(k) for k in ("planned", "error")}
                                                           for n, r in rows.items()}, "ok": ok}
    (out / "uneven_pipeline.json").write_text(json.dumps(summary, indent=1, sort_keys=True), encoding="utf-8")
    print(json.dumps(summary["configurations"], indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
