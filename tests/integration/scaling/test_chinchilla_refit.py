"""The approach-3 fit reproduces Besiroglu et al. 2024's refit of Chinchilla's points
(bench/scaling/besiroglu2024: their 240 points and their published parameters and intervals)."""

from __future__ import annotations

import pytest

import scaling_kit
from dlmspec.scaling.law import fit_law

PUBLISHED = scaling_kit.published()


@pytest.fixture(scope="module")
def refit():
    n, d, c, loss = scaling_kit.chinchilla_points()
    return fit_law(n, d, loss, compute=c)


def test_the_points_are_the_published_file() -> None:
    import hashlib

    data = (scaling_kit.BESIROGLU / PUBLISHED["points_file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == PUBLISHED["points_sha256"]
    n, _, _, _ = scaling_kit.chinchilla_points()
    assert len(n) == 240


@pytest.mark.parametrize("name", ["E", "A", "B", "alpha", "beta"])
def test_each_parameter_falls_in_the_published_95_percent_interval(refit, name: str) -> None:
    lo, hi = PUBLISHED["intervals_95"][name]
    assert lo <= refit.law.as_dict()[name] <= hi, (name, refit.law.as_dict()[name], (lo, hi))


@pytest.mark.parametrize("name", ["E", "A", "B", "alpha", "beta"])
def test_the_fit_matches_their_grid_fit_of_the_same_objective(refit, name: str) -> None:
    """Their notebook's L-BFGS-B grid fit of Hoffmann's objective (cell 18): the same minimum."""
    assert refit.law.as_dict()[name] == pytest.approx(PUBLISHED["grid_fit"][name], rel=2e-3)


def test_the_compute_optimal_exponents_are_the_laws() -> None:
    """N*(C) grows as C^(beta/(alpha+beta)) (Hoffmann et al. 2022, Eq. 4)."""
    from dlmspec.scaling.law import Law

    law = Law(**PUBLISHED["estimates"])
    n1, d1 = law.optimal(1e21)
    n2, d2 = law.optimal(1e23)
    import math

    assert math.log(n2 / n1) / math.log(100) == pytest.approx(law.beta / (law.alpha + law.beta))
    assert math.log(d2 / d1) / math.log(100) == pytest.approx(law.alpha / (law.alpha + law.beta))
    assert 6 * n1 * d1 == pytest.approx(1e21)
