"""The dataset builder data prepare writes with: megatron-core's ``IndexedDatasetBuilder`` whose
``.bin`` and ``.idx`` (temporary names) are created exclusively before the builder opens them by name
(never written through a link or over a planted file), and which appends a chunk's documents with one
``add_document`` call (the bytes of one call a document)."""

from __future__ import annotations

import os
from itertools import accumulate
from typing import Any, Sequence

from dlmspec.data.errors import DataPrepareError
from dlmspec.files import create_exclusive

__all__ = ["exclusive_builder", "indexed_dataset_classes"]


#: What :func:`indexed_dataset_classes` returned, for its later calls in this process.
_CLASSES: list[tuple[Any, Any]] = []


def indexed_dataset_classes() -> tuple[Any, Any]:
    """megatron-core's ``DType`` and ``IndexedDatasetBuilder``, importing only what their module needs
    (once a process: later calls return the same classes).

    ``megatron/core/__init__.py`` imports most of the library (tensor_parallel, transformer,
    inference, wandb): ~4.5 s of CPU, where ``megatron.core.datasets.indexed_dataset`` needs ~0.6 s
    beyond torch. So, when ``megatron.core`` is not imported yet, a bare package of the same folder
    stands in for it while that module and what it imports load (``parallel_state`` first, as the
    library's ``__init__`` orders them); then the stand-in and those modules leave ``sys.modules``,
    so that a later ``import megatron.core`` runs the library's ``__init__`` in full (the classes
    returned keep their own modules). Where that import fails (another megatron-core layout), the
    full import is used; where megatron-core or torch is missing, that import raises the ImportError.
    """
    if _CLASSES:
        return _CLASSES[0]
    _CLASSES.append(_import_indexed_dataset_classes())
    return _CLASSES[0]


def _import_indexed_dataset_classes() -> tuple[Any, Any]:
    import importlib.util
    import sys
    import types

    if "megatron.core" not in sys.modules:
        before = set(sys.modules)
        stand_in = types.ModuleType("megatron.core")
        classes = None
        try:
            found = importlib.util.find_spec("megatron.core")
            if found is not None and found.submodule_search_locations:
                stand_in.__path__ = list(found.submodule_search_locations)
                sys.modules["megatron.core"] = stand_in
                import megatron.core.parallel_state  # noqa: F401  (before utils: the library's import cycle)
                from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

                classes = (DType, IndexedDatasetBuilder)
        except Exception:  # noqa: BLE001 - the full import below decides (and raises what is missing)
            classes = None
        finally:
            for name in set(sys.modules) - before:
                if name == "megatron.core" or name.startswith("megatron.core."):
                    del sys.modules[name]
            if sys.modules.get("megatron.core") is stand_in:
                del sys.modules["megatron.core"]
            parent = sys.modules.get("megatron")
            if parent is not None and getattr(parent, "core", None) is stand_in:
                delattr(parent, "core")
        if classes is not None:
            return classes
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
