"""``dlmspec data inspect`` of an SFT dataset shows which tokens carry loss: the decoded sample with
each response span between ``[[`` and ``]]`` (plain text; coloured in the table), the sample's and
the dataset's loss-token counts and share; pre-training data shows none of it; a missing response
mask is a note, not a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlmspec.data.cli import app
from shared_kit import SHARED_DATA  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

GPT2 = SHARED_DATA / "tokenizers" / "gpt2"
GPT2_CLI = ["--tokenizer-type", "gpt2bpe", "--vocab-file", str(GPT2 / "vocab.json"),
            "--merge-file", str(GPT2 / "merges.txt")]
ROWS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "It is 4."}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there!"}]},
]


@pytest.fixture(scope="module")
def sft_prefix(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("sft-inspect")
    source = folder / "chats.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    out = CliRunner().invoke(app, ["prepare", "--sft", "--no-progress", "--input", str(source),
                                   "--output-prefix", str(folder / "chat"), *GPT2_CLI, "--json"])
    assert out.exit_code == 0, out.output
    return str(folder / "chat") + "_text_document"


def _inspect_json(prefix: str) -> dict:
    out = CliRunner().invoke(app, ["inspect", prefix, "--json"])
    assert out.exit_code == 0, out.output
    return json.loads(out.stdout)["result"]


def _mask(prefix: str) -> np.ndarray:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    data = IndexedDataset(prefix + "_response", mmap=True)
    return np.concatenate([np.asarray(data[i]) for i in range(len(data))])


def test_json_sample_flags_and_dataset_share_match_the_response_mask(sft_prefix):
    result = _inspect_json(sft_prefix)
    mask = _mask(sft_prefix)
    assert result["response"]["tokens"] == int(mask.sum()) > 0
    assert result["response"]["share"] == pytest.approx(mask.sum() / result["tokens"])
    sample = result["sample"]
    first_doc = _mask(sft_prefix)[: len(sample["ids"])]
    assert sample["response"] == [int(f) for f in first_doc]
    assert sample["response_tokens"] == sum(sample["response"])


def test_marked_sample_brackets_the_assistant_answer_and_not_the_prompt(sft_prefix):
    marked = _inspect_json(sft_prefix)["sample"]["marked"]
    assert "[[" in marked and "]]" in marked
    inside = "".join(part.split("]]", 1)[0] for part in marked.split("[[")[1:])
    outside = marked.split("[[", 1)[0]
    assert "It is 4." in inside
    assert "What is 2+2?" in outside and "What is 2+2?" not in inside
    assert marked.replace("[[", "").replace("]]", "") == _inspect_json(sft_prefix)["sample"]["text"]


def test_table_shows_the_loss_share_and_the_marked_sample(sft_prefix):
    out = CliRunner().invoke(app, ["inspect", sft_prefix])
    assert out.exit_code == 0, out.output
    assert "loss tokens" in out.stdout and "% of tokens" in out.stdout
    assert "[[" in out.stdout and "It is 4." in out.stdout


def test_pretraining_data_has_no_response_section(sft_prefix, tmp_path):
    from dlmspec.data.prepare import prepare

    source = tmp_path / "docs.jsonl"
    source.write_text(json.dumps({"text": "plain pre-training text"}) + "\n", encoding="utf-8")
    prefix = prepare(source, tmp_path / "pt", append_eod=True, tokenizer_type="GPT2BPETokenizer",
                     vocab_file=str(GPT2 / "vocab.json"), merge_file=str(GPT2 / "merges.txt")).datasets[0].prefix
    result = _inspect_json(prefix)
    assert result["response"] is None and "marked" not in result["sample"]


def test_a_missing_response_mask_is_a_note(sft_prefix, tmp_path):
    import shutil

    copy = tmp_path / "copy_text_document"
    for ext in (".bin", ".idx", ".dlmspec.json"):
        shutil.copy(sft_prefix + ext, str(copy) + ext)
    result = _inspect_json(str(copy))
    assert result["response"] is None
    assert any("response mask" in n for n in result["notes"])
    assert not os.path.exists(str(copy) + "_response.bin")
    assert Path(str(copy) + ".bin").is_file()
