"""The planner prints a duration in the unit that reads best (dlmspec/wording.py ``duration``): a
sub-second RL rollout batch in milliseconds, not as "0.05 s"."""

from __future__ import annotations

import pytest

from dlmspec.plan.rl import rl_lines
from dlmspec.wording import duration
from rl_plan_kit import rl_plan


@pytest.mark.parametrize("seconds, text", [
    (0.0487, "48.7 ms"), (0.9999, "999.9 ms"), (1.0, "1.00 s"), (59.994, "59.99 s"), (60.0, "1.0 min"),
    (5400.0, "1.5 h"), (2 * 86400.0, "2.0 d"),
])
def test_a_duration_is_written_in_the_unit_that_reads_best(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_rl_lines_give_the_rollout_batch_and_the_step_with_their_units() -> None:
    p = rl_plan("generate.steps=8", "generate.gen_length=8", "generate.block_length=8")
    line = next(x for x in rl_lines(p.rl) if x.startswith("rollout:"))
    assert f"{duration(p.rl.rollout_seconds)} per rollout batch" in line
    assert f"of each {duration(p.rl.step_seconds)} step" in line
