"""dlmspec's approach-3 fit of Besiroglu et al. 2024's 240 Chinchilla points, beside their published
parameters and 95% intervals (bench/scaling/besiroglu2024/). CPU only.

    python bench/scaling/chinchilla_refit.py --out bench/results/scaling-cpu/chinchilla-refit.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "kits"))

import scaling_kit  # noqa: E402 (reads the committed points and published values)
from dlmspec.scaling.law import fit_law  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the comparison as JSON here")
    args = parser.parse_args()
    published = scaling_kit.published()
    n, d, c, loss = scaling_kit.chinchilla_points()
    fitted = fit_law(n, d, loss, compute=c).law.as_dict()
    rows = {k: {"dlmspec": fitted[k], "published_grid_fit": published["grid_fit"][k],
                "published_95": published["intervals_95"][k],
                "inside": published["intervals_95"][k][0] <= fitted[k] <= published["intervals_95"][k][1]}
            for k in ("E", "A", "B", "alpha", "beta")}
    result = {"command": "python bench/scaling/chinchilla_refit.py --out " + str(args.out or "-"),
              "points": len(n), "parameters": rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if all(r["inside"] for r in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
