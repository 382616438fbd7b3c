"""An unknown ``[generate] preset`` is reported beside the table's other errors, not instead of them:
the table's validator stops at the preset, so the loader validates the table again without it (a new
user's finding: 11 bad keys and a bad preset showed only the preset)."""

from __future__ import annotations

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from spec_kit import spec_file


def test_the_preset_and_every_other_generate_error_are_reported_together(tmp_path):
    path = spec_file(tmp_path, {"train.micro_batch_size": 0},
                     generate={"preset": "nope", "cache": "duel", "steps": 0})
    with pytest.raises(SpecError) as caught:
        load(path)
    keys = [i.key for i in caught.value.issues]
    assert {"generate.preset", "generate.cache", "generate.steps", "train.micro_batch_size"} <= set(keys), keys
    assert len(keys) == len(set(keys)), keys  # nothing twice
    preset = next(i for i in caught.value.issues if i.key == "generate.preset")
    assert "llada-gsm8k" in preset.hint and preset.line is not None


def test_a_bad_preset_alone_is_one_error(tmp_path):
    with pytest.raises(SpecError) as caught:
        load(spec_file(tmp_path, generate={"preset": "nope"}))
    assert [i.key for i in caught.value.issues] == ["generate.preset"]
