"""Approach 2 (isoFLOP parabolas): the budgets are grouped, each parabola's minimum is the
compute-optimal size, and the power laws of the minima follow the law's exponents."""

from __future__ import annotations

import numpy as np
import pytest

import scaling_kit
from dlmspec.scaling.isoflop import fit_isoflops, group_budgets
from dlmspec.scaling.law import Law


def _profiles(budgets, noise=0.0, seed=0, sizes=9):
    law = Law(**scaling_kit.KNOWN)
    rng = np.random.default_rng(seed)
    n, d, c = [], [], []
    for budget in budgets:
        n_star, _ = law.optimal(budget)
        for size in np.geomspace(n_star / 8, n_star * 8, sizes):
            n.append(size)
            d.append(budget / (6 * size))
            c.append(budget * (1 + 0.01 * rng.standard_normal()))  # a sweep's budgets are not exact
    n, d, c = np.array(n), np.array(d), np.array(c)
    return n, d, c, law.loss(n, d) * np.exp(noise * rng.standard_normal(n.shape)), law


def test_points_group_by_budget_within_the_tolerance() -> None:
    assert group_budgets([1e18, 1.1e18, 1e19, 0.95e18, 1.05e19, 1e20]) == [[3, 0, 1], [2, 4], [5]]


def test_each_parabola_minimum_is_near_the_laws_optimum() -> None:
    n, d, c, loss, law = _profiles([1e19, 1e20, 1e21])
    fit = fit_isoflops(n, d, c, loss)
    assert len(fit.budgets) == 3
    for budget in fit.budgets:
        n_star, d_star = law.optimal(budget.compute)
        # a parabola in log N is only the law's second-order expansion: within 15 %
        assert budget.n_opt == pytest.approx(n_star, rel=0.15)
        assert budget.d_opt == pytest.approx(budget.compute / (6 * budget.n_opt), rel=0.03)  # k: the median C/(N D)
    assert fit.n_exponent == pytest.approx(law.beta / (law.alpha + law.beta), abs=0.02)
    assert fit.d_exponent == pytest.approx(law.alpha / (law.alpha + law.beta), abs=0.02)


def test_bootstrap_intervals_hold_the_minimum() -> None:
    n, d, c, loss, _ = _profiles([1e19, 1e20, 1e21], noise=0.002, seed=3)
    fit = fit_isoflops(n, d, c, loss, bootstrap=50, seed=2)
    for budget in fit.budgets:
        lo, hi = budget.n_interval
        assert lo <= budget.n_opt <= hi
    assert fit.intervals["N_exponent"][0] < fit.n_exponent < fit.intervals["N_exponent"][1]


def test_a_budget_with_too_few_sizes_or_no_minimum_says_why() -> None:
    law = Law(**scaling_kit.KNOWN)
    n = np.array([1e7, 2e7, 1e9, 1e8, 1e8 * 1.01])
    c = np.array([1e20, 1e20, 1e21, 1e21, 1e21 * 1.01])
    d = c / (6 * n)
    fit = fit_isoflops(n, d, c, law.loss(n, d))
    assert "fewer than 3 distinct model sizes" in fit.budgets[0].why_none
    # all three sizes of the second budget lie far above its optimum: a minimum, but outside
    sizes = np.array([1e12, 2e12, 4e12])
    cs = np.full(3, 1e21)
    far = fit_isoflops(sizes, cs / (6 * sizes), cs, law.loss(sizes, cs / (6 * sizes)))
    assert far.budgets[0].n_opt is None and "bracket" in far.budgets[0].why_none
    assert far.n_exponent is None
