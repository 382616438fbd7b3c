"""The benchmarks' files name runs by date and features, never internal work periods or issue numbers.

Checked: the name of every file and folder under ``bench/`` and the text of every file there
(results, calibration data, logs, scripts, docs). Set aside:

* compressed archives (``*.tgz``, ``*.gz``, ``*.zip``): raw logs packed on the GPU machine as it
  returned them, binary, not rewritten;
* figures (``*.png`` with PNG's signature) and megatron-core dataset indexes (``*.idx`` with its
  ``MMIDIDX`` header) that a result folder carries so ``dlmspec fit`` can read it: binary, their
  names are still checked;
* ``__pycache__`` folders;
* the keys of ``bench/results/renames.json``'s ``renames`` map: they are the old paths that map
  exists to translate (``bench/rewrite_citations.py`` reads them); its description and its new
  paths are checked like any other text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RENAMES = BENCH / "results" / "renames.json"

#: Binary archives of raw logs: exempt (see the module docstring).
ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".gz", ".zip")

#: An issue number (the word with a number, with or without "#", or a bare "#" and number in
#: parentheses) or a work period (the word "session" with a number or "x2", in prose, in a file name
#: or as "S" and two digits); the examples are in the parametrised checks below. A bare "#N" after
#: ")" is a C++ lambda's name in a profiler trace (``lambda()#3``), not an issue, and is left alone.
OFFENCE = re.compile(
    r"(?i:\bissues? ?#?\d+)"
    r"|(?<![\w&/#'\")])#\d{1,3}\b(?![\w-])"
    r"|(?i:(?<![a-z])sessions? ?[-_]?\d+)"
    r"|(?i:(?<![a-z])session[-_ ]?x\d)"
    r"|(?i:session\d+)"
    r"|\bS\d{2}\b")
#: A file or folder name that names a work period or an issue.
OFFENDING_NAME = re.compile(r"(?i)session|issue[-_ ]?\d|(?<![a-z])s\d\d(?![0-9])")


#: Binary result files by suffix and the first bytes they must start with (see the module docstring).
BINARY_SIGNATURES = {".png": b"\x89PNG\r\n\x1a\n", ".idx": b"MMIDIDX\x00\x00"}


def is_exempt(path: Path, root: Path = BENCH) -> bool:
    """True for a compressed archive, a PNG figure or a megatron-core dataset index (by their
    signatures: a text file named ``.png`` is still read), or anything under ``__pycache__``."""
    if "__pycache__" in path.parts or path.name.endswith(ARCHIVE_SUFFIXES):
        return True
    signature = BINARY_SIGNATURES.get(path.suffix)
    if signature is None:
        return False
    with open(root / path, "rb") as fh:
        return fh.read(len(signature)) == signature


def offences(text: str) -> list[str]:
    """Each offending phrase of ``text`` as ``"line N: ...context..."``."""
    found = []
    for m in OFFENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        found.append(f"line {line}: ...{text[max(0, m.start() - 40):m.end() + 20]!r}...")
    return found


def checked_text(path: Path) -> str:
    """The text of ``path`` that is checked: the whole file, except for ``renames.json``, whose
    ``renames`` keys (the old paths) are left out. Raises ``UnicodeDecodeError`` for a file that is
    not UTF-8 text (the test then reports it: a binary file under bench/ must be an archive)."""
    text = path.read_bytes().decode("utf-8")
    if path.name == RENAMES.name and path.parent.name == "results":
        data = json.loads(text)
        data["renames"] = sorted(data.get("renames", {}).values())
        return json.dumps(data, indent=1)
    return text


def bench_files(root: Path) -> list[Path]:
    """Every file under ``root`` that the text check reads."""
    return [p for p in sorted(root.rglob("*")) if p.is_file() and not is_exempt(p.relative_to(root), root)]


def text_offences(root: Path) -> dict[str, list[str]]:
    """``{relative path: offences}`` for every checked file under ``root`` with any."""
    out = {}
    for path in bench_files(root):
        rel = path.relative_to(root).as_posix()
        try:
            found = offences(checked_text(path))
        except UnicodeDecodeError:
            found = ["not UTF-8 text and not a compressed archive"]
        if found:
            out[rel] = found
    return out


def name_offences(root: Path) -> list[str]:
    """The relative paths under ``root`` whose last part names a work period or an issue."""
    return [p.relative_to(root).as_posix() for p in sorted(root.rglob("*"))
            if "__pycache__" not in p.parts and OFFENDING_NAME.search(p.name)]


# --- the checker itself ------------------------------------------------------------------------

# Built by joining, so that this file's own text does not carry the phrases it checks for.
S, I, H = "sess" + "ion", "iss" + "ue", "#"


@pytest.mark.parametrize("text", [
    f"'benchmark': '{S} 10 on one H200: what ran'",
    f"{S[0].upper()}{S[1:]} 4's throughput",
    f"bench/results/{S}10_h200/te_install.log",
    f"calibration_h200x2_{S}5.json",
    f"bash bench/gpu/{S}11.sh $OUT",
    f"bash bench/gpu/{S}_x2.sh a $OUT",
    f"the planned {S}-12 list",
    f"{I} {H}7's requirement",
    f"{I}s {H}2 and {H}4",
    f"{I.capitalize()} 21: the TE path",
    f"answers beside the base model's ({H}19)",
    f"run by the S{10} harness",
])
def test_checker_finds_a_work_period_or_a_ticket_number(text: str) -> None:
    assert offences(text), text


@pytest.mark.parametrize("text", [
    "the 2026-12-02 run on one H200",
    "bash [a device script of 2026-12-02, retired in 0.2.0] $OUT",
    "at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()()",
    '"session_command": "bash bench/devbox/gpu/run_matrix.sh"',
    "every optimisation keeps the first 50 steps' losses within bf16 noise",
])
def test_checker_leaves_dates_features_and_profiler_names(text: str) -> None:
    assert offences(text) == []


def test_checker_reads_every_text_file_and_skips_archives_and_renames_keys(tmp_path: Path) -> None:
    (tmp_path / "results" / "old").mkdir(parents=True)
    (tmp_path / "results" / "run.json").write_text(json.dumps({"benchmark": f"{S} 9 on one H200"}))
    (tmp_path / "results" / "old" / "eval.log").write_text(f"ok\n{I} {H}19: SFT\n")
    (tmp_path / "results" / "logs.tgz").write_bytes(b"\x1f\x8b\x08\x00" + f"{S}9".encode())
    (tmp_path / "results" / "renames.json").write_text(json.dumps({
        "what": "old -> new", "renames": {f"bench/results/{S}9_h200.json": "bench/results/gpu_runs.json"}}))
    (tmp_path / "results" / "blob.bin").write_bytes(b"\xff\xfe\x00")
    found = text_offences(tmp_path)
    assert sorted(found) == ["results/blob.bin", "results/old/eval.log", "results/run.json"]
    assert found["results/old/eval.log"][0].startswith("line 2:")
    (tmp_path / "results" / "renames.json").write_text(json.dumps({
        "what": f"old names from {S} 9", "renames": {"a": "b"}}))
    assert "results/renames.json" in text_offences(tmp_path)


def test_checker_finds_a_file_or_folder_named_after_a_work_period(tmp_path: Path) -> None:
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / f"{S}11.sh").write_text("true\n")
    (tmp_path / f"{S}10_h200").mkdir()
    (tmp_path / "results.json").write_text("{}")
    assert name_offences(tmp_path) == [f"gpu/{S}11.sh", f"{S}10_h200"]


# --- the repository ----------------------------------------------------------------------------


def test_no_bench_file_mentions_a_work_period_or_a_ticket_number() -> None:
    found = text_offences(BENCH)
    assert not found, "\n".join(f"bench/{path}: {hits[:3]} ({len(hits)} in all)" for path, hits in found.items())


def test_no_bench_file_or_folder_is_named_after_a_work_period_or_a_ticket() -> None:
    assert name_offences(BENCH) == []


def test_checker_sets_aside_figures_and_dataset_indexes_by_their_signature_only(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "fit.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (results / "demo_text_document.idx").write_bytes(b"MMIDIDX\x00\x00" + bytes(range(256)))
    (results / "fake.png").write_text(f"measured in {S} 12\n", encoding="utf-8")
    (results / "raw.idx").write_bytes(bytes(range(256)))
    found = text_offences(tmp_path)
    assert sorted(found) == ["results/fake.png", "results/raw.idx"]
    assert found["results/raw.idx"] == ["not UTF-8 text and not a compressed archive"]
