"""One JSON envelope on every command: ``--json`` prints
``{"schema": "dlmspec.result", "version": 1, "command", "ok", "issues", "warnings", "result"}``
with the same keys on success and failure, built by :func:`dlmspec.cli.output.envelope`.

The test walks the typer app, so a command added without ``--json`` (or without a case here)
fails it; each command is run once as it succeeds and once as it fails, through
:func:`dlmspec.cli.main` (the fast path of validate/check/plan included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import typer

import scaling_kit
from dlmspec.cli import main
from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "specs" / "demo-dlm.toml")
FAKEBIN = ROOT / "tests" / "slurm" / "fakebin"
KEYS = ["schema", "version", "command", "ok", "issues", "warnings", "result"]


def command_paths() -> list[tuple[str, ...]]:
    """Every command of the app (hidden ones too: ``check``), as the words that run it."""
    from typer._click import Context

    def walk(command: Any, path: tuple[str, ...], ctx: Any) -> list[tuple[str, ...]]:
        if not hasattr(command, "list_commands"):
            return [path]
        found: list[tuple[str, ...]] = []
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            found += walk(sub, path + (name,), Context(sub, info_name=name, parent=ctx))
        return found

    root = typer.main.get_command(app)
    return walk(root, (), Context(root, info_name="dlmspec"))


def _tiny_hf(tmp: Path) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from dlmspec.backends.convert.tiny import make_tiny_hf

    src, _ = make_tiny_hf("qwen3", tmp / "hf", seed=3)
    return src


def _tiny_mcore(tmp: Path) -> tuple[Path, Path]:
    src = _tiny_hf(tmp)
    assert main(["convert", "hf-to-mcore", str(src), str(tmp / "mcore")]) == 0
    return src, tmp / "mcore"


def _jsonl(tmp: Path) -> Path:
    path = tmp / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i % 7} {i % 5} 3"}) + "\n" for i in range(20)))
    return path


def _prepare(tmp: Path, source: str) -> list[str]:
    return ["data", "prepare", "--input", source, "--output-prefix", str(tmp / "ds"), "--tokenizer-type", "null",
            "--vocab-size", "10", "--no-progress", "--json"]


def _inspect(tmp: Path) -> list[str]:
    """``data inspect`` of a dataset ``data prepare`` wrote (NullTokenizer: no tokenizer files)."""
    from dlmspec.data.prepare import prepare

    result = prepare(_jsonl(tmp), tmp / "ins", tokenizer_type="null", vocab_size=10)
    return ["data", "inspect", result.datasets[0].prefix, "--json"]


def _ids(tmp: Path) -> Path:
    path = tmp / "prompts.jsonl"
    path.write_text('{"prompt_ids": [1, 2, 3]}\n')
    return path


def _dataset(tmp: Path) -> str:
    assert main(_prepare(tmp, str(_jsonl(tmp)))) == 0
    return str(tmp / "ds")


def _foreign(tmp: Path) -> Path:
    path = tmp / "mine.json"
    path.write_text('{"not": "a dlmspec schema"}\n')
    return path


def _run_dir(tmp: Path) -> Path:
    """A run directory with a metrics.jsonl of one launch (dlmspec show RUN_DIR, dlmspec plot)."""
    run = tmp / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_text('{"event": "start", "name": "r"}\n{"event": "train", "iteration": 1, "loss": 2.0}\n')
    return run


#: Command -> (name in the envelope, success cases, failure cases); a case maps ``tmp_path`` to the
#: arguments (``--json`` included). Every command of the app must be here.
Case = Callable[[Path], list[str]]
CASES: dict[tuple[str, ...], tuple[list[Case], list[Case]]] = {
    ("validate",): ([lambda t: ["validate", DEMO, "--json"],
                     lambda t: ["validate", DEMO, "--json", "--set", "train.lr=0.001"]],
                    [lambda t: ["validate", str(t / "missing.toml"), "--json"],
                     lambda t: ["validate", DEMO, "--json", "--strict"],
                     lambda t: ["validate", DEMO, "--json", "--set", "model.preset=nope"]]),
    ("check",): ([lambda t: ["check", DEMO, "--json"]],
                 [lambda t: ["check", DEMO, "--json", "--set", "parallel.tensor_model_parallel_size=5"]]),
    ("plan",): ([lambda t: ["plan", DEMO, "--json"], lambda t: ["plan", DEMO, "--search", "--json"]],
                [lambda t: ["plan", str(t / "missing.toml"), "--json"],
                 lambda t: ["plan", DEMO, "--json", "--set", "train.micro_batch_size=1024",
                            "--set", "train.global_batch_size=1024", "--set", "train.seq_length=1024"],
                 lambda t: ["plan", DEMO, "--search", "--json", "--set", "model.preset=nope"]]),
    ("show",): ([lambda t: ["show", DEMO, "--json"], lambda t: ["show", "--gpus", "--json"],
                 lambda t: ["show", "--presets", "--json"], lambda t: ["show", "--rules", "--json"],
                 lambda t: ["show", str(_run_dir(t)), "--json"]],
                [lambda t: ["show", "--json"], lambda t: ["show", str(t / "missing.toml"), "--json"]]),
    ("new",): ([lambda t: ["new", str(t / "a.toml"), "--from", "demo-dlm", "--json"],
                lambda t: ["new", str(t / "b.toml"), "--preset", "qwen3-0.6b", "--json"]],
               [lambda t: ["new", str(t / "c.toml"), "--preset", "nope", "--json"]]),
    ("schema",): ([lambda t: ["schema", "--json"], lambda t: ["schema", "-o", str(t / "s.json"), "--json"]],
                  [lambda t: ["schema", "-o", str(_foreign(t)), "--force", "--json"]]),
    ("compile",): ([lambda t: ["compile", DEMO, "-o", str(t / "out"), "--json"]],
                   [lambda t: ["compile", str(t / "missing.toml"), "-o", str(t / "out"), "--json"]]),
    ("submit",): ([lambda t: ["submit", DEMO, "-o", str(t / "sub"), "--dry-run", "--json"],
                   lambda t: ["submit", DEMO, "-o", str(t / "sub"), "--json"]],
                  [lambda t: ["submit", str(t / "missing.toml"), "--json"],
                   lambda t: ["submit", str(t / "missing.toml"), "--dry-run", "--json"]]),
    ("plot",): ([lambda t: ["plot", str(_run_dir(t)), "-o", str(t / "p.png"), "--json"]],
                [lambda t: ["plot", str(t / "none"), "-o", str(t / "p.png"), "--json"]]),
    ("fit",): ([lambda t: ["fit", *map(str, scaling_kit.isoflop_study(t / "runs")), "--bootstrap", "0", "--json"]],
               [lambda t: ["fit", str(t / "none"), "--json"]]),
    ("data", "prepare"): ([lambda t: _prepare(t, str(_jsonl(t)))],
                          [lambda t: _prepare(t, str(t / "missing.jsonl"))]),
    ("data", "inspect"): ([_inspect], [lambda t: ["data", "inspect", str(t / "none"), "--json"]]),
    ("convert", "hf-to-mcore"): ([lambda t: ["convert", "hf-to-mcore", str(_tiny_hf(t)), str(t / "mc"), "--json"]],
                                 [lambda t: ["convert", "hf-to-mcore", str(t), str(t / "mc"), "--json"]]),
    ("convert", "mcore-to-hf"): ([lambda t: ["convert", "mcore-to-hf", str(_tiny_mcore(t)[1]), str(t / "back"),
                                             "--json"]],
                                 [lambda t: ["convert", "mcore-to-hf", str(t / "none"), str(t / "back"), "--json"]]),
    ("generate",): ([lambda t: ["generate", str(_tiny_hf(t)), "--prompts", str(_ids(t)), "--gen-length", "4",
                                "--device", "cpu", "--json"]],
                    [lambda t: ["generate", str(t / "none"), "--prompt", "a", "--json"]]),
    ("eval",): ([lambda t: ["eval", str(_tiny_hf(t)), "--data", _dataset(t), "--seq-length", "8", "--device", "cpu",
                            "--json"]],
                [lambda t: ["eval", str(t / "none"), "--data", str(t / "none"), "--json"]]),
    ("convert", "verify"): ([lambda t: ["convert", "verify", *map(str, _tiny_mcore(t)), "--json"]],
                            [lambda t: ["convert", "verify", str(t / "none"), str(t / "none2"), "--json"]]),
    ("task", "make"): ([lambda t: ["task", "make", "addition", "--out", str(t / "task"), "--train", "20", "--valid",
                                   "10", "--test", "500", "--json"]],
                       [lambda t: ["task", "make", "division", "--out", str(t / "task"), "--json"],
                        lambda t: ["task", "make", "addition", "--out", str(t / "task"), "--test", "5", "--json"]]),
}


def test_every_command_has_json_and_a_case() -> None:
    paths = command_paths()
    assert set(paths) == set(CASES), "a command without a case in CASES (or a case without a command)"
    from typer._click import Context

    root = typer.main.get_command(app)
    for path in paths:
        command, ctx = root, Context(root, info_name="dlmspec")
        for name in path:
            command = command.get_command(ctx, name)
            ctx = Context(command, info_name=name, parent=ctx)
        options = {opt for param in command.params for opt in getattr(param, "opts", [])}
        assert "--json" in options, f"dlmspec {' '.join(path)} has no --json"


def _envelope(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any]]:
    code = main(args)
    out = capsys.readouterr().out
    try:
        data = json.loads(out)
    except ValueError:
        pytest.fail(f"dlmspec {' '.join(args)} (exit {code}) did not print one JSON document:\n{out}")
    return code, data


def _check(data: dict[str, Any], path: tuple[str, ...]) -> None:
    assert list(data) == KEYS
    assert data["schema"] == "dlmspec.result" and data["version"] == 1
    assert data["command"] == " ".join(path)
    assert isinstance(data["ok"], bool)
    assert isinstance(data["issues"], list) and isinstance(data["warnings"], list)
    for item in data["issues"] + data["warnings"]:  # the issue dicts the tables print
        assert {"severity", "rule", "key", "value", "message", "hint", "file", "line"} <= set(item)
    assert all(w["severity"] == "warning" for w in data["warnings"])


def _cases(kind: int) -> list[Any]:
    return [pytest.param(path, i, id=f"{'-'.join(path)}-{i}") for path, cases in CASES.items()
            for i in range(len(cases[kind]))]


@pytest.mark.parametrize(("path", "index"), _cases(0))
def test_success_prints_the_envelope(path: tuple[str, ...], index: int, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKEBIN}:{os.environ['PATH']}")  # a fake sbatch for submit
    monkeypatch.setenv("FAKE_LOG", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the demo's data paths are missing here: warnings
    args = CASES[path][0][index](tmp_path)
    capsys.readouterr()
    code, data = _envelope(capsys, args)
    _check(data, path)
    assert code == 0 and data["ok"] is True and data["issues"] == [], data
    assert isinstance(data["result"], dict) and data["result"], data


@pytest.mark.parametrize(("path", "index"), _cases(1))
def test_failure_prints_the_envelope(path: tuple[str, ...], index: int, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = CASES[path][1][index](tmp_path)
    capsys.readouterr()
    code, data = _envelope(capsys, args)
    _check(data, path)
    assert code == 2 and data["ok"] is False and data["issues"], data
    assert all(i["message"] for i in data["issues"])


def test_a_failed_plan_keeps_the_plan_and_a_strict_failure_lists_its_warnings(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    code, data = _envelope(capsys, ["plan", DEMO, "--json", "--set", "train.micro_batch_size=1024",
                                    "--set", "train.global_batch_size=1024", "--set", "train.seq_length=1024"])
    assert code == 2 and data["result"]["schema"].startswith("dlmspec.plan/")
    assert {i["rule"] for i in data["issues"]} >= {"memory-fits"}
    code, data = _envelope(capsys, ["validate", DEMO, "--json", "--strict"])
    assert code == 2 and data["result"] is None and data["warnings"] == []
    assert data["issues"] and all(i["severity"] == "warning" for i in data["issues"])


def test_the_envelope_is_documented() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("*.md"))
    assert '"schema": "dlmspec.result"' in text


@pytest.mark.parametrize("args, command, key", [
    (["validate", "--json"], "validate", "SPEC"),
    (["compile", "specs/demo-dlm.toml", "--json"], "compile", "--output"),
    (["validate", "specs/demo-dlm.toml", "--bogus", "--json"], "validate", "--bogus"),
    (["plan", "specs/demo-dlm.toml", "--top", "x", "--json"], "plan", "--top"),
    (["convert", "verify", "--json"], "convert verify", "HF"),
    (["data", "prepare", "--json"], "data prepare", "--output-prefix"),
])
def test_usage_errors_print_the_envelope(args, command, key, capsys, monkeypatch) -> None:
    """A usage error (missing argument or option, unknown option, a value of the wrong type) with
    --json prints the envelope too, not only click's usage box (the new-user trial)."""
    from dlmspec.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[3])
    assert main(args) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["command"], doc["ok"], doc["result"]) == ("dlmspec.result", command, False, None)
    (issue,) = doc["issues"]
    assert issue["key"] == key and issue["rule"] == "usage" and issue["hint"] == f"see dlmspec {command} -h"
