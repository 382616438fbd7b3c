"""The dataset builder data prepare writes with: megatron-core's ``IndexedDatasetBuilder`` whose
``.bin`` and ``.idx`` (temporary names) are created exclusively before the builder opens them by name
(never written through a link or over a planted file), and which appends a chunk's documents with one
``add_document`` call (the bytes of one call a document)."""

from __future__ import annotations

import contextlib
import os
from itertools import accumulate
from typing import Any, Sequence

from dlmspec.data.errors import DataPrepareError
from dlmspec.files import create_exclusive
from dlmspec.data.megatron_light import without_megatron_core_init

__all__ = ["exclusive_builder", "indexed_dataset_classes"]


#: The classes :func:`indexed_dataset_classes` imported without megatron-core's ``__init__``, for its
#: later calls in this process.
_LIGHT: list[tuple[Any, Any]] = []


def indexed_dataset_classes() -> tuple[Any, Any]:
    """megatron-core's ``DType`` and ``IndexedDatasetBuilder``: those of the process's
    ``megatron.core.datasets.indexed_dataset`` when it is imported; else imported without the
    library's ``__init__`` (:func:`dlmspec.data.megatron_light.without_megatron_core_init`: the
    writer's module and what it imports, ~2.5 s of CPU less), once a process. Where that import
    fails (another megatron-core layout), the full import is used; where megatron-core or torch is
    missing, that import raises the ImportError."""
    import sys

    module = sys.modules.get("megatron.core.datasets.indexed_dataset")
    if module is not None:  # the library's own (the light import leaves none behind)
        return module.DType, module.IndexedDatasetBuilder
    if not _LIGHT:
        # a light import that fails leaves _LIGHT empty: the full import below decides (and raises)
        with without_megatron_core_init() as light, contextlib.suppress(Exception):
            if light:
                from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

                _LIGHT.append((DType, IndexedDatasetBuilder))
    if _LIGHT:
        return _LIGHT[0]
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    return DType, IndexedDatasetBuilder


def _create_new(path: str) -> os.stat_result:
    """Create the empty regular file ``path`` here and now (:func:`dlmspec.files.create_exclusive`:
    never an existing file, never through a symbolic link), as readable as the umask allows;
    returns its ``stat``.

    Raises:
        DataPrepareError: something (a file, a link) is at ``path`` already.
    """
    try:
        fd = create_exclusive(path, 0o666)
    except FileExistsError:
        raise DataPrepareError(
            f"{path}: a file or link is at this temporary name, where data prepare writes; it is never "
            "written through. Remove it (or pick another --output-prefix)"
        ) from None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _same_inode(path: str, made: os.stat_result) -> bool:
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino)


def exclusive_builder(builder_class: Any) -> Any:
    """megatron-core's ``IndexedDatasetBuilder`` (``builder_class``) whose ``.bin`` and ``.idx``
    (temporary names) are created by :func:`_create_new` before the builder opens them by name,
    and checked afterwards to be the files created: a link or file planted at a temporary name is
    refused, never written through."""

    class ExclusiveBuilder(builder_class):  # type: ignore[misc, valid-type]
        def __init__(self, bin_path: str, *args: Any, **kwargs: Any) -> None:
            made = _create_new(bin_path)
            super().__init__(bin_path, *args, **kwargs)
            if not _same_inode(bin_path, made):
                self.data_file.close()
                raise DataPrepareError(f"{bin_path}: replaced while data prepare opened it; rerun")

        def add_documents(self, tokens: Any, sequence_lengths: Sequence[int],
                          sequences_per_document: Sequence[int]) -> None:
            """Append many documents with one ``add_document`` call, and the same bytes and index
            entries as one call a document: ``tokens`` (1-D, the documents' tokens concatenated)
            and ``sequence_lengths`` (every sequence, in order) go in as one document, whose
            boundary is then replaced by one after ``sequences_per_document[i]`` sequences for
            each document ``i`` (0: an empty document, a boundary only).

            Raises:
                ValueError: the lengths do not add up to ``len(tokens)`` and to the number of
                    sequences; a multimodal builder (its sequences have modes).
            """
            if sum(sequence_lengths) != len(tokens) or sum(sequences_per_document) != len(sequence_lengths):
                raise ValueError(f"add_documents: {len(tokens)} tokens, {len(sequence_lengths)} sequences of "
                                 f"{sum(sequence_lengths)} tokens in documents of {sum(sequences_per_document)}")
            if self.multimodal:
                raise ValueError("add_documents: a multimodal builder adds documents with add_document (modes)")
            if not sequences_per_document:
                return
            before = self.document_indices[-1]
            self.add_document(tokens, list(sequence_lengths))
            self.document_indices.pop()  # the one boundary add_document put after them all
            ends = accumulate(sequences_per_document, initial=before)
            next(ends)  # ``before`` itself, the last boundary already there
            self.document_indices.extend(ends)

        def finalize(self, idx_path: str) -> None:
            made = _create_new(idx_path)
            super().finalize(idx_path)
            if not _same_inode(idx_path, made):
                raise DataPrepareError(f"{idx_path}: replaced while data prepare wrote it; rerun")

    ExclusiveBuilder.__name__ = ExclusiveBuilder.__qualname__ = f"Exclusive{builder_class.__name__}"
    return ExclusiveBuilder
