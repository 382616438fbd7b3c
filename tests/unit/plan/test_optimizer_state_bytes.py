"""The planner's optimizer-state bytes per option (dlmspec/plan/optimizer_state.py) against hand
counts from megatron-core 0.16.1 and Transformer Engine's FusedAdam, their place in the memory plan,
and the CPU offload's time term."""

from __future__ import annotations

from typing import Any

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan.optimizer_state import (
    HOST_ADAM_BYTES, HOST_ADAM_GBPS, PCIE_EFFICIENCY, offload_seconds, state_bytes,
)
from dlmspec.plan.shape import layout
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

PA = {"train.use_precision_aware_optimizer": True}

#: (changes, GPU bytes of optimizer state per owned parameter, host bytes, step-only bytes), by hand:
CASES: list[tuple[str, dict[str, Any], float, float, float]] = [
    # fp32 master (4) + fp32 exp_avg, exp_avg_sq (8): Megatron-LM's 18 = 2 + 4 + 12
    ("plain-bf16", {}, 12, 0, 0),
    # fp32 weights are the master: the moments only
    ("plain-fp32", {"precision.dtype": "fp32"}, 8, 0, 0),
    # SGD: fp32 momentum + fp32 master
    ("sgd", {"train.optimizer": "sgd"}, 8, 0, 0),
    # TE FusedAdam, fp32 master as int16 remainders (2) + fp32 moments (8)
    ("precision-aware", PA, 10, 0, 0),
    # remainders (2) + bf16 moments (2 + 2); the step's fp32 copies of both moments (4 + 4)
    ("bf16-moments", {**PA, "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16"}, 6, 0, 8),
    # no remainders: the whole fp32 master (4) + bf16 moments (4)
    ("bf16-moments-whole-master", {**PA, "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16",
                                   "train.store_param_remainders": False}, 8, 0, 8),
    # fp16 master (2) + fp8 moments (1 + 1); fp32 copies of all three in the step (12)
    ("fp8-moments-fp16-master", {**PA, "train.exp_avg_dtype": "fp8", "train.exp_avg_sq_dtype": "fp8",
                                 "train.main_params_dtype": "fp16"}, 4, 0, 12),
    # HybridDeviceOptimizer, all offloaded: host fp32 copy (4) + fp32 moments (8) + pinned fp32 grad (4)
    ("cpu-offload", {**PA, "train.optimizer_cpu_offload": True}, 0, 16, 0),
    # half offloaded: GPU keeps an fp32 copy (4) and fp32 moments (8) of the other half
    ("cpu-offload-half", {**PA, "train.optimizer_cpu_offload": True, "train.optimizer_offload_fraction": 0.5}, 6, 8, 0),
]


def _layout(changes: dict[str, Any], **more: Any):
    return layout(resolve(Spec.model_validate(spec_dict({**changes, **more}))))


@pytest.mark.parametrize(("name", "changes", "gpu", "host", "step"), CASES, ids=[c[0] for c in CASES])
def test_optimizer_state_bytes_per_parameter_match_the_hand_count(name, changes, gpu, host, step) -> None:
    s = state_bytes(_layout(changes))
    assert (s.gpu, s.host, s.step_transient) == (gpu, host, step)


def test_memory_plan_shards_the_precision_aware_state_like_the_plain_one() -> None:
    """8 GPUs, distributed optimizer: the optimizer_states term is bytes/param x params / DP, so
    bf16 moments with remainders (6) are half the plain state (12); CPU offload leaves none."""
    terms = {}
    for name, changes in (("plain", {}), ("bf16", {**PA, "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16"}),
                          ("offload", {**PA, "train.optimizer_cpu_offload": True})):
        plan = make_plan(resolve(Spec.model_validate(spec_dict({"model.transformer_impl": "transformer_engine",
                                                                 **changes}))))
        terms[name] = plan.memory.peak.breakdown["optimizer_states"]
        params = sum(plan.memory.peak.params)
        assert plan.layout.dp == 8
    assert terms["plain"] == pytest.approx(12 * params / 8)
    assert terms["bf16"] == pytest.approx(terms["plain"] / 2)
    assert terms["offload"] == 0


def test_plan_reports_the_bytes_per_parameter_of_the_options() -> None:
    plan = make_plan(resolve(Spec.model_validate(spec_dict({**PA, "train.optimizer_cpu_offload": True}))))
    assert "16 in host memory" in plan.runtime["optimizer_state"]
    plain = make_plan(resolve(Spec.model_validate(spec_dict())))
    assert "optimizer_state" not in plain.runtime  # plan.json of a spec without the options is unchanged


def test_cpu_offload_time_is_pcie_copies_plus_the_host_adam() -> None:
    lay = _layout({**PA, "train.optimizer_cpu_offload": True})
    link = 64e9 * PCIE_EFFICIENCY  # h100: PCIe Gen5 x16, 64 GB/s per direction
    copies = 1e9 * 4 / link + 1e9 * 4 / link  # fp32 gradients down, fp32 master up
    host = 1e9 * HOST_ADAM_BYTES / (HOST_ADAM_GBPS * 1e9)
    assert offload_seconds(lay, 1e9, "h100") == pytest.approx(copies + host)
    overlapped = _layout({**PA, "train.optimizer_cpu_offload": True, "train.overlap_cpu_optimizer_d2h_h2d": True})
    assert offload_seconds(overlapped, 1e9, "h100") == pytest.approx(max(copies, host))
    assert offload_seconds(_layout(PA), 1e9, "h100") == 0.0


def test_offload_makes_the_planned_step_slower_by_at_least_its_copies() -> None:
    base = make_plan(resolve(Spec.model_validate(spec_dict(PA))))
    off = make_plan(resolve(Spec.model_validate(spec_dict({**PA, "train.optimizer_cpu_offload": True}))))
    owned = sum(off.memory.peak.params) / off.layout.dp
    assert off.time.breakdown["optimizer"] - base.time.breakdown["optimizer"] >= 0.9 * offload_seconds(
        off.layout, owned, "h100")
