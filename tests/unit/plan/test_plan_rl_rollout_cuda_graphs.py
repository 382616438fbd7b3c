"""The planner's rollout time when the sampler replays the model's forward as a CUDA graph
(``[generate] cuda_graph``, dlmspec/plan/rl.py ``graph_fallback``): a replay costs no host launch
work, each forward kernel the GPU's per-kernel floor; where the runtime runs the forward eager
(AR sampler, TP > 1, FSDP, overlapped parameter gathers, ``compile``), the eager launches are priced."""

from __future__ import annotations

import pytest

from dlmspec.plan.calibration import DEFAULT_CALIBRATION
from dlmspec.plan.launches import kernels_per_microbatch
from dlmspec.plan.memory import stage_layer_counts
from rl_plan_kit import rl_plan, rollout_work

plan = rl_plan  # the demo's RL plan (tests/kits/rl_plan_kit.py)


def _work(p) -> float:
    """A rollout batch's GPU work besides launches: the inference forward and the logits' traffic."""
    return sum(rollout_work(p).values())


def _eager_launches(p) -> float:
    lay = p.layout
    return p.time.breakdown["kernel_launch"] / (3 * (lay.global_batch // (lay.micro_batch * lay.dp)))


def test_a_graph_rollout_prices_each_forward_kernel_at_the_gpu_floor() -> None:
    p = plan()  # cuda_graph is on by default
    assert p.rl.cuda_graph_fallback is None
    floor = DEFAULT_CALIBRATION.gpu_seconds_per_kernel
    kernels = kernels_per_microbatch(p.shape, p.layout, stage_layer_counts(p.shape, p.layout, 0), 0) / 3
    assert p.time.breakdown["rl_rollout"] == pytest.approx(_work(p) + 64 * kernels * floor)
    eager = plan("generate.cuda_graph=false")
    assert eager.rl.cuda_graph_fallback == "[generate] cuda_graph = false"
    assert eager.time.breakdown["rl_rollout"] == pytest.approx(_work(eager) + 64 * _eager_launches(eager))
    # the demo's calls are launch-bound: the graph's rollout is the cheaper one, and the step with it
    assert p.time.breakdown["rl_rollout"] < eager.time.breakdown["rl_rollout"]
    assert p.time.step_seconds == pytest.approx(sum(p.time.breakdown.values()))
    from dlmspec.plan.rl import rl_lines

    assert "the forward a CUDA graph" in "\n".join(rl_lines(p.rl))
    assert "the forward eager ([generate] cuda_graph = false)" in "\n".join(rl_lines(eager.rl))


@pytest.mark.parametrize("extra, why", [
    (["parallel.tensor_model_parallel_size=2", "cluster.gpus_per_node=2"], "tensor_model_parallel_size = 2"),
    (["generate.compile=true"], "[generate] compile = true (torch.compile's own graphs)"),
])
def test_where_the_runtime_runs_the_forward_eager_the_eager_launches_are_priced(extra, why) -> None:
    p = plan(*extra)
    assert p.rl.cuda_graph_fallback == why
    assert p.time.breakdown["rl_rollout"] == pytest.approx(_work(p) + 64 * _eager_launches(p))


def test_the_ar_sampler_is_priced_eager() -> None:
    p = plan('stage.rl.algorithm="grpo"', spec="demo-ar.toml")
    assert p.rl.cuda_graph_fallback == "the AR sampler calls the model eager"
