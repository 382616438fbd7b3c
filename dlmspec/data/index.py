"""Reading a Megatron indexed dataset's index (``PREFIX.idx``) and checking that it is consistent
before anything trusts its numbers: ``dlmspec data inspect``, ``train.py --check`` (the runtime's
:func:`dlmspec.backends.megatron.data.check_indexed_dataset`) and whatever else opens a
``.bin``/``.idx`` pair call :func:`check_index`.

The layout is megatron-core's ``indexed_dataset._IndexWriter`` / ``_IndexReader`` (0.16): the
9-byte magic ``MMIDIDX\\x00\\x00``, version ``<Q`` (1), dtype code ``<B``, the sequence count
``S`` ``<Q`` and the document-index count ``D`` ``<Q`` (34 bytes), then ``sequence_lengths``
(``S`` x int32, tokens), ``sequence_pointers`` (``S`` x int64, byte offsets into ``.bin``),
``document_indices`` (``D`` x int64, the first sequence of each document, then ``S``) and, for
multimodal data only, ``sequence_modes`` (``S`` x int8).

What the writer guarantees, and so what is checked (a file that breaks any of it was damaged or
forged, and Megatron would read garbage or crash on it):

* the file is exactly ``34 + 12 S + 8 D`` bytes (or ``S`` more, with sequence modes);
* every length is ``>= 0``;
* ``sequence_pointers[0] == 0`` and ``sequence_pointers[i + 1] == sequence_pointers[i] +
  sequence_lengths[i] * itemsize`` (the writer keeps a running sum), so the pointers are monotone
  and the last sequence ends at ``sum(lengths) * itemsize`` bytes, which must be within the
  ``.bin``'s size;
* ``document_indices`` starts at 0, never decreases and ends at ``S`` (each ``add_document``
  appends the sequence count so far), so ``D >= 1`` and every entry lies in ``[0, S]``.

The arrays are checked in pieces of :data:`CHUNK` entries (memory stays flat on an index of
millions of sequences). numpy is imported when a check runs; torch never is.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

from dlmspec.files import FileRefused, file_kind, open_regular

#: The first bytes of a Megatron ``.idx`` file (megatron.core.datasets.indexed_dataset._INDEX_HEADER).
INDEX_HEADER = b"MMIDIDX\x00\x00"
#: Header bytes: magic (9), version ``<Q``, dtype code ``<B``, sequence count ``<Q``, document-index count ``<Q``.
HEADER_BYTES = 34
#: megatron.core.datasets.indexed_dataset.DType: code -> numpy dtype name.
DTYPE_CODES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
#: Entries of an array checked at a time.
CHUNK = 1 << 22

_PREPARE_AGAIN = "prepare the dataset again with `dlmspec data prepare` (or copy both files again)"


class IndexInconsistent(FileRefused):
    """A ``.idx`` (or its ``.bin``) whose numbers contradict each other or the data file:
    ``path``, ``why`` and ``hint`` as :class:`~dlmspec.files.FileRefused`."""


@dataclass
class IndexFacts:
    """What :func:`check_index` read from a consistent index.

    Attributes:
        idx_path, bin_path: The two files.
        dtype: Token dtype name (``"uint16"``...); ``itemsize`` its bytes.
        sequences: ``S``; ``documents``: documents (``D - 1``).
        tokens: ``sum(sequence_lengths)``; ``data_bytes``: ``tokens * itemsize``, where the last
            sequence ends in ``.bin``; ``bin_bytes``: the ``.bin``'s size (``None``: no ``.bin``,
            with ``bin_optional``).
        multimodal: The index holds sequence modes.
        sequence_lengths, sequence_pointers, document_indices: numpy arrays (int32, int64, int64)
            over the memory-mapped ``.idx``.
    """

    idx_path: str
    bin_path: str
    dtype: str
    itemsize: int
    sequences: int
    documents: int
    tokens: int
    data_bytes: int
    bin_bytes: int | None
    multimodal: bool
    sequence_lengths: Any
    sequence_pointers: Any
    document_indices: Any


def _bad(path: str, why: str) -> IndexInconsistent:
    return IndexInconsistent(path, why, _PREPARE_AGAIN)


def check_index(prefix: str, *, exact_bin: bool = False, bin_optional: bool = False) -> IndexFacts:
    """Read ``PREFIX.idx`` and check it against itself and ``PREFIX.bin`` (see the module doc).

    Args:
        prefix: The dataset path without ``.bin`` / ``.idx``.
        exact_bin: Also require the ``.bin`` to end where the last sequence ends (megatron's
            builder writes the tokens back to back; training refuses anything else, ``data
            inspect`` only notes it).
        bin_optional: A missing ``.bin`` is no error (``bin_bytes`` is then ``None``): for
            counting documents and tokens from the index alone (the unique tokens of a results
            folder that keeps each dataset's ``.idx`` but not its tokens). A ``.bin`` that
            exists is checked as always.

    Returns:
        :class:`IndexFacts` of a consistent index.

    Raises:
        FileRefused: either file is missing, unreadable or not a regular file.
        IndexInconsistent: not a Megatron index, or numbers that contradict each other or the
            ``.bin`` (the message names the file, the entry and its value).
    """
    import numpy as np

    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    fd = open_regular(idx_path, what="dataset index (.idx)")
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        head = handle.read(HEADER_BYTES)
        if len(head) < HEADER_BYTES or head[:9] != INDEX_HEADER:
            raise _bad(idx_path, f"not a Megatron index: it does not start with the {HEADER_BYTES}-byte header "
                       f"{INDEX_HEADER!r}...")
        version, code, sequences, doc_entries = struct.unpack("<QBQQ", head[9:])
        if version != 1:
            raise _bad(idx_path, f"index version {version}; megatron-core writes and reads version 1")
        if code not in DTYPE_CODES:
            raise _bad(idx_path, f"dtype code {code} is none of megatron-core's {sorted(DTYPE_CODES)}")
        dtype = DTYPE_CODES[code]
        itemsize = np.dtype(dtype).itemsize
        expected = HEADER_BYTES + 12 * sequences + 8 * doc_entries
        if size not in (expected, expected + sequences):
            state = "truncated" if size < expected else f"{size - expected:,} bytes longer than that"
            raise _bad(idx_path, f"{size:,} bytes, but its header ({sequences:,} sequences, {doc_entries:,} document "
                       f"indices) needs {expected:,}: {state}")
        if doc_entries < 1:
            raise _bad(idx_path, "its document index is empty (megatron-core writes at least the entry 0)")
        buffer = np.memmap(handle, mode="r", dtype=np.uint8)
        lengths = np.frombuffer(buffer, dtype=np.int32, count=sequences, offset=HEADER_BYTES)
        pointers = np.frombuffer(buffer, dtype=np.int64, count=sequences, offset=HEADER_BYTES + 4 * sequences)
        docs = np.frombuffer(buffer, dtype=np.int64, count=doc_entries, offset=HEADER_BYTES + 12 * sequences)

    # sequence lengths >= 0, pointers the running sum of length x itemsize
    position = 0  # bytes before the current chunk's first sequence
    for start in range(0, sequences, CHUNK):
        part = lengths[start:start + CHUNK].astype(np.int64)
        negative = np.flatnonzero(part < 0)
        if negative.size:
            i = start + int(negative[0])
            raise _bad(idx_path, f"sequence_lengths[{i:,}] is {int(lengths[i]):,}: a length is never negative")
        ends = np.cumsum(part * itemsize) + position
        want = np.concatenate(([position], ends[:-1]))
        wrong = np.flatnonzero(pointers[start:start + CHUNK] != want)
        if wrong.size:
            i = start + int(wrong[0])
            raise _bad(idx_path, f"sequence_pointers[{i:,}] is {int(pointers[i]):,}, but the sequences before it "
                       f"end at byte {int(want[wrong[0]]):,} (pointers are the running sum of lengths x {itemsize} "
                       "bytes)")
        position = int(ends[-1])
    data_bytes = position

    # document indices: 0 first, never decreasing, S last
    first, last = int(docs[0]), int(docs[-1])
    if first != 0:
        raise _bad(idx_path, f"document_indices[0] is {first:,}; the first document starts at sequence 0")
    for start in range(0, doc_entries, CHUNK):
        part = docs[max(0, start - 1):start + CHUNK]
        high = np.flatnonzero((part > sequences) | (part < 0))
        if high.size:
            i = max(0, start - 1) + int(high[0])
            raise _bad(idx_path, f"document_indices[{i:,}] is {int(docs[i]):,}, outside the {sequences:,} "
                       "sequences the index holds")
        down = np.flatnonzero(part[1:] < part[:-1])
        if down.size:
            i = max(0, start - 1) + int(down[0]) + 1
            raise _bad(idx_path, f"document_indices[{i:,}] is {int(docs[i]):,}, less than the entry before it "
                       f"({int(docs[i - 1]):,}): documents start in sequence order")
    if last != sequences:
        raise _bad(idx_path, f"the last document index is {last:,}, but the index holds {sequences:,} sequences "
                   "(it ends with the sequence count)")

    # the .bin: a regular file at least as long as the sequences
    try:
        st = os.stat(bin_path)
    except FileNotFoundError:
        if bin_optional:
            return IndexFacts(idx_path=idx_path, bin_path=bin_path, dtype=dtype, itemsize=itemsize,
                              sequences=sequences, documents=doc_entries - 1, tokens=data_bytes // itemsize,
                              data_bytes=data_bytes, bin_bytes=None, multimodal=size != expected,
                              sequence_lengths=lengths, sequence_pointers=pointers, document_indices=docs)
        raise FileRefused(bin_path, "the data file (.bin) beside the index does not exist",
                          "copy the .bin with its .idx, or " + _PREPARE_AGAIN) from None
    except OSError as exc:
        raise FileRefused(bin_path, f"cannot read the data file (.bin): {exc.strerror or exc}",
                          "check the path and its permissions") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(bin_path, f"the data file (.bin) is {file_kind(st.st_mode)}, not a regular file",
                          "point at the dataset itself (dlmspec never reads pipes or devices)")
    if st.st_size < data_bytes:
        raise _bad(bin_path, f"{st.st_size:,} bytes, but its index describes {data_bytes // itemsize:,} {dtype} "
                   f"tokens = {data_bytes:,} bytes: truncated, or the .idx belongs to another .bin")
    if exact_bin and st.st_size != data_bytes:
        raise _bad(bin_path, f"{st.st_size:,} bytes, but its index describes {data_bytes // itemsize:,} {dtype} "
                   f"tokens = {data_bytes:,} bytes: the .bin and .idx do not belong together or disagree on the dtype")
    return IndexFacts(idx_path=idx_path, bin_path=bin_path, dtype=dtype, itemsize=itemsize, sequences=sequences,
                      documents=doc_entries - 1, tokens=data_bytes // itemsize, data_bytes=data_bytes,
                      bin_bytes=st.st_size, multimodal=size != expected, sequence_lengths=lengths,
                      sequence_pointers=pointers, document_indices=docs)
