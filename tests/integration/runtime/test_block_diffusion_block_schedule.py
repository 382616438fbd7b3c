"""The block-size schedule of block diffusion (``objective.block_size_schedule``, LLaDA 2.0's
warm-up / stable / decay of the block): at step k the objective's block, its noise levels and its
mask are those of the schedule's formula (the last entry at or before k), the stage tells the
objective the step, the planner prices the steps' average attention, and a bad schedule is refused
with a fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlmspec.backends.megatron.objectives.base import ObjectiveRng
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.objectives.bd3lm import attended_keys_block_diffusion, block_at

ROOT = Path(__file__).resolve().parents[3]
MASK, L = 15, 64
SCHEDULE = [(0, 1), (10, 4), (20, 64), (40, 8)]  # warm-up 1 -> 4, stable: the whole sequence, decay to 8


def _formula(k: int) -> int:
    return 1 if k < 10 else 4 if k < 20 else 64 if k < 40 else 8


def _dense(n: int, block: int) -> torch.Tensor:
    q = torch.arange(2 * n).view(-1, 1)
    k = torch.arange(2 * n).view(1, -1)
    qc, kc, bq, bk = q >= n, k >= n, (q % n) // block, (k % n) // block
    return ((~qc & ~kc & (bq == bk)) | (~qc & kc & (bk < bq)) | (qc & kc & (bk <= bq)))


def test_block_at_step_k_is_the_schedules_formula() -> None:
    assert [block_at(SCHEDULE, k) for k in range(60)] == [_formula(k) for k in range(60)]
    with pytest.raises(ValueError, match="starts at step 0"):
        block_at([(5, 4)], 7)


@pytest.mark.parametrize("k", [0, 9, 10, 19, 20, 39, 40, 55])
def test_the_objectives_block_noise_levels_and_mask_at_step_k(k: int) -> None:
    obj = BlockDiffusionObjective(MASK, block_size=8, block_size_schedule=SCHEDULE)
    obj.set_iteration(k)
    block = _formula(k)
    assert obj.block_size == block
    tokens = torch.randint(0, 14, (64, L), generator=torch.Generator().manual_seed(k))
    ob = obj.prepare({"tokens": tokens}, ObjectiveRng(torch.Generator().manual_seed(1)))
    assert torch.equal(ob.attention_mask.allowed(2 * L, 2 * L)[0, 0], _dense(L, block))
    # one noise level per block: every masked position of a block has the block's weight 1/t
    w = ob.loss_weights[:, :L].reshape(64, L // block, block)
    masked = ob.masked[:, :L].reshape(64, L // block, block)
    top = torch.where(masked, w, torch.zeros_like(w)).amax(dim=2, keepdim=True)
    assert torch.equal(torch.where(masked, w, top), top.expand_as(w))


def test_the_stage_tells_the_objective_each_step() -> None:
    from dlmspec.backends.megatron.config import ObjectiveConfig, RunConfig, ScheduleConfig
    from dlmspec.backends.megatron.data import DataConfig
    from dlmspec.backends.megatron.stage import PretrainStage

    run = RunConfig(objective=ObjectiveConfig(kind="bd3lm", mask_token_id=MASK),
                    data=DataConfig(seq_length=L, vocab_size=16, eod_id=14, mock=True),
                    schedule=ScheduleConfig(micro_batch_size=1, global_batch_size=1, train_iters=50))
    stage = PretrainStage(run)
    stage.objective = BlockDiffusionObjective(MASK, block_size=8, block_size_schedule=SCHEDULE)
    for k in (3, 15, 25, 45):
        stage.before_step(k, [])
        assert stage.objective.block_size == _formula(k)


def test_the_planner_prices_the_average_attention_over_the_schedule() -> None:
    from dlmspec.plan import make_plan
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load

    spec = load(ROOT / "specs" / "demo-bd3lm.toml",
                ["objective.block_size_schedule=[[0, 4], [100, 512], [250, 32]]", "train.train_iters=300"]).spec
    keys = make_plan(resolve(spec)).shape.attended_keys
    want = (100 * attended_keys_block_diffusion(512, 4) + 150 * attended_keys_block_diffusion(512, 512)
            + 50 * attended_keys_block_diffusion(512, 32)) / 300
    assert keys == pytest.approx(want)
    assert make_plan(resolve(load(ROOT / "specs" / "demo-bd3lm.toml").spec)).shape.attended_keys == pytest.approx(
        attended_keys_block_diffusion(512, 16))


def test_a_schedule_that_does_not_start_at_zero_or_divide_the_sequence_is_refused_with_a_remedy() -> None:
    from dlmspec.check import find
    from dlmspec.spec.load import load

    spec = load(ROOT / "specs" / "demo-bd3lm.toml", ["objective.block_size_schedule=[[5, 4], [3, 48]]"]).spec
    (issue,) = [i for i in find(("spec",), spec) if i.rule == "bd3lm-block-schedule"]
    assert issue.key == "objective.block_size_schedule" and issue.fix.set == {
        "objective.block_size_schedule": [[0, 4], [3, 32]]}
