"""Predict, then measure: the planner on configurations kept out of its calibration.

``bench/plan/holdout.json`` lists configurations no calibration run had (the format of
``bench/plan/matrix.json``). ``predict`` plans each with the committed constants and writes the
predictions, with the commit they were made at, BEFORE anything runs on a GPU; ``compare`` reads
the GPU measurements (``bench/devbox/gpu/run_matrix.sh``'s format) and reports each against the
committed prediction (typical host) and against the plan on the host speed the run logged.
``calibrate.py`` does not read these files, so the comparison stays out of sample.

    .venv/bin/python bench/plan/holdout.py predict bench/results/holdout_predictions.json
    .venv/bin/python bench/plan/holdout.py compare bench/results/holdout_predictions.json MEASURED.json OUT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dlmspec.spec.load import load  # noqa: E402
from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, FITTED_FROM  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402

HOLDOUT = ROOT / "bench" / "plan" / "holdout.json"


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def head_commit() -> str:
    """The commit the repository is at (``git rev-parse HEAD``; "" outside a checkout)."""
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def entry_overrides(entry: dict, host_launch_us: float | None = None) -> list[str]:
    """An entry's ``--set`` overrides, with ``cluster.host_launch_us`` (microseconds) when a measured
    host speed is given."""
    return list(entry["overrides"]) + ([f"cluster.host_launch_us={host_launch_us}"] if host_launch_us else [])


def plan_entry(entry: dict, host_launch_us: float | None = None):
    """The plan of a holdout entry (optionally on a measured host speed)."""
    return make_plan(resolve(load(ROOT / entry["base"], entry_overrides(entry, host_launch_us)).spec),
                     DEFAULT_CALIBRATION)


def predict(out: Path) -> None:
    """Write the predictions of every holdout entry, with the commit and calibration they used."""
    commit = head_commit()
    entries = json.loads(HOLDOUT.read_text())
    preds = []
    for e in entries:
        p = plan_entry(e)
        preds.append({"name": e["name"], "gpus": e["gpus"], "note": e.get("note", ""),
                      "planned_step_seconds": p.time.step_seconds,
                      "planned_peak_allocated_bytes": p.peak_allocated_bytes,
                      "planned_peak_bytes": p.peak_bytes})
    out.write_text(json.dumps({"made_at_commit": commit, "calibration_fitted_from": FITTED_FROM,
                               "command": "python bench/plan/holdout.py predict " + shown(out),
                               "predictions": preds}, indent=1) + "\n")
    for r in preds:
        print(f"{r['name']:44s} {r['planned_step_seconds']:.4f} s  {r['planned_peak_allocated_bytes'] / 2**30:.2f} GiB")


def compare(pred_path: Path, measured_path: Path, out: Path) -> int:
    """Measured vs predicted; returns how many configurations missed 15% (time) or 5% (memory)."""
    preds = {p["name"]: p for p in json.loads(pred_path.read_text())["predictions"]}
    entries = {e["name"]: e for e in json.loads(HOLDOUT.read_text())}
    rows, misses = [], 0
    for run in json.loads(measured_path.read_text())["runs"]:
        name = run["name"]
        if name not in preds or "step_seconds" not in run:
            rows.append({"name": name, "error": run.get("error", "no measurement")})
            continue
        p = preds[name]
        on_host = plan_entry(entries[name], run.get("host_launch_us")).time.step_seconds
        row = {"name": name, "measured_step_seconds": run["step_seconds"],
               "predicted_step_seconds": p["planned_step_seconds"],
               "time_error": p["planned_step_seconds"] / run["step_seconds"] - 1,
               "planned_on_measured_host_seconds": on_host,
               "time_error_on_measured_host": on_host / run["step_seconds"] - 1,
               "host_launch_us": run.get("host_launch_us"),
               "measured_peak_allocated_bytes": run["peak_allocated_bytes"],
               "predicted_peak_allocated_bytes": p["planned_peak_allocated_bytes"],
               "memory_error": p["planned_peak_allocated_bytes"] / run["peak_allocated_bytes"] - 1}
        misses += abs(row["time_error"]) > 0.15 or abs(row["memory_error"]) > 0.05
        rows.append(row)
        print(f"{name:44s} step {run['step_seconds']:.4f} s predicted {p['planned_step_seconds']:.4f} "
              f"({row['time_error']:+.1%}; {row['time_error_on_measured_host']:+.1%} on its host)  "
              f"memory {row['memory_error']:+.1%}")
    out.write_text(json.dumps({"predictions": shown(pred_path),
                               "measurements": str(measured_path), "rows": rows}, indent=1) + "\n")
    return misses


def cli(predict: Callable[[Path], None], compare: Callable[[Path, Path, Path], int], description: str) -> int:
    """The ``predict OUT`` / ``compare PREDICTIONS MEASURED OUT`` command line of a holdout script
    (this one's and ``te_holdout.py``'s); exit code 1 when ``compare`` counts a miss."""
    ap = argparse.ArgumentParser(description=description)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("predict")
    a.add_argument("out", type=Path)
    b = sub.add_parser("compare")
    b.add_argument("predictions", type=Path)
    b.add_argument("measured", type=Path)
    b.add_argument("out", type=Path)
    args = ap.parse_args()
    if args.cmd == "predict":
        predict(args.out.resolve())
        return 0
    return 1 if compare(args.predictions.resolve(), args.measured, args.out) else 0


def main() -> int:
    return cli(predict, compare, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
