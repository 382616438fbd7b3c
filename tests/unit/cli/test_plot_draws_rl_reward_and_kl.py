"""``dlmspec plot`` of an RL run: besides loss and tokens/s, the mean reward and the KL to the
reference (``rl/reward_mean``, ``rl/kl`` of its ``train`` records), one line per run, and no empty
validation-loss panel (the stage has no validation feed); a run without RL records keeps the three
panels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app

pytest.importorskip("matplotlib")


def rl_run(root: Path, name: str, steps: int) -> Path:
    """A run folder whose metrics.jsonl holds what the RL stage writes every 2 steps: loss,
    tokens/s, the rollouts' mean reward and the KL to the reference."""
    run = root / name
    run.mkdir(parents=True)
    lines = [{"event": "start", "name": name, "iteration": 0}]
    for it in range(2, steps + 1, 2):
        lines.append({"event": "train", "iteration": it, "loss": 0.1, "tokens_per_s": 900.0,
                      "rl/reward_mean": 0.3 + it / 100, "rl/kl": 1e-4 * it})
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def plain_run(root: Path, name: str) -> Path:
    run = root / name
    run.mkdir(parents=True)
    lines = [{"event": "train", "iteration": it, "loss": 1.0, "tokens_per_s": 10.0} for it in (10, 20)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def plot_points(*args: str) -> dict:
    result = CliRunner().invoke(app, ["plot", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["result"]["points"]


def test_an_rl_run_gets_reward_and_kl_panels(tmp_path) -> None:
    out = tmp_path / "rl.png"
    points = plot_points(str(rl_run(tmp_path, "rl", 20)), "-o", str(out))
    assert points == {"training loss": 10, "throughput": 10, "reward": 10, "KL to the reference": 10}
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_an_rl_run_beside_a_pretraining_run_draws_both_and_the_plain_run_alone_keeps_three_panels(tmp_path) -> None:
    rl, plain = rl_run(tmp_path, "rl", 8), plain_run(tmp_path, "pre")
    both = plot_points(str(rl), str(plain), "-o", str(tmp_path / "both.png"))
    assert both["reward"] == 4 and both["KL to the reference"] == 4 and both["training loss"] == 4 + 2
    alone = plot_points(str(plain), "-o", str(tmp_path / "plain.png"))
    assert set(alone) == {"training loss", "validation loss", "throughput"}
