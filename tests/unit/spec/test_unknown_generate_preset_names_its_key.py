"""An unknown ``[generate] preset`` is refused at the key ``generate.preset`` (not at the table
``generate``), with the value as written and the preset names that exist, by ``dlmspec validate``
(exit 2, no traceback) and by the loader compile uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlmspec.cli import main
from dlmspec.errors import SpecError
from dlmspec.spec.load import load
from spec_kit import spec_file

#: An unknown preset whose text would run a command if it reached a shell unescaped.
PRESET = "llada-gsm8k\n$(touch PWNED)"


def test_unknown_generate_preset_is_refused_at_generate_preset(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    spec = spec_file(tmp_path, {"generate.preset": PRESET})
    line = next(n for n, text in enumerate(spec.read_text(encoding="utf-8").splitlines(), 1) if text.startswith("preset"))
    with pytest.raises(SpecError) as info:
        load(spec)
    (issue,) = [i for i in info.value.errors if i.key.startswith("generate")]
    assert (issue.key, issue.value) == ("generate.preset", PRESET)
    assert "llada-gsm8k-semi-ar" in issue.hint and issue.line == line
    capsys.readouterr()
    assert main(["validate", str(spec), "--json"]) == 2
    out = capsys.readouterr()
    shown = [i["key"] for i in json.loads(out.out)["issues"] if i["key"].startswith("generate")]
    assert shown == ["generate.preset"] and "Traceback" not in out.err
    assert not (tmp_path / "PWNED").exists()
