"""Validate's attention-backend rule (dlmspec/check/mask.py attention-backend-masks) and the table it
reads (dlmspec/attention.py): a combination no backend runs is refused, naming the one that would."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dlmspec.attention import BACKENDS, MASK_KINDS, backends_running, choose_backend, refused_kinds
from dlmspec.check import find
from dlmspec.resolve import resolve
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

BASE: dict[str, Any] = spec_dict()
CP2 = {"parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather"}


def spec(changes: dict[str, Any]) -> Spec:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return Spec.model_validate(data)


def backend_issues(changes: dict[str, Any]) -> list:
    return [i for i in find(("spec", "runtime"), spec(changes)) if i.rule == "attention-backend-masks"]


def test_flex_under_context_parallelism_is_refused_naming_sdpa():
    (issue,) = backend_issues({"model.attention_backend": "flex", **CP2})
    assert issue.severity == "error" and issue.key == "model.attention_backend"
    assert "under context parallelism" in issue.message
    assert issue.fix.set == {"model.attention_backend": "sdpa"} and "sdpa" in issue.hint


def test_flex_with_attention_dropout_is_refused_naming_sdpa():
    (issue,) = backend_issues({"model.attention_backend": "flex", "model.attention_dropout": 0.1})
    assert issue.key == "model.attention_dropout" and "attention dropout" in issue.message
    assert issue.fix.set == {"model.attention_backend": "sdpa"}


def test_local_backend_on_transformer_engine_layers_is_refused():
    (issue,) = backend_issues({"model.attention_backend": "flex", "model.transformer_impl": "transformer_engine"})
    assert issue.fix.set == {"model.transformer_impl": "local"}


@pytest.mark.parametrize("changes", [
    {"model.attention_backend": "flex"},
    {"model.attention_backend": "flex", "objective.attention_mask": "block_causal", "objective.block_size": 64},
    {"model.attention_backend": "flex", "data.reset_attention_mask": True},
    {"model.attention_backend": "sdpa", **CP2},
    {"model.attention_backend": "auto", **CP2},
    {},
])
def test_backends_that_run_the_masks_pass(changes):
    assert backend_issues(changes) == []


def test_flex_takes_the_local_layers_under_auto():
    r = resolve(spec({"model.attention_backend": "flex"}))
    assert r.transformer_impl == "local"


def test_table_keeps_transformer_engine_and_context_parallel_refusals():
    assert refused_kinds("te", ["block_causal", "document"]) == ["block_causal", "document"]
    assert refused_kinds("te", ["bidirectional", "key_padding"]) == []
    assert backends_running(["key_padding"], context_parallel=True) == []
    assert backends_running(["block_causal"], context_parallel=True) == ["sdpa"]
    assert backends_running(["mask_mod"]) == ["sdpa", "flex"]
    assert set(BACKENDS["flex"].runs) == set(MASK_KINDS)


def test_auto_chooses_flex_for_the_masks_it_runs_faster():
    assert choose_backend(None, ["bidirectional"]) == "sdpa"
    assert choose_backend(None, ["block_causal"]) == "sdpa"  # unset: SDPA, as before
    assert choose_backend("auto", ["bidirectional"]) == "sdpa"
    assert choose_backend("auto", ["causal"]) == "sdpa"
    assert choose_backend("auto", ["bidirectional", "document"]) == "sdpa"  # per-batch masks: the layer's pattern decides
    assert choose_backend("auto", ["block_causal"]) == "flex"
    assert choose_backend("auto", ["bidirectional", "mask_mod"]) == "flex"
    assert choose_backend("auto", ["block_causal"], context_parallel=True) == "sdpa"
    assert choose_backend("auto", ["bidirectional"], context_parallel=True) == "sdpa"
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        choose_backend("cudnn", ["bidirectional"])


@pytest.mark.parametrize("backend", ["flex", "auto"])
def test_train_py_builds_the_layers_with_the_named_backend(backend):
    from dlmspec.render.compile import render

    import ast

    files = render(resolve(spec({"model.attention_backend": backend})), "t.toml")
    ast.parse(files["train.py"])
    assert f"attention_backend={backend!r},  # [model] attention_backend" in files["train.py"]
    assert "attention_backend=" not in render(resolve(spec({})), "t.toml")["train.py"]
