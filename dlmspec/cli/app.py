"""The typer app of ``dlmspec`` and its group: a :class:`SpecError` from any command becomes the
issue report and exit code 2. No command is declared here: :mod:`dlmspec.cli.commands` registers
them on :data:`app` when imported; ``data`` and ``convert`` are sub-apps imported on first use.

The help habits every command shares are :mod:`dlmspec.cli.help`'s.
"""

from __future__ import annotations

from typing import Any, Callable

import typer

from dlmspec import __version__
from dlmspec.cli.help import CONTEXT_SETTINGS, MARKUP_MODE, Group
from dlmspec.cli.output import _COMMAND_META, _JSON_META, report_issues
from dlmspec.errors import EXIT_USAGE, SpecError


def _data_app() -> typer.Typer:
    # lazy: dlmspec.data.cli loads multiprocessing and the tokenizer factory
    from dlmspec.data.cli import app as data_app

    return data_app


def _convert_app() -> typer.Typer:
    # lazy: only `dlmspec convert` needs the conversion commands
    from dlmspec.cli.convert import app as convert_app

    return convert_app


#: Sub-apps imported when the command runs or help lists it, so other commands do not pay for the
#: import: name -> (function returning the typer sub-app, help).
_LAZY_GROUPS: dict[str, tuple[Callable[[], typer.Typer], str]] = {
    "data": (_data_app, "Data tools: `dlmspec data prepare` (JSONL or a Hugging Face dataset to Megatron indexed datasets), `dlmspec data inspect`."),
    "convert": (_convert_app, "Hugging Face <-> megatron-core checkpoints: hf-to-mcore, mcore-to-hf, verify."),
}


def _generate_commands() -> typer.Typer:
    # lazy: only `dlmspec generate` / `eval` need them (they import torch inside the commands)
    from dlmspec.cli.generate import app as generate_app

    return generate_app


#: Top-level commands of a sub-app imported on first use: name -> function returning the sub-app.
_LAZY_COMMANDS: dict[str, Callable[[], typer.Typer]] = {"generate": _generate_commands, "eval": _generate_commands}


class _Group(Group):
    """Runs the command; turns a :class:`SpecError` from any command into the issue report and
    exit code 2. Sub-apps in :data:`_LAZY_GROUPS` are imported on first use."""

    #: Set while this group prints its own help: the lazy sub-apps are then listed by name and help
    #: text (:data:`_LAZY_GROUPS`) without importing them (``dlmspec --help`` would otherwise pay
    #: for ``dlmspec.data.cli`` and the conversion commands).
    _listing_help = False

    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = super().list_commands(ctx)
        return names + [n for n in (*_LAZY_GROUPS, *_LAZY_COMMANDS) if n not in names]

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        self._listing_help = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing_help = False

    def get_command(self, ctx: typer.Context, name: str) -> Any:
        if self._listing_help and name in _LAZY_GROUPS and name not in self.commands:
            return Group(name=name, help=_LAZY_GROUPS[name][1])  # a listing only, never run
        if name in _LAZY_GROUPS and name not in self.commands:
            sub_app, help_text = _LAZY_GROUPS[name]
            command = typer.main.get_command(sub_app())
            command.name, command.help = name, help_text
            self.add_command(command, name)
        if name in _LAZY_COMMANDS and name not in self.commands:
            self.add_command(typer.main.get_command(_LAZY_COMMANDS[name]()).commands[name], name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SpecError as exc:
            report_issues(exc.issues, as_json=bool(ctx.meta.get(_JSON_META)), command=ctx.meta.get(_COMMAND_META, ""),
                          rules_skipped=exc.rules_skipped)
            raise typer.Exit(EXIT_USAGE) from None


app = typer.Typer(
    cls=_Group,
    name="dlmspec",
    help="Declarative config-compiler for training diffusion (and autoregressive) LMs on megatron-core.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=MARKUP_MODE,
    context_settings=CONTEXT_SETTINGS,
)


def _version(value: bool) -> None:
    if value:
        print(f"dlmspec {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Declarative config-compiler for training diffusion (and autoregressive) LMs on megatron-core."""
