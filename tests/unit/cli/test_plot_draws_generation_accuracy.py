"""``dlmspec plot`` of a run that scored generated answers as it trained (``[eval.generation]``:
``generation_accuracy`` in its ``eval`` records): a panel of that accuracy beside loss and tokens/s,
one line per run; an RL run beside a pre-training run keeps the validation-loss panel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app

pytest.importorskip("matplotlib")


def write_run(root: Path, name: str, lines: list[dict]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def sft_lines(name: str) -> list[dict]:
    """An SFT run scored every 100 steps: train records, validation losses and accuracies."""
    lines: list[dict] = [{"event": "start", "name": name, "iteration": 0}]
    for it in range(10, 301, 10):
        lines.append({"event": "train", "iteration": it, "loss": 1.0 - it / 1000, "tokens_per_s": 5000.0})
    for it, acc in ((100, 0.003), (200, 0.4), (300, 0.9)):
        lines.append({"event": "valid", "iteration": it, "loss": 0.9})
        lines.append({"event": "eval", "iteration": it, "generation_accuracy": acc, "generation_count": 1000})
    return lines


def plot_points(*args: str) -> dict:
    result = CliRunner().invoke(app, ["plot", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["result"]["points"]


def test_a_run_scoring_generated_answers_gets_an_accuracy_panel(tmp_path) -> None:
    run = write_run(tmp_path, "sft", sft_lines("sft"))
    points = plot_points(str(run), "-o", str(tmp_path / "sft.png"))
    assert points == {"training loss": 30, "validation loss": 3, "throughput": 30, "generation accuracy": 3}
    assert (tmp_path / "sft.png").read_bytes()[:4] == b"\x89PNG"


def test_an_rl_run_beside_an_sft_run_keeps_validation_loss_and_adds_accuracy_and_rl_panels(tmp_path) -> None:
    sft = write_run(tmp_path, "sft", sft_lines("sft"))
    rl = write_run(tmp_path, "rl", [{"event": "start", "name": "rl", "iteration": 0}] + [
        {"event": "train", "iteration": it, "loss": 0.01, "tokens_per_s": 9000.0, "rl/reward_mean": 0.5,
         "rl/kl": 0.1} for it in range(2, 11, 2)] + [
        {"event": "eval", "iteration": 10, "generation_accuracy": 0.95, "generation_count": 1000}])
    points = plot_points(str(sft), str(rl), "-o", str(tmp_path / "both.png"))
    assert points == {"training loss": 35, "validation loss": 3, "throughput": 35, "generation accuracy": 4,
                      "reward": 5, "KL to the reference": 5}
