"""How a spec string is written into each kind of generated file: one function per target.

Every string from a spec (or the command line) reaches ``train.py``, ``launch.sh``,
``launch.sbatch``, ``spec.lock.toml`` and ``plan.json`` through one of these, so no value can
end a literal, a comment, a docstring, a shell word or an ``#SBATCH`` line early:

* a Python literal: :func:`py_literal` (``ast.literal_eval`` gives the value back);
* text inside a Python docstring: :func:`py_docstring` (the docstring reads as the text);
* text of a ``#`` comment (Python or bash): :func:`comment` (one line, printable characters);
* a bash word: :func:`shell_word` (one word that expands to the value);
* an ``#SBATCH`` value: :func:`sbatch_value` (one argument sbatch reads as the value);
* a TOML document: :func:`toml_document` (``tomllib.loads`` gives the data back).

JSON (``plan.json``) is written by ``json.dumps``, which escapes every string. A value that
cannot be written for its target (NUL in a shell word, a control character in an ``#SBATCH``
line) raises :class:`ValueError` here; the validator refuses such values first, naming the key
(rule ``string-characters`` of :mod:`dlmspec.check.strings`, the ``slurm`` rules of :mod:`dlmspec.check.slurm`).

It sits below the pipeline (beside :mod:`dlmspec.files` and :mod:`dlmspec.errors`), not in
:mod:`dlmspec.render`: the ``slurm`` rules of :mod:`dlmspec.check` and the CLI use it as well as the
renderer, and a check never imports a later pipeline stage (docs/architecture.md, "Layers").
Nothing here imports torch or megatron.
"""

from __future__ import annotations

import math
import re
import shlex
from typing import Any

import tomli_w

#: Characters an ``#SBATCH`` value may hold without quotes.
_SBATCH_BARE = re.compile(r"[A-Za-z0-9_.,:@%+=/\-\[\]]+")


def _escape_unprintable(ch: str) -> str:
    """``ch`` as a Python/bash-style backslash escape (``\\n``, ``\\x00``, ``\\u2028``, ...)."""
    return ch.encode("unicode_escape", "backslashreplace").decode("ascii")


def py_literal(value: Any) -> str:
    """Python source for ``value`` (None, bool, int, finite float, str, list, tuple, dict with
    sorted keys). Strings go through ``repr``, so no spec value can break out of the literal,
    and the result is one line of printable characters (``repr`` escapes the others), so it can
    also be shown in a ``#`` comment.

    Raises:
        ValueError: a non-finite float or an unsupported type.
    """
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot render non-finite float {value!r}")
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(py_literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in items) + "}"
    raise ValueError(f"cannot render {type(value).__name__} as a Python literal")


def py_docstring(value: Any) -> str:
    """``str(value)`` as text inside a (non-raw) ``\"\"\"`` docstring that reads as exactly that
    text: backslashes and double quotes escaped (so ``\"\"\"`` cannot close the docstring), every
    non-printable character (line breaks included) as an escape, so the text stays on its line.
    Plain text is unchanged."""
    out = []
    for ch in str(value):
        if ch in '\\"':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(_escape_unprintable(ch))
    return "".join(out)


def comment(value: Any) -> str:
    """``str(value)`` as text that cannot leave a one-line ``#`` comment of Python or bash:
    every non-printable character (``\\n``, ``\\r``, NUL, U+2028, U+0085, ...) is written as
    its escape. Plain text is unchanged."""
    return "".join(ch if ch.isprintable() else _escape_unprintable(ch) for ch in str(value))


def shell_word(value: str) -> str:
    """``value`` as one bash word that expands to exactly ``value``: ``shlex.quote(value)``;
    single quotes also around a bare word holding a comma (shellcheck's SC2054 reads ``a,b`` in
    an array as a mistaken separator); and bash's ``$'...'`` when the value holds ``$`` or a
    backtick (literal there too, and shellcheck's SC2016 does not mistake it for an expansion
    meant to happen) or a control character, written as ``\\xHH`` escapes (UTF-8 bytes, so no
    locale is involved), so no value puts a line break (or a line of its own) into the script.

    Raises:
        ValueError: the value holds NUL, which no shell word (and no environment) can carry, or
            a lone surrogate, which is not a character (no UTF-8 for it).
    """
    if "\x00" in value:
        raise ValueError("NUL cannot be passed through a shell")
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        raise ValueError("a lone surrogate is not a character and cannot be written as UTF-8")
    if "$" in value or "`" in value or any(not ch.isprintable() for ch in value):
        out = []
        for ch in value:
            if ch in "\\'":
                out.append("\\" + ch)
            elif ch.isprintable():
                out.append(ch)
            else:
                out.extend(f"\\x{byte:02x}" for byte in ch.encode("utf-8"))
        return "$'" + "".join(out) + "'"
    quoted = shlex.quote(value)
    if quoted == value and "," in value:
        return f"'{value}'"
    return quoted


def sbatch_value(value: str) -> str:
    """``value`` as one argument of an ``#SBATCH`` line.

    sbatch (not a shell) reads ``#SBATCH`` lines: it splits at unquoted whitespace, honours
    single and double quotes and backslash escapes, and ends the line at an unquoted ``#``
    (src/sbatch/opt.c ``_get_argument``). A value of plain characters is written as is; any
    other is written in double quotes with ``\\`` and ``"`` escaped, so spaces, quotes, ``#``,
    ``$(...)`` and backticks arrive literally (sbatch expands nothing).

    Raises:
        ValueError: the value is empty or holds a control character (a newline would end the
            line, and what followed would be a line of the shell script).
    """
    if value == "":
        raise ValueError("empty value")
    if any(not ch.isprintable() for ch in value):
        raise ValueError("control characters (newline, tab, ...) cannot be written in an #SBATCH line")
    if _SBATCH_BARE.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_document(data: dict[str, Any]) -> str:
    """``data`` as a TOML document (``tomli_w.dumps``: every string a basic string with its
    control characters escaped, keys quoted where they need it). tomli_w leaves DEL, the C1
    controls (U+009B is a one-character CSI) and the bidi overrides as they are; they can only
    stand inside a basic string or a quoted key, where ``\\uXXXX`` means the same character, so
    they are written that way (a ``cat`` of the file or ``dlmspec show`` cannot drive the terminal)."""
    return _TERMINAL_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", tomli_w.dumps(data))


_TERMINAL_CONTROLS = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


__all__ = ["comment", "py_docstring", "py_literal", "sbatch_value", "shell_word", "toml_document"]
