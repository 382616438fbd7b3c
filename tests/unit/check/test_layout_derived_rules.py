"""Rules that read what the layout derives (data-parallel size, microbatches per step) run only
on a consistent layout: a TP that does not divide the GPUs gets its own error and fix (batch size
included), not a batch-size fix computed from a rounded DP. TOML specs and sweep members alike."""

from __future__ import annotations

from pathlib import Path

from dlmspec.check import issues_for
from dlmspec.check.registry import RULES
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from dlmspec.spec.python_load import sweep_targets
from small_spec import SMALL_SPEC

#: 8 GPUs, global batch 12 of micro batch 4: TP 3 leaves a "DP" of 8 // 3 = 2 (step 8), TP 2 a DP of 4.
EIGHT_GPUS = (SMALL_SPEC.replace("gpus_per_node = 2", "gpus_per_node = 8")
              .replace("global_batch_size = 8", "global_batch_size = 12\nmicro_batch_size = 4"))


def _rules(path: Path | str) -> dict[str, object]:
    loaded = load(path)
    return {i.rule: i for i in issues_for("validate", loaded, resolve(loaded.spec))}


def test_an_inconsistent_tp_gets_no_batch_remedy_from_a_rounded_dp(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(EIGHT_GPUS + "[parallel]\ntensor_model_parallel_size = 3\n")
    found = _rules(spec)
    assert "batch-divisible" not in found
    layout = found["world-divisible-by-model-parallel"]
    assert layout.fix.set == {"parallel.tensor_model_parallel_size": 2, "train.global_batch_size": 16}


def test_a_consistent_layout_still_gets_the_batch_rule(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(EIGHT_GPUS + "[parallel]\ntensor_model_parallel_size = 2\n")
    found = _rules(spec)
    assert found["batch-divisible"].fix.set == {"train.global_batch_size": 16}


def test_a_sweep_member_with_a_bad_tp_gets_only_the_layout_remedy(tmp_path: Path) -> None:
    base = tmp_path / "base.toml"
    base.write_text(EIGHT_GPUS)
    sweep = tmp_path / "sweep.py"
    sweep.write_text("from dlmspec.dsl import Spec\nbase = Spec.load(%r)\n"
                     "spec = {f'tp{t}': base.replace(parallel={'tensor_model_parallel_size': t}) for t in (2, 3)}\n"
                     % str(base))
    good, bad = sweep_targets(sweep)
    assert "batch-divisible" in _rules(good)
    found = _rules(bad)
    assert "batch-divisible" not in found and "world-divisible-by-model-parallel" in found


def test_the_dp_derived_rules_are_marked() -> None:
    assert {r.id for r in RULES.values() if getattr(r, "needs_layout", False)} >= {"batch-divisible", "vpp-microbatches",
                                                                 "pipeline-bubble"}


def test_layout_consistent_checks_the_expert_groups_too(tmp_path: Path) -> None:
    from dlmspec.check.registry import layout_consistent

    spec = tmp_path / "spec.toml"
    spec.write_text(EIGHT_GPUS)
    r = resolve(load(spec).spec)
    assert layout_consistent(r)
    assert not layout_consistent(type(r)(**{**r.__dict__, "ep": 3}))
