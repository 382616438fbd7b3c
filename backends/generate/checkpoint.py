"""Where a checkpoint is and what reading it can raise: :func:`find_checkpoint` tells a runtime
checkpoint (its record, or a save/run folder's ``latest`` tracker read by
:mod:`dlmspec.backends.tracker`), a ``dlmspec convert`` output and a Hugging Face folder apart;
:class:`LoadError` is every refusal of :func:`dlmspec.backends.generate.load.load_model`;
:func:`checkpoint_read_errors` are the exceptions a damaged checkpoint's weights raise."""

from __future__ import annotations

import os
import pickle
from typing import Any, Optional

from dlmspec.names import CHECKPOINT_RECORD, CHECKPOINT_TRACKER

#: The runtime checkpoint's metadata file (``dlmspec.backends.megatron.checkpointing.METADATA_FILENAME``).
METADATA_FILENAME = CHECKPOINT_RECORD
#: The save folder's tracker (``checkpointing.TRACKER_FILENAME``).
TRACKER_FILENAME = CHECKPOINT_TRACKER
#: The sidecar ``dlmspec convert hf-to-mcore`` writes (``dlmspec.backends.convert.mcore_io.SIDECAR_NAME``).
CONVERT_SIDECAR = "dlmspec_convert.json"
#: Largest ``dlmspec.json`` / ``spec.lock.toml`` read, bytes (each is a few KiB).
MAX_RECORD_BYTES = 16 << 20


def checkpoint_read_errors() -> tuple[type[BaseException], ...]:
    """What reading a checkpoint's weights raises on a damaged checkpoint folder (a missing,
    truncated or zeroed ``.distcp`` shard, a truncated ``.metadata``, a ``common.pt`` that is not
    a pickle): the exceptions :func:`load_model` turns into a :class:`LoadError` naming the folder.

    ``OSError`` (a missing or unreadable file), ``EOFError`` and ``pickle.UnpicklingError`` (a
    truncated or zeroed pickle), ``ValueError`` (``FileRefused``, a refused-pickle error of a safe
    loader, a bad header), ``RuntimeError`` (torch's reader, a state-dict mismatch), ``KeyError`` /
    ``IndexError`` / ``AttributeError`` / ``TypeError`` / ``AssertionError`` (a pickle that loads
    into the wrong structure), megatron-core's ``CheckpointingException`` and torch.distributed
    checkpoint's ``CheckpointException`` (a ``BaseException``: it wraps the errors of each rank).
    """
    errors: list[type[BaseException]] = [OSError, EOFError, pickle.UnpicklingError, ValueError, RuntimeError, KeyError,
                                         IndexError, AttributeError, TypeError, AssertionError, UnicodeDecodeError]
    try:
        from megatron.core.dist_checkpointing.core import CheckpointingException

        errors.append(CheckpointingException)
    except ImportError:  # pragma: no cover - megatron-core is a dependency of the runtime
        pass
    try:
        from torch.distributed.checkpoint.api import CheckpointException

        errors.append(CheckpointException)
    except ImportError:  # pragma: no cover - torch without torch.distributed
        pass
    return tuple(errors)


def _safetensors_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError

        return (SafetensorError,)
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        return ()


#: Words of the errors CUDA, torch and NCCL raise when the GPU's memory runs out (torch's
#: ``OutOfMemoryError``; ``CUDA error: out of memory``; NCCL's ``Failed to CUDA calloc``).
OUT_OF_MEMORY_WORDS = ("out of memory", "Failed to CUDA calloc", "cudaErrorMemoryAllocation")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` (or the exception it wraps, :func:`describe_read_error`'s) says the GPU's
    memory ran out: torch's ``OutOfMemoryError`` or one of :data:`OUT_OF_MEMORY_WORDS`. Reads the
    type's name and the text only (no torch import)."""
    text = describe_read_error(exc, width=10_000)
    return type(exc).__name__ == "OutOfMemoryError" or any(w in text for w in OUT_OF_MEMORY_WORDS)


#: What to do when the GPU's memory runs out (:func:`is_out_of_memory`).
OUT_OF_MEMORY_FIX = ("free the GPU's memory (nvidia-smi lists the processes that hold it), use a smaller batch, "
                     "or run on the CPU: --device cpu")


def describe_read_error(exc: BaseException, width: int = 300) -> str:
    """One line naming a checkpoint read error: its type and first words (a
    ``CheckpointException`` lists each rank's error: the first is shown)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
            inner = inner[0]  # torch keeps (exception, stack summary) per rank
        inner = getattr(inner, "exc", inner) if not isinstance(inner, BaseException) else inner
        if isinstance(inner, BaseException):
            exc = inner
    text = f"{type(exc).__name__}: {exc}"
    text = text.split("Traceback (most recent call last)")[0].strip()  # never a traceback in a message
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


class LoadError(ValueError):
    """A model cannot be loaded from the path given.

    Attributes:
        path: the path given.
        why: what is wrong, in words.
        fix: what to pass instead.
    """

    def __init__(self, path: str, why: str, fix: str) -> None:
        self.path, self.why, self.fix = str(path), why, fix
        super().__init__(f"{path}: {why}; {fix}")


# --------------------------------------------------------------------------- finding the checkpoint


def _read_json(path: str) -> Any:
    """The JSON of a checkpoint's record (``dlmspec.json``): a regular file, at most
    :data:`MAX_RECORD_BYTES`, nested at most ``dlmspec.files.MAX_NESTING`` levels.

    Raises:
        LoadError: missing, not a regular file (a FIFO, a device), too large, not UTF-8, not JSON.
    """
    from dlmspec.files import FileRefused, read_json

    try:
        return read_json(path, limit=MAX_RECORD_BYTES, what=f"checkpoint record {os.path.basename(path)}")
    except FileRefused as exc:
        raise LoadError(path, exc.why, f"{exc.hint}; or pass a checkpoint the dlmspec runtime wrote") from None


def _latest(root: str) -> Optional[str]:
    """The checkpoint folder the save folder ``root``'s ``latest`` tracker names, or ``None``
    when ``root`` has no tracker (or a folder of that name): :func:`dlmspec.backends.tracker.latest_checkpoint`.

    Raises:
        LoadError: the tracker is not a regular file, larger than 4 KiB, not UTF-8, names no
            folder name, or names a folder that does not exist.
    """
    from dlmspec.backends.tracker import TrackerError, latest_checkpoint, tracker_path

    if os.path.isdir(tracker_path(root)):
        return None
    try:
        return latest_checkpoint(root)
    except TrackerError as exc:
        raise LoadError(exc.path, exc.why, exc.fix) from None


def _present(path: str) -> bool:
    """Something other than a folder is at ``path`` (a file, a link, a FIFO: it is read, or
    refused, by :func:`dlmspec.files.read_json`)."""
    return os.path.lexists(path) and not os.path.isdir(path)


def find_checkpoint(path: str) -> tuple[str, str]:
    """Which kind of checkpoint ``path`` is, and its folder.

    Returns:
        ``(source, folder)``: ``source`` is ``"dlmspec"`` (a runtime checkpoint: ``folder`` holds
        ``dlmspec.json``), ``"mcore"`` (``dlmspec convert hf-to-mcore`` output) or ``"hf"``.

    Raises:
        LoadError: ``path`` does not exist or is none of them (the message lists what was looked for).
    """
    p = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.exists(p):
        raise LoadError(path, "does not exist", "pass a run folder, a checkpoint folder (iter_*) or a Hugging Face folder")
    if not os.path.isdir(p):
        raise LoadError(path, "is a file, not a folder", "pass the checkpoint's folder")
    if _present(os.path.join(p, METADATA_FILENAME)):  # a FIFO or device is refused when it is read
        return "dlmspec", p
    for root in (p, os.path.join(p, "checkpoints")):
        latest = _latest(root)
        if latest is not None:
            if not _present(os.path.join(latest, METADATA_FILENAME)):
                raise LoadError(latest, f"has no {METADATA_FILENAME}", "pass a checkpoint the dlmspec runtime wrote")
            return "dlmspec", latest
    if os.path.isfile(os.path.join(p, CONVERT_SIDECAR)):
        return "mcore", p
    if os.path.isfile(os.path.join(p, "config.json")) and any(n.endswith(".safetensors") for n in os.listdir(p)):
        return "hf", p
    raise LoadError(
        path, f"is not a checkpoint: no {METADATA_FILENAME}, no {TRACKER_FILENAME} (nor checkpoints/{TRACKER_FILENAME}), "
        f"no {CONVERT_SIDECAR}, no config.json with *.safetensors",
        "pass a run folder (runs/NAME), its checkpoints folder, one iter_* folder, or a Hugging Face folder",
    )
