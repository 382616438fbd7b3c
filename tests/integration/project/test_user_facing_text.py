"""What users read names features and versions, never internal work periods or issue numbers.

Checked: the names and the text of every file in `docs/`, `dlmspec/`, `backends/`, `specs/`,
`templates/`, README.md, CHANGELOG.md and CONTRIBUTING.md, and what `validate`, `plan` and
`compile` print (text and `--json`) and write on every bundled spec.

A citation of a file that exists under `bench/` (a result, a script) is judged by that file's own
name, which belongs to the benchmarks; so such a path is set aside here while the file exists,
and becomes an offence as soon as the file is renamed or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

FOLDERS = ("docs", "dlmspec", "backends", "specs", "templates")
FILES = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")

#: An issue number ("issue #21", "issues #2 and #4", "issue 21", "#18"), a work period
#: ("session 12", "session-5", "sessions 3", "S10", "session_x2") or the words "work period".
OFFENCE = re.compile(
    r"\bissues? ?#?\d+"
    r"|(?<![\w&/#'\"])#\d{1,3}\b(?![\w-])"
    r"|(?i:(?<![a-z])sessions? ?[-_]?\d+)"
    r"|(?i:(?<![a-z])session[-_ ]?x\d)"
    r"|\bS\d{2}\b"
    r"|(?i:\bwork[- ]periods?\b)")
#: A file name that names a work period or an issue.
OFFENDING_NAME = re.compile(r"(?i)session|issue[-_ ]?\d|(?<![a-z])s\d\d(?![0-9])")

TEXT_SUFFIXES = {".md", ".py", ".toml", ".j2", ".txt", ".json", ".sh", ".cfg", ".ini", ".yaml", ".yml", ""}

#: A path-like token: what a citation of a file looks like in prose, code or output.
PATH_TOKEN = re.compile(r"[\w.{},*/-]+")


def _bench_names() -> tuple[set[str], set[str]]:
    """Every file and folder under bench/: relative paths and base names."""
    bench = ROOT / "bench"
    paths, names = set(), set()
    if bench.is_dir():
        for path in bench.rglob("*"):
            rel = path.relative_to(ROOT).as_posix()
            paths.add(rel)
            names.add(path.name)
    return paths, names


BENCH_PATHS, BENCH_NAMES = _bench_names()


def _without_bench_citations(text: str) -> str:
    """``text`` with each token that names an existing file or folder under bench/ blanked."""
    def blank(match: re.Match) -> str:
        token = match.group(0).strip(".,")
        bare = token.rstrip("/")
        if bare in BENCH_PATHS or (bare.startswith("bench/") and (ROOT / bare).exists()):
            return "<bench>"
        if "/" not in bare and bare in BENCH_NAMES and "." in bare:
            return "<bench>"
        return match.group(0)
    return PATH_TOKEN.sub(blank, text)


def offences(text: str) -> list[str]:
    """The offending phrases of ``text`` (after setting aside citations of existing bench files),
    each with a little context."""
    clean = _without_bench_citations(text)
    found = []
    for m in OFFENCE.finditer(clean):
        line = clean.count("\n", 0, m.start()) + 1
        found.append(f"line {line}: ...{clean[max(0, m.start() - 40):m.end() + 20]!r}...")
    return found


def _user_facing_files() -> list[Path]:
    files = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files.append(path)
    return files


# --- the checker itself ------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "so its memory and step time can be off (issue #21)",
    "Issues #2 and #4 ask for it",
    "the option #18 asks for",
    "## Session 12 (2026-12-03, one H200)",
    "measured in session-5 and sessions 3 and 4",
    "run by the session_x2 harness",
    "fitted on calibration_h200x2_session77b.json",
    "the S10 work period",
    "cites bench/results/session99_h200_that_does_not_exist.json",
])
def test_checker_finds_work_periods_and_ticket_numbers(text: str) -> None:
    assert offences(text), text


@pytest.mark.parametrize("text", [
    "for (s0, lr0), (s1, lr1) in zip(points, points[1:])",
    "s3://KEY:SECRET@bucket; S3 clients read them",
    "color: '#1f77b4'; fig.add_subplot(111)",
    "dlmspec 0.2.0, megatron-core 0.16.1, a run's session of W&B",
    "a sequence of 4096 tokens on 8 GPUs",
])
def test_checker_leaves_ordinary_text_alone(text: str) -> None:
    assert offences(text) == [], offences(text)


def test_checker_sets_aside_a_citation_of_an_existing_bench_file() -> None:
    existing = sorted(p for p in BENCH_PATHS if OFFENDING_NAME.search(Path(p).name))
    if not existing:
        pytest.skip("no file under bench/ is named after a work period")
    assert offences(f"measured in `{existing[0]}`.") == []


# --- the repository ----------------------------------------------------------------------------


def test_no_user_facing_file_is_named_after_a_work_period_or_ticket() -> None:
    named = [p.relative_to(ROOT).as_posix() for p in _user_facing_files()
             if OFFENDING_NAME.search(p.name)]
    assert named == []


def test_no_user_facing_text_refers_to_a_work_period_or_ticket() -> None:
    bad = {}
    for path in _user_facing_files():
        if path.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found = offences(text)
        if found:
            bad[path.relative_to(ROOT).as_posix()] = found
    assert bad == {}, "\n".join(f"{k}: {v}" for k, v in bad.items())


# --- what the commands print and write on the bundled specs ------------------------------------


def _bundled_specs() -> list[str]:
    specs = ROOT / "specs"
    return sorted(p.relative_to(ROOT).as_posix() for p in specs.iterdir()
                  if p.suffix in (".toml", ".py") and p.name != "__init__.py")


@pytest.mark.parametrize("spec", _bundled_specs())
def test_validate_plan_and_compile_output_names_no_work_period_or_ticket(spec, tmp_path, monkeypatch, capsys) -> None:
    from dlmspec.cli import main

    monkeypatch.chdir(ROOT)
    out_dir = tmp_path / "out"
    runs = [["validate", spec], ["validate", spec, "--json"], ["plan", spec], ["plan", spec, "--json"],
            ["compile", spec, "-o", str(out_dir), "--force"]]
    for args in runs:
        code = main(args)
        captured = capsys.readouterr()
        assert code in (0, 2), (args, code)
        found = offences(captured.out + captured.err)
        assert found == [], (args, found)
    written = [p for p in out_dir.rglob("*") if p.is_file()]
    assert written, f"compile {spec} wrote nothing"
    for path in written:
        found = offences(path.read_text(encoding="utf-8", errors="replace"))
        assert found == [], (path.relative_to(out_dir).as_posix(), found)


@pytest.mark.parametrize("calibrated", [True, False])
@pytest.mark.parametrize("impl", ["local+sdpa", "transformer_engine", "a-path-with-no-runs"])
def test_plan_calibration_line_names_no_ticket(impl: str, calibrated: bool) -> None:
    """The `calibration:` line `plan` prints, also for a layer path without calibration runs
    (`UNCALIBRATED for PATH`), which no bundled spec reaches."""
    from dlmspec.plan.provenance import calibration_text

    text = calibration_text(impl, calibrated, custom=False)
    assert impl in text and offences(text) == [], text


def test_changelog_is_by_release_and_its_newest_release_is_the_package_version() -> None:
    """CHANGELOG.md has an Unreleased section, then releases `## [X.Y.Z] - YYYY-MM-DD`, newest
    first; the newest is pyproject's version, which `dlmspec --version` prints."""
    import tomllib

    import dlmspec

    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert headings[0] == "[Unreleased]", headings[:2]
    releases = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}", h) for h in headings[1:]]
    assert releases and all(releases), headings
    versions = [tuple(int(x) for x in m.group(1).split(".")) for m in releases]
    assert versions == sorted(versions, reverse=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert releases[0].group(1) == project == dlmspec.__version__
