"""Where the offline data kit lies: a real GPT-2 tokenizer and an English corpus of Python
documentation (``shared/data``: ``tokenizers/gpt2/{vocab.json,merges.txt}``,
``corpus/pydocs-{train,valid,test}.jsonl``). It is not part of the repository: it lies beside the
development checkout (``../shared/data``), or wherever ``$DLMSPEC_SHARED_DATA`` points (then only there).

Tests that read it carry ``pytestmark = pytest.mark.shared_data``; tests/conftest.py skips them, with
this module's reason, when the kit is not found (a clone elsewhere). Every other test runs without it.
"""

from __future__ import annotations

import os
from pathlib import Path


def _find() -> Path:
    env = os.environ.get("DLMSPEC_SHARED_DATA")
    if env:  # named: that one only
        return Path(env)
    candidates = [Path(__file__).resolve().parents[3] / "shared" / "data",  # ../shared/data beside the checkout
                  Path("/work/shared/data")]
    for path in candidates:
        if (path / "tokenizers" / "gpt2" / "vocab.json").is_file():
            return path
    return candidates[0]


#: The kit's root (``.../shared/data``); may not exist (see :data:`PRESENT`).
SHARED_DATA = _find()
#: Whether the kit was found.
PRESENT = (SHARED_DATA / "tokenizers" / "gpt2" / "vocab.json").is_file()
#: Why the marked tests are skipped when it was not.
MISSING_REASON = (f"the offline data kit (GPT-2 tokenizer and corpus) is not at {SHARED_DATA}: "
                  "put it beside the checkout as ../shared/data or set DLMSPEC_SHARED_DATA")
