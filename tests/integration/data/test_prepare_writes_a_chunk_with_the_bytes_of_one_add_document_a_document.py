"""`dlmspec data prepare` writes a chunk of documents with one call of its dataset builder
(``add_documents``): the .bin and .idx are byte for byte those of megatron-core's
``IndexedDatasetBuilder.add_document`` called once a document, for documents of several sequences,
empty documents (a boundary only) and a chunk of none; lengths that do not add up are refused."""

from __future__ import annotations

import numpy as np
import pytest

from dlmspec.data.prepare import load_runtime

#: (tokens of each sequence, per document): a document of two sequences, an empty one, one of one
CHUNKS = [
    [[[1, 2, 3], [4]], [], [[5, 6]]],
    [],
    [[], [], [[7, 8, 9, 10]]],
    [[[11]]],
]


def _reference(path, dtype):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(path) + ".bin", dtype=dtype)
    for chunk in CHUNKS:
        for document in chunk:
            builder.add_document(np.asarray([t for s in document for t in s], dtype=dtype), [len(s) for s in document])
    builder.finalize(str(path) + ".idx")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_a_chunk_a_call_gives_the_bytes_of_a_call_a_document(tmp_path, dtype):
    _, _, builder_class = load_runtime()
    builder = builder_class(str(tmp_path / "mine.bin"), dtype=dtype)
    for chunk in CHUNKS:
        tokens = np.asarray([t for d in chunk for s in d for t in s], dtype=dtype)
        builder.add_documents(tokens, [len(s) for d in chunk for s in d], [len(d) for d in chunk])
    builder.finalize(str(tmp_path / "mine.idx"))
    _reference(tmp_path / "theirs", dtype)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"mine{ext}").read_bytes() == (tmp_path / f"theirs{ext}").read_bytes(), ext


def test_lengths_that_do_not_add_up_are_refused(tmp_path):
    _, _, builder_class = load_runtime()
    builder = builder_class(str(tmp_path / "x.bin"), dtype=np.int32)
    with pytest.raises(ValueError, match="3 tokens"):
        builder.add_documents(np.arange(3, dtype=np.int32), [2], [1])
    with pytest.raises(ValueError, match="documents of 2"):
        builder.add_documents(np.arange(3, dtype=np.int32), [3], [2])
    builder.finalize(str(tmp_path / "x.idx"))
