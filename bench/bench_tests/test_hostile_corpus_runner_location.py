"""The hostile-file corpus runner lives in bench/hostile/ (named for what it runs), and every
instruction that names it uses that path (the recorded commands of bench/results/ stay as run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_runner_is_under_bench_hostile_and_starts() -> None:
    runner = ROOT / "bench" / "hostile" / "run_corpus.py"
    assert runner.is_file() and not (ROOT / "bench" / "hardening").exists()
    out = subprocess.run([sys.executable, str(runner), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--out" in out.stdout


def test_no_instruction_names_the_old_folder() -> None:
    stale = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if (rel.parts[0] in (".git", ".venv", "bench") and rel.parts[:2] != ("bench", "hostile")) or not path.is_file():
            continue
        if path.suffix in (".py", ".md", ".toml", ".sh", ".txt") and "bench/hardening" in path.read_text(errors="replace"):
            stale.append(str(rel))
    assert stale == [], stale
