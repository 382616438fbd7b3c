"""fp8 primary weights (megatron-core ``fp8_param_gather``): the linear layers' weights are held in
fp8 (1 byte) with a 1-byte transpose / column-wise copy, in place of the bf16 weight and the 2-byte
fp8 cache Transformer Engine keeps for bf16 weights."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan.memory import linear_params, memory_plan, stage_layer_counts
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
ENTRIES = {e["name"]: e for e in json.loads((ROOT / "bench" / "plan" / "te_matrix.json").read_text())}


def _plan(name: str):
    e = ENTRIES[name]
    return make_plan(resolve(load(ROOT / e["base"], e["overrides"]).spec))


def test_fp8_primary_weights_save_two_bytes_per_linear_weight() -> None:
    plan = _plan("te-fp8-delayed-mb8")
    assert plan.layout.fp8 and not plan.layout.fp8_param_gather
    lay = dataclasses.replace(plan.layout, fp8_param_gather=True)
    before = plan.memory.peak
    after = memory_plan(plan.shape, lay, plan.calibration).stages[before.stage]
    lin = linear_params(plan.shape, lay, stage_layer_counts(plan.shape, lay, before.stage))
    assert after.breakdown["weights"] == pytest.approx(before.breakdown["weights"] - lin)
    assert after.breakdown["fp8_weight_cache"] == pytest.approx(before.breakdown["fp8_weight_cache"] / 2)
    assert before.peak_allocated_bytes - after.peak_allocated_bytes == pytest.approx(2 * lin, rel=1e-6)


def test_fp8_primary_weights_change_nothing_without_fp8() -> None:
    plan = _plan("te-bf16-mb8")
    lay = dataclasses.replace(plan.layout, fp8_param_gather=True)
    after = memory_plan(plan.shape, lay, plan.calibration).peak
    assert after.breakdown == plan.memory.peak.breakdown
