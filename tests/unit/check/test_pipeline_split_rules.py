"""The validator's rules of megatron-core's uneven pipeline splits (:mod:`dlmspec.check.pipeline`):
each refuses what megatron-core 0.16.1 refuses, names the key, and its fix, applied, validates with
no error at all; the uneven splits megatron-core builds validate clean."""

from __future__ import annotations

from typing import Any

import pytest

from dlmspec.check import find
from dlmspec.errors import SpecIssue
from dlmspec.spec.models import Spec
from spec_kit import apply, spec_dict

P = "parallel."

#: (rule, changes to an 8-GPU spec of 8 layers, the key it names)
FAILING: list[tuple[str, dict[str, Any], str]] = [
    ("pipeline-stage-layers-with-accounting", {P + "pipeline_model_parallel_size": 2,
                                               P + "num_layers_in_last_pipeline_stage": 4,
                                               P + "account_for_loss_in_pipeline_split": True},
     P + "num_layers_in_last_pipeline_stage"),
    ("pipeline-layout-alone", {P + "pipeline_model_parallel_size": 2, P + "pipeline_model_parallel_layout": "Et*4|t*4L",
                               P + "num_layers_in_first_pipeline_stage": 4}, P + "pipeline_model_parallel_layout"),
    ("pipeline-layout-grammar", {P + "pipeline_model_parallel_size": 2,
                                 P + "pipeline_model_parallel_layout": "Et*4|t*4 L"}, P + "pipeline_model_parallel_layout"),
    ("pipeline-layout-grammar", {P + "pipeline_model_parallel_size": 2,
                                 P + "pipeline_model_parallel_layout": "E(t|)*99999999999L"}, P + "pipeline_model_parallel_layout"),
    ("pipeline-layout-stages", {P + "pipeline_model_parallel_size": 4,
                                P + "pipeline_model_parallel_layout": "Et*3|t*3|t*2L"}, P + "pipeline_model_parallel_layout"),
    ("pipeline-layout-virtual-size", {P + "pipeline_model_parallel_size": 2,
                                      P + "virtual_pipeline_model_parallel_size": 4,
                                      P + "pipeline_model_parallel_layout": "Et*2|t*2|t*2|t*2L"},
     P + "virtual_pipeline_model_parallel_size"),
    ("pipeline-layout-layers", {P + "pipeline_model_parallel_size": 2,
                                P + "pipeline_model_parallel_layout": "Et*5|t*5L"}, P + "pipeline_model_parallel_layout"),
    ("pipeline-layout-layers", {P + "pipeline_model_parallel_size": 2,
                                P + "pipeline_model_parallel_layout": "Et*4|t*4"}, P + "pipeline_model_parallel_layout"),
    ("pipeline-stage-layers", {P + "pipeline_model_parallel_size": 2, P + "num_layers_in_first_pipeline_stage": 8},
     P + "num_layers_in_first_pipeline_stage"),
    ("pipeline-stage-layers", {P + "pipeline_model_parallel_size": 4, P + "num_layers_in_first_pipeline_stage": 1,
                               P + "num_layers_in_last_pipeline_stage": 2}, P + "num_layers_in_first_pipeline_stage"),
    ("pipeline-accounted-layers-divide", {P + "pipeline_model_parallel_size": 2,
                                          P + "account_for_loss_in_pipeline_split": True},
     P + "pipeline_model_parallel_size"),
    ("pipeline-accounted-layers-divide", {P + "pipeline_model_parallel_size": 2,
                                          P + "virtual_pipeline_model_parallel_size": 3,
                                          P + "account_for_embedding_in_pipeline_split": True,
                                          P + "account_for_loss_in_pipeline_split": True},
     P + "virtual_pipeline_model_parallel_size"),
]


def _data(changes: dict[str, Any]) -> dict[str, Any]:
    return spec_dict({"model.num_layers": 8}, changes)


def _errors(data: dict[str, Any]) -> list[SpecIssue]:
    return [i for i in find(("spec",), Spec.model_validate(data)) if i.severity == "error"]


@pytest.mark.parametrize(("rule", "changes", "key"), FAILING, ids=[f"{c[0]}-{i}" for i, c in enumerate(FAILING)])
def test_each_uneven_split_rule_refuses_and_its_remedy_validates(rule: str, changes: dict[str, Any], key: str) -> None:
    data = _data(changes)
    errors = _errors(data)
    (issue,) = [i for i in errors if i.rule == rule]
    assert issue.key == key and issue.message and issue.hint
    assert issue.fix is not None and issue.fix.text() in issue.hint
    apply(data, {**issue.fix.set, **{k: None for k in issue.fix.unset}})
    assert _errors(data) == [], [(i.rule, i.message) for i in _errors(data)]


def test_a_stage_count_remedy_moves_the_written_count_the_least() -> None:
    """8 layers on PP 4 with 3 on the first rank: 5 left over 3 ranks does not divide; 2 (6 / 3)
    is nearer 3 than 5 (3 / 3)."""
    (issue,) = [i for i in _errors(_data({P + "pipeline_model_parallel_size": 4,
                                          P + "num_layers_in_first_pipeline_stage": 3}))
                if i.rule == "pipeline-stage-layers"]
    assert issue.fix.set == {P + "num_layers_in_first_pipeline_stage": 2} and not issue.fix.unset


def test_a_broken_layout_is_replaced_by_the_accounted_layout_written_out() -> None:
    (issue,) = [i for i in _errors(_data({P + "pipeline_model_parallel_size": 2,
                                          P + "pipeline_model_parallel_layout": "Et*4|t*3L"}))
                if i.rule == "pipeline-layout-layers"]
    assert "3 transformer layers" not in issue.message and "7 transformer layers" in issue.message
    assert issue.fix.set == {P + "pipeline_model_parallel_layout": "Et*4|t*4L"}


@pytest.mark.parametrize("changes", [
    # 6 layers on PP 4: (6 + 2) / 4 = 2 per rank, the published recipes' balance
    {"model.num_layers": 6, P + "pipeline_model_parallel_size": 4, P + "account_for_embedding_in_pipeline_split": True,
     P + "account_for_loss_in_pipeline_split": True},
    # 14 layers on PP 4 x VPP 2 with accounting: (14 + 2) / 4 = 4 per rank, 2 per virtual stage
    {"model.num_layers": 14, P + "pipeline_model_parallel_size": 4, P + "virtual_pipeline_model_parallel_size": 2,
     P + "account_for_embedding_in_pipeline_split": True, P + "account_for_loss_in_pipeline_split": True},
    # 10 layers on PP 4 with 1 on the first and 3 on the last: 6 over 2 middle ranks
    {"model.num_layers": 10, P + "pipeline_model_parallel_size": 4, P + "num_layers_in_first_pipeline_stage": 1,
     P + "num_layers_in_last_pipeline_stage": 3},
    # 7 layers on PP 2 written out
    {"model.num_layers": 7, P + "pipeline_model_parallel_size": 2, P + "pipeline_model_parallel_layout": "Et*3|t*4L"},
    # 6 layers on PP 2 x VPP 2 written out, commas and repeats
    {"model.num_layers": 6, P + "pipeline_model_parallel_size": 2, P + "virtual_pipeline_model_parallel_size": 2,
     P + "pipeline_model_parallel_layout": "E,t|(t*2|)*2t,L"},
], ids=["accounting-pp4", "accounting-pp4-vpp2", "first-last", "layout", "layout-vpp2"])
def test_uneven_splits_megatron_core_builds_validate_clean(changes: dict[str, Any]) -> None:
    assert _errors(spec_dict(changes)) == []


def test_the_even_split_rule_offers_the_accounting_flags_that_keep_pp() -> None:
    (issue,) = [i for i in _errors(spec_dict({"model.num_layers": 6, P + "pipeline_model_parallel_size": 4}))
                if i.rule == "pp-divides-layers"]
    assert "keep PP 4" in issue.hint and "account_for_embedding_in_pipeline_split = true" in issue.hint
