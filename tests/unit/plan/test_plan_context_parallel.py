"""Context parallelism on the local layers (``cp_comm_type = "allgather"``) in the compiler and
the planner: the validator accepts it, ``train.py`` passes megatron-core's ``"all_gather"``, and
the time model charges the all-gather path's exchange whole (``dlmspec.plan.comm.CP_KV_EXCHANGES``).
The runtime itself: ``tests/integration/runtime/test_runtime_context_parallel.py``."""

import pytest


CP2_LOCAL = ["parallel.context_parallel_size=2", 'parallel.cp_comm_type="allgather"', 'model.transformer_impl="local"',
             "objective.variable_length_prob=0.0", "cluster.gpus_per_node=2"]


def _resolved(overrides):
    from pathlib import Path

    from dlmspec.spec.load import load
    from dlmspec.resolve import resolve

    loaded = load(Path(__file__).resolve().parents[3] / "specs/demo-dlm.toml", overrides)
    return loaded, resolve(loaded.spec)


def test_cp2_on_the_local_layers_validates_and_compiles_to_megatrons_all_gather():
    from dlmspec.check import find
    from dlmspec.render.compile import render

    loaded, resolved = _resolved(CP2_LOCAL)
    assert [i for i in find(("spec",), loaded, resolved) if i.severity == "error"] == []
    assert find(("runtime",), loaded, resolved) == []
    train = render(resolved, "demo-dlm.toml")["train.py"]
    assert "cp_comm_type='all_gather'" in train and "use_transformer_engine=False" in train
    loaded, resolved = _resolved(CP2_LOCAL[:1] + CP2_LOCAL[2:])  # cp_comm_type left at p2p
    assert "cp-local-allgather" in {i.rule for i in find(("spec",), loaded, resolved)}


def test_planner_models_the_all_gather_exchange_whole_and_the_ring_behind_attention():
    from dataclasses import replace

    from dlmspec.plan.calibration import DEFAULT_CALIBRATION as calib
    from dlmspec.plan.shape import layout, model_shape, transformer_impl
    from dlmspec.plan.time import microbatch_seconds, stage_work

    _, resolved = _resolved(CP2_LOCAL[:2] + CP2_LOCAL[3:])  # transformer_impl = auto
    assert transformer_impl(resolved)[0] == "local+sdpa"  # allgather CP does not need TE
    shape, lay = model_shape(resolved), layout(resolved)
    gather = stage_work(shape, lay, resolved.gpu, 0, calib)
    ring = stage_work(shape, replace(lay, cp_comm_type="p2p"), resolved.gpu, 0, calib)
    assert gather.cp_comm_seconds == pytest.approx(ring.cp_comm_seconds * 2 / 3)
    assert not gather.cp_overlapped and ring.cp_overlapped
    assert gather.cp_collectives == 2 * shape.num_layers
    exposed = microbatch_seconds(gather, calib)[0]["cp_communication"]
    assert exposed == pytest.approx(gather.cp_comm_seconds / calib.nvlink_efficiency
                                    + 2 * shape.num_layers * calib.collective_latency_seconds)
