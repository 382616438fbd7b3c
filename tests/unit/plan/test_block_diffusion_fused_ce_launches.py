"""The fused linear cross entropy's chunk launches (PyTorch implementation: 15 kernels per chunk of
4096 projected rows) count the rows that carry loss: for block diffusion the masked x_t tokens, about
(low + high) / 2 of the L data tokens (a quarter of the 2L input positions), plus the L - 1 AR rows
of x_0 with an AR loss. Hand counts on the demo block-diffusion spec (micro batch 32, L = 512,
t ~ U(0.001, 1)) and the MDM demo at the same tokens."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dlmspec.plan import make_plan
from dlmspec.plan import launches
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
TORCH_CE = ['kernels.cross_entropy="fused_linear"', 'kernels.fused_linear_impl="torch"']


def _plan(spec: str, *sets: str):
    return make_plan(resolve(load(ROOT / "specs" / spec, TORCH_CE + list(sets)).spec))


def test_block_diffusion_chunks_count_the_masked_noised_tokens() -> None:
    plan = _plan("demo-bd3lm.toml")
    masked = (0.001 + 1.0) / 2 * 32 * 512  # E[t] of the L = 512 x_t tokens of each of 32 rows: 8200
    assert launches.fused_ce_kernels(plan.shape, plan.layout) == 15 * math.ceil(masked / 4096) == 45
    assert launches.fused_ce_rows(plan.shape, plan.layout) == masked


def test_block_diffusion_with_an_ar_loss_adds_the_clean_half_rows() -> None:
    plan = _plan("demo-bd3lm.toml", "objective.ar_loss_weight=0.5")
    rows = (0.001 + 1.0) / 2 * 32 * 512 + 32 * 512  # masked x_t tokens + every x_0 row (L - 1 ~ L)
    assert launches.fused_ce_kernels(plan.shape, plan.layout) == 15 * math.ceil(rows / 4096) == 105
    assert launches.fused_ce_rows(plan.shape, plan.layout) == rows


def test_masked_diffusion_at_the_same_tokens_projects_as_many_rows_as_block_diffusion() -> None:
    mdm = _plan("demo-dlm.toml")
    bd3 = _plan("demo-bd3lm.toml")
    # MDM's share is 1/2 of its L positions (eps left out), BD3's (0.001 + 1) / 4 of its 2L
    assert launches.fused_ce_rows(mdm.shape, mdm.layout) == pytest.approx(launches.fused_ce_rows(bd3.shape, bd3.layout), rel=1e-3)
    assert launches.fused_ce_kernels(mdm.shape, mdm.layout) == 30  # 8192 rows: two chunks
