"""Help and CLI habits: ``-h`` is ``--help`` everywhere, flags show no type, help
text reflows to the terminal (no line broken mid-sentence, no word lost to markup) at 80 and
200 columns, ``plan --top`` is not silently ignored, and a missing spec file gets a fix.

Every command and group is found by walking the typer app, so a new command is checked too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.rich_utils
from typer.testing import CliRunner

from dlmspec.cli import main
from dlmspec.cli.commands import app

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "specs" / "demo-dlm.toml")
BOX = ("│", "╭", "╰")


def commands() -> list[tuple[tuple[str, ...], Any]]:
    """(words, click command) of the app, its groups and every visible command."""
    from typer._click import Context

    def walk(command: Any, path: tuple[str, ...], ctx: Any) -> list[tuple[tuple[str, ...], Any]]:
        found = [(path, command)]
        if hasattr(command, "list_commands"):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if not sub.hidden:
                    found += walk(sub, path + (name,), Context(sub, info_name=name, parent=ctx))
        return found

    root = typer.main.get_command(app)
    return walk(root, (), Context(root, info_name="dlmspec"))


COMMANDS = commands()
IDS = [" ".join(path) or "dlmspec" for path, _ in COMMANDS]


def render_help(args: list[str], width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", width)
    result = CliRunner().invoke(app, args, prog_name="dlmspec")
    assert result.exit_code == 0, result.output
    return result.output


def broken_lines(text: str, width: int) -> list[tuple[str, str]]:
    """Pairs of help lines where a paragraph was broken mid-sentence: the first line ends without
    sentence punctuation, the next (same paragraph, or the same table cell) starts with a
    lower-case letter or a digit, and its first word would have fit on the first line, so the
    terminal did not wrap there: the text had a hard line break."""
    found = []
    lines = text.splitlines()
    for first, second in zip(lines, lines[1:]):
        if first.startswith("│") and second.startswith("│"):
            a, b = first[1:first.rindex("│")], second[1:second.rindex("│")]
            right = len(a) - 1  # the panel's right padding
        elif not first.startswith(BOX) and not second.startswith(BOX):
            a, b, right = first, second, width - 1
        else:
            continue
        rest = b.lstrip()
        column = len(b) - len(rest)
        if not rest or column >= len(a) or a[column] == " " or (column and a[column - 1] != " "):
            continue  # not the continuation of a's text in the same column
        if not (rest[0].islower() or rest[0].isdigit()) or a.rstrip()[-1] in ".:;!?":
            continue
        if len(a.rstrip()) + 1 + len(rest.split()[0]) <= right:
            found.append((first.rstrip(), second.rstrip()))
    return found


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_dash_h_is_help(path: tuple[str, ...], command: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert render_help([*path, "-h"], 120, monkeypatch) == render_help([*path, "--help"], 120, monkeypatch)


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_reflows_and_flags_show_no_type(path: tuple[str, ...], command: Any, width: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    text = render_help([*path, "--help"], width, monkeypatch)
    assert not broken_lines(text, width), broken_lines(text, width)
    assert "<bool>" not in text
    assert "\u2026" not in text, [line for line in text.splitlines() if "\u2026" in line]  # nothing cut short
    for line in text.splitlines():
        assert len(line) <= width, line


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=IDS)
def test_help_loses_no_word(path: tuple[str, ...], command: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Markup must not eat text: every word of the docstring and of each option's help is printed
    (``<hidden>`` read as an HTML tag, say, would vanish)."""
    text = render_help([*path, "--help"], 200, monkeypatch)
    shown = set(re.findall(r"[A-Za-z0-9]+", text))
    sources = [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]
    if hasattr(command, "list_commands"):
        sources += [(c.short_help or (c.help or "").split("\n\n")[0]) for c in command.commands.values()
                    if not c.hidden]
    for source in sources:
        missing = set(re.findall(r"[A-Za-z0-9]+", source)) - shown
        assert not missing, (source, missing)


def test_the_detector_finds_a_hard_break() -> None:
    assert broken_lines(" Convert a checkpoint into a format (loadable at\n any TP/PP).\n", 80)
    assert not broken_lines(" " + "word " * 15 + "and\n continues here.\n", 80)  # wrapped by the terminal


def test_top_implies_search(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan --top N`` ranks N layouts, as ``--search --top N`` does, on both paths (fast and typer)."""
    args = ["plan", DEMO, "--top", "2", "--json", "--set", "cluster.gpus_per_node=2",
            "--set", "train.global_batch_size=64"]
    assert main(args) == 0  # the fast path
    assert len(json.loads(capsys.readouterr().out)["result"]["search"]["top"]) == 2
    result = CliRunner().invoke(app, args)  # the typer path
    assert result.exit_code == 0 and len(json.loads(result.stdout)["result"]["search"]["top"]) == 2
    text = render_help(["plan", "--help"], 200, monkeypatch)
    assert "implies --search" in text


def test_missing_spec_file_gets_a_remedy_without_extends(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "demo-dlm.toml").write_text("")
    assert main(["validate", "missing.toml", "--json"]) == 2
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert "extends" not in issue["hint"] and "extends" not in issue["message"]
    assert "dlmspec new missing.toml --from demo-dlm" in issue["hint"] and str(tmp_path) in issue["hint"]
    assert main(["validate", "specs/demo-dl.toml", "--json"]) == 2
    (issue,) = json.loads(capsys.readouterr().out)["issues"]
    assert "did you mean specs/demo-dlm.toml" in issue["hint"]
