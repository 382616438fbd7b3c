"""An unknown ``[generate] preset`` is reported beside the table's other errors, not instead of them:
the table's validator stops at the preset, so the loader validates the table again without it (a new
user's finding: 11 bad keys and a bad preset showed only the preset)."""

from __future__ import annotations

import pytest

from dlmspec.errors import SpecError
from dlmspec.spec.load import load_text

SPEC = """name = "x"
[model]
preset = "qwen3-0.6b"
[train]
seq_length = 64
micro_batch_size = {mbs}
[generate]
preset = "nope"
cache = "duel"
steps = 0
"""


def test_the_preset_and_every_other_generate_error_are_reported_together():
    with pytest.raises(SpecError) as caught:
        load_text(SPEC.format(mbs=0), "bad.toml")
    keys = [i.key for i in caught.value.issues]
    assert {"generate.preset", "generate.cache", "generate.steps", "train.micro_batch_size"} <= set(keys), keys
    assert len(keys) == len(set(keys)), keys  # nothing twice
    preset = next(i for i in caught.value.issues if i.key == "generate.preset")
    assert "llada-gsm8k" in preset.hint and preset.line == 8


def test_a_bad_preset_alone_is_one_error():
    text = SPEC.format(mbs=1).replace('cache = "duel"\nsteps = 0\n', "")
    with pytest.raises(SpecError) as caught:
        load_text(text, "bad.toml")
    assert [i.key for i in caught.value.issues if i.key.startswith("generate")] == ["generate.preset"]
