"""``Resolved.stage_values`` comes from the ``[stage] kind``'s registration (:mod:`dlmspec.stages`):
its ``resolve_values(spec, table, defaults)``, not a branch on the kind's name in the resolver."""

from __future__ import annotations

from pathlib import Path

from dlmspec import stages
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]


def test_a_registered_stage_kind_gives_the_values_resolve_keeps() -> None:
    seen = []

    def values(spec, table, defaults):
        seen.append(table)
        return {"kind": spec.stage.kind, "mask": spec.objective.kind}

    stages.register_stage_kind(stages.StageKind("toy-stage", "a stage of a plugin", resolve_values=values))
    try:
        spec = load(ROOT / "specs" / "demo-dlm.toml", ["stage.kind=toy-stage"]).spec
        assert resolve(spec).stage_values == {"kind": "toy-stage", "mask": "mdm"}
        assert seen == [None]  # no [stage.<section>] table declared
    finally:
        stages.STAGE_KINDS.pop("toy-stage", None)


def test_sft_values_fill_the_section_defaults_through_its_registration() -> None:
    entry = stages.stage_kind("sft")
    assert entry is not None and entry.section == ("sft", "SFTSpec") and entry.resolve_values is not None
    spec = load(ROOT / "specs" / "demo-dlm.toml", ["stage.kind=sft"]).spec
    got = resolve(spec).stage_values
    assert got["pad_eos_tokens"] is None  # mdm supervises every padding EOS (LLaDA sec. 2.3)
    assert got["section"].packed_sequence is False
    ar = load(ROOT / "specs" / "demo-ar.toml", ["stage.kind=sft"]).spec
    assert resolve(ar).stage_values["pad_eos_tokens"] == 0
    assert resolve(load(ROOT / "specs" / "demo-dlm.toml").spec).stage_values is None
