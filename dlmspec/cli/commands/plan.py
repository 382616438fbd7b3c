"""``dlmspec plan SPEC``: the typer declaration; the body is :func:`dlmspec.cli.plan.run_plan`, which
:func:`dlmspec.cli.main` also runs without typer for the plain forms.
"""

from __future__ import annotations

from typing import Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import _SET_HELP
from dlmspec.cli.help import Command
from dlmspec.cli.output import use_json

@app.command("plan", cls=Command)
def plan_command(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the plan (or search) as JSON on stdout."),
    search: bool = typer.Option(False, "--search", help="Rank the parallel layouts that fit, fastest first."),
    top: Optional[int] = typer.Option(None, "--top", help="Layouts to rank, fastest first (default 5). --top N "
                                      "implies --search: ranking layouts is what --search does, so the number is "
                                      "never silently ignored."),
) -> None:
    """Per-GPU memory, step time and MFU of a spec; --search finds layouts that fit.

    Exit code 2 when the spec has an error, when its peak memory exceeds the GPU (the plan and
    what would make it fit are printed), or when --search finds no layout.
    """
    from dlmspec.cli.plan import run_plan

    use_json(ctx, json_output)
    code = run_plan(spec, set_, json_output, search, top)
    if code:
        raise typer.Exit(code)
