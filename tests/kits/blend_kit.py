"""Helpers shared by tests (moved from test_blend.py): BASE, spec."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
import tomli_w


#: A small valid spec (8 GPUs, NullTokenizer of 999: EOD 999); ``data.train`` is the test's.
BASE: dict[str, Any] = {
    "name": "t",
    "model": {"num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024, "num_attention_heads": 8,
              "num_query_groups": 4, "vocab_size": 1000, "max_position_embeddings": 1024},
    "train": {"micro_batch_size": 2, "global_batch_size": 64, "seq_length": 512, "train_iters": 100,
              "lr_warmup_iters": 10, "eval_interval": 50},
    "data": {"train": ["data/web-*_text_document"], "tokenizer": {"type": "NullTokenizer", "vocab_size": 999}},
    "cluster": {"gpu": "h100", "gpus_per_node": 8, "nodes": 1},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
}


def spec(folder: Path, train: Any = None, name: str = "spec.toml", **data: Any) -> Path:
    body = copy.deepcopy(BASE)
    if train is not None:
        body["data"]["train"] = train
    body["data"].update(data)
    path = folder / name
    path.write_text(tomli_w.dumps(body), encoding="utf-8")
    return path
