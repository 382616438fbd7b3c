"""dlmspec.cli.fast_arguments (the parser of the plain validate/check/plan forms, run without typer)
reads the table generated from the typer declaration and parses as typer does: every argv it
takes, typer takes with the same parameters; every argv typer refuses, it leaves to typer."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from dlmspec.cli import fast_arguments
from dlmspec.cli.commands import app

#: argv -> whether the fast parser must take it itself (True) or leave it to typer (False).
CASES: list[tuple[list[str], bool]] = [
    (["validate", "S.toml"], True),
    (["check", "S.toml", "--strict"], True),
    (["validate", "--json", "S.toml", "--strict", "--json"], True),
    (["validate", "S.toml", "--set", "a.b=1", "-s", "c=2", "--set=d=3"], True),
    (["plan", "S.toml"], True),
    (["plan", "--set", "a=1", "S.toml", "-s", "b=2", "--set=c=3", "--json", "--top", "7", "--search", "--top=3"], True),
    (["plan", "S.toml", "--top", "0"], True),
    (["plan", "S.toml", "--search"], True),
    (["validate"], False),
    (["plan"], False),
    (["validate", "S.toml", "extra"], False),
    (["validate", "S.toml", "--bogus"], False),
    (["validate", "S.toml", "--set"], False),
    (["validate", "S.toml", "--json=1"], False),
    (["validate", "S.toml", "--search"], False),
    (["plan", "S.toml", "--strict"], False),
    (["plan", "S.toml", "--top", "x"], False),
    (["plan", "S.toml", "--top"], False),
    (["plan", "S.toml", "--top", "1.5"], False),
    (["validate", "--help"], False),
    (["plan", "-h"], False),
    (["validate", "-s=a.b=1", "S.toml"], False),
    (["validate", "S.toml", "--set", "-x"], False),
    (["plan", "S.toml", "--top", "+2"], False),
    (["validate", "--", "S.toml"], False),
    (["show", "S.toml"], False),
    (["--version", "validate", "S.toml"], False),
    ([], False),
]


def _typer_params(argv: list[str]) -> dict[str, Any] | None:
    """What typer's parser makes of ``argv`` (``ctx.params``, tuples as lists), ``None`` when it
    refuses it or exits (help, a usage error)."""
    group = typer.main.get_command(app)
    if not argv or argv[0] not in group.commands:
        return None
    command = group.commands[argv[0]]
    try:
        ctx = command.make_context(f"dlmspec {argv[0]}", list(argv[1:]))
    except (Exception, SystemExit):  # click's UsageError / Exit, typer's copies of them
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in ctx.params.items()}


@pytest.mark.parametrize("argv, taken", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_fast_parser_takes_what_typer_takes_with_the_same_values(argv: list[str], taken: bool) -> None:
    fast = fast_arguments(argv)
    typed = _typer_params(argv)
    assert (fast is not None) == taken, fast
    if fast is not None:
        assert typed is not None, "the fast parser took what typer refuses"
        assert fast == (argv[0], typed)
    # what typer refuses (usage errors, help) is always left to typer
    if typed is None:
        assert fast is None


def test_fast_table_is_the_typer_declaration() -> None:
    """The generated table is what the typer app declares today (dlmspec.cli.fast_argv_build)."""
    from dlmspec.cli.fast_argv import COMMANDS
    from dlmspec.cli.fast_argv_build import declaration

    assert COMMANDS == declaration()


def test_declaration_refuses_an_option_the_parser_cannot_take(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast command given an option of a type the parser does not know (a float) makes the
    generator fail, naming it, instead of writing a table the parser would misread."""
    from dlmspec.cli import fast_argv_build

    extra = typer.Typer()

    @extra.command("validate")
    def validate(spec: str = typer.Argument(...), ratio: float = typer.Option(0.5, "--ratio")) -> None:
        """A command with a float option."""

    @extra.command("other")
    def other() -> None:
        """Another command."""

    import dlmspec.cli.commands

    monkeypatch.setattr(dlmspec.cli.commands, "app", extra)
    monkeypatch.setattr(fast_argv_build, "FAST", ("validate",))
    with pytest.raises(ValueError, match="--ratio"):
        fast_argv_build.declaration()
