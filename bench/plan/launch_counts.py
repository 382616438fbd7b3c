"""The planner's kernel launches per step against the profiles'.

Reads a profile file of per-rank ``torch.profiler`` summaries with their host part
(``bench/results/profile_host_h200x2.json``, written from
``backends/megatron/profiling.py`` summaries) and, for each configuration (a
``bench/plan/matrix.json`` name) and rank, prints the measured launches per step next to
:func:`dlmspec.plan.launches.kernels_per_step` (the rank's pipeline stage; ranks of other layouts
are stage 0).

    .venv/bin/python bench/plan/launch_counts.py [PROFILE.json] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dlmspec.spec.load import load  # noqa: E402
from dlmspec.plan.shape import layout, model_shape  # noqa: E402
from dlmspec.plan.launches import kernels_per_step  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402

PROFILE = ROOT / "bench" / "results" / "profile_host_h200x2.json"
MATRIX = ROOT / "bench" / "plan" / "matrix.json"


def compare(profile: Path = PROFILE) -> list[dict]:
    """``[{"name", "rank", "measured", "planned", "error"}]``: launches per step, ``error`` =
    planned / measured - 1."""
    entries = {e["name"]: e for e in json.loads(MATRIX.read_text())}
    rows = []
    for name, ranks in json.loads(profile.read_text())["summaries"].items():
        entry = entries[name]
        resolved = resolve(load(ROOT / entry["base"], entry["overrides"]).spec)
        shape, lay = model_shape(resolved), layout(resolved)
        for rank_key, summary in sorted(ranks.items()):
            rank = int(rank_key.removeprefix("rank"))
            stage = rank if lay.pp > 1 else 0
            measured = summary["host"]["launches_per_step"]
            planned = kernels_per_step(shape, lay, stage)
            rows.append({"name": name, "rank": rank, "measured": measured, "planned": planned,
                         "error": planned / measured - 1})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", type=Path, default=PROFILE)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = compare(args.profile)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['name']:20s} rank {r['rank']}  measured {r['measured']:8.1f}  planned {r['planned']:8.1f}  {r['error']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
