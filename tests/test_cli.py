"""Tests of the CLI core (dlmspec.cli): exit codes, the issue report (never a traceback),
--json, show round trips and the catalogs, and `new`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli import app, main, spec_issues
from dlmspec.errors import EXIT_USAGE
from dlmspec.gpus import GPUS
from dlmspec.loader import load
from dlmspec.presets import PRESETS
from dlmspec.resolve import resolve
from dlmspec.validate import RULES

ROOT = Path(__file__).resolve().parent.parent
DEMO = str(ROOT / "specs" / "demo-dlm.toml")


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_check_ok() -> None:
    result = run("check", DEMO)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("ok: demo-dlm: 152.7M parameters, 1 GPU(s)")
    assert "600 steps of 16,384 tokens" in result.stdout
    assert result.stderr == ""


def test_check_error_reports_every_issue_with_location_and_fix() -> None:
    result = run("check", DEMO, "--set", "train.global_batch_size=30", "--set", "parallel.sequence_parallel=true")
    assert result.exit_code == EXIT_USAGE
    err = result.stderr
    assert "Traceback" not in err and "Traceback" not in result.stdout
    for text in ("train.global_batch_size", "30", "not a multiple of micro_batch_size", "fix:", "use global_batch_size = 32",
                 "parallel.sequence_parallel", "[batch-divisible]", "[sequence-parallel-needs-tp]", "2 errors, 0 warnings"):
        assert text in err, text


def test_check_points_at_the_line(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text((ROOT / "specs" / "demo-dlm.toml").read_text().replace("global_batch_size = 32", "global_batch_size = 30"))
    result = CliRunner().invoke(app, ["check", str(spec), "--json"])
    assert result.exit_code == EXIT_USAGE
    report = json.loads(result.stdout)
    assert report["ok"] is False
    (issue,) = report["issues"]
    lines = spec.read_text().splitlines()
    assert issue["file"].endswith("bad.toml")
    assert lines[issue["line"] - 1].startswith("global_batch_size = 30")
    assert (issue["rule"], issue["key"], issue["value"], issue["severity"]) == (
        "batch-divisible", "train.global_batch_size", 30, "error")


def test_check_json_ok() -> None:
    result = run("check", DEMO, "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["warnings"] == []
    assert report["derived"]["padded_vocab_size"] == 50304
    assert report["derived"]["mask_token_id"] == 50257


def test_check_warnings_and_strict() -> None:
    result = run("check", DEMO, "--set", "train.eval_interval=1000")
    assert result.exit_code == 0
    assert "[eval-interval]" in result.stderr and "1 warning" in result.stderr
    assert result.stdout.startswith("ok:")
    strict = run("check", DEMO, "--set", "train.eval_interval=1000", "--strict")
    assert strict.exit_code == EXIT_USAGE
    assert "0 errors, 1 warning" in strict.stderr


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["check", "no/such/spec.toml"], "file not found"),
        (["check", DEMO, "--set", "nonsense"], "expected section.key=value"),
        (["check", DEMO, "--set", "model.num_layerz=3"], "did you mean 'num_layers'?"),
        (["check", DEMO, "--set", "cluster.gpu=h1000"], "unknown GPU"),
        (["show"], "give exactly one of SPEC"),
        (["show", DEMO, "--gpus"], "give exactly one of SPEC"),
    ],
)
def test_bad_input_exits_2_without_traceback(args: list[str], text: str) -> None:
    result = run(*args)
    assert result.exit_code == EXIT_USAGE
    assert text in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


def test_python_spec_error(tmp_path: Path) -> None:
    spec = tmp_path / "s.py"
    spec.write_text("x = 1\nspec = {'model': 1 / 0}\n")
    result = run("check", str(spec))
    assert result.exit_code == EXIT_USAGE
    assert "ZeroDivisionError" in result.stderr and "s.py:2" in result.stderr


def test_usage_errors_exit_2() -> None:
    assert run("bogus").exit_code == 2
    assert run("check").exit_code == 2
    assert main(["check", "--no-such-option"]) == 2


def test_main_returns_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", DEMO]) == 0
    assert main(["check", DEMO, "--set", "train.global_batch_size=30"]) == EXIT_USAGE
    assert main(["--version"]) == 0
    assert "dlmspec 0.1.0" in capsys.readouterr().out


def test_show_round_trips(tmp_path: Path) -> None:
    result = run("show", DEMO)
    assert result.exit_code == 0
    assert "#   padded_vocab_size = 50304" in result.stdout
    full = tmp_path / "full.toml"
    full.write_text(result.stdout)
    assert load(full).spec == load(DEMO).spec
    again = run("show", str(full))
    assert again.stdout == result.stdout


def test_show_json() -> None:
    result = run("show", DEMO, "--json", "--set", "cluster.gpus_per_node=2", "--set", "train.micro_batch_size=16")
    data = json.loads(result.stdout)
    assert data["spec"]["cluster"]["gpus_per_node"] == 2
    assert data["derived"]["data_parallel_size"] == 2 and data["derived"]["num_microbatches"] == 1


def test_show_catalogs() -> None:
    gpus = json.loads(run("show", "--gpus", "--json").stdout)
    assert [g["id"] for g in gpus] == sorted(GPUS)
    presets = json.loads(run("show", "--presets", "--json").stdout)
    assert [p["id"] for p in presets] == sorted(PRESETS)
    llama = next(p for p in presets if p["id"] == "llama-3-8b")
    assert llama["parameters"] == 8_030_261_248 and llama["published"] == "8,030,261,248"
    rules = json.loads(run("show", "--rules", "--json").stdout)
    assert [r["id"] for r in rules] == list(RULES)
    table = run("show", "--presets")
    assert table.exit_code == 0 and "mixtral-8x7b" in table.stdout and "46.7B" in table.stdout


def test_new_writes_a_spec_that_checks(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "llada.toml"
    result = run("new", str(out), "--preset", "llada-8b", "--nodes", "2")
    assert result.exit_code == 0, result.stderr
    loaded = load(out)
    resolved = resolve(loaded.spec)
    assert spec_issues(loaded, resolved) == []
    assert loaded.spec.model.preset == "llada-8b" and resolved.world_size == 16
    assert loaded.spec.train.global_batch_size % (resolved.dp * loaded.spec.train.micro_batch_size) == 0
    assert resolved.mask_token_id == 126336
    # It never overwrites without --force.
    again = run("new", str(out), "--preset", "llada-8b")
    assert again.exit_code == EXIT_USAGE and "--force" in again.stderr
    assert run("new", str(out), "--preset", "qwen3-1.7b", "--objective", "ar", "--force").exit_code == 0
    assert load(out).spec.objective.kind == "ar"


def test_new_refuses_a_spec_that_does_not_check(tmp_path: Path) -> None:
    out = tmp_path / "q.toml"
    # Qwen3's vocabulary (151,936) is a multiple of 128: padding leaves no row for [MASK].
    result = run("new", str(out), "--preset", "qwen3-1.7b")
    assert result.exit_code == EXIT_USAGE
    assert "[mask-token-range]" in result.stderr and "q.toml (not written)" in result.stderr
    assert not out.exists()
    fixed = run("new", str(out), "--preset", "qwen3-1.7b", "--set", "model.vocab_size=151937")
    assert fixed.exit_code == 0, fixed.stderr
    assert resolve(load(out).spec).mask_token_id == 151937


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["--preset", "qwen3-1.7x"], "did you mean 'qwen3-1.7b'?"),
        (["--preset", "llada-8b", "--objective", "gpt"], "use mdm or ar"),
        (["--preset", "llada-8b", "--set", "train"], "expected section.key=value"),
    ],
)
def test_new_bad_arguments(tmp_path: Path, args: list[str], text: str) -> None:
    result = run("new", str(tmp_path / "x.toml"), *args)
    assert result.exit_code == EXIT_USAGE
    assert text in result.stderr
    assert not (tmp_path / "x.toml").exists()
