"""A copy of bench/calibration/ (manifest, run files, fit.json) with one layer path's run files
replaced, for tests of ``bench/calibration/fit.py --write`` and ``build.py:render`` (the one
writer of the planner's constants). Not a test module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def calibration_copy(tmp: Path, layer_path: str, runs: dict[str, dict], prior_weight: float | None = None) -> Path:
    """``tmp/calibration``: bench/calibration's data with ``layer_path``'s run files replaced by
    ``runs`` (file name -> run file content); its fit.json names them (constants kept, the prior)."""
    data = tmp / "calibration"
    shutil.copytree(ROOT / "bench" / "calibration", data, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    manifest = json.loads((data / "manifest.json").read_text())
    entry = next(e for e in manifest["paths"] if e["layer_path"] == layer_path)
    folder = data / entry["dir"]
    for name in entry["runs"]:
        (folder / name).unlink()
    for name, content in runs.items():
        (folder / name).write_text(json.dumps(content))
    entry["runs"] = sorted(runs)
    (data / "manifest.json").write_text(json.dumps(manifest, indent=1))
    fit = json.loads((data / entry["fit"]).read_text())
    fit["files"] = entry["runs"]
    if prior_weight is not None:
        fit["prior_weight"] = prior_weight
    (data / entry["fit"]).write_text(json.dumps(fit, indent=1))
    return data
