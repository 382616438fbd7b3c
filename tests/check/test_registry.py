"""The issue registry (dlmspec.check.registry): every rule is described, each command's scopes
come from one table, issues come in one order, and ``dlmspec show --rules`` lists every rule."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dlmspec.check import RULES, SCOPE_NAMES
from dlmspec.cli import app


def test_show_rules_lists_every_rule_with_its_scope() -> None:
    """The loader's, the spec's, the files', SLURM's, memory's and the runtime's rules, by scope."""
    result = CliRunner().invoke(app, ["show", "--rules", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert sorted(r["id"] for r in rows) == sorted(RULES)
    assert {r["id"]: (r["scope"], r["severity"], r["source"], r["summary"], r["fix"]) for r in rows} == {
        r.id: (r.scope, r.severity, r.source, r.summary, r.fix) for r in RULES.values()}
    scopes = [r["scope"] for r in rows]
    assert scopes == sorted(scopes, key=SCOPE_NAMES.index) and set(scopes) == set(SCOPE_NAMES)
    table = CliRunner().invoke(app, ["show", "--rules"])
    assert table.exit_code == 0
    for rule_id in ("schema", "tp-divides-heads", "path-not-found", "slurm-secret", "memory-fits", "runtime-sft"):
        assert rule_id in table.stdout
