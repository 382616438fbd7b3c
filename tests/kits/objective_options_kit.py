"""Helpers shared by tests (moved from test_objective_options.py): _objective_call, _rules."""

from __future__ import annotations

import ast
from typing import Any
import validate_kit
from dlmspec.check import find
from dlmspec.render.compile import render
from dlmspec.resolve import resolve


def _rules(changes: dict[str, Any], scopes=("spec", "runtime")) -> set[str]:
    return {i.rule for i in find(scopes, validate_kit.make(changes))}


def _objective_call(changes: dict[str, Any]) -> dict[str, Any]:
    files = render(resolve(validate_kit.make(changes)), "spec.toml")
    train = files["train.py"]
    tree = ast.parse(train)
    found: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("ObjectiveConfig", "TransformerConfig"):
            for kw in node.keywords:
                if kw.arg:
                    try:
                        found[f"{node.func.id}.{kw.arg}"] = ast.literal_eval(kw.value)
                    except ValueError:  # a name (F.silu, torch.bfloat16): not an option of this test
                        pass
    return found
