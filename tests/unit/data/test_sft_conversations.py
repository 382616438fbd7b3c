"""bench/sft_conversations.py: the demo conversation set from the shared corpus is deterministic,
its responses are each passage's first sentence, the split is by document, and the prepare
commands it prints make the contract's datasets."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.data.cli import app
from dlmspec.data.record import read_record
from bench_scripts import load_script
import pytest  # noqa: E402
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

SHARED = SHARED_DATA
script = load_script(Path("bench/sft_conversations.py"), "sft_conversations")


def test_paragraph_filter_and_first_sentence():
    text = ("Title\n=====\n\n.. note:: markup\n\n   indented code\n\n"
            + "The first sentence is here. " + "The second one follows it with more words. " * 6)
    assert script.prose_paragraphs(text) == [("The first sentence is here. "
                                              + "The second one follows it with more words. " * 6).strip()]
    row = script.conversation(script.prose_paragraphs(text)[0])
    assert row["messages"][1] == {"role": "assistant", "content": "The first sentence is here."}
    assert row["messages"][0]["content"].startswith(script.INSTRUCTION + "\n\n")


def test_builds_the_split_and_the_commands_prepare_it(tmp_path, capsys, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("pydocs-train.jsonl", "pydocs-valid.jsonl"):  # the kit's first documents, quick
        with (SHARED / "corpus" / name).open(encoding="utf-8") as src:
            (corpus / name).write_text("".join(next(src) for _ in range(3)), encoding="utf-8")
    (tmp_path / "tokenizers").symlink_to(SHARED / "tokenizers")
    monkeypatch.chdir(tmp_path)
    args = ["--corpus-dir", str(corpus), "--out", "sft", "--data", "data"]
    assert script.main(args) == 0
    first = (Path("sft/train.jsonl").read_bytes(), Path("sft/heldout.jsonl").read_bytes())
    commands = [shlex.split(line) for line in capsys.readouterr().out.splitlines()]
    assert script.main(args) == 0
    assert (Path("sft/train.jsonl").read_bytes(), Path("sft/heldout.jsonl").read_bytes()) == first
    train = [json.loads(line) for line in first[0].decode().splitlines()]
    heldout = {json.loads(line)["messages"][0]["content"] for line in first[1].decode().splitlines()}
    assert train and heldout and not heldout & {r["messages"][0]["content"] for r in train}
    for row in train:
        prompt, response = (m["content"] for m in row["messages"])
        assert prompt.split("\n\n", 1)[1].startswith(response)
    assert [c[:4] for c in commands] == [["dlmspec", "data", "prepare", "--sft"]] * 2
    for command in commands:
        result = CliRunner().invoke(app, [*command[2:], "--no-progress"])
        assert result.exit_code == 0, result.output
    record = read_record("data/demo-sft-train_text_document")
    assert record["sft"]["rows"]["written"] == len(train) and record["sft"]["max_length"] == 512
    assert Path("data/demo-sft-heldout_text_document_response.idx").is_file()
