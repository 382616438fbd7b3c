"""Group-normalised advantages (GRPO, Dr. GRPO) and DAPO's filter of groups whose rewards do not
vary, on hand-made rewards checked against the formulas written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from dlmspec.backends.rl.advantages import group_advantages, varying_groups


def _by_hand(group, eps=1e-4, scale=True):
    mean = sum(group) / len(group)
    std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
    return [(r - mean) / (std + eps) if scale else r - mean for r in group]


def test_advantages_equal_group_mean_and_sample_std_formula():
    groups = [[1.0, 0.0, 0.0, 1.0], [0.5, 2.0, -1.0, 3.5], [1.0, 1.0, 1.0, 1.0]]
    rewards = torch.tensor(sum(groups, []), dtype=torch.float64)
    got = group_advantages(rewards, 4)
    want = sum((_by_hand(g) for g in groups), [])
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    # Hand arithmetic for the first group: mean 0.5, sample std sqrt(1/3).
    assert float(got[0]) == pytest.approx(0.5 / (math.sqrt(1 / 3) + 1e-4), rel=1e-12)
    assert torch.equal(got[8:], torch.zeros(4, dtype=torch.float64))  # a constant group: no signal


def test_dr_grpo_scale_none_only_subtracts_the_group_mean():
    rewards = torch.tensor([3.0, 1.0, 2.0, 10.0, 20.0, 30.0])
    got = group_advantages(rewards, 3, scale="none")
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, 0.0, -10.0, 0.0, 10.0]))


def test_eps_is_added_to_the_std():
    rewards = torch.tensor([0.0, 1.0], dtype=torch.float64)
    std = math.sqrt(0.5)
    torch.testing.assert_close(group_advantages(rewards, 2, eps=0.5),
                               torch.tensor([-0.5 / (std + 0.5), 0.5 / (std + 0.5)], dtype=torch.float64))


def test_failed_rewards_are_left_out_of_the_group_statistics_and_get_nan():
    rewards = torch.tensor([1.0, float("nan"), 0.0, 0.0, 5.0, float("nan"), float("nan"), float("nan")],
                           dtype=torch.float64)
    got = group_advantages(rewards, 4)
    torch.testing.assert_close(got[[0, 2, 3]], torch.tensor(_by_hand([1.0, 0.0, 0.0]), dtype=torch.float64))
    assert math.isnan(float(got[1]))
    assert float(got[4]) == 0.0  # one finite reward: no spread, no signal
    assert bool(torch.isnan(got[5:]).all())


def test_varying_groups_keeps_only_groups_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 1.0,   0.0, 1.0, 0.0,   0.0, 0.0, 0.0,   2.0, float("nan"), 2.0,
                            float("nan"), 3.0, float("nan"),   0.25, 0.5, float("nan")])
    assert varying_groups(rewards, 3).tolist() == [False, True, False, False, False, True]


@pytest.mark.parametrize("call,message", [
    (lambda: group_advantages(torch.zeros(5), 2), "not a multiple of group_size = 2"),
    (lambda: group_advantages(torch.zeros(4), 0), "group_size = 0"),
    (lambda: group_advantages(torch.zeros(4, dtype=torch.int64), 2), "floating-point"),
    (lambda: group_advantages(torch.zeros(4), 2, scale="max"), "scale = 'max'"),
    (lambda: group_advantages(torch.zeros(4), 2, eps=0.0), "eps = 0.0"),
    (lambda: varying_groups(torch.zeros(2, 2), 2), "1-D"),
])
def test_bad_arguments_are_refused_with_a_remedy(call, message):
    with pytest.raises(ValueError, match=message):
        call()
