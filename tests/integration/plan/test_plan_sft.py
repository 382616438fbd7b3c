"""SFT planning: padding waste. Padded conversations leave positions without a real
token, so an SFT plan reports real (non-padding) tokens/s and the steps a token budget takes,
from the dataset record's mean conversation length or a stated assumption
(``dlmspec/plan/sft.py``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.data.record import write_record
from dlmspec.plan import make_plan
from dlmspec.plan.sft import ASSUMED_MEAN_FRACTION, packing, real_fraction
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
SFT = ROOT / "specs" / "megadlms-1.7b-sft.toml"  # seq 1024, train_tokens 2B, data .data/chat-sft_text_document
runner = CliRunner()


def _plan(path: Path, *overrides: str):
    return make_plan(resolve(load(path, list(overrides)).spec))


def test_pretraining_has_no_sft_section():
    assert _plan(DEMO).sft is None and _plan(DEMO).to_dict()["sft"] is None


def test_without_a_record_the_mean_is_a_stated_assumption(tmp_path):
    plan = _plan(SFT, f'data.train=["{tmp_path}/none_text_document"]')
    s = plan.sft
    assert s.source == "assumed" and s.mean_sample_tokens == ASSUMED_MEAN_FRACTION * 1024
    assert any(line.startswith("assumed:") for line in s.sources)
    assert not s.packed and s.packing_key == "packed_sequence"  # padded, the default (stage.sft.packed_sequence)
    assert s.real_fraction == pytest.approx(0.5)
    assert s.positions_per_second == pytest.approx(plan.time.tokens_per_second)
    assert s.real_tokens_per_second == pytest.approx(0.5 * plan.time.tokens_per_second)
    per_step = plan.layout.global_batch * plan.layout.seq
    assert s.real_tokens_to_train == pytest.approx(plan.layout.train_iters * per_step * 0.5)
    # the budget counts real tokens: twice the steps train_tokens sets (which count positions)
    assert s.iters_for_train_tokens == math.ceil(2_000_000_000 / (per_step * 0.5))
    assert s.seconds_for_train_tokens == pytest.approx(s.iters_for_train_tokens * plan.time.step_seconds)


def test_the_record_gives_the_mean_and_the_response_share(tmp_path):
    prefix = str(tmp_path / "chat_text_document")
    write_record(prefix, documents=1000, tokens=256_000,
                 sft={"response_tokens": 64_000, "prompt_tokens": 192_000, "rows": {"written": 1000}})
    plan = _plan(SFT, f'data.train=["{prefix}"]')
    s = plan.sft
    assert s.source == "record" and s.mean_sample_tokens == pytest.approx(256.0)
    assert s.real_fraction == pytest.approx(0.25) and s.response_fraction == pytest.approx(0.25)
    assert s.response_tokens_per_second == pytest.approx(plan.time.tokens_per_second * 0.25 * 0.25)
    data = plan.to_dict()["sft"]
    assert data["mean_sample_source"] == "record" and data["real_fraction"] == pytest.approx(0.25)
    json.dumps(data)


def test_a_blend_weighs_its_records_and_longer_than_seq_is_cut(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    write_record(a, documents=10, tokens=10 * 512)
    write_record(b, documents=10, tokens=10 * 4096)  # over-long: a sequence holds 1024 of them
    s = _plan(SFT, f'data.train=[{{prefix="{a}", weight=3}}, {{prefix="{b}", weight=1}}]').sft
    assert s.mean_sample_tokens == pytest.approx((3 * 512 + 4096) / 4)
    assert s.real_fraction == pytest.approx(1.0)  # min(mean, seq) / seq with the mean 1408 > 1024
    assert s.response_fraction is None  # no "sft" section: unknown, not guessed


def test_packing_is_read_defensively():
    assert packing(None) == (False, None)
    assert packing(SimpleNamespace(chat_template="chatml")) == (False, None)
    assert packing(SimpleNamespace(packed_sequence=True)) == (True, "packed_sequence")
    assert packing(SimpleNamespace(packing="pad")) == (False, "packing")
    # packed: never below the padded fraction; short conversations fill most of a sequence
    assert real_fraction(256, 1024, packed=True) == pytest.approx(1 - 256 / 2048)
    assert real_fraction(256, 1024, packed=False) == pytest.approx(0.25)
    assert real_fraction(2048, 1024, packed=True) == pytest.approx(1.0)


def test_cli_prints_the_sft_lines(tmp_path):
    result = runner.invoke(app, ["plan", str(SFT), "--set", f'data.train=["{tmp_path}/x_text_document"]'])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert ("SFT: padded, one conversation per sequence (packed_sequence = false); mean conversation 512 tokens "
            "(assumed)") in text
    assert "50% of the positions are real (non-padding) tokens" in text and "real tokens/s of" in text
    assert "train.train_tokens = 2,000,000,000 real tokens would take" in text
    result = runner.invoke(app, ["plan", str(SFT), "--set", f'data.train=["{tmp_path}/x_text_document"]',
                                 "--set", "stage.sft.packed_sequence=true"])
    text = " ".join(result.output.split())
    assert "SFT: packed (packed_sequence = true)" in text and "75% of the positions are real" in text


def test_packed_sequence_plans_the_segment_mask():
    padded = _plan(SFT, 'model.transformer_impl="local"')
    packed = _plan(SFT, 'model.transformer_impl="local"', "stage.sft.packed_sequence=true")
    assert not padded.shape.segment_mask and packed.shape.segment_mask
    assert packed.memory.layer_terms.dense_kept["attention_mask_path"] > 0
    assert packed.peak_allocated_bytes > padded.peak_allocated_bytes


def test_segment_masks_are_planned_on_the_local_path():
    """A packed SFT sequence (or MDM padding that is partly unsupervised, stage.sft.pad_eos_tokens
    set) passes a [b, 1, s, s] segment mask (backends/megatron/sft.py segment_attention_mask); SDPA's
    masked kernel saves it as an additive mask of the activation dtype in every layer."""
    from dataclasses import replace

    from dlmspec.plan.memory import layer_terms
    from dlmspec.plan.sft import needs_segment_mask

    assert needs_segment_mask(SimpleNamespace(packed_sequence=True), "ar")
    assert needs_segment_mask(SimpleNamespace(packed_sequence=False, pad_eos_tokens=2), "mdm")
    assert not needs_segment_mask(SimpleNamespace(packed_sequence=False, pad_eos_tokens=None), "mdm")
    assert not needs_segment_mask(SimpleNamespace(packed_sequence=False, pad_eos_tokens=2), "ar")
    assert not needs_segment_mask(None, "mdm")
    plan = _plan(SFT, "train.micro_batch_size=2", "train.global_batch_size=256",
                 'model.transformer_impl="local"', "objective.variable_length_prob=0.0", "model.num_query_groups=8")
    assert not plan.shape.segment_mask  # padded (packed_sequence = false), every padding EOS supervised: no mask
    masked = replace(plan.shape, segment_mask=True)
    b, s = plan.layout.micro_batch, plan.layout.seq
    a, g, d = masked.heads, masked.groups, masked.head_dim
    assert (a, g) == (16, 8) and masked.qk_norm
    before = layer_terms(plan.shape, plan.layout).dense_kept["attention_mask_path"]
    after = layer_terms(masked, plan.layout).dense_kept["attention_mask_path"]
    assert before == 0.0
    # the mask, and with GQA the repeat_interleave'd k, v in place of the rotated k
    assert after == pytest.approx(2 * b * s * s + 2 * 2 * b * s * a * d - 2 * b * s * g * d)
    te = replace(plan.layout, impl="transformer_engine")
    assert layer_terms(masked, te).dense_kept["attention_mask_path"] == 0.0  # TE refuses masks


@pytest.mark.parametrize("spec", [SFT, DEMO])
def test_planning_a_fast_loaded_spec_imports_no_pydantic(spec):
    """``dlmspec plan`` loads with ``fast=True``; reading ``[stage.sft]`` keys that the section may
    not have must not fall back to the pydantic model (an import of ~100 ms)."""
    import subprocess
    import sys

    code = ("import sys\nfrom dlmspec.spec.load import load\nfrom dlmspec.resolve import resolve\n"
            "from dlmspec.plan import make_plan\n"
            f"make_plan(resolve(load({str(spec)!r}, fast=True).spec)).to_dict()\n"
            "print(sorted(m for m in ('pydantic', 'dlmspec.spec.models') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", out
