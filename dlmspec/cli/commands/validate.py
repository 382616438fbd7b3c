"""``dlmspec validate SPEC`` (and its hidden alias ``check``): the typer declaration; the body is
:func:`dlmspec.cli.validate.run_validate`, which :func:`dlmspec.cli.main` also runs without typer
for the plain forms (the fast path's options are generated from this declaration:
:mod:`dlmspec.cli.fast_argv_build`).
"""

from __future__ import annotations

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import _SET_HELP
from dlmspec.cli.help import Command
from dlmspec.cli.output import command_name, use_json

def validate(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    strict: bool = typer.Option(False, "--strict", help="Fail (exit 2) on warnings too."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Validate a spec: schema, cross-field rules, SLURM settings and memory per GPU.

    Every problem is reported at once with file, line, key, value, why and a value that works.
    Data, tokenizer and checkpoint paths missing on this machine are warnings (they usually live
    on the cluster). Exit code 0 when the spec is valid (warnings go to stderr), 2 when not.
    Settings the bundled runtime cannot run yet (SFT, RL, FSDP, ...) are reported
    by `dlmspec compile`.
    """
    from dlmspec.cli.validate import run_validate

    use_json(ctx, json_output)
    run_validate(spec, set_, strict=strict, json_output=json_output, command=command_name(ctx))


app.command("validate", cls=Command)(validate)


app.command("check", hidden=True, help="Alias of `dlmspec validate`.", cls=Command)(validate)
