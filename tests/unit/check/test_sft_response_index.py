"""validate's longest-prompt reading of an SFT dataset's response masks
(:func:`dlmspec.check.sft.longest_prompt`) goes through dlmspec.data.index.check_index: a
``PREFIX_response.idx`` that is a FIFO is not opened (no hang), and one whose lengths contradict
the file gives "unknown" instead of a number read from garbage."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

from dlmspec.check.sft import longest_prompt


def _response_index(lengths: list[int], pointers: list[int] | None = None) -> bytes:
    if pointers is None:
        pointers, at = [], 0
        for n in lengths:
            pointers.append(at)
            at += n
    docs = list(range(len(lengths) + 1))
    return (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 1, len(lengths), len(docs))  # uint8 flags
            + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
            + struct.pack(f"<{len(docs)}q", *docs))


def test_response_masks_give_the_longest_prompt(tmp_path: Path) -> None:
    prefix = str(tmp_path / "s")
    Path(prefix + "_response.idx").write_bytes(_response_index([4, 3]))
    Path(prefix + "_response.bin").write_bytes(bytes([0, 0, 1, 1, 0, 0, 0]))
    assert longest_prompt(prefix) == (3, 1)


def test_a_response_index_that_is_a_fifo_is_unknown_not_a_hang(tmp_path: Path) -> None:
    prefix = str(tmp_path / "s")
    Path(prefix + "_response.bin").write_bytes(bytes([0, 1]))
    fifo = prefix + "_response.idx"
    os.mkfifo(fifo)

    def release() -> None:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    timer = threading.Timer(3.0, release)
    timer.start()
    try:
        assert longest_prompt(prefix) is None
    finally:
        timer.cancel()


def test_a_response_index_with_a_negative_length_is_unknown(tmp_path: Path) -> None:
    prefix = str(tmp_path / "s")
    Path(prefix + "_response.idx").write_bytes(_response_index([9, -2], pointers=[0, 9]))
    Path(prefix + "_response.bin").write_bytes(bytes(7))
    assert longest_prompt(prefix) is None
