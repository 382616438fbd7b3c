"""Fit the planner's constants on the calibration data: ``bench/calibration/<path>/<gpu>/fit.json``.

    python bench/calibration/fit.py            # print each path's constants: committed -> refitted
    python bench/calibration/fit.py --write    # ... and write them to each fit.json
    python bench/calibration/fit.py --write --only transformer_engine   # one layer path only
    python -m dlmspec.generated                # then regenerate dlmspec/plan/calibration.py

The fit is ``bench/plan/calibrate.py``'s :func:`fit` (memory by linear least squares, time by
non-negative least squares on relative errors, re-deciding each run's launch- or GPU-bound side
between rounds), pulled with weight ``prior_weight`` (fit.json, default 0.1) towards the committed
constants of the path, so a constant no run exercises keeps its value; the Transformer Engine path
adds ``allocator_reserve_fraction`` (:func:`fit_te`). Held-out records are not fitted. Refitting
moves the constants a little even on unchanged data (the pull is towards the constants before the
fit), which is why the build (``bench/calibration/build.py``) reads fit.json instead of refitting.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from bench.calibration.build import (  # noqa: E402
    DATA, FIT_SCHEMA, _calibrate, _literal, fitted_runs, read_fit, read_manifest,
)


def refit(data: Path = DATA, only: str | None = None) -> dict[str, dict]:
    """Layer path -> ``{"before": constants, "after": constants, "runs": n, "entry": manifest entry}``
    (``only``: that layer path alone; the others' fit.json are left as they are)."""
    from dlmspec.plan.calibration import DEFAULT_CALIBRATION, FITTED, TE_FITTED_NAMES

    calibrate = _calibrate()
    out = {}
    for entry in read_manifest(data):
        if only is not None and entry["layer_path"] != only:
            continue
        te = entry["layer_path"] == "transformer_engine"
        names = TE_FITTED_NAMES if te else FITTED
        fit_path = data / entry["fit"]
        raw = json.loads(fit_path.read_text(encoding="utf-8"))
        before = {n: raw["constants"][n] for n in names if n in raw.get("constants", {})}
        if set(before) == set(names):
            read_fit(fit_path, entry["layer_path"], names, raw.get("files"))  # checks types
        runs, _ = fitted_runs(data, entry)
        prior = DEFAULT_CALIBRATION.with_values(**before)
        weight = float(raw.get("prior_weight", 0.1))
        if te:
            fitted = calibrate.fit_te(runs, prior, weight)
        else:
            fitted = calibrate.fit(runs, prior, weight) if len(runs) >= 2 else prior
        after = {n: float(_literal(n, getattr(fitted, n))) for n in names}
        out[entry["layer_path"]] = {"before": before, "after": after, "runs": len(runs), "entry": entry,
                                    "prior_weight": weight, "raw": raw}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--write", action="store_true", help="write the refitted constants into each fit.json")
    p.add_argument("--data", default=str(DATA), help="calibration data directory (default bench/calibration)")
    p.add_argument("--only", choices=("local+sdpa", "transformer_engine"), default=None,
                   help="refit this layer path only (a refit moves constants a little even on unchanged data)")
    args = p.parse_args(argv)
    data = Path(args.data)
    from dlmspec.files import write_atomic

    for path, r in refit(data, args.only).items():
        print(f"{path} ({r['runs']} runs of {r['entry']['dir']}):")
        for n, v in r["after"].items():
            b = r["before"].get(n)
            print(f"  {n:30s} {b if b is not None else '-':>14} -> {v:<14}")
        if args.write:
            raw = dict(r["raw"])
            raw.update(schema=FIT_SCHEMA, layer_path=path, files=r["entry"]["runs"], runs_fitted=r["runs"],
                       prior_weight=r["prior_weight"],
                       constants={n: (int(v) if n.endswith("_bytes") else v) for n, v in r["after"].items()})
            write_atomic(data / r["entry"]["fit"], json.dumps(raw, indent=1) + "\n")
            print(f"  wrote {data / r['entry']['fit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
