"""Attention annealing's schedule (dlmspec/objectives/attention_anneal.py) is DiffuLLaMA's
``min(1, (global_step + 1) / anneal_steps)`` at every step, reaching full attention at step K - 1;
an unset or single-step annealing is full attention throughout."""

from __future__ import annotations

import pytest

from dlmspec.objectives.attention_anneal import anneal_ratio, annealed_steps


@pytest.mark.parametrize("k", [2, 7, 40])
def test_the_ratio_at_each_step_is_step_plus_one_over_the_annealing_steps_capped_at_one(k) -> None:
    for step in range(3 * k):
        assert anneal_ratio(step, k) == min(1.0, (step + 1) / k)
    assert anneal_ratio(0, k) == 1 / k and anneal_ratio(k // 2, k) == (k // 2 + 1) / k
    assert anneal_ratio(k - 2, k) < 1.0 and anneal_ratio(k - 1, k) == 1.0


def test_no_or_one_annealing_step_is_full_attention_from_the_first_step() -> None:
    assert [anneal_ratio(s, None) for s in range(3)] == [1.0, 1.0, 1.0]
    assert [anneal_ratio(s, 1) for s in range(3)] == [1.0, 1.0, 1.0]
    assert annealed_steps(None, 100) == annealed_steps(1, 100) == 0


def test_the_masked_steps_are_the_annealing_steps_but_the_last_within_training() -> None:
    assert annealed_steps(40, 100) == 39
    assert annealed_steps(400, 100) == 100


def test_a_negative_step_is_refused() -> None:
    with pytest.raises(ValueError, match="iteration must be >= 0"):
        anneal_ratio(-1, 10)
