"""The fixes ``validate`` prints for a pipeline-parallel error and for a global-batch error agree: each
printed fix applied alone clears its rule without breaking the other's, and both applied together
validate (no error left)."""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[3]
SPEC = str(ROOT / "specs" / "demo-dlm.toml")

#: 8 GPUs; 6 layers over PP 4 (not a multiple: pp-divides-layers proposes PP 2, DP 2 -> 4);
#: global batch 12 over micro batch 4 * DP 2 (not a multiple: batch-divisible).
CASES = {
    "pp4-of-6-layers-gbs12": ["cluster.gpus_per_node=8", "model.num_layers=6", "parallel.pipeline_model_parallel_size=4",
                              "train.micro_batch_size=4", "train.global_batch_size=12"],
    "pp3-of-8-layers-gbs5": ["cluster.gpus_per_node=6", "model.num_layers=8", "parallel.pipeline_model_parallel_size=3",
                              "train.micro_batch_size=2", "train.global_batch_size=5"],
}


def _errors(sets: list[str]) -> dict[str, dict]:
    args = ["validate", SPEC, "--json"] + [a for s in sets for a in ("--set", s)]
    result = subprocess.run([sys.executable, "-m", "dlmspec.cli", *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    issues = json.loads(result.stdout)["issues"]
    return {i["rule"]: i for i in issues if i["severity"] == "error"}


def _applied(sets: list[str], fixes: list[dict]) -> list[str]:
    out = list(sets)
    for fix in fixes:
        out += [f"{k}={json.dumps(v)}" for k, v in fix["set"].items()]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_printed_layout_and_batch_remedies_validate_alone_and_together(case: str) -> None:
    sets = CASES[case]
    errors = _errors(sets)
    assert {"pp-divides-layers", "batch-divisible"} <= set(errors), sorted(errors)
    fixes = {rule: errors[rule]["fix"] for rule in ("pp-divides-layers", "batch-divisible")}
    for rule, fix in fixes.items():  # alone: its rule clears, and it breaks no other rule's fix
        left = _errors(_applied(sets, [fix]))
        assert rule not in left, (rule, left)
        other = next(r for r in fixes if r != rule)
        again = _errors(_applied(sets, [fix, fixes[other]]))
        assert again == {}, (rule, "then", other, again)
    for pair in combinations(fixes.values(), 2):
        assert _errors(_applied(sets, list(pair))) == {}
