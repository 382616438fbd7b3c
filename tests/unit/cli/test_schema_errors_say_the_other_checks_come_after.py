"""Where a spec's schema errors leave nothing the cross-field rules can run on (no partial spec:
a key the model needs was rejected), the summary line says those checks come once they are fixed
(a first-time user took "every problem at once" to include the layout error that appeared only
afterwards); where the rules ran on the rest of the spec, their findings are in the same table and
the line says nothing more."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app

DEMO = Path(__file__).resolve().parents[3] / "specs" / "demo-dlm.toml"
LATER = "the cross-field rules, layout and memory checks run once the schema errors are fixed"


def validate(*sets: str):
    args = ["validate", str(DEMO)]
    for item in sets:
        args += ["--set", item]
    return CliRunner(env={"COLUMNS": "250"}).invoke(app, args)


def test_when_the_rules_cannot_run_the_summary_says_they_come_after() -> None:
    # the demo spec names no preset: without its hidden_size no model is left to check
    result = validate("model.hidden_size=-768", "parallel.tensor_model_parallel_size=5")
    assert result.exit_code == 2
    assert "e.g. hidden_size = 768" in result.output and LATER in result.output
    assert "[world-divisible-by-model-parallel]" not in result.output


def test_when_the_rules_ran_on_the_rest_their_findings_stand_beside_the_schema_error() -> None:
    result = validate('data.train="corpus"', "parallel.tensor_model_parallel_size=5")
    assert result.exit_code == 2
    assert "a list is expected, not a single value" in result.output
    assert "[world-divisible-by-model-parallel]" in result.output and LATER not in result.output
