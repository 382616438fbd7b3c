"""render() is pure: given a Resolved, it reads no file. The tokenizer's files (its end-of-document
id and size) and the SFT datasets' records are read by resolve and kept on the Resolved."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dlmspec.files
import dlmspec.tokenizers
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import TINY, spec_file

#: spec_kit.TINY's data: one dataset from files and no tokenizer (each test names its own).
DATA: dict[str, Any] = {"data": {"train": ["data/x_text_document"]}}


def gpt2_files(tmp_path: Path) -> dict[str, Any]:
    """A GPT-2 BPE vocabulary whose <|endoftext|> is id 7 (not GPT-2's 50256)."""
    vocab = {f"t{i}": i for i in range(7)} | {"<|endoftext|>": 7}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    return {"type": "GPT2BPETokenizer", "vocab_file": str(tmp_path / "vocab.json"),
            "merge_file": str(tmp_path / "merges.txt")}


def hf_folder(tmp_path: Path) -> dict[str, Any]:
    """A local Hugging Face tokenizer folder whose EOS token <eos> is id 3."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}), encoding="utf-8")
    (folder / "tokenizer.json").write_text(json.dumps(
        {"added_tokens": [{"content": "<eos>", "id": 3}], "model": {"vocab": {"a": 0}}}), encoding="utf-8")
    return {"type": "HuggingFaceTokenizer", "model": str(folder)}


def bert_vocab(tmp_path: Path) -> dict[str, Any]:
    """A WordPiece vocabulary of 600 words (602 ids with the BOS/EOS Megatron adds; read from the file)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(595)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return {"type": "BertWordPieceCase", "vocab_file": str(tmp_path / "vocab.txt")}


def sft_with_record(tmp_path: Path) -> Path:
    """An SFT stage whose training dataset has a record (mean conversation 64 tokens)."""
    prefix = tmp_path / "data" / "sft_text_document"
    prefix.parent.mkdir()
    Path(str(prefix) + ".dlmspec.json").write_text(json.dumps(
        {"schema": "dlmspec.dataset", "version": 1, "documents": 10, "tokens": 640,
         "sft": {"prompt_tokens": 320, "response_tokens": 320}}), encoding="utf-8")
    return spec_file(tmp_path, TINY, {"data": {"train": [str(prefix)]}},
                     data={"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}}, stage={"kind": "sft"})


def refuse_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every read of a file through dlmspec.files (the one reader of files a user names),
    and the WordPiece vocabulary reader, raise, and record what was asked."""
    asked: list[str] = []

    def refuse(path: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(path))
        raise AssertionError(f"render read {path}")

    monkeypatch.setattr(dlmspec.files, "open_regular", refuse)
    monkeypatch.setattr(dlmspec.tokenizers, "read_bert_vocab", refuse)  # reads vocab.txt with open()
    return asked


@pytest.mark.parametrize("make, expect", [
    (lambda tmp: spec_file(tmp, TINY, DATA, data={"tokenizer": gpt2_files(tmp)}), "eod_id=7,"),
    (lambda tmp: spec_file(tmp, TINY, DATA, data={"tokenizer": hf_folder(tmp)}), "eod_id=3,"),
    (lambda tmp: spec_file(tmp, TINY, DATA, data={"tokenizer": bert_vocab(tmp)}), "(BertWordPieceCase: 602 ids)"),
    (sft_with_record, "mean 64 tokens per conversation (its record)"),
], ids=["gpt2-vocab", "hf-folder", "wordpiece-vocab", "sft-record"])
def test_render_reads_no_file_given_a_resolved_spec(tmp_path, monkeypatch, make, expect) -> None:
    resolved = resolve(load(make(tmp_path)).spec)
    asked = refuse_reads(monkeypatch)
    files = render(resolved, "spec.toml")
    assert asked == []
    assert expect in files["train.py"] + files["plan.json"]
