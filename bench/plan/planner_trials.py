"""Two planner variants tried, refitted and scored like calibrate.py.

* ``ep_dispatch``: ``KERNELS_EP_DISPATCH`` (the alltoall dispatcher's launches per MoE layer at
  EP > 1) at 0, as before, and at its value.
* ``multi_gpu_host_factor``: every two-GPU record planned on a host slower by a factor (its
  ``host_launch_us``, or the typical host's, times 1.0, 1.15, 1.3) - the idea that the ranks of a
  two-GPU run each get less of the host than a one-GPU run. Kept out of the model.

Each variant is fitted on every record under ``bench/results/`` (``calibrate.fit``, prior weight
0.1 as ``calibrate.py`` uses) and scored: records within 15%, the newest record of each
configuration within 15%, each configuration's median within 15%.

    .venv/bin/python bench/plan/planner_trials.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "plan"))

import calibrate as cal  # noqa: E402
from dlmspec.plan import launches  # noqa: E402
from dlmspec.plan.calibration import DEFAULT_CALIBRATION  # noqa: E402

PRIOR = 0.1


def local_runs(runs) -> list:
    """The local path's records (an earlier GPU run's trials predate the Transformer Engine records, which
    calibrate.py fits apart: :func:`calibrate.fit_te`)."""
    return [r for r in runs if cal.path_of(r) != cal.TE]


def score(runs) -> dict:
    """Fit on ``runs`` and count what is within 15%."""
    fitted = cal.fit(runs, DEFAULT_CALIBRATION, PRIOR)
    planned = [cal._plan(r, fitted).time.step_seconds for r in runs]
    errs = [p / r.measured_seconds - 1 for p, r in zip(planned, runs)]
    latest = cal.newest(runs)
    configs = cal.by_configuration(runs, planned)
    return {"records_within_15": f"{sum(abs(e) <= 0.15 for e in errs)}/{len(runs)}",
            "newest_within_15": f"{sum(abs(errs[i]) <= 0.15 for i in latest)}/{len(latest)}",
            "medians_within_15": f"{sum(abs(c[4]) <= 0.15 for c in configs)}/{len(configs)}",
            "median_errors": {c[0]: round(c[4], 4) for c in configs if abs(c[4]) > 0.15 or c[0] == "demo-moe-ep2"}}


def ep_dispatch() -> dict:
    saved = dict(launches.KERNELS_EP_DISPATCH)
    out = {}
    try:
        for value in (0, saved["local+sdpa"]):
            launches.KERNELS_EP_DISPATCH.update({k: value for k in saved})
            out[str(value)] = score(local_runs(cal.read_runs(cal.RESULTS)[0]))
    finally:
        launches.KERNELS_EP_DISPATCH.update(saved)
    return out


def multi_gpu_host_factor() -> dict:
    matrix = {e["name"]: e for e in json.loads((ROOT / "bench/plan/matrix.json").read_text())}
    typical_us = DEFAULT_CALIBRATION.host_launch_seconds * 1e6
    out = {}
    for factor in (1.0, 1.15, 1.3):
        with tempfile.TemporaryDirectory() as tmp:
            for path in cal.RESULTS.glob("*.json"):
                data = json.loads(path.read_text())
                runs = data.get("runs") if isinstance(data, dict) else data if isinstance(data, list) else None
                for r in runs or []:
                    if isinstance(r, dict) and matrix.get(r.get("name"), {}).get("gpus", 1) > 1 and "step_seconds" in r:
                        r["host_launch_us"] = r.get("host_launch_us", typical_us) * factor
                (Path(tmp) / path.name).write_text(json.dumps(data))
            out[str(factor)] = score(local_runs(cal.read_runs(Path(tmp))[0]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = {"command": "python bench/plan/planner_trials.py --json OUT",
              "ep_dispatch": ep_dispatch(), "multi_gpu_host_factor": multi_gpu_host_factor()}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
