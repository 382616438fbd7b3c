"""`dlmspec data prepare` keeps secrets out of what it writes and prints (a token-shaped folder name
in --input, a password in an --hf-dataset URL), and never writes through a symbolic link planted
at an output or temporary name (the link's target is left as it was)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.data import prepare as prepare_module
from dlmspec.data import sft as sft_module
from dlmspec.data import shards as shards_module
from dlmspec.data.cli import app
from shared_kit import SHARED_DATA  # noqa: E402

NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]
HF_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
GH_TOKEN = "ghp_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
TAG = "tmp-testhost-4242-0badc0de"


def _invoke(*args: str):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


def _corpus(path: Path, n: int = 30) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": " ".join(str(j) for j in range(i % 5 + 1))}) + "\n"
                            for i in range(n)))
    return path


@pytest.mark.parametrize("token", [HF_TOKEN, GH_TOKEN])
@pytest.mark.parametrize("sharded", [False, True])
def test_a_token_shaped_input_folder_is_redacted_in_records_and_summary(tmp_path, token, sharded):
    corpus = _corpus(tmp_path / token / "corpus.jsonl")
    extra = ["--shard-size", "20"] if sharded else []
    result = _invoke("--input", str(corpus), "--output-prefix", str(tmp_path / "out" / "ds"), *NULL_CLI,
                     *extra, "--json")
    assert result.exit_code == 0, result.output
    assert token not in result.output
    written = [p for p in (tmp_path / "out").iterdir() if p.suffix == ".json"]
    assert written, list((tmp_path / "out").iterdir())
    for path in written:
        text = path.read_text()
        assert token not in text, path
        assert "<hidden>" in text, path


def test_a_password_in_an_hf_dataset_url_is_never_printed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    secret = "s3cretPassw0rdValue"
    for output in ("--json", None):
        result = _invoke("--hf-dataset", f"https://alice:{secret}@example.com/data/train.jsonl", "--output-prefix",
                         str(tmp_path / "out"), *NULL_CLI, *([output] if output else []))
        assert result.exit_code == 2, result.output
        assert secret not in result.output and "<hidden>" in result.output, result.output


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return victim


@pytest.mark.parametrize("name", ["ds_text_document.{tag}.bin", "ds_text_document.{tag}.idx"])
def test_a_link_at_a_temporary_name_is_never_written_through(tmp_path, monkeypatch, name):
    monkeypatch.setattr(prepare_module, "tmp_tag", lambda: TAG)
    corpus = _corpus(tmp_path / "in" / "corpus.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    victim = _victim(tmp_path)
    (out / name.format(tag=TAG)).symlink_to(victim)
    result = _invoke("--input", str(corpus), "--output-prefix", str(out / "ds"), *NULL_CLI)
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), text
    assert name.format(tag=TAG) in text and "never written through" in text, text
    assert victim.read_text() == "precious"
    assert not (out / "ds_text_document.idx").exists()


def test_a_link_at_a_shard_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    monkeypatch.setattr(shards_module, "tmp_tag", lambda: TAG)
    corpus = _corpus(tmp_path / "in" / "corpus.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    victim = _victim(tmp_path)
    (out / f"ds-00000_text_document.{TAG}.bin").symlink_to(victim)
    result = _invoke("--input", str(corpus), "--output-prefix", str(out / "ds"), *NULL_CLI, "--shard-size", "20")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert victim.read_text() == "precious"


@pytest.mark.shared_data
def test_a_link_at_an_sft_temporary_name_is_never_written_through(tmp_path, monkeypatch):
    monkeypatch.setattr(sft_module, "tmp_tag", lambda: TAG)
    gpt2 = SHARED_DATA / "tokenizers" / "gpt2"
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"}]}) + "\n")
    victim = _victim(tmp_path)
    (tmp_path / f"out_text_document_response.{TAG}.bin").symlink_to(victim)
    result = CliRunner().invoke(app, ["prepare", "--sft", "--no-progress", "--input", str(path), "--output-prefix",
                                      str(tmp_path / "out"), "--tokenizer-type", "gpt2bpe", "--vocab-file",
                                      str(gpt2 / "vocab.json"), "--merge-file", str(gpt2 / "merges.txt")])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("sharded", [False, True])
def test_links_at_output_names_are_replaced_not_written_through(tmp_path, sharded):
    corpus = _corpus(tmp_path / "in" / "corpus.jsonl")
    out = tmp_path / "out"
    out.mkdir()
    victim = _victim(tmp_path)
    if sharded:
        names = ["ds-00000_text_document.bin", "ds-00000_text_document.idx", "ds-00000_text_document.dlmspec.json",
                 "ds_text_document.manifest.json", "ds.prepare-progress.json"]
        extra = ["--shard-size", "20", "--force"]
    else:
        names = ["ds_text_document.bin", "ds_text_document.idx", "ds_text_document.dlmspec.json"]
        extra = ["--force"]
    for name in names:
        (out / name).symlink_to(victim)
    result = _invoke("--input", str(corpus), "--output-prefix", str(out / "ds"), *NULL_CLI, *extra)
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious"
    for name in names:
        assert (out / name).is_file() and not (out / name).is_symlink(), name
