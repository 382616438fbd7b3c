"""A results folder keeps each dataset's ``.idx`` (document lengths) but not its ``.bin`` (tokens):
``dlmspec fit`` counts a capped dataset's unique tokens, and so the epochs, from the index alone;
a ``.bin`` that is there is still checked against it."""

from __future__ import annotations

from pathlib import Path

import scaling_kit
from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.scaling.runs import read_point

CAPPED = {"data.mock": None, "data.split": "100,0,0",
          "data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 10}]}


def test_a_capped_dataset_is_counted_from_its_index_without_its_tokens(tmp_path: Path) -> None:
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(400), null_tokenizer())  # 100 documents of 4 tokens
    (tmp_path / "data/a_text_document.bin").unlink()
    run = scaling_kit.write_run(tmp_path / "runs" / "r", shape=(4, 256), tokens=80, loss=3.0, data=CAPPED)
    point = read_point(str(run))
    assert point.unique_tokens == 8 and point.epochs == 10.0, point.unique_why  # 2 whole documents under the cap


def test_a_truncated_bin_beside_the_index_still_leaves_the_count_unknown(tmp_path: Path) -> None:
    write_shard(str(tmp_path / "data/a_text_document"), docs_of(400), null_tokenizer())
    (tmp_path / "data/a_text_document.bin").write_bytes(b"\0" * 10)
    run = scaling_kit.write_run(tmp_path / "runs" / "r", shape=(4, 256), tokens=80, loss=3.0, data=CAPPED)
    point = read_point(str(run))
    assert point.unique_tokens is None and "truncated" in point.unique_why
