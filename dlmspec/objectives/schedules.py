"""Masking schedules of masked diffusion: ``alpha(t)``, its derivative and the ELBO weight.

``alpha(t)`` is the probability that a token is still clean at time ``t`` in ``[0, 1]``
(``alpha(0) = 1``: nothing masked; ``alpha(1) = 0``: everything masked); a token is masked with
probability ``1 - alpha(t)``. The continuous-time negative ELBO of MDLM (Sahoo et al. 2024,
arXiv:2406.07524, eq. 10) weights the masked tokens' cross entropy at time ``t`` by

    w(t) = -alpha'(t) / (1 - alpha(t)),

and its value does not depend on the schedule (MDLM sec. 3.2: the NELBO is invariant to the
functional form of ``alpha``), only the variance of its Monte-Carlo estimate does.

The schedules (``objective.noise_schedule``):

* ``"linear"``: ``alpha(t) = 1 - t``, ``w(t) = 1 / t``: LLaDA (arXiv:2502.09992 eq. 3), MDLM's
  log-linear schedule in its alpha form; dllm's ``LinearAlphaScheduler``
  (ZHZisZZ/dllm@2d962f3 ``dllm/core/schedulers/alpha.py``).
* ``"cosine"``: ``alpha(t) = 1 - cos(pi/2 (1 - t))``, ``w(t) = pi/2 tan(pi/2 (1 - t))``: dllm's
  ``CosineAlphaScheduler`` (same file) and MD4's cosine schedule (Shi et al. 2024,
  arXiv:2406.04329, table of schedules).
* ``"polynomial"``: ``alpha(t) = 1 - t^a`` with ``a = objective.noise_schedule_exponent > 0``,
  ``w(t) = a / t``: MD4's polynomial schedule (arXiv:2406.04329, same table); ``a = 1`` is
  ``"linear"``.

Every formula is written once, on a namespace of ``cos``/``sin``/``tan`` (:mod:`math` for floats,
``torch`` for tensors), so the compiler (no torch) and the runtime (training loss, the sampler's
transfer schedule, eval's ELBO) evaluate the same expressions. ``t`` is dimensionless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Tuple

#: The ``objective.noise_schedule`` values.
SCHEDULES = ("linear", "cosine", "polynomial")
#: ``objective.noise_schedule_exponent`` unset (``"polynomial"`` only): 1, the linear schedule.
POLYNOMIAL_EXPONENT_DEFAULT = 1.0

_HALF_PI = math.pi / 2


# Each schedule is (1 - alpha(t), alpha'(t)): the masked share is written directly, so the weight's
# denominator 1 - alpha(t) is not 1 - (1 - x) (which cancels at small t).
_FORMULAS: Dict[str, Tuple[Callable[[Any, float, Any], Any], Callable[[Any, float, Any], Any]]] = {
    "linear": (lambda t, a, ops: t, lambda t, a, ops: -1 + 0 * t),
    "cosine": (lambda t, a, ops: ops.cos(_HALF_PI * (1 - t)), lambda t, a, ops: -_HALF_PI * ops.sin(_HALF_PI * (1 - t))),
    "polynomial": (lambda t, a, ops: t ** a, lambda t, a, ops: -a * t ** (a - 1)),
}


@dataclass(frozen=True)
class MaskingSchedule:
    """One masking schedule (see the module docstring for the formulas and their sources).

    Attributes:
        name: one of :data:`SCHEDULES`.
        exponent: ``"polynomial"``'s ``a`` (> 0); ignored by the others.

    Raises:
        ValueError: an unknown name or an exponent that is not a finite number > 0.
    """

    name: str = "linear"
    exponent: float = POLYNOMIAL_EXPONENT_DEFAULT

    def __post_init__(self) -> None:
        if self.name not in _FORMULAS:
            raise ValueError(f"noise_schedule must be one of {SCHEDULES}, got {self.name!r}")
        a = float(self.exponent)
        if not (math.isfinite(a) and a > 0):
            raise ValueError(f"noise_schedule_exponent must be a finite number > 0, got {self.exponent!r}")

    @property
    def is_linear(self) -> bool:
        """``alpha(t) = 1 - t`` exactly (``"linear"``, or ``"polynomial"`` with exponent 1)."""
        return self.name == "linear" or (self.name == "polynomial" and float(self.exponent) == 1.0)

    def alpha(self, t: Any, ops: Any = math) -> Any:
        """``alpha(t)``, the probability a token is clean at ``t`` (float or tensor, as ``t``)."""
        return 1 - _FORMULAS[self.name][0](t, float(self.exponent), ops)

    def alpha_derivative(self, t: Any, ops: Any = math) -> Any:
        """``d alpha / dt`` at ``t`` (<= 0)."""
        return _FORMULAS[self.name][1](t, float(self.exponent), ops)

    def mask_probability(self, t: Any, ops: Any = math) -> Any:
        """``1 - alpha(t)``: each token is masked with it at time ``t``."""
        return _FORMULAS[self.name][0](t, float(self.exponent), ops)

    def weight(self, t: Any, ops: Any = math) -> Any:
        """The ELBO weight ``-alpha'(t) / (1 - alpha(t))`` (MDLM eq. 10), for ``t`` in ``(0, 1]``
        (infinite at ``t = 0``: the samplers draw ``t >= eps``)."""
        masked, derivative = (f(t, float(self.exponent), ops) for f in _FORMULAS[self.name])
        return -derivative / masked

    def to_record(self) -> Dict[str, Any]:
        """``{"noise_schedule": name}`` plus ``"noise_schedule_exponent"`` for ``"polynomial"``."""
        record: Dict[str, Any] = {"noise_schedule": self.name}
        if self.name == "polynomial":
            record["noise_schedule_exponent"] = float(self.exponent)
        return record


LINEAR = MaskingSchedule("linear")


def masking_schedule(name: str | None = None, exponent: float | None = None) -> MaskingSchedule:
    """The :class:`MaskingSchedule` of ``objective.noise_schedule`` / ``noise_schedule_exponent``
    (unset: ``"linear"`` / :data:`POLYNOMIAL_EXPONENT_DEFAULT`).

    Raises:
        ValueError: as :class:`MaskingSchedule`.
    """
    return MaskingSchedule(name or "linear",
                           POLYNOMIAL_EXPONENT_DEFAULT if exponent is None else float(exponent))
