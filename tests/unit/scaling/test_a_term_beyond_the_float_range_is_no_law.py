"""A fit whose minimiser sends ``log A`` (or ``log B``, ``log E``) past the float range: the full fit is
a FitError naming the term (exit 2 in `dlmspec fit`, never an OverflowError), and a bootstrap resample
that does so counts as failed, left out of the intervals (the demo study's DLM points on one H100 gave
such resamples)."""

from __future__ import annotations

import numpy as np
import pytest

import dlmspec.scaling.law as law_module
from dlmspec.scaling.law import LOG_FLOAT_MAX, FitError, _law, fit_law


def test_a_log_term_beyond_the_float_range_is_a_fit_error_naming_it():
    with pytest.raises(FitError, match=r"sends A beyond the float range \(log A = 800\)") as caught:
        _law(np.array([800.0, 1.0, 0.5, 0.3, 0.3]))
    assert "more model sizes N" in caught.value.fix
    law = _law(np.array([LOG_FLOAT_MAX - 1.0, 1.0, 0.5, 0.3, 0.3]))
    assert np.isfinite(law.A) and law.E == pytest.approx(np.exp(0.5))


def test_a_bootstrap_resample_beyond_the_float_range_counts_as_failed(monkeypatch):
    rng = np.random.default_rng(0)
    n = np.array([1e6, 3e6, 1e7, 3e7, 1e6, 3e6, 1e7, 3e7])
    d = np.array([1e9, 1e9, 1e9, 1e9, 3e9, 3e9, 3e9, 3e9])
    loss = 1.7 + 400 / n**0.34 + 410 / d**0.28
    loss = loss * np.exp(rng.normal(0, 1e-3, len(loss)))
    calls = {"n": 0}
    real = law_module._law

    def every_third_resample_diverges(theta):
        calls["n"] += 1
        if calls["n"] > 1 and calls["n"] % 3 == 0:  # the first call is the full fit's
            theta = np.array(theta, dtype=float)
            theta[0] = 900.0
        return real(theta)

    monkeypatch.setattr(law_module, "_law", every_third_resample_diverges)
    fit = fit_law(n, d, loss, bootstrap=9, seed=1)
    assert fit.bootstrap == 9 and fit.bootstrap_failed == 3
    assert fit.samples.shape == (6, 5) and np.all(np.isfinite(fit.samples))
    low, high = fit.intervals["A"]
    assert np.isfinite(low) and np.isfinite(high)
