"""``dlmspec plan`` and ``dlmspec show`` state, per training dataset, its unique tokens (after the
cap), the tokens the run draws from it, the epochs and the unique tokens seen, with the run's
totals (``--json``: ``result.data``); a dataset whose counts cannot be read here is named as
unknown, with why; ``show``'s lines are comments, so its output still loads."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.cli import main
from spec_kit import spec_file

#: 32 tokens a step, 10 steps: 320 drawn; a: 40 tokens capped to 12 (three 4-token documents), weight 1;
#: b: 100 tokens, weight 3.
RUN = {"data.mock": None, "data.tokenizer": {"type": "NullTokenizer", "vocab_size": 999},
       "data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 13},
                      {"prefix": "data/b_text_document", "weight": 3.0}],
       "data.valid": ["data/v_text_document"], "train.seq_length": 8, "train.global_batch_size": 4,
       "train.micro_batch_size": 1, "train.train_iters": 10, "train.lr_warmup_iters": 0, "train.eval_interval": 5,
       "model.max_position_embeddings": 64, "cluster.gpus_per_node": 4}


@pytest.fixture
def spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    for name, tokens in (("a", 40), ("b", 100), ("v", 16)):
        write_shard(str(tmp_path / f"data/{name}_text_document"), docs_of(tokens), null_tokenizer())
    return spec_file(tmp_path, RUN)


def test_plan_json_holds_each_dataset_and_the_totals(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", str(spec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["result"]["data"]
    a, b = data["datasets"]
    assert (a["max_unique_tokens"], a["unique_tokens"], a["drawn_tokens"], a["seen_tokens"]) == (13, 12, 80, 12)
    assert a["epochs"] == pytest.approx(80 / 12) and a["kept_documents"] == 3 and a["tokens"] == 40
    assert (b["unique_tokens"], b["drawn_tokens"], b["epochs"], b["seen_tokens"]) == (100, 240, 2.4, 100)
    assert (data["drawn_tokens"], data["unique_tokens"], data["seen_tokens"]) == (320, 112, 112)
    assert data["epochs"] == pytest.approx(320 / 112) and data["epoch_threshold"] == 100.0


def test_plan_text_prints_the_epochs(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "data/a_text_document: 12 unique tokens (max_unique_tokens 13: 3 documents), weight 0.250, " \
           "draws 80, 6.67 epochs, 12 unique seen" in out
    assert "total: 112 unique tokens, 320 drawn, 2.86 epochs, 112 unique seen" in out


def test_show_states_the_epochs_as_comments_and_still_loads(spec: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["show", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "# training data: 320 tokens drawn" in out and "#   data/b_text_document: 100 unique tokens" in out
    tomllib.loads(out)  # the lines are comments
    assert main(["show", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"]["data"]["unique_tokens"] == 112


def test_unreadable_counts_are_named_not_guessed(spec: Path, capsys: pytest.CaptureFixture) -> None:
    (spec.parent / "data/b_text_document.idx").unlink()
    (spec.parent / "data/b_text_document.dlmspec.json").unlink()
    assert main(["plan", str(spec), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["result"]["data"]
    assert data["unique_tokens"] is None and data["epochs"] is None
    assert data["datasets"][1]["epochs"] is None and "no record" in data["datasets"][1]["unknown"]
    assert main(["plan", str(spec)]) == 0
    out = capsys.readouterr().out
    assert "unknown: data/b_text_document.idx" in out and "total: unknown unique tokens" in out
