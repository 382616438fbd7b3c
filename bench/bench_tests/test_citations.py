"""Every cited bench/results path exists; renames.json and bench/rewrite_citations.py keep citations right."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITED_IN = ("README.md", "CHANGELOG.md", "docs", "dlmspec", "backends", "bench")
SUFFIXES = {".md", ".py", ".sh", ".toml", ".j2", ".txt"}
CITATION = re.compile(r"bench/results/[\w./{},*<>-]+")


def _expand(path: str) -> list[str]:
    """``a/{x,y}_z`` -> ``a/x_z``, ``a/y_z`` (nested braces expand left to right)."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in _expand(path[:m.start()] + alt + path[m.end():])]


def cited_paths(root: Path = ROOT) -> dict[str, list[str]]:
    """cited path -> the files citing it, over :data:`CITED_IN` (patterns with ``*`` or ``<...>``
    and the results' own data are not citations of one file)."""
    files = []
    for name in CITED_IN:
        p = root / name
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files += [f for f in sorted(p.rglob("*")) if f.is_file() and f.suffix in SUFFIXES
                      and not f.relative_to(root).as_posix().startswith(("bench/results/", "bench/calibration/local/",
                                                                        "bench/calibration/te/", "bench/bench_tests/",
                                                                        "bench/rewrite_citations.py"))]
    out: dict[str, list[str]] = {}
    for f in files:
        for m in CITATION.finditer(f.read_text(encoding="utf-8", errors="replace")):
            raw = m.group(0).rstrip(".,:;")
            if "*" in raw or "<" in raw or raw.endswith("/"):
                continue
            for path in _expand(raw):
                out.setdefault(path.rstrip(".,:;)"), []).append(f.relative_to(root).as_posix())
    return out


def test_every_cited_bench_results_path_exists():
    missing = {p: files for p, files in cited_paths().items() if not (ROOT / p).exists()}
    assert not missing, "cited but missing (run python bench/rewrite_citations.py after renames): " + json.dumps(
        missing, indent=1)


def test_renames_point_from_paths_that_are_gone_to_paths_that_exist():
    renames = json.loads((ROOT / "bench" / "results" / "renames.json").read_text())["renames"]
    assert renames
    for old, new in renames.items():
        assert not (ROOT / old).exists(), old
        assert (ROOT / new).exists(), new
        assert "session" not in new.lower(), new


def test_no_result_or_bench_file_is_named_after_a_work_period():
    named = [p.relative_to(ROOT).as_posix() for p in (ROOT / "bench").rglob("*")
             if re.search(r"session\d|session_|_session", p.name.lower())]
    assert not named, named


def test_rewrite_citations_replaces_old_paths_once_and_keeps_longer_names(tmp_path):
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "results" / "renames.json").write_text(json.dumps({"renames": {
        "bench/results/run_a.json": "bench/results/run_measured.json",
        "bench/results/run_a": "bench/results/run_measured_logs",
        "bench/results/cal_x.json": "bench/calibration/te/h200/x.json"}}))
    doc = tmp_path / "docs" / "page.md"
    doc.write_text("see bench/results/run_a.json, bench/results/run_a/log.txt and bench/results/run_a_b.json; bench/results/run_a. "
                   "cal_x.json in prose\n")
    code = tmp_path / "docs" / "tool.py"
    code.write_text('PATH = ROOT / "bench" / "results" / "cal_x.json"\nOTHER = "run_a.json"\n')
    cmd = [sys.executable, str(ROOT / "bench" / "rewrite_citations.py"), "--root", str(tmp_path)]
    assert subprocess.run(cmd + ["--check"], capture_output=True, timeout=60).returncode == 1
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0
    assert doc.read_text() == ("see bench/results/run_measured.json, bench/results/run_measured_logs/log.txt and "
                               "bench/results/run_a_b.json; bench/results/run_measured_logs. bench/calibration/te/h200/x.json in prose\n")
    # in code a bare name moved to another folder stays (it is joined to a folder there); same folder: renamed
    assert code.read_text() == 'PATH = ROOT / "bench" / "results" / "cal_x.json"\nOTHER = "run_measured.json"\n'
    before = doc.read_text()
    assert subprocess.run(cmd + ["--check"], capture_output=True, timeout=60).returncode == 0
    assert subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0 and doc.read_text() == before
