"""`dlmspec eval --task` (dlmspec/cli/eval_task.py) on tiny runtime checkpoints: the accuracy, its
Wilson interval and n equal the library's scoring of the same model and settings; the settings,
their origins and a spec's preset are recorded; bad task files and flags exit 2 naming them."""

from __future__ import annotations

import json

import pytest
import torch

from dlmspec.cli import main
from tiny_ckpt import tiny_runs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.shared_data  # the tiny runs use the offline GPT-2 tokenizer


ROWS = [{"prompt": "The sky is", "answer": " blue"}, {"prompt": "One, two,", "answer": " three"},
        {"prompt": " 1 2 +", "answer": " 3"}]


@pytest.fixture()
def task_file(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def run_json(capsys, *args: str):
    capsys.readouterr()
    code = main(["eval", *args, "--device", "cpu", "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_task_accuracy_is_the_library_scoring_of_the_same_model(tiny_runs, task_file, capsys, kind):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.load import load_model
    from dlmspec.backends.megatron.generation_eval import score_prompts

    run_dir = tiny_runs[kind][0]
    code, env = run_json(capsys, str(run_dir), "--task", str(task_file), "--gen-length", "4", "--steps", "4",
                         "--block-length", "4", "--batch-size", "2")
    assert code == 0, env["issues"]
    t = env["result"]["task"]
    assert t["n"] == 3 and t["checker"] == "exact_match" and t["interval_method"] == "wilson"
    assert t["settings"]["gen_length"] == 4 and t["origins"]["gen_length"] == "flag"
    model = load_model(str(run_dir), device="cpu")
    try:
        config = GenerateConfig(**t["settings"])
        ref = score_prompts(model.logits_fn, ROWS, encode=model.encode, decode=model.decode, config=config,
                            batch_size=2, device=torch.device("cpu"), noise_schedule=getattr(model, "noise_schedule", None))
    finally:
        model.close()
    assert t["correct"] == ref["correct"] and t["accuracy"] == ref["correct"] / 3
    assert [e["completion"] for e in t["examples"]] == [c["completion"] for c in ref["completions"]]
    from dlmspec.backends.generate.likelihood import wilson_interval

    assert t["interval_95"] == list(wilson_interval(t["correct"], 3))


def test_the_spec_gives_the_task_file_and_its_preset_is_recorded(tiny_runs, task_file, tmp_path, capsys):
    from pathlib import Path

    spec = tmp_path / "spec.toml"
    root = Path(__file__).resolve().parents[3]
    spec.write_text(f'extends = "{root / "specs" / "demo-dlm.toml"}"\n[generate]\npreset = "llada-gsm8k-semi-ar"\n'
                    f'gen_length = 8\n[eval.generation]\nprompts = "{task_file}"\nmax_prompts = 2\n')
    code, env = run_json(capsys, str(tiny_runs["mdm"][0]), "--spec", str(spec))
    assert code == 0, env["issues"]
    t = env["result"]["task"]
    assert t["n"] == 2 and t["file"] == str(task_file)
    assert t["preset"] == "llada-gsm8k-semi-ar" and t["settings"]["block_length"] == 8
    assert t["origins"]["block_length"] == "spec"


@pytest.mark.parametrize("content, where, why", [
    ('{"prompt": "a", "answer": "b"}\n{"prompt": 3, "answer": "b"}\n', ":2", "'prompt' is a int"),
    ("", "", "no rows"),
])
def test_a_bad_task_file_exits_2_naming_file_and_line_before_loading(tiny_runs, tmp_path, capsys, content, where, why):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    code, env = run_json(capsys, "/nonexistent/run", "--task", str(path))  # the file is read first
    assert code == 2
    issue = env["issues"][0]
    assert issue["key"] == "--task" and issue["value"] == f"{path}{where}" and why in issue["message"]
    code, env = run_json(capsys, "/nonexistent/run", "--task", str(tmp_path / "missing.jsonl"))
    assert code == 2 and env["issues"][0]["key"] == "--task"
    code, env = run_json(capsys, "/nonexistent/run", "--task", str(path), "--max-prompts", "0")
    assert code == 2 and env["issues"][0]["key"] == "--max-prompts"


def test_a_spec_without_eval_generation_names_the_spec_and_the_table_to_add(tmp_path, capsys):
    from pathlib import Path

    spec = tmp_path / "spec.toml"
    root = Path(__file__).resolve().parents[3]
    spec.write_text(f'extends = "{root / "specs" / "demo-dlm.toml"}"\n[generate]\ngen_length = 8\n')
    code, env = run_json(capsys, "/nonexistent/run", "--spec", str(spec))  # refused before any checkpoint is read
    assert code == 2
    (issue,) = env["issues"]
    assert issue["key"] == "--spec" and issue["value"] == str(spec)
    assert "no [eval.generation] table" in issue["message"] and "[eval.generation]" in issue["hint"]
