"""dlmspec.data.index.check_index: a Megatron index whose numbers contradict each other or its
.bin is refused by name before anything trusts it, and ``dlmspec data inspect`` says so with exit
2 (never nonsense counts, never a traceback); the dataset record and manifest beside it are read
through dlmspec.files (a FIFO, /dev/zero, 100,000 nested brackets: exit 2)."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path
from typing import Sequence

import pytest
from typer.testing import CliRunner


from blend_shards import manifest_text, null_tokenizer, write_shard  # noqa: E402

from dlmspec.data.cli import app  # noqa: E402
from dlmspec.data.index import IndexInconsistent, check_index  # noqa: E402
from dlmspec.files import FileRefused  # noqa: E402

UINT16 = 8


def forged_index(lengths: Sequence[int], pointers: Sequence[int] | None = None,
                 documents: Sequence[int] | None = None) -> bytes:
    """A uint16 ``.idx`` with the given arrays (pointers and document indices as megatron-core
    writes them unless given)."""
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += 2 * n
    if documents is None:
        documents = list(range(len(lengths) + 1))
    return (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, UINT16, len(lengths), len(documents))
            + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(documents)}q", *documents))


def dataset(tmp_path: Path, idx: bytes, bin_tokens: int = 60, name: str = "d") -> str:
    prefix = str(tmp_path / name)
    Path(prefix + ".idx").write_bytes(idx)
    Path(prefix + ".bin").write_bytes(b"\x01\x00" * bin_tokens)
    return prefix


def inspect(*args: str):
    return CliRunner().invoke(app, ["inspect", *args])


GOOD = [10, 20, 30]

#: (name, .idx bytes, what the refusal names)
FORGED = [
    ("document index of 10**6", forged_index(GOOD, documents=[0, 10**6, 3]), "document_indices[1] is 1,000,000"),
    ("negative document index", forged_index(GOOD, documents=[0, -5, 3]), "document_indices[1] is -5"),
    ("document index past the end", forged_index(GOOD, documents=[0, 1, 4]), "document_indices[2] is 4, outside"),
    ("document index ending early", forged_index(GOOD, documents=[0, 1, 2]), "last document index is 2"),
    ("decreasing document index", forged_index(GOOD, documents=[0, 2, 1, 3]), "less than the entry before"),
    ("negative length", forged_index([10, -20, 30], pointers=[0, 20, 20]), "sequence_lengths[1] is -20"),
    ("length 2**31-1", forged_index([10, 2**31 - 1, 30], pointers=[0, 20, 40]), "sequence_pointers[2] is 40"),
    ("last length 2**31-1", forged_index([10, 20, 2**31 - 1]), "truncated"),
    ("pointer past its place", forged_index(GOOD, pointers=[0, 20, 1000]), "sequence_pointers[2] is 1,000"),
    ("first pointer not 0", forged_index(GOOD, pointers=[8, 28, 68]), "sequence_pointers[0] is 8"),
]


def test_a_consistent_index_gives_its_counts(tmp_path: Path) -> None:
    facts = check_index(dataset(tmp_path, forged_index(GOOD)))
    assert (facts.sequences, facts.documents, facts.tokens, facts.data_bytes) == (3, 3, 60, 120)
    assert facts.document_indices.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("name, idx, named", FORGED, ids=[f[0] for f in FORGED])
def test_an_inconsistent_index_is_refused_by_entry(tmp_path: Path, name: str, idx: bytes, named: str) -> None:
    prefix = dataset(tmp_path, idx)
    with pytest.raises(IndexInconsistent) as refused:
        check_index(prefix)
    assert named in refused.value.why and "dlmspec data prepare" in refused.value.hint
    assert refused.value.path in (prefix + ".idx", prefix + ".bin")


@pytest.mark.parametrize("name, idx, named", FORGED, ids=[f[0] for f in FORGED])
def test_data_inspect_exits_2_on_an_inconsistent_index(tmp_path: Path, name: str, idx: bytes, named: str) -> None:
    prefix = dataset(tmp_path, idx)
    result = inspect(prefix, "--json")
    assert result.exit_code == 2, result.output
    assert named in result.output and "Traceback" not in result.output and "G tokens" not in result.output


def test_exact_bin_refuses_a_longer_bin(tmp_path: Path) -> None:
    prefix = dataset(tmp_path, forged_index(GOOD), bin_tokens=61)
    assert check_index(prefix).bin_bytes == 122
    with pytest.raises(IndexInconsistent, match="do not belong together"):
        check_index(prefix, exact_bin=True)


def test_an_index_or_bin_that_is_a_fifo_is_refused_unopened(tmp_path: Path) -> None:
    prefix = str(tmp_path / "p")
    os.mkfifo(prefix + ".idx")
    Path(prefix + ".bin").write_bytes(b"")
    with pytest.raises(FileRefused, match="FIFO"):
        check_index(prefix)
    prefix = dataset(tmp_path, forged_index(GOOD), name="q")
    os.remove(prefix + ".bin")
    os.symlink("/dev/zero", prefix + ".bin")
    with pytest.raises(FileRefused, match="character device"):
        check_index(prefix)


def _unblock_after(path: str) -> threading.Timer:
    def release() -> None:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(2.0, release)
    timer.start()
    return timer


@pytest.mark.parametrize("record", ["fifo", "dev-zero", "nested"])
def test_data_inspect_exits_2_on_a_record_that_is_not_one(tmp_path: Path, record: str) -> None:
    prefix = write_shard(str(tmp_path / "r_text_document"), [[1, 2, 3]], None)
    path = prefix + ".dlmspec.json"
    timer = None
    if record == "fifo":
        os.mkfifo(path)
        timer = _unblock_after(path)
    elif record == "dev-zero":
        os.symlink("/dev/zero", path)
    else:
        Path(path).write_text("[" * 100_000 + "]" * 100_000)
    try:
        result = inspect(prefix)
    finally:
        if timer is not None:
            timer.cancel()
    assert result.exit_code == 2, result.output
    assert path in result.output.replace("\n", "") or "dlmspec.json" in result.output
    assert "Traceback" not in result.output and "RecursionError" not in result.output


def test_data_inspect_exits_2_on_a_manifest_nested_100000_deep(tmp_path: Path) -> None:
    manifest = tmp_path / "m_text_document.manifest.json"
    manifest.write_text("[" * 100_000 + "]" * 100_000)
    result = inspect(str(manifest))
    assert result.exit_code == 2 and "nests" in result.output and "Traceback" not in result.output
    manifest.write_text(manifest_text([("s-00000_text_document", 1, 3)], null_tokenizer()))
    write_shard(str(tmp_path / "s-00000_text_document"), [[1, 2, 3]], null_tokenizer())
    assert inspect(str(manifest), "--json").exit_code == 0
    assert json.loads(inspect(str(manifest), "--json").stdout)["result"]["tokens"] == 3
