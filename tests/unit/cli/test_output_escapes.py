"""Issue tables print spec text literally: terminal control sequences (ESC, CSI, OSC, BEL, C1
controls, bidi overrides) in a run name, a key or a value are written as escapes, and rich
markup in a value prints as written."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from dlmspec.cli.commands import app
from dlmspec.cli.output import issues_table, stderr
from dlmspec.errors import EXIT_USAGE, SpecIssue
from small_spec import SMALL_SPEC

#: What a terminal would act on: C0 but newline, DEL, C1, bidi overrides and isolates.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HOSTILE = "a\x1b[31mRED\x1b]0;pwned\x07 [bold]x[/bold] \x9b2J \u202eevil"


def test_control_sequences_in_a_run_name_and_a_key_print_as_escapes(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    text = SMALL_SPEC.replace('name = "t"', 'name = "a\\u001b[31mRED\\u001b]0;pwned\\u0007 [bold]x[/bold] '
                              '\\u009b2J \\u202eevil"\n"\\u001b[2Jkey" = 1')
    spec.write_text(text, encoding="utf-8")
    result = CliRunner().invoke(app, ["validate", str(spec)])
    assert result.exit_code == EXIT_USAGE
    assert not RAW.search(result.stdout + result.stderr)
    assert "\\x1b[31mRED" in result.stderr and "\\x1b[2Jkey" in result.stderr
    assert "[bold]x[/bold]" in result.stderr


def test_finding_table_cells_are_printable() -> None:
    issue = SpecIssue(HOSTILE, HOSTILE, value=HOSTILE, hint=HOSTILE, file="spec\x1b[2J.toml", line=3)
    console = stderr()
    with console.capture() as captured:
        console.print(issues_table([issue]))
    out = captured.get()
    assert not RAW.search(out) and "[bold]x[/bold]" in out and "\\u202eevil" in out


def test_printable_keeps_newlines_only_when_asked() -> None:
    from dlmspec.cli.output import printable

    assert printable("a\nb\x1b") == "a\\nb\\x1b"
    assert printable("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


def test_show_and_toml_text_write_c1_and_bidi_controls_as_escapes(tmp_path: Path) -> None:
    import tomllib

    from dlmspec.errors import toml_text
    from dlmspec.escape import toml_document

    spec = tmp_path / "spec.toml"
    spec.write_text(SMALL_SPEC.replace('name = "t"', 'name = "t"\ndescription = "x\\u009b2J \\u202eevil \\u007f"'),
                    encoding="utf-8")
    result = CliRunner().invoke(app, ["show", str(spec)])
    assert result.exit_code == 0 and 'description = "x\\u009b2J \\u202eevil \\u007f"' in result.stdout
    assert not RAW.search(result.stdout)
    for text in (toml_text(HOSTILE), toml_document({"k\x9b": HOSTILE})):
        assert not RAW.search(text)
    assert tomllib.loads(toml_document({"k\x9b": HOSTILE})) == {"k\x9b": HOSTILE}
    assert tomllib.loads("v = " + toml_text(HOSTILE))["v"] == HOSTILE
