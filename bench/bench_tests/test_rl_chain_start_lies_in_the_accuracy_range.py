"""The RL chain's start (bench/sampling/rl_chain.py pick-start): the latest scored checkpoint whose
validation accuracy lies in [--min-accuracy, --max-accuracy]; with none there (a run scored too
rarely: the AR task model went 0.7 % -> 82 % between two scores 250 iterations apart) the command
says so on stderr, names the candidates and exits 3, never starting RL from ~0 %."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "sampling" / "rl_chain.py"
sys.path.insert(0, str(SCRIPT.parent))
import rl_chain  # noqa: E402


def _run(root: Path, scores: dict) -> Path:
    """A run folder scored ``{iteration: accuracy}`` in training, a checkpoint at each score."""
    root.mkdir(parents=True)
    rows = [{"event": "valid", "iteration": it, "loss": 1.0, "generation_accuracy": acc} for it, acc in scores.items()]
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for it in scores:
        (root / "checkpoints" / f"iter_{it:07d}").mkdir(parents=True)
        (root / "checkpoints" / f"iter_{it:07d}" / "dlmspec.json").write_text("{}")
    return root


def _pick(run: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "pick-start", "--run", str(run), "--out", str(out), *flags],
                          capture_output=True, text=True, timeout=60)


def test_a_near_zero_checkpoint_below_the_range_is_never_the_start(tmp_path) -> None:
    # the AR run of the H100 call: scored every 250 iterations
    run = _run(tmp_path / "ar", {250: 0.007, 500: 0.824, 750: 0.949})
    choice = rl_chain.pick_start(run, 0.75, 0.2)
    assert choice["checkpoint"] is None and "[0.2, 0.75]" in choice["rule"] and "250: 0.007" in choice["rule"]
    proc = _pick(run, tmp_path / "start.json")
    assert proc.returncode == rl_chain.NO_START == 3, proc.stderr
    assert "250: 0.007" in proc.stderr and "score the run more often" in proc.stderr.lower() and proc.stdout == ""
    assert json.loads((tmp_path / "start.json").read_text())["candidates"][0] == {"iteration": 250, "accuracy": 0.007}


def test_the_latest_checkpoint_inside_the_range_is_the_start(tmp_path) -> None:
    run = _run(tmp_path / "ar", {250: 0.007, 300: 0.15, 350: 0.31, 400: 0.58, 450: 0.77, 500: 0.824})
    proc = _pick(run, tmp_path / "start.json")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("iter_0000400")
    assert rl_chain.pick_start(run, 0.75, 0.2)["accuracy"] == 0.58
    assert rl_chain.pick_start(run, 0.75, 0.4)["iteration"] == 400 and rl_chain.pick_start(run, 0.5, 0.2)["iteration"] == 350


def test_a_run_without_scores_and_a_reversed_range_are_refused(tmp_path) -> None:
    bare = tmp_path / "bare"
    (bare / "checkpoints" / "iter_0000100").mkdir(parents=True)
    proc = _pick(bare, tmp_path / "s.json")
    assert proc.returncode == 3 and "none" in proc.stderr
    run = _run(tmp_path / "r", {10: 0.3})
    bad = _pick(run, tmp_path / "s.json", "--min-accuracy", "0.8", "--max-accuracy", "0.5")
    assert bad.returncode == 2 and "--min-accuracy 0.8 is above --max-accuracy 0.5" in bad.stderr
