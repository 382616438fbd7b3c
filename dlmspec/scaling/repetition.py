"""Repeated data: the data-constrained scaling law of Muennighoff et al. 2023 ("Scaling
Data-Constrained Language Models", NeurIPS 2023, arXiv:2305.16264, Section 3.1, Eq. 5).

With ``U_D`` unique tokens seen and ``D`` tokens trained on, the repetitions are
``R_D = D / U_D - 1`` (epochs - 1), and repeated tokens are worth less than fresh ones:

    D' = U_D + U_D R*_D (1 - exp(-R_D / R*_D))                         (effective data)

and the same for parameters beyond the compute-optimal size for ``U_D``:

    U_N = min(N_opt(U_D), N),   N_opt(U_D) = G (U_D G)^(beta/alpha)    (Muennighoff Eq. 5; G of Hoffmann Eq. 4)
    R_N = N / U_N - 1,          N' = U_N + U_N R*_N (1 - exp(-R_N / R*_N))

    L(N, D, U_D) = E + A / N'^alpha + B / D'^beta.

``R*_D`` and ``R*_N`` are the repetitions after which repeated data (excess parameters) are worth
``1 - 1/e`` of their value; Muennighoff et al. fitted ``R*_D ~ 15.4`` and ``R*_N ~ 5.3``
(:data:`PUBLISHED_R_D`, :data:`PUBLISHED_R_N`) on their AR runs. A study with at least
:data:`MIN_REPETITION_LEVELS` distinct repetition levels fits its own (with E, A, B, alpha, beta
held at the single-epoch fit, as Muennighoff et al. fit them: Huber with delta 1e-3 on log loss,
L-BFGS-B from a grid of starts in ``log R*``); otherwise the published values are used and said
to be. For masked diffusion LMs Ni et al. 2025 ("Diffusion Language Models are Super Data
Learners") report that repeated data keeps its value for far more epochs than for AR models, so
the published AR values understate a DLM's effective data: fit them when the study allows.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from dlmspec.scaling.law import HUBER_DELTA, FitError, Law, log_loss_weights, single_threaded_blas

#: Muennighoff et al. 2023's fitted R*_D (Section 3.1 / Figure 3): ~15.4 repetitions.
PUBLISHED_R_D = 15.4
#: Muennighoff et al. 2023's fitted R*_N: ~5.3.
PUBLISHED_R_N = 5.3
#: Distinct repetition levels (epochs, rounded to 2 decimals) a study needs to fit its own R*.
MIN_REPETITION_LEVELS = 3
#: Starts of the R* fit: log R*_D x log R*_N.
R_STAR_STARTS = (math.log(1.0), math.log(5.0), math.log(15.0), math.log(50.0), math.log(200.0))


def effective(unique: Any, repetitions: Any, r_star: float) -> Any:
    """``U + U R* (1 - exp(-R / R*))`` (Muennighoff et al. 2023, Eq. 5): effective data (or
    parameters) of ``unique`` tokens (parameters) repeated ``repetitions`` times beyond the first."""
    u, r = np.asarray(unique, dtype=float), np.maximum(np.asarray(repetitions, dtype=float), 0.0)
    return u + u * r_star * (1.0 - np.exp(-r / r_star))


def unique_params(law: Law, unique_tokens: Any, n: Any) -> Any:
    """``U_N = min(G (U_D G)^(beta/alpha), N)``: the compute-optimal size for ``unique_tokens``
    under ``law`` (Hoffmann Eq. 4 solved for N at D = U_D), at most ``n``."""
    u = np.asarray(unique_tokens, dtype=float)
    return np.minimum(law.G * (u * law.G) ** (law.beta / law.alpha), np.asarray(n, dtype=float))


def effective_sizes(law: Law, n: Any, d: Any, unique_tokens: Any, r_star_d: float, r_star_n: float) -> tuple[Any, Any]:
    """``(N', D')`` of Muennighoff et al. 2023's Eq. 5 (the module docstring)."""
    n_a, d_a, u_a = (np.asarray(v, dtype=float) for v in (n, d, unique_tokens))
    d_eff = effective(u_a, d_a / u_a - 1.0, r_star_d)
    u_n = unique_params(law, u_a, n_a)
    n_eff = effective(u_n, n_a / u_n - 1.0, r_star_n)
    return n_eff, d_eff


def predict(law: Law, n: Any, d: Any, unique_tokens: Any, r_star_d: float = PUBLISHED_R_D,
            r_star_n: float = PUBLISHED_R_N) -> Any:
    """The data-constrained law's loss ``E + A/N'^alpha + B/D'^beta``."""
    n_eff, d_eff = effective_sizes(law, n, d, unique_tokens, r_star_d, r_star_n)
    return law.loss(n_eff, d_eff)


def repetition_levels(epochs: Sequence[float]) -> list[float]:
    """The distinct repetition levels of a study: epochs rounded to 2 decimals, at least 1."""
    return sorted({round(max(float(e), 1.0), 2) for e in epochs})


@dataclass
class RepetitionFit:
    """R*_D and R*_N of a study and what the data-constrained law predicts for its points.

    Attributes:
        r_star_d, r_star_n: The values used.
        source: ``"fitted"`` (the study's own, with ``intervals``) or ``"published"``
            (Muennighoff et al. 2023; the study had fewer than :data:`MIN_REPETITION_LEVELS` levels).
        levels: The study's repetition levels (epochs).
        predicted: ``[points]`` the law's loss at each point's (N', D').
        effective_tokens, effective_params: ``[points]`` D' and N'.
    """

    r_star_d: float
    r_star_n: float
    source: str
    levels: list[float]
    predicted: np.ndarray
    effective_tokens: np.ndarray
    effective_params: np.ndarray
    bootstrap: int = 0
    percentile: float = 95.0
    intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"method": "Muennighoff et al. 2023 effective data and parameters (Eq. 5)",
                "R_star_D": self.r_star_d, "R_star_N": self.r_star_n, "source": self.source,
                "levels": self.levels, "bootstrap": {"resamples": self.bootstrap, "percentile": self.percentile},
                "intervals": {k: list(v) for k, v in self.intervals.items()}}


def _objective(theta: np.ndarray, law: Law, n: np.ndarray, d: np.ndarray, u: np.ndarray, log_loss: np.ndarray,
               weights: np.ndarray, delta: float) -> float:
    r_d, r_n = math.exp(theta[0]), math.exp(theta[1])
    pred = predict(law, n, d, u, r_d, r_n)
    r = weights * (log_loss - np.log(pred))
    return float(np.sum(np.where(np.abs(r) <= delta, 0.5 * r * r, delta * (np.abs(r) - 0.5 * delta))))


def _fit_r_star(law: Law, n: np.ndarray, d: np.ndarray, u: np.ndarray, log_loss: np.ndarray, weights: np.ndarray,
                delta: float) -> tuple[float, float]:
    from scipy.optimize import minimize

    best = None
    for start in itertools.product(R_STAR_STARTS, R_STAR_STARTS):
        res = minimize(_objective, np.array(start), args=(law, n, d, u, log_loss, weights, delta), method="L-BFGS-B",
                       bounds=[(math.log(1e-2), math.log(1e4))] * 2)
        if math.isfinite(res.fun) and (best is None or res.fun < best.fun):
            best = res
    if best is None:
        raise FitError("no start of the R* grid converged", "check the points' unique tokens and epochs")
    return math.exp(best.x[0]), math.exp(best.x[1])


def fit_repetition(law: Law, n: Sequence[float], d: Sequence[float], unique_tokens: Sequence[float],
                   loss: Sequence[float], *, stderr: Sequence[float] | None = None, delta: float = HUBER_DELTA,
                   bootstrap: int = 0, percentile: float = 95.0, seed: int = 0) -> RepetitionFit:
    """R*_D and R*_N for ``law`` (fitted on single-epoch points): the study's own when its points
    have at least :data:`MIN_REPETITION_LEVELS` repetition levels, else Muennighoff et al.'s.

    Args:
        law: The single-epoch law (E, A, B, alpha, beta held fixed).
        n, d, unique_tokens, loss: ``[points]``: parameters, tokens trained on, unique tokens
            seen, final loss.
        stderr: ``[points]`` standard errors of the losses (NaN: none).
        bootstrap: Resamples for the intervals of a fitted R* (0: none).
    """
    n_a, d_a, u_a, l_a = (np.asarray(v, dtype=float) for v in (n, d, unique_tokens, loss))
    s_a = np.full_like(l_a, np.nan) if stderr is None else np.asarray(stderr, dtype=float)
    if not np.all(np.isfinite(u_a) & (u_a > 0)):
        raise FitError("a point without a positive number of unique tokens", "give each point its unique tokens")
    levels = repetition_levels(d_a / u_a)
    weights = log_loss_weights(l_a, s_a)
    result_source, intervals = "published", {}
    r_d, r_n = PUBLISHED_R_D, PUBLISHED_R_N
    done = 0
    if len(levels) >= MIN_REPETITION_LEVELS:
        with single_threaded_blas():
            r_d, r_n = _fit_r_star(law, n_a, d_a, u_a, np.log(l_a), weights, delta)
        result_source = "fitted"
        if bootstrap > 0:
            rng = np.random.default_rng(seed)
            samples = []
            for _ in range(bootstrap):
                idx = rng.integers(0, len(n_a), len(n_a))
                with single_threaded_blas():
                    samples.append(_fit_r_star(law, n_a[idx], d_a[idx], u_a[idx], np.log(l_a[idx]), weights[idx],
                                               delta))
            done = bootstrap
            tail = (100.0 - percentile) / 2
            arr = np.array(samples)
            for i, name in enumerate(("R_star_D", "R_star_N")):
                lo, hi = np.percentile(arr[:, i], [tail, 100.0 - tail])
                intervals[name] = (float(lo), float(hi))
    n_eff, d_eff = effective_sizes(law, n_a, d_a, u_a, r_d, r_n)
    return RepetitionFit(r_star_d=r_d, r_star_n=r_n, source=result_source, levels=levels,
                         predicted=law.loss(n_eff, d_eff), effective_tokens=d_eff, effective_params=n_eff,
                         bootstrap=done, percentile=percentile, intervals=intervals)
