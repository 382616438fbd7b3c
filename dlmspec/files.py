"""Reading and writing files that dlmspec does not trust: every file a user, another run or
another machine left behind (dataset records and manifests, ``metrics.jsonl``, lock files,
checkpoint records, ``config.json``, prompt files, progress files).

Reading: only regular files (a FIFO, device or socket is refused before a byte is read: the
file is opened without blocking and checked again on the open descriptor), at most ``limit``
bytes (one more byte read tells that it is larger), UTF-8, and for JSON and TOML nested at most
``depth`` levels (checked before parsing, so no parser recursion runs out). Every refusal is a
:class:`FileRefused` naming the file, why and a fix; the CLI turns it into exit code 2.

Writing: :func:`write_atomic` writes a new file beside the target (created exclusively, never
through a symbolic link), flushes it and renames it over the target, so a link or a file placed
at the temporary name is never written through, and the target is either the old file or the
whole new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10 (a runtime container): tomli, else no TOML reading
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

#: Default cap of a JSON or TOML record (dataset records, manifests, lock files, checkpoint
#: records, ``config.json``): each is a few KiB; a manifest of 100,000 shards is ~20 MiB.
MAX_RECORD_BYTES = 64 << 20

#: Default nesting cap of JSON and TOML records: arrays and objects (tables) together. The
#: deepest record dlmspec writes nests 8 levels.
MAX_NESTING = 64

#: Default cap of one line of a JSON-lines file (``metrics.jsonl``, ``--prompts``, ``--choices``).
MAX_LINE_BYTES = 16 << 20

#: Largest single read (bytes): a read reserves its whole size before the file answers.
_READ_PIECE = 1 << 20

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class FileRefused(ValueError):
    """A file dlmspec will not read (or write): ``path``, ``why`` and a ``hint`` that works.

    ``str()`` is one line: ``"PATH: WHY. Fix: HINT"``."""

    def __init__(self, path: str | os.PathLike[str], why: str, hint: str) -> None:
        self.path = str(path)
        self.why = why
        self.hint = hint
        super().__init__(f"{self.path}: {why}. Fix: {hint}")


def file_kind(mode: int) -> str:
    """``"a directory"``, ``"a FIFO (named pipe)"``, ... for a non-regular ``st_mode``."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _size_text(size: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f} {unit}"
    return f"{size} bytes"


def open_regular(path: str | os.PathLike[str], *, what: str = "file") -> int:
    """An open read-only descriptor of the regular file ``path`` (the caller closes it).

    Raises:
        FileRefused: missing, unreadable, or not a regular file (FIFO, device, socket, folder).
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise FileRefused(path, f"the {what} does not exist", f"check the path of the {what}") from None
    except (OSError, ValueError) as exc:
        raise FileRefused(path, f"cannot open the {what}: {getattr(exc, 'strerror', None) or exc}",
                          "check the path and its permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FileRefused(path, f"the {what} is {file_kind(mode)}, not a regular file",
                          f"point at the {what} itself (dlmspec never reads pipes or devices)")
    return fd


def read_bytes(path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        FileRefused: see :func:`open_regular`; larger than ``limit``; a read error.
    """
    too_large = FileRefused(path, f"the {what} is larger than {_size_text(limit)}, more than a {what} ever holds",
                            f"point at the right {what}, or check that it was not replaced")
    fd = open_regular(path, what=what)
    with os.fdopen(fd, "rb", buffering=0) as handle:
        if os.fstat(handle.fileno()).st_size > limit:  # a huge (or sparse) file is refused unread
            raise too_large
        pieces: list[bytes] = []
        total = 0
        try:
            # Blocking reads from here on (the file is regular): O_NONBLOCK only guarded the open.
            # In pieces of at most 1 MiB: read(limit + 1) would reserve the whole cap up front.
            while total <= limit:
                piece = handle.read(min(_READ_PIECE, limit + 1 - total))
                if not piece:
                    break
                pieces.append(piece)
                total += len(piece)
        except OSError as exc:
            raise FileRefused(path, f"cannot read the {what}: {exc.strerror or exc}", "check the file") from None
    if total > limit:  # it grew while it was read
        raise too_large
    return b"".join(pieces)


def read_text(path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES, what: str = "file") -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`).

    Raises:
        FileRefused: see :func:`read_bytes`; not UTF-8.
    """
    data = read_bytes(path, limit=limit, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"the {what} is not UTF-8 text (byte {exc.start})",
                          f"point at the right {what}, or write it again") from None


#: A string literal of JSON (and TOML's basic strings): escapes skipped, closed by its quote or
#: by the end of the text (an unterminated string hides the rest, as a parser would read it).
_BASIC_STRING = r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)'
#: TOML's literal strings: no escapes.
_LITERAL_STRING = r"'[^']*(?:'|\Z)"
_JSON_STRINGS = re.compile(_BASIC_STRING, re.S)
_TOML_STRINGS = re.compile(f"{_BASIC_STRING}|{_LITERAL_STRING}", re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_exceeds(text: str, depth: int, *, toml: bool = False) -> bool:
    """Whether the arrays and objects (TOML: arrays, inline tables and dotted table headers
    aside) of ``text`` open more than ``depth`` levels deep, brackets inside strings ignored.
    Linear in ``len(text)``, no recursion: the string literals are cut out by one regular
    expression, then only the brackets left are counted (a 1 MB vocab.json in ~10 ms, where a
    character-by-character loop took ~100 ms)."""
    level = 0
    stripped = (_TOML_STRINGS if toml else _JSON_STRINGS).sub("", text)
    for match in _BRACKETS.finditer(stripped):
        if match.group() in "[{":
            level += 1
            if level > depth:
                return True
        else:
            level = max(0, level - 1)
    return False


def loads_json(text: str | bytes, *, depth: int = MAX_NESTING, where: str | os.PathLike[str] = "<json>",
               what: str = "file") -> Any:
    """``json.loads(text)`` refused past ``depth`` levels of nesting or on any parse error.

    Raises:
        FileRefused: not JSON, too deep, or an integer longer than Python converts.
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FileRefused(where, f"the {what} is not UTF-8 text (byte {exc.start})",
                              f"point at the right {what}, or write it again") from None
    if nesting_exceeds(text, depth):
        raise FileRefused(where, f"the {what} nests arrays and objects more than {depth} levels deep",
                          f"point at the right {what}: dlmspec's records nest a few levels")
    try:
        return json.loads(text)
    except RecursionError:
        raise FileRefused(where, f"the {what} nests too deep to parse", f"point at the right {what}") from None
    except ValueError as exc:  # json.JSONDecodeError, and int() past sys.get_int_max_str_digits()
        raise FileRefused(where, f"the {what} is not valid JSON ({_short(exc)})",
                          f"point at the right {what}, or write it again") from None


def read_json(path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES, depth: int = MAX_NESTING,
              what: str = "file") -> Any:
    """The JSON value in the regular file ``path`` (see :func:`read_text`, :func:`loads_json`).

    Raises:
        FileRefused: see :func:`read_text` and :func:`loads_json`.
    """
    return loads_json(read_text(path, limit=limit, what=what), depth=depth, where=path, what=what)


def read_toml(path: str | os.PathLike[str], *, limit: int = MAX_RECORD_BYTES, depth: int = MAX_NESTING,
              what: str = "file") -> dict[str, Any]:
    """The TOML document in the regular file ``path``.

    Raises:
        FileRefused: see :func:`read_text`; nested past ``depth``; not TOML.
    """
    text = read_text(path, limit=limit, what=what)
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise FileRefused(path, "no TOML parser is installed (Python 3.10 without tomli)", "pip install tomli")
    if nesting_exceeds(text, depth, toml=True):
        raise FileRefused(path, f"the {what} nests arrays and tables more than {depth} levels deep",
                          f"point at the right {what}")
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise FileRefused(path, f"the {what} nests too deep to parse", f"point at the right {what}") from None
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise FileRefused(path, f"the {what} is not valid TOML ({_short(exc)})",
                          f"point at the right {what}, or write it again") from None


def iter_lines(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES,
               what: str = "file") -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of the regular file ``path`` (1-based, the newline stripped),
    read in bounded pieces: a line longer than ``max_line_bytes`` is refused, never held whole.

    Raises:
        FileRefused: see :func:`open_regular`; a line longer than ``max_line_bytes``.
    """
    fd = open_regular(path, what=what)
    with os.fdopen(fd, "rb") as handle:
        number = 0
        while True:
            line = handle.readline(max_line_bytes + 1)
            if not line:
                return
            number += 1
            if len(line) > max_line_bytes and not (len(line) == max_line_bytes + 1 and line.endswith(b"\n")):
                raise FileRefused(path, f"line {number} of the {what} is longer than {_size_text(max_line_bytes)}",
                                  f"point at the right {what}, or check that it was not replaced")
            yield number, line.rstrip(b"\r\n")


def _short(exc: BaseException, width: int = 120) -> str:
    text = str(exc).replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------------------------------
# Writing


def create_exclusive(path: str | os.PathLike[str], mode: int = 0o600) -> int:
    """A write-only descriptor of the new file ``path``: created here and now, never an existing
    file and never through a symbolic link (``O_CREAT | O_EXCL | O_NOFOLLOW``).

    Raises:
        FileExistsError: something (a file or a link) is already there.
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                   | getattr(os, "O_CLOEXEC", 0), mode)


def default_mode() -> int:
    """``0o666`` less the process's umask: the mode ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[BinaryIO]:
    """A binary file to write the new content of ``path`` into, for writers that want a file
    object (``fig.savefig(handle)``, ``json.dump``): a temporary file created exclusively beside
    ``path`` (``.<name>.tmp-<random>``, ``O_CREAT | O_EXCL | O_NOFOLLOW``), flushed, given
    ``mode`` (default :func:`default_mode`) and renamed over ``path`` when the block ends without
    an exception. A symbolic link at ``path`` is replaced, never written through; on any failure
    the temporary file is removed and ``path`` is as it was.

    Raises:
        OSError: the folder cannot be written, the disk is full, ...
        IsADirectoryError: ``path`` is a folder.
    """
    target = Path(path)
    if target.is_dir() and not target.is_symlink():
        raise IsADirectoryError(f"{target} is a folder")
    temp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:12]}")
    fd = create_exclusive(temp, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), default_mode() if mode is None else mode)
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = 0o644) -> None:
    """Write ``data`` (``str``: UTF-8, ``\\n`` line ends) to ``path``: into a temporary file
    created exclusively beside it (``.<name>.tmp-<random>``), flushed, then renamed over ``path``
    (:func:`atomic_writer`). A symbolic link at ``path`` is replaced by the file, never written
    through; on any failure the temporary file is removed and ``path`` is as it was.

    Raises:
        OSError: the folder cannot be written, the disk is full, ...
        IsADirectoryError: ``path`` is a folder.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_writer(path, mode=mode) as handle:
        handle.write(payload)


def append_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o644) -> None:
    """Append ``text`` (UTF-8) to the regular file ``path``, creating it if absent: opened with
    ``O_APPEND | O_CREAT | O_NOFOLLOW`` (never written through a symbolic link; a link or a
    non-regular file there is refused), one ``write`` per call (a log of JSON lines).

    Raises:
        FileRefused: ``path`` is a symbolic link or not a regular file.
        OSError: the folder cannot be written, the disk is full, ...
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        if os.path.islink(path):
            raise FileRefused(path, "is a symbolic link, which is never written through",
                              "remove the link, or point the run's folder elsewhere") from None
        raise exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(path, f"is a {file_kind(info.st_mode)}, not a regular file",
                              "remove it, or point the run's folder elsewhere")
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
