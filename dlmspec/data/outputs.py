"""The files ``dlmspec data prepare`` writes: output names, the checks that keep the user's files,
temporary files and their cleanup.

Nothing the user wrote is lost: an output file that is an input (``--input`` or a tokenizer
file, by name, through a symlink or as a hard link of it) is refused, with ``--force`` too, and
an existing dataset (or any file at an output name) is replaced only with ``--force``.

Both files of a dataset are written as ``PREFIX.tmp-HOST-PID-HEX.bin/.idx`` (``HOST`` the short
host name) and renamed at the end (``.idx`` last): an interrupted run leaves no ``PREFIX.idx``,
and a dataset from an earlier run stays intact until the new one is complete. SIGTERM and SIGHUP
raise :class:`~dlmspec.data.errors.PrepareInterrupted` (a ``KeyboardInterrupt``, as SIGINT
raises) while the files are written, so they are removed on those too; only SIGKILL (or a crash)
leaves them. Each run removes the temporary files under its ``--output-prefix`` whose process is
gone (same host, pid not running) and says so in one line; files of a running process, or of
another host (whose pids cannot be checked from here), are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import socket
import threading
from dataclasses import dataclass
from typing import Any

from dlmspec.data.errors import DataPrepareError, PrepareInterrupted

#: Megatron's ``level`` in the output name; always ``document`` (no sentence splitting).
LEVEL = "document"


def dataset_prefix(output_prefix: str, json_key: str, level: str = LEVEL) -> str:
    """Path prefix of one output dataset, as in Megatron-LM's ``preprocess_data.py``."""
    return f"{output_prefix}_{json_key}_{level}"


@dataclass
class DatasetOutput:
    """One written dataset (one ``--json-keys`` key)."""

    json_key: str
    prefix: str
    bin_path: str
    idx_path: str
    documents: int = 0
    empty_documents: int = 0
    sequences: int = 0
    tokens: int = 0


def _same_file(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once links are resolved
    (``os.path.realpath``: also when ``b`` does not exist yet), or the same device and inode (a
    hard link)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def protected_inputs(
    input_name: str | list[str] | None,
    tokenizer_model: str | None,
    vocab_file: str | None,
    merge_file: str | None,
) -> list[tuple[str, str]]:
    """(flag, path) of every file the run reads, which it must never write over (``input_name``
    one ``--input`` file or a list of them; None: the rows come from ``--hf-dataset``)."""
    names = [input_name] if isinstance(input_name, str) else list(input_name or [])
    files = [("--input", name) for name in names]
    for flag, path in (
        ("--tokenizer-model", tokenizer_model),
        ("--vocab-file", vocab_file),
        ("--merge-file", merge_file),
    ):
        if path and os.path.isfile(path):
            files.append((flag, path))
    return files


def occupant(path: str) -> str | None:
    """What is at an output name: ``"folder"`` (a folder, not a link to one: nothing can be
    renamed over it, so it is refused with ``--force`` too), ``"file"`` (a file, a link, anything
    else: replaced only with ``--force``) or None (nothing). The one rule of both
    :func:`check_outputs` and ``dlmspec task make --prepare-data``'s check of every output
    before it writes (:func:`dlmspec.tasks.datasets.existing_outputs`)."""
    if os.path.isdir(path) and not os.path.islink(path):
        return "folder"
    return "file" if os.path.lexists(path) else None


def check_outputs(
    outputs: dict[str, DatasetOutput],
    output_prefix: str,
    protected: list[tuple[str, str]],
    force: bool,
) -> None:
    """Refuse output names that would lose a file; raises :class:`DataPrepareError`.

    An output (``PREFIX.bin``, ``PREFIX.idx`` or the dataset record ``PREFIX.dlmspec.json``) that
    is the same file as an input (by name, through a symlink on either side, a symlinked folder,
    or a hard link) is always refused: the commit renames over the output name. A folder at an output name is refused (it cannot be renamed over). Any other file
    at an output name (a dataset from an earlier run, a lone ``.bin``) is refused unless
    ``force``.
    """
    existing: list[str] = []
    from dlmspec.data.record import record_path

    for out in outputs.values():
        for path in (out.bin_path, out.idx_path, record_path(out.prefix)):
            for flag, value in protected:
                if _same_file(value, path) and path == record_path(out.prefix):
                    raise DataPrepareError(
                        f"--output-prefix {output_prefix}: {path}, the dataset record, is an input file "
                        f"({flag} {value}), and data prepare never writes over its input (--force does not "
                        f"allow this); pick another --output-prefix, e.g. {output_prefix}-tokens"
                    )
                if _same_file(value, path):
                    if os.path.abspath(value) == os.path.abspath(path):
                        what = "this file is an output"
                    else:
                        what = f"this is the same file as {path} (through a link), an output"
                    raise DataPrepareError(
                        f"{flag} {value}: {what} of --output-prefix {output_prefix} (key "
                        f"{out.json_key!r}), and data prepare never writes over its input "
                        "(--force does not allow this). Pick another --output-prefix, e.g. "
                        f"{output_prefix}-tokens"
                    )
            if path not in (out.bin_path, out.idx_path):
                continue  # the record is replaced whole with the dataset (write_atomic)
            found = occupant(path)
            if found == "folder":
                raise DataPrepareError(
                    f"--output-prefix {output_prefix}: {path} is a folder, where the dataset "
                    "file goes. Pick another --output-prefix, or move the folder"
                )
            if found == "file":
                existing.append(path)
    if existing and not force:
        raise DataPrepareError(
            f"--output-prefix {output_prefix}: {', '.join(existing)} already exist "
            "(a dataset from an earlier run?), and data prepare would replace them. Pass "
            "--force to replace them, or pick another --output-prefix"
        )


# --------------------------------------------------------------------------- temporary files

#: Signals that end a run with its temporary files removed (SIGINT raises KeyboardInterrupt).
TERMINATION_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def install_termination_handlers() -> dict[int, Any]:
    """Make SIGTERM/SIGHUP raise :class:`PrepareInterrupted` in the main thread.

    Only signals that still have their default action are taken (an ignored SIGHUP under
    ``nohup``, or an application's own handler, stays). A second signal gets the default
    action (the process ends at once). Returns the replaced handlers, for
    :func:`restore_handlers`; nothing is installed outside the main thread.
    """
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        raise PrepareInterrupted(signum)

    previous: dict[int, Any] = {}
    for signum in TERMINATION_SIGNALS:
        if signal.getsignal(signum) is signal.SIG_DFL:
            previous[signum] = signal.signal(signum, handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`install_termination_handlers` replaced."""
    for signum, old in previous.items():
        signal.signal(signum, old)


def host_tag() -> str:
    """This host's name as it goes into temporary file names: ``[A-Za-z0-9-]``, no dots."""
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")[:40] or "host"


def tmp_tag() -> str:
    """``tmp-HOST-PID-HEX``: the part of this run's temporary file names that is its own."""
    return f"tmp-{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


_TMP_MARK = f"_{LEVEL}.tmp-"


def _tmp_owner(name: str) -> tuple[str, int] | None:
    """``(host, pid)`` of a temporary file name ``*_document.tmp-[HOST-]PID-HEX.{bin,idx}``.

    ``host`` is ``""`` in names without it (written before hosts were named); None when
    ``name`` is not a temporary file name of :func:`dlmspec.data.prepare.prepare`.
    """
    stem, _, ext = name.rpartition(".")
    _, mark, tag = stem.rpartition(_TMP_MARK)
    if ext not in ("bin", "idx") or not mark:
        return None
    parts = tag.split("-")
    if len(parts) < 2:
        return None
    host, pid, hex_part = "-".join(parts[:-2]), parts[-2], parts[-1]
    if not (pid.isascii() and pid.isdigit()) or not re.fullmatch(r"[0-9a-f]{8}", hex_part):
        return None
    return host, int(pid)


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (a pid of another user counts)."""
    if os.name != "posix":
        return True  # no cheap check: keep the files
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def _size_text(nbytes: int) -> str:
    if nbytes < 1000:
        return f"{nbytes} B"
    for unit, scale in (("KB", 1e3), ("MB", 1e6), ("GB", 1e9)):
        if nbytes < 1000 * scale or unit == "GB":
            return f"{nbytes / scale:,.1f} {unit}"
    raise AssertionError("unreachable")


def _is_shard_name(rest: str) -> bool:
    """Whether ``rest`` (a name after ``PREFIX-``) starts as a shard's: five or more digits, ``_``."""
    digits, sep, _ = rest.partition("_")
    return bool(sep) and len(digits) >= 5 and digits.isascii() and digits.isdigit()


def remove_stale_tmp(output_prefix: str, protected: list[tuple[str, str]]) -> list[str]:
    """Remove the temporary files of dead runs under ``output_prefix``; returns the notes.

    A file is one of ours by its name (:func:`_tmp_owner`), below the prefix's folder and
    starting with ``{basename(output_prefix)}_`` (or ``{basename(output_prefix)}-NNNNN_``, a
    shard of ``--shard-size``), for any key. It is removed when it was
    written on this host (or before hosts were named) by a pid that does not run. Files of a
    live pid or of another host are kept and named in a note; an input file is never removed.
    A pid reused by an unrelated process keeps its files until that process ends.
    """
    directory = os.path.dirname(output_prefix) or "."
    start = os.path.basename(output_prefix) + "_"
    shard_start = os.path.basename(output_prefix) + "-"  # a shard's: PREFIX-00000_KEY_document.tmp-...
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    host = host_tag()
    removed: dict[int, list[str]] = {}
    kept: dict[str, list[str]] = {}
    freed = 0
    failed: list[str] = []
    for name in names:
        ours = name.startswith(start) or (name.startswith(shard_start) and _is_shard_name(name[len(shard_start):]))
        owner = _tmp_owner(name) if ours else None
        if owner is None:
            continue
        file_host, pid = owner
        path = os.path.join(directory, name)
        if file_host and file_host != host:
            owner_text = f"of host {file_host} (its pid {pid} cannot be checked from here)"
            kept.setdefault(owner_text, []).append(path)
            continue
        if pid == os.getpid() or _pid_alive(pid):
            kept.setdefault(f"of a running process (pid {pid})", []).append(path)
            continue
        if any(_same_file(value, path) for _, value in protected):
            continue
        try:
            info = os.lstat(path)
            if os.path.isdir(path) and not os.path.islink(path):
                continue
            os.remove(path)
        except OSError as exc:
            failed.append(f"{path} ({exc.strerror})")
            continue
        freed += info.st_size
        removed.setdefault(pid, []).append(path)
    notes = []
    if removed:
        count = sum(len(paths) for paths in removed.values())
        pids = ", ".join(str(pid) for pid in removed)
        paths = ", ".join(p for group in removed.values() for p in group)
        notes.append(
            f"removed {count} stale temporary file{'s' if count != 1 else ''} "
            f"({_size_text(freed)}) of interrupted runs (pid {pids}: not running): {paths}"
        )
    for owner_text, paths in kept.items():
        notes.append(
            f"left {len(paths)} temporary file{'s' if len(paths) != 1 else ''} {owner_text} "
            f"alone: {', '.join(paths)}"
        )
    if failed:
        notes.append(f"could not remove stale temporary files: {', '.join(failed)}")
    return notes


def remove_file(path: str) -> None:
    """Remove ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def commit_datasets(outputs: dict[Any, DatasetOutput], tmp: dict[Any, str], committed: set) -> None:
    """Rename each finished ``tmp[key].bin/.idx`` onto its output. An ``.idx`` beside a ``.bin``
    marks a complete dataset, so the old ``.idx`` goes first and the new one comes last; each key
    whose ``.bin`` was renamed is added to ``committed`` (for :func:`discard_partial`)."""
    for key, out in outputs.items():
        remove_file(out.idx_path)
        os.replace(tmp[key] + ".bin", out.bin_path)
        committed.add(key)
        os.replace(tmp[key] + ".idx", out.idx_path)


def discard_partial(outputs: dict[Any, DatasetOutput], tmp: dict[Any, str], builders: dict[Any, Any],
                    committed: set) -> None:
    """After a failure: close the builders' files, remove the temporary ``.bin``/``.idx``, and a
    renamed ``.bin`` whose ``.idx`` never followed (an incomplete dataset); complete ones stay."""
    for key, out in outputs.items():
        builder = builders.get(key)
        if builder is not None:
            with contextlib.suppress(Exception):
                builder.data_file.close()
        remove_file(tmp[key] + ".bin")
        remove_file(tmp[key] + ".idx")
        if key in committed and not os.path.exists(out.idx_path):
            remove_file(out.bin_path)
