"""Text read from a run folder's metrics.jsonl reaches the terminal and the plot escaped:
``dlmspec show RUN_DIR`` and ``dlmspec plot RUN_DIR`` print a run name holding a lone surrogate
(JSON's ``"\\ud800"``), terminal escapes or rich markup as escaped, literal text
(:func:`dlmspec.cli.output.shown`), and never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED"
HF_TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI"


def _dlmspec(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """The command line in a process of its own, stdout a pipe in UTF-8 (a surrogate cannot be
    encoded there: the failure a terminal sees)."""
    env = dict(os.environ, PYTHONIOENCODING="utf-8", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "dlmspec.cli", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=120)


def _run(tmp_path: Path, start_line: str) -> Path:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    train = "".join(json.dumps({"event": "train", "iteration": i, "loss": 5.0 - i / 10, "tokens_per_s": 1e4}) + "\n"
                    for i in range(1, 4))
    (run / "metrics.jsonl").write_text(start_line + "\n" + train, encoding="utf-8")
    return run


def test_shown_escapes_surrogates_controls_and_hides_secrets() -> None:
    from dlmspec.cli.output import shown

    assert shown("r\ud800") == "r\\ud800"
    assert shown(ESCAPES) == "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED"
    hidden = shown(f"/data/{HF_TOKEN}/vocab.json")
    assert HF_TOKEN not in hidden and hidden.startswith("/data/") and "<hidden>" in hidden
    assert shown("[bold]x[/bold]") == "[bold]x[/bold]"  # unchanged: printed as Text, never as markup
    assert shown(12) == "12"
    shown("r\ud800").encode("utf-8")  # encodable


def test_show_prints_a_lone_surrogate_name_escaped(tmp_path: Path) -> None:
    _run(tmp_path, '{"event": "start", "name": "r\\ud800", "time": 1}')
    done = _dlmspec("show", "runs/r", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert b"run r\\ud800 (" in done.stdout
    assert b"Traceback" not in done.stderr


def test_show_prints_escapes_and_markup_of_a_run_name_literally(tmp_path: Path) -> None:
    _run(tmp_path, json.dumps({"event": "start", "name": ESCAPES + "[bold]x[/bold]", "time": 1e9,
                               "provenance": {"spec_hash": ESCAPES, "git": {"commit": HF_TOKEN}}}))
    done = _dlmspec("show", "runs/r", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    out = done.stdout + done.stderr
    assert b"\x1b" not in out and b"\x07" not in out
    assert b"\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[31mRED[bold]x[/bold]" in done.stdout
    assert HF_TOKEN.encode() not in out


@pytest.mark.parametrize("name", ["r\\ud800", "a $\\\\frac{$ b"])
def test_plot_draws_a_run_whose_name_a_font_or_mathtext_cannot_take(tmp_path: Path, name: str) -> None:
    pytest.importorskip("matplotlib")
    _run(tmp_path, '{"event": "start", "name": "' + name + '", "time": 1}')
    done = _dlmspec("plot", "runs/r", "-o", "plot.png", cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")
    assert b"Traceback" not in done.stderr
