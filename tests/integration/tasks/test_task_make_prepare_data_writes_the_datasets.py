"""`dlmspec task make --prepare-data GPT2_DIR`: the four datasets it writes are byte for byte the ones
`dlmspec data prepare` writes from the same task files with the commands of docs/tasks.md (with GPT-2's
own BPE files from the offline data kit, and with BPE files in GPT-2's format trained here, so that the
check runs without the kit); a second run keeps them without --force and replaces them with it; a
tokenizer data prepare cannot read, or one whose SFT rows are all over the SFT spec's 24 tokens, exits 2
naming --prepare-data with a fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.data.cli import app as data_app
from shared_kit import SHARED_DATA
from task_bpe_kit import write_task_bpe, write_wordy_bpe

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
SMALL = ["--train", "300", "--valid", "40", "--test", "500", "--digits", "3"]
#: (the task's prefix suffix, its input file, the `dlmspec data prepare` flags of docs/tasks.md)
COMMANDS = [("train", "pretrain-train.jsonl", ["--append-eod"]),
            ("valid", "pretrain-validation.jsonl", ["--append-eod"]),
            ("sft-train", "sft-train.jsonl", ["--sft", "--chat-template", "plain", "--seq-length", "24"]),
            ("sft-valid", "sft-validation.jsonl", ["--sft", "--chat-template", "plain", "--seq-length", "24"])]


def _gpt2_flags(folder: Path) -> list[str]:
    return ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(folder / "vocab.json"),
            "--merge-file", str(folder / "merges.txt")]


@pytest.fixture(params=["trained-here", pytest.param("gpt2", marks=pytest.mark.shared_data)])
def bpe(request, tmp_path) -> Path:
    """The folder of vocab.json and merges.txt: trained here (always), or GPT-2's own (the data kit)."""
    return write_task_bpe(tmp_path / "bpe") if request.param == "trained-here" else GPT2


def make(out: Path, *args: str, gpt2: Path):
    return CliRunner().invoke(app, ["task", "make", "addition-padded", "--out", str(out), *SMALL,
                                    "--prepare-data", str(gpt2), *args])


def _files(prefix: Path, sft: bool) -> list[Path]:
    names = [f"{prefix.name}_text_document.bin", f"{prefix.name}_text_document.idx"]
    if sft:
        names += [f"{prefix.name}_text_document_response.bin", f"{prefix.name}_text_document_response.idx"]
    return [prefix.parent / n for n in names]


def test_datasets_equal_the_ones_data_prepare_writes_from_the_same_files(tmp_path, bpe):
    out = tmp_path / "data" / "task-addition"
    res = make(out, "--json", gpt2=bpe)
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)["result"]["datasets"]}
    assert set(rows) == {"train", "valid", "sft-train", "sft-valid"}
    assert rows["train"]["documents"] == 300 and rows["sft-valid"]["documents"] == 40
    assert rows["sft-train"]["skipped"] == {} and rows["sft-train"]["response_tokens"] > 0
    reference = tmp_path / "reference"
    reference.mkdir()
    for suffix, input_name, flags in COMMANDS:
        mine = tmp_path / "data" / f"task-addition-{suffix}"
        theirs = reference / f"task-addition-{suffix}"
        got = CliRunner().invoke(data_app, ["prepare", "--no-progress", "--input", str(out / input_name),
                                            "--output-prefix", str(theirs), *_gpt2_flags(bpe), *flags])
        assert got.exit_code == 0, got.output
        assert rows[suffix]["prefix"] == f"{mine}_text_document"
        for a, b in zip(_files(mine, "--sft" in flags), _files(theirs, "--sft" in flags), strict=True):
            assert a.read_bytes() == b.read_bytes(), a.name


def test_a_second_run_keeps_the_datasets_without_force_and_replaces_them_with_it(tmp_path):
    bpe = write_task_bpe(tmp_path / "bpe")
    out = tmp_path / "task-addition"
    assert make(out, gpt2=bpe).exit_code == 0
    train = tmp_path / "task-addition-train_text_document.bin"
    before = train.read_bytes()
    res = make(out, "--json", gpt2=bpe)
    assert res.exit_code == 2 and train.read_bytes() == before
    assert {i["key"] for i in json.loads(res.stdout)["issues"]} == {"--out", "--prepare-data"}
    res = make(out, "--force", "--seed", "1", gpt2=bpe)
    assert res.exit_code == 0, res.output
    assert train.read_bytes() != before and len(train.read_bytes()) == len(before)


def test_a_vocab_file_data_prepare_cannot_read_exits_2_naming_the_flag(tmp_path):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "vocab.json").write_text("{not json")
    (gpt2 / "merges.txt").write_bytes((write_task_bpe(tmp_path / "bpe") / "merges.txt").read_bytes())
    res = make(tmp_path / "task-addition", "--json", gpt2=gpt2)
    assert res.exit_code == 2, res.output
    issue = json.loads(res.stdout)["issues"][0]
    assert issue["key"] == "--prepare-data" and issue["value"] == str(gpt2) and "--force" in issue["hint"]
    assert not (tmp_path / "task-addition-train_text_document.bin").exists()


def test_a_tokenizer_whose_sft_rows_are_all_too_long_exits_2_naming_the_length_and_gpt2_files(tmp_path):
    gpt2 = write_wordy_bpe(tmp_path / "wordy")
    res = make(tmp_path / "task-addition", "--json", gpt2=gpt2)
    assert res.exit_code == 2, res.output
    issue = json.loads(res.stdout)["issues"][0]
    assert issue["key"] == "--prepare-data" and "over_long" in issue["message"]
    assert "24 tokens" in issue["hint"] and "GPT-2's own vocab.json" in issue["hint"]
    assert not (tmp_path / "task-addition-sft-train_text_document.bin").exists()
