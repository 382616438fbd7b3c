"""How every command's help looks, shared by the app and its sub-apps.

- ``-h`` is ``--help`` (:data:`CONTEXT_SETTINGS` on the root app; click passes it on to every
  sub-context, so sub-apps and commands need nothing).
- Flags show no type (:class:`Command`, :class:`Group`): declare commands with
  ``@app.command(cls=Command)`` and sub-apps with ``typer.Typer(cls=Group)``.
- Help text is markdown (:data:`MARKUP_MODE`, on every app), so hard-wrapped docstrings reflow to
  the terminal's width; write ``<...>`` only inside backticks (markdown reads it as a tag).

``tests/unit/cli/test_help.py`` renders every command's help at 80 and 200 columns and checks all of it.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

#: ``-h`` works as ``--help`` on every command and group.
CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

#: typer's markup for help text: single line breaks inside a paragraph are joined, paragraphs
#: reflow to the terminal (typer's "rich" mode keeps a docstring's line breaks).
MARKUP_MODE = "markdown"


def usage_piece(piece: str) -> str:
    """A usage-line piece as the user reads it: ``{output}`` -> ``OUTPUT``, ``{targets}...`` ->
    ``TARGETS...``, ``[name]`` -> ``[NAME]``; anything else (``[OPTIONS]``, ``COMMAND [ARGS]...``)
    as it is."""
    import re

    match = re.fullmatch(r"([{\[])([a-z_][a-z0-9_-]*)([}\]])(\.\.\.)?", piece)
    if match is None:
        return piece
    opening, name, _, more = match.groups()
    name = name.upper()
    return (name if opening == "{" else f"[{name}]") + (more or "")


class _QuietFlags:
    """Help without a type for flags: typer's rich help labels every option with its type, so a
    flag read ``--force <bool>`` although it takes no value. A flag's metavar is set empty."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:
        """The usage line's pieces with each argument in capitals (``OUTPUT``, ``[NAME]``,
        ``TARGETS...``): typer writes a required one in braces (``{output}``), which reads as a
        placeholder left unformatted."""
        return [usage_piece(piece) for piece in super().collect_usage_pieces(ctx)]  # type: ignore[misc]


class Command(_QuietFlags, TyperCommand):
    """The class of every ``dlmspec`` command (``@app.command(cls=Command)``)."""


class Group(_QuietFlags, TyperGroup):
    """The class of every ``dlmspec`` group (``typer.Typer(cls=Group)``)."""
