"""``dlmspec show RUN_DIR`` and ``dlmspec plot`` on run folders that lie: odd metrics records exit
0 (or 2), never a traceback; a metrics.jsonl that is a FIFO or a link to /dev/zero exits 2 at
once; a missing run folder is answered as a run folder, and errors about run folders name the
folder (not ``<spec>``); plot never writes through a link planted at its temporary name."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app

pytest.importorskip("matplotlib")

BIG = "9" * 400

#: metrics.jsonl lines a hand, a bug or an attacker may leave.
ODD = {
    "provenance-a-string": ['{"event": "start", "name": "r", "provenance": "x"}'],
    "provenance-parts-wrong": ['{"event": "start", "provenance": {"git": "x", "versions": [1, 2]}}'],
    "phases-a-list": ['{"event": "start", "phases_s": [1, 2]}'],
    "phases-strings": ['{"event": "start", "phases_s": {"load": "slow", "build": 1.5}}'],
    "tokens-per-s-1e308": ['{"event": "train", "iteration": 1, "loss": 2.0, "tokens_per_s": 1e308}',
                           '{"event": "train", "iteration": 2, "loss": 1.0, "tokens_per_s": -1e308}'],
    "iteration-400-digits": ['{"event": "train", "iteration": ' + BIG + ', "loss": 1.0, "tokens_per_s": 5}',
                             '{"event": "train", "iteration": 3, "loss": ' + BIG + '}'],
    "iteration-5000-digits": ['{"event": "train", "iteration": ' + "9" * 5000 + ', "loss": 1.0}'],
    "non-dict-lines": ["[1, 2]", "3", '"text"', "null"],
    "nan-and-infinity": ['{"event": "train", "iteration": 1, "loss": NaN, "tokens_per_s": Infinity}',
                         '{"event": "valid", "iteration": 1, "loss": -Infinity}'],
    "nested-100000": ["[" * 100_000 + "]" * 100_000],
}


def run_folder(root: Path, lines: list[str]) -> Path:
    run = root / "runs" / "r"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("case", sorted(ODD))
def test_show_survives_odd_records(tmp_path: Path, case: str) -> None:
    run = run_folder(tmp_path, ODD[case])
    for args in ([str(run)], [str(run), "--json"]):
        result = invoke("show", *args)
        assert result.exit_code in (0, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        if "--json" in args and result.exit_code == 0:
            json.loads(result.stdout)  # standard JSON: NaN and infinities are spelled as strings


@pytest.mark.parametrize("case", sorted(ODD))
def test_plot_survives_odd_records(tmp_path: Path, case: str) -> None:
    run = run_folder(tmp_path, ODD[case])
    result = invoke("plot", str(run), "-o", str(tmp_path / "out.png"))
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def test_show_prints_nan_and_keeps_the_numeric_phases(tmp_path: Path) -> None:
    run = run_folder(tmp_path, ['{"event": "start", "provenance": "x", "phases_s": {"load": "slow", "build": 1.5}}',
                                '{"event": "train", "iteration": 4, "loss": NaN}'])
    result = invoke("show", str(run))
    assert result.exit_code == 0, result.output
    assert "provenance: none recorded" in result.stdout and "build 1.5 s" in result.stdout and "load" not in result.stdout
    assert "nan" in result.stdout
    doc = json.loads(invoke("show", str(run), "--json").stdout)
    assert doc["result"]["run"]["last_train"]["loss"] == "nan"


def _release_after(path: Path, seconds: float = 3.0) -> threading.Timer:
    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(seconds, release)
    timer.start()
    return timer


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
@pytest.mark.parametrize("command", ["show", "plot"])
def test_a_metrics_file_that_is_not_a_file_exits_2(tmp_path: Path, kind: str, command: str) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    timer = None
    if kind == "fifo":
        os.mkfifo(metrics)
        timer = _release_after(metrics)
    else:
        metrics.symlink_to("/dev/zero")
    args = [command, str(run)] + (["-o", str(tmp_path / "o.png")] if command == "plot" else [])
    try:
        result = invoke(*args)
    finally:
        if timer is not None:
            timer.cancel()
    assert result.exit_code == 2, result.output
    assert ("FIFO" if kind == "fifo" else "character device") in result.output


def test_show_of_a_missing_run_folder_speaks_of_a_run_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("show", "runs/nope")
    assert result.exit_code == 2
    assert "not a run folder" in result.output and "dlmspec new" not in result.output
    assert "runs/nope" in result.output and "<spec>" not in result.output


@pytest.mark.parametrize("command", ["show", "plot"])
def test_errors_about_a_run_folder_name_the_folder_not_a_spec(tmp_path: Path, command: str) -> None:
    empty = tmp_path / "runs" / "empty"
    empty.mkdir(parents=True)
    result = invoke(command, str(empty), *(["-o", str(tmp_path / "o.png")] if command == "plot" else []))
    assert result.exit_code == 2
    assert "<spec>" not in result.output and "metrics.jsonl" in result.output


def test_plot_never_writes_through_a_link_at_its_temporary_name(tmp_path: Path) -> None:
    run = run_folder(tmp_path, ['{"event": "train", "iteration": 1, "loss": 2.0}'])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out.png"
    # the name the temporary file had (OUT.tmp<pid>.png), and any name beside out.png
    (tmp_path / f"out.png.tmp{os.getpid()}.png").symlink_to(victim)
    result = invoke("plot", str(run), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious"
    assert out.is_file() and not out.is_symlink() and out.read_bytes().startswith(b"\x89PNG")
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # no temporary file left
