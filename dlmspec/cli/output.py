"""What every command prints: issue tables, warnings, ``--json`` output, consoles.

Bad input never prints a traceback: a :class:`~dlmspec.errors.SpecError` is printed as a table of
issues (file:line, key, value, why, fix) on stderr (:func:`report_issues`), or as JSON on stdout
when the command was given ``--json`` (:func:`use_json`). rich is imported only to print a table.

``--json`` prints one document on stdout, the same keys on success and failure, for every
command: :func:`envelope` builds it, :func:`print_envelope` prints it (docs/architecture.md,
"JSON output").
"""

from __future__ import annotations

import re
import sys
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence, TypeVar

from dlmspec.errors import SpecIssue, display_path, json_safe, safe_repr

if TYPE_CHECKING:
    import typer
    from rich.console import Console
    from rich.table import Table

T = TypeVar("T")

_JSON_META = "dlmspec.json"
_COMMAND_META = "dlmspec.command"

#: ``schema`` and ``version`` of every ``--json`` document (:func:`envelope`). The version grows
#: when a key of the envelope changes meaning; a command's ``result`` may gain keys without it.
RESULT_SCHEMA = "dlmspec.result"
RESULT_VERSION = 1


def _text(*args: Any, **kwargs: Any) -> Any:
    """``rich.text.Text``; rich is imported only when something is printed with it (a clean
    ``dlmspec validate`` prints one plain line and never needs it)."""
    from rich.text import Text

    return Text(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# Output helpers (public: other commands print issues the same way)


def stdout() -> Console:
    """Console for results; 200 columns wide when stdout is not a terminal, so piped output
    does not wrap at 80. No emoji codes: what is printed is text (cells are
    :class:`~rich.text.Text`; titles and headers are plain words), and rich's emoji table takes
    milliseconds to import."""
    from rich.console import Console

    return Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 200)


def stderr() -> Console:
    """Console for issues and notes (as :func:`stdout`)."""
    terminal = sys.stderr.isatty()
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False, width=None if terminal else 200)


def command_name(ctx: typer.Context) -> str:
    """The words that ran the command, without ``dlmspec``: ``"validate"``, ``"data prepare"``."""
    return " ".join(ctx.command_path.split()[1:]) or ctx.info_name or ""


def use_json(ctx: typer.Context, enabled: bool) -> None:
    """Tell the error handler that the running command prints JSON, so a :class:`SpecError`
    is reported as the :func:`envelope` (``ok`` false) on stdout instead of a table.

    ``ctx`` is the command's context (declare a ``ctx: typer.Context`` parameter); its ``meta``
    is shared with the group that reports the error."""
    ctx.meta[_JSON_META] = enabled
    ctx.meta[_COMMAND_META] = command_name(ctx)


def envelope(command: str, *, ok: bool, issues: Iterable[SpecIssue] = (),
             result: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON document every ``--json`` prints (the same keys on success and failure).

    Keys, in order: ``schema`` (:data:`RESULT_SCHEMA`), ``version`` (:data:`RESULT_VERSION`),
    ``command`` (the words after ``dlmspec``, e.g. ``"convert verify"``), ``ok``, ``issues``,
    ``warnings`` (issue dicts, :meth:`SpecIssue.to_dict` with ``file`` relative to the working
    directory: what the tables print), ``result`` (the command's data; ``None`` when it failed
    before producing any, e.g. a :class:`~dlmspec.errors.SpecError`).

    ``issues`` are what made the command fail (empty when ``ok``): its errors, or, when it
    failed on warnings alone (``--strict``), every warning. ``warnings`` are the other findings.
    Non-finite floats anywhere become the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (JSON has
    no NaN or infinity; :func:`dlmspec.errors.json_safe`), so the document is always valid JSON.

    Args:
        command: the command's name (:func:`command_name`).
        ok: whether the command succeeded (its exit code is 0).
        issues: every issue found, errors and warnings in any order (split here by severity).
        result: the command's data (JSON-ready).
    """
    found = list(issues)
    errors = [i for i in found if i.severity == "error"]
    if ok or errors:
        failing, other = errors, [i for i in found if i.severity != "error"]
    else:
        failing, other = found, []
    return {"schema": RESULT_SCHEMA, "version": RESULT_VERSION, "command": command, "ok": ok,
            "issues": [_issue_dict(i) for i in failing], "warnings": [_issue_dict(i) for i in other],
            "result": json_safe(result)}


def print_envelope(command: str, *, ok: bool, issues: Iterable[SpecIssue] = (),
                   result: dict[str, Any] | None = None) -> None:
    """Print :func:`envelope` on stdout (indented JSON, one document)."""
    import json  # --json only (a table needs no JSON)

    document = json_safe(envelope(command, ok=ok, issues=issues, result=result))
    print(json.dumps(document, indent=2, allow_nan=False))


def _issue_dict(issue: SpecIssue) -> dict[str, Any]:
    data = issue.to_dict()
    data["file"] = display_path(issue.file)
    return data


#: Characters a terminal acts on instead of printing: C0 controls (ESC starts CSI and OSC
#: sequences), DEL, C1 controls (U+0080-U+009F; U+009B is a one-character CSI) and the bidi
#: overrides and isolates (U+202A-U+202E, U+2066-U+2069), which reorder what follows; and lone
#: surrogates (U+D800-U+DFFF, which JSON's ``"\\ud800"`` gives), which no encoding writes (printing
#: one raises ``UnicodeEncodeError``, drawing one fails inside a font library).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would act on (:data:`_CONTROLS`) written as its
    Python escape (``\\x1b``, ``\\u202e``), so a value from a spec (a run name, a key) cannot
    move the cursor, recolour, retitle or clear the terminal the issue is printed on;
    ``keep_newlines``: ``\\n`` stays a line break and ``\\t`` a tab (dlmspec's own messages, and
    text such as prompts and generated code, use them)."""
    def escape(match: re.Match[str]) -> str:
        ch = match.group()
        if keep_newlines and ch in "\n\t":
            return ch
        if ch in "\n\t":
            return "\\n" if ch == "\n" else "\\t"
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"

    return _CONTROLS.sub(escape, text) if isinstance(text, str) else text


def shown(value: Any, *, keep_newlines: bool = False) -> str:
    """``value`` (a string read from a file: a record, a manifest, a run's metrics, a file name)
    as it may reach the terminal: ``str(value)`` with every token-shaped secret and URL password
    replaced by ``<hidden>`` (:func:`dlmspec.credentials.redact_text`), then every character a
    terminal acts on, and every lone surrogate, written as its escape (:func:`printable`).

    The one function for file-read text on its way to a console, a plot or a message. Print the
    result as :class:`rich.text.Text` (or with ``markup=False``), so brackets print literally."""
    from dlmspec.credentials import redact_text

    text = value if isinstance(value, str) else str(value)
    return printable(redact_text(text), keep_newlines=keep_newlines)


def issues_table(issues: Iterable[SpecIssue]) -> Table:
    """The issues as a rich table: where, key, value, problem and fix. Cells are plain
    :class:`~rich.text.Text`, so brackets in user values are never read as markup."""
    from rich.table import Table

    table = Table(show_lines=False, pad_edge=False, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("where", no_wrap=True)
    table.add_column("key", overflow="fold")
    table.add_column("value", overflow="fold", max_width=30)
    table.add_column("problem", overflow="fold")
    for issue in issues:
        where = display_path(issue.file) or "<spec>"
        if issue.line:
            where = f"{where}:{issue.line}"
        label = _text(issue.severity, style="bold red" if issue.severity == "error" else "yellow")
        problem = _text(printable(issue.message, keep_newlines=True))
        if issue.hint:
            problem.append("\nfix: ", style="bold green")
            problem.append(printable(issue.hint, keep_newlines=True))
        problem.append(f"\n[{printable(issue.rule)}]", style="dim")
        value = "" if issue.value is None else safe_repr(issue.value, limit=10_000)
        table.add_row(label, _text(printable(where)), _text(printable(issue.key)), _text(printable(value)), problem)
    return table


def report_issues(issues: list[SpecIssue], *, as_json: bool = False, command: str = "",
                  result: dict[str, Any] | None = None, rules_skipped: bool = False) -> None:
    """Print ``issues`` for a failed command: the :func:`envelope` of ``command`` (``ok``
    false, ``result``: ``None`` unless given) on stdout, or a table and an ``N errors, M
    warnings`` line on stderr; ``rules_skipped`` (:class:`~dlmspec.errors.SpecError`'s) adds to
    that line that the cross-field checks run once the schema errors are fixed."""
    if as_json:
        print_envelope(command, ok=False, issues=issues, result=result)
        return
    console = stderr()
    console.print(issues_table(issues))
    errors = sum(1 for i in issues if i.severity == "error")
    later = " (the cross-field rules, layout and memory checks run once the schema errors are fixed)" if rules_skipped else ""
    if not errors and issues:  # a command fails on warnings alone only under --strict
        later += ": --strict fails on warnings (without it this spec passes)"
    console.print(_text(f"{_plural(errors, 'error')}, {_plural(len(issues) - errors, 'warning')}{later}", style="bold"))


def report_warnings(warnings: list[SpecIssue]) -> None:
    """Print the warnings of a command that succeeded (on stderr, so stdout stays clean)."""
    if warnings:
        console = stderr()
        console.print(issues_table(warnings))
        console.print(_text(_plural(len(warnings), "warning"), style="bold yellow"))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def human_count(n: int | float) -> str:
    """``152712960 -> '152.7M'`` (powers of 1000: K, M, B, T)."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def progress(items: Sequence[T], description: str, *, after: float = 1.0) -> Iterator[T]:
    """Yield ``items``; when stderr is a terminal and they have taken more than ``after``
    seconds, show a rich progress bar (``description``, done/total, time left) on stderr until
    the last one is done. The bar is transient (gone when done) and lines printed meanwhile
    appear above it; piped or redirected runs never see it."""
    import time

    total = len(items)
    if total < 2 or not sys.stderr.isatty():
        yield from items
        return
    start = time.monotonic()
    bar = None
    task = None
    try:
        for done, item in enumerate(items):
            if bar is None and time.monotonic() - start > after:
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

                bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                               TimeRemainingColumn(), console=stderr(), transient=True)
                bar.start()
                task = bar.add_task(printable(description), total=total, completed=done)
            yield item
            if bar is not None:
                bar.advance(task)  # type: ignore[arg-type]
    finally:
        if bar is not None:
            bar.stop()
