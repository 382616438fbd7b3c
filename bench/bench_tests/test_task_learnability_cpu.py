"""bench/sampling/task_learnability.py end to end on CPU for a few steps: the task files, the token stream
through megatron-core's GPTDataset, the runtime objective, the sampler and the checker run, and the result
records the settings, the loss curve and each evaluation with its Wilson interval.

The runs share one work folder (the script keeps the task files and token stream it prepared under a
name of its settings, and a later run with the same settings reuses them): the first run's
``dlmspec data prepare`` is the only one. They run on one xdist worker, one after another, so that no
two runs write that folder at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.harness  # a harness end to end on CPU: the bench tier (CONTRIBUTING.md)

ROOT = Path(__file__).resolve().parents[2]
GPT2 = Path(os.environ.get("GPT2_DIR", "/work/main/.bench-data/gpt2"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The work folder the runs share (see the module docstring)."""
    return tmp_path_factory.mktemp("learnability-work")


@pytest.mark.skipif(not (GPT2 / "vocab.json").is_file(), reason="GPT-2's BPE files are not here (GPT2_DIR)")
@pytest.mark.xdist_group("task-learnability-work")
@pytest.mark.parametrize("mode", ["mdm", "mdm-sft", "ar"])
def test_a_short_learnability_run_records_losses_and_scored_evaluations(tmp_path, work, mode) -> None:
    out = tmp_path / "result.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench/sampling/task_learnability.py"), "--mode", mode, "--steps", "10",
         "--eval-every", "10", "--train", "300", "--test", "40", "--batch", "4", "--seq-length", "32", "--dim", "32",
         "--layers", "1", "--heads", "2", "--work", str(work), "--vocab-file", str(GPT2 / "vocab.json"),
         "--merge-file", str(GPT2 / "merges.txt"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["mode"] == mode and result["task"] == "addition-padded" and result["steps"] == 10
    assert [step for step, _ in result["loss_curve"]] == [10] and result["loss_curve"][0][1] > 0
    final = result["final"]
    assert final["count"] == 40 and 0 <= final["correct"] <= 40
    low, high = final["wilson95"]
    assert 0.0 <= low <= final["accuracy"] <= high <= 1.0
    assert len(final["examples"]) == 3 and "after_eod" in final


def test_the_sft_canvas_schedule_is_read_as_sizes_from_steps() -> None:
    from bench.sampling.task_learnability import canvas_at, parse_canvas

    assert parse_canvas("8") == [(1, 8)]
    schedule = parse_canvas("32@801, 8")
    assert schedule == [(1, 8), (801, 32)]
    assert [canvas_at(schedule, s) for s in (1, 800, 801, 1000)] == [8, 8, 32, 32]
    for bad in ("8@5", "0", "8,16@0"):
        with pytest.raises(ValueError):
            parse_canvas(bad)


@pytest.mark.skipif(not (GPT2 / "vocab.json").is_file(), reason="GPT-2's BPE files are not here (GPT2_DIR)")
@pytest.mark.xdist_group("task-learnability-work")
def test_an_sft_run_changes_its_canvas_and_scores_every_generation_length(tmp_path, work) -> None:
    out = tmp_path / "result.json"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench/sampling/task_learnability.py"), "--mode", "mdm-sft", "--steps", "10",
         "--eval-every", "5", "--train", "300", "--test", "40", "--batch", "4", "--dim", "32", "--layers", "1",
         "--heads", "2", "--canvas", "8,16@6", "--eval-gen-lengths", "8,16", "--work", str(work),
         "--vocab-file", str(GPT2 / "vocab.json"), "--merge-file", str(GPT2 / "merges.txt"), "--json", str(out)],
        capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["canvas"] == [[1, 8], [6, 16]] and result["eval_gen_lengths"] == [8, 16]
    for record in result["evaluations"]:
        assert record["gen_length"] == 8 and list(record["at_gen_length"]) == ["16"]
        extra = record["at_gen_length"]["16"]
        assert 0 <= extra["correct"] <= 40 and extra["accuracy"] == extra["correct"] / 40
