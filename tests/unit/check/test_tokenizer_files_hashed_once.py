"""The ``data-tokenizer-spec`` rule (dlmspec/check/data.py) compares each dataset's record with
the spec's tokenizer files by SHA-256: each spec file is hashed once per check, not once per
shard, so a manifest of many shards validates in time linear in its shards."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w


import tokenizer_kit as kit  # noqa: E402
from blend_shards import docs_of, manifest_text, write_shard  # noqa: E402

from dlmspec.check import data as data_rules  # noqa: E402
from dlmspec.cli import main  # noqa: E402
from dlmspec.data.record import file_sha256  # noqa: E402

pytestmark = pytest.mark.shared_data  # reads the offline data kit (tests/kits/shared_kit.py)

GPT2 = Path(kit.CORPUS).parents[1] / "tokenizers" / "gpt2"
SHARDS = 300


def test_each_spec_tokenizer_file_is_hashed_once_for_many_shards(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    files = {"vocab_file": GPT2 / "vocab.json", "merge_file": GPT2 / "merges.txt"}
    section = {"type": "GPT2BPETokenizer", "vocab_size": 50257, "eod_id": 50256,
               "files": {k: {"path": str(p), "sha256": file_sha256(str(p))} for k, p in files.items()}}
    names = [f"sh-{i:05d}_text_document" for i in range(SHARDS)]
    for name in names:
        write_shard(name, docs_of(8), section)
    Path("sh.manifest.json").write_text(manifest_text([(n, 2, 8) for n in names], section))
    spec = {"name": "t",
            "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
                      "num_query_groups": 2, "vocab_size": 50257, "max_position_embeddings": 256},
            "train": {"micro_batch_size": 1, "global_batch_size": 1, "seq_length": 64, "train_iters": 10},
            "data": {"train": [{"prefix": "sh.manifest.json", "weight": 1.0}],
                     "tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": str(files["vocab_file"]),
                                   "merge_file": str(files["merge_file"])}},
            "cluster": {"gpu": "h100", "gpus_per_node": 1, "nodes": 1}}
    Path("spec.toml").write_text(tomli_w.dumps(spec))
    hashed: list[str] = []

    def counting(path: str) -> str:
        hashed.append(path)
        return file_sha256(path)

    monkeypatch.setattr(data_rules, "file_sha256", counting)
    code = main(["validate", "spec.toml"])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert sorted(hashed) == sorted(str(p) for p in files.values())
