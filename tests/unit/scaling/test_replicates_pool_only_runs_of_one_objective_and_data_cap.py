"""Replicates (other seeds of one run) pool into one point; runs of the same N and D but another
objective or another configured data cap (``data.train[].max_unique_tokens``) are distinct
points, even when their unique tokens are unknown (no ``.idx`` to count the cap with)."""

from __future__ import annotations

from pathlib import Path

import pytest

import scaling_kit
from dlmspec.scaling.runs import pool_replicates, read_point


def _capped(cap: int | None) -> dict:
    # the dataset has no .idx and no record: U is unknown, as in a results folder without the index
    entry = "data/demo-train_text_document" if cap is None else {"prefix": "data/demo-train_text_document",
                                                                  "max_unique_tokens": cap}
    return {"data.mock": None, "data.train": [entry], "data.split": "100,0,0"}


def test_only_runs_of_one_objective_and_cap_pool(tmp_path: Path) -> None:
    runs = {  # name: (objective, cap, loss)
        "ar-u2.4m-seed0": ("ar", 2_400_000, 4.0), "ar-u2.4m-seed1": ("ar", 2_400_000, 4.2),
        "ar-u300k-e8": ("ar", 300_000, 4.9), "dlm-u2.4m-e1": ("mdm", 2_400_000, 4.4),
        "ar-uncapped": ("ar", None, 3.9),
    }
    points = []
    for name, (objective, cap, loss) in runs.items():
        folder = scaling_kit.write_run(tmp_path / "runs" / name, shape=(4, 256), tokens=2_400_256, loss=loss,
                                       objective=objective, data=_capped(cap))
        points.append(read_point(str(folder)))
    assert all(p.unique_tokens is None for p in points)
    pooled = {tuple(sorted(Path(r).name for r in p.replicates)): p.point for p in pool_replicates(points)}
    assert sorted(pooled) == [("ar-u2.4m-seed0", "ar-u2.4m-seed1"), ("ar-u300k-e8",), ("ar-uncapped",),
                              ("dlm-u2.4m-e1",)]
    seeds = pooled[("ar-u2.4m-seed0", "ar-u2.4m-seed1")]
    assert seeds.loss == pytest.approx(4.1) and seeds.name.endswith("(+1 replicates)")
    assert seeds.data_caps == (("data/demo-train_text_document", 2_400_000),) and seeds.objective == "ar"
    assert pooled[("dlm-u2.4m-e1",)].loss == 4.4 and pooled[("ar-u300k-e8",)].loss == 4.9
