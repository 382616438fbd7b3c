"""Pinned evaluation protocols (dlmspec/generate_presets.py): a [generate] preset fills the keys a
spec does not write, written keys win, the name is kept, an unknown name is an exit-2 error, and
every preset cites a source and the sampler accepts its settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.generate_presets import PRESETS, PresetError, apply_preset, preset_record
from dlmspec.generate_settings import GenerateConfig
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_cites_a_source_and_runs_in_the_sampler(name):
    preset = PRESETS[name]
    assert "arXiv:" in preset.source and "github:" in preset.source
    assert set(preset.unconfirmed) <= set(preset.settings) | set(preset.protocol)
    values = apply_preset({"preset": name})
    values.pop("preset")
    GenerateConfig(kind="mdm", mask_token_id=0, **values)  # raises on settings the sampler cannot run


def test_written_keys_win_and_unwritten_keys_come_from_the_preset():
    values = apply_preset({"preset": "fast-dllm-gsm8k", "threshold": 0.8})
    assert values["threshold"] == 0.8 and values["block_length"] == 32 and values["remasking"] == "threshold"
    assert values["preset"] == "fast-dllm-gsm8k"
    assert "cache" in preset_record("fast-dllm-gsm8k")["settings"]
    with pytest.raises(PresetError, match="llada-gsm8k"):
        apply_preset({"preset": "llada-gsm9k"})


def test_a_spec_preset_is_resolved_and_recorded(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\npreset = "llada-gsm8k-semi-ar"\n'
                    "gen_length = 128\n")
    table = load(spec).spec.generate
    # the preset's one-token-per-step (steps = gen_length) follows the written gen_length; its block of 8 stays
    assert (table.preset, table.gen_length, table.block_length, table.steps) == ("llada-gsm8k-semi-ar", 128, 8, 128)
    spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\npreset = "nope"\n')
    result = CliRunner().invoke(app, ["validate", str(spec), "--json"])
    assert result.exit_code == 2
    issue = json.loads(result.stdout)["issues"][0]
    assert issue["key"].startswith("generate") and "fast-dllm-gsm8k" in issue["message"] + (issue["hint"] or "")
