"""The optimizer-state rules (dlmspec/check/optimizer.py): each fires on a spec megatron-core or
Megatron-LM would refuse, names the key and a fix, and the fix applied gives a spec without errors."""

from __future__ import annotations

from typing import Any

import pytest

from dlmspec.check import find
from dlmspec.errors import Fix
from dlmspec.spec.models import Spec
from spec_kit import spec_dict

SCOPES = ("spec", "runtime")

#: (rule, changes of the spec_kit default that break it, key the finding names)
FAILING: list[tuple[str, dict[str, Any], str]] = [
    ("precision-aware-needs-adam", {"train.use_precision_aware_optimizer": True, "train.optimizer": "sgd"},
     "train.optimizer"),
    ("precision-aware-needs-distributed-optimizer",
     {"train.use_precision_aware_optimizer": True, "parallel.use_distributed_optimizer": False},
     "parallel.use_distributed_optimizer"),
    ("optimizer-dtypes-need-precision-aware", {"train.exp_avg_sq_dtype": "fp8"}, "train.exp_avg_sq_dtype"),
    ("optimizer-dtypes-need-precision-aware", {"train.main_grads_dtype": "bf16"}, "train.main_grads_dtype"),
    ("main-grads-dtype-grad-buffer", {"train.use_precision_aware_optimizer": True, "train.main_grads_dtype": "bf16"},
     "train.main_grads_dtype"),
    ("cpu-offload-needs-precision-aware", {"train.optimizer_cpu_offload": True, "train.optimizer": "sgd",
                                           "parallel.use_distributed_optimizer": False}, "train.optimizer_cpu_offload"),
    ("cpu-offload-state-dtypes", {"train.use_precision_aware_optimizer": True, "train.optimizer_cpu_offload": True,
                                  "train.main_params_dtype": "fp16"}, "train.main_params_dtype"),
    ("optimizer-state-fsdp", {"train.use_precision_aware_optimizer": True, "parallel.fsdp": "megatron",
                              "parallel.data_parallel_sharding_strategy": "optim", "kernels.cross_entropy": "megatron"},
     "parallel.fsdp"),
]


def _apply(data: dict[str, Any], fix: Fix) -> dict[str, Any]:
    for key in fix.unset:
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.get(part, {})
        node.pop(last, None)
    for key, value in fix.set.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


@pytest.mark.parametrize(("rule", "changes", "key"), FAILING, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(FAILING)])
def test_optimizer_state_rule_fires_and_its_remedy_validates(rule: str, changes: dict[str, Any], key: str) -> None:
    data = spec_dict({"model.transformer_impl": "transformer_engine", **changes})
    issues = [i for i in find(SCOPES, Spec.model_validate(data)) if i.rule == rule]
    assert [(i.key, i.severity) for i in issues] == [(key, "error")]
    issue = issues[0]
    assert issue.fix is not None and issue.hint and issue.source
    fixed = Spec.model_validate(_apply(data, issue.fix))
    errors = [i for i in find(SCOPES, fixed) if i.severity == "error"]
    assert errors == [], [(i.rule, i.key, i.message) for i in errors]


def test_precision_aware_optimizer_on_local_layers_warns_that_transformer_engine_is_still_needed() -> None:
    data = spec_dict({"model.transformer_impl": "local", "train.use_precision_aware_optimizer": True,
                      "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16"})
    (issue,) = [i for i in find(SCOPES, Spec.model_validate(data)) if i.rule == "precision-aware-needs-transformer-engine"]
    assert issue.severity == "warning" and "FusedAdam" in issue.message and "local" in issue.message
    assert "install Transformer Engine" in issue.hint
    fixed = Spec.model_validate(_apply(data, issue.fix))
    assert not [i for i in find(SCOPES, fixed) if i.rule.startswith(("precision-aware", "optimizer-", "cpu-offload"))]


def test_cpu_offload_does_not_silence_the_transformer_engine_warning() -> None:
    """megatron-core 0.16.1 calls is_te_min_version before its CPU-offload early return: a machine
    without Transformer Engine fails either way, so the warning stays and says so."""
    data = spec_dict({"model.transformer_impl": "local", "train.use_precision_aware_optimizer": True,
                      "train.optimizer_cpu_offload": True})
    (issue,) = [i for i in find(SCOPES, Spec.model_validate(data)) if i.rule == "precision-aware-needs-transformer-engine"]
    assert "importable" in issue.message and "offload" in issue.message


def test_transformer_engine_layers_need_no_warning_for_the_optimizer() -> None:
    data = spec_dict({"model.transformer_impl": "transformer_engine", "train.use_precision_aware_optimizer": True})
    assert not [i for i in find(SCOPES, Spec.model_validate(data)) if i.rule == "precision-aware-needs-transformer-engine"]


def test_offload_keys_without_offload_are_reported_as_ignored() -> None:
    data = spec_dict({"train.optimizer_offload_fraction": 0.25, "train.overlap_cpu_optimizer_d2h_h2d": True})
    found = {(i.rule, i.key, i.severity) for i in find(SCOPES, Spec.model_validate(data))}
    assert {("optimizer-keys-ignored", "train.optimizer_offload_fraction", "warning"),
            ("optimizer-keys-ignored", "train.overlap_cpu_optimizer_d2h_h2d", "warning")} <= found


@pytest.mark.parametrize(("key", "value"), [("train.exp_avg_dtype", "int8"), ("train.main_params_dtype", "bf16"),
                                            ("train.main_grads_dtype", "fp16"), ("train.optimizer_offload_fraction", 0.0),
                                            ("train.optimizer_offload_fraction", 1.5)])
def test_state_values_megatron_cannot_take_are_refused_by_the_schema(key: str, value: Any) -> None:
    """Megatron-LM's choices (--main-params-dtype fp32/fp16, --main-grads-dtype fp32/bf16, moments
    fp32/fp16/bf16/fp8; TE FusedAdam refuses a bf16 master) and an offload share in (0, 1]."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Spec.model_validate(spec_dict({key: value}))
