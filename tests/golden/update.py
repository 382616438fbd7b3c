"""Compile every bundled spec into ``tests/golden/compiled/<spec>/`` (the golden files).

Run ``python tests/golden/update.py`` from the project root after a change that is meant to change
compiled output, and commit the new files in a commit of their own that says why they changed.
``tests/integration/golden/test_golden_compile.py`` fails when compiling a bundled spec gives other bytes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "compiled"


def bundled_specs() -> list[Path]:
    """Every spec file under ``specs/`` (TOML and Python; ``__init__.py`` is not a spec)."""
    specs = sorted(ROOT.glob("specs/*.toml")) + sorted(
        p for p in ROOT.glob("specs/*.py") if p.name != "__init__.py"
    )
    return specs


def compile_spec(spec: Path, out: Path) -> None:
    """Compile ``spec`` into ``out`` with the installed CLI (raises on a non-zero exit)."""
    subprocess.run(
        [sys.executable, "-m", "dlmspec.cli", "compile", str(spec), "-o", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )


def normalize(data: bytes) -> bytes:
    """Compiled files name the spec by its absolute path (their header line): the checkout's
    location is written as ``<checkout>`` so the golden files hold in any clone."""
    return data.replace(str(ROOT).encode(), b"<checkout>")


def compiled_files(out: Path) -> dict[str, bytes]:
    """``{relative path: normalized bytes}`` of every file under ``out``."""
    return {str(p.relative_to(out)): normalize(p.read_bytes()) for p in sorted(out.rglob("*")) if p.is_file()}


def main() -> None:
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)
    for spec in bundled_specs():
        compile_spec(spec, GOLDEN / spec.stem)
        for name, data in compiled_files(GOLDEN / spec.stem).items():
            (GOLDEN / spec.stem / name).write_bytes(data)
        print(f"{spec.relative_to(ROOT)} -> {(GOLDEN / spec.stem).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
