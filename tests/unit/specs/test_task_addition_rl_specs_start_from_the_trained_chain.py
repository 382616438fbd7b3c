"""The addition task's RL specs start where the chain measured on a GPU starts them (docs/rl.md): the
masked-diffusion ones from the SFT run's checkpoints with its chat template (RL from the pre-trained
task model never earns a reward), the AR one from the AR task model with no template; each reads the
prompts `dlmspec task make` writes, and its header gives the commands of the whole chain."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlmspec.spec.load import load
from dlmspec.tasks.make import TASKS, task_files

ROOT = Path(__file__).resolve().parents[3]
SPECS = ROOT / "specs"


def _spec(stem: str):
    return load(SPECS / f"{stem}.toml").spec


@pytest.mark.parametrize("rl, start, template, chain", [
    ("task-addition-dlm-rl", "task-addition-dlm-sft", "plain",
     ["task-addition-dlm.toml", "task-addition-dlm-sft.toml", "task-addition-dlm-rl.toml"]),
    ("task-addition-dlm-rl-coupled", "task-addition-dlm-sft", "plain",
     ["task-addition-dlm.toml", "task-addition-dlm-sft.toml", "task-addition-dlm-rl-coupled.toml"]),
    ("task-addition-ar-rl", "task-addition-ar", "none", ["task-addition-ar.toml", "task-addition-ar-rl.toml"]),
])
def test_rl_spec_starts_from_the_stage_before_it_with_its_template(rl, start, template, chain):
    spec, before = _spec(rl), _spec(start)
    assert spec.checkpoint.init_from == f"mcore:{before.checkpoint.save}"
    assert spec.stage.rl.chat_template == template
    if before.stage.kind == "sft":
        assert before.stage.sft.chat_template == template
    assert spec.stage.rl.prompts == ".data/task-addition/train.jsonl"
    header = "\n".join(line for line in (SPECS / f"{rl}.toml").read_text().splitlines() if line.startswith("#"))
    assert "dlmspec submit " + " ".join(f"specs/{name}" for name in chain) in header
    assert "--prepare-data" in header


def test_the_rl_prompts_and_held_out_files_are_ones_task_make_writes():
    written = set(task_files(TASKS["addition-padded"], {"digits": 3}, 0, {"train": 10, "validation": 10, "test": 500}))
    assert {"train.jsonl", "test.jsonl", "test-plain.jsonl"} <= written
    header = (SPECS / "task-addition-dlm-rl.toml").read_text()
    # scored greedy, as measured: the RL run's own [generate] samples its rollouts at temperature 1
    assert ("dlmspec eval runs/task-addition-dlm-rl --task .data/task-addition/test-plain.jsonl "
            "--spec specs/task-addition-dlm.toml") in header
    assert _spec("task-addition-dlm-rl").generate.temperature > 0 and _spec("task-addition-dlm").generate.temperature == 0
