"""``dlmspec data prepare`` never writes over one of its inputs, even with ``--force``: an
``--input`` that is one of the files the run would write (``PREFIX.bin``, ``PREFIX.idx``, the
dataset record ``PREFIX.dlmspec.json``, a sharded run's manifest and progress file), by name or
through a link, is refused with exit 2 and left as it was."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlmspec.data.cli import app

NULL_CLI = ["--tokenizer-type", "null", "--vocab-size", "100"]


def _rows(path: Path, n: int = 20) -> bytes:
    path.write_text("".join(json.dumps({"text": " ".join(str(j) for j in range(i % 5 + 1))}) + "\n"
                            for i in range(n)))
    return path.read_bytes()


def _prepare(*args: str):
    return CliRunner().invoke(app, ["prepare", "--no-progress", *args])


@pytest.mark.parametrize("name", ["o_text_document.dlmspec.json", "o_text_document.bin", "o_text_document.idx"])
@pytest.mark.parametrize("through_link", [False, True])
def test_an_input_named_as_an_output_is_refused_even_with_force(tmp_path, monkeypatch, name, through_link):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / ("rows.jsonl" if through_link else name)
    before = _rows(source)
    given = name
    if through_link:
        os.symlink(source, tmp_path / "in.jsonl")
        os.symlink(source, tmp_path / name)  # the output name is a link to the input
        given = "in.jsonl"
    result = _prepare("--input", given, "--output-prefix", "o", *NULL_CLI, "--force")
    assert result.exit_code == 2, result.output
    assert "never writes over its input" in result.output
    assert source.read_bytes() == before


def test_a_sharded_input_named_as_the_manifest_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = tmp_path / "o_text_document.manifest.json"
    before = _rows(source)
    result = _prepare("--input", source.name, "--output-prefix", "o", *NULL_CLI, "--shard-size", "20", "--force")
    assert result.exit_code == 2, result.output
    assert source.read_bytes() == before
