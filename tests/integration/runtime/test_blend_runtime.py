"""CPU test of shards named in the spec: a spec whose ``data.train`` is a glob of three
shards compiles to a blend that megatron-core's ``BlendedMegatronDatasetBuilder`` loads (through
``dlmspec.backends.megatron.data.build_datasets``, as train.py does), sampling each shard by its
share of the tokens; and the torch-free shard writer of the compile tests (tests/kits/blend_shards.py)
writes the bytes megatron-core's ``IndexedDatasetBuilder`` writes."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder


from blend_shards import docs_of, write_shard  # noqa: E402
from blend_kit import spec  # noqa: E402

from dlmspec.backends.megatron.data import DataConfig, build_datasets  # noqa: E402
from dlmspec.render.compile import compile_spec  # noqa: E402

EOD = 999
#: Documents of shard i: 50 * (i + 1) documents of 5 ids in [100 i + 1, 100 i + 90] and an EOD.
DOCS = (50, 100, 150)


#: the one-process gloo world of tests/conftest.py, for every test here
pytestmark = pytest.mark.usefixtures("gloo_world")


def write_with_megatron(prefix: str, docs: list[list[int]]) -> None:
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for doc in docs:
        builder.add_document(np.asarray(doc, dtype=np.int64), [len(doc)])
    builder.finalize(prefix + ".idx")


def test_the_test_writer_writes_what_megatron_writes(tmp_path: Path) -> None:
    docs = docs_of(37, per_doc=5) + [[EOD]]
    write_with_megatron(str(tmp_path / "m"), docs)
    write_shard(str(tmp_path / "h"), docs)
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"h{ext}").read_bytes() == (tmp_path / f"m{ext}").read_bytes()


def test_megatron_loads_the_compiled_blend_of_a_glob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    for i, n in enumerate(DOCS):
        docs = [[int(x) for x in rng.integers(100 * i + 1, 100 * i + 91, 5)] + [EOD] for _ in range(n)]
        write_with_megatron(f"data/web-{i:05d}_text_document", docs)
    compile_spec(spec(tmp_path, ["data/web-*_text_document"]), tmp_path / "out")
    line = next(x.strip() for x in (tmp_path / "out" / "train.py").read_text().splitlines()
                if x.strip().startswith("blend="))
    blend = ast.literal_eval(line[len("blend="):].rstrip(","))
    assert [w for _, w in blend] == pytest.approx([1 / 6, 2 / 6, 3 / 6])
    data = DataConfig(seq_length=8, vocab_size=1000, eod_id=EOD, blend=blend, split="100,0,0",
                      cache_dir=str(tmp_path / "cache"))
    train, _ = build_datasets(data, seed=1, train_samples=600, valid_samples=0, add_extra_token_to_sequence=False)
    assert isinstance(train, BlendedDataset) and len(train.datasets) == 3
    assert [d.dataset.path_prefix for d in train.datasets] == [p for p, _ in blend]
    counts = np.bincount(np.asarray(train.dataset_index[:600]), minlength=3) / 600
    assert counts == pytest.approx([1 / 6, 2 / 6, 3 / 6], abs=0.02)
    for i in range(0, 600, 37):  # each sample's ids come from its shard
        k = int(train.dataset_index[i])
        ids = train[i]["tokens"].numpy()
        ids = ids[ids != EOD]
        assert ((ids > 100 * k) & (ids <= 100 * k + 90)).all()
