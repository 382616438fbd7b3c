"""render() is pure: given a Resolved, it reads no file. The tokenizer's files (its end-of-document
id and size) and the SFT datasets' records are read by resolve and kept on the Resolved."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import tomli_w

import dlmspec.files
import dlmspec.tokenizers
from dlmspec.render.compile import render
from dlmspec.resolve import resolve
from dlmspec.spec.load import load
from spec_kit import spec_dict

BASE: dict[str, Any] = spec_dict({
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 256},
    "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 128, "train_iters": 10, "eval_interval": 5},
    "data": {"train": ["data/x_text_document"]},
})


def write_spec(tmp_path: Path, tokenizer: dict[str, Any], **tables: Any) -> Path:
    data = copy.deepcopy(BASE)
    data["data"]["tokenizer"] = tokenizer
    for key, value in tables.items():
        data.setdefault(key, {}).update(value)
    path = tmp_path / "spec.toml"
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


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
    path = write_spec(tmp_path, {"type": "NullTokenizer", "vocab_size": 999}, stage={"kind": "sft"})
    data = __import__("tomllib").loads(path.read_text(encoding="utf-8"))
    data["data"]["train"] = [str(prefix)]
    path.write_text(tomli_w.dumps(data), encoding="utf-8")
    return path


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
    (lambda tmp: write_spec(tmp, gpt2_files(tmp)), "eod_id=7,"),
    (lambda tmp: write_spec(tmp, hf_folder(tmp)), "eod_id=3,"),
    (lambda tmp: write_spec(tmp, bert_vocab(tmp)), "(BertWordPieceCase: 602 ids)"),
    (sft_with_record, "mean 64 tokens per conversation (its record)"),
], ids=["gpt2-vocab", "hf-folder", "wordpiece-vocab", "sft-record"])
def test_render_reads_no_file_given_a_resolved_spec(tmp_path, monkeypatch, make, expect) -> None:
    resolved = resolve(load(make(tmp_path)).spec)
    asked = refuse_reads(monkeypatch)
    files = render(resolved, "spec.toml")
    assert asked == []
    assert expect in files["train.py"] + files["plan.json"]
