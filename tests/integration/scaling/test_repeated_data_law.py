"""Muennighoff et al. 2023's effective data and parameters: the formula, the published R* when the
study has fewer than 3 repetition levels, and a fit of R* that recovers known values."""

from __future__ import annotations

import math

import numpy as np
import pytest

import scaling_kit
from dlmspec.scaling.law import Law
from dlmspec.scaling.repetition import (PUBLISHED_R_D, PUBLISHED_R_N, effective, effective_sizes, fit_repetition,
                                        predict, unique_params)


def test_effective_data_by_hand() -> None:
    # U = 100, R_D = 3 (4 epochs), R* = 15.4: 100 + 100 * 15.4 * (1 - e^(-3/15.4))
    assert effective(100.0, 3.0, 15.4) == pytest.approx(100 + 1540 * (1 - math.exp(-3 / 15.4)))
    assert effective(100.0, 0.0, 15.4) == pytest.approx(100.0)  # one epoch: all data fresh
    assert effective(100.0, 1e6, 15.4) == pytest.approx(100 * (1 + 15.4))  # the limit: U (1 + R*)
    # a few repetitions are worth almost fresh data (Muennighoff: up to ~4 epochs)
    assert effective(100.0, 3.0, 15.4) / 400.0 > 0.9


def test_unique_params_is_the_compute_optimal_size_for_the_unique_data() -> None:
    law = Law(**scaling_kit.KNOWN)
    u_d = 1e10
    u_n = unique_params(law, u_d, 1e15)
    # the law's optimum whose D* is U_D has N* = U_N
    compute = 6 * u_n * u_d
    n_star, d_star = law.optimal(compute)
    assert n_star == pytest.approx(u_n, rel=1e-9) and d_star == pytest.approx(u_d, rel=1e-9)
    assert unique_params(law, u_d, 1e6) == 1e6  # capped at N


def test_single_epoch_points_predict_the_plain_law_unless_the_model_is_too_large() -> None:
    law = Law(**scaling_kit.KNOWN)
    n, d = np.array([1e7, 1e8]), np.array([1e11, 1e9])
    n_eff, d_eff = effective_sizes(law, n, d, d, PUBLISHED_R_D, PUBLISHED_R_N)
    assert d_eff == pytest.approx(d)  # one epoch: D' = D
    assert n_eff[0] == n[0]  # 1e7 parameters are fewer than the optimum for 1e11 tokens: N' = N
    assert predict(law, n, d, d)[0] == pytest.approx(law.loss(n, d)[0])
    # 1e8 parameters exceed the optimum for 1e9 unique tokens: the excess is worth less (R_N > 0)
    u_n = unique_params(law, 1e9, 1e8)
    assert u_n < 1e8 and n_eff[1] == pytest.approx(effective(u_n, 1e8 / u_n - 1, PUBLISHED_R_N))
    assert predict(law, n, d, d)[1] > law.loss(n, d)[1]


def _repeated(levels, r_d=6.0, r_n=3.0, noise=0.0, seed=0):
    law = Law(**scaling_kit.KNOWN)
    rng = np.random.default_rng(seed)
    n, d, u = [], [], []
    for size in (5e7, 2e8, 8e8):
        for unique in (1e9, 4e9):
            for epochs in levels:
                n.append(size)
                u.append(unique)
                d.append(unique * epochs)
    n, d, u = np.array(n), np.array(d), np.array(u)
    loss = predict(law, n, d, u, r_d, r_n) * np.exp(noise * rng.standard_normal(n.shape))
    return law, n, d, u, loss


def test_fewer_than_three_repetition_levels_use_the_published_values() -> None:
    law, n, d, u, loss = _repeated([1, 8])
    fit = fit_repetition(law, n, d, u, loss)
    assert fit.source == "published" and fit.levels == [1.0, 8.0]
    assert (fit.r_star_d, fit.r_star_n) == (PUBLISHED_R_D, PUBLISHED_R_N)
    assert fit.intervals == {}


def test_three_levels_fit_r_star_and_recover_known_values() -> None:
    law, n, d, u, loss = _repeated([1, 4, 16, 40], r_d=6.0, r_n=3.0, noise=0.002, seed=1)
    fit = fit_repetition(law, n, d, u, loss, bootstrap=20, seed=0)
    assert fit.source == "fitted"
    lo, hi = fit.intervals["R_star_D"]
    assert lo <= 6.0 <= hi
    assert fit.r_star_d == pytest.approx(6.0, rel=0.25)
