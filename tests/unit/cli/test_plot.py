"""``dlmspec plot RUN_DIR [RUN_DIR...]``: a PNG of loss, validation loss and tokens/s
against steps from two fake runs; a file dlmspec did not draw is replaced only with --force."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.cli.plot import SOFTWARE, written_by_dlmspec
from dlmspec.cli.runs import read_run

pytest.importorskip("matplotlib")


def fake_run(root: Path, name: str, steps: int, *, resumed_at: int | None = None) -> Path:
    """A run directory whose metrics.jsonl holds what the runtime writes: a start record, a
    train record every 10 steps, a valid record every 20, an exit (and, with ``resumed_at``, a
    second launch that repeats the steps after it)."""
    run = root / name
    run.mkdir(parents=True)
    lines = [{"event": "start", "name": name, "iteration": 0}]
    for it in range(10, steps + 1, 10):
        lines.append({"event": "train", "iteration": it, "loss": 10.0 / it, "tokens_per_s": 1000.0 + it})
        if it % 20 == 0:
            lines.append({"event": "valid", "iteration": it, "loss": 11.0 / it})
    if resumed_at is not None:
        lines.append({"event": "start", "name": name, "iteration": resumed_at})
        lines += [{"event": "train", "iteration": it, "loss": 1.0, "tokens_per_s": 5.0}
                  for it in range(resumed_at + 10, steps + 1, 10)]
    lines.append({"event": "exit", "iteration": steps, "reason": "completed"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_two_runs_side_by_side(tmp_path) -> None:
    a, b = fake_run(tmp_path, "run-a", 100), fake_run(tmp_path, "run-b", 60)
    out = tmp_path / "loss.png"
    result = run_cli("plot", str(a), str(b), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["result"]["points"] == {"training loss": 16, "validation loss": 8, "throughput": 16}
    width, height = png_size(out)
    assert width > 1000 and height > 300
    assert written_by_dlmspec(str(out)) and SOFTWARE.encode() in out.read_bytes()[:65536]
    assert not list(tmp_path.glob("*.tmp*"))  # the temporary file is gone


def test_a_resume_keeps_the_later_launchs_values(tmp_path) -> None:
    log = read_run(str(fake_run(tmp_path, "r", 60, resumed_at=30)))
    steps, losses = log.series("train", "loss")
    assert steps == [10, 20, 30, 40, 50, 60] and losses[3:] == [1.0, 1.0, 1.0] and losses[0] == 1.0


def test_plot_replaces_its_own_png_and_refuses_other_files(tmp_path) -> None:
    run = fake_run(tmp_path, "r", 40)
    out = tmp_path / "p.png"
    assert run_cli("plot", str(run), "-o", str(out)).exit_code == 0
    assert run_cli("plot", str(run), "-o", str(out)).exit_code == 0  # its own file: replaced
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"\x89PNG\r\n\x1a\n a picture of my cat")
    result = run_cli("plot", str(run), "-o", str(mine))
    assert result.exit_code == 2 and "--output" in result.output and "--force" in result.output
    assert mine.read_bytes().endswith(b"my cat")  # untouched
    assert run_cli("plot", str(run), "-o", str(mine), "--force").exit_code == 0
    assert written_by_dlmspec(str(mine))


@pytest.mark.parametrize("make, why", [
    (lambda root: root / "missing", "is not a run folder"),
    (lambda root: root, "without metrics.jsonl"),
])
def test_a_bad_run_dir_is_named(tmp_path, make, why) -> None:
    result = run_cli("plot", str(make(tmp_path)), "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 2 and "RUN_DIR" in result.output and why in result.output
    assert "Traceback" not in result.output and not (tmp_path / "x.png").exists()


def test_an_output_folder_that_does_not_exist_is_named(tmp_path) -> None:
    run = fake_run(tmp_path, "r", 20)
    result = run_cli("plot", str(run), "-o", str(tmp_path / "no" / "x.png"))
    assert result.exit_code == 2 and "--output" in result.output and "does not exist" in result.output
