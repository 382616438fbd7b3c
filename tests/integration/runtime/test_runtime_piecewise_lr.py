"""The piecewise learning-rate schedule (LLaDA's schedule) on CPU, with the scheduler
alone: ``train.lr_decay_style = "piecewise"`` follows ``train.lr_points`` after megatron's
warm-up, jumps where a step repeats, holds the last lr, and a resumed scheduler gives the
uninterrupted one's learning rates."""

from __future__ import annotations

import pytest

from megatron.core.optimizer import OptimizerConfig

from dlmspec.backends.megatron.config import CheckpointConfig, ScheduleConfig
from dlmspec.backends.megatron.optim import build_scheduler
from dlmspec.backends.megatron.spec_record import load_scheduler_state, scheduler_changes

#: A small LLaDA: warm-up over 2 steps to 4e-4, hold to step 5, jump to 1e-4, hold to 7, linear to
#: 1e-5 at 10, then constant.
POINTS = [[2, 4e-4], [5, 4e-4], [5, 1e-4], [7, 1e-4], [10, 1e-5]]

#: (step, lr) by hand: warm-up 0 -> 4e-4 over steps 0..2 (megatron's init_lr + (max_lr - init_lr) *
#: step / warmup), the jump at 5 (the later point of a repeated step holds from that step on), and
#: 1e-4 - 9e-5 * (step - 7) / 3 on 7..10.
HAND = [(0, 0.0), (1, 2e-4), (2, 4e-4), (3, 4e-4), (4, 4e-4), (5, 1e-4), (6, 1e-4), (7, 1e-4),
        (8, 7e-5), (9, 4e-5), (10, 1e-5), (11, 1e-5), (12, 1e-5)]


class _Optimizer:
    """What ``OptimizerParamScheduler`` touches of megatron's optimizer: ``param_groups``."""

    def __init__(self, *groups: dict) -> None:
        self.param_groups = [dict(g) for g in groups] or [{}]


def _scheduler(points=POINTS, warmup: int = 2, optimizer=None):
    optimizer = optimizer or _Optimizer()
    schedule = ScheduleConfig(train_iters=12, lr_warmup_iters=warmup, lr_decay_style="piecewise", lr_points=points)
    return build_scheduler(optimizer, OptimizerConfig(lr=4e-4, min_lr=1e-5), schedule, CheckpointConfig()), optimizer


def _lrs(scheduler, optimizer, until: int) -> list[float]:
    out = [optimizer.param_groups[0]["lr"]]
    while scheduler.num_steps < until:
        scheduler.step(1)
        out.append(optimizer.param_groups[0]["lr"])
    return out


def test_the_schedule_follows_the_hand_table() -> None:
    scheduler, optimizer = _scheduler()
    lrs = _lrs(scheduler, optimizer, 12)
    assert lrs == pytest.approx([lr for _, lr in HAND], rel=1e-12, abs=1e-15)


def test_without_warmup_the_first_point_holds_from_step_zero() -> None:
    scheduler, optimizer = _scheduler(points=[[3, 2e-4], [6, 1e-4]], warmup=0)
    assert _lrs(scheduler, optimizer, 8) == pytest.approx(
        [2e-4, 2e-4, 2e-4, 2e-4, 2e-4 - 1e-4 / 3, 2e-4 - 2e-4 / 3, 1e-4, 1e-4, 1e-4], rel=1e-12)


def test_a_group_with_its_own_max_lr_is_scaled() -> None:
    """megatron-core's param groups may carry their own ``max_lr`` (``lr_mult``): the points are
    the default group's lrs, a group with half the peak gets half of them."""
    scheduler, optimizer = _scheduler(optimizer=_Optimizer({}, {"max_lr": 2e-4}))
    for step, lr in HAND:
        while scheduler.num_steps < step:
            scheduler.step(1)
        assert optimizer.param_groups[1]["lr"] == pytest.approx(lr / 2, rel=1e-12, abs=1e-15), step


def test_a_resumed_scheduler_gives_the_uninterrupted_learning_rates() -> None:
    whole, whole_opt = _scheduler()
    uninterrupted = _lrs(whole, whole_opt, 12)
    first, first_opt = _scheduler()
    _lrs(first, first_opt, 6)
    state = first.state_dict()
    assert state["lr_points"] == POINTS and state["lr_decay_style"] == "piecewise"
    resumed, resumed_opt = _scheduler()
    assert load_scheduler_state(resumed, state) == []
    assert resumed.num_steps == 6
    assert [resumed_opt.param_groups[0]["lr"]] + _lrs(resumed, resumed_opt, 12)[1:] == uninterrupted[6:]


def test_changed_points_on_resume_are_reported_and_this_specs_points_kept() -> None:
    first, first_opt = _scheduler()
    _lrs(first, first_opt, 6)
    state = first.state_dict()
    other = [[2, 4e-4], [8, 4e-4], [8, 1e-4], [10, 1e-5]]
    resumed, resumed_opt = _scheduler(points=other)
    changes = load_scheduler_state(resumed, state)
    assert changes == [("train.lr_points", POINTS, other)]
    assert resumed_opt.param_groups[0]["lr"] == pytest.approx(4e-4)  # step 6 of the new points
    assert scheduler_changes(resumed, resumed.state_dict()) == []
