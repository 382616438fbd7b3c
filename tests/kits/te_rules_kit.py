"""Helpers shared by tests (moved from test_te_rules.py): BASE, FP8, SCOPES, TE, issues, rules, spec."""

from __future__ import annotations

import copy
from typing import Any
from dlmspec.check import find
from dlmspec.spec.models import Spec
from spec_kit import spec_dict


SCOPES = ("spec", "runtime")


#: A valid spec of 8 H100s: vocab 1000, hidden 256, head dim 32, mock data.
BASE: dict[str, Any] = spec_dict()


TE = {"model.transformer_impl": "transformer_engine"}


FP8 = {"precision.fp8": "hybrid"}


def spec(changes: dict[str, Any]) -> Spec:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return Spec.model_validate(data)


def issues(changes: dict[str, Any], severity: str | None = None) -> list:
    return [i for i in find(SCOPES, spec(changes)) if severity is None or i.severity == severity]


def rules(changes: dict[str, Any], severity: str | None = None) -> set[str]:
    return {i.rule for i in issues(changes, severity)}
