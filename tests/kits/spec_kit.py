"""The one spec factory of the tests: a small valid spec as a dict, as TOML text, or as a file.

``DEFAULT`` is a spec of 8 H100s (one node), 4 layers of hidden size 256 (8 heads, 4 query groups,
head dim 32), vocabulary 1000, sequence length 512, micro batch 2, global batch 64, 100 iterations,
and megatron's mock data with a NullTokenizer (vocab_size 999 + 1 = 1000 ids). It validates clean.
A test states only what it changes:

    spec_dict({"train.seq_length": 1024})            # dotted keys; a value of None deletes the key
    spec_dict(TRAIN_FILES, name="v")                 # several change sets, applied in order
    spec_dict(model={"num_layers": 8})               # a table's keys merged into it
    spec_file(tmp_path, {"parallel.tensor_model_parallel_size": 2})   # written as TOML

tests/conftest.py hands ``spec_dict`` and ``spec_file`` to tests as fixtures; modules that need a
spec at import time (for ``parametrize``) import them from here. The suite's rules
(tests/unit/suite/test_suite_rules.py) refuse a module-level dict or TOML literal that holds a
whole spec anywhere else.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomli_w

DEFAULT: dict[str, Any] = {
    "name": "t",
    "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
              "num_query_groups": 4, "vocab_size": 1000, "max_position_embeddings": 1024},
    "train": {"micro_batch_size": 2, "global_batch_size": 64, "seq_length": 512, "train_iters": 100,
              "lr_warmup_iters": 10, "eval_interval": 50},
    "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
    "cluster": {"gpu": "h100", "gpus_per_node": 8, "nodes": 1},
}

#: Data from files (``data/x_text_document``) instead of megatron's mock data.
TRAIN_FILES: dict[str, Any] = {"data.mock": None, "data.train": ["data/x_text_document"]}

#: A tiny model (2 layers, hidden 64, 4 heads, no query groups) on short sequences: 10 iterations of
#: global batch 8, micro batch 1, sequence 128.
TINY: dict[str, Any] = {
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
              "vocab_size": 1000, "max_position_embeddings": 256},
    "train": {"micro_batch_size": 1, "global_batch_size": 8, "seq_length": 128, "train_iters": 10,
              "eval_interval": 5},
}


def apply(data: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """Set each dotted key of ``changes`` in ``data`` (in place; tables made as needed); None deletes."""
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return data


def spec_dict(*changes: Mapping[str, Any], **tables: Any) -> dict[str, Any]:
    """A fresh copy of :data:`DEFAULT` with each mapping of dotted-key ``changes`` applied in order,
    then each keyword: a dict replaces the table whole when given as ``table=...`` and the table did
    not exist; merged key by key into an existing table; any other value set as it is (``name="v"``).
    A nested dict in ``TINY``-style change sets (``{"model": {...}}``) replaces that table whole."""
    data = copy.deepcopy(DEFAULT)
    for change in changes:
        apply(data, change)
    for table, value in tables.items():
        if isinstance(value, Mapping) and isinstance(data.get(table), dict):
            data[table].update(copy.deepcopy(dict(value)))
        else:
            data[table] = copy.deepcopy(value)
    return data


def spec_toml(*changes: Mapping[str, Any], **tables: Any) -> str:
    """:func:`spec_dict` as TOML text."""
    return tomli_w.dumps(spec_dict(*changes, **tables))


def spec_file(folder: Path, *changes: Mapping[str, Any], file_name: str = "spec.toml", **tables: Any) -> Path:
    """:func:`spec_dict` written as TOML to ``folder / file_name``; returns the path."""
    return write_toml(Path(folder) / file_name, spec_dict(*changes, **tables))


def write_toml(path: Path, data: Mapping[str, Any]) -> Path:
    """``data`` (a spec a test built itself, e.g. from a bundled spec or :func:`spec_dict`) written as
    TOML (``tomli_w``, UTF-8) to ``path``, parent folders made as needed; returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(dict(data)), encoding="utf-8")
    return path
