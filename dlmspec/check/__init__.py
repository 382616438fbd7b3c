"""Every check of a spec, in one registry (:mod:`dlmspec.check.registry`): rules with an id, a
severity, the source they mirror and a fix, collected for each command from one table of scopes
(:data:`SCOPES`) and sorted one way (:func:`sort_key`).

``spec -> Resolved -> check -> plan -> render``: ``dlmspec validate`` reports
``issues_for("validate", ...)`` and ``dlmspec compile`` refuses on ``issues_for("compile", ...)``,
the same scopes. The rules live by concern in the modules below; importing this package
registers all of them. Nothing here imports the compiler, jinja2, torch or megatron.
"""

from __future__ import annotations

# The modules register their rules on import, in this order (the order of RULES).
from dlmspec.check import load  # noqa: F401
from dlmspec.check import parallel  # noqa: F401
from dlmspec.check import pipeline  # noqa: F401
from dlmspec.check import sequence  # noqa: F401
from dlmspec.check import moe  # noqa: F401
from dlmspec.check import recompute  # noqa: F401
from dlmspec.check import precision  # noqa: F401
from dlmspec.check import optimizer  # noqa: F401
from dlmspec.check import objective  # noqa: F401
from dlmspec.check import block_diffusion  # noqa: F401
from dlmspec.check import tokenizer  # noqa: F401
from dlmspec.check import mask  # noqa: F401
from dlmspec.check import schedule  # noqa: F401
from dlmspec.check import data  # noqa: F401
from dlmspec.check import stage  # noqa: F401
from dlmspec.check import sft  # noqa: F401
from dlmspec.check import rl  # noqa: F401
from dlmspec.check import generate  # noqa: F401
from dlmspec.check import eval_generation  # noqa: F401
from dlmspec.check import strings  # noqa: F401
from dlmspec.check import paths  # noqa: F401
from dlmspec.check import slurm  # noqa: F401
from dlmspec.check import memory  # noqa: F401
from dlmspec.check import runtime  # noqa: F401
from dlmspec.check.registry import (
    RULES,
    SCOPE_NAMES,
    SCOPES,
    Context,
    Finding,
    Fix,
    Rule,
    find,
    issues_for,
    load_for,
    rule,
    sort_key,
    with_rule_issues,
)

__all__ = [
    "Context",
    "Finding",
    "Fix",
    "RULES",
    "Rule",
    "SCOPES",
    "SCOPE_NAMES",
    "find",
    "issues_for",
    "load_for",
    "rule",
    "sort_key",
    "with_rule_issues",
]
