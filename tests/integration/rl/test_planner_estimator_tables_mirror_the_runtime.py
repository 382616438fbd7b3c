"""The planner's tables of RL estimators (dlmspec/plan/rl.py, which imports no torch) say what the
runtime's estimators (backends/rl/estimators.py) do: which algorithm runs which estimator, and which
estimators draw nothing (``deterministic``: their old-policy and reference passes are made once per
rollout batch, and planned so)."""

from __future__ import annotations

from dlmspec.plan import rl as plan_rl


def test_the_deterministic_estimators_are_the_runtimes() -> None:
    from dlmspec.backends.rl import estimators

    runtime = {name for name in estimators.names() if estimators.get(name).deterministic}
    assert plan_rl.DETERMINISTIC_ESTIMATORS == runtime


def test_each_algorithm_runs_the_runtimes_estimator() -> None:
    from dlmspec.backends.rl import rollout

    assert plan_rl.ALGORITHM_ESTIMATOR == rollout.ALGORITHM_ESTIMATOR
