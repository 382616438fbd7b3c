"""MegaDLMs' schedule (`--lr-decay-style WSD --lr-wsd-decay-style exponential
--lr-wsd-decay-iters 1000`, JinjieNi/MegaDLMs@bdf7545 examples/dlm_training/dlm_pretrain_1.7b.sh:157-163)
on CPU, with the scheduler alone: megatron-core's ``OptimizerParamScheduler`` as
``backends/megatron/optim.py`` builds it, against a hand table, and built from the compiled
train.py of specs/megadlms-1.7b-mdm.toml (spec -> train.py -> scheduler)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from megatron.core.optimizer import OptimizerConfig

from dlmspec.backends.megatron.config import CheckpointConfig, ScheduleConfig
from dlmspec.backends.megatron.optim import build_scheduler
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]


class _Optimizer:
    """What ``OptimizerParamScheduler`` touches of megatron's optimizer: ``param_groups``."""

    def __init__(self) -> None:
        self.param_groups = [{}]


def _exponential(k: int, decay: int, lr: float, min_lr: float) -> float:
    """The WSD anneal by hand: ``coeff = 2 * 0.5 ** (k / decay) - 1`` from lr (k = 0) to min_lr (k = decay)."""
    return min_lr + (2 * 0.5 ** (k / decay) - 1) * (lr - min_lr)


def _lr_at(scheduler, optimizer, step: int) -> float:
    scheduler.step(step - scheduler.num_steps)
    return optimizer.param_groups[0]["lr"]


def test_wsd_exponential_follows_the_hand_table() -> None:
    """Warm-up over 4 steps to 2e-4, held to step 12, exponential to 2e-5 over the last 8 of 20."""
    optimizer = _Optimizer()
    schedule = ScheduleConfig(train_iters=20, lr_warmup_iters=4, lr_decay_style="WSD", lr_wsd_decay_iters=8,
                              lr_wsd_decay_style="exponential")
    scheduler = build_scheduler(optimizer, OptimizerConfig(lr=2e-4, min_lr=2e-5), schedule, CheckpointConfig())
    hand = [2e-4 * s / 4 for s in range(5)] + [2e-4] * 8 + [_exponential(k, 8, 2e-4, 2e-5) for k in range(1, 9)]
    hand += [2e-5]  # past the decay: min_lr
    assert [_lr_at(scheduler, optimizer, s) for s in range(22)] == pytest.approx(hand, rel=1e-12, abs=1e-15)
    assert hand[16] == pytest.approx(2e-5 + (math.sqrt(2) - 1) * 1.8e-4)  # halfway: 2 * 0.5 ** 0.5 - 1


def test_the_compiled_megadlms_spec_runs_megadlms_schedule(tmp_path: Path) -> None:
    """train.py of megadlms-1.7b-mdm builds the scheduler of dlm_pretrain_1.7b.sh: 2e-4 after the
    2,000 warm-up steps and until 1,000 steps before the end, then exponential to 2e-5."""
    resolved = resolve(load(ROOT / "specs" / "megadlms-1.7b-mdm.toml").spec)
    path = tmp_path / "train.py"
    path.write_text(render(resolved, "specs/megadlms-1.7b-mdm.toml")["train.py"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location("megadlms_train", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run = module.build_run()
    optimizer_config = module.build_configs()[3]
    optimizer = _Optimizer()
    scheduler = build_scheduler(optimizer, optimizer_config, run.schedule, run.checkpoint)
    end = resolved.train_iters
    assert end == 95368 and (optimizer_config.lr, optimizer_config.min_lr) == (2e-4, 2e-5)
    for step, lr in [(1000, 1e-4), (2000, 2e-4), (end - 1000, 2e-4), (end - 500, _exponential(500, 1000, 2e-4, 2e-5)),
                     (end - 1, _exponential(999, 1000, 2e-4, 2e-5)), (end, 2e-5)]:
        assert _lr_at(scheduler, optimizer, step) == pytest.approx(lr, rel=1e-12), step
