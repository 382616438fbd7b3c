"""The expert-parallel all-to-all terms of a fine-grained MoE layer: megatron-core's combined 1F1B
schedule pairs each all-to-all with one compute piece of the other microbatch
(dlmspec.plan.comm.combined_1f1b_layer_seconds, combined_1f1b_unpaired_share), and the flex
dispatcher (DeepEP / HybridEP) sends a token once per destination rank, DeepEP once per node
across nodes (dlmspec.plan.comm.a2a_share with Layout.moe_flex_dispatcher)."""

from __future__ import annotations

import dataclasses
from math import comb

import pytest
import tomli_w
from spec_kit import spec_dict as make_spec

from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.comm import a2a_share, combined_1f1b_layer_seconds, combined_1f1b_unpaired_share
from dlmspec.plan.time import ep_overlap_exposed, microbatch_seconds, stage_work
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text


def _plan(ep: int, nodes: int, experts: int = 128, topk: int = 8, gbs_per_rank: int = 2, pp: int = 1, vpp: int = 0):
    values = {"model.num_experts": experts, "model.moe_router_topk": topk, "model.moe_ffn_hidden_size": 256,
              "model.transformer_impl": "transformer_engine", "parallel.expert_model_parallel_size": ep,
              "cluster.nodes": nodes, "train.global_batch_size": 8 * nodes * gbs_per_rank}
    if pp > 1:
        values["parallel.pipeline_model_parallel_size"] = pp
        values["model.num_layers"] = 4 * pp * max(1, vpp)
    if vpp:
        values["parallel.virtual_pipeline_model_parallel_size"] = vpp
    data = make_spec(values)
    return make_plan(resolve(load_text(tomli_w.dumps(data), name="t.toml").spec), DEFAULT_CALIBRATION)


def test_an_all_to_all_longer_than_its_partner_is_exposed_though_the_pair_has_more_compute():
    # attention-heavy layer: 9.3 units of compute against 4 of all-to-all. Pooled, the compute
    # would hide every all-to-all (9.3); paired, the dispatch forward and backward run back to
    # back beside the experts' 0.3 units, and the attention backward waits for them: 11.
    got = combined_1f1b_layer_seconds(attn_fwd=3, attn_bwd=6, mlp_fwd=0.1, mlp_dgrad=0.1, mlp_wgrad=0.1, a2a=1)
    assert got == pytest.approx(11.0)
    assert got > max(3 + 6 + 0.3, 4 * 1)


def test_all_to_alls_shorter_than_their_partners_cost_nothing():
    got = combined_1f1b_layer_seconds(attn_fwd=2, attn_bwd=4, mlp_fwd=2, mlp_dgrad=2, mlp_wgrad=2, a2a=0.5)
    assert got == pytest.approx(2 + 4 + 2 + 2 + 2)  # the compute alone: each all-to-all ends first


def test_a_communication_bound_layer_takes_its_four_all_to_alls():
    got = combined_1f1b_layer_seconds(attn_fwd=0.1, attn_bwd=0.2, mlp_fwd=0.1, mlp_dgrad=0.1, mlp_wgrad=0.1, a2a=2)
    assert got == pytest.approx(4 * 2)  # the four all-to-alls back to back; the compute hides in them


def test_warm_up_and_cool_down_chunks_run_unpaired():
    lay = dataclasses.replace(_plan(8, 8, pp=8, vpp=4, gbs_per_rank=16).layout)
    m = lay.num_microbatches
    # megatron-core get_pp_rank_microbatches: (pp - rank - 1) * 2 + (vpp - 1) * pp, plus one
    assert combined_1f1b_unpaired_share(lay, 1) == pytest.approx(((8 - 1 - 1) * 2 + 3 * 8 + 1) / (m * 4))
    assert combined_1f1b_unpaired_share(lay, 7) == pytest.approx((3 * 8 + 1) / (m * 4))
    one = _plan(8, 1, gbs_per_rank=4).layout
    assert combined_1f1b_unpaired_share(one, 0) == pytest.approx(1 / one.num_microbatches)


def test_a_single_microbatch_overlaps_nothing():
    plan = _plan(32, 4, gbs_per_rank=1)
    lay = dataclasses.replace(plan.layout, moe_a2a_overlap=True)
    assert lay.num_microbatches == 1
    w = stage_work(plan.shape, lay, plan.gpu, 0, DEFAULT_CALIBRATION)
    plain = microbatch_seconds(stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION),
                               DEFAULT_CALIBRATION)[0]
    assert ep_overlap_exposed(w, DEFAULT_CALIBRATION, plain["ep_communication"], 1.0) == plain["ep_communication"]


def test_flex_dispatcher_sends_a_token_once_per_destination_rank_in_a_node():
    plan = _plan(8, 1)
    flex = dataclasses.replace(plan.layout, moe_flex_dispatcher="hybridep")
    none = comb(128 - 16, 8) / comb(128, 8)  # a rank of 16 experts holds none of a token's 8
    assert a2a_share(flex, plan.shape) == pytest.approx(7 * (1 - none) / 8)
    assert a2a_share(plan.layout, plan.shape) == 7 / 8  # alltoall: one copy per expert
    assert a2a_share(flex, plan.shape) < a2a_share(plan.layout, plan.shape)


def test_deepep_merges_a_tokens_copies_per_node_across_nodes_hybridep_per_rank():
    plan = _plan(32, 4)
    lay = plan.layout
    deepep = dataclasses.replace(lay, moe_flex_dispatcher="deepep")
    hybrid = dataclasses.replace(lay, moe_flex_dispatcher="hybridep")
    node_none = comb(128 - 32, 8) / comb(128, 8)  # a node of 32 experts holds none of them
    rank_none = comb(128 - 4, 8) / comb(128, 8)
    assert a2a_share(deepep, plan.shape) == pytest.approx(3 * (1 - node_none) / 8)
    assert a2a_share(hybrid, plan.shape) == pytest.approx(24 * (1 - rank_none) / 8)
    assert a2a_share(deepep, plan.shape) < a2a_share(hybrid, plan.shape) < a2a_share(lay, plan.shape) == 24 / 32


def test_flex_dispatch_shortens_the_planned_all_to_alls():
    plan = _plan(32, 4)
    base = stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)
    flex = stage_work(plan.shape, dataclasses.replace(plan.layout, moe_flex_dispatcher="deepep"), plan.gpu, 0,
                      DEFAULT_CALIBRATION)
    ratio = flex.ep_forward_seconds / base.ep_forward_seconds
    assert ratio == pytest.approx(a2a_share(dataclasses.replace(plan.layout, moe_flex_dispatcher="deepep"), plan.shape)
                                  / (24 / 32))
