"""Expert-parallel all-to-alls that span nodes (dlmspec.plan.comm.a2a_share) and their overlap with
another microbatch's compute (Layout.moe_a2a_overlap, megatron-core overlap_moe_expert_parallel_comm:
dlmspec.plan.time.ep_overlap_exposed)."""

from __future__ import annotations

import dataclasses

import tomli_w
from spec_kit import spec_dict as make_spec

from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.comm import a2a_share
from dlmspec.plan.time import ep_overlap_exposed, microbatch_seconds, stage_work
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text


def _moe_plan(ep: int, nodes: int):
    data = make_spec({"model.num_experts": 32, "model.moe_router_topk": 4, "model.moe_ffn_hidden_size": 512,
                      "model.transformer_impl": "transformer_engine", "parallel.expert_model_parallel_size": ep,
                      "cluster.nodes": nodes, "train.global_batch_size": 8 * nodes * 2})
    return make_plan(resolve(load_text(tomli_w.dumps(data), name="t.toml").spec), DEFAULT_CALIBRATION)


def test_inside_a_node_every_peer_is_on_nvlink():
    lay = _moe_plan(8, 1).layout
    assert a2a_share(lay) == 7 / 8


def test_across_nodes_only_the_off_node_peers_cross_the_network():
    lay = _moe_plan(32, 4).layout
    assert lay.gpus_per_node == 8
    assert a2a_share(lay) == (32 - 8) / 32  # 8 EP ranks share each node


def test_overlapped_all_to_alls_hide_only_in_the_paired_chunks():
    plan = _moe_plan(32, 4)
    base = stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)
    lay = dataclasses.replace(plan.layout, moe_a2a_overlap=True)
    over = stage_work(plan.shape, lay, plan.gpu, 0, DEFAULT_CALIBRATION)
    assert over.ep_overlapped and not base.ep_overlapped
    t_base = microbatch_seconds(base, DEFAULT_CALIBRATION)[0]
    t_over = microbatch_seconds(over, DEFAULT_CALIBRATION)[0]
    # Without pipelining the first forward and the last backward run unpaired (1 of m chunks).
    assert over.ep_unpaired_share == 1 / lay.num_microbatches
    compute = t_over["gemm"] + t_over["attention"] + t_over["elementwise"]
    assert t_over["ep_communication"] == ep_overlap_exposed(over, DEFAULT_CALIBRATION, t_base["ep_communication"], compute)
    assert t_over["ep_communication"] <= t_base["ep_communication"]
