"""The planner counts block diffusion's doubled input: activations as a sequence of 2L, FLOPs of 2L
positions at the mask's attention density ((L + B) / 2 keys a query, not 2L), tokens/s per data
token, and the two MFUs (the data tokens' model FLOPs, and the 2L positions' at the mask's density)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.flops import forward_flops_per_token
from dlmspec.objectives.bd3lm import attended_keys_block_diffusion
from dlmspec.plan import make_plan
from dlmspec.plan.report import plan_renderable
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
BD3 = ROOT / "specs" / "demo-bd3lm.toml"



def _plan(path: Path, *sets: str):
    return make_plan(resolve(load(path, list(sets)).spec))


def _mdm_on_the_same_layers():
    spec = load(ROOT / "specs" / "demo-dlm.toml", ['model.transformer_impl="local"', 'model.attention_backend="flex"',
                                                     "objective.variable_length_prob=0.0"]).spec
    return make_plan(resolve(spec))


def test_the_plan_counts_2l_positions_for_activations() -> None:
    bd3, mdm = _plan(BD3), _mdm_on_the_same_layers()
    assert bd3.shape.extra_seq_length == 512 and bd3.layout.seq == 512
    assert bd3.memory.layer_terms.dense_total == pytest.approx(2 * mdm.memory.layer_terms.dense_total)
    assert bd3.memory.peak.breakdown["activations"] > 1.9 * mdm.memory.peak.breakdown["activations"]


def test_model_flops_count_the_masks_attention_density() -> None:
    bd3 = _plan(BD3)
    s = bd3.shape
    keys = attended_keys_block_diffusion(512, 16)
    assert keys == pytest.approx((512 + 16) / 2)
    parts = forward_flops_per_token(s.num_layers, s.hidden, s.ffn, s.heads, s.groups, s.head_dim, s.vocab, 1024,
                                    gated=s.gated, keys=keys)
    # the output layer's 2 h V on the x_t half only (512 rows: no AR loss)
    want = 3 * (sum(parts.values()) * 1024 - parts["logits"] * 512) * bd3.layout.global_batch
    assert bd3.time.flops.model_per_step == pytest.approx(want)
    # not a bidirectional 2L (each query would see 1024 keys)
    full = forward_flops_per_token(s.num_layers, s.hidden, s.ffn, s.heads, s.groups, s.head_dim, s.vocab, 1024,
                                   gated=s.gated)
    assert bd3.time.flops.model_per_step < 3 * sum(full.values()) * bd3.layout.global_batch * 1024


def test_throughput_is_stated_per_data_token_and_per_input_position() -> None:
    bd3, mdm = _plan(BD3), _mdm_on_the_same_layers()
    t = bd3.time
    assert t.tokens_per_second == pytest.approx(32 * 512 / t.step_seconds)
    assert t.input_positions_per_second == pytest.approx(2 * t.tokens_per_second)
    # the data MFU counts what an MDM step over the same tokens counts
    assert t.data_mfu == pytest.approx(mdm.time.mfu * mdm.time.step_seconds / t.step_seconds)
    assert mdm.time.data_mfu == pytest.approx(mdm.time.mfu)
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(plan_renderable(bd3))
    text = console.export_text()
    assert "per data token (512 a sequence)" in text and "the input's 1,024 positions" in text
