"""``dlmspec data prepare`` writes the dataset record (PREFIX.dlmspec.json: the tokenizer with its
files' SHA-256, documents, tokens), and ``dlmspec data inspect PREFIX`` shows a dataset before a
run: documents, tokens, a length histogram, a decoded sample and the tokenizer it was written
with; a dataset without a record (Megatron-LM's preprocess_data.py) is shown with ids only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import tokenizer_kit as kit
from dlmspec.data.cli import app
from dlmspec.data.prepare import prepare
from dlmspec.data.record import file_sha256, read_record
from dlmspec.tokenizers import build_tokenizer

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

GPT2 = Path(kit.CORPUS).parents[1] / "tokenizers" / "gpt2"
GPT2_ARGS = {"tokenizer_type": "GPT2BPETokenizer", "vocab_file": str(GPT2 / "vocab.json"),
             "merge_file": str(GPT2 / "merges.txt")}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return kit.corpus_texts(12)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, texts):
    root = tmp_path_factory.mktemp("inspect")
    source = kit.write_jsonl(root / "docs.jsonl", texts + [""])  # one empty document
    result = prepare(source, root / "pydocs", append_eod=True, **GPT2_ARGS)
    return result, result.datasets[0].prefix


def _inspect(*args: str):
    return CliRunner().invoke(app, ["inspect", *args])


def test_prepare_writes_the_record(prepared):
    result, prefix = prepared
    record = read_record(prefix)
    assert record is not None and Path(prefix + ".dlmspec.json").is_file()
    tok = record["tokenizer"]
    assert (tok["type"], tok["vocab_size"], tok["eod_id"]) == ("GPT2BPETokenizer", 50257, 50256)
    assert tok["files"]["vocab_file"] == {"path": GPT2_ARGS["vocab_file"],
                                          "sha256": file_sha256(GPT2_ARGS["vocab_file"])}
    assert set(tok["files"]) == {"vocab_file", "merge_file"}
    assert (record["documents"], record["tokens"]) == (result.documents, result.tokens)


def test_inspect_json_counts_histogram_sample_and_tokenizer(prepared, texts):
    _, prefix = prepared
    out = _inspect(prefix, "--json", "--sample-tokens", "16")
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["command"] == "data inspect" and body["ok"] is True
    res = body["result"]
    gpt2 = build_tokenizer(**GPT2_ARGS)
    lengths = [len(gpt2.tokenize(t)) + 1 for t in texts] + [0]
    assert (res["documents"], res["tokens"], res["empty_documents"]) == (13, sum(lengths), 1)
    assert res["dtype"] == "uint16" and res["max_document_tokens"] == max(lengths)
    assert sum(b["documents"] for b in res["histogram"]) == 13
    assert res["tokenizer"]["type"] == "GPT2BPETokenizer" and res["tokenizer"]["files_match"] is True
    sample = res["sample"]
    assert sample["document"] == 0 and sample["ids"] == gpt2.tokenize(texts[0])[:16]
    assert sample["text"] == gpt2.detokenize(sample["ids"])


def test_inspect_table(prepared):
    _, prefix = prepared
    out = _inspect(prefix)
    assert out.exit_code == 0, out.output
    for word in ("documents", "tokens", "GPT2BPETokenizer", "histogram", "sample"):
        assert word in out.output


def test_inspect_without_record_shows_ids_only(prepared, tmp_path):
    _, prefix = prepared
    copy = tmp_path / "plain"
    for ext in (".bin", ".idx"):
        shutil.copy(prefix + ext, str(copy) + ext)
    out = _inspect(str(copy), "--json")
    assert out.exit_code == 0, out.output
    res = json.loads(out.output)["result"]
    assert res["tokenizer"] is None and res["sample"]["text"] is None and res["sample"]["ids"]
    assert res["documents"] == 13


def test_inspect_notices_a_changed_tokenizer_file(prepared, tmp_path):
    _, prefix = prepared
    vocab = tmp_path / "vocab.json"
    shutil.copy(GPT2_ARGS["vocab_file"], vocab)
    copy = tmp_path / "d"
    for ext in (".bin", ".idx", ".dlmspec.json"):
        shutil.copy(prefix + ext, str(copy) + ext)
    record = json.loads(Path(str(copy) + ".dlmspec.json").read_text())
    record["tokenizer"]["files"]["vocab_file"] = {"path": str(vocab), "sha256": "0" * 64}
    Path(str(copy) + ".dlmspec.json").write_text(json.dumps(record))
    res = json.loads(_inspect(str(copy), "--json").output)["result"]
    assert res["tokenizer"]["files_match"] is False and res["sample"]["text"] is None
    assert any("vocab_file" in note for note in res["notes"])


def test_inspect_accepts_the_output_prefix_and_bin_name(prepared):
    result, prefix = prepared
    assert json.loads(_inspect(prefix + ".bin", "--json").output)["ok"] is True
    out = _inspect(result.output_prefix, "--json")  # --output-prefix of prepare: one key -> its dataset
    assert out.exit_code == 0 and json.loads(out.output)["result"]["prefix"] == prefix


@pytest.mark.parametrize("case", ["missing", "garbage"])
def test_inspect_bad_input_exits_2_naming_the_file(case, tmp_path):
    prefix = tmp_path / "x"
    if case == "garbage":
        (tmp_path / "x.bin").write_bytes(b"")
        (tmp_path / "x.idx").write_bytes(b"not an index")
    out = _inspect(str(prefix))
    assert out.exit_code == 2
    assert str(prefix) in out.output and "Traceback" not in out.output
    assert ("no dataset" if case == "missing" else "not a Megatron index") in out.output


def test_record_for_every_key(tmp_path):
    source = tmp_path / "d.jsonl"
    source.write_text(json.dumps({"a": "1 2 3", "b": "4 5"}) + "\n")
    result = prepare(source, tmp_path / "o", tokenizer_type="NullTokenizer", vocab_size=10, json_keys="a,b")
    for out, tokens in zip(result.datasets, (3, 2)):
        record = read_record(out.prefix)
        assert record["tokens"] == tokens and record["tokenizer"]["eod_id"] == 10
        assert record["tokenizer"]["files"] == {}
    res = json.loads(_inspect(result.datasets[0].prefix, "--json").output)["result"]
    assert res["sample"]["text"] == "1 2 3"
    assert np.array_equal(res["sample"]["ids"], [1, 2, 3])


def test_sft_chat_tokens_decode_to_their_text(tmp_path):
    """An SFT dataset's chat tokens (ids past the vocabulary, in the record's sft section) are
    shown as their text in the decoded sample, and a note names them (README trial: <|im_start|>
    vanished from the sample)."""
    from dlmspec.data.inspect import _decode

    class Tok:
        def detokenize(self, ids):
            return "".join(chr(ord("a") + i) for i in ids)

    import dlmspec.tokenizers as toks
    section = {"type": "GPT2BPETokenizer", "files": {}, "files_match": True, "vocab_size": 5}
    original = toks.build_tokenizer
    toks.build_tokenizer = lambda *a, **k: Tok()
    try:
        assert _decode(section, [7, 0, 1, 8], [], {7: "<|im_start|>", 8: "<|im_end|>"}) == "<|im_start|>ab<|im_end|>"
    finally:
        toks.build_tokenizer = original


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, texts):
    """The same documents prepared whole and in shards of about 2,000 tokens (several shards)."""
    root = tmp_path_factory.mktemp("inspect-shards")
    source = kit.write_jsonl(root / "docs.jsonl", texts + [""])
    whole = prepare(source, root / "whole", append_eod=True, **GPT2_ARGS).datasets[0].prefix
    prepare(source, root / "web", append_eod=True, shard_size=2000, **GPT2_ARGS)
    manifest = root / "web_text_document.manifest.json"
    assert manifest.is_file() and len(json.loads(manifest.read_text())["shards"]) > 1
    return root, whole, manifest


def test_inspect_a_manifest_shows_the_whole_sharded_dataset(sharded):
    """A sharded output is inspected as one dataset: its manifest, the manifest's prefix or the
    --output-prefix give the counts and histogram of all shards together (those of the same
    documents prepared whole), the shards, and a sample found by its document number."""
    root, whole, manifest = sharded
    one = json.loads(_inspect(whole, "--json", "--sample-document", "5").output)["result"]
    for name in (str(manifest), str(manifest)[: -len(".manifest.json")], str(root / "web")):
        out = _inspect(name, "--json", "--sample-document", "5")
        assert out.exit_code == 0, (name, out.output)
        res = json.loads(out.output)["result"]
        for key in ("documents", "sequences", "tokens", "empty_documents", "max_document_tokens", "histogram", "dtype"):
            assert res[key] == one[key], (name, key)
        assert res["sample"] == one["sample"] and res["tokenizer"]["files_match"] is True
        shards = res["shards"]
        assert len(shards) > 1 and sum(s["tokens"] for s in shards) == one["tokens"]
        assert all(Path(s["prefix"] + ".idx").is_file() for s in shards)
    table = _inspect(str(manifest))
    assert table.exit_code == 0 and "shards" in table.output
    # a manifest whose shard is gone: exit 2 naming the shard
    gone = json.loads(manifest.read_text())["shards"][0]["path"]  # the copy in bad/ has no shards beside it
    bad = root / "bad"
    bad.mkdir()
    copy = bad / manifest.name
    copy.write_text(manifest.read_text())
    out = _inspect(str(copy))
    assert out.exit_code == 2 and gone in out.output and "Traceback" not in out.output
