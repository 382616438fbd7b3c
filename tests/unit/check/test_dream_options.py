"""Dream's objective options through the compiler: ``objective.shift`` and
``objective.loss_weighting = "cart"`` with ``objective.cart_p``: the keys, their defaults (unset:
today's behaviour and today's bytes), their rules and what train.py receives."""

from __future__ import annotations

import pydantic
import pytest

import validate_kit
from objective_options_kit import _objective_call, _rules
from dlmspec.resolve import resolve, runtime_values

DREAM = {"objective.shift": True, "objective.loss_weighting": "cart"}


def test_dream_objective_is_accepted_and_cart_p_defaults_to_dreams() -> None:
    spec = validate_kit.make(DREAM)
    assert spec.objective.shift is True and spec.objective.loss_weighting == "cart"
    assert spec.objective.cart_p is None
    rt = runtime_values(resolve(spec))
    # DreamLM's trainers' config default (Dream-Coder instruct/src/trainer/config/sft_trainer.yaml:57)
    assert (rt.shift, rt.cart_p) == (True, 0.1)
    assert not {r for r in _rules(DREAM)}


def test_unset_is_todays_behaviour() -> None:
    spec = validate_kit.make({})
    assert (spec.objective.shift, spec.objective.cart_p) == (None, None)
    rt = runtime_values(resolve(spec))
    assert (rt.shift, rt.cart_p) == (False, None)
    plain = _objective_call({})
    assert "ObjectiveConfig.shift" not in plain and "ObjectiveConfig.cart_p" not in plain


def test_train_py_receives_shift_and_cart_p() -> None:
    got = _objective_call({**DREAM, "objective.cart_p": 0.3})
    assert got["ObjectiveConfig.shift"] is True
    assert got["ObjectiveConfig.loss_weighting"] == "cart"
    assert got["ObjectiveConfig.cart_p"] == 0.3
    assert _objective_call(DREAM)["ObjectiveConfig.cart_p"] == 0.1


@pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.1])
def test_cart_p_out_of_range_is_refused(bad: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="cart_p"):
        validate_kit.make({**DREAM, "objective.cart_p": bad})


def test_rules() -> None:
    assert "mdm-cart-p-ignored" in _rules({"objective.cart_p": 0.2})
    assert "mdm-cart-p-ignored" not in _rules({**DREAM, "objective.cart_p": 0.2})
    assert "mdm-shift-ar" in _rules({"objective.kind": "ar", "objective.shift": True})
    assert "mdm-shift-ar" not in _rules({"objective.kind": "ar"})
    # CART has no 1/t: eps = 0 is safe with it (mdm-eps-zero reads the llada weighting only)
    assert "mdm-eps-zero" not in _rules({**DREAM, "objective.eps": 0.0})


# ---------------------------------------------------------------- MegaDLMs' window: objective.unshift
def test_unshift_reaches_train_py_and_defaults_off() -> None:
    assert validate_kit.make({}).objective.unshift is None
    assert runtime_values(resolve(validate_kit.make({}))).unshift is False
    assert "ObjectiveConfig.unshift" not in _objective_call({})
    assert _objective_call({"objective.unshift": True})["ObjectiveConfig.unshift"] is True
    assert not _rules({"objective.unshift": True})


def test_unshift_rules() -> None:
    assert "mdm-unshift-ar" in _rules({"objective.kind": "ar", "objective.unshift": True})
    # s - 1 positions: no pipeline (activations of seq_length positions), and a length the layout splits
    assert "mdm-unshift-layout" in _rules({"objective.unshift": True, "parallel.pipeline_model_parallel_size": 2})
    assert "mdm-unshift-layout" in _rules({"objective.unshift": True, "parallel.context_parallel_size": 2})
    assert "mdm-unshift-layout" not in _rules({"objective.unshift": True})


def test_unshift_layout_remedy_names_what_works() -> None:
    """The MegaDLMs spec (PP 1, micro batch 4, seq 2048) with TE fp8: 4 x 2047 rows is no multiple of 8.
    The fix names what works there (micro batch 8, or no fp8), not pipeline parallelism, which is already 1."""
    from dlmspec.check import find
    from dlmspec.spec.load import load
    from pathlib import Path

    spec = load(Path(__file__).resolve().parents[3] / "specs" / "megadlms-1.7b-mdm.toml",
                ['model.transformer_impl="transformer_engine"', 'precision.fp8="hybrid"']).spec
    assert spec.parallel.pipeline_model_parallel_size == 1 and spec.train.micro_batch_size == 4
    [issue] = [i for i in find(("spec", "runtime"), spec) if i.rule == "mdm-unshift-layout"]
    assert "pipeline" not in issue.message and "pipeline" not in issue.hint
    assert "train.micro_batch_size = 8" in issue.hint and 'precision.fp8 = "none"' in issue.hint
    fixed = load(Path(__file__).resolve().parents[3] / "specs" / "megadlms-1.7b-mdm.toml",
                 ['model.transformer_impl="transformer_engine"', 'precision.fp8="hybrid"', "train.micro_batch_size=8"]).spec
    assert "mdm-unshift-layout" not in {i.rule for i in find(("spec", "runtime"), fixed)}
    # with PP 2 as well, the fix names both changes
    piped = {"objective.unshift": True, "parallel.pipeline_model_parallel_size": 2}
    [issue] = [i for i in find(("spec", "runtime"), validate_kit.make(piped)) if i.rule == "mdm-unshift-layout"]
    assert "parallel.pipeline_model_parallel_size = 1" in issue.hint


def test_shift_written_when_set() -> None:
    """An explicit shift = false (MegaDLMs' spec says so) reaches train.py; unset writes nothing."""
    assert _objective_call({"objective.shift": False})["ObjectiveConfig.shift"] is False
