"""The failing examples of the rules of shards named in the spec (dlmspec/check/data.py):
a spec change of test_validate_compile_agree.BASE and the files beside it (tiny shards, their
records, manifests), as text. Shared by test_validate, test_validate_compile_agree and
test_remedies_validate; tests/unit/data/test_blend.py tests each rule in full."""

from __future__ import annotations

from pathlib import Path
from typing import Any


from blend_shards import data_bytes, docs_of, index_bytes, manifest_text, null_tokenizer  # noqa: E402

import json  # noqa: E402


def _shard(prefix: str, tokens: int, tokenizer: dict[str, Any] | None = None, per_doc: int = 4) -> dict[str, str]:
    """A shard's files as text (every byte of these small ids and counts is ASCII), with its record."""
    docs = docs_of(tokens, per_doc)
    files = {prefix + ".bin": data_bytes(docs).decode("ascii"),
             prefix + ".idx": index_bytes([len(d) for d in docs]).decode("ascii")}
    record = {"schema": "dlmspec.dataset", "version": 1, "tokenizer": tokenizer or null_tokenizer(),
              "documents": len(docs), "tokens": tokens}
    files[prefix + ".dlmspec.json"] = json.dumps(record)
    return files


MANIFEST = "data/x_text_document.manifest.json"
GLOB = "data/x-*_text_document"

#: rule -> (changes to agree.BASE, files, the key reported).
FILE_EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {
    "data-glob-empty": ({"data.train": [GLOB]}, {}, "data.train"),
    "data-manifest-missing": ({"data.train": [MANIFEST]}, {}, "data.train"),
    "data-manifest-unreadable": ({"data.train": [MANIFEST]}, {MANIFEST: "{"}, "data.train"),
    "data-manifest-kind": ({"data.valid": [MANIFEST]},
                           {MANIFEST: manifest_text([("x-00000_text_document", 3, 10)], kind="other"),
                            **_shard("data/x-00000_text_document", 10)}, "data.valid"),
    "data-shard-missing": ({"data.train": [MANIFEST]}, {MANIFEST: manifest_text([("x-00000_text_document", 3, 10)])},
                           "data.train"),
    "data-index-unreadable": ({"data.train": [GLOB]}, {"data/x-00000_text_document.bin": "",
                                                       "data/x-00000_text_document.idx": ""}, "data.train"),
    "data-manifest-tokens": ({"data.train": [MANIFEST]},
                             {MANIFEST: manifest_text([("x-00000_text_document", 3, 11)]),
                              **_shard("data/x-00000_text_document", 10)}, "data.train"),
    "data-tokenizer-mixed": ({"data.train": [GLOB]}, {**_shard("data/x-00000_text_document", 10),
                                                      **_shard("data/x-00001_text_document", 12,
                                                               null_tokenizer(vocab_size=500))}, "data.train"),
    "data-tokenizer-spec": ({"data.train": [GLOB]}, {**_shard("data/x-00000_text_document", 10, {
        "type": "SentencePieceTokenizer", "vocab_size": 999, "eod_id": 999, "files": {}})}, "data.train"),
    # one document of 4,112 tokens (0x1010: its index bytes stay ASCII); a cap above it; 3,276,800 tokens
    # drawn (100 x 64 x 512) from 4,112: 797 epochs
    "data-cap-tokens": ({"data.train": [{"prefix": "data/x_text_document", "max_unique_tokens": 5000}]},
                        _shard("data/x_text_document", 4112, per_doc=4112), "data.train"),
    "data-repetition": ({}, _shard("data/x_text_document", 4112, per_doc=4112), "data.train"),
}
