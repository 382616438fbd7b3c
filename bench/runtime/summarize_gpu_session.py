"""Summarise metrics_all.jsonl files written by bench/runtime/gpu_session.sh.

    python bench/runtime/summarize_gpu_session.py throughput METRICS RUN [--warmup-iters 10]
    python bench/runtime/summarize_gpu_session.py resume METRICS_A RUN_A METRICS_C RUN_C

``throughput`` averages the logged intervals after ``--warmup-iters`` steps
(the first steps include torch.compile and allocator warm-up): step time is the
mean over those steps, tokens/s, TFLOP/s per GPU and MFU follow from it with
the run's ``model_flops_per_token``; memory is the run's peak.  ``resume``
lines up the per-interval training losses of an uninterrupted run (A) and a
resumed run (C) and reports their differences.
"""

import argparse
import json
import sys


def _records(path, run):
    return [r for r in map(json.loads, open(path)) if r.get("run") == run]


def throughput(path, run, warmup_iters=10):
    """Steady-state throughput of one run (dict)."""
    recs = _records(path, run)
    start = next(r for r in recs if r["event"] == "start")
    train = [r for r in recs if r["event"] == "train"]
    steady = [r for r in train if r["iteration"] > warmup_iters]
    if not steady:
        raise SystemExit(f"{run}: no logged interval after iteration {warmup_iters}")
    interval = train[1]["iteration"] - train[0]["iteration"] if len(train) > 1 else train[0]["iteration"]
    # Each record covers log_interval steps; weight equally (same interval length).
    step_time = sum(r["step_time_s"] for r in steady) / len(steady)
    tokens_per_step = steady[0]["tokens_per_s"] * steady[0]["step_time_s"]
    tokens_per_s = tokens_per_step / step_time
    flops = start["model_flops_per_token"]
    world = start["world_size"]
    tflops = flops * tokens_per_s / world / 1e12
    mfu = [r["mfu"] for r in steady if r.get("mfu") is not None]
    peak = (steady[0]["tflops_per_gpu"] / steady[0]["mfu"]) if mfu else None
    return {
        "steps_measured": [steady[0]["iteration"] - interval + 1, steady[-1]["iteration"]],
        "step_time_s": round(step_time, 4),
        "tokens_per_step": int(round(tokens_per_step)),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_tflops_per_gpu": round(tflops, 1),
        "mfu": round(tflops / peak, 4) if peak else None,
        "peak_tflops_per_gpu": round(peak, 1) if peak else None,
        "model_flops_per_token": flops,
        "peak_mem_allocated_gib": round(max(r["peak_mem_gib"] for r in train), 2),
        "peak_mem_reserved_gib": round(max(r["peak_reserved_gib"] for r in train), 2),
        "loss_first_interval": round(train[0]["loss"], 4),
        "loss_last_interval": round(train[-1]["loss"], 4),
        "layer_spec": start["layer_spec"],
        "params_on_rank": start["params_on_logging_rank"],
    }


def resume(path_a, run_a, path_c, run_c):
    """Per-interval loss differences between an uninterrupted and a resumed run (dict)."""
    a = {r["iteration"]: r for r in _records(path_a, run_a) if r["event"] == "train"}
    c = {r["iteration"]: r for r in _records(path_c, run_c) if r["event"] == "train"}
    common = sorted(set(a) & set(c))
    rows = [
        {"iteration": i, "loss_uninterrupted": round(a[i]["loss"], 5), "loss_resumed": round(c[i]["loss"], 5),
         "rel_diff": round((c[i]["loss"] - a[i]["loss"]) / a[i]["loss"], 6)}
        for i in common
    ]
    resumed = next((r for r in _records(path_c, run_c) if r["event"] == "resume"), None)
    return {
        "resumed_at_iteration": resumed["iteration"] if resumed else None,
        "intervals": rows,
        "max_abs_rel_diff": max(abs(r["rel_diff"]) for r in rows) if rows else None,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("throughput")
    t.add_argument("metrics")
    t.add_argument("run")
    t.add_argument("--warmup-iters", type=int, default=10)
    r = sub.add_parser("resume")
    r.add_argument("metrics_a")
    r.add_argument("run_a")
    r.add_argument("metrics_c")
    r.add_argument("run_c")
    args = p.parse_args(argv)
    if args.cmd == "throughput":
        out = throughput(args.metrics, args.run, args.warmup_iters)
    else:
        out = resume(args.metrics_a, args.run_a, args.metrics_c, args.run_c)
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
