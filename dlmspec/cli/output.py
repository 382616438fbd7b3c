"""What every command prints: issue tables, warnings, ``--json`` output, consoles.

Bad input never prints a traceback: a :class:`~dlmspec.errors.SpecError` is printed as a table of
issues (file:line, key, value, why, fix) on stderr (:func:`report_issues`), or as JSON on stdout
when the command was given ``--json`` (:func:`use_json`). rich is imported only to print a table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from dlmspec.errors import SpecIssue

if TYPE_CHECKING:
    import typer
    from rich.console import Console
    from rich.table import Table

_JSON_META = "dlmspec.json"


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


def use_json(ctx: typer.Context, enabled: bool) -> None:
    """Tell the error handler that the running command prints JSON, so a :class:`SpecError`
    is reported as ``{"ok": false, "issues": [...]}`` on stdout instead of a table.

    ``ctx`` is the command's context (declare a ``ctx: typer.Context`` parameter); its ``meta``
    is shared with the group that reports the error."""
    ctx.meta[_JSON_META] = enabled


def display_path(path: str | None) -> str | None:
    """``path`` relative to the working directory when it lies under it (shorter messages)."""
    if not path or path.startswith(("<", "--")):
        return path
    try:
        return os.path.relpath(path) if Path(path).is_absolute() and Path(path).resolve().is_relative_to(Path.cwd()) else path
    except (OSError, ValueError):
        return path


def _issue_dict(issue: SpecIssue) -> dict[str, Any]:
    data = issue.to_dict()
    data["file"] = display_path(issue.file)
    return data


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
        problem = _text(issue.message)
        if issue.hint:
            problem.append("\nfix: ", style="bold green")
            problem.append(issue.hint)
        problem.append(f"\n[{issue.rule}]", style="dim")
        table.add_row(label, _text(where), _text(issue.key), _text("" if issue.value is None else repr(issue.value)), problem)
    return table


def report_issues(issues: list[SpecIssue], *, as_json: bool = False) -> None:
    """Print ``issues`` for a failed command: JSON (``{"ok": false, "issues": [...]}``) on
    stdout, or a table and an ``N errors, M warnings`` line on stderr."""
    if as_json:
        import json  # --json only (a table needs no JSON)

        print(json.dumps({"ok": False, "issues": [_issue_dict(i) for i in issues]}, indent=2))
        return
    console = stderr()
    console.print(issues_table(issues))
    errors = sum(1 for i in issues if i.severity == "error")
    console.print(_text(f"{_plural(errors, 'error')}, {_plural(len(issues) - errors, 'warning')}", style="bold"))


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
