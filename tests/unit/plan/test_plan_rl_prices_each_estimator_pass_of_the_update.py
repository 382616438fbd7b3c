"""The planner prices every forward-and-backward pass of an RL update, compute and kernel launches:
coupled-GRPO's second view of each pair (and mc-elbo's K - 1 extra samples) cost what the base
step's pass costs, so a small, launch-bound model's coupled step is planned near its measurement."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

SPECS = Path(__file__).resolve().parents[3] / "specs"
#: The overrides of bench/devbox/gpu/task_rl.sh's RL run on one H100 (the measured runs of
#: bench/results/rl/2026-12-06-h100-{diffu,coupled}-grpo.json).
H100_RUN = ['cluster.gpus_per_node=1', 'cluster.gpu="h100"', 'model.qk_layernorm=false', 'train.train_iters=186',
            'checkpoint.save_interval=186', 'logging.log_interval=2', 'train.eval_interval=186',
            'train.lr_decay_style="constant"',
            'generate.cuda_graph=false']  # those runs' rollouts predate CUDA graphs: the forward ran eager


def _plan(name: str, *extra: str):
    return make_plan(resolve(load(SPECS / name, [*H100_RUN, *extra]).spec))


def test_coupled_step_adds_a_whole_forward_and_backward_with_its_kernel_launches() -> None:
    one = _plan("task-addition-dlm-rl.toml")
    coupled = _plan("task-addition-dlm-rl-coupled.toml")
    b = coupled.time.breakdown
    forward_compute = (b["gemm"] + b["attention"] + b["elementwise"]) / 3
    # second view: forward + backward (3 forwards) with the step's launches; old policy and reference
    # (grpo_iterations = 2, grpo_kl_beta > 0): one more no-grad forward each
    extra = 3 * forward_compute + b["kernel_launch"] + 2 * forward_compute
    assert coupled.time.step_seconds - one.time.step_seconds == pytest.approx(extra)
    assert b["kernel_launch"] > 5 * forward_compute  # launch-bound: compute alone would miss most of it


@pytest.mark.parametrize("spec, measured", [("task-addition-dlm-rl-coupled.toml", 0.4006),
                                            ("task-addition-dlm-rl.toml", 0.2831)])
def test_planned_rl_step_is_within_15_percent_of_the_h100_measurement(spec: str, measured: float) -> None:
    """Median step_time_s of the two H100 runs (bench/results/rl/2026-12-06-h100-*-grpo.json)."""
    planned = _plan(spec).time.step_seconds
    assert abs(planned - measured) / measured <= 0.15, (spec, planned, measured)
