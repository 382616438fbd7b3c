"""Helpers shared by tests (moved from test_blend.py): BASE, spec."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
import tomli_w
from spec_kit import spec_dict


#: A small valid spec (8 GPUs, NullTokenizer of 999: EOD 999); ``data.train`` is the test's.
BASE: dict[str, Any] = spec_dict({
    "data": {"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}, "train": ["data/web-*_text_document"]},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
})


def spec(folder: Path, train: Any = None, name: str = "spec.toml", **data: Any) -> Path:
    body = copy.deepcopy(BASE)
    if train is not None:
        body["data"]["train"] = train
    body["data"].update(data)
    path = folder / name
    path.write_text(tomli_w.dumps(body), encoding="utf-8")
    return path
