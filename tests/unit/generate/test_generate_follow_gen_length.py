"""`[generate] gen_length = 64` alone (or `dlmspec generate --gen-length 64` alone) takes steps and
block_length from it, as LLaDA's defaults are all one length (one block, one token a step), instead of
failing on the default 128 (found by a new-user trial)."""

from __future__ import annotations

from pathlib import Path

from dlmspec.cli.generate_options import resolve_settings

ROOT = Path(__file__).resolve().parents[3]


def _rules(path: Path) -> list:
    """(rule, key) of every issue ``dlmspec validate --json`` reports for ``path``."""
    import json

    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    report = json.loads(CliRunner().invoke(app, ["validate", str(path), "--json"]).stdout)
    return [(i["rule"], i["key"]) for i in report["issues"] + report["warnings"]]


def _spec(tmp_path: Path, table: str, name: str = "g.toml") -> Path:
    path = tmp_path / name
    path.write_text((ROOT / "specs" / "demo-dlm.toml").read_text() + "\n[generate]\n" + table)
    return path


def test_a_spec_giving_only_gen_length_validates_and_locks_steps_and_block_length_to_it(tmp_path: Path) -> None:
    path = _spec(tmp_path, "gen_length = 64\n")
    assert [r for r in _rules(path) if r[0] == "generate-settings"] == []
    from typer.testing import CliRunner

    from dlmspec.cli.commands import app

    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compile", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    lock = (out / "spec.lock.toml").read_text()
    table = lock[lock.index("[generate]"):].split("\n\n")[0]
    assert "gen_length = 64" in table and "steps = 64" in table and "block_length = 64" in table


def test_given_steps_or_block_length_are_kept(tmp_path: Path) -> None:
    path = _spec(tmp_path, "gen_length = 64\nsteps = 32\nblock_length = 32\n")
    assert [r for r in _rules(path) if r[0] == "generate-settings"] == []
    bad = _spec(tmp_path, "gen_length = 64\nsteps = 128\n", "bad.toml")
    assert [r[1] for r in _rules(bad) if r[0] == "generate-settings"] == ["generate.steps"]


def test_the_gen_length_flag_alone_takes_steps_and_block_length_with_it() -> None:
    config, settings = resolve_settings(kind="mdm", mask_token_id=5, eos_token_id=1, pad_token_id=None,
                                        flags={"gen_length": 64})
    assert (config.gen_length, config.steps, config.block_length) == (64, 64, 64)
    config, _ = resolve_settings(kind="mdm", mask_token_id=5, eos_token_id=1, pad_token_id=None,
                                 flags={"gen_length": 64, "block_length": 32})
    assert (config.steps, config.block_length) == (64, 32)
