"""Spec problems: one record per problem, reported all at once.

A :class:`SpecIssue` names where the problem is (file, line, dotted key), the value the user
wrote, why it is wrong and a value that works. :class:`SpecError` carries every error found
in one pass, so a user fixes a spec in one edit instead of one problem per run. The CLI turns
a ``SpecError`` into a table and exit code 2; nothing here prints.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dlmspec.credentials import redact, redact_text

Severity = Literal["error", "warning"]

#: Exit code of every command when the spec (or another user input) is wrong.
EXIT_USAGE = 2

#: Exit code of a training process that saved a checkpoint on SIGUSR1/SIGTERM and stopped so the
#: job can be requeued (the runtime, ``dlmspec.backends.megatron.training`` and
#: ``dlmspec.backends.launch.check``, exits with it; launch.sbatch requeues a job whose ``srun``
#: ends with it). 85 is outside the shell's 126-165 range and the codes Python and torchrun use
#: for crashes.
REQUEUE_EXIT_CODE = 85


#: What a terminal acts on beyond the C0 controls json escapes: DEL, C1 (U+009B is a one-character
#: CSI) and the bidi overrides and isolates.
_TERMINAL_CONTROLS = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def toml_text(value: Any) -> str:
    """``value`` as a TOML value, as a spec (and ``--set``) writes it: ``true``, ``4``, ``0.0003``,
    ``"text"``, ``[0, 1]``, ``{ a = 1 }``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return non_finite_text(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):  # C0 controls are escaped by json; DEL, C1 and bidi controls here
        return _TERMINAL_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_text(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {toml_text(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    return json.dumps(str(value))


def display_path(path: str | None) -> str | None:
    """``path`` relative to the working directory when it lies under it (shorter messages)."""
    if not path or path.startswith(("<", "--")):
        return path
    try:
        return os.path.relpath(path) if Path(path).is_absolute() and Path(path).resolve().is_relative_to(Path.cwd()) else path
    except (OSError, ValueError):
        return path


@dataclass(frozen=True)
class Fix:
    """A change of spec keys that makes an issue pass: machine-applicable, so tools (and the
    tests that apply every rule's fix to its failing example) can apply it.

    Attributes:
        set: dotted key -> the value to write there (a table is created where it is missing).
        unset: dotted keys to remove from the spec (their defaults apply).
    """

    set: dict[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()

    def text(self) -> str:
        """The fix in words, as hints write it: ``remove a.b and set c.d = 4 and e = "x"``."""
        parts = []
        if self.unset:
            parts.append("remove " + " and ".join(self.unset))
        if self.set:
            parts.append("set " + " and ".join(f"{k} = {toml_text(v)}" for k, v in self.set.items()))
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``{"set": {key: value}, "unset": [key, ...]}``."""
        return {"set": {k: _jsonable(v) for k, v in self.set.items()}, "unset": list(self.unset)}


@dataclass
class SpecIssue:
    """One problem with a spec.

    Attributes:
        key: dotted path of the offending key, e.g. ``"parallel.tensor_model_parallel_size"``.
        message: why the value is wrong, in one sentence.
        value: the value as written (or resolved), ``None`` when the key is missing.
        hint: a value or change that works, e.g. ``"use one of 1, 2, 4, 8"``.
        severity: ``"error"`` fails validation; ``"warning"`` is legal but probably unintended.
        rule: short id of the rule (``"tp-divides-heads"``), stable for tests and ``--json``.
        source: what the rule mirrors (a megatron-core module and function, or a reason).
        file: the spec file the key was read from, when known.
        line: 1-based line of the key in ``file``, when known.
        fix: the keys to set or remove that make the issue pass (a :class:`Fix`), when the fix is
            a change of spec keys; None when it is not (a missing file, a shell setting) or not
            known. ``hint`` says the same in words.

    No issue holds a secret: a value that is one (or the value of a secret-named environment
    variable) becomes ``"<hidden>"`` and secrets inside the key, message and hint are replaced
    by ``<hidden>`` when the issue is made (:mod:`dlmspec.credentials`), so no report prints one
    (the keys and values of ``fix`` too).
    """

    key: str
    message: str
    value: Any = None
    hint: str | None = None
    severity: Severity = "error"
    rule: str = "schema"
    source: str | None = None
    file: str | None = None
    line: int | None = None
    fix: Fix | None = None

    def __post_init__(self) -> None:
        self.value = redact(self.value, self.key)
        self.key = redact_text(self.key)
        self.message = redact_text(self.message)
        if self.hint is not None:
            self.hint = redact_text(self.hint)
        if self.fix is not None:
            self.fix = Fix({redact_text(k): redact(v, k) for k, v in self.fix.set.items()},
                           tuple(redact_text(k) for k in self.fix.unset))

    def where(self) -> str:
        """``file:line`` (or just ``file``, or ``<spec>``) for messages."""
        if self.file and self.line:
            return f"{self.file}:{self.line}"
        return self.file or "<spec>"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form used by ``--json``."""
        return {
            "severity": self.severity,
            "rule": self.rule,
            "key": self.key,
            "value": _jsonable(self.value),
            "message": self.message,
            "hint": self.hint,
            "source": self.source,
            "file": self.file,
            "line": self.line,
            "fix": self.fix.to_dict() if self.fix is not None else None,
        }

    def __str__(self) -> str:
        text = f"{self.where()}: {self.severity}: {self.key}"
        if self.value is not None:
            text += f" = {self.value!r}"
        text += f": {self.message}"
        if self.hint:
            text += f" Fix: {self.hint}"
        return text


def non_finite_text(value: float) -> str:
    """A non-finite float as TOML (and a spec) writes it: ``"nan"``, ``"inf"``, ``"-inf"``."""
    return "nan" if value != value else ("inf" if value > 0 else "-inf")


def json_safe(value: Any) -> Any:
    """``value`` (dicts, lists, tuples, scalars) as data ``json.dumps(..., allow_nan=False)``
    always writes: a non-finite float becomes its TOML text (:func:`non_finite_text`; JSON has
    no NaN or infinity, and ``NaN``/``Infinity`` break strict parsers), a dict key a string, an
    integer longer than Python prints (4300 digits) a string saying so, anything else
    (a path, an object) its ``repr`` (:func:`safe_repr`, which never raises)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else non_finite_text(value)
    if isinstance(value, int):
        return value if printable_int(value) else _long_int_text(value)
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else str(json_safe(k))): json_safe(v) for k, v in value.items()}
    return safe_repr(value)


def printable_int(value: int) -> bool:
    """Whether ``str(value)`` works: Python refuses integers of more than
    ``sys.get_int_max_str_digits()`` (4300) digits."""
    import sys

    limit = sys.get_int_max_str_digits()
    return limit == 0 or value.bit_length() < limit * 3.3  # 4300 digits need about 14,284 bits


def _long_int_text(value: int) -> str:
    return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"


def safe_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; never raises: an object whose ``__repr__``
    raises (or an integer longer than Python prints) gets a stand-in naming its type."""
    if isinstance(value, int) and not isinstance(value, bool) and not printable_int(value):
        return _long_int_text(value)
    try:
        text = repr(value)
    except Exception:  # a user's object may raise anything from __repr__
        try:
            name = type(value).__name__
        except Exception:
            name = "object"
        return f"<unprintable {name}>"
    if not isinstance(text, str):
        return "<unprintable>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


_jsonable = json_safe


@dataclass
class SpecError(Exception):
    """A spec that cannot be used; ``issues`` holds every error (and the warnings) found.

    Raised by :mod:`dlmspec.spec.load` (syntax, unknown keys, wrong types) and by
    the rules of :mod:`dlmspec.check` (through the commands that refuse on them).

    ``partial``: for schema errors only, the spec loaded without the offending keys (a
    :class:`dlmspec.spec.load.LoadedSpec`, or None when that does not load either), and ``dropped``
    those keys, so the cross-field rules can be reported in the same run
    (:func:`dlmspec.check.with_rule_issues`); ``rules_skipped``: set there when they could not run
    (no partial spec, or one that does not resolve), so the report can say they come later.
    """

    issues: list[SpecIssue] = field(default_factory=list)
    partial: Any = field(default=None, compare=False, repr=False)
    dropped: tuple[str, ...] = field(default=(), compare=False, repr=False)
    rules_skipped: bool = field(default=False, compare=False, repr=False)

    @property
    def errors(self) -> list[SpecIssue]:
        return [i for i in self.issues if i.severity == "error"]

    def __str__(self) -> str:
        return "\n".join(str(i) for i in self.issues)
