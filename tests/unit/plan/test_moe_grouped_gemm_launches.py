"""The planner's expert launches, grouped GEMM against SequentialMLP (dlmspec/plan/moe_experts.py):
Transformer Engine's grouped GEMM keeps the measured launches per expert at every expert count (the
8-expert calibration run, and the public calibration split's 16-experts-per-rank points); on the local
path megatron-core's GroupedMLP launches fewer kernels than SequentialMLP, so it plans faster."""

from __future__ import annotations

from typing import Any

from dlmspec.plan import make_plan
from dlmspec.plan.launches import KERNELS_PER_LOCAL_EXPERT, kernels_per_microbatch
from dlmspec.plan.moe_experts import GROUPED_PER_LOCAL_EXPERT, GROUPED_PER_MOE_LAYER, expert_kernels
from dlmspec.plan.memory import stage_layer_counts
from dlmspec.plan.shape import layout, model_shape
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

TE = {"model.transformer_impl": "transformer_engine"}


def _resolved(experts: int, grouped: bool, **more: Any):
    return resolve(Spec.model_validate(spec_dict({
        **TE, "model.num_experts": experts, "model.moe_router_topk": min(8, experts), "model.moe_ffn_hidden_size": 128,
        "model.moe_grouped_gemm": grouped, **more})))


def test_te_grouped_gemm_keeps_the_measured_launches_per_expert_at_every_expert_count():
    for experts in (8, 16, 64, 128):
        r = _resolved(experts, True)
        shape, lay = model_shape(r), layout(r)
        grouped = expert_kernels(shape, lay, "transformer_engine", KERNELS_PER_LOCAL_EXPERT["transformer_engine"])
        assert grouped == GROUPED_PER_MOE_LAYER["transformer_engine"] + GROUPED_PER_LOCAL_EXPERT["transformer_engine"] * experts
        assert grouped == KERNELS_PER_LOCAL_EXPERT["transformer_engine"] * experts


def test_local_grouped_gemm_counts_fewer_launches_than_sequential_experts():
    for experts in (16, 128):
        r = _resolved(experts, True, **{"model.transformer_impl": "local"})
        shape, lay = model_shape(r), layout(r)
        grouped = expert_kernels(shape, lay, "local+sdpa", KERNELS_PER_LOCAL_EXPERT["local+sdpa"])
        assert grouped == GROUPED_PER_MOE_LAYER["local+sdpa"] < KERNELS_PER_LOCAL_EXPERT["local+sdpa"] * experts


def test_the_measured_eight_expert_grouped_run_keeps_its_calibrated_count():
    r = _resolved(8, True)
    assert expert_kernels(model_shape(r), layout(r), "transformer_engine",
                          KERNELS_PER_LOCAL_EXPERT["transformer_engine"]) == KERNELS_PER_LOCAL_EXPERT["transformer_engine"] * 8


def test_fine_grained_moe_plans_no_slower_with_te_grouped_gemm():
    seq, grp = _resolved(128, False), _resolved(128, True)
    counts = stage_layer_counts(model_shape(seq), layout(seq), 0)
    assert kernels_per_microbatch(model_shape(grp), layout(grp), counts) <= kernels_per_microbatch(
        model_shape(seq), layout(seq), counts)
    assert make_plan(grp).time.step_seconds <= make_plan(seq).time.step_seconds
