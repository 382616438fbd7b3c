"""Compiling each bundled spec gives exactly the committed golden files (tests/golden/compiled/).

A refactor must leave compiled output byte-identical; a change meant to alter it regenerates the
golden files with ``python tests/golden/update.py`` in a commit of its own that says why.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parents[2] / "golden"
_spec = importlib.util.spec_from_file_location("golden_update", _HERE / "update.py")
update = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(update)


@pytest.mark.parametrize("spec", update.bundled_specs(), ids=lambda p: p.stem)
def test_compiled_output_equals_golden_files(spec: Path, tmp_path: Path) -> None:
    golden = update.GOLDEN / spec.stem
    assert golden.is_dir(), f"no golden files for {spec.name}: run python tests/golden/update.py"
    update.compile_spec(spec, tmp_path / spec.stem)
    got = update.compiled_files(tmp_path / spec.stem)
    want = {str(p.relative_to(golden)): p.read_bytes() for p in sorted(golden.rglob("*")) if p.is_file()}
    assert sorted(got) == sorted(want)
    changed = [name for name in want if got[name] != want[name]]
    assert not changed, f"{spec.name}: compiled files differ from the golden files: {changed}"


def test_every_bundled_spec_has_golden_files() -> None:
    names = {p.stem for p in update.bundled_specs()}
    assert names == {p.name for p in update.GOLDEN.iterdir() if p.is_dir()}
