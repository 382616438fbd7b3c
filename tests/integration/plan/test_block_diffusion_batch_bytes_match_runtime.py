"""The planner's micro-batch bytes of block diffusion (``batch_and_objective`` of one pipeline rank,
per micro-batch in flight) equal what the runtime objective builds: the tensors of the
``ObjectiveBatch`` that ``BlockDiffusionObjective.prepare_batch`` returns for the demo's micro-batch
(``[b, 2L]`` input, position and clean ids; ``[b, L]`` labels, weights and masks when only the
noised half is scored), plus the fp32 per-token loss and its gradient of every labelled row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron.objectives.base import ObjectiveRng
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.plan import make_plan
from dlmspec.plan.memory import stage_memory
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
BD3 = ROOT / "specs" / "demo-bd3lm.toml"
MASK_ID = 50257


def _planned_per_micro_batch(*sets: str) -> tuple[float, int, int]:
    plan = make_plan(resolve(load(BD3, list(sets)).spec))
    mem = stage_memory(plan.shape, plan.layout, 0)
    return mem.breakdown["batch_and_objective"] / mem.in_flight, plan.layout.micro_batch, plan.layout.seq


def _runtime_bytes(b: int, L: int, *, ar_loss_weight: float, noised_half_loss: bool) -> int:
    objective = BlockDiffusionObjective(MASK_ID, block_size=16, ar_loss_weight=ar_loss_weight)
    objective.noised_half_loss = noised_half_loss  # what prepare_model sets without an AR loss and SP
    tokens = torch.randint(0, MASK_ID, (b, L), generator=torch.Generator().manual_seed(0))
    ob = objective.prepare_batch({"tokens": tokens}, ObjectiveRng(masking=torch.Generator().manual_seed(1)))
    per_row = [getattr(ob, name) for name in ("input_ids", "labels", "loss_weights", "token_mask", "masked",
                                              "position_ids", "source_ids")]
    assert all(t.dim() == 2 and t.shape[0] == b for t in per_row)
    loss_and_grad = 2 * 4 * ob.labels.numel()  # fp32 per-token loss and its gradient, one per label
    return sum(t.numel() * t.element_size() for t in per_row) + loss_and_grad


def test_planned_batch_bytes_equal_the_runtime_batch_of_the_noised_half() -> None:
    planned, b, L = _planned_per_micro_batch()
    assert planned == _runtime_bytes(b, L, ar_loss_weight=0.0, noised_half_loss=True)


def test_planned_batch_bytes_with_an_ar_loss_are_within_the_masks_of_the_runtime_batch() -> None:
    planned, b, L = _planned_per_micro_batch("objective.ar_loss_weight=0.5")
    runtime = _runtime_bytes(b, L, ar_loss_weight=0.5, noised_half_loss=False)
    # the two bool masks cover 2L positions here (the planner's objective bytes count L of them):
    # 2 bytes per data token of 92 the runtime holds
    assert runtime - planned == 2 * b * L
    assert planned == pytest.approx(runtime, rel=0.025)
