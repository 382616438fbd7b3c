"""The planner's output layer counts the rows that reach it: block diffusion without an AR loss
passes only the noised half x_t (L of the 2L input positions) from the decoder to the output layer
(backends/megatron/objectives/bd3lm.py noised_half_output), so the logits GEMM, the cross entropy's
bytes and the logits' memory are those of L rows; with an AR loss, or under sequence parallelism,
all 2L rows reach it. Hand counts on the demo block-diffusion spec (L = 512, blocks of 16)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dlmspec.flops import forward_flops_per_token
from dlmspec.objectives.bd3lm import attended_keys_block_diffusion
from dlmspec.plan import make_plan, plan_layout
from dlmspec.plan.elementwise import CE_BYTES_PER_LOGIT, elementwise_bytes
from dlmspec.plan.shape import output_length, output_rows
from dlmspec.plan.time import stage_work
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
BD3 = ROOT / "specs" / "demo-bd3lm.toml"
MEGATRON_CE = 'kernels.cross_entropy="megatron"'


def _plan(*sets: str):
    return make_plan(resolve(load(BD3, list(sets)).spec))


def _whole_output(plan):
    """The same plan with every input position reaching the output layer (what was counted before)."""
    shape = dataclasses.replace(plan.shape, extra_positions_output=True)
    return plan_layout(plan.name, shape, plan.layout, plan.gpu, dict(plan.runtime), plan.calibration)


def test_only_the_noised_half_reaches_the_output_layer_without_an_ar_loss() -> None:
    plan = _plan()
    assert output_length(plan.shape, plan.layout) == 512  # of 1024 input positions
    assert output_rows(plan.shape, plan.layout) == plan.layout.micro_batch * 512


def test_an_ar_loss_on_the_clean_half_sends_both_halves_to_the_output_layer() -> None:
    plan = _plan("objective.ar_loss_weight=0.5")
    assert output_length(plan.shape, plan.layout) == 1024


def test_sequence_parallelism_keeps_both_halves_at_the_output_layer() -> None:
    plan = _plan("parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                 "cluster.gpus_per_node=2")
    assert plan.layout.tp == 2 and plan.layout.sp
    assert output_length(plan.shape, plan.layout) == 1024


def test_model_flops_count_the_logits_gemm_on_the_noised_half_only() -> None:
    plan = _plan()
    s, lay = plan.shape, plan.layout
    parts = forward_flops_per_token(s.num_layers, s.hidden, s.ffn, s.heads, s.groups, s.head_dim, s.vocab, 1024,
                                    gated=s.gated, keys=attended_keys_block_diffusion(512, 16))
    decoder = sum(v for k, v in parts.items() if k != "logits")
    # forward + backward (x3): the decoder on 1024 positions, the output layer's 2 h V on 512 rows
    want = 3 * (decoder * 1024 + 2 * s.hidden * s.vocab * 512) * lay.global_batch
    assert plan.time.flops.model_per_step == pytest.approx(want)
    whole = _whole_output(plan)
    assert whole.time.flops.model_per_step - plan.time.flops.model_per_step == pytest.approx(
        3 * 2 * s.hidden * s.vocab * 512 * lay.global_batch)


def test_the_output_gemm_time_and_cross_entropy_bytes_count_the_noised_half() -> None:
    plan = _plan(MEGATRON_CE)
    s, lay = plan.shape, plan.layout
    whole = dataclasses.replace(s, extra_positions_output=True)
    last = lay.pp - 1
    counts = (s.num_layers, 0)
    half_rows = lay.micro_batch * 512
    ew = elementwise_bytes(whole, lay, last, counts) - elementwise_bytes(s, lay, last, counts)
    assert ew == pytest.approx(CE_BYTES_PER_LOGIT * half_rows * s.vocab / lay.tp)
    a, b = stage_work(whole, lay, plan.gpu, last, plan.calibration), stage_work(s, lay, plan.gpu, last, plan.calibration)
    gemm_flops = 3 * 2 * s.hidden * s.vocab / lay.tp * half_rows
    assert a.gemm_seconds - b.gemm_seconds == pytest.approx(
        gemm_flops / (plan.gpu.bf16_tflops * 1e12) / plan.calibration.gpu_compute_scale.get(plan.gpu.id, 1.0))


def test_the_logits_memory_is_that_of_the_noised_half() -> None:
    plan = _plan(MEGATRON_CE)
    s, lay = plan.shape, plan.layout
    # megatron's cross entropy: bf16 logits + their fp32 copy, 6 bytes per logit of the L rows
    want = plan.calibration.activation_scale * 6 * lay.micro_batch * 512 * s.vocab / lay.tp
    assert plan.memory.peak.breakdown["loss_logits"] == pytest.approx(want)
    assert _whole_output(plan).memory.peak.breakdown["loss_logits"] == pytest.approx(2 * want)
