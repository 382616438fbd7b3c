"""The micro-batch's bytes on the last pipeline rank count the rows that reach the output layer: block
diffusion without an AR loss hands the loss ``[b, L]`` labels and loss weights (the noised half x_t)
for its ``[b, 2L]`` input (backends/megatron/objectives/bd3lm.py, ``noised_half_loss``), so the
labels, weights, per-token loss and its gradient (20 bytes a row) are those of L rows; the token and
position ids and the objective's noised ids and masks stay per input position (2L). Hand counts on
the demo block-diffusion spec (L = 512, blocks of 16, one pipeline rank: first and last)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan.memory import stage_memory
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
BD3 = ROOT / "specs" / "demo-bd3lm.toml"


def _batch_bytes(*sets: str) -> tuple[float, float, int]:
    """(batch_and_objective bytes, in-flight micro-batches, micro batch) of the demo BD3 spec."""
    plan = make_plan(resolve(load(BD3, list(sets)).spec))
    assert plan.layout.pp == 1
    mem = stage_memory(plan.shape, plan.layout, 0)
    return mem.breakdown["batch_and_objective"], mem.in_flight, plan.layout.micro_batch


def test_the_last_rank_holds_labels_and_loss_weights_of_the_noised_half_only() -> None:
    got, flight, b = _batch_bytes()
    # ids + position ids (16) and the objective's noised ids and masks (9) on 2L = 1024 input positions;
    # labels, weights, per-token loss and its gradient (20) on the L = 512 rows reaching the output layer
    assert got == pytest.approx(flight * ((16 + 9) * b * 1024 + 20 * b * 512))


def test_an_ar_loss_on_the_clean_half_holds_labels_for_both_halves() -> None:
    got, flight, b = _batch_bytes("objective.ar_loss_weight=0.5")
    assert got == pytest.approx(flight * ((16 + 9) * b * 1024 + 20 * b * 1024))
