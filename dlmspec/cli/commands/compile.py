"""``dlmspec compile SPEC -o DIR``: validate, resolve and render the run folder (one per member of a
Python sweep).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import _PYTHON_HELP, _SET_HELP
from dlmspec.cli.help import Command
from dlmspec.cli.output import _text, print_envelope, progress, report_warnings, stdout, use_json
from dlmspec.errors import SpecError, SpecIssue

@app.command("compile", cls=Command)
def compile_command(
    ctx: typer.Context,
    spec: str = typer.Argument(..., help="Spec file (.toml or .py)."),
    output: str = typer.Option(..., "--output", "-o", help="Directory for train.py, launch.sh, launch.sbatch, "
                               "spec.lock.toml and plan.json (created if missing)."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty directory: replace the files "
                               "dlmspec generates, keep the others."),
    python: Optional[str] = typer.Option(None, "--python", help=_PYTHON_HELP),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Compile a spec into a directory that runs it.

    The spec is checked first (as by `dlmspec validate`, plus what the runtime cannot run yet);
    nothing is written when it has an error.
    The same spec always gives the same bytes.
    """
    from dlmspec.render.compile import compile_spec, launch_interpreter

    use_json(ctx, json_output)
    from dlmspec.spec.python_load import sweep_targets

    members = sweep_targets(spec, set_)
    if len(members) > 1:
        _compile_sweep(members, output, set_, force=force, python=python, json_output=json_output)
        return
    result = compile_spec(spec, output, overrides=set_, force=force, python=python)
    if json_output:
        print_envelope("compile", ok=True, issues=result.warnings,
                       result={"name": result.resolved.spec.name, "content_hash": result.content_hash,
                               "output": output, "files": [p.name for p in result.files],
                               "python": launch_interpreter(python), "launch": str(Path(output) / "launch.sh")})
        return
    report_warnings(result.warnings)
    names = ", ".join(p.name for p in result.files)
    stdout().print(_text(f"compiled {result.resolved.spec.name} ({result.content_hash[:19]}) into {output}: {names}"))
    launch = Path(output) / "launch.sh"
    stdout().print(_text(f"run it from the directory the spec's relative paths refer to: bash {launch}"))
    if python is None:
        stdout().print(_text("it runs $DLMSPEC_PYTHON, else python3: compile with --python PATH to name the "
                             "interpreter that has torch and megatron-core"))


def _compile_sweep(members: list[str], output: str, overrides: list[str], *, force: bool, python: str | None,
                   json_output: bool) -> None:
    """``dlmspec compile SWEEP.py -o DIR``: each member into ``DIR/<name>``, in the sweep's order.
    Every member is checked first; nothing is written when one has an error (all are reported).

    Raises:
        SpecError: the members' errors, or an unusable output directory.
    """
    from dlmspec.check import load_for
    from dlmspec.cli.validate import member_issues
    from dlmspec.render.compile import compile_spec

    failed: list[SpecIssue] = []
    for target in progress(members, f"checking {len(members)} members"):
        try:
            _, _, issues = load_for("compile", target, overrides)
        except SpecError as exc:
            issues = exc.issues
        if any(i.severity == "error" for i in issues):
            failed.extend(member_issues(target, issues))
    if failed:
        raise SpecError(failed)
    results = []
    for target in members:
        name = target.rpartition("::")[2]
        results.append(compile_spec(target, Path(output) / name, overrides=overrides, force=force, python=python))
    if json_output:
        print_envelope("compile", ok=True, issues=[w for r in results for w in r.warnings],
                       result={"sweep": [{"name": r.resolved.spec.name, "content_hash": r.content_hash,
                                          "output": str(r.out_dir), "files": [p.name for p in r.files]}
                                         for r in results]})
        return
    for r in results:
        report_warnings(r.warnings)
        stdout().print(_text(f"compiled {r.resolved.spec.name} ({r.content_hash[:19]}) into {r.out_dir}"))
