"""IsoFLOP profiles: Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models",
arXiv:2203.15556) approach 2 (Section 3.2).

The points are grouped by compute budget (training FLOPs within a factor ``tolerance`` of the
group's first, in increasing order: a sweep that spends C on each member gives one group per C).
For each budget with at least 3 distinct model sizes a parabola of loss in ``log N``

    L = p2 (log N)^2 + p1 log N + p0        (``numpy.polyfit``, weights 1/stderr where given)

is fitted; its minimum ``N_opt = exp(-p1 / (2 p2))`` (a parabola that opens downward has none:
the budget is reported and left out) is the budget's compute-optimal size, and
``D_opt = C / f(N_opt)``, ``f(N) = s N + b`` the FLOPs per token fitted to the budget's points
(:func:`dlmspec.scaling.law.flops_per_token_line`; ``6 N`` in Hoffmann's accounting). Then power laws ``N_opt = n0 C^a`` and ``D_opt = d0 C^b`` are fitted by
least squares in log-log (Hoffmann et al. 2022, Table 2 reports a and b).

Intervals are bootstrap percentiles: resample the points inside each budget with replacement,
refit the parabolas and the power laws, take the central ``percentile`` of ``N_opt`` and ``D_opt``
per budget and of the exponents.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from dlmspec.scaling.law import flops_per_token_line

#: Points whose FLOPs lie within this factor of a budget's smallest are one budget.
BUDGET_TOLERANCE = 1.25

#: A parabola needs this many distinct model sizes in its budget.
MIN_SIZES = 3


@dataclass
class Budget:
    """One isoFLOP profile.

    Attributes:
        compute: The budget (FLOPs): the geometric mean of its points' FLOPs.
        indices: Indices of its points (into the arrays given to :func:`fit_isoflops`).
        coefficients: ``(p2, p1, p0)`` of the parabola in ``log N``, or ``None`` (too few sizes).
        n_opt, d_opt, loss_opt: The parabola's minimum (``None`` where there is none).
        why_none: Why there is no minimum (``None`` when there is one).
        n_interval, d_interval: Bootstrap intervals of ``n_opt`` and ``d_opt``.
    """

    compute: float
    indices: list[int]
    coefficients: tuple[float, float, float] | None = None
    n_opt: float | None = None
    d_opt: float | None = None
    loss_opt: float | None = None
    why_none: str | None = None
    n_interval: tuple[float, float] | None = None
    d_interval: tuple[float, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"compute": self.compute, "points": len(self.indices), "parabola": self.coefficients,
                "N_opt": self.n_opt, "D_opt": self.d_opt, "loss_opt": self.loss_opt, "why_none": self.why_none,
                "N_interval": self.n_interval, "D_interval": self.d_interval}


@dataclass
class IsoFlopFit:
    """Approach 2's result: the budgets and the power laws ``N_opt = n0 C^a``, ``D_opt = d0 C^b``
    (``None`` with fewer than 2 budgets that have a minimum)."""

    budgets: list[Budget]
    n_exponent: float | None = None
    n_coefficient: float | None = None
    d_exponent: float | None = None
    d_coefficient: float | None = None
    bootstrap: int = 0
    percentile: float = 95.0
    seed: int = 0
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"method": "Hoffmann et al. 2022 approach 2: a parabola of loss in log N per compute budget, "
                          "then power laws of its minima in C",
                "budgets": [b.as_dict() for b in self.budgets],
                "N_opt": {"coefficient": self.n_coefficient, "exponent": self.n_exponent},
                "D_opt": {"coefficient": self.d_coefficient, "exponent": self.d_exponent},
                "bootstrap": {"resamples": self.bootstrap, "percentile": self.percentile, "seed": self.seed},
                "intervals": {k: list(v) for k, v in self.intervals.items()}}


def group_budgets(compute: Sequence[float], tolerance: float = BUDGET_TOLERANCE) -> list[list[int]]:
    """Indices of the points grouped by compute budget: in increasing FLOPs, a point joins the
    current group while its FLOPs are within ``tolerance`` x the group's smallest."""
    c = np.asarray(compute, dtype=float)
    order = np.argsort(c, kind="stable")
    groups: list[list[int]] = []
    for i in order:
        if groups and c[i] <= c[groups[-1][0]] * tolerance:
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return groups


def _parabola(log_n: np.ndarray, loss: np.ndarray, stderr: np.ndarray) -> tuple[float, float, float] | None:
    if len(np.unique(log_n)) < MIN_SIZES:
        return None
    known = np.isfinite(stderr) & (stderr > 0)
    w = None
    if known.all():
        w = 1.0 / stderr
    elif known.any():
        w = np.where(known, 1.0 / np.where(known, stderr, 1.0), 1.0 / np.exp(np.mean(np.log(stderr[known]))))
    p2, p1, p0 = np.polyfit(log_n, loss, 2, w=w)
    return float(p2), float(p1), float(p0)


def _minimum(coefficients: tuple[float, float, float], log_n: np.ndarray) -> tuple[float, float] | str:
    p2, p1, p0 = coefficients
    if p2 <= 0:
        return "the parabola opens downward (no minimum): the sizes do not bracket the optimum"
    x = -p1 / (2 * p2)
    if not (log_n.min() - math.log(4) <= x <= log_n.max() + math.log(4)):
        return (f"the minimum (N = {math.exp(x):.3g}) lies more than 4x outside the sizes trained: the sizes "
                "do not bracket the optimum")
    return math.exp(x), p0 - p1 * p1 / (4 * p2)


def _budget_optima(n: np.ndarray, d: np.ndarray, c: np.ndarray, loss: np.ndarray, stderr: np.ndarray,
                   groups: list[list[int]]) -> list[Budget]:
    budgets = []
    for idx in groups:
        sel = np.array(idx)
        budget = Budget(compute=float(np.exp(np.mean(np.log(c[sel])))), indices=list(idx))
        log_n = np.log(n[sel])
        coefficients = _parabola(log_n, loss[sel], stderr[sel])
        if coefficients is None:
            budget.why_none = f"fewer than {MIN_SIZES} distinct model sizes"
        else:
            budget.coefficients = coefficients
            found = _minimum(coefficients, log_n)
            if isinstance(found, str):
                budget.why_none = found
            else:
                slope, intercept = flops_per_token_line(n[sel], c[sel], d[sel])
                budget.n_opt, budget.loss_opt = found
                budget.d_opt = budget.compute / (slope * budget.n_opt + intercept)
        budgets.append(budget)
    return budgets


def _power_law(compute: list[float], values: list[float]) -> tuple[float, float] | None:
    """``(coefficient, exponent)`` of ``values = coefficient x compute^exponent`` (log-log least squares)."""
    if len(compute) < 2:
        return None
    exponent, intercept = np.polyfit(np.log(compute), np.log(values), 1)
    return float(math.exp(intercept)), float(exponent)


def _percentiles(values: list[float], percentile: float) -> tuple[float, float] | None:
    if len(values) < 2:
        return None
    tail = (100.0 - percentile) / 2
    lo, hi = np.percentile(np.array(values), [tail, 100.0 - tail])
    return float(lo), float(hi)


def fit_isoflops(n: Sequence[float], d: Sequence[float], compute: Sequence[float], loss: Sequence[float], *,
                 stderr: Sequence[float] | None = None, tolerance: float = BUDGET_TOLERANCE, bootstrap: int = 0,
                 percentile: float = 95.0, seed: int = 0) -> IsoFlopFit:
    """Hoffmann et al. 2022 approach 2 on points (the module docstring).

    Args:
        n, d, compute, loss: ``[points]``: parameters, tokens, training FLOPs, final loss (nats/token).
        stderr: ``[points]`` standard errors of the losses (NaN: none), or ``None``.
        tolerance: Budget grouping factor (:func:`group_budgets`).
        bootstrap: Resamples for the intervals (0: none).
    """
    from dlmspec.scaling.law import single_threaded_blas

    with single_threaded_blas():
        return _fit_isoflops(n, d, compute, loss, stderr, tolerance, bootstrap, percentile, seed)


def _fit_isoflops(n: Sequence[float], d: Sequence[float], compute: Sequence[float], loss: Sequence[float],
                  stderr: Sequence[float] | None, tolerance: float, bootstrap: int, percentile: float,
                  seed: int) -> IsoFlopFit:
    n_a, d_a, c_a, l_a = (np.asarray(v, dtype=float) for v in (n, d, compute, loss))
    s_a = np.full_like(l_a, np.nan) if stderr is None else np.asarray(stderr, dtype=float)
    groups = group_budgets(c_a, tolerance)
    budgets = _budget_optima(n_a, d_a, c_a, l_a, s_a, groups)
    fit = IsoFlopFit(budgets=budgets, percentile=percentile, seed=seed)
    found = [b for b in budgets if b.n_opt is not None]
    n_law = _power_law([b.compute for b in found], [b.n_opt for b in found])
    d_law = _power_law([b.compute for b in found], [b.d_opt for b in found])
    if n_law and d_law:
        fit.n_coefficient, fit.n_exponent = n_law
        fit.d_coefficient, fit.d_exponent = d_law
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        per_budget: list[tuple[list[float], list[float]]] = [([], []) for _ in budgets]
        exponents: dict[str, list[float]] = {"N_exponent": [], "D_exponent": []}
        for _ in range(bootstrap):
            resampled = [[idx[j] for j in rng.integers(0, len(idx), len(idx))] for idx in groups]
            again = _budget_optima(n_a, d_a, c_a, l_a, s_a, resampled)
            for slot, b in zip(per_budget, again):
                if b.n_opt is not None:
                    slot[0].append(b.n_opt)
                    slot[1].append(b.d_opt)
            ok = [b for b in again if b.n_opt is not None]
            laws = (_power_law([b.compute for b in ok], [b.n_opt for b in ok]),
                    _power_law([b.compute for b in ok], [b.d_opt for b in ok]))
            if laws[0] and laws[1]:
                exponents["N_exponent"].append(laws[0][1])
                exponents["D_exponent"].append(laws[1][1])
        for b, (ns, ds) in zip(budgets, per_budget):
            if b.n_opt is not None:
                b.n_interval, b.d_interval = _percentiles(ns, percentile), _percentiles(ds, percentile)
        fit.bootstrap = bootstrap
        for key, values in exponents.items():
            interval = _percentiles(values, percentile)
            if interval is not None:
                fit.intervals[key] = interval
    return fit
