"""``dlmspec fit`` counts a run's unique tokens with the planner's data arithmetic
(dlmspec/data/repetition.py): the data.split carve-out, the cap as a prefix of whole documents, and
globs of shards, against hand counts on tiny indexed datasets of 4-token documents; and it gives
the same number as the planner's repetition of the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

import scaling_kit
from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.data.repetition import repetition
from dlmspec.resolve import resolve
from dlmspec.scaling.runs import read_point
from dlmspec.spec.load import load


def _point(root: Path, data: dict, tokens: int = 100_000):
    run = scaling_kit.write_run(root / "runs" / "r", shape=(4, 256), tokens=tokens, loss=3.0,
                                data={"data.mock": None, **data})
    return read_point(str(run))


def test_the_validation_split_is_carved_out_of_the_unique_tokens(tmp_path: Path) -> None:
    # 400 tokens in 100 documents, with a record that says 400; split 99,1,0 trains on
    # documents [0, round(0.99 * 100)) = 99 documents = 396 tokens
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(400), null_tokenizer())
    point = _point(tmp_path, {"data.train": ["data/a_text_document"], "data.split": "99,1,0"})
    assert point.unique_tokens == 396
    assert point.epochs == pytest.approx(100_000 / 396)


def test_a_cap_keeps_whole_documents_not_a_token_count(tmp_path: Path) -> None:
    # a cap of 10 tokens over 4-token documents keeps 2 documents: 8 unique tokens
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(400), null_tokenizer())
    point = _point(tmp_path, {"data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 10}],
                              "data.split": "100,0,0"})
    assert point.unique_tokens == 8


def test_a_glob_of_shards_counts_every_shard(tmp_path: Path) -> None:
    for name, tokens in (("web-00000", 40), ("web-00001", 80)):
        write_shard(str(tmp_path / f"data/{name}_text_document"), docs_of(tokens), null_tokenizer())
    point = _point(tmp_path, {"data.train": ["data/web-*_text_document"], "data.split": "100,0,0"})
    assert point.unique_tokens == 120


def test_fit_and_the_planner_count_the_same_unique_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two datasets weighted 1:1 drawing 1,000 tokens: a (100 documents, split 99,1,0 trains 99:
    # 396 tokens) gives min(500, 396); b (10 documents, round(0.99 * 10) = 10: 40 tokens) min(500, 40)
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(400), null_tokenizer())
    write_shard(str(tmp_path / "data/b_text_document"), docs_of(40), null_tokenizer())
    data = {"data.train": [{"prefix": "data/a_text_document", "weight": 1.0},
                           {"prefix": "data/b_text_document", "weight": 1.0}],
            "data.split": "99,1,0", "train.seq_length": 8, "train.global_batch_size": 5,
            "train.micro_batch_size": 1, "train.train_iters": 25, "train.lr_warmup_iters": 0}
    point = _point(tmp_path, data, tokens=25 * 5 * 8)
    assert point.unique_tokens == 396 + 40
    monkeypatch.chdir(tmp_path)
    spec = load(tmp_path / "runs" / "r" / "spec.lock.toml").spec
    assert repetition(spec, resolve(spec)).seen_tokens == pytest.approx(point.unique_tokens)
