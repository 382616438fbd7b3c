"""`dlmspec generate` with `[generate] cache` (dlmspec/cli/generate.py): the block cache asked for runs on a
runtime checkpoint of the local layer spec and is recorded with the settings and the result, with each
output's forward passes; at `cache_refresh = 1` the tokens are those of no cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.cli import main
from tiny_ckpt import tiny_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

ROOT = Path(__file__).resolve().parents[3]


def _generate(capsys, run_dir, spec: Path, *flags: str):
    capsys.readouterr()
    code = main(["generate", str(run_dir), "--prompt", "The quick brown fox", "--prompt", "Hello", "--spec", str(spec),
                 "--device", "cpu", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_the_block_cache_of_the_spec_runs_and_is_recorded_with_every_output(tiny_runs, capsys, tmp_path, cache):
    run_dir = tiny_runs["mdm"][0]
    results = {}
    for name, table in (("none", 'cache = "none"\n'), ("every", f'cache = "{cache}"\ncache_refresh = 1\n'),
                        ("cached", f'cache = "{cache}"\n')):
        spec = tmp_path / f"{name}.toml"
        spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 8\nblock_length = 4\n'
                        f'steps = 8\n{table}')
        code, env = _generate(capsys, run_dir, spec)
        assert code == 0 and env["ok"], env
        results[name] = env["result"]
    cached = results["cached"]
    assert cached["settings"]["cache"] == cache and cached["origins"]["cache"] == "spec"
    assert cached["cache"] == cache and cached["cache_fallback"] is None
    assert all(o["settings"]["cache"] == cache for o in cached["outputs"])
    assert [o["forward_passes"] for o in cached["outputs"]] == [8, 8]
    assert [o["ids"] for o in results["every"]["outputs"]] == [o["ids"] for o in results["none"]["outputs"]]


def test_the_cache_flags_beat_the_spec_and_a_bad_one_is_named(tiny_runs, capsys, tmp_path):
    run_dir = tiny_runs["mdm"][0]
    spec = tmp_path / "spec.toml"
    spec.write_text(f'extends = "{ROOT / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 8\nblock_length = 4\n'
                    'steps = 8\ncache = "prefix"\n')
    code, env = _generate(capsys, run_dir, spec, "--cache", "dual", "--remasking", "factor", "--factor", "2.0")
    assert code == 0, env
    result = env["result"]
    assert result["settings"]["cache"] == "dual" and result["origins"]["cache"] == "flag"
    assert result["settings"]["remasking"] == "factor" and result["settings"]["factor"] == 2.0
    code, env = _generate(capsys, run_dir, spec, "--cache", "both")
    assert code == 2 and "--cache" in json.dumps(env) and "prefix" in json.dumps(env)
