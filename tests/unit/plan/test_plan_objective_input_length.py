"""The planner counts the model's input length, ``train.seq_length`` plus the objective's
``extra_seq_length`` (:func:`dlmspec.plan.shape.input_length`), for activations, attention and
FLOPs: an objective that feeds ``x_t (+) x_0`` (block diffusion) doubles the input. A toy objective
defined here alone registers that term."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dlmspec import objectives
from dlmspec.plan import make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
KIND = "toy-concatenated-input"


class ConcatenatedInput(objectives.Objective):
    """Next-token prediction whose model input is the sequence twice (``x_t (+) x_0``)."""

    kind = KIND
    description = "a toy whose model input is twice train.seq_length"
    attention = "causal"
    attentions = ("causal",)

    def dataset_extra_token(self, objective: Any, stage_kind: str) -> bool:
        return True

    def extra_seq_length(self, objective: Any, seq_length: int) -> int:
        return seq_length


@pytest.fixture()
def concatenated():
    objectives.register(ConcatenatedInput())
    try:
        yield
    finally:
        objectives.unregister(KIND)


def _plan(*overrides: str):
    return make_plan(resolve(load(ROOT / "specs" / "demo-ar.toml", list(overrides)).spec))


def test_extra_seq_length_doubles_activations_and_flops_as_a_twice_longer_sequence(concatenated) -> None:
    ar = _plan()
    seq = ar.layout.seq
    toy = _plan(f'objective.kind="{KIND}"')
    twice = _plan(f"train.seq_length={2 * seq}", f"model.max_position_embeddings={2 * seq}")
    assert toy.shape.extra_seq_length == seq and toy.layout.seq == seq
    # the model sees 2 * seq positions: per-position FLOPs and the positions of a step are those of
    # a run of twice the sequence length (causal attention's keys grow with the input too)
    assert toy.time.flops.model_per_token == pytest.approx(twice.time.flops.model_per_token)
    assert toy.time.flops.model_per_step == pytest.approx(twice.time.flops.model_per_step)
    assert toy.time.flops.model_per_step > 2 * ar.time.flops.model_per_step
    # activations: every per-token term doubles
    toy_acts = toy.memory.peak.breakdown["activations"]
    ar_acts = ar.memory.peak.breakdown["activations"]
    assert toy_acts == pytest.approx(twice.memory.peak.breakdown["activations"])
    assert toy_acts == pytest.approx(2 * ar_acts)
    assert toy.memory.layer_terms.dense_total == pytest.approx(2 * ar.memory.layer_terms.dense_total)
    assert toy.peak_bytes == pytest.approx(twice.peak_bytes) and toy.peak_bytes > ar.peak_bytes
    # the step takes as long as the twice longer run's, and trains on half its tokens
    assert toy.time.step_seconds == pytest.approx(twice.time.step_seconds)
    assert toy.time.tokens_per_second == pytest.approx(twice.time.tokens_per_second / 2)


def test_no_extra_seq_length_leaves_the_plan_as_it_was() -> None:
    for kind in objectives.kinds():
        if not objectives.get(kind).block_diffusion:  # x_t (+) x_0: tests/unit/plan/test_block_diffusion_plan.py
            assert objectives.get(kind).extra_seq_length(None, 4096) == 0
    plan = _plan()
    assert plan.shape.extra_seq_length == 0
    assert plan.time.flops.model_per_step == pytest.approx(plan.time.flops.model_per_token * plan.layout.global_batch
                                                           * plan.layout.seq)
