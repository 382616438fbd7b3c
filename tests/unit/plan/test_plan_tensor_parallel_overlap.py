"""Tensor-parallel communication on the Transformer Engine path: the backward collectives TE runs
beside GEMMs, userbuffers overlap (Layout.tp_comm_overlap) and the exposed remainder
(dlmspec.plan.comm.TE_TP_UNITS, dlmspec.plan.time.tp_overlap_exposed)."""

from __future__ import annotations

import dataclasses

import tomli_w
from spec_kit import spec_dict as make_spec

from dlmspec.plan import DEFAULT_CALIBRATION, make_plan
from dlmspec.plan.comm import TE_TP_UNITS, stage_collectives
from dlmspec.plan.memory import stage_layer_counts
from dlmspec.plan.time import microbatch_seconds, stage_work, tp_overlap_exposed
from dlmspec.resolve import resolve
from dlmspec.spec.load import load_text


def _plan(impl: str, **changes):
    data = make_spec({"model.transformer_impl": impl, "parallel.tensor_model_parallel_size": 4,
                      "parallel.sequence_parallel": True, "model.num_layers": 8, "model.hidden_size": 1024,
                      "model.ffn_hidden_size": 4096, "model.num_attention_heads": 16, "model.num_query_groups": 4,
                      "train.seq_length": 1024, **changes})
    return make_plan(resolve(load_text(tomli_w.dumps(data), name="t.toml").spec), DEFAULT_CALIBRATION)


def test_te_path_exposes_six_units_per_layer_and_overlaps_four_behind_backward_gemms():
    plan = _plan("transformer_engine")
    lay, shape = plan.layout, plan.shape
    counts = stage_layer_counts(shape, lay, 0)
    c = stage_collectives(shape, lay, plan.gpu, 0, counts, DEFAULT_CALIBRATION)
    exposed, overlapped = TE_TP_UNITS[True]
    assert (exposed, overlapped) == (6, 4)
    layers = sum(counts)
    assert c.tp_collectives == exposed * layers + 4  # embedding's and output layer's pairs on one rank
    unit = c.tp_seconds / c.tp_collectives
    assert abs(c.tp_overlapped_seconds - overlapped * layers * unit) < 1e-12
    assert 0 < c.tp_hiding_share < 2 / 3


def test_local_path_keeps_its_calibrated_eight_exposed_units():
    plan = _plan("local")
    counts = stage_layer_counts(plan.shape, plan.layout, 0)
    c = stage_collectives(plan.shape, plan.layout, plan.gpu, 0, counts, DEFAULT_CALIBRATION)
    assert c.tp_collectives == 8 * sum(counts) + 4 and c.tp_overlapped_seconds == 0


def test_userbuffers_move_every_layer_collective_behind_the_gemms():
    plan = _plan("transformer_engine")
    ub = dataclasses.replace(plan.layout, tp_comm_overlap=True)
    counts = stage_layer_counts(plan.shape, ub, 0)
    c = stage_collectives(plan.shape, ub, plan.gpu, 0, counts, DEFAULT_CALIBRATION)
    assert c.tp_collectives == 4 and c.tp_hiding_share == 1.0
    base = stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)
    over = stage_work(plan.shape, ub, plan.gpu, 0, DEFAULT_CALIBRATION)
    assert microbatch_seconds(over, DEFAULT_CALIBRATION)[0]["tp_communication"] < \
        microbatch_seconds(base, DEFAULT_CALIBRATION)[0]["tp_communication"]


def test_overlapped_collectives_longer_than_their_gemms_leave_the_excess_exposed():
    plan = _plan("transformer_engine")
    w = stage_work(plan.shape, plan.layout, plan.gpu, 0, DEFAULT_CALIBRATION)
    calib = DEFAULT_CALIBRATION.with_values(tp_overlap_exposed_fraction=0.1)
    over = w.tp_overlapped_seconds / calib.nvlink_efficiency
    assert tp_overlap_exposed(w, calib, 0.0) == over  # nothing to hide behind: all exposed
    hidden_all = over / w.tp_hiding_share * 10
    assert abs(tp_overlap_exposed(w, calib, hidden_all) - 0.1 * over) < 1e-15  # the floor
