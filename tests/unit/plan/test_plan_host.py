"""The planner's host terms: cluster.host_launch_us scales the host constants, Megatron-FSDP's
host operations, and what the plan reports about the host it assumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.spec.load import load
from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.launches import FSDP_OPS_PER_TENSOR, fsdp_buckets, fsdp_host_ops, param_tensors
from dlmspec.plan.time import host_speed
from dlmspec.resolve import resolve

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "specs" / "demo-dlm.toml"
LAUNCH_BOUND = ['kernels.cross_entropy="megatron"', "kernels.apply_rope_fusion=false"]


def _plan(*overrides, calib=DEFAULT_CALIBRATION):
    return make_plan(resolve(load(DEMO, list(overrides)).spec), calib)


def test_default_host_is_the_calibrations():
    plan = _plan(*LAUNCH_BOUND)
    assert plan.layout.host_launch_seconds is None and plan.time.host_scale == 1.0
    d = plan.to_dict()["time"]
    assert d["host_launch_us"] == pytest.approx(DEFAULT_CALIBRATION.host_launch_seconds * 1e6)
    assert d["host_launch_source"] == "calibration"
    assert "typical host" in plan.runtime["host_launch"]


def test_host_launch_scales_the_host_terms():
    base = _plan(*LAUNCH_BOUND)
    typical = DEFAULT_CALIBRATION.host_launch_seconds * 1e6
    slow = _plan(*LAUNCH_BOUND, f"cluster.host_launch_us={2 * typical}")
    same = _plan(*LAUNCH_BOUND, f"cluster.host_launch_us={typical}")
    assert same.time.step_seconds == pytest.approx(base.time.step_seconds)
    assert slow.time.host_scale == pytest.approx(2.0)
    b0, b2 = base.time.breakdown, slow.time.breakdown
    assert b2["host_sync"] == pytest.approx(2 * b0["host_sync"])
    assert base.time.features["kernels"] > 0  # the demo at micro batch 32 is launch-bound
    # Launch-bound: the host's kernels (GPU floor + wait) double with the host time.
    host0 = (base.time.features["kernels"] * DEFAULT_CALIBRATION.seconds_per_kernel
             + base.time.features["compiled_calls"] * DEFAULT_CALIBRATION.seconds_per_compiled_call)
    assert slow.time.step_seconds - base.time.step_seconds == pytest.approx(host0 + b0["host_sync"], rel=1e-6)
    assert slow.to_dict()["time"]["host_launch_source"] == "spec"
    assert "cluster.host_launch_us" in slow.runtime["host_launch"]


def test_gpu_bound_runs_hide_the_launches():
    qwen = ["model.num_layers=28", "model.hidden_size=2048", "model.ffn_hidden_size=6144",
            "model.num_attention_heads=16", "model.num_query_groups=8", "model.kv_channels=128",
            "train.micro_batch_size=8", "train.global_batch_size=8", "train.seq_length=2048",
            "model.max_position_embeddings=2048"]
    # Micro batch 8 x 2048: with every [kernels] default, 4 x 2048 sits at the launch/GPU boundary.
    base, fast = _plan(*qwen), _plan(*qwen, "cluster.host_launch_us=3")
    assert base.time.features["gemm"] > 0  # GPU-bound
    assert fast.time.step_seconds < base.time.step_seconds  # the syncs and the step's launches
    assert fast.time.breakdown["gemm"] == base.time.breakdown["gemm"]
    assert fast.time.breakdown["kernel_launch"] == base.time.breakdown["kernel_launch"]  # hidden


def test_host_speed_ratio():
    lay = _plan(*LAUNCH_BOUND, "cluster.host_launch_us=9").layout
    assert host_speed(lay, DEFAULT_CALIBRATION.with_values(host_launch_seconds=3e-6)) == pytest.approx(3.0)


FSDP = ["cluster.gpus_per_node=2", "train.global_batch_size=64", 'parallel.fsdp="megatron"']


@pytest.mark.parametrize("strategy, gather, reduce", [
    ("optim_grads_params", True, True), ("optim_grads", False, True), ("optim", False, False), ("no_shard", False, False)])
def test_fsdp_host_operations(strategy, gather, reduce):
    plan = _plan(*FSDP, f'parallel.data_parallel_sharding_strategy="{strategy}"')
    shape, lay = plan.shape, plan.layout
    counts = (shape.num_layers, 0)
    tensors, buckets = param_tensors(shape, lay, 0, counts), fsdp_buckets(counts)
    assert buckets == shape.num_layers + 1
    per_mb, per_step = fsdp_host_ops(shape, lay, 0, counts)
    assert per_mb == FSDP_OPS_PER_TENSOR * tensors + buckets * (12 * gather + 9 * reduce)
    assert per_step == 4 * tensors + 5 * buckets + (0 if reduce else 9 * buckets)
    assert plan.time.features["fsdp_ops"] > 0


def test_no_fsdp_no_fsdp_host_operations():
    plan = _plan("cluster.gpus_per_node=2", "train.global_batch_size=64")
    assert fsdp_host_ops(plan.shape, plan.layout, 0, (plan.shape.num_layers, 0)) == (0.0, 0.0)
    assert plan.time.features["fsdp_ops"] == 0


def test_fsdp_costs_more_than_the_distributed_optimizer():
    fsdp = _plan(*FSDP, 'parallel.data_parallel_sharding_strategy="optim_grads_params"', *LAUNCH_BOUND)
    ddp = _plan("cluster.gpus_per_node=2", "train.global_batch_size=64", *LAUNCH_BOUND)
    assert fsdp.time.step_seconds > ddp.time.step_seconds * 1.2


def test_fused_ce_chunk_loop_launches_at_their_own_host_cost():
    """The fused linear cross entropy's chunk-loop launches cost seconds_per_fused_ce_kernel of
    host time each (Liger's tight loop inside one autograd.Function), the other launches
    seconds_per_kernel; on the GPU every launch keeps its per-kernel floor."""
    from dlmspec.plan.launches import fused_ce_kernels
    from dlmspec.plan.time import host_seconds, stage_work

    fused = ['kernels.cross_entropy="fused_linear"', "kernels.apply_rope_fusion=false"]
    plan = _plan(*fused)
    n = fused_ce_kernels(plan.shape, plan.layout)
    assert n == 8 * -(-plan.shape.vocab // plan.shape.hidden) and n > 100  # Liger: ~ceil(V / h) chunks
    f = plan.time.features
    assert f["gemm"] == 0.0  # launch-bound
    m = plan.layout.num_microbatches
    assert f["fused_ce_kernels"] == pytest.approx(m * n)
    megatron = _plan(*LAUNCH_BOUND)
    assert megatron.time.features["fused_ce_kernels"] == 0.0
    # The chunk loop's launches are not among the megatron-core launches the kernels feature counts.
    w = stage_work(plan.shape, plan.layout, plan.gpu, plan.layout.pp - 1, DEFAULT_CALIBRATION)
    assert w.fused_ce_kernels == n and w.kernels > n
    c = DEFAULT_CALIBRATION
    assert host_seconds(w, c) == pytest.approx((w.kernels - n) * c.seconds_per_kernel + n * c.seconds_per_fused_ce_kernel
                                               + w.compiled_calls * c.seconds_per_compiled_call)
    # The step changes by exactly the chunk loop's host time when its constant does.
    cheap = _plan(*fused, calib=c.with_values(seconds_per_fused_ce_kernel=0.0))
    dear = _plan(*fused, calib=c.with_values(seconds_per_fused_ce_kernel=c.seconds_per_kernel))
    assert dear.time.step_seconds - cheap.time.step_seconds == pytest.approx(m * n * c.seconds_per_kernel, rel=1e-6)
    assert plan.time.step_seconds - cheap.time.step_seconds == pytest.approx(m * n * c.seconds_per_fused_ce_kernel, rel=1e-6)
    # The fitted value is about one micro-benchmark launch, well below a megatron-core launch's.
    assert c.seconds_per_fused_ce_kernel < c.seconds_per_kernel / 2
