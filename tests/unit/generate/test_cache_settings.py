"""The block-cache and parallel-decoding settings of [generate] (dlmspec.generate_settings.GenerateConfig,
GenerateSpec): defaults, refusals that name the field, the value and a value that works, and the
validate rule that refuses pipeline-parallel generation."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.generate_settings import GenerateConfig, GenerateConfigError

ROOT = Path(__file__).resolve().parents[3]


def test_the_cache_is_off_by_default_and_recorded_with_the_settings():
    config = GenerateConfig(mask_token_id=5)
    recorded = config.to_dict()
    assert (recorded["cache"], recorded["cache_refresh"], recorded["compile"]) == ("none", None, False)
    assert recorded["factor"] == 1.0
    assert GenerateConfig(mask_token_id=5, cache="dual", cache_refresh=4).to_dict()["cache"] == "dual"


@pytest.mark.parametrize("field, value, fix", [
    ("cache", "both", "'none', 'prefix', 'dual'"),
    ("cache_refresh", 0, "cache_refresh = None"),
    ("cache_refresh", True, "cache_refresh = None"),
    ("factor", 0.0, "factor = 1.0"),
    ("factor", float("nan"), "factor = 1.0"),
    ("compile", "yes", "compile = false"),
])
def test_a_bad_cache_or_factor_setting_is_refused_with_a_value_that_works(field, value, fix):
    with pytest.raises(GenerateConfigError) as err:
        GenerateConfig(mask_token_id=5, **{field: value})
    assert err.value.field == field and fix in str(err.value)


def test_the_factor_rule_ends_a_block_when_it_has_no_mask_left_so_steps_may_exceed_the_blocks():
    config = GenerateConfig(mask_token_id=5, gen_length=8, block_length=4, steps=3, remasking="factor")
    assert config.remasking == "factor"


def _validate(tmp_path: Path, extra: str) -> list:
    import json

    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    path = tmp_path / "g.toml"
    path.write_text((ROOT / "specs" / "demo-dlm.toml").read_text() + extra)
    result = CliRunner().invoke(app, ["validate", str(path), "--json"])
    report = json.loads(result.stdout)
    return report["issues"] + report["warnings"]


def test_generate_cache_keys_validate_and_a_bad_one_is_named(tmp_path: Path):
    ok = _validate(tmp_path, '\n[generate]\ngen_length = 64\nblock_length = 32\ncache = "dual"\ncache_refresh = 8\n'
                             'remasking = "factor"\nfactor = 2.0\n')
    assert [i for i in ok if i["key"].startswith("generate")] == []
    bad = _validate(tmp_path, '\n[generate]\ncache = "both"\n')
    assert any(i["key"] == "generate.cache" for i in bad)


def test_pipeline_parallel_generation_is_refused_with_what_works(tmp_path: Path):
    spec = (ROOT / "specs" / "demo-dlm.toml").read_text()
    assert "pipeline_model_parallel_size" not in spec
    issues = _validate(tmp_path, "\n[generate]\ngen_length = 64\n[parallel]\npipeline_model_parallel_size = 2\n"
                       if "[parallel]" not in spec else "\n[generate]\ngen_length = 64\n")
    found = [i for i in issues if i["rule"] == "generate-pipeline"]
    assert found and found[0]["key"] == "parallel.pipeline_model_parallel_size"
    assert "one pipeline stage" in found[0]["message"] and "remove generate" in found[0]["hint"]
    assert found[0]["severity"] == "error"
