"""The planner's RL terms (dlmspec/plan/rl.py): rollout time = the sampler's forward calls (an
inference forward each, its launches, its logits' traffic) / grpo_iterations, the estimator's extra passes, the reference model's forward and memory, and the
rollout counts of a run."""

from __future__ import annotations

import math

import pytest

from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from rl_plan_kit import EAGER, SPECS, rl_plan, rollout_work


def plan(*extra: str):
    """The demo's RL plan with the eager rollout forward (CUDA-graph rollouts: test_plan_rl_rollout_cuda_graphs.py)."""
    return rl_plan(EAGER, *extra)


def _launches(p) -> float:
    """One eager sampler call's launches: a third of one microbatch's."""
    lay = p.layout
    return p.time.breakdown["kernel_launch"] / (3 * (lay.global_batch // (lay.micro_batch * lay.dp)))


def _forward(p) -> float:
    b, lay = p.time.breakdown, p.layout
    microbatches = lay.global_batch // (lay.micro_batch * lay.dp)
    return (b["gemm"] + b["attention"] + b["elementwise"]) / 3 + b["kernel_launch"] / (3 * microbatches)


@pytest.mark.parametrize("mu", [1, 4])
def test_rollout_time_is_the_sampler_calls_over_the_inner_iterations(mu: int) -> None:
    p = plan(f"stage.rl.grpo_iterations={mu}")
    work = sum(rollout_work(p).values())
    assert p.time.breakdown["rl_rollout"] == pytest.approx((work + 64 * _launches(p)) / mu)
    assert p.rl.rollout_batches == math.ceil(300 / mu) and p.rl.prompts_seen == p.rl.rollout_batches * 8
    assert p.rl.completions == p.rl.prompts_seen * 4 and p.rl.sampler_passes == 64
    assert p.time.step_seconds == pytest.approx(sum(p.time.breakdown.values()))


def test_guidance_doubles_the_sampler_passes_and_the_ar_sampler_passes_once_per_token() -> None:
    assert plan("generate.cfg_scale=1.0").rl.sampler_passes == 128
    ar = rl_plan(EAGER, 'stage.rl.algorithm="grpo"', spec="demo-ar.toml")
    seq = ar.layout.seq
    assert ar.rl.sampler_passes == pytest.approx(128 * (seq - 64) / seq) and ar.rl.estimator == "ar"


def test_the_estimator_reference_and_old_policy_passes_are_counted() -> None:
    one = plan("stage.rl.grpo_kl_beta=0.0")
    assert one.time.breakdown["rl_scoring"] == 0.0  # one pass, no reference, mu = 1: nothing extra
    f = _forward(one) - one.time.breakdown["kernel_launch"] / (3 * (one.layout.global_batch // (
        one.layout.micro_batch * one.layout.dp)))
    coupled = plan("stage.rl.grpo_kl_beta=0.0", 'stage.rl.algorithm="coupled-grpo"')
    launches = coupled.time.breakdown["kernel_launch"]
    assert coupled.time.breakdown["rl_scoring"] == pytest.approx(3 * f + launches)  # the pair's second pass, fwd + bwd
    with_ref = plan("stage.rl.grpo_kl_beta=0.04", "stage.rl.grpo_iterations=2")
    no_grad = f + with_ref.time.breakdown["kernel_launch"] / 3  # a forward of every microbatch, its launches too
    # per rollout batch of mu = 2 steps: the old policy for the second iteration, the reference for both
    assert with_ref.time.breakdown["rl_scoring"] == pytest.approx((1 + 2) * no_grad / 2)
    mc = plan("stage.rl.grpo_kl_beta=0.0", 'stage.rl.estimator="mc-elbo"', "stage.rl.elbo_samples=4")
    assert mc.rl.estimator_passes == 4 and mc.time.breakdown["rl_scoring"] == pytest.approx(3 * (3 * f + launches))


def test_the_ar_estimator_scores_the_old_policy_and_the_reference_once_per_rollout_batch() -> None:
    def ar_plan(*extra: str):
        return rl_plan(EAGER, 'stage.rl.algorithm="grpo"', *extra, spec="demo-ar.toml")

    base = ar_plan("stage.rl.grpo_kl_beta=0.0", "stage.rl.grpo_iterations=1")
    assert base.time.breakdown["rl_scoring"] == 0.0
    for mu in (2, 4):
        p = ar_plan("stage.rl.grpo_kl_beta=0.04", f"stage.rl.grpo_iterations={mu}")
        b = p.time.breakdown
        no_grad = _forward(p) - b["kernel_launch"] / (3 * (p.layout.global_batch // p.layout.micro_batch)) \
            + b["kernel_launch"] / 3
        assert b["rl_scoring"] == pytest.approx(2 * no_grad / mu)  # one old-policy pass and one reference pass


def test_the_reference_model_is_a_copy_of_the_weights_in_memory_only_with_a_kl_penalty() -> None:
    with_ref, without = plan("stage.rl.grpo_kl_beta=0.04"), plan("stage.rl.grpo_kl_beta=0.0")
    stage = with_ref.memory.peak
    assert stage.breakdown["rl_reference"] == pytest.approx(sum(stage.params) * 2)  # bf16 weights
    assert without.memory.peak.breakdown["rl_reference"] == 0.0
    assert with_ref.rl.reference_bytes == stage.breakdown["rl_reference"] and without.rl.reference_bytes == 0.0


def test_the_plan_json_and_text_carry_the_rl_section() -> None:
    from dlmspec.plan.rl import rl_lines

    p = plan()
    assert p.to_dict()["rl"]["rollout_batches"] == 300
    text = "\n".join(rl_lines(p.rl))
    assert "300 rollout batches" in text and "sampler passes" in text and "reference model" in text
    assert "rl" not in make_plan(resolve(load(SPECS / "demo-dlm.toml").spec)).to_dict()
