"""``data.train[].max_unique_tokens`` reaches the compiled train.py as ``DataConfig.max_unique_tokens``
(``{prefix: cap}``), and the lock keeps it so a lock compiles to the same run; a spec without a
cap compiles without the line (the bundled specs' compiled output is unchanged: the golden test)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

from blend_shards import docs_of, null_tokenizer, write_shard
from dlmspec.render.compile import compile_spec
from spec_kit import spec_file

FILES = {"data.mock": None, "data.tokenizer": {"type": "NullTokenizer", "vocab_size": 999},
         "logging.tensorboard_dir": "runs/t/tensorboard"}


def _caps(train_py: Path):
    for line in train_py.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("max_unique_tokens="):
            return ast.literal_eval(line.strip()[len("max_unique_tokens="):].split("  #")[0].rstrip(","))
    return None


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name, tokens in (("a", 400), ("b", 400)):
        write_shard(str(tmp_path / f"data/{name}_text_document"), docs_of(tokens), null_tokenizer())
    return tmp_path


def test_the_cap_is_compiled_into_the_data_config(data: Path) -> None:
    spec = spec_file(data, FILES, {"data.train": [{"prefix": "data/a_text_document", "max_unique_tokens": 100},
                                                  "data/b_text_document"]})
    compile_spec(spec, data / "out")
    assert _caps(data / "out" / "train.py") == {"data/a_text_document": 100}
    lock = tomllib.loads((data / "out" / "spec.lock.toml").read_text(encoding="utf-8"))
    assert lock["data"]["train"][0]["max_unique_tokens"] == 100
    compile_spec(data / "out" / "spec.lock.toml", data / "again")  # the lock compiles to the same caps
    assert _caps(data / "again" / "train.py") == {"data/a_text_document": 100}


def test_no_cap_no_line(data: Path) -> None:
    compile_spec(spec_file(data, FILES, {"data.train": ["data/a_text_document"]}), data / "out")
    assert _caps(data / "out" / "train.py") is None
    assert "max_unique_tokens" not in (data / "out" / "train.py").read_text(encoding="utf-8")
