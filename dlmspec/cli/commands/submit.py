"""``dlmspec submit``: compile and submit a spec (or a sweep, or a chain of stages) to SLURM; the body
is :mod:`dlmspec.cli.submit`.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from dlmspec.cli.app import app
from dlmspec.cli.commands.common import _PYTHON_HELP, _SET_HELP
from dlmspec.cli.help import Command
from dlmspec.cli.output import print_envelope, use_json

@app.command("submit", cls=Command)
def submit_command(
    ctx: typer.Context,
    targets: list[str] = typer.Argument(..., help="Spec files or compiled directories, in order; each "
                                        "starts after the previous one succeeds (--dependency=afterok); a "
                                        "Python sweep's members run side by side."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Where to compile a spec (several specs: "
                                         "one subdirectory each, by file name). Default: compiled/NAME, NAME the spec file's name "
                                         "without its suffix."),
    set_: list[str] = typer.Option([], "--set", "-s", help=_SET_HELP),
    force: bool = typer.Option(False, "--force", help="Replace the generated files of a directory that holds "
                               "another compile."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the commands (as bash) and do nothing."),
    check: Optional[str] = typer.Option(None, "--check", help="CPU check run instead of training: env "
                                        "(rendezvous, ranks, environment; JSON report) or train (simulated "
                                        "preemptible job). Sets DLMSPEC_CHECK_MODE."),
    sbatch_arg: list[str] = typer.Option([], "--sbatch-arg", help="Extra sbatch option, e.g. "
                                         "--sbatch-arg=--hold (repeatable)."),
    python: Optional[str] = typer.Option(None, "--python", help=_PYTHON_HELP + " For spec files only."),
    after: Optional[str] = typer.Option(None, "--after", help="Job id the first job (each member of "
                                        "a sweep) waits for (--dependency=afterok:JOBID): continue a chain "
                                        "submitted before."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout (the jobs, or "
                                     "with --dry-run the script); progress lines go to stderr."),
) -> None:
    """Submit specs (compiled first) or compiled directories to SLURM with sbatch.

    Run it from the directory the specs' relative paths refer to: the jobs start there.

    Exit code 2 when a spec is invalid, sbatch is missing, or sbatch refuses a script.
    """
    from dlmspec.cli.submit import submit

    use_json(ctx, json_output)
    script: list[str] = []
    if json_output:
        def echo(line: str) -> None:
            (script.append if dry_run else lambda text: print(text, file=sys.stderr))(line)
    else:
        echo = print
    jobs = submit(targets, output=output, overrides=set_, force=force, dry_run=dry_run, check_mode=check,
                  sbatch_args=sbatch_arg, echo=echo, python=python, after=after)
    if json_output:
        print_envelope("submit", ok=True, result={
            "dry_run": dry_run, "script": "\n".join(script) + "\n" if dry_run else None,
            "jobs": [{"job_id": j.job_id, "after": j.after, "target": j.step.target, "name": j.step.name,
                      "directory": str(j.step.directory), "script": str(j.step.script)} for j in jobs]})
