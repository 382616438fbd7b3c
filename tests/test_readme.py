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


def test_readme_sft_chain_submits_pretraining_then_sft(monkeypatch, capsys) -> None:
    """README's SFT section: its `dlmspec submit ... --dry-run` line runs as written and chains
    the SFT job after the pre-training job."""
    from dlmspec.cli import main

    line = next(ln for ln in README.read_text().splitlines() if "dlmspec submit specs/demo-dlm.toml" in ln)
    args = line.split("#")[0].split()[1:]  # drop .venv/bin/dlmspec
    monkeypatch.chdir(README.parent)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "specs/demo-dlm-sft.toml" in out and "--dependency=afterok:$job1" in out
