"""``dlmspec``: the command line's entry point (:func:`main`) and the output every command
shares (issue tables, ``--json``, consoles).

The commands are declared with typer in :mod:`dlmspec.commands`; ``from dlmspec.cli import
app`` still gives that app (and any other name of :mod:`dlmspec.commands`), imported on first
use. Other modules add their commands to it (``@app.command()`` or ``app.add_typer(...)``).

``validate`` and ``plan`` are the commands users run most (issues #2 and #4 target 0.3 s on a
2-core machine; ``bench/validate/bench_validate.py`` times them). :func:`main` runs their
plain forms - ``dlmspec validate|check|plan SPEC`` with ``--set``/``-s``, ``--strict``,
``--json``, ``--search``, ``--top N`` - itself, with the same bodies (:func:`run_validate`,
:func:`dlmspec.plan.cli.run_plan`) and the same error handling, without importing typer or
building the app (about 80 ms), and load the spec with ``fast=True``: a plainly valid spec is
checked without pydantic (:mod:`dlmspec.fastspec`; importing pydantic and building the models
took more than half of ``validate``). Every other argument list (``--help``, ``--version``, an
unknown or malformed option, a missing or extra argument, shell completion) goes to typer, so
help texts, usage errors and exit codes are typer's. Neither path imports torch, megatron or the
compiler (jinja2); rich is imported only to print a table.

Bad input never prints a traceback: a :class:`~dlmspec.errors.SpecError` that escapes a command
is printed as a table of issues (file:line, key, value, why, fix) on stderr, or as JSON on
stdout when the command was given ``--json`` (see :func:`use_json`), and the process exits with
:data:`~dlmspec.errors.EXIT_USAGE` (2). Usage errors (unknown options, missing arguments) also
exit with 2 (click's convention, which typer keeps).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from dlmspec.errors import EXIT_USAGE, SpecError, SpecIssue

if TYPE_CHECKING:
    import typer
    from rich.console import Console
    from rich.table import Table

    from dlmspec.loader import LoadedSpec
    from dlmspec.resolve import Resolved

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


# --------------------------------------------------------------------------------------------
# Checking a spec: what validate reports is what compile refuses


def spec_issues(loaded: LoadedSpec, resolved: Resolved) -> list[SpecIssue]:
    """Every issue between this spec and a running job: what ``dlmspec validate`` reports and
    ``dlmspec compile`` refuses (:func:`dlmspec.check.issues_for`: rules, paths, SLURM
    settings, memory, the runtime's gaps), sorted errors first, then by file, line and key.
    ``dlmspec new`` uses it."""
    from dlmspec.check import issues_for

    return issues_for("validate", loaded, resolved)


def load_and_check(path: str, overrides: list[str], *, strict: bool = False,
                   fast: bool = False) -> tuple[LoadedSpec, Resolved, list[SpecIssue]]:
    """Load ``path`` with ``--set`` ``overrides``, resolve it and check it as ``dlmspec
    compile`` does (:func:`dlmspec.check.load_for` with ``validate``'s scopes, which are
    ``compile``'s). ``fast``: load a plainly valid spec without pydantic
    (:func:`dlmspec.loader.load`'s ``fast``).

    Returns:
        (loaded, resolved, warnings).

    Raises:
        SpecError: the spec does not load, or has an error (or, with ``strict``, a warning).
    """
    from dlmspec.check import load_for

    loaded, resolved, issues = load_for("validate", path, overrides, fast=fast)
    if any(i.severity == "error" for i in issues) or (strict and issues):
        raise SpecError(issues)
    return loaded, resolved, issues


def _memory(resolved: Resolved) -> dict[str, int] | None:
    """Planned peak per GPU and the GPU's memory, bytes (None for a GPU outside the catalog)."""
    if resolved.gpu is None:
        return None
    from dlmspec.plan import make_plan

    return {"peak_bytes": int(round(make_plan(resolved).peak_bytes)), "capacity_bytes": int(resolved.gpu.memory_bytes)}


def run_validate(spec: str, overrides: list[str], *, strict: bool = False, json_output: bool = False) -> None:
    """Body of ``dlmspec validate`` (and ``check``): load ``spec`` with the ``--set``
    ``overrides``, check it as ``compile`` does (:func:`load_and_check`) and plan its memory;
    print one ``ok:`` line (warnings on stderr) that ends with the layer path train.py takes
    (``transformer_impl``, resolved, and why), or with ``json_output`` ``{"ok": true, ...}``
    on stdout.

    Raises:
        SpecError: the spec has an error (or, with ``strict``, a warning); the caller prints it
            (:func:`report_issues`) and exits 2.
    """
    from dlmspec.gpus import GiB

    loaded, resolved, warnings = load_and_check(spec, overrides, strict=strict, fast=True)
    memory = _memory(resolved)
    if json_output:
        import json

        print(json.dumps({"ok": True, "spec": display_path(str(loaded.path)), "name": loaded.spec.name,
                          "warnings": [_issue_dict(w) for w in warnings], "derived": resolved.derived(),
                          "memory": memory}, indent=2))
        return
    report_warnings(warnings)
    p = resolved.params
    active = f" ({human_count(p.active)} active)" if p.active != p.total else ""
    fits = (f"; planned peak {memory['peak_bytes'] / GiB:.1f} of {memory['capacity_bytes'] / GiB:.1f} GiB per GPU"
            if memory else "")
    print(
        f"ok: {loaded.spec.name}: {human_count(p.total)} parameters{active}, "
        f"{resolved.world_size} GPU(s) as TP {resolved.tp} x PP {resolved.pp} x CP {resolved.cp} "
        f"x DP {resolved.dp}, {resolved.num_microbatches} microbatch(es) per step, "
        f"{resolved.train_iters:,} steps of {resolved.tokens_per_step:,} tokens{fits}; "
        f"layers: {resolved.transformer_impl} ({resolved.transformer_impl_reason})"
    )


# --------------------------------------------------------------------------------------------
# Entry point


#: Commands :func:`main` runs without typer: name -> (flags, options that take a value).
_FAST_COMMANDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "validate": (frozenset({"--strict", "--json"}), frozenset({"--set", "-s"})),
    "check": (frozenset({"--strict", "--json"}), frozenset({"--set", "-s"})),
    "plan": (frozenset({"--json", "--search"}), frozenset({"--set", "-s", "--top"})),
}


def fast_arguments(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """``argv`` parsed as typer (click) parses it, for the plain forms of ``validate``,
    ``check`` and ``plan`` only; ``None`` for anything else (typer then parses it, and prints
    its help or usage error).

    Plain means: the command first; exactly one argument (SPEC) that does not start with ``-``;
    flags and options among that command's, written ``--set VALUE``, ``--set=VALUE`` or ``-s
    VALUE``, with a value that does not start with ``-`` (click would take it, but so rare a
    form is left to click); ``--top`` a decimal number. Options may come before or after SPEC,
    repeated flags count once and a repeated ``--top`` keeps the last, as in click.

    Returns:
        ``(command, options)``; options has ``spec``, ``set`` (list), ``json``, ``strict``,
        ``search`` (bools) and ``top`` (int, default 5).
    """
    if not argv or argv[0] not in _FAST_COMMANDS:
        return None
    flags, valued = _FAST_COMMANDS[argv[0]]
    options: dict[str, Any] = {"spec": None, "set": [], "json": False, "strict": False, "search": False, "top": 5}
    rest = argv[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-"):
            if options["spec"] is not None:
                return None  # an extra argument: typer's usage error
            options["spec"] = token
            continue
        if token in flags:
            options[token[2:]] = True
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
        if name == "--top":
            if not (value.isascii() and value.isdigit()):
                return None
            options["top"] = int(value)
        else:
            options["set"].append(value)
    if options["spec"] is None:
        return None
    return argv[0], options


def _run_fast(command: str, options: dict[str, Any]) -> int:
    """Run a command :func:`fast_arguments` parsed, as typer would: a :class:`SpecError` is
    reported (table, or JSON with ``--json``) with exit code 2; Ctrl-C exits 130; a closed
    stdout (``| head``) exits 1 quietly. Returns the exit code."""
    try:
        try:
            if command == "plan":
                from dlmspec.plan.cli import run_plan

                return run_plan(options["spec"], options["set"], options["json"], options["search"], options["top"])
            run_validate(options["spec"], options["set"], strict=options["strict"], json_output=options["json"])
            return 0
        except SpecError as exc:
            report_issues(exc.issues, as_json=options["json"])
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
    the others) or when pydantic has already looked. ``tests/test_cli.py`` checks that the
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
    docstring), and without pydantic plugins (:func:`skip_pydantic_plugin_discovery`);
    everything else goes to :data:`dlmspec.commands.app`."""
    args = sys.argv[1:] if argv is None else list(argv)
    fast = fast_arguments(args) if "_DLMSPEC_COMPLETE" not in os.environ else None
    if fast is not None:
        skip_pydantic_plugin_discovery()
        return _run_fast(*fast)
    from dlmspec.commands import app

    try:
        app(args=argv, prog_name="dlmspec", standalone_mode=True)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def __getattr__(name: str) -> Any:
    """``app``, the commands and their helpers (:mod:`dlmspec.commands`), imported on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from dlmspec import commands

    try:
        return getattr(commands, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":  # pragma: no cover - `python -m dlmspec.cli`
    sys.exit(main())
