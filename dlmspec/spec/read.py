"""Reading TOML spec files and their ``extends`` chain: only regular files (never pipes or devices)
of at most :data:`MAX_SPEC_BYTES`, read through :func:`dlmspec.files.read_bytes`, as UTF-8;
nesting of at most ``MAX_DEPTH`` levels; chains of at most :data:`MAX_EXTENDS` files. Every
problem is a :class:`~dlmspec.errors.SpecError` naming the file (or the ``extends`` key that named it).
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlmspec.errors import Fix, SpecError, SpecIssue
from dlmspec.files import FileRefused, read_bytes
from dlmspec.spec.dotted import LONG_NUMBER, deep_merge, flatten_keys, nesting_message, too_deep
from dlmspec.spec.lines import Origin, _deep_line, _leading_keys, _line_of, line_map, locate_key
from dlmspec.spec.schema_errors import _INT64_HINT, _excerpt, _short_key

#: Largest spec file read, bytes (4 MiB). Real specs are a few KiB; without a cap a mistaken
#: path (``extends = "/dev/zero"``, a dataset) filled memory.
MAX_SPEC_BYTES = 4 << 20


#: Most files in an ``extends`` chain, the spec itself included (real chains have 2 or 3; a
#: chain of about 1000 raised RecursionError).
MAX_EXTENDS = 32


#: The fix of a nesting issue.
_SPEC_DEPTH_HINT = ("write it flatter, as the spec's keys (the deepest is cluster.slurm.env.NAME); "
                    "`dlmspec schema` lists them")


def _file_kind(mode: int) -> str:
    """What a file that is not regular is, for messages (``stat`` mode)."""
    for test, kind in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a plain file"


@dataclass(frozen=True)
class _Ref:
    """Who named a spec file: the ``extends`` key (as written) at ``file``:``line``."""

    file: str
    line: int | None
    written: str


def _file_error(path: Path, message: str, hint: str, ref: _Ref | None) -> SpecError:
    """A :class:`SpecError` about the spec file ``path``, pointing at the ``extends`` that
    named it (``ref``) or, for the file given on the command line, at the file itself."""
    if ref is not None:
        return SpecError([SpecIssue("extends", message, value=ref.written, hint=hint, rule="file", file=ref.file,
                                    line=ref.line)])
    return SpecError([SpecIssue("<file>", message, value=str(path), hint=hint, rule="file", file=str(path))])


def _missing_file_hint(path: Path) -> str:
    """The fix for a spec file given on the command line that does not exist: a close name in its
    directory (``did you mean ...``) or the directory's absence, where a relative path is read
    from, and how to write a spec there (``dlmspec new``)."""
    import difflib  # only for this message

    cwd = Path.cwd()
    try:
        shown = path.relative_to(cwd) if path.is_absolute() else path
    except ValueError:
        shown = path
    read_from = f" (relative paths are read from {cwd})" if not shown.is_absolute() else ""
    folder = shown.parent
    try:
        specs = {p.stem: p.name for p in path.parent.iterdir() if p.suffix in (".toml", ".py") and p.is_file()}
    except OSError:
        specs = None
    if specs is None:
        first = f"the directory {folder} does not exist{read_from}"
    else:
        close = difflib.get_close_matches(path.stem, sorted(specs), n=1, cutoff=0.75)
        first = (f"did you mean {folder / specs[close[0]] if str(folder) != '.' else specs[close[0]]}?" if close
                 else f"check the path{read_from}")
    return f"{first}{' ' if first.endswith('?') else '. '}Or write a spec there: dlmspec new {shown} --from demo-dlm " \
           "(or --preset NAME)"


def _check_file(path: Path, ref: _Ref | None) -> int:
    """Check with ``os.stat`` (nothing is opened) that ``path`` is a regular file of at most
    :data:`MAX_SPEC_BYTES`; return its size.

    Raises:
        SpecError: missing, a directory, a pipe, device or socket, too large, or unreadable.
    """
    what = "a spec file (extends is relative to the file that names it)" if ref else "a .toml or .py spec file"
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise _file_error(path, f"file not found: {path}",
                          "check the path (extends is relative to the file that names it)" if ref else
                          _missing_file_hint(path), ref) from None
    except (OSError, ValueError) as exc:  # permissions, symlink loops, names too long, NUL bytes
        raise _file_error(path, f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                          f"give the path of {what}", ref) from None
    if stat.S_ISDIR(info.st_mode):
        raise _file_error(path, f"{path} is a directory, not a spec file", "give a .toml or .py spec file", ref)
    if not stat.S_ISREG(info.st_mode):
        raise _not_regular(path, info.st_mode, ref)
    if info.st_size > MAX_SPEC_BYTES:
        raise _too_large(path, info.st_size, ref)
    return info.st_size


def _not_regular(path: Path, mode: int, ref: _Ref | None) -> SpecError:
    return _file_error(path, f"{path} is {_file_kind(mode)}, not a regular file: dlmspec reads specs only from "
                       "regular files (a pipe or device can block or never end)",
                       "give the path of a spec file; to use generated text, write it to a file first", ref)


def _too_large(path: Path, size: int | None, ref: _Ref | None) -> SpecError:
    size_text = f"{size:,} bytes" if size is not None else "more than that"
    return _file_error(path, f"{path} is {size_text}: dlmspec reads at most {MAX_SPEC_BYTES >> 20} MiB "
                       f"({MAX_SPEC_BYTES:,} bytes) of a spec file, and a spec is a few KiB",
                       "check that this is the spec you meant" + (" (extends names a spec file)" if ref else ""),
                       ref)


def _read_spec_text(path: Path, ref: _Ref | None) -> str:
    """The text of the TOML spec ``path``, read as :func:`_check_file` allows, through
    :func:`dlmspec.files.read_bytes` (opened without blocking, checked again on the open file, so
    a pipe put there after the check is not read; at most :data:`MAX_SPEC_BYTES`). Newlines are
    read as ``Path.read_text`` reads them.

    Raises:
        SpecError: see :func:`_check_file`; refused by :func:`dlmspec.files.read_bytes` (the file
            changed after the check); not UTF-8.
    """
    _check_file(path, ref)
    try:
        data = read_bytes(path, limit=MAX_SPEC_BYTES, what="spec file")
    except FileRefused as exc:
        raise _file_error(path, f"cannot read {path}: {exc.why}", exc.hint, ref) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([SpecIssue("<file>", f"not UTF-8 text (byte {exc.start}): a spec is a TOML or Python file",
                                   value=str(path), hint="save the spec as UTF-8 text", rule="file",
                                   file=str(path))]) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _nesting_error(path: Path, text: str, lines: dict[str, int], key_path: tuple[Any, ...] | None,
                   line: int | None) -> SpecError:
    """The nesting issue of the TOML file ``path``: at ``key_path`` (from :func:`too_deep`),
    else at ``line``, naming the key written on or above that line."""
    if key_path is not None:
        full = ".".join(_leading_keys(key_path))
        origins: dict[str, Origin] = {k: (str(path), n) for k, n in lines.items()}
        line = locate_key(origins, full, path)[1]
        key = _short_key(key_path)
    else:
        above = [(n, k) for k, n in lines.items() if line is not None and n <= line]
        key = _short_key(max(above)[1].split(".")) if above else "<toml>"
    source = text.splitlines()[line - 1].strip() if line else ""
    return SpecError([SpecIssue(key, nesting_message(), value=_excerpt(source) or None, hint=_SPEC_DEPTH_HINT,
                                rule="nesting", file=str(path), line=line)])


def _long_number_error(path: Path, text: str) -> SpecError:
    """The issue of a TOML file holding an integer longer than Python reads, at its line."""
    match = re.search(r"[0-9_]{4301,}", text)
    line = text.count("\n", 0, match.start()) + 1 if match else None
    above = [(n, k) for k, n in line_map(text).items() if line is not None and n <= line]
    key = max(above)[1] if above else "<toml>"
    source = text.splitlines()[line - 1].strip() if line else ""
    return SpecError([SpecIssue(key, LONG_NUMBER, value=_excerpt(source) or None, hint=_INT64_HINT, rule="int64",
                                file=str(path), line=line)])


def _load_toml(path: Path) -> tuple[dict[str, Any], dict[str, Origin], dict[str, str]]:
    """Read the TOML spec ``path`` and its ``extends`` chain (at most :data:`MAX_EXTENDS`
    files, no cycles) and merge them, parents first; also return where each key was written and
    :attr:`LoadedSpec.files`."""
    chain: list[tuple[dict[str, Any], dict[str, Origin]]] = []
    seen: list[Path] = []
    ref: _Ref | None = None
    while True:
        if path in seen:
            names = " -> ".join(str(p) for p in (*seen, path))
            assert ref is not None
            raise SpecError([SpecIssue("extends", f"circular extends: {names}", value=ref.written,
                                       hint="remove the extends that leads back: a spec cannot extend itself or a "
                                       "spec that extends it", rule="extends", file=ref.file, line=ref.line,
                                       fix=Fix(unset=("extends",)))])
        if len(seen) == MAX_EXTENDS:
            assert ref is not None
            shown = [p.name for p in seen]
            names = " -> ".join(shown if len(shown) <= 5 else [*shown[:3], "...", *shown[-2:]])
            raise SpecError([SpecIssue("extends", f"the extends chain is longer than {MAX_EXTENDS} files "
                                       f"({names} -> ...)", value=ref.written,
                                       hint=f"extend a spec nearer the base: a chain has at most {MAX_EXTENDS} "
                                       "files (a base and a few layers)", rule="extends", file=ref.file,
                                       line=ref.line)])
        data, origins, parent, lines = _read_toml(path, ref)
        chain.append((data, origins))
        seen.append(path)
        if parent is None:
            break
        if not isinstance(parent, str):
            raise SpecError([SpecIssue("extends", "extends must be a file path string", value=parent,
                                       hint='e.g. extends = "base.toml"', rule="extends", file=str(path),
                                       line=lines.get("extends"))])
        try:
            parent_path = (path.parent / parent).resolve()
        except (OSError, ValueError, RuntimeError) as exc:
            raise SpecError([SpecIssue("extends", f"not a usable path: {exc}", value=parent, rule="extends",
                                       hint="give the path of a spec file, relative to this one",
                                       file=str(path), line=lines.get("extends"))]) from None
        ref = _Ref(str(path), lines.get("extends"), parent)
        path = parent_path
    files = _chain_names([str(p) for p in seen], [d for d, _ in chain])
    data, origins = chain.pop()
    while chain:  # children over parents
        child, child_origins = chain.pop()
        child_origins.pop("extends", None)
        data, origins = deep_merge(data, child), {**origins, **child_origins}
    return data, origins, files


def _chain_names(files: list[str], tables: list[dict[str, Any]]) -> dict[str, str]:
    """:attr:`LoadedSpec.files` of an ``extends`` chain: ``files`` and their ``tables``, the
    spec itself first."""
    from dlmspec.spec.names import DEFAULT_NAME

    names: dict[str, str] = {}
    name = DEFAULT_NAME
    for file, table in zip(reversed(files), reversed(tables)):
        if isinstance(table.get("name"), str):
            name = table["name"]
        names[file] = name
    return dict(reversed(list(names.items())))


def _read_toml(path: Path, ref: _Ref | None) -> tuple[dict[str, Any], dict[str, Origin], Any, dict[str, int]]:
    """One TOML spec file: ``(data without extends, origins, the extends value or None, line map)``.

    Raises:
        SpecError: unreadable (:func:`_read_spec_text`), not TOML, nested too deep.
    """
    text = _read_spec_text(path, ref)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise SpecError(
            [SpecIssue("<toml>", f"not valid TOML: {exc}", rule="toml", file=str(path),
                       line=int(match.group(1)) if match else None,
                       hint="strings need quotes, tables are [section], keys are key = value")]
        ) from None
    except RecursionError:
        raise _nesting_error(path, text, line_map(text), None, _deep_line(text)) from None
    except ValueError:  # int() refuses more than sys.get_int_max_str_digits() digits
        raise _long_number_error(path, text) from None
    lines = line_map(text)
    deep = too_deep(data)
    if deep is not None:
        raise _nesting_error(path, text, lines, deep, None)
    origins: dict[str, Origin] = {k: (str(path), _line_of(lines, k)) for k in flatten_keys(data)}
    parent = data.pop("extends", None)
    return data, origins, parent, lines
