"""Epochs and unique tokens of a run's training data (dlmspec/data/repetition.py) against hand
counts: blend weights over several datasets, a glob of shards, the data.split carve-out, the
max_unique_tokens cap, train_tokens for train_iters, and datasets whose counts cannot be read.

Datasets are tiny Megatron indexed datasets of 4-token documents (tests/kits/blend_shards.py:
``docs_of(n)`` holds ``n`` tokens in ``ceil(n / 4)`` documents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from spec_kit import spec_file
from dlmspec.data.repetition import (
    AR_EPOCHS, DIFFUSION_EPOCHS, capped_documents, dataset_tokens, repetition, repetition_lines, train_split_bounds,
)
from dlmspec.resolve import resolve
from dlmspec.spec.load import load

#: 32 tokens a step (global batch 4 x sequence 8), 10 steps: 320 tokens drawn.
RUN = {"data.mock": None, "train.seq_length": 8, "train.global_batch_size": 4, "train.micro_batch_size": 1,
       "train.train_iters": 10, "train.lr_warmup_iters": 0}


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """data/a (40 tokens, 10 documents), data/b (100 tokens, 25 documents), data/v (validation),
    three shards data/web-0000{0,1,2} of 10, 20 and 30 tokens; tmp_path the working directory."""
    monkeypatch.chdir(tmp_path)
    for name, tokens in (("a", 40), ("b", 100), ("v", 16), ("web-00000", 10), ("web-00001", 20), ("web-00002", 30)):
        write_shard(str(tmp_path / f"data/{name}_text_document"), docs_of(tokens), null_tokenizer())
    return tmp_path


def _rep(folder: Path, **changes):
    loaded = load(spec_file(folder, RUN, changes))
    return repetition(loaded.spec, resolve(loaded.spec))


def test_weights_split_the_draws_and_epochs_are_draws_over_unique_tokens(data: Path) -> None:
    rep = _rep(data, **{"data.train": [{"prefix": "data/a_text_document", "weight": 1.0},
                                                   {"prefix": "data/b_text_document", "weight": 3.0}],
                                   "data.valid": ["data/v_text_document"]})
    a, b = rep.datasets
    # 320 drawn; a: 1/4 of it (80) over 40 tokens, b: 3/4 (240) over 100
    assert rep.drawn_tokens == 320
    assert (a.weight, a.drawn_tokens, a.data.unique_tokens, a.epochs, a.seen_tokens) == (0.25, 80, 40, 2.0, 40)
    assert (b.weight, b.drawn_tokens, b.data.unique_tokens, b.epochs, b.seen_tokens) == (0.75, 240, 100, 2.4, 100)
    assert (rep.unique_tokens, rep.seen_tokens) == (140, 140)
    assert rep.epochs == pytest.approx(320 / 140)
    assert a.data.source == "index" and a.data.documents == 10


def test_less_than_an_epoch_sees_only_what_it_draws(data: Path) -> None:
    rep = _rep(data, **{"data.train": ["data/b_text_document"], "data.valid": ["data/v_text_document"],
                                   "train.train_iters": 2})
    (b,) = rep.datasets
    assert (b.drawn_tokens, b.epochs, b.seen_tokens) == (64, 0.64, 64)


def test_cap_keeps_the_longest_prefix_of_whole_documents(data: Path) -> None:
    # 13 tokens: three 4-token documents (12); a fourth would make 16
    rep = _rep(data, **{"data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 13},
                                                   {"prefix": "data/b_text_document", "weight": 3.0}],
                                   "data.valid": ["data/v_text_document"]})
    a, b = rep.datasets
    assert (a.data.cap, a.data.kept_documents, a.data.split_tokens, a.data.unique_tokens) == (13, 3, 40, 12)
    assert a.epochs == pytest.approx(80 / 12) and a.seen_tokens == 12
    assert rep.unique_tokens == 112 and rep.epochs == pytest.approx(320 / 112)
    assert "max_unique_tokens 13: 3 documents" in "\n".join(repetition_lines(rep))


def test_a_glob_of_shards_shares_its_weight_by_tokens(data: Path) -> None:
    rep = _rep(data, **{"data.train": [{"prefix": "data/web-*_text_document", "weight": 2.0},
                                                   {"prefix": "data/a_text_document", "weight": 2.0}],
                                   "data.valid": ["data/v_text_document"]})
    # the glob's half of the draws (160) split 10:20:30 over its shards; a gets the other 160
    by_prefix = {d.data.prefix: d for d in rep.datasets}
    for i, tokens in enumerate((10, 20, 30)):
        shard = by_prefix[f"data/web-{i:05d}_text_document"]
        assert shard.drawn_tokens == pytest.approx(160 * tokens / 60)
        assert shard.epochs == pytest.approx(160 / 60)  # every shard of a group is drawn alike
        assert shard.data.entry == "data/web-*_text_document"
    assert by_prefix["data/a_text_document"].epochs == pytest.approx(160 / 40)
    assert rep.unique_tokens == 100 and rep.epochs == pytest.approx(3.2)


def test_the_split_carves_validation_documents_out_first(data: Path) -> None:
    # no data.valid: "80,20,0" of a's 10 documents trains on the first round(0.8 * 10) = 8 (32 tokens)
    rep = _rep(data, **{"data.train": ["data/a_text_document"], "data.split": "80,20,0"})
    (a,) = rep.datasets
    assert (a.data.tokens, a.data.split_tokens, a.data.unique_tokens) == (40, 32, 32)
    assert a.epochs == pytest.approx(10.0)
    # and the cap applies inside the training split: 9 tokens keep two documents
    rep = _rep(data, **{"data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 9}],
                                   "data.split": "80,20,0"})
    assert (rep.datasets[0].data.kept_documents, rep.datasets[0].data.unique_tokens) == (2, 8)


def test_train_tokens_draw_what_the_rounded_up_steps_draw(data: Path) -> None:
    # 300 tokens at 32 a step: ceil(300 / 32) = 10 steps = 320 tokens
    rep = _rep(data, **{"data.train": ["data/a_text_document"], "data.valid": ["data/v_text_document"],
                                   "train.train_iters": None, "train.train_tokens": 300})
    assert rep.drawn_tokens == 320 and rep.epochs == 8.0


def test_unreadable_counts_are_unknown_and_say_why(data: Path) -> None:
    # no files at all: unknown, with the reason; nothing is estimated
    rep = _rep(data, **{"data.train": ["data/gone_text_document", "data/a_text_document"],
                                   "data.valid": ["data/v_text_document"]})
    gone, a = rep.datasets
    assert gone.epochs is None and gone.data.unique_tokens is None and "no record" in gone.data.why
    assert rep.unique_tokens is None and rep.epochs is None and a.epochs == 4.0
    assert any(line.startswith("  unknown: ") for line in repetition_lines(rep))


def test_a_record_alone_counts_only_what_needs_no_document_lengths(data: Path) -> None:
    record = {"schema": "dlmspec.dataset", "version": 1, "tokenizer": null_tokenizer(), "documents": 5,
              "tokens": 64}
    (data / "data/r_text_document.dlmspec.json").write_text(json.dumps(record), encoding="utf-8")
    rep = _rep(data, **{"data.train": ["data/r_text_document"], "data.valid": ["data/v_text_document"]})
    (r,) = rep.datasets
    assert (r.data.source, r.data.unique_tokens, r.epochs) == ("record", 64, 5.0)
    # a split or a cap needs each document's length: unknown, said so
    carved = dataset_tokens("data/r_text_document", split="99,1,0")
    capped = dataset_tokens("data/r_text_document", split=None, cap=10)
    assert carved.unique_tokens is None and "data.split '99,1,0' needs each document's length" in carved.why
    assert capped.unique_tokens is None and "the cap needs each document's length" in capped.why


def test_mock_data_repeats_nothing(tmp_path: Path) -> None:
    loaded = load(spec_file(tmp_path))
    assert repetition(loaded.spec, resolve(loaded.spec)) is None


def test_a_stage_that_reads_conversations_is_not_counted_as_pretraining(data: Path) -> None:
    # SFT reads one conversation per sample: the pre-training arithmetic would be wrong, so none is given
    loaded = load(spec_file(data, RUN, {"data.train": ["data/a_text_document"], "stage.kind": "sft"}))
    assert repetition(loaded.spec, resolve(loaded.spec)) is None


def test_a_rewritten_dataset_is_counted_again(data: Path) -> None:
    changes = {"data.train": ["data/a_text_document"], "data.valid": ["data/v_text_document"]}
    assert _rep(data, **changes).unique_tokens == 40
    write_shard(str(data / "data/a_text_document"), docs_of(48), null_tokenizer())
    assert _rep(data, **changes).unique_tokens == 48


def test_split_bounds_round_like_megatron_core() -> None:
    # megatron-core: int(round(f * S)) of the normalised train weight
    assert train_split_bounds(10, "99,1,0") == (0, 10)
    assert train_split_bounds(1000, "99,1,0") == (0, 990)
    assert train_split_bounds(7, "1,1") == (0, 4)  # round(3.5) = 4 (banker's rounding, as Python's round)
    assert train_split_bounds(9, "2,1") == (0, 6)
    assert train_split_bounds(9, None) == (0, 9)


def test_capped_documents_counts_whole_documents() -> None:
    assert capped_documents([5, 3, 7], 8) == 2
    assert capped_documents([5, 3, 7], 15) == 3
    assert capped_documents([5, 3, 7], 4) == 0
    with pytest.raises(ValueError):
        capped_documents([5], 0)


def test_thresholds_are_the_cited_ones() -> None:
    assert (AR_EPOCHS, DIFFUSION_EPOCHS) == (4.0, 100.0)


def test_a_pipe_in_place_of_the_index_is_refused_not_read(data: Path) -> None:
    import os

    os.mkfifo(data / "data/p_text_document.idx")  # opening it for reading would block
    (data / "data/p_text_document.bin").write_bytes(b"")
    counted = dataset_tokens("data/p_text_document", split=None, cap=10)
    assert counted.unique_tokens is None and "is a FIFO (named pipe), not a regular file" in counted.why, counted.why


def test_counting_in_pieces_gives_the_counts_of_the_whole(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is read CHUNK documents at a time; pieces of 3 documents give what one piece gives."""
    import dlmspec.data.repetition as repetition_module

    whole = [dataset_tokens("data/b_text_document", split="70,30", cap=cap) for cap in (None, 1, 9, 30, 70, 1000)]
    monkeypatch.setattr(repetition_module, "CHUNK", 3)
    repetition_module._dataset_tokens_cached.cache_clear()
    pieces = [dataset_tokens("data/b_text_document", split="70,30", cap=cap) for cap in (None, 1, 9, 30, 70, 1000)]
    assert pieces == whole
    # b: 25 documents of 4 tokens; "70,30" trains on round(0.7 x 25) = 18 (72 tokens)
    assert [(p.kept_documents, p.unique_tokens) for p in pieces] == [(18, 72), (0, 0), (2, 8), (7, 28), (17, 68),
                                                                    (18, 72)]
