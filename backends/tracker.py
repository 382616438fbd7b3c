"""The one reader of a save folder's ``latest`` tracker (:data:`dlmspec.names.CHECKPOINT_TRACKER`).

The runtime writes ``latest`` beside its ``iter_NNNNNNN`` folders, holding one folder name
(``backends/megatron/checkpointing.py``). Resume (:func:`dlmspec.backends.megatron.checkpointing.read_latest_checkpoint`),
``generate`` / ``eval`` (:mod:`dlmspec.backends.generate.load`) and ``convert``
(:func:`dlmspec.backends.convert.mcore_io.resolve_checkpoint_dir`) read it here, as an untrusted
file (:func:`dlmspec.files.read_text`: a regular file of at most :data:`MAX_TRACKER_BYTES`, UTF-8),
and each turns :class:`TrackerError` into its own refusal. Imports neither torch nor megatron.
"""

from __future__ import annotations

import os
from typing import Optional

from dlmspec.files import FileRefused, read_text
from dlmspec.names import CHECKPOINT_TRACKER

#: Largest tracker read, bytes (it holds one folder name).
MAX_TRACKER_BYTES = 4096
#: Longest folder name a tracker may name (a file name on common file systems).
MAX_NAME_CHARS = 255
#: What to do about a tracker that is refused.
TRACKER_FIX = "write the name of an iter_* folder of this folder into it (e.g. iter_0000300), or pass that folder"


class TrackerError(ValueError):
    """A ``latest`` tracker that cannot be used.

    Attributes:
        path: the tracker (or the folder it names).
        why: what is wrong with it.
        fix: what to do.
    """

    def __init__(self, path: str, why: str, fix: str = TRACKER_FIX) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why, self.fix = path, why, fix


def tracker_path(root: str | os.PathLike[str]) -> str:
    """``root/latest``."""
    return os.path.join(os.fspath(root), CHECKPOINT_TRACKER)


def read_tracker(root: str | os.PathLike[str]) -> Optional[str]:
    """The folder name ``root/latest`` holds (stripped), or ``None`` when there is no tracker.

    Raises:
        TrackerError: the tracker is not a regular file (a FIFO, a device, a folder), is larger
            than :data:`MAX_TRACKER_BYTES`, is not UTF-8, or holds no single folder name (empty,
            a path, ``.``/``..``, unprintable, longer than :data:`MAX_NAME_CHARS`).
    """
    tracker = tracker_path(root)
    if not os.path.lexists(tracker):
        return None
    try:
        name = read_text(tracker, limit=MAX_TRACKER_BYTES, what="checkpoint tracker ('latest')").strip()
    except FileRefused as exc:
        raise TrackerError(tracker, exc.why) from None
    if (not name or len(name) > MAX_NAME_CHARS or os.sep in name or name in (".", "..")
            or not name.isprintable()):
        raise TrackerError(tracker, f"holds {name[:80]!r}, not the name of a checkpoint folder")
    return name


def latest_checkpoint(root: str | os.PathLike[str]) -> Optional[str]:
    """The checkpoint folder ``root/latest`` names (``root/<name>``), or ``None`` without a tracker.

    Raises:
        TrackerError: as :func:`read_tracker`, or the named folder does not exist.
    """
    name = read_tracker(root)
    if name is None:
        return None
    path = os.path.join(os.fspath(root), name)
    if not os.path.isdir(path):
        raise TrackerError(tracker_path(root), f"names {name!r} but {path} does not exist",
                           "pass one of the iter_* folders that exist")
    return path
