"""The approach-3 fitter recovers a known law from noisy points within the intervals it reports,
and its objective is Hoffmann et al. 2022's (Huber on log loss, the log-sum-exp form)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import scaling_kit
from dlmspec.scaling.law import (FitError, Law, fit_law, flops_per_token_line, huber_objective, log_loss_weights,
                                 optimal_allocation)


@pytest.fixture(scope="module")
def recovered():
    n, d, loss = scaling_kit.noisy_points(seed=0, noise=0.01)
    return fit_law(n, d, loss, bootstrap=40, seed=1)


@pytest.mark.parametrize("name", ["E", "A", "B", "alpha", "beta"])
def test_each_true_parameter_lies_in_the_reported_interval(recovered, name: str) -> None:
    lo, hi = recovered.intervals[name]
    assert lo <= scaling_kit.KNOWN[name] <= hi, (name, scaling_kit.KNOWN[name], (lo, hi))
    assert lo < hi


def test_the_bootstrap_states_its_count_and_percentile(recovered) -> None:
    assert recovered.bootstrap == 40 and recovered.percentile == 95.0
    assert recovered.samples.shape == (40 - recovered.bootstrap_failed, 5)
    info = recovered.as_dict()["bootstrap"]
    assert info == {"resamples": 40, "failed": recovered.bootstrap_failed, "percentile": 95.0, "seed": 1}


def test_the_compute_optimum_of_the_true_law_lies_in_the_reported_interval(recovered) -> None:
    (row,) = recovered.optimum([1e21])
    n_true, d_true = Law(**scaling_kit.KNOWN).optimal(1e21)
    assert row["N_interval"][0] <= n_true <= row["N_interval"][1]
    assert row["D_interval"][0] <= d_true <= row["D_interval"][1]


def test_noiseless_points_give_the_law_back() -> None:
    n, d, loss = scaling_kit.noisy_points(noise=0.0)
    fit = fit_law(n, d, loss)
    for name, value in scaling_kit.KNOWN.items():
        assert fit.law.as_dict()[name] == pytest.approx(value, rel=1e-3), name


def test_the_objective_is_huber_on_the_log_sum_exp_residuals() -> None:
    """Hand values: at theta the prediction is log(E + A/N^alpha + B/D^beta)."""
    theta = np.array([math.log(400.0), math.log(400.0), math.log(1.7), 0.3, 0.3])
    n, d = np.array([1e8, 1e9]), np.array([1e10, 1e11])
    pred = np.log(1.7 + 400.0 / n**0.3 + 400.0 / d**0.3)
    residual = np.array([5e-4, 3e-3])  # one inside delta = 1e-3, one outside
    value, grad = huber_objective(theta, np.log(n), np.log(d), pred + residual, np.ones(2))
    assert value == pytest.approx(0.5 * 5e-4**2 + 1e-3 * (3e-3 - 0.5e-3))
    eps = 1e-7
    for i in range(5):
        step = np.zeros(5)
        step[i] = eps
        up, _ = huber_objective(theta + step, np.log(n), np.log(d), pred + residual, np.ones(2))
        down, _ = huber_objective(theta - step, np.log(n), np.log(d), pred + residual, np.ones(2))
        assert grad[i] == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-12)


def test_standard_errors_weight_the_residuals_by_their_log_loss_precision() -> None:
    loss = np.array([2.0, 2.0, 4.0, 3.0])
    stderr = np.array([0.01, 0.04, 0.02, np.nan])  # sigma_log = 0.005, 0.02, 0.005, unknown
    w = log_loss_weights(loss, stderr)
    ref = math.exp(np.mean(np.log([0.005, 0.02, 0.005])))
    assert w == pytest.approx([ref / 0.005, ref / 0.02, ref / 0.005, 1.0])
    assert log_loss_weights(loss, np.full(4, np.nan)) == pytest.approx([1.0] * 4)


def test_a_point_with_a_large_standard_error_moves_the_fit_less() -> None:
    n, d, loss = scaling_kit.noisy_points(noise=0.0)
    bent = loss.copy()
    bent[0] *= 1.05  # one corrupted point
    plain = fit_law(n, d, bent)
    stderr = np.full_like(loss, 0.001)
    stderr[0] = 1.0  # ... that says it is unreliable
    weighted = fit_law(n, d, bent, stderr=stderr)
    truth = scaling_kit.KNOWN["alpha"]
    assert abs(weighted.law.alpha - truth) < abs(plain.law.alpha - truth)


def test_fewer_points_than_parameters_are_refused() -> None:
    with pytest.raises(FitError, match="4 points for a law of 5 parameters"):
        fit_law([1e8, 2e8, 3e8, 4e8], [1e9] * 4, [3.0, 2.9, 2.8, 2.7])


def test_a_non_positive_loss_is_refused() -> None:
    with pytest.raises(FitError, match="loss"):
        fit_law([1e8, 2e8, 3e8, 4e8, 5e8], [1e9] * 5, [3.0, 2.9, 0.0, 2.7, 2.6])


def test_the_flops_per_token_line_of_the_planners_count() -> None:
    """A token of the planner's count costs 6 N plus the logits and attention: s N + b."""
    n = np.array([1e6, 4e6, 1.6e7])
    d = np.array([1e9, 2e9, 3e9])
    slope, intercept = flops_per_token_line(n, (6 * n + 7e7) * d, d)
    assert (slope, intercept) == pytest.approx((6.0, 7e7))
    assert flops_per_token_line(n, 6 * n * d, d) == pytest.approx((6.0, 0.0), abs=1e-6)


def test_the_optimum_under_a_constant_cost_per_token_is_the_constrained_minimum() -> None:
    law = Law(**scaling_kit.KNOWN)
    budget, cost = 1e18, (6.0, 7e7)
    n_star, d_star = optimal_allocation(law, budget, cost)
    assert budget == pytest.approx(d_star * (6.0 * n_star + 7e7))
    sizes = np.geomspace(n_star / 3, n_star * 3, 2001)
    brute = sizes[np.argmin(law.loss(sizes, budget / (6.0 * sizes + 7e7)))]
    assert n_star == pytest.approx(brute, rel=2e-3)
    # a fixed cost per token makes tokens dearer: the optimum moves to fewer tokens than under 6 N D
    assert d_star < law.optimal(budget)[1]
