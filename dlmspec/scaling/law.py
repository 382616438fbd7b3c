"""The parametric scaling law L(N, D) = E + A / N^alpha + B / D^beta, fitted as Hoffmann et al.
2022 ("Training Compute-Optimal Large Language Models", arXiv:2203.15556) fit it (their
approach 3, Section 3.3 and Appendix D.2), and the compute-optimal allocation it implies.

The fit (Hoffmann et al. 2022, Eq. 2 and D.2): with ``a = log A``, ``b = log B``, ``e = log E``,
minimise over ``(a, b, e, alpha, beta)``

    sum_i Huber_delta( w_i * ( log L_i - LSE(a - alpha log N_i, b - beta log D_i, e) ) )

(``LSE`` the log-sum-exp, so ``exp(LSE(...)) = E + A/N^alpha + B/D^beta``; ``delta = 1e-3``),
with L-BFGS-B (``scipy.optimize.minimize``) from each start of a grid and keeping the best
(Hoffmann's grid, :data:`HOFFMANN_GRID`: alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1},
a, b in {0, 5, ..., 25}, 4,500 starts; by default a 72-start grid over the same ranges,
:data:`DEFAULT_GRID`: on Chinchilla's points every start tried converges to the same minimum once
L-BFGS-B's tolerances are tight enough, :data:`LBFGSB_OPTIONS`).
Besiroglu et al. 2024 ("Chinchilla Scaling: A replication attempt", arXiv:2404.10102) redid
this fit on the points read off Hoffmann's Figure 4; tests/unit/scaling reproduces their
parameters.

Weights (a dlmspec choice, not Hoffmann's: their losses came without errors): a point with a
standard error ``s_i`` of its loss has a log-loss error ``sigma_i = s_i / L_i`` (the delta
method), and its residual is scaled by ``w_i = sigma_ref / sigma_i``, ``sigma_ref`` the
geometric mean of the points' ``sigma_i``; points without one take ``w_i = 1``. With no
standard error anywhere every ``w_i`` is 1: Hoffmann's objective exactly. ``delta`` thus keeps
its meaning (a residual of 1e-3 in log-loss for a point of typical precision).

Compute-optimal allocation (Hoffmann et al. 2022, Eq. 4 and Appendix D.3): for training FLOPs
``C = 6 N D`` (Kaplan et al. 2020; Hoffmann)

    N*(C) = G (C/6)^(beta/(alpha+beta)),  D*(C) = G^-1 (C/6)^(alpha/(alpha+beta)),
    G = (alpha A / (beta B))^(1/(alpha+beta)).

dlmspec's points carry the planner's FLOPs (:mod:`dlmspec.flops`: attention and the logits GEMM
included, so not 6 N a token: at small widths the logits dominate). The FLOPs per token are
then taken as a line in N fitted to the points, ``f(N) = s N + b`` (least squares of ``C_i / D_i``
on ``N_i``; ``b = 0`` and ``s`` the median ``C_i / (N_i D_i)`` when the line's intercept would
be negative or the points have one size), and ``N*(C)`` minimises ``L(N, C / f(N))`` over N
(``scipy.optimize.minimize_scalar``, bounded, in log N); with ``b = 0`` that is Eq. 4 with
``k = s`` in place of 6.

Intervals are bootstrap percentiles (Besiroglu et al. 2024's method): resample the points with
replacement ``bootstrap`` times, refit each from the full fit's best starts, and take the 2.5th
and 97.5th percentiles (``percentile = 95``) of each parameter and of N*(C), D*(C).

Imports numpy and scipy, never torch.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

#: Huber's delta of Hoffmann et al. 2022 (Appendix D.2), in log-loss.
HUBER_DELTA = 1e-3

#: The parameters of the law, in the order the optimiser sees them (``a = log A`` ...).
PARAMETERS = ("E", "A", "B", "alpha", "beta")

#: Hoffmann et al. 2022's grid of starts (Appendix D.2): (a, b, e, alpha, beta) values.
HOFFMANN_GRID: dict[str, tuple[float, ...]] = {
    "a": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "b": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
    "e": (-1.0, -0.5, 0.0, 0.5, 1.0),
    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0),
    "beta": (0.0, 0.5, 1.0, 1.5, 2.0),
}

#: The grid ``dlmspec fit`` starts from by default: 72 starts spanning Hoffmann's ranges (a, b in
#: {0, 10, 20}, e in {-1, 1}, alpha, beta in {0, 1}); ``grid=HOFFMANN_GRID`` (4,500 starts,
#: ``dlmspec fit --grid hoffmann``) is theirs exactly.
DEFAULT_GRID: dict[str, tuple[float, ...]] = {
    "a": (0.0, 10.0, 20.0),
    "b": (0.0, 10.0, 20.0),
    "e": (-1.0, 1.0),
    "alpha": (0.0, 1.0),
    "beta": (0.0, 1.0),
}

#: L-BFGS-B's stopping rules: the objective is ~1e-3 (Huber with delta 1e-3), so scipy's default
#: tolerances stop short of the minimum; these let it converge.
LBFGSB_OPTIONS = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 2000}

#: FLOPs per parameter per token of Kaplan et al. 2020 / Hoffmann et al. 2022 (``C = 6 N D``).
KAPLAN_FLOPS_PER_PARAM_TOKEN = 6.0


class FitError(ValueError):
    """A fit that cannot be made: ``why`` and ``fix`` (the CLI turns it into exit code 2)."""

    def __init__(self, why: str, fix: str) -> None:
        super().__init__(f"{why}. Fix: {fix}")
        self.why, self.fix = why, fix


@dataclass(frozen=True)
class Law:
    """``L(N, D) = E + A / N^alpha + B / D^beta`` (Hoffmann et al. 2022, Eq. 2); N parameters,
    D training tokens, L loss in nats per token."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n: Any, d: Any) -> Any:
        """The law's loss at ``n`` parameters and ``d`` tokens (scalars or arrays, broadcast). A power
        that overflows (a bootstrap law's exponent of ~17 at millions of parameters) is ``inf`` and its
        term 0, without numpy's warning (a user reads the fit, not a RuntimeWarning)."""
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        with np.errstate(over="ignore"):
            return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def as_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in PARAMETERS}

    @property
    def G(self) -> float:
        """``(alpha A / (beta B))^(1/(alpha+beta))`` (Hoffmann et al. 2022, Eq. 4)."""
        return (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))

    def optimal(self, compute: Any, flops_per_param_token: float = KAPLAN_FLOPS_PER_PARAM_TOKEN) -> tuple[Any, Any]:
        """``(N*(C), D*(C))``: the parameters and tokens that minimise the law at training FLOPs
        ``compute`` = ``flops_per_param_token`` x N x D (Hoffmann et al. 2022, Eq. 4)."""
        c = np.asarray(compute, dtype=float) / flops_per_param_token
        s = self.alpha + self.beta
        return self.G * c ** (self.beta / s), c ** (self.alpha / s) / self.G


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """numpy's BLAS on one thread while fitting: L-BFGS-B's small matrix products on several
    threads cost some 20 times as much (measured: 10 starts on 36 points, 3.1 s against 0.14 s of
    CPU on a 2-core machine). ``threadpoolctl``; nothing when it is not installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - a dependency of dlmspec
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def flops_per_token_line(n: Any, compute: Any, tokens: Any) -> tuple[float, float]:
    """``(s, b)`` of the FLOPs per token ``f(N) = s N + b`` of the points (the module docstring).

    Args:
        n, compute, tokens: ``[points]`` parameters, training FLOPs and training tokens."""
    n_a, per_token = np.asarray(n, dtype=float), np.asarray(compute, dtype=float) / np.asarray(tokens, dtype=float)
    ok = np.isfinite(per_token) & (per_token > 0) & np.isfinite(n_a) & (n_a > 0)
    n_a, per_token = n_a[ok], per_token[ok]
    if not len(n_a):
        return KAPLAN_FLOPS_PER_PARAM_TOKEN, 0.0
    if len(np.unique(n_a)) >= 2:
        slope, intercept = np.polyfit(n_a, per_token, 1)
        if slope > 0 and intercept >= 0:
            return float(slope), float(intercept)
    return float(np.median(per_token / n_a)), 0.0


def optimal_allocation(law: Law, compute: float, flops_per_token: tuple[float, float]) -> tuple[float, float]:
    """``(N*, D*)`` minimising ``law`` at training FLOPs ``compute`` when a token costs
    ``s N + b`` FLOPs (``flops_per_token = (s, b)``): Hoffmann et al. 2022's Eq. 4 with ``k = s``
    when ``b = 0``, else a bounded 1-D minimisation over log N."""
    slope, intercept = flops_per_token
    if intercept == 0:
        n, d = law.optimal(compute, slope)
        return float(n), float(d)
    from scipy.optimize import minimize_scalar

    top = math.log(max((compute - intercept) / slope, 2.0))  # the largest N that still trains on one token

    def loss_at(x: float) -> float:
        n = math.exp(x)
        return float(law.loss(n, compute / (slope * n + intercept)))

    found = minimize_scalar(loss_at, bounds=(0.0, top), method="bounded", options={"xatol": 1e-7})
    n = math.exp(float(found.x))
    return n, compute / (slope * n + intercept)


def huber_objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray,
                    weights: np.ndarray, delta: float = HUBER_DELTA) -> tuple[float, np.ndarray]:
    """Hoffmann et al. 2022's objective (Appendix D.2) and its gradient in ``theta = (a, b, e,
    alpha, beta)``: ``sum_i Huber_delta(w_i (log L_i - LSE_i))``, ``Huber_delta(r) = r^2/2`` for
    ``|r| <= delta``, else ``delta (|r| - delta/2)``.

    Args:
        theta: ``[5]``.
        log_n, log_d, log_loss, weights: ``[points]`` each (natural logs; weights as the module
            docstring says).
    """
    # LSE_i = log(exp(a - alpha log N_i) + exp(b - beta log D_i) + exp(e)), shifted by its largest term,
    # and the gradient through its softmax, term by term: the objective is evaluated hundreds of times a
    # start on a few dozen points, where each numpy call's overhead outweighs its arithmetic
    a, b, e, alpha, beta = theta
    t_n, t_d = a - alpha * log_n, b - beta * log_d
    top = np.maximum(np.maximum(t_n, t_d), e)
    x_n, x_d, x_e = np.exp(t_n - top), np.exp(t_d - top), np.exp(e - top)
    total = x_n + x_d + x_e
    r = weights * (log_loss - (top + np.log(total)))
    size = np.abs(r)
    value = float(np.where(size <= delta, 0.5 * r * r, delta * (size - 0.5 * delta)).sum())
    dr = np.clip(r, -delta, delta) * -weights / total  # d value / d pred, over the softmax's denominator
    g_n, g_d = dr * x_n, dr * x_d
    grad = np.array([g_n.sum(), g_d.sum(), (dr * x_e).sum(), -float(g_n @ log_n), -float(g_d @ log_d)])
    return value, grad


def grid_starts(grid: dict[str, Sequence[float]] | None = None) -> np.ndarray:
    """The starts ``[starts, 5]`` (a, b, e, alpha, beta) of a grid (default :data:`DEFAULT_GRID`)."""
    g = grid or DEFAULT_GRID
    return np.array(list(itertools.product(g["a"], g["b"], g["e"], g["alpha"], g["beta"])), dtype=float)


def log_loss_weights(loss: np.ndarray, stderr: np.ndarray) -> np.ndarray:
    """``w_i = sigma_ref / sigma_i`` with ``sigma_i = stderr_i / loss_i`` (the module docstring);
    1 where a point has no standard error (NaN) or none has one."""
    sigma = stderr / loss
    known = np.isfinite(sigma) & (sigma > 0)
    weights = np.ones_like(loss)
    if known.any():
        ref = float(np.exp(np.mean(np.log(sigma[known]))))
        weights[known] = ref / sigma[known]
    return weights


@dataclass
class _Minimum:
    theta: np.ndarray
    value: float


def _minimise(starts: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray, weights: np.ndarray,
              delta: float, keep: int = 0) -> tuple[_Minimum, list[np.ndarray]]:
    """L-BFGS-B from every start; the best minimum and the ``keep`` best distinct end points."""
    from scipy.optimize import minimize

    results: list[_Minimum] = []
    for start in starts:  # the callers hold single_threaded_blas()
        res = minimize(huber_objective, start, args=(log_n, log_d, log_loss, weights, delta), jac=True,
                       method="L-BFGS-B", options=LBFGSB_OPTIONS)
        if np.all(np.isfinite(res.x)) and math.isfinite(res.fun):
            results.append(_Minimum(np.asarray(res.x, dtype=float), float(res.fun)))
    if not results:
        raise FitError("no start of the grid converged to a finite fit", "check the points (losses > 0, N and D > 0)")
    results.sort(key=lambda m: m.value)
    distinct: list[np.ndarray] = []
    for m in results:
        if len(distinct) >= keep:
            break
        if all(np.max(np.abs(m.theta - t)) > 1e-3 for t in distinct):
            distinct.append(m.theta)
    return results[0], distinct


#: The largest natural log a float holds the exponential of (``log`` of the largest float, ~709.8).
LOG_FLOAT_MAX = math.log(sys.float_info.max)


def _law(theta: np.ndarray) -> Law:
    """The :class:`Law` of a minimiser's ``(log A, log B, log E, alpha, beta)``.

    Raises:
        FitError: a ``log A``, ``log B`` or ``log E`` whose exponential is beyond the float range: the
            points leave that term unconstrained (a term that tends to infinity is no law).
    """
    a, b, e, alpha, beta = (float(v) for v in theta)
    for name, value in (("A", a), ("B", b), ("E", e)):
        if value > LOG_FLOAT_MAX:
            raise FitError(f"the fit sends {name} beyond the float range (log {name} = {value:.0f}): the points "
                           "leave that term unconstrained",
                           "add runs that constrain it: more model sizes N per budget (A), more token counts D (B)")
    return Law(E=math.exp(e), A=math.exp(a), B=math.exp(b), alpha=alpha, beta=beta)


@dataclass
class LawFit:
    """A fit of :class:`Law` (Hoffmann et al. 2022 approach 3) and its bootstrap intervals.

    Attributes:
        law: The best fit.
        objective: The Huber objective at it.
        points: Points fitted.
        starts: L-BFGS-B starts of the grid.
        flops_per_token: ``(s, b)``: a token costs ``s N + b`` FLOPs (:func:`flops_per_token_line`).
        bootstrap: Resamples drawn (0: no intervals).
        bootstrap_failed: Resamples whose refit did not converge (left out of the percentiles).
        percentile: Central interval width in percent (95: the 2.5th to 97.5th percentiles).
        intervals: Parameter name -> ``(low, high)``.
        samples: ``[resamples, 5]`` the refitted (E, A, B, alpha, beta).
        seed: The bootstrap's seed.
    """

    law: Law
    objective: float
    points: int
    starts: int
    flops_per_token: tuple[float, float]
    bootstrap: int = 0
    bootstrap_failed: int = 0
    percentile: float = 95.0
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: np.ndarray | None = None
    seed: int = 0

    def optimum(self, budgets: Sequence[float]) -> list[dict[str, Any]]:
        """Per compute budget C (FLOPs): ``N*`` and ``D*`` of the law (Hoffmann et al. 2022,
        Eq. 4) with their bootstrap intervals (``None`` without a bootstrap)."""
        out = []
        for budget in budgets:
            n, d = optimal_allocation(self.law, budget, self.flops_per_token)
            row: dict[str, Any] = {"compute": float(budget), "N": float(n), "D": float(d),
                                   "N_interval": None, "D_interval": None}
            if self.samples is not None and len(self.samples):
                ns, ds = [], []
                for E, A, B, alpha, beta in self.samples:
                    n_b, d_b = optimal_allocation(Law(E, A, B, alpha, beta), budget, self.flops_per_token)
                    ns.append(float(n_b))
                    ds.append(float(d_b))
                row["N_interval"] = _percentiles(np.array(ns), self.percentile)
                row["D_interval"] = _percentiles(np.array(ds), self.percentile)
            out.append(row)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"method": "Hoffmann et al. 2022 approach 3: Huber (delta 1e-3) on log loss, L-BFGS-B from a grid",
                "law": self.law.as_dict(), "objective": self.objective, "points": self.points,
                "starts": self.starts, "flops_per_token": {"per_parameter": self.flops_per_token[0],
                                                                      "constant": self.flops_per_token[1]},
                "bootstrap": {"resamples": self.bootstrap, "failed": self.bootstrap_failed,
                              "percentile": self.percentile, "seed": self.seed},
                "intervals": {k: list(v) for k, v in self.intervals.items()}}


def _percentiles(values: np.ndarray, percentile: float) -> tuple[float, float]:
    tail = (100.0 - percentile) / 2
    lo, hi = np.percentile(values, [tail, 100.0 - tail])
    return float(lo), float(hi)


def fit_law(n: Sequence[float], d: Sequence[float], loss: Sequence[float], *, stderr: Sequence[float] | None = None,
            compute: Sequence[float] | None = None, grid: dict[str, Sequence[float]] | None = None,
            delta: float = HUBER_DELTA, bootstrap: int = 0, percentile: float = 95.0, seed: int = 0,
            bootstrap_starts: int = 4) -> LawFit:
    """Fit :class:`Law` to points (Hoffmann et al. 2022 approach 3; the module docstring).

    Args:
        n: ``[points]`` parameters N (non-embedding, as Kaplan and Chinchilla fit them).
        d: ``[points]`` training tokens D.
        loss: ``[points]`` final loss (nats per token), > 0.
        stderr: ``[points]`` standard errors of the losses (NaN: none), or ``None``.
        compute: ``[points]`` training FLOPs, for the FLOPs per token (:func:`flops_per_token_line`);
            default ``6 N``.
        grid: Starts per parameter (default :data:`DEFAULT_GRID`, 72 starts; :data:`HOFFMANN_GRID`
            is Hoffmann et al.'s 4,500).
        delta: Huber's delta (default 1e-3).
        bootstrap: Resamples for the intervals (0: none). Each refit starts from the full fit's
            ``bootstrap_starts`` best distinct minima.
        percentile: Central interval width in percent.
        seed: Seed of the resampling (``numpy.random.default_rng``).

    Raises:
        FitError: fewer points than the law's 5 parameters, or a non-positive or non-finite value.
    """
    n_a, d_a, l_a = (np.asarray(v, dtype=float) for v in (n, d, loss))
    s_a = np.full_like(l_a, np.nan) if stderr is None else np.asarray(stderr, dtype=float)
    if not (n_a.shape == d_a.shape == l_a.shape == s_a.shape) or n_a.ndim != 1:
        raise FitError("N, D, loss and standard errors differ in length", "give one value of each per point")
    if len(n_a) < len(PARAMETERS):
        raise FitError(f"{len(n_a)} points for a law of {len(PARAMETERS)} parameters",
                       f"give at least {len(PARAMETERS)} runs (distinct N and D) with a loss")
    for name, values in (("N", n_a), ("D", d_a), ("loss", l_a)):
        if not np.all(np.isfinite(values) & (values > 0)):
            raise FitError(f"a {name} that is not a positive finite number", f"every point needs {name} > 0")
    k = (KAPLAN_FLOPS_PER_PARAM_TOKEN, 0.0) if compute is None else flops_per_token_line(n_a, compute, d_a)
    log_n, log_d, log_l = np.log(n_a), np.log(d_a), np.log(l_a)
    weights = log_loss_weights(l_a, s_a)
    starts = grid_starts(grid)
    with single_threaded_blas():
        return _fit(log_n, log_d, log_l, weights, starts, delta, bootstrap, bootstrap_starts, percentile, seed, k)


def _fit(log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, weights: np.ndarray, starts: np.ndarray,
         delta: float, bootstrap: int, bootstrap_starts: int, percentile: float, seed: int,
         k: tuple[float, float]) -> LawFit:
    best, distinct = _minimise(starts, log_n, log_d, log_l, weights, delta, keep=max(bootstrap_starts, 1))
    result = LawFit(law=_law(best.theta), objective=best.value, points=len(log_n), starts=len(starts),
                    flops_per_token=k, percentile=percentile, seed=seed)
    if bootstrap > 0:
        rng = np.random.default_rng(seed)
        samples, failed = [], 0
        boot_starts = np.array(distinct)
        for _ in range(bootstrap):
            idx = rng.integers(0, len(log_n), len(log_n))
            try:  # a resample that does not converge, or converges to a term beyond the float range
                m, _ = _minimise(boot_starts, log_n[idx], log_d[idx], log_l[idx], weights[idx], delta)
                fitted = _law(m.theta)
            except FitError:
                failed += 1
                continue
            samples.append([fitted.E, fitted.A, fitted.B, fitted.alpha, fitted.beta])
        result.bootstrap, result.bootstrap_failed = bootstrap, failed
        if samples:
            result.samples = np.array(samples)
            result.intervals = {name: _percentiles(result.samples[:, i], percentile)
                                for i, name in enumerate(PARAMETERS)}
    return result
