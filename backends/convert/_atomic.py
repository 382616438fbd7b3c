"""Write a checkpoint folder so that nothing half-written sits at its final path, nothing a user
wrote is lost, and an interrupted write leaves no temporary folder behind.

* The files are written into ``<parent>/.<name>.tmp-<pid>@<host>.<8 hex>`` (same filesystem as
  ``dst``), a folder created here and now (``mkdir`` fails on anything already there, a link
  included) and readable by its owner only until it is moved into place, so no one else can plant
  a link inside it; removed when the body raises, on Ctrl-C and on SIGTERM. Small files are
  written with :func:`write_new` (created exclusively).
* A new ``dst`` appears by one ``os.replace``. Over an existing folder (``overwrite``) only the
  files the writer owns (``owned`` patterns: the file names convert writes) are replaced or, when
  the new output lacks them (an older run's shards), removed; every other file stays. The
  ``marker`` file (``config.json``, ``metadata.json``) is removed first and moved in last, so an
  interrupted replacement leaves a folder that is refused as incomplete, not a mixed checkpoint.
* Temporary folders of a killed run (its process is gone on this host) are removed by the next
  write to the same ``dst``, and that is said in one line on stderr.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dlmspec.backends.convert.errors import ConversionError, Interrupted
from dlmspec.files import create_exclusive

_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)@(?P<host>[^/]+)\.(?P<tag>[0-9a-f]{8})$")


def overlap(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> str | None:
    """How ``dst`` overlaps ``src`` once symbolic links are resolved: ``"same"``, ``"inside"``
    (``dst`` is inside ``src``), ``"holds"`` (``src`` is inside ``dst``), or ``None``."""
    a, b = Path(src).resolve(), Path(dst).resolve()
    if a == b:
        return "same"
    if a in b.parents:
        return "inside"
    if b in a.parents:
        return "holds"
    return None


def check_separate(src: str | os.PathLike[str], dst: str | os.PathLike[str], *, src_name: str = "src",
                   dst_name: str = "dst") -> None:
    """Refuse an output that is, holds or sits inside the input (symbolic links resolved).

    ``src_name``/``dst_name`` are how the caller's user spells them (``SRC``/``DST`` on the
    command line, ``src``/``dst`` for the Python API).

    Raises:
        ConversionError: the two overlap; writing there could replace or bury the input.
    """
    how = overlap(src, dst)
    if how is None:
        return
    s, d = f"{src_name} {str(src)!r}", f"{dst_name} {str(dst)!r}"
    relation = {"same": f"{d} is the same folder as {s}", "inside": f"{d} is inside {s}",
                "holds": f"{d} holds {s} inside it"}[how]
    outside = Path(dst if how == "holds" else src).resolve()
    suggestion = outside.parent / f"{outside.name}-converted"
    raise ConversionError(
        f"{relation}: writing the output there could replace or delete the input. Fix: choose a {dst_name} "
        f"outside {src_name}, e.g. {str(suggestion)!r}",
        tensor=dst_name,
        expected=f"a folder that neither is, holds nor sits inside {src_name}",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(dst: str | os.PathLike[str], *, say: Callable[[str], None] | None = None) -> list[Path]:
    """Remove the temporary folders of ``dst`` that no running process owns.

    A temporary folder ``.<name>.tmp-<pid>@<host>.<tag>`` is stale when ``host`` is this machine
    and process ``pid`` has ended; folders of a live process or of another host (a shared
    filesystem) are kept. ``say`` (default: a line on stderr) is told once what was removed.

    Returns:
        The folders removed.
    """
    dst = Path(dst)
    parent = dst.parent
    if not parent.is_dir():
        return []
    host = socket.gethostname()
    removed = []
    for entry in parent.iterdir():
        match = _TMP.match(entry.name)
        if not match or match["name"] != dst.name or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _alive(pid) or entry.is_symlink() or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    if removed:
        message = (f"removed {len(removed)} stale temporary folder(s) left by an interrupted conversion "
                   f"(its process has ended): {', '.join(str(p) for p in removed)}")
        (say or (lambda line: print(line, file=sys.stderr)))(message)
    return removed


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the body runs, SIGTERM raises :class:`Interrupted` (so cleanup runs) instead of
    killing the process; only where SIGTERM has its default action and in the main thread (a
    program's own SIGTERM handler is left alone)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def signals_held() -> Iterator[None]:
    """Defer SIGINT and SIGTERM until the body is done, then deliver them as they would have been.

    Used for the final moves of :func:`atomic_directory` and around megatron-core's save, whose
    forked writer processes (they inherit the handlers) would otherwise die mid-write, printing
    their own tracebacks, while the temporary folder is removed under them. The handlers are
    swapped (main thread only; elsewhere a no-op): a thread mask would not do, since any of
    torch's threads may take the signal.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = (signal.SIGINT, signal.SIGTERM)
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def write_new(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) into the new file ``path`` (inside the temporary folder of
    :func:`atomic_directory`), created exclusively (:func:`dlmspec.files.create_exclusive`): a
    file or link already at that name is an error, never written through or over.

    Raises:
        FileExistsError: something is already at ``path``.
    """
    fd = create_exclusive(path, 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode("utf-8"))


def _owned(name: str, owned: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in owned)


def _replace_owned(tmp: Path, dst: Path, owned: tuple[str, ...], marker: str | None) -> None:
    """Move ``tmp``'s files into the existing folder ``dst``; remove owned files it lacks."""
    new = {p.name for p in tmp.iterdir()}
    stale = [p for p in dst.iterdir() if _owned(p.name, owned) and p.name not in new]
    order = sorted(new - {marker}) + ([marker] if marker in new else [])
    if marker is not None:
        (dst / marker).unlink(missing_ok=True)
    for path in stale:
        path.unlink(missing_ok=True)
    for name in order:
        os.replace(tmp / name, dst / name)
    tmp.rmdir()


@contextmanager
def atomic_directory(dst: str | os.PathLike[str], overwrite: bool = False, *, owned: tuple[str, ...] = (),
                     marker: str | None = None) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``dst``; when the body succeeds, its files become ``dst``.

    Args:
        dst: the folder to write.
        overwrite: write into an existing ``dst``, replacing only the files matching ``owned``.
        owned: ``fnmatch`` patterns of the file names this writer produces (``"*.distcp"``).
        marker: the file moved in last and removed first when ``dst`` exists (its absence marks
            an incomplete folder to every reader).

    The temporary folder is removed if the body raises, on Ctrl-C and on SIGTERM (raised as
    :class:`Interrupted`); stale ones of killed runs are removed first
    (:func:`remove_stale_temporaries`). A signal arriving during the final moves is held until
    they are done; the ``KeyboardInterrupt`` then raised has ``written = True`` (``dst`` is
    complete), one raised earlier ``written = False`` (``dst`` is as it was).

    Raises:
        ConversionError: ``dst`` exists and ``overwrite`` is false; ``dst`` is not a folder; a
            name this writer owns is a folder inside ``dst``.
        Interrupted: SIGTERM arrived while writing.
    """
    dst = Path(dst)
    exists = dst.exists() or dst.is_symlink()
    if exists and not overwrite:
        raise ConversionError(
            f"destination {str(dst)!r} already exists (pass overwrite=True to replace the files convert writes "
            "there; other files are kept)",
            tensor=str(dst),
            expected="a path that does not exist",
        )
    if exists:
        if not dst.is_dir():
            raise ConversionError(f"destination {str(dst)!r} exists and is not a folder", tensor=str(dst),
                                  expected="a folder")
        dst = dst.resolve()  # a link to a folder: write beside the real one (same filesystem)
        for entry in dst.iterdir():
            if _owned(entry.name, owned) and entry.is_dir() and not entry.is_symlink():
                raise ConversionError(
                    f"{str(entry)!r} is a folder, but convert writes a file of that name; move it away first",
                    tensor=str(entry),
                    expected="a file or nothing",
                )
    dst.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(dst)
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}@{socket.gethostname()}.{uuid.uuid4().hex[:8]}"
    tmp.mkdir(mode=0o700)
    written = False
    try:
        with _sigterm_raises():
            yield tmp
            with signals_held():  # a signal held here is raised when the moves are done
                if exists:
                    _replace_owned(tmp, dst, owned, marker)
                else:
                    os.chmod(tmp, 0o755)
                    os.replace(tmp, dst)
                written = True
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            exc.written = written  # type: ignore[attr-defined]  # dst complete (signal came at the end)
        raise
