"""Tiny Megatron indexed datasets for the blend tests, written without torch: the layout of
megatron-core's ``IndexedDatasetBuilder`` (one sequence per document; tests/integration/runtime/test_blend_runtime.py
checks that the bytes equal the builder's), a dataset record, and a manifest of shards."""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Sequence

#: megatron.core.datasets.indexed_dataset: the .idx magic and DType.uint16's code.
INDEX_HEADER = b"MMIDIDX\x00\x00"
UINT16 = 8


def index_bytes(lengths: Sequence[int]) -> bytes:
    """The .idx of uint16 documents of ``lengths`` tokens (one sequence each)."""
    pointers, at = [], 0
    for n in lengths:
        pointers.append(at)
        at += 2 * n
    return (INDEX_HEADER + struct.pack("<Q", 1) + struct.pack("<B", UINT16)
            + struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1)
            + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(lengths)}q", *pointers)
            + struct.pack(f"<{len(lengths) + 1}q", *range(len(lengths) + 1)))


def data_bytes(docs: Sequence[Sequence[int]]) -> bytes:
    """The .bin of uint16 documents ``docs``."""
    return b"".join(struct.pack(f"<{len(d)}H", *d) for d in docs)


def write_shard(prefix: str, docs: Sequence[Sequence[int]], tokenizer: dict[str, Any] | None = None) -> str:
    """Write ``PREFIX.bin`` / ``PREFIX.idx`` (and, with ``tokenizer``, the record
    ``PREFIX.dlmspec.json`` with that tokenizer section); returns ``prefix``."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(prefix + ".bin", "wb") as f:
        f.write(data_bytes(docs))
    with open(prefix + ".idx", "wb") as f:
        f.write(index_bytes([len(d) for d in docs]))
    if tokenizer is not None:
        record = {"schema": "dlmspec.dataset", "version": 1, "tokenizer": tokenizer,
                  "documents": len(docs), "tokens": sum(map(len, docs))}
        with open(prefix + ".dlmspec.json", "w", encoding="utf-8") as f:
            json.dump(record, f)
    return prefix


def null_tokenizer(vocab_size: int = 999) -> dict[str, Any]:
    """A record's tokenizer section of a NullTokenizer (dlmspec/data/record.py tokenizer_section)."""
    return {"type": "NullTokenizer", "vocab_size": vocab_size, "eod_id": vocab_size, "files": {}}


def manifest_text(shards: Sequence[tuple[str, int, int]], tokenizer: dict[str, Any] | None = None,
                  kind: str = "dlmspec-dataset-manifest", version: int = 1) -> str:
    """A manifest of ``(path relative to the manifest's folder, documents, tokens)`` shards."""
    return json.dumps({"kind": kind, "version": version, "tokenizer": tokenizer or null_tokenizer(),
                       "shards": [{"path": p, "documents": d, "tokens": t} for p, d, t in shards]})


def docs_of(tokens: int, per_doc: int = 4, start: int = 1) -> list[list[int]]:
    """Documents of ``per_doc`` ids (the last one shorter) holding ``tokens`` tokens in all."""
    ids = [start + i % 100 for i in range(tokens)]
    return [ids[i:i + per_doc] for i in range(0, tokens, per_doc)]
