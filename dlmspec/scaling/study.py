"""A scaling study's fits, from its points (:mod:`dlmspec.scaling.runs`): what ``dlmspec fit``
prints and draws.

* Replicates (runs of the same N, D and U) are pooled first (:func:`dlmspec.scaling.runs.pool_replicates`).
* The parametric law (:func:`dlmspec.scaling.law.fit_law`, Hoffmann et al. 2022 approach 3) is
  fitted on the single-epoch points (epochs <= 1, or unknown: a run that repeats its data would
  bias A, B, alpha, beta toward repeated tokens' lower worth).
* IsoFLOP profiles (:func:`dlmspec.scaling.isoflop.fit_isoflops`, approach 2) on the same points.
* When some points repeat their data (epochs > 1, unique tokens known), the data-constrained
  form (:func:`dlmspec.scaling.repetition.fit_repetition`, Muennighoff et al. 2023) on all
  points with unique tokens: R*_D and R*_N fitted with at least 3 repetition levels, else the
  published ones.
* The compute-optimal N*(C) and D*(C) of the law at each compute budget present, with bootstrap
  intervals (the same resamples as the law's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlmspec.scaling.isoflop import BUDGET_TOLERANCE, IsoFlopFit, fit_isoflops, group_budgets
from dlmspec.scaling.law import PARAMETERS, FitError, LawFit, fit_law
from dlmspec.scaling.repetition import RepetitionFit, fit_repetition
from dlmspec.scaling.runs import Pooled, RunPoint, pool_replicates

#: A run whose epochs exceed this repeats its data (a rounding margin above one epoch).
SINGLE_EPOCH = 1.0 + 1e-6


@dataclass
class StudyFit:
    """Every fit of a study (see the module docstring)."""

    points: list[Pooled]
    single_epoch: list[RunPoint]
    law: LawFit
    isoflops: IsoFlopFit
    optimum: list[dict[str, Any]]
    repetition: RepetitionFit | None = None
    repeated: list[RunPoint] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"points": [dict(p.point.as_dict(), replicates=p.replicates) for p in self.points],
                "law": self.law.as_dict(), "isoflops": self.isoflops.as_dict(), "optimum": self.optimum,
                "data_constrained": self.repetition.as_dict() if self.repetition else None}


def fit_study(points: list[RunPoint], *, bootstrap: int = 200, percentile: float = 95.0, seed: int = 0,
              grid: dict[str, Any] | None = None, tolerance: float = BUDGET_TOLERANCE) -> StudyFit:
    """Fit a study's points (the module docstring).

    Raises:
        FitError: fewer single-epoch points than the law's 5 parameters.
    """
    pooled = pool_replicates(points)
    base = [p.point for p in pooled if p.point.epochs is None or p.point.epochs <= SINGLE_EPOCH]
    repeated = [p.point for p in pooled if p.point.epochs is not None and p.point.epochs > SINGLE_EPOCH]
    if len(base) < len(PARAMETERS):
        extra = f" ({len(repeated)} more repeat their data: the law is fitted on single-epoch runs)" if repeated else ""
        raise FitError(f"{len(base)} single-epoch points{extra} for a law of {len(PARAMETERS)} parameters",
                       f"give at least {len(PARAMETERS)} runs of at most one epoch, each with a validation loss "
                       "(replicates of one N and D count once)")

    def arrays(ps: list[RunPoint]) -> tuple[np.ndarray, ...]:
        return (np.array([p.params for p in ps], dtype=float), np.array([p.tokens for p in ps], dtype=float),
                np.array([p.flops for p in ps], dtype=float), np.array([p.loss for p in ps], dtype=float),
                np.array([np.nan if p.stderr is None else p.stderr for p in ps], dtype=float))

    n, d, c, loss, err = arrays(base)
    law = fit_law(n, d, loss, stderr=err, compute=c, grid=grid, bootstrap=bootstrap, percentile=percentile, seed=seed)
    iso = fit_isoflops(n, d, c, loss, stderr=err, tolerance=tolerance, bootstrap=bootstrap, percentile=percentile,
                       seed=seed)
    budgets = [float(np.exp(np.mean(np.log(c[idx])))) for idx in group_budgets(c, tolerance)]
    study = StudyFit(points=pooled, single_epoch=base, law=law, isoflops=iso, optimum=law.optimum(budgets),
                     repeated=repeated)
    if repeated:
        with_u = [p for p in base + repeated if p.unique_tokens]
        n2, d2, _, loss2, err2 = arrays(with_u)
        u2 = np.array([p.unique_tokens for p in with_u], dtype=float)
        study.repetition = fit_repetition(law.law, n2, d2, u2, loss2, stderr=err2, bootstrap=bootstrap,
                                          percentile=percentile, seed=seed)
    return study


__all__ = ["FitError", "StudyFit", "fit_study"]
