"""``hf_to_mcore`` carries the source folder's tokenizer files (tokenizer.json, tokenizer_config.json,
special_tokens_map.json, vocab/merges, *.model) into the converted folder, where the generate loader
finds them; a link or a FIFO among them is never followed, and an unreadable one stops the conversion
before anything is written."""

from __future__ import annotations

import json
import os

import pytest

from dlmspec.backends.convert import hf_to_mcore
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.tiny import make_tiny_hf

WORDS = ["<pad>", "<eos>", "<unk>", "the", "quick", "brown", "fox", "jumps"]


def _tokenizer_folder(folder):
    """A word-level Hugging Face tokenizer (ids below the tiny model's vocabulary of 100) written
    into ``folder`` as tokenizer.json, tokenizer_config.json and special_tokens_map.json, plus a
    SentencePiece-named ``tokenizer.model`` and a ``merges.txt`` (bytes only: copied, not read)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "pad_token": "<pad>",
         "unk_token": "<unk>"}), encoding="utf-8")
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<eos>"}), encoding="utf-8")
    (folder / "tokenizer.model").write_bytes(b"\x00sentencepiece-bytes\xff")
    (folder / "merges.txt").write_text("#version: 0.2\nt h\n", encoding="utf-8")


def test_converted_folder_holds_the_tokenizer_files_byte_for_byte(tmp_path):
    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=1)
    _tokenizer_folder(src)
    (src / "tokenization_evil.py").write_text("raise SystemExit('never copied')\n", encoding="utf-8")
    dst = tmp_path / "mcore"
    hf_to_mcore(src, dst)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "merges.txt"):
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    assert not (dst / "tokenization_evil.py").exists()


def test_a_link_or_fifo_among_the_tokenizer_files_is_not_followed(tmp_path):
    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=1)
    _tokenizer_folder(src)
    secret = tmp_path / "secret.txt"
    secret.write_text("not a tokenizer\n", encoding="utf-8")
    os.symlink(secret, src / "vocab.json")
    os.mkfifo(src / "spiece.model")
    dst = tmp_path / "mcore"
    hf_to_mcore(src, dst)  # returns: the FIFO is never opened
    assert not (dst / "vocab.json").exists() and not (dst / "spiece.model").exists()
    assert (dst / "tokenizer.json").is_file()


def test_a_tokenizer_file_too_large_stops_the_conversion_before_writing(tmp_path, monkeypatch):
    from dlmspec.backends.convert import api

    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=1)
    _tokenizer_folder(src)
    monkeypatch.setattr(api, "MAX_TOKENIZER_BYTES", 16)
    dst = tmp_path / "mcore"
    with pytest.raises(ConversionError, match="larger than") as info:
        hf_to_mcore(src, dst)
    assert info.value.tensor in {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                 "tokenizer.model", "merges.txt"}
    assert not dst.exists()


def test_generate_loader_finds_the_tokenizer_of_a_converted_folder(tmp_path):
    from dlmspec.backends.generate.load import load_model

    src, _ = make_tiny_hf("qwen3", tmp_path / "hf", seed=1)
    _tokenizer_folder(src)
    dst = tmp_path / "mcore"
    hf_to_mcore(src, dst)
    model = load_model(str(dst), device="cpu")
    try:
        assert model.source == "mcore"
        assert model.tokenizer is not None, model.tokenizer_error
        ids = model.encode("the quick brown fox")
        assert ids == [3, 4, 5, 6]
        assert model.decode(ids) == "the quick brown fox"
    finally:
        model.close()
