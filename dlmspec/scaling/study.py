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

A study whose runs train different objectives (AR and a diffusion LM side by side) is several
studies: :func:`fit_objectives` fits each objective's runs on their own (a law, parabolas and
optimum each), every run of an objective with the same loss source
(:func:`dlmspec.scaling.runs.select_loss`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlmspec.scaling.isoflop import BUDGET_TOLERANCE, IsoFlopFit, fit_isoflops, group_budgets
from dlmspec.scaling.law import PARAMETERS, FitError, LawFit, fit_law
from dlmspec.scaling.repetition import RepetitionFit, fit_repetition
from dlmspec.scaling.runs import Pooled, RunPoint, Skipped, by_objective, pool_replicates, select_loss

#: A run whose epochs exceed this repeats its data. The margin above one epoch is rounding: a cap
#: keeps whole documents and a run ends on a whole step, so a one-epoch design lands a little above
#: 1 (the bundled data-constrained pair: 1.0002 epochs); 1% more tokens than unique tokens is still
#: read as one epoch (Muennighoff et al. 2023's repetition term, R = epochs - 1, is then < 0.01).
SINGLE_EPOCH = 1.01


def is_single_epoch(point: RunPoint) -> bool:
    """Whether ``point`` counts as a run of at most one epoch (unknown epochs count as one)."""
    return point.epochs is None or point.epochs <= SINGLE_EPOCH


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
    objective: str | None = None
    loss_source: str | None = None
    loss_why: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``points``, ``law``, ``isoflops``, ``optimum``, ``data_constrained``, and
        ``objective`` (the runs' objective kind) with ``loss`` (``{"source": "eval" | "valid",
        "why": ...}``) when :func:`fit_objectives` made it."""
        return {"points": [dict(p.point.as_dict(), replicates=p.replicates) for p in self.points],
                "law": self.law.as_dict(), "isoflops": self.isoflops.as_dict(), "optimum": self.optimum,
                "data_constrained": self.repetition.as_dict() if self.repetition else None,
                "objective": self.objective, "loss": {"source": self.loss_source, "why": self.loss_why}}


@dataclass
class ObjectiveFits:
    """:func:`fit_objectives`' answer: ``fits`` (objective kind -> its :class:`StudyFit`),
    ``failed`` (objective kind -> the :class:`~dlmspec.scaling.law.FitError` that kept it from a
    fit), ``skipped`` (runs left out because they lack the loss source their objective uses) and
    ``left_out`` (runs of objectives other than the one asked for)."""

    fits: dict[str, StudyFit]
    failed: dict[str, FitError]
    skipped: list[Skipped]
    left_out: list[RunPoint]


def fit_objectives(points: list[RunPoint], *, loss: str = "auto", objective: str | None = None,
                   **options: Any) -> ObjectiveFits:
    """Fit each objective's points on their own (:func:`~dlmspec.scaling.runs.by_objective`):
    one loss source for all the runs of an objective (:func:`~dlmspec.scaling.runs.select_loss`,
    ``loss``: ``auto``, ``eval`` or ``valid``), then :func:`fit_study` (``options``: its keyword
    arguments). ``objective``: fit only that kind (the other runs go to ``left_out``).

    An objective with too few points is in ``failed`` with why; the others are fitted.
    """
    groups = by_objective(points)
    left_out: list[RunPoint] = []
    if objective is not None:
        left_out = [p for kind, ps in groups.items() if kind != objective for p in ps]
        groups = {objective: groups.get(objective, [])}
    answer = ObjectiveFits(fits={}, failed={}, skipped=[], left_out=left_out)
    for kind, members in groups.items():
        chosen, skipped, used, why = select_loss(members, loss)
        answer.skipped += skipped
        try:
            fit = fit_study(chosen, **options)
        except FitError as exc:
            answer.failed[kind] = exc
            continue
        fit.objective, fit.loss_source, fit.loss_why = kind, used, why
        answer.fits[kind] = fit
    return answer


def fit_study(points: list[RunPoint], *, bootstrap: int = 200, percentile: float = 95.0, seed: int = 0,
              grid: dict[str, Any] | None = None, tolerance: float = BUDGET_TOLERANCE) -> StudyFit:
    """Fit a study's points (the module docstring).

    Raises:
        FitError: fewer single-epoch points than the law's 5 parameters.
    """
    pooled = pool_replicates(points)
    base = [p.point for p in pooled if is_single_epoch(p.point)]
    repeated = [p.point for p in pooled if not is_single_epoch(p.point)]
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


__all__ = ["FitError", "ObjectiveFits", "StudyFit", "fit_objectives", "fit_study"]
