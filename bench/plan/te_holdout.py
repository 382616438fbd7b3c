"""Predict, then measure: the planner on the Transformer Engine calibration matrix.

``predict`` plans every entry of ``bench/plan/te_matrix.json`` (``bench/plan/te_calibration_matrix.py``)
with the committed constants of the TE path (``dlmspec.plan.provenance.calibration_for``: the local
path's while the TE path has no calibration of its own, marked "uncalibrated") and writes step
seconds, peak allocated and peak reserved bytes, with the commit they were made at, BEFORE anything
runs on a GPU (``bench/plan/te_holdout_predictions.json``). ``compare`` reads the measurements
(``bench/devbox/gpu/te_calibration.sh``'s ``calibration_te_h200.json``) and reports each configuration's
median against its committed prediction, held-out entries marked.

Planned peak reserved = planned peak allocated + the plan's ``allocator_reserve`` term (what
``torch.cuda.max_memory_reserved()`` adds to ``max_memory_allocated()``: the caching allocator's
unused blocks; the CUDA context and NCCL's buffers are outside both).

    .venv/bin/python bench/plan/te_holdout.py predict bench/plan/te_holdout_predictions.json
    .venv/bin/python bench/plan/te_holdout.py compare bench/plan/te_holdout_predictions.json MEASURED.json OUT.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "plan"))

from dlmspec.spec.load import load  # noqa: E402
from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from holdout import cli, entry_overrides, head_commit, shown  # noqa: E402

MATRIX = ROOT / "bench" / "plan" / "te_matrix.json"


def plan_numbers(entry: dict, host_launch_us: float | None = None) -> dict:
    """The plan of a matrix entry (on the committed constants of its layer path; optionally on a
    measured host speed): ``step_seconds``, ``peak_allocated_bytes``, ``peak_reserved_bytes``,
    ``peak_bytes`` (what must fit: with the CUDA context), ``calibration`` (the provenance status)."""
    plan = make_plan(resolve(load(ROOT / entry["base"], entry_overrides(entry, host_launch_us)).spec))
    reserve = plan.memory.peak.breakdown.get("allocator_reserve", 0.0)
    return {"step_seconds": plan.time.step_seconds, "peak_allocated_bytes": plan.peak_allocated_bytes,
            "peak_reserved_bytes": plan.peak_allocated_bytes + reserve, "peak_bytes": plan.peak_bytes,
            "layer_path": plan.layout.impl, "calibration": plan.provenance["calibration"]["status"]}


def predict(out: Path) -> None:
    """Write the predictions of every matrix entry, with the commit and calibration they used."""
    from dlmspec.plan.calibration import FITTED_FROM, TE_FITTED_FROM

    fitted_from = TE_FITTED_FROM or f"{FITTED_FROM} (the local path's: no TE calibration yet)"

    commit = head_commit()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "dlmspec"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    preds = []
    for e in json.loads(MATRIX.read_text()):
        p = plan_numbers(e)
        preds.append({"name": e["name"], "held_out": e["held_out"], "note": e.get("note", ""),
                      "layer_path": p["layer_path"], "calibration": p["calibration"],
                      "planned_step_seconds": p["step_seconds"],
                      "planned_peak_allocated_bytes": round(p["peak_allocated_bytes"]),
                      "planned_peak_reserved_bytes": round(p["peak_reserved_bytes"]),
                      "planned_peak_bytes": round(p["peak_bytes"])})
    out.write_text(json.dumps({"made_at_commit": commit, "planner_modified_at_commit": bool(dirty),
                               "calibration_fitted_from": fitted_from,
                               "command": "python bench/plan/te_holdout.py predict " + shown(out),
                               "predictions": preds}, indent=1) + "\n")
    for r in preds:
        print(f"{r['name']:32s} {'held out' if r['held_out'] else '        '} {r['planned_step_seconds']:.4f} s  "
              f"{r['planned_peak_allocated_bytes'] / 2**30:.2f} GiB allocated  "
              f"{r['planned_peak_reserved_bytes'] / 2**30:.2f} GiB reserved ({r['calibration']})")


def compare(pred_path: Path, measured_path: Path, out: Path) -> int:
    """Median measured vs predicted per configuration; returns how many missed 15% (step time) or
    5% (peak allocated)."""
    preds = {p["name"]: p for p in json.loads(pred_path.read_text())["predictions"]}
    groups: dict[str, list[dict]] = {}
    for run in json.loads(measured_path.read_text())["runs"]:
        groups.setdefault(run["name"], []).append(run)
    rows, misses = [], 0
    for name, runs in groups.items():
        ok = [r for r in runs if "step_seconds" in r]
        if name not in preds or not ok:
            rows.append({"name": name, "error": runs[0].get("error", "no measurement")})
            continue
        p = preds[name]
        med = {k: statistics.median(r[k] for r in ok) for k in ("step_seconds", "peak_allocated_bytes",
                                                                 "peak_reserved_bytes")}
        row = {"name": name, "held_out": p["held_out"], "measurements": len(ok),
               **{f"measured_{k}": v for k, v in med.items()},
               "time_error": p["planned_step_seconds"] / med["step_seconds"] - 1,
               "allocated_error": p["planned_peak_allocated_bytes"] / med["peak_allocated_bytes"] - 1,
               "reserved_error": (p["planned_peak_reserved_bytes"] / med["peak_reserved_bytes"] - 1
                                  if med["peak_reserved_bytes"] else None)}
        misses += abs(row["time_error"]) > 0.15 or abs(row["allocated_error"]) > 0.05
        rows.append(row)
        print(f"{name:32s} {'held out' if p['held_out'] else '        '} step {med['step_seconds']:.4f} s "
              f"({row['time_error']:+.1%})  allocated {med['peak_allocated_bytes'] / 2**30:.1f} GiB "
              f"({row['allocated_error']:+.1%})  reserved {med['peak_reserved_bytes'] / 2**30:.1f} GiB"
              + (f" ({row['reserved_error']:+.1%})" if row["reserved_error"] is not None else ""))
    out.write_text(json.dumps({"predictions": shown(pred_path), "measurements": str(measured_path),
                               "rows": rows}, indent=1) + "\n")
    return misses


def main() -> int:
    return cli(predict, compare, __doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
