"""``dlmspec``: the command line's entry point (:func:`main`; ``python -m dlmspec.cli`` runs it).

The package, in the order a command runs: :mod:`dlmspec.cli.app` (the typer app, no command),
:mod:`dlmspec.cli.commands` (the commands, one module each, registered on the app when imported),
:mod:`dlmspec.cli.validate` and :mod:`dlmspec.cli.plan` (the bodies of ``validate`` and ``plan``),
:mod:`dlmspec.cli.submit` (``dlmspec submit``), :mod:`dlmspec.cli.convert` (``dlmspec convert``),
:mod:`dlmspec.cli.output` (what every command prints, the ``--json`` envelope included),
:mod:`dlmspec.cli.help` (the help habits: ``-h``, flags without a type, markdown help). Command
modules import the app and the output helpers, never this module.

``validate`` and ``plan`` are the commands users run most (they are meant to answer in 0.3 s on a
2-core machine; ``bench/validate/bench_validate.py`` and ``bench/cli/startup.py`` time them).
:func:`main` runs their plain forms - ``dlmspec validate|check|plan SPEC`` with ``--set``/``-s``,
``--strict``, ``--json``, ``--search``, ``--top N`` (which implies ``--search``), as
:data:`dlmspec.cli.fast_argv.COMMANDS` (generated from the typer declarations) lists them -
itself, with the same bodies (:func:`dlmspec.cli.validate.run_validate`,
:func:`dlmspec.cli.plan.run_plan`) and the same error handling, without importing typer or
building the app (about 80 ms), and load the spec with ``fast=True``: a plainly valid spec is
checked without pydantic (:mod:`dlmspec.spec.fast`; importing pydantic and building the models
took more than half of ``validate``). Every other argument list (``--help``, ``--version``, an
unknown or malformed option, a missing or extra argument, shell completion) goes to typer, so
help texts, usage errors and exit codes are typer's. Neither path imports torch, megatron or the
compiler (jinja2); rich is imported only to print a table.

Bad input never prints a traceback: a :class:`~dlmspec.errors.SpecError` that escapes a command
is printed as a table of issues (file:line, key, value, why, fix) on stderr, or as JSON on
stdout when the command was given ``--json`` (see :func:`dlmspec.cli.output.use_json`), and the process exits with
:data:`~dlmspec.errors.EXIT_USAGE` (2). Usage errors (unknown options, missing arguments) also
exit with 2 (click's convention, which typer keeps).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from dlmspec.errors import EXIT_USAGE, SpecError, SpecIssue

# dlmspec.cli.validate (the rules) and dlmspec.cli.output are imported by the commands that use
# them: `dlmspec --help` and `dlmspec CMD --help` import neither the rules nor the spec models
# (tests/integration/cli/test_help_imports.py).

# --------------------------------------------------------------------------------------------
# Entry point


def fast_arguments(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``argv`` parsed as typer (click) parses it, for the plain forms of ``validate``,
    ``check`` and ``plan`` only; ``None`` for anything else (typer then parses it, and prints
    its help or usage error).

    The options come from :data:`dlmspec.cli.fast_argv.COMMANDS`, generated from the typer app's
    declaration (``python -m dlmspec.generated``), so the two cannot drift apart. Plain means:
    the command first; exactly one argument (SPEC) that does not start with ``-``; flags and
    options among that command's, written ``--set VALUE``, ``--set=VALUE`` or ``-s VALUE``, with
    a value that does not start with ``-`` (click would take it, but so rare a form is left to
    click); an integer option's value a plain decimal number. Options may come before or after
    SPEC, repeated flags count once, a repeatable option collects its values in order, and a
    repeated single option keeps the last, as in click.

    Returns:
        ``(command, params)``: params by the typer parameter names (``spec``, ``set_``,
        ``json_output``, ...), each present, defaults filled in, as click's ``ctx.params``.
    """
    from dlmspec.cli.fast_argv import COMMANDS

    if not argv or argv[0] not in COMMANDS:
        return None
    declared = COMMANDS[argv[0]]
    flags, valued, argument = declared["flags"], declared["values"], declared["argument"]
    params: dict[str, Any] = {k: list(v) if isinstance(v, list) else v for k, v in declared["defaults"].items()}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-"):
            if params[argument] is not None:
                return None  # an extra argument: typer's usage error
            params[argument] = token
            continue
        if token in flags:
            params[flags[token]] = True
            continue
        name, has_value, value = token.partition("=")
        if name not in valued or (has_value and not name.startswith("--")):
            return None  # --help, an unknown option, -s=VALUE, a flag given a value, ...
        if not has_value:
            if i == len(rest):
                return None  # option without its value: typer's usage error
            value = rest[i]
            i += 1
        if value.startswith("-"):
            return None
        key, kind, repeatable = valued[name]
        if kind == "int":
            if not (value.isascii() and value.isdigit()):
                return None
            value = int(value)
        if repeatable:
            params[key].append(value)
        else:
            params[key] = value
    if params[argument] is None:
        return None
    return argv[0], params


def _run_fast(command: str, options: dict[str, Any]) -> int:
    """Run a command :func:`fast_arguments` parsed, as typer would: a :class:`SpecError` is
    reported (table, or JSON with ``--json``) with exit code 2; Ctrl-C exits 130; a closed
    stdout (``| head``) exits 1 quietly. Returns the exit code."""
    from dlmspec.cli.output import report_issues

    try:
        try:
            if command == "plan":
                from dlmspec.cli.plan import run_plan

                return run_plan(options["spec"], options["set_"], options["json_output"], options["search"],
                                options["top"])
            from dlmspec.cli.validate import run_validate

            run_validate(options["spec"], options["set_"], strict=options["strict"],
                         json_output=options["json_output"], command=command)
            return 0
        except SpecError as exc:
            report_issues(exc.issues, as_json=options["json_output"], command=command, rules_skipped=exc.rules_skipped)
            return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except EOFError:
        from typer import rich_utils

        print(file=sys.stderr)
        rich_utils.rich_abort_error()
        return 1
    except OSError as exc:
        import errno

        if exc.errno != errno.EPIPE:
            raise
        sys.stdout, sys.stderr = _PipeClosed(sys.stdout), _PipeClosed(sys.stderr)
        return 1


class _PipeClosed:
    """A stream whose ``flush`` ignores a closed pipe (click's ``PacifyFlushWrapper``), so the
    interpreter's final flush prints nothing after ``dlmspec plan SPEC | head``."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        import errno

        try:
            self.wrapped.flush()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


#: What ``PYDANTIC_DISABLE_PLUGINS`` says when pydantic loads no plugin at all (pydantic's
#: ``plugin._loader.get_plugins``).
_PLUGINS_OFF = ("__all__", "1", "true")


def skip_pydantic_plugin_discovery() -> bool:
    """Run this process without pydantic plugins, as ``PYDANTIC_DISABLE_PLUGINS=__all__`` does,
    and without the cost of looking for them. Returns whether it did.

    The first time pydantic builds a validator it imports ``pydantic.plugin._loader``, which
    imports ``importlib.metadata`` and scans every installed distribution for ``pydantic``
    entry points: about 80M instructions (35 ms on the 2-core CI machine), a tenth of
    ``dlmspec validate``, even when ``PYDANTIC_DISABLE_PLUGINS`` is set (it skips the scan, not
    the import). dlmspec's spec models use no plugin, so the fast path registers a
    ``pydantic.plugin._loader`` whose ``get_plugins`` returns none: what pydantic's own returns
    with plugins disabled. Nothing is done when the user named plugins to disable (then they use
    the others) or when pydantic has already looked. ``tests/integration/cli/test_cli.py`` checks that the
    installed pydantic still asks that module for ``get_plugins`` only.
    """
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS", "__all__") not in _PLUGINS_OFF:
        return False
    if "pydantic.plugin._loader" in sys.modules:
        return False
    import types

    loader = types.ModuleType("pydantic.plugin._loader", "No pydantic plugins (dlmspec.cli.skip_pydantic_plugin_discovery).")
    loader.get_plugins = lambda: ()  # type: ignore[attr-defined]
    sys.modules["pydantic.plugin._loader"] = loader
    return True


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``[project.scripts] dlmspec``). Returns the exit code.

    The plain forms of ``validate``/``check``/``plan`` run without typer (see the module
    docstring), and without pydantic plugins (:func:`skip_pydantic_plugin_discovery`), as
    does any help (``-h``/``--help``: typer checks its parameters with pydantic);
    everything else goes to :data:`dlmspec.cli.commands.app`."""
    args = sys.argv[1:] if argv is None else list(argv)
    fast = fast_arguments(args) if "_DLMSPEC_COMPLETE" not in os.environ else None
    if fast is not None:
        skip_pydantic_plugin_discovery()
        return _run_fast(*fast)
    if "--help" in args or "-h" in args:
        skip_pydantic_plugin_discovery()  # help runs no command; typer's own parameter checks use pydantic
    from dlmspec.cli.commands import app  # here: importing typer and registering the commands is what the fast path skips

    if "--json" in args:
        return _run_json(app, args)
    try:
        app(args=argv, prog_name="dlmspec", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _abort_types(click_exceptions: Any) -> tuple:
    """What a Ctrl-C (``Abort``) is under this typer: typer >= 0.20 defines it in
    ``typer.exceptions`` (its ``_click.exceptions`` has none), older typer takes click's."""
    import typer

    found = tuple({t for t in (getattr(typer, "Abort", None), getattr(click_exceptions, "Abort", None))
                   if isinstance(t, type)})
    return found or (KeyboardInterrupt,)


def _run_json(app: Any, args: list[str]) -> int:
    """Run ``app`` for a ``--json`` command line: a usage error (a missing argument, an unknown
    option, a value of the wrong type: click's ``UsageError``) is printed as the JSON envelope,
    ``ok: false`` with one issue naming the option, instead of only a usage box on stderr; exit
    code 2 either way."""
    try:  # typer >= 0.20 carries its own copy of click
        from typer._click import exceptions as click_exceptions
    except ImportError:  # pragma: no cover - older typer on click
        from click import exceptions as click_exceptions

    from dlmspec.cli.output import print_envelope

    try:
        returned = app(args=args, prog_name="dlmspec", standalone_mode=False)
    except click_exceptions.UsageError as exc:
        param = getattr(exc, "param", None)
        key = (max(param.opts, key=len) if param is not None and getattr(param, "opts", None) else None) \
            or getattr(exc, "option_name", None) or "<arguments>"
        if param is not None and getattr(param, "param_type_name", "") == "argument":
            key = (getattr(param, "metavar", None) or str(getattr(param, "name", "") or "argument")).upper()
        words = exc.ctx.command_path.split()[1:] if exc.ctx is not None else []
        command = " ".join(words) or "dlmspec"
        issue = SpecIssue(key, exc.format_message(), hint=f"see {'dlmspec ' * bool(words)}{command} -h", rule="usage")
        print_envelope(command, ok=False, issues=[issue])
        return EXIT_USAGE
    except _abort_types(click_exceptions):
        return 1
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return returned if isinstance(returned, int) else 0
