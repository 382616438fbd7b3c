"""Summarise bench/devbox/gpu/demo_resume.sh's output into one JSON (the resume check).

    python3 bench/gpu/summarize_resume.py WORK_DIR OUT_JSON [--command CMD]

Reads ``resume_metrics_launch1.jsonl`` (launch 1, stopped by SIGTERM), ``resume_metrics.jsonl``
(the same file after launch 2 appended to it) and ``ref_metrics.jsonl`` (the uninterrupted run).
Reports the step of the checkpoint saved on the signal, the step launch 2 resumed from, and per
logged step the training and validation losses of both runs with their relative difference,
split into before the stop (run-to-run noise of the same spec: non-deterministic GPU kernels)
and after it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (bench/common.py: read_metrics)


def _load(path: Path) -> list[dict]:
    """The records of a metrics file (:func:`common.read_metrics`; [] when it is missing)."""
    return common.read_metrics(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--command", default="STOP_AT=150 bash bench/devbox/gpu/demo_resume.sh $OUT/work")
    p.add_argument("--device", default="")
    a = p.parse_args()
    first = _load(a.work / "resume_metrics_launch1.jsonl")
    both = _load(a.work / "resume_metrics.jsonl")
    ref = _load(a.work / "ref_metrics.jsonl")
    saved = [r for r in first if r["event"] == "checkpoint" and str(r.get("reason", "")).startswith("signal")]
    resumed = [r for r in both if r["event"] == "resume"]
    stop = saved[-1]["iteration"] if saved else None

    def series(records, event):
        return {r["iteration"]: r["loss"] for r in records if r["event"] == event}

    rows = {}
    for event in ("train", "valid"):
        mine, theirs = series(both, event), series(ref, event)
        rows[event] = [
            {"iteration": it, "resumed_run": round(mine[it], 5), "uninterrupted": round(theirs[it], 5),
             "rel_diff": round((mine[it] - theirs[it]) / theirs[it], 5)}
            for it in sorted(mine) if it in theirs
        ]

    def worst(event, after):
        diffs = [abs(r["rel_diff"]) for r in rows[event] if stop is not None and ((r["iteration"] > stop) == after)]
        return max(diffs) if diffs else None

    result = {
        "benchmark": "the compiled demo (specs/demo-dlm.toml) stopped by SIGTERM and launched again, "
                     "against the same spec run uninterrupted",
        "device": a.device, "command": a.command,
        "signal_checkpoint": saved[-1] if saved else None,
        "resumed_from": resumed[-1] if resumed else None,
        "launch1_exit": [r for r in first if r["event"] == "exit"][-1:] or None,
        "final": {"resumed_run": [r for r in both if r["event"] == "exit"][-1:],
                  "uninterrupted": [r for r in ref if r["event"] == "exit"][-1:]},
        "max_abs_rel_diff": {"train_before_stop": worst("train", False), "train_after_stop": worst("train", True),
                             "valid_before_stop": worst("valid", False), "valid_after_stop": worst("valid", True)},
        "losses": rows,
    }
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["max_abs_rel_diff"]))


if __name__ == "__main__":
    main()
