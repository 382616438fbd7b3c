"""A spec with schema errors cannot be resolved, so the cross-field, layout and memory checks wait for
it to parse: the summary line says so (a first-time user took "every problem at once" to include the
layout error that appeared only after the schema errors were fixed)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

DEMO = Path(__file__).resolve().parents[3] / "specs" / "demo-dlm.toml"
LATER = "the cross-field rules, layout and memory checks run once the schema errors are fixed"


def test_a_schema_error_summary_says_the_other_checks_come_after() -> None:
    result = CliRunner().invoke(app, ["validate", str(DEMO), "--set", 'data.train="corpus"'])
    assert result.exit_code == 2
    assert "a list is expected, not a single value" in result.output and LATER in result.output


def test_a_summary_without_schema_errors_has_no_such_note() -> None:
    result = CliRunner().invoke(app, ["validate", str(DEMO), "--set", "parallel.tensor_model_parallel_size=5"])
    assert result.exit_code == 2 and "[schema]" not in result.output and LATER not in result.output
