"""The ``rl-objective`` rule asks each objective's registration which ``stage.rl.algorithm``
trains it (:attr:`dlmspec.objectives.Objective.rl_algorithm`): the built-ins keep their findings,
and an objective that no algorithm trains gets a finding without a fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec import objectives
from dlmspec.check import find
from dlmspec.spec.load import load

ROOT = Path(__file__).resolve().parents[3]
KIND = "toy-without-rl"


class NoRl(objectives.Objective):
    kind = KIND
    attention = "causal"
    attentions = ("causal",)

    def dataset_extra_token(self, objective, stage_kind):
        return True


def _rl_findings(*overrides: str):
    spec = load(ROOT / "specs" / "demo-ar.toml", ['stage.kind="rl"', *overrides]).spec
    return [i for i in find(("spec", "runtime"), spec) if i.rule == "rl-objective"]


@pytest.mark.parametrize("kind, algorithm, message, fix", [
    ("ar", "diffu-grpo", "diffu-grpo is for mdm models, and objective.kind = 'ar'", "grpo"),
    ("mdm", "grpo", "grpo is for ar models, and objective.kind = 'mdm'", "diffu-grpo"),
])
def test_builtin_objectives_are_told_their_algorithm(kind: str, algorithm: str, message: str, fix: str) -> None:
    extra = ['objective.mask_token_id=50257'] if kind == "mdm" else []
    (finding,) = _rl_findings(f'objective.kind="{kind}"', f'stage.rl.algorithm="{algorithm}"', *extra)
    assert (finding.message, finding.hint, finding.fix.set) == (message, f"use algorithm = '{fix}'",
                                                                {"stage.rl.algorithm": fix})


def test_matching_algorithm_gives_no_finding() -> None:
    assert _rl_findings('stage.rl.algorithm="grpo"') == []


def test_objective_no_algorithm_trains_is_refused_without_a_remedy() -> None:
    objectives.register(NoRl())
    try:
        (finding,) = _rl_findings(f'objective.kind="{KIND}"', 'stage.rl.algorithm="grpo"')
    finally:
        objectives.unregister(KIND)
    assert finding.message == f"grpo is for ar models, and objective.kind = '{KIND}'"
    assert finding.hint == f"no RL algorithm trains objective.kind = '{KIND}'" and finding.fix is None
