"""The planner under megatron-core's uneven pipeline splits: each rank's layers, weights and
activations follow :func:`dlmspec.pipeline_split.chunk_layers`, the heaviest rank is the memory
peak and the slowest sets the step, also when the layout search evaluates only the ranks that can
be the peak; and the bundled Llama-3.1-405B layout plans with its published split."""

from __future__ import annotations

from pathlib import Path

from dlmspec.plan import make_plan
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.memory import in_flight, memory_plan
from dlmspec.plan.time import time_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

ROOT = Path(__file__).resolve().parents[3]

#: No constant overheads and no fitted activation scale: the test checks the counted terms only.
BARE = Calibration(allocated_overhead_bytes=0, cuda_context_bytes=0, nccl_bytes_per_group=0,
                   allocator_reserve_fraction=0.0, activation_scale=1.0)

H, F, A, G, D = 256, 1024, 8, 4, 32  # spec_kit.DEFAULT's model (head dim 256 / 8)
#: One transformer layer's parameters on one rank (TP 1): QKV, projection, two RMSNorm weights, SwiGLU MLP.
LAYER_PARAMS = H * (A + 2 * G) * D + A * D * H + 2 * H + 3 * H * F


def _plan(changes: dict):
    """A 10-layer model on 4 GPUs as PP 4 (DP 1), 16 microbatches."""
    data = spec_dict({"model.num_layers": 10, "cluster.gpus_per_node": 4, "parallel.pipeline_model_parallel_size": 4,
                      "train.micro_batch_size": 1, "train.global_batch_size": 16,
                      "kernels.cross_entropy": "megatron"}, changes)
    return make_plan(resolve(Spec.model_validate(data)), BARE)


def test_a_middle_rank_with_the_most_layers_is_the_memory_peak() -> None:
    """1 layer on the first rank, 1 on the last, 4 on each middle rank: rank 1 (4 layers, more
    microbatches in flight than rank 2) is the peak; its weights are 3 layers more than rank 0's,
    less rank 0's embedding; activations scale with layers x microbatches in flight."""
    plan = _plan({"parallel.num_layers_in_first_pipeline_stage": 1, "parallel.num_layers_in_last_pipeline_stage": 1})
    stages = plan.memory.stages
    assert [s.layers for s in stages] == [(1, 0), (4, 0), (4, 0), (1, 0)]
    assert plan.memory.peak.stage == 1
    vocab_rows = 1024  # 1000 padded to a multiple of 128
    w0, w1, w2 = (s.breakdown["weights"] for s in stages[:3])
    assert w1 == w2 == 2 * 4 * LAYER_PARAMS  # bf16
    assert w0 == 2 * (LAYER_PARAMS + vocab_rows * H)
    lay = plan.layout
    a1, a2 = stages[1].breakdown["activations"], stages[2].breakdown["activations"]
    assert a1 / a2 == in_flight(lay, 1) / in_flight(lay, 2) == 3 / 2


def test_the_search_view_of_ranks_finds_the_same_peak_and_slowest_rank() -> None:
    """``all_stages=False`` (the layout search) evaluates the first and last rank and, with an uneven
    split, the rank with the most layers: the same peak and step as every rank's plan."""
    plan = _plan({"parallel.num_layers_in_first_pipeline_stage": 1, "parallel.num_layers_in_last_pipeline_stage": 1})
    shape, lay = plan.shape, plan.layout
    assert memory_plan(shape, lay, BARE, all_stages=False).peak.stage == plan.memory.peak.stage == 1
    full, quick = time_plan(shape, lay, plan.gpu, BARE), time_plan(shape, lay, plan.gpu, BARE, all_stages=False)
    assert quick.slowest_stage == full.slowest_stage in (1, 2)
    assert quick.step_seconds == full.step_seconds


def test_the_slowest_rank_sets_the_step() -> None:
    """Moving layers from the middle ranks to the first and last (4, 1, 1, 4) against (1, 4, 4, 1)
    keeps the total but the first rank's embedding and the last rank's logits ride on the fullest
    ranks: the plan's step is the slowest rank's microbatch time x (microbatches + bubble)."""
    edges = _plan({"parallel.num_layers_in_first_pipeline_stage": 4, "parallel.num_layers_in_last_pipeline_stage": 4})
    middle = _plan({"parallel.num_layers_in_first_pipeline_stage": 1, "parallel.num_layers_in_last_pipeline_stage": 1})
    assert [s.layers[0] for s in edges.memory.stages] == [4, 1, 1, 4]
    assert edges.time.slowest_stage in (0, 3) and middle.time.slowest_stage in (1, 2)
    assert edges.time.step_seconds > middle.time.step_seconds


def test_the_accounting_flags_take_a_layer_off_the_edge_ranks() -> None:
    """14 layers + embedding + loss = 16 = 4 ranks x 4: ranks 0 and 3 hold 3 layers."""
    plan = _plan({"model.num_layers": 14, "parallel.account_for_embedding_in_pipeline_split": True,
                  "parallel.account_for_loss_in_pipeline_split": True})
    assert [s.layers[0] for s in plan.memory.stages] == [3, 4, 4, 3]


def test_the_bundled_405b_layout_plans_with_its_published_split() -> None:
    loaded = load(ROOT / "specs" / "llama-3.1-405b-pretrain.toml")
    plan = make_plan(resolve(loaded.spec))
    assert (plan.layout.tp, plan.layout.pp, plan.layout.vpp, plan.layout.cp, plan.layout.dp) == (8, 8, 8, 2, 8)
    assert [s.layers[0] for s in plan.memory.stages] == [15, 16, 16, 16, 16, 16, 16, 15]
    assert plan.memory.peak.stage == 1  # the first rank with 16 layers: more in flight than ranks 2-6
    assert plan.memory.peak.peak_bytes < plan.gpu.memory_bytes
    assert plan.time.slowest_stage == 1
    from rich.console import Console

    from dlmspec.plan.report import plan_renderable

    console = Console(record=True, width=200)
    console.print(plan_renderable(plan))
    assert "PP 8 x VPP 8 (layers per rank 15, 16, 16, 16, 16, 16, 16, 15)" in console.export_text()


def test_the_layout_search_keeps_the_split_and_proposes_only_layouts_megatron_core_builds() -> None:
    """14 layers with both accounting flags on 8 GPUs: an even-split search would skip PP 2 and
    PP 4 (14 is a multiple of neither 4 nor 2 x VPP 4); with the flags (14 + 2) / PP splits, and
    every proposed layout validates with the spec's split kept."""
    from dlmspec.check import find
    from dlmspec.plan.search import enumerate_layouts, search
    from dlmspec.plan.shape import pipeline_fits

    data = spec_dict({"model.num_layers": 14, "parallel.pipeline_model_parallel_size": 4,
                      "parallel.account_for_embedding_in_pipeline_split": True,
                      "parallel.account_for_loss_in_pipeline_split": True})
    spec = Spec.model_validate(data)
    resolved = resolve(spec)
    plan = make_plan(resolved)
    layouts = [lay for lay, _ in enumerate_layouts(plan.shape, plan.layout)]
    assert {(lay.pp, lay.vpp) for lay in layouts} >= {(4, 1), (2, 1), (2, 2), (2, 4), (4, 2)}
    assert all(pipeline_fits(plan.shape, lay, lay.pp, lay.vpp) for lay in layouts)
    result = search(resolved, top=5)
    assert result.top, result.message
    for cand in result.top:
        new = spec.replace(**cand.spec_changes())
        assert new.parallel.account_for_embedding_in_pipeline_split and new.parallel.account_for_loss_in_pipeline_split
        assert [i for i in find(("spec",), new) if i.severity == "error"] == []


def test_interleaved_in_flight_layers_follow_the_schedules_chunk_order_by_hand() -> None:
    """405B, PP 8 x VPP 8, 64 microbatches. Rank 0 warms up 2*7 + 7*8 = 70 chunk-microbatches and
    holds 71 at its peak: chunk 0 (1 layer) for k = 0-7 and 64-70, chunks 1-7 (2 layers) for
    k = 8-63: 8 + 112 + 7 = 127 layer-microbatches, 127 / 15 stage-microbatches (not 8.875).
    Rank 7 holds 57: chunks 0-6 (2 layers) for k = 0-55 and chunk 7 (1 layer) for k = 56:
    113 / 15. A rank of equal chunks keeps the schedule's count (rank 1: 8.625)."""
    from dlmspec.plan.memory import in_flight_layers

    plan = make_plan(resolve(load(ROOT / "specs" / "llama-3.1-405b-pretrain.toml").spec))
    shape, lay = plan.shape, plan.layout
    assert in_flight(lay, 0) == 71 / 8
    assert in_flight_layers(shape, lay, 0) == 127 / 15
    assert in_flight_layers(shape, lay, 7) == 113 / 15
    assert in_flight_layers(shape, lay, 1) == in_flight(lay, 1) == 69 / 8
