"""The plan states attention annealing's first steps as a phase with their extra memory: each
micro-batch of those steps draws an s x s mask (float32 uniforms + bool: 5 bytes per entry at the
draw, backends/megatron/masks.py annealed_causal) and holds it through its forward and backward
(SDPA: the bool draw + its dense tensor, 2 bytes per entry; FlexAttention: the draw, 1). Hand
counts on the spec kit's small spec; a run without annealing has no phase."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from rich.console import Console

from dlmspec.plan import make_plan
from dlmspec.plan.pipeline_stages import in_flight
from dlmspec.plan.time import ATTENTION_BACKEND_SPEED, time_plan
from dlmspec.plan.report import plan_renderable
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import spec_file

ANNEAL = {"objective.attention_anneal_iters": 40, "checkpoint.init_from": "mcore:ar-checkpoint",
          "model.transformer_impl": "local", "model.attention_backend": "sdpa"}


def _plan(tmp_path, *changes):
    return make_plan(resolve(load(spec_file(tmp_path, ANNEAL, *changes)).spec))


def test_one_micro_batch_in_flight_adds_five_bytes_per_mask_entry(tmp_path) -> None:
    plan = _plan(tmp_path)
    s = plan.layout.seq
    assert plan.layout.pp == 1  # one micro-batch in flight
    (phase,) = plan.phases
    assert phase.name == "attention annealing"
    assert phase.steps == 39  # steps 0 .. K-2 run masked; step K-1 has r = 1
    assert phase.during == "during the first 39 steps"
    assert phase.extra_bytes == 5 * s * s
    assert phase.peak_bytes == pytest.approx(plan.peak_bytes + 5 * s * s)


def test_micro_batches_in_flight_hold_their_masks_by_backend(tmp_path) -> None:
    # pipeline of 2: the first rank holds 2 micro-batches in flight at its peak (1F1B warm-up)
    for backend, held in (("sdpa", 2), ("flex", 1)):
        plan = _plan(tmp_path, {"parallel.pipeline_model_parallel_size": 2, "cluster.gpus_per_node": 2,
                                "model.attention_backend": backend})
        flight = in_flight(plan.layout, plan.memory.peak.stage)
        assert flight > 1
        s = plan.layout.seq
        (phase,) = plan.phases
        assert phase.extra_bytes == pytest.approx(s * s * (5 + held * (flight - 1)))


def test_the_phase_is_in_the_plan_json_and_its_report(tmp_path) -> None:
    plan = _plan(tmp_path)
    doc = json.loads(json.dumps(plan.to_dict()))
    (phase,) = doc["phases"]
    assert phase["during"] == "during the first 39 steps" and phase["extra_bytes"] == 5 * plan.layout.seq ** 2
    console = Console(width=300, record=True)
    console.print(plan_renderable(plan))
    assert "during the first 39 steps (attention annealing)" in console.export_text()


def test_annealing_over_a_single_step_or_none_has_no_phase(tmp_path) -> None:
    assert _plan(tmp_path, {"objective.attention_anneal_iters": 1}).phases == []
    plain = make_plan(resolve(load(spec_file(tmp_path)).spec))
    assert plain.phases == [] and "phases" not in plain.to_dict()


def test_the_annealing_steps_are_timed_on_sdpas_masked_kernel(tmp_path) -> None:
    plan = _plan(tmp_path)
    (phase,) = plan.phases
    masked = time_plan(plan.shape, replace(plan.layout, sdpa_backend="efficient"), plan.gpu, plan.calibration)
    assert phase.step_seconds == pytest.approx(masked.step_seconds)
    assert phase.step_seconds >= plan.time.step_seconds  # this tiny model is launch-bound: equal here
    # the steady steps' attention on cuDNN (speed 1), the annealing steps' on the memory-efficient kernel
    assert masked.breakdown["attention"] == pytest.approx(
        plan.time.breakdown["attention"] / ATTENTION_BACKEND_SPEED["efficient"])
    # FlexAttention: the time model has no speed for it, so no step time is claimed
    assert _plan(tmp_path, {"model.attention_backend": "flex"}).phases[0].step_seconds is None
