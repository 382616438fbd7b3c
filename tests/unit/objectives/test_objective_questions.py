"""The questions modules ask an objective's registration instead of comparing its kind with a
name (dlmspec.objectives.Objective): the built-ins answer them as the names did, a toy objective
answers for itself, and the helpers for values read from files refuse what is not a registered
kind without raising."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from dlmspec import objectives

MDM, AR = objectives.get("mdm"), objectives.get("ar")


def test_builtins_say_how_they_are_sampled_scored_and_trained_by_rl() -> None:
    assert (MDM.diffusion, MDM.predicts_next_token, MDM.rl_algorithm, MDM.adjective) == (
        True, False, "diffu-grpo", "masked-diffusion")
    assert (AR.diffusion, AR.predicts_next_token, AR.rl_algorithm, AR.adjective) == (
        False, True, "grpo", "autoregressive")
    assert MDM.attentions == ("bidirectional", "block_causal") and AR.attentions == ("causal",)


@pytest.mark.parametrize("variable_length, prob", list(itertools.product([None, "sequence", "micro_batch"], [0.0, 0.25])))
def test_variable_length_answers_match_the_settings(variable_length: Any, prob: float) -> None:
    o = SimpleNamespace(variable_length=variable_length, variable_length_prob=prob)
    assert MDM.variable_length_prob(o) == prob
    assert MDM.micro_batch_variable_length_prob(o) == (prob if variable_length == "micro_batch" else 0.0)
    assert MDM.masked_variable_length_prob(o) == (prob if variable_length in (None, "sequence") else 0.0)
    # next-token prediction never cuts a sequence, whatever the shared table holds
    assert (AR.variable_length_prob(o), AR.micro_batch_variable_length_prob(o), AR.masked_variable_length_prob(o)) == (
        0.0, 0.0, 0.0)


@pytest.mark.parametrize("value", [None, 3, ["mdm"], {"kind": "mdm"}, "MDM", "mdm ", ""])
def test_lookups_of_untrusted_values_answer_none_without_raising(value: Any) -> None:
    assert objectives.find(value) is None
    assert objectives.is_diffusion(value) is False


def test_kind_lists_in_messages_follow_the_registry() -> None:
    assert objectives.kinds_text() == "mdm, ar or bd3lm"
    assert objectives.kinds_text("--kind ") == "--kind mdm, --kind ar or --kind bd3lm"

    class Toy(objectives.Objective):
        kind = "toy-unmasking"
        diffusion = True
        predicts_next_token = False

    objectives.register(Toy())
    try:
        assert objectives.kinds_text("kind=") == "kind=mdm, kind=ar, kind=bd3lm or kind=toy-unmasking"
        assert objectives.is_diffusion("toy-unmasking") and objectives.find("toy-unmasking").rl_algorithm == ""
    finally:
        objectives.unregister("toy-unmasking")
    assert objectives.find("toy-unmasking") is None
