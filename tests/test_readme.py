"""The spec shown in README.md validates as written (a user copies it first)."""

import re
from pathlib import Path

from dlmspec.check import find
from dlmspec.spec.load import load_text
from dlmspec.resolve import resolve

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_spec_validates() -> None:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md shows no TOML spec"
    loaded = load_text(blocks[0], "README.toml")
    errors = [i for i in find(("spec",), loaded, resolve(loaded.spec)) if i.severity == "error"]
    assert errors == [], [str(e) for e in errors]
