"""What the RL reference model adds to checkpoints in the plan (dlmspec/plan/rl.py
``reference_checkpoint``): its whole weights in the run's dtype (padded vocabulary, each tensor
once over all GPUs), in every checkpoint without ``checkpoint.init_from``, after the first refresh
with it, never without a refresh in the run or without a reference."""

from __future__ import annotations

import pytest

from dlmspec.plan.rl import reference_checkpoint, rl_lines
from rl_plan_kit import rl_plan

INIT = 'checkpoint.init_from="mcore:runs/sft/checkpoints"'


plan = rl_plan  # the demo's RL plan (tests/kits/rl_plan_kit.py)


def test_checkpoints_after_the_first_refresh_hold_the_whole_reference_in_the_run_dtype() -> None:
    p = plan(INIT, "stage.rl.ref_model_sync_steps=100")
    assert p.rl.reference_checkpoint_from == 100
    assert p.rl.reference_checkpoint_bytes == p.shape.padded_total_params * 2  # bf16, all GPUs together
    assert "every checkpoint after step 100 holds it: +" in "\n".join(rl_lines(p.rl))
    fp32 = plan(INIT, "stage.rl.ref_model_sync_steps=100", 'precision.dtype="fp32"')
    assert fp32.rl.reference_checkpoint_bytes == fp32.shape.padded_total_params * 4
    assert p.to_dict()["rl"]["reference_checkpoint_bytes"] == p.rl.reference_checkpoint_bytes


def test_without_init_from_every_checkpoint_holds_the_reference() -> None:
    p = plan("stage.rl.ref_model_sync_steps=100")
    assert (p.rl.reference_checkpoint_from, p.rl.reference_checkpoint_bytes) == (0, p.shape.padded_total_params * 2)
    assert "every checkpoint holds it" in "\n".join(rl_lines(p.rl))


@pytest.mark.parametrize("extra", [("stage.rl.ref_model_sync_steps=300",),  # the refresh step is not run
                                   ("stage.rl.grpo_kl_beta=0.0",)])  # no reference at all
def test_no_checkpoint_holds_a_reference_that_is_never_refreshed_or_absent(extra) -> None:
    p = plan(INIT, *extra)
    assert (p.rl.reference_checkpoint_from, p.rl.reference_checkpoint_bytes) == (None, 0.0)


def test_the_reference_checkpoint_term_follows_the_runtime_rule() -> None:
    options = {"grpo_kl_beta": 0.04, "ref_model_sync_steps": 64}
    assert reference_checkpoint(options, parameters=10, dtype="bf16", init_from=True, train_iters=65) == (20.0, 64)
    assert reference_checkpoint(options, parameters=10, dtype="bf16", init_from=True, train_iters=64) == (0.0, None)
    assert reference_checkpoint(options, parameters=10, dtype="fp32", init_from=False, train_iters=1) == (40.0, 0)
    never = {**options, "ref_model_sync_steps": None}  # no refresh: init_from rebuilds it
    assert reference_checkpoint(never, parameters=10, dtype="bf16", init_from=True, train_iters=1000) == (0.0, None)
    assert reference_checkpoint({**options, "grpo_kl_beta": 0.0}, parameters=10, dtype="bf16", init_from=False,
                                train_iters=100) == (0.0, None)
