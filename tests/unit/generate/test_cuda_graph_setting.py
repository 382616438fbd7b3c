"""[generate] cuda_graph (dlmspec.generate_settings.GenerateConfig, GenerateSpec, the generate CLI's table
fields): on by default and recorded with every output's settings; a value that is not true/false is refused
naming the key, the value and a value that works; a spec that turns it off validates and keeps it."""

from __future__ import annotations

import json

import pytest

from dlmspec.generate_settings import GenerateConfig, GenerateConfigError


def test_cuda_graphs_are_on_by_default_and_recorded_with_the_settings():
    assert GenerateConfig(mask_token_id=5).to_dict()["cuda_graph"] is True
    assert GenerateConfig(mask_token_id=5, cuda_graph=False).to_dict()["cuda_graph"] is False


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_cuda_graph_value_that_is_not_true_or_false_is_refused_with_one_that_works(value):
    with pytest.raises(GenerateConfigError) as err:
        GenerateConfig(mask_token_id=5, cuda_graph=value)
    assert err.value.field == "cuda_graph" and "cuda_graph = true" in str(err.value)


def test_the_generate_table_takes_cuda_graph_and_the_cli_reads_it():
    from dlmspec.cli.generate_options import TABLE_FIELDS
    from dlmspec.spec.models import GenerateSpec

    assert GenerateSpec().cuda_graph is True and GenerateSpec(cuda_graph=False).cuda_graph is False
    assert "cuda_graph" in TABLE_FIELDS


def test_a_spec_that_turns_cuda_graphs_off_validates_and_a_bad_value_is_named(spec_file):
    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    def issues(value):
        path = spec_file({"objective.kind": "mdm", "generate.cuda_graph": value}, file_name=f"{value}.toml")
        result = CliRunner().invoke(app, ["validate", str(path), "--json"])
        report = json.loads(result.stdout)
        return [i for i in report["issues"] + report["warnings"] if i["key"].startswith("generate")]

    assert issues(False) == []
    bad = issues("sometimes")
    assert bad and bad[0]["key"] == "generate.cuda_graph"
