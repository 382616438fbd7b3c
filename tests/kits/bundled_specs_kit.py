"""The bundled specs under specs/ that are one spec each (a sweep file is several specs: its members
are compiled by tests/integration/cli/test_sweep.py and the golden files)."""

from __future__ import annotations

from pathlib import Path

from dlmspec.spec.python_load import sweep_targets

ROOT = Path(__file__).resolve().parents[2]


def single_specs() -> list[Path]:
    """specs/*.toml and specs/*.py that define one spec (not a sweep), sorted by name."""
    files = sorted(p for p in (ROOT / "specs").iterdir() if p.suffix in (".toml", ".py") and p.name != "__init__.py")
    return [p for p in files if p.suffix == ".toml" or sweep_targets(p) == [str(p)]]
