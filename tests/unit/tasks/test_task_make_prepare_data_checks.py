"""`dlmspec task make --prepare-data GPT2_DIR`, before any tokenizing: the dataset prefixes are those
the bundled task specs read, and every bad input (GPT2_DIR missing or incomplete, an existing dataset
without --force, a folder at a dataset path, --workers 0) exits 2 naming the flag, the value, why and a
fix, with nothing written. The held-out prompts in the plain chat template are task files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.spec.load import load
from dlmspec.tasks.datasets import SFT_CHAT_TEMPLATE, SFT_SEQ_LENGTH, task_datasets
from dlmspec.tasks.make import TASKS, task_files

ROOT = Path(__file__).resolve().parents[3]
SMALL = ["--train", "60", "--valid", "20", "--test", "500"]


def run(*args: str):
    return CliRunner().invoke(app, ["task", "make", "addition-padded", *SMALL, *args])


def _gpt2_dir(tmp_path: Path) -> Path:
    """A folder with files named as GPT-2's (their contents are never read before the checks pass)."""
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "vocab.json").write_text("{}")
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def test_prefixes_for_the_bundled_out_folder_are_the_ones_the_task_specs_read():
    by_name = {d.name: d.prefix for d in task_datasets(".data/task-addition")}
    for spec, train, valid in (("task-addition-dlm.toml", "train", "valid"), ("task-addition-ar.toml", "train", "valid"),
                               ("task-addition-dlm-sft.toml", "sft-train", "sft-valid")):
        data = load(ROOT / "specs" / spec).spec.data
        assert [e.prefix for e in data.train] == [by_name[train]], spec
        assert [e.prefix for e in data.valid] == [by_name[valid]], spec
    assert task_datasets(".data/task-addition/") == task_datasets(".data/task-addition")


def test_sft_datasets_use_the_sft_specs_template_and_sequence_length():
    sft = load(ROOT / "specs" / "task-addition-dlm-sft.toml").spec
    assert sft.stage.sft.chat_template == SFT_CHAT_TEMPLATE and sft.train.seq_length == SFT_SEQ_LENGTH
    assert sft.eval.generation.prompts == ".data/task-addition/test-plain.jsonl"


def test_a_folder_without_a_name_puts_the_prefixes_beside_it_not_inside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prefixes = [d.output_prefix for d in task_datasets(".")]
    assert prefixes[0] == f"{tmp_path}-train" and not any(p.startswith("./") or p.startswith(".-") for p in prefixes)


def test_the_held_out_prompts_are_written_in_the_plain_template_as_the_sft_stage_trains():
    files = task_files(TASKS["addition-padded"], {"digits": 3}, 0, {"train": 10, "validation": 20, "test": 500})
    for split in ("test", "validation"):
        raw = [json.loads(line) for line in files[f"{split}.jsonl"].decode().splitlines()]
        plain = files[f"{split}-plain.jsonl"]
        want = "".join(json.dumps({**r, "prompt": f"User:\n{r['prompt']}\n\nAssistant:\n"}, sort_keys=True) + "\n"
                       for r in raw)
        assert plain.decode() == want
    record = json.loads(files["task.json"])
    assert {"test-plain.jsonl", "validation-plain.jsonl"} <= set(record["files"])


@pytest.mark.parametrize("broken, named", [("missing-folder", "no such folder"), ("no-merges", "merges.txt"),
                                           ("a-file", "is not a folder")])
def test_a_bad_gpt2_folder_exits_2_naming_the_flag_and_writes_nothing(tmp_path, broken, named):
    gpt2 = _gpt2_dir(tmp_path)
    if broken == "missing-folder":
        gpt2 = tmp_path / "nowhere"
    elif broken == "no-merges":
        (gpt2 / "merges.txt").unlink()
    else:
        gpt2 = gpt2 / "vocab.json"
    out = tmp_path / "data" / "task-addition"
    res = run("--out", str(out), "--prepare-data", str(gpt2), "--json")
    assert res.exit_code == 2, res.output
    issue = json.loads(res.stdout)["issues"][0]
    assert issue["key"] == "--prepare-data" and issue["value"] == str(gpt2) and named in issue["message"]
    assert issue["hint"] and not (tmp_path / "data").exists()


def test_existing_datasets_are_named_and_kept_without_force_and_nothing_is_written(tmp_path):
    gpt2 = _gpt2_dir(tmp_path)
    out = tmp_path / "data" / "task-addition"
    mine = [tmp_path / "data" / "task-addition-train_text_document.bin",
            tmp_path / "data" / "task-addition-sft-valid_text_document_response.idx"]
    mine[0].parent.mkdir(parents=True)
    for path in mine:
        path.write_text("my own tokens\n")
    res = run("--out", str(out), "--prepare-data", str(gpt2), "--json")
    assert res.exit_code == 2, res.output
    issues = json.loads(res.stdout)["issues"]
    assert sorted(i["value"] for i in issues) == sorted(str(p) for p in mine)
    assert all(i["key"] == "--prepare-data" and "--force" in i["hint"] for i in issues)
    assert all(p.read_text() == "my own tokens\n" for p in mine) and not out.exists()


def test_a_folder_at_a_dataset_path_is_refused_with_force_too(tmp_path):
    gpt2 = _gpt2_dir(tmp_path)
    out = tmp_path / "data" / "task-addition"
    (tmp_path / "data" / "task-addition-valid_text_document.idx").mkdir(parents=True)
    res = run("--out", str(out), "--prepare-data", str(gpt2), "--force", "--json")
    assert res.exit_code == 2, res.output
    issue = json.loads(res.stdout)["issues"][0]
    assert issue["value"].endswith("task-addition-valid_text_document.idx") and "folder" in issue["message"]
    assert not out.exists()


def test_workers_below_one_exits_2(tmp_path):
    res = run("--out", str(tmp_path / "t"), "--prepare-data", str(_gpt2_dir(tmp_path)), "--workers", "0", "--json")
    assert res.exit_code == 2 and json.loads(res.stdout)["issues"][0]["key"] == "--workers"
    assert not (tmp_path / "t").exists()
