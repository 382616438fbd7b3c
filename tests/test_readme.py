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


def _readme_spec_issues() -> list:
    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(), flags=re.S)
    loaded = load_text(blocks[0], "README.toml")
    return find(("spec",), loaded, resolve(loaded.spec))


def test_readme_spec_saves_checkpoints() -> None:
    """The example spec plans a multi-day run: it saves checkpoints, so it draws no
    `no-checkpoint-save` warning."""
    rules = {i.rule for i in _readme_spec_issues()}
    assert "no-checkpoint-save" not in rules


def test_readme_states_the_scale_of_its_measurements() -> None:
    """Where README describes the plans' accuracy it says on how many GPUs and how large a model
    they were measured."""
    text = " ".join(README.read_text().split())
    assert "one or two GPUs" in text and "2B parameters" in text


def test_readme_offline_data_needs_nothing_outside_the_repository() -> None:
    """README's offline data preparation names a local JSONL file, not a folder outside the checkout."""
    text = README.read_text()
    assert "../shared/data`, not part of" not in text
    assert "--input my-corpus.jsonl" in text
