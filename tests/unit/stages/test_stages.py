"""The compiler's stage registry (dlmspec/stages.py): what a registration may write into train.py,
and the template values each built-in stage gives."""

from __future__ import annotations

import pytest

from dlmspec import stages
from dlmspec.stages import StageKind, register_stage_kind


@pytest.mark.parametrize("entry, why", [
    (StageKind("Toy", "s"), "lowercase"),
    (StageKind("toy; import os", "s"), "lowercase"),
    (StageKind("toy", "s", imports=(("os; os.system('x')", ""),)), "not a module"),
    (StageKind("toy", "s", imports=(("pkg.mod", "A, B"),)), "not a module"),
    (StageKind("toy", "s", template="t.j2", options_call="__import__('os')"), "options_call"),
    (StageKind("toy", "s", options_call="build_toy()"), "needs a template"),
])
def test_a_registration_that_would_write_code_into_train_py_is_refused(entry, why) -> None:
    with pytest.raises(ValueError, match=why):
        register_stage_kind(entry)
    assert "toy" not in stages.STAGE_KINDS


def test_the_built_in_stages_are_registered() -> None:
    assert list(stages.STAGE_KINDS)[:3] == ["pretrain", "sft", "rl"]
    assert stages.stage_kind("sft").options_call == "build_sft()"
    assert stages.stage_kind("rl").runtime and stages.stage_kind("nope") is None
    assert stages.known_kinds().startswith("'pretrain', 'sft', 'rl'")


def test_a_plugin_stage_registers_and_is_replaced_on_a_second_import() -> None:
    try:
        register_stage_kind(StageKind("toy", "first", imports=(("pkg.toy", ""),)))
        register_stage_kind(StageKind("toy", "second"))
        assert stages.stage_kind("toy").summary == "second"
    finally:
        stages.STAGE_KINDS.pop("toy", None)
