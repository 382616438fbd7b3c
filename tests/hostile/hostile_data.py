"""Hostile building blocks shared by the corpus (:mod:`hostile_corpus`): the payloads each hostile class
plants, written once here so every surface gets the same ones.

Classes (:data:`CLASSES`): ``nesting`` (100,000 brackets), ``fifo`` (a named pipe where a file is
read), ``device`` (a link to ``/dev/zero`` or ``/dev/urandom``), ``symlink`` (a link planted at an
output or temporary name, pointing at a victim file that must stay unchanged), ``huge`` (sparse
files of GiBs, zip-bomb style ``.gz`` / ``.zst`` streams), ``numbers`` (NaN, Infinity, 1e999,
integers of 5,000 digits), ``surrogate`` (lone UTF-16 surrogates, escaped and raw),
``non-utf8`` (bytes that are no UTF-8), ``pickle`` (a pickle whose payload writes the canary
file), ``template`` (Jinja templates that escape the sandbox, loop or blow up), ``escape``
(terminal escape sequences), ``secret`` (token-shaped secrets) and ``code`` (``auto_map`` custom
code, Python specs with hostile objects: the canary tells whether it ran).
"""

from __future__ import annotations

import gzip
import os
import pickle
import random
import string
import zlib
from pathlib import Path

CLASSES = ("nesting", "fifo", "device", "symlink", "huge", "numbers", "surrogate", "non-utf8", "pickle",
           "template", "escape", "secret", "code")

#: File the hostile payloads create (relative to the case folder, the commands' working directory).
CANARY = "CANARY"
#: The file every planted link points at: it must be byte-for-byte unchanged after the case.
VICTIM = "victim/victim.txt"
VICTIM_TEXT = "the victim file: no command may change this\n"

DEPTH = 100_000
NESTED_ARRAY = "[" * DEPTH + "]" * DEPTH
NESTED_OBJECT = '{"a":' * DEPTH + "1" + "}" * DEPTH
#: A terminal escape: set the window title, clear the screen, red text, then an OSC 8 link.
ESCAPE = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mRED\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\"
#: The escapes of :data:`ESCAPE` that fit in a file name (no ``/``).
ESCAPE_NAME = "\x1b]0;PWNED\x07\x1b[2J\x1b[31mds"
#: What must never reach the output raw (the ESC of the sequences above).
ESCAPE_MARKERS = ("\x1b]0;PWNED", "\x1b[2J")
#: Bytes that are no UTF-8 (a lone continuation byte, an overlong encoding, 0xFF).
NON_UTF8 = b"\x80\xc0\xaf\xff\xfe"
#: A lone surrogate as raw (CESU-style) bytes; JSON's escaped form is ``LONE_SURROGATE_JSON``.
RAW_SURROGATE = b"\xed\xa0\x80"
LONE_SURROGATE_JSON = "\\ud800"
HUGE_INT = "9" * 5000  # past Python's int/str conversion limit (4300 digits)


def secret_token(rng: random.Random) -> str:
    """A Hugging Face-shaped token (``hf_`` + 34 letters and digits), drawn from ``rng``."""
    return "hf_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(34))


def github_token(rng: random.Random) -> str:
    """A GitHub-shaped personal access token (``ghp_`` + 36 letters and digits)."""
    return "ghp_" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(36))


def canary_code() -> str:
    """Python that creates the canary file in the working directory (the case folder)."""
    return f"open({CANARY!r}, 'w').write('code ran')"


class _Payload:
    """Unpickles into a call of ``exec`` with :func:`canary_code`."""

    def __reduce__(self):
        import builtins

        return (builtins.exec, (canary_code(),))


def hostile_pickle() -> bytes:
    """A pickle that, loaded with :func:`pickle.load`, runs :func:`canary_code`."""
    return pickle.dumps(_Payload(), protocol=2)


def plant_victim(case: Path) -> Path:
    """Write the victim file of ``case``; returns its path."""
    path = case / VICTIM
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(VICTIM_TEXT)
    return path


def plant_link(case: Path, at: str | os.PathLike[str], target: str | None = None) -> None:
    """A symbolic link at ``case/at`` pointing at the victim (or ``target``)."""
    link = case / at
    link.parent.mkdir(parents=True, exist_ok=True)
    if target is None:
        target = str(plant_victim(case))
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(target, link)


def plant_fifo(case: Path, at: str) -> None:
    path = case / at
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    os.mkfifo(path)


def plant_device(case: Path, at: str, device: str = "/dev/zero") -> None:
    plant_link(case, at, device)


def plant_sparse(case: Path, at: str, size: int = 8 << 30) -> None:
    """A sparse file of ``size`` bytes (zeros, no disk used)."""
    path = case / at
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


_CHUNK = 1 << 20


def gzip_bomb(line: bytes = b" ", total: int = 4 << 30) -> bytes:
    """A ``.gz`` stream of ``total`` bytes of ``line`` repeated (no newline unless ``line`` holds
    one): concatenated gzip members of 1 MiB each, ~1 KiB compressed apiece."""
    chunk = (line * (_CHUNK // len(line) + 1))[:_CHUNK]
    member = gzip.compress(chunk, compresslevel=9, mtime=0)
    return member * (total // _CHUNK)


def zstd_bomb(line: bytes = b" ", total: int = 4 << 30) -> bytes:
    """A ``.zst`` stream as :func:`gzip_bomb` (concatenated frames); without the ``zstandard``
    library a stream of one raw-literal frame is not possible, so it needs it."""
    import zstandard

    chunk = (line * (_CHUNK // len(line) + 1))[:_CHUNK]
    frame = zstandard.ZstdCompressor(level=19).compress(chunk)
    return frame * (total // _CHUNK)


def deflate_ratio() -> float:
    """Compression ratio of the bombs' chunk (for the docs: ~1000x)."""
    return _CHUNK / len(zlib.compress(b" " * _CHUNK, 9))
