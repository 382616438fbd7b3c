"""The ``latest`` tracker is read once, the same way, by resume (checkpointing), generate/eval
(generate.load) and convert (mcore_io): each accepts the same trackers, resolves them to the same
folder, and refuses the same damaged ones naming the tracker and why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

from dlmspec.backends.convert.errors import ConversionError  # noqa: E402
from dlmspec.backends.convert.mcore_io import resolve_checkpoint_dir  # noqa: E402
from dlmspec.backends.generate.checkpoint import LoadError, _latest  # noqa: E402
from dlmspec.backends.megatron.checkpointing import read_latest_checkpoint  # noqa: E402

#: A tracker's bytes -> the words every reader's refusal holds.
DAMAGED = {
    "binary": (b"\x80\xff\x00", "UTF-8"),
    "huge": (b"i" * (1 << 20), "larger than"),
    "path": (b"../../etc\n", "not the name of a checkpoint folder"),
    "long": (b"9" * 3000 + b"\n", "not the name of a checkpoint folder"),
    "empty": (b"\n", "not the name of a checkpoint folder"),
    "missing folder": (b"iter_0000020\n", "does not exist"),
    "fifo": (None, "FIFO"),
}


def save_folder(tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    (root / "iter_0000010").mkdir(parents=True)
    (root / "iter_0000010" / "metadata.json").write_text("{}")
    return root


def refusals(root: Path) -> list[str]:
    """The message each reader refuses ``root`` with (an empty string where one accepts it)."""
    out = []
    for read, errors in ((lambda: read_latest_checkpoint(str(root)), FileNotFoundError),
                         (lambda: _latest(str(root)), LoadError),
                         (lambda: resolve_checkpoint_dir(root), ConversionError)):
        try:
            read()
        except errors as exc:
            out.append(str(exc))
        else:
            out.append("")
    return out


def test_every_reader_resolves_a_tracker_to_the_same_folder(tmp_path: Path) -> None:
    root = save_folder(tmp_path)
    (root / "latest").write_text("iter_0000010\n")
    want = root / "iter_0000010"
    assert read_latest_checkpoint(str(root)) == str(want)
    assert _latest(str(root)) == str(want)
    assert resolve_checkpoint_dir(root) == want


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_every_reader_refuses_a_damaged_tracker_naming_it_and_why(tmp_path: Path, case: str) -> None:
    root = save_folder(tmp_path)
    body, why = DAMAGED[case]
    if body is None:
        os.mkfifo(root / "latest")
    else:
        (root / "latest").write_bytes(body)
    messages = refusals(root)
    for reader, message in zip(("resume", "generate", "convert"), messages):
        assert str(root / "latest") in message and why in message, (reader, message[:300])
