"""The planner's fused cross-entropy chunks of block diffusion equal the runtime's: the rows
``linear_cross_entropy`` (``backends/megatron/output_loss.py``, PyTorch implementation) hands to its
chunk loop for a batch of ``BlockDiffusionObjective`` (the rows with a non-zero loss weight), cut into
chunks of ``DEFAULT_CHUNK_ROWS``, for the demo block-diffusion spec at micro batch 24 (the planned rows
lie mid-chunk, so the draw's spread cannot cross a chunk boundary), with and without an AR loss."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron import output_loss
from dlmspec.backends.megatron.objectives.base import ObjectiveRng
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.plan import launches, make_plan
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
SETS = ['kernels.cross_entropy="fused_linear"', 'kernels.fused_linear_impl="torch"', "train.micro_batch_size=24",
        "train.global_batch_size=24"]
MASK_ID, HIDDEN, VOCAB = 50257, 8, 16


def _runtime_rows(b: int, L: int, ar_loss_weight: float, monkeypatch: pytest.MonkeyPatch) -> int:
    """Rows the runtime's PyTorch fused cross entropy projects for one micro-batch."""
    objective = BlockDiffusionObjective(MASK_ID, block_size=16, ar_loss_weight=ar_loss_weight)
    objective.noised_half_loss = ar_loss_weight == 0.0  # prepare_model's choice without sequence parallelism
    tokens = torch.randint(0, MASK_ID, (b, L), generator=torch.Generator().manual_seed(0))
    ob = objective.prepare_batch({"tokens": tokens}, ObjectiveRng(masking=torch.Generator().manual_seed(1)))
    seen = []
    real = output_loss.ChunkedLinearCrossEntropy.apply

    def record(x, weight, y, w, chunk_rows):
        seen.append(x.shape[0])
        return real(x, weight, y, w, chunk_rows)

    monkeypatch.setattr(output_loss.ChunkedLinearCrossEntropy, "apply", record)
    rows = ob.labels.shape[1]  # the rows reaching the output layer: L (noised half) or 2L
    hidden = torch.randn(b, rows, HIDDEN)
    output_loss.linear_cross_entropy(hidden, torch.randn(VOCAB, HIDDEN), ob.labels % VOCAB, ob.loss_weights,
                                     impl="torch")
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("ar_loss_weight", [0.0, 0.5])
def test_planned_chunks_equal_the_runtime_chunks(ar_loss_weight: float, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = make_plan(resolve(load(ROOT / "specs" / "demo-bd3lm.toml",
                                  SETS + [f"objective.ar_loss_weight={ar_loss_weight}"]).spec))
    b, L = plan.layout.micro_batch, plan.layout.seq
    rows = _runtime_rows(b, L, ar_loss_weight, monkeypatch)
    chunks = math.ceil(rows / output_loss.DEFAULT_CHUNK_ROWS)
    assert launches.fused_ce_kernels(plan.shape, plan.layout) == 15 * chunks
    assert launches.fused_ce_rows(plan.shape, plan.layout) == pytest.approx(rows, rel=0.05)
