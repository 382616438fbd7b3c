"""the objective options through the compiler: the spec keys (``objective.eps = 0``,
``objective.min_masked_tokens``, ``objective.variable_length``, ``train.loss_normalization``),
their rules, the layer path they allow and what train.py receives; the bundled specs compile
byte-identically while they leave the options at their defaults (the defaults print nothing new)."""

from __future__ import annotations

import ast
import copy
from typing import Any

import pytest

import validate_kit
from dlmspec.check import find
from dlmspec.render.compile import render
from dlmspec.resolve import resolve, runtime_values

from objective_options_kit import (  # noqa: F401 (fixtures among them)
    _objective_call,
    _rules,
)

MEGADLMS = {"objective.eps": 0.0, "objective.loss_weighting": "realised", "objective.min_masked_tokens": 1,
            "objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch",
            "train.loss_normalization": "micro_batch"}




def test_megadlms_objective_is_accepted() -> None:
    spec = validate_kit.make(MEGADLMS)
    assert spec.objective.eps == 0.0 and spec.objective.min_masked_tokens == 1
    assert spec.objective.variable_length == "micro_batch" and spec.train.loss_normalization == "micro_batch"
    assert [i for i in find(("spec", "runtime"), spec) if i.severity == "error"] == []


def test_defaults_are_todays_behaviour() -> None:
    """Unset (None, so the locked spec and its content hash of every existing spec stay the same)
    means today's behaviour: no forced mask, a per-sequence cut, the global per-token mean."""
    spec = validate_kit.make({})
    assert (spec.objective.min_masked_tokens, spec.objective.variable_length, spec.train.loss_normalization) == (
        None, None, None)
    rt = runtime_values(resolve(spec))
    assert (rt.min_masked_tokens, rt.variable_length, rt.loss_normalization) == (0, "sequence", "global_token")
    assert rt.calculate_per_token_loss is True


def test_eps_zero_rule_reads_the_weighting() -> None:
    assert "mdm-eps-zero" in _rules({"objective.eps": 0.0})
    assert "mdm-eps-zero" not in _rules({"objective.eps": 0.0, "objective.loss_weighting": "realised"})
    assert "mdm-eps-zero" not in _rules({"objective.eps": 0.0, "objective.kind": "ar"})


def test_micro_batch_cut_runs_on_both_layer_paths() -> None:
    """A dense shorter micro-batch needs no key-padding mask: auto does not force the local
    layers, Transformer Engine is allowed, and context parallelism is not refused."""
    cut = {"objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch"}
    assert resolve(validate_kit.make(cut)).transformer_impl == "auto"
    assert resolve(validate_kit.make({"objective.variable_length_prob": 0.01})).transformer_impl == "local"
    assert not {r for r in _rules({**cut, "model.transformer_impl": "transformer_engine"}) if r.startswith("runtime-")}
    # a per-sequence cut runs on TE too (its padding mask; tests/unit/check/test_te_rules.py)
    assert not {r for r in _rules({"objective.variable_length_prob": 0.01, "model.transformer_impl": "transformer_engine"})
                if r.startswith("runtime-")}
    assert "cp-attention-mask" not in _rules({**cut, "parallel.context_parallel_size": 2})


def test_length_multiple_of_the_cut() -> None:
    """The cut length stays a multiple of what the layout splits the sequence by: 2 x CP
    (megatron's load-balanced CP halves), TP under sequence parallelism."""
    cut = {"objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch"}
    assert runtime_values(resolve(validate_kit.make(cut))).variable_length_multiple == 1
    assert runtime_values(resolve(validate_kit.make({**cut, "parallel.context_parallel_size": 2}))
                          ).variable_length_multiple == 4
    assert runtime_values(resolve(validate_kit.make(
        {**cut, "parallel.tensor_model_parallel_size": 2, "parallel.sequence_parallel": True}))
    ).variable_length_multiple == 2




def test_train_py_receives_the_options() -> None:
    got = _objective_call(MEGADLMS)
    assert got["ObjectiveConfig.eps"] == 0.0
    assert got["ObjectiveConfig.min_masked_tokens"] == 1
    assert got["ObjectiveConfig.variable_length"] == "micro_batch"
    assert got["ObjectiveConfig.loss_normalization"] == "micro_batch"
    assert got["TransformerConfig.calculate_per_token_loss"] is False
    plain = _objective_call({})
    assert "ObjectiveConfig.min_masked_tokens" not in plain and "ObjectiveConfig.loss_normalization" not in plain
    assert plain["TransformerConfig.calculate_per_token_loss"] is True
    seq = _objective_call({"train.loss_normalization": "sequence"})
    assert seq["ObjectiveConfig.loss_normalization"] == "sequence"
    assert seq["TransformerConfig.calculate_per_token_loss"] is False
