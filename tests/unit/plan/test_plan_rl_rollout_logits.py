"""The rollout's inference forward and its logits' traffic (dlmspec/plan/rl.py ``sampler_work``,
``logits_traffic``): bytes per logit counted pass by pass from the sampler's code, the output layer and
the logits over the block's columns (the AR sampler's: every position so far), the decoder over the canvas."""

from __future__ import annotations

import pytest

from dlmspec.plan.rl import COMMIT_BYTES, GUIDANCE_BYTES, logits_traffic
from rl_plan_kit import rl_plan, rollout_work


def plan(*extra: str):
    """The demo's RL plan, its rollouts at temperature 1."""
    return rl_plan("generate.temperature=1.0", *extra)


def _options(**generate) -> dict:
    base = {"gen_length": 8, "block_length": 8, "steps": 8, "cfg_scale": 0.0, "temperature": 0.0}
    return {"algorithm": "diffu-grpo", "estimator": None, "elbo_samples": 4, "generate": {**base, **generate}}


def test_each_pass_over_the_logits_is_counted() -> None:
    # bf16: transpose 2 + 2, .float() 2 + 4; the commit: float64 copy 4 + 8, argmax 8, softmax 3 x 8 + 8
    assert COMMIT_BYTES["greedy"] == 12 + 8 + 32
    assert logits_traffic(_options(), 32, act_bytes=2) == {"columns": 8.0, "bytes": 4 + 6 + 52}
    # Gumbel noise: rand 8, log_ / neg_ / log_ 16 each, the subtraction 16 + 8; l / T 8 + 8 unless T = 1
    assert logits_traffic(_options(temperature=1.0), 32, act_bytes=2)["bytes"] == 10 + 52 + 80
    assert logits_traffic(_options(temperature=0.7), 32, act_bytes=2)["bytes"] == 10 + 52 + 80 + 16
    # guidance: both halves' output, then uncond + (w + 1)(cond - uncond) in float32
    assert GUIDANCE_BYTES == 32
    assert logits_traffic(_options(cfg_scale=1.0), 32, act_bytes=2)["bytes"] == 2 * 10 + 32 + 52
    # float32: the transpose 4 + 4 and the copy of the graph's static output 4 + 4
    assert logits_traffic(_options(), 32, act_bytes=4)["bytes"] == 16 + 52
    # the block is the logits' width, at most gen_length
    assert logits_traffic(_options(block_length=32), 32, act_bytes=2)["columns"] == 8.0


def test_the_ar_sampler_moves_every_positions_logits_once() -> None:
    ar = {**_options(), "algorithm": "grpo"}
    assert logits_traffic(ar, 32, act_bytes=2) == {"columns": 32 - 8 / 2, "bytes": 10.0}


def test_the_logits_traffic_is_calls_rows_columns_vocabulary_and_bytes_at_the_calibrated_bandwidth() -> None:
    p = plan()
    moved = 64 * 32 * 32 * p.shape.vocab * (10 + 52 + 80)
    bandwidth = p.gpu.hbm_gbps * 1e9 * p.calibration.memory_efficiency
    assert rollout_work(p)["logits"] == pytest.approx(moved / bandwidth)


def test_the_output_layer_and_the_logits_cover_the_block_and_the_decoder_the_canvas() -> None:
    narrow, wide = plan(), plan("generate.block_length=64")
    a = rollout_work(narrow)
    b = rollout_work(wide)
    assert b["decoder"] == pytest.approx(a["decoder"]) and b["head"] == pytest.approx(2 * a["head"])
    assert b["logits"] == pytest.approx(2 * a["logits"])
    # the output layer: 2 h V FLOPs over 64 calls x 32 rows x 32 columns at the bf16 GEMM rate
    shape, cal = narrow.shape, narrow.calibration
    rate = narrow.gpu.bf16_tflops * 1e12 * cal.gemm_efficiency * cal.gpu_compute_scale.get(narrow.gpu.id, 1.0)
    assert a["head"] == pytest.approx(2 * shape.hidden * shape.vocab * 64 * 32 * 32 / rate)


def test_the_decoder_is_an_inference_forward_not_a_third_of_the_training_step() -> None:
    # a third of the step holds the cross entropy over every position and training-only work; the sampler
    # runs neither, so its decoder forward per full pass costs less than a third of the step's compute
    p = plan()
    b = p.time.breakdown
    work = rollout_work(p)
    third = (b["gemm"] + b["attention"] + b["elementwise"]) / 3
    assert 0 < work["decoder"] / 64 < third
