"""The suite's own rules, read from each test module's syntax tree (tests/kits/suite_kit.py):

- where a test goes: ``tests/unit/<concern>/`` holds modules that import no torch or megatron-core
  at module level (directly or through what they import) and start no process; every other test
  goes to ``tests/integration/<concern>/``; benchmark tests to ``bench/bench_tests/``;
- helpers tests share live in ``tests/kits/*.py`` (on ``sys.path``), never in a test module: no
  test module (nor kit) imports a test module;
- a whole spec is built by the one factory (``spec_dict`` / ``spec_file``, tests/kits/spec_kit.py),
  never written out as a module-level dict or TOML literal;
- file and test names say the behaviour they check (never "fix", "hardening", "session" or
  "issue"), and no test cites an issue number or a work period.

Each failure names the file and the fix.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import suite_kit

ROOT = suite_kit.ROOT
TESTS = ROOT / "tests"
UNIT = TESTS / "unit"
INTEGRATION = TESTS / "integration"
KITS = suite_kit.KITS


def _python_files() -> list[Path]:
    found = [p for p in sorted(TESTS.rglob("*.py")) if "compiled" not in p.relative_to(TESTS).parts]
    return found + sorted((ROOT / "bench" / "bench_tests").glob("*.py"))


FILES = _python_files()
TEST_FILES = [p for p in FILES if p.name.startswith("test_")]
UNIT_FILES = [p for p in TEST_FILES if UNIT in p.parents]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _concern(path: Path) -> str:
    parts = path.relative_to(TESTS).parts
    return parts[1] if len(parts) > 2 else "<concern>"


#: Words a test file or test function name may not hold (as a whole word between underscores).
NAME_WORDS = re.compile(r"(?:^|_)(fix|fixes|fixed|hardening|session|sessions|issue|issues)(?:_|$)")
#: An issue number or a work period cited in a test's text: "issue 12", "issues 3", "#35", "session 4".
CITATION = re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/\"'])#\d+\b(?!:)|\b[Ss]essions? \d+")
#: The checkers of citations themselves hold examples of them.
CITATION_CHECKERS = (TESTS / "unit" / "suite" / "test_suite_rules.py", TESTS / "integration" / "project" / "test_user_facing_text.py",
                     ROOT / "bench" / "bench_tests" / "test_results_text.py")


def test_test_files_sit_in_a_tier_or_beside_the_benchmarks() -> None:
    """A test module lies in tests/unit/<concern>/, tests/integration/<concern>/ or bench/bench_tests/."""
    misplaced = [f"{_rel(p)}: move it to tests/unit/<concern>/ (no torch, megatron-core or process) or "
                 f"tests/integration/<concern>/ (git mv)"
                 for p in TEST_FILES
                 if not (p.parent.parent in (UNIT, INTEGRATION) or p.parent == ROOT / "bench" / "bench_tests")]
    assert misplaced == [], "\n".join(misplaced)


def test_only_benchmark_tests_leave_ci_for_the_bench_tier() -> None:
    """``harness`` (left out of README's test command, so out of CI) marks benchmark tests only: every
    test of the product runs in CI."""
    found = [f"{_rel(p)}:{line} marks a test harness: only bench/bench_tests/ may (a product test runs in CI); "
             f"make it faster instead"
             for p in FILES if p.parent != ROOT / "bench" / "bench_tests" for line in suite_kit.harness_marks(p)]
    assert found == [], "\n".join(found)


def test_harness_marks_are_found(tmp_path: Path) -> None:
    probe = _probe(tmp_path, "import pytest\npytestmark = pytest.mark.harness\n"
                             "@pytest.mark.harness\ndef test_x():\n    pass\ndef test_y(harness):\n    pass\n")
    assert suite_kit.harness_marks(probe) == [2, 3]


def test_test_file_names_are_unique() -> None:
    """Test folders are not packages: two modules of one name would shadow each other."""
    seen: dict[str, Path] = {}
    clashes = []
    for p in FILES:
        if p.name in ("conftest.py", "__init__.py") or p.parent in (TESTS / "hostile", TESTS / "golden", ROOT / "bench" / "bench_tests"):
            continue
        if p.name in seen:
            clashes.append(f"{_rel(p)} and {_rel(seen[p.name])}: rename one (names say the behaviour)")
        seen[p.name] = p
    assert clashes == [], "\n".join(clashes)


def test_no_module_imports_a_test_module() -> None:
    found = [f"{_rel(p)} imports {name}: move what it needs into a kit (tests/kits/<name>_kit.py) and "
             f"import it from there in both"
             for p in FILES for name in suite_kit.test_imports(p)]
    assert found == [], "\n".join(found)


def test_unit_tests_import_no_torch_or_megatron_at_module_level() -> None:
    found = []
    for p in UNIT_FILES:
        heavy = suite_kit.heavy_imports(p)
        if heavy:
            found.append(f"{_rel(p)} imports {heavy[0]} when imported: move it to "
                         f"tests/integration/{_concern(p)}/ (git mv), or import it inside the tests that need it")
    assert found == [], "\n".join(found)


def test_unit_tests_start_no_process() -> None:
    found = []
    for p in UNIT_FILES:
        calls = suite_kit.subprocess_calls(p)
        if calls:
            found.append(f"{_rel(p)} starts a process ({calls[0]}): move it to tests/integration/{_concern(p)}/ "
                         f"(git mv), or run the command in-process (typer's CliRunner)")
    assert found == [], "\n".join(found)


#: TOML texts whose layout is what the tests read (a finding's line number, a format template with a
#: placeholder between tables, text edited line by line): module-level, name -> why it stays text.
TEXT_SPECS = {
    ("tests/unit/check/test_validate.py", "TOML"): "findings point at its lines",
    ("tests/unit/check/test_validate_rule_cases.py", "TOML"): "edited line by line, loaded with and without pydantic",
    ("tests/integration/plan/test_plan_json.py", "BIG"): "the memory finding points at line 10",
    ("tests/integration/runtime/test_toy_stage.py", "SPEC"): "a format template ({kind})",
    ("tests/unit/spec/test_hints.py", "BASE"): "a format template ({extra} between tables)",
    ("tests/unit/spec/test_names.py", "PARENT"): "a parent file whose run paths the tests rewrite",
    ("tests/kits/small_spec.py", "SMALL"): "the changes to spec_kit.DEFAULT that SMALL_SPEC and spec_file apply",
}


def test_whole_specs_come_from_the_spec_factory() -> None:
    found = [f"{hit}: build it with spec_dict(...) / spec_file(...) (tests/kits/spec_kit.py; fixtures of "
             f"the same names in tests/conftest.py), stating only what differs from spec_kit.DEFAULT"
             for p in FILES if p != KITS / "spec_kit.py" for hit in suite_kit.spec_literals(p)
             if (_rel(p), hit.split(" (")[0].split(":")[0]) not in TEXT_SPECS]
    assert found == [], "\n".join(found)


#: Spec-file writers of a test module's own that write a file spec_kit does not make (not a spec
#: from spec_kit.DEFAULT nor a dict): (module, function) -> why.
OWN_SPEC_WRITERS = {
    ("tests/integration/cli/test_plan_states_refusals.py", "_rl_spec"): "the bundled demo-dlm spec's text, edited",
    ("tests/integration/convert/test_convert_cli.py", "_spec_for"): "a model read from a checkpoint's config.json",
    ("tests/integration/runtime/test_toy_stage.py", "_spec"): "its SPEC format template ({kind})",
    ("tests/integration/spec/test_loader_refuses_hostile_specs.py", "_spec"): "hostile TOML text, no spec",
    ("tests/unit/check/test_block_diffusion_rules.py", "_spec_file"): "a child extending the bundled bd3 spec",
    ("tests/unit/generate/test_generate_follow_gen_length.py", "_spec"): "the bundled demo-dlm spec plus [generate]",
    ("tests/unit/secrets/test_secrets.py", "spec_file"): "SMALL_SPEC's text with hand-written TOML lines",
    ("tests/unit/secrets/test_secrets.py", "_spec_with_data_secret"): "SMALL_SPEC's text, edited line by line",
}


def test_no_test_module_writes_a_spec_file_with_a_helper_of_its_own() -> None:
    found = [f"{_rel(p)}: {hit} writes a spec file itself: use spec_kit.spec_file(folder, changes, "
             f"file_name=...) (or spec_kit.write_toml(path, data) for a spec built another way) from "
             f"tests/kits/spec_kit.py" for p in FILES if not p.is_relative_to(KITS)
             for hit in suite_kit.spec_writers(p) if (_rel(p), hit.split(" (")[0]) not in OWN_SPEC_WRITERS]
    assert found == [], "\n".join(found)


def test_file_and_test_names_say_the_behaviour() -> None:
    found = []
    for p in FILES:
        if NAME_WORDS.search(p.stem):
            found.append(f"{_rel(p)}: the file name holds {NAME_WORDS.search(p.stem).group(1)!r}; "
                         "name it after the behaviour its tests check (git mv)")
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                hit = NAME_WORDS.search(node.name)
                if hit:
                    found.append(f"{_rel(p)}:{node.lineno} {node.name} holds {hit.group(1)!r}: name the "
                                 "behaviour it checks (a refusal's remedy, a finding, ...)")
    assert found == [], "\n".join(found)


def test_no_test_cites_a_tracker_number_or_a_work_period() -> None:
    found = [f"{_rel(p)}:{n}: {m.group(0)!r}: say what the test checks, not where it came from"
             for p in FILES if p not in CITATION_CHECKERS
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in [CITATION.search(line)] if m]
    assert found == [], "\n".join(found)


# ------------------------------------------------------------------------------------------------
# the checks themselves, on hostile modules made in tmp_path


@pytest.mark.parametrize("text", [
    "import torch\n",
    "from megatron.core import parallel_state\n",
    "import pytest\ntorch = pytest.importorskip('torch')\n",
    "try:\n    import torch\nexcept ImportError:\n    pass\n",
    "from dlmspec.backends.megatron import attention\n",
])
def test_heavy_imports_are_found_at_module_level(tmp_path: Path, text: str) -> None:
    assert suite_kit.heavy_imports(_probe(tmp_path, text))


def test_imports_inside_functions_are_allowed(tmp_path: Path) -> None:
    assert suite_kit.heavy_imports(_probe(tmp_path, "def test_x():\n    import torch\n")) == []


@pytest.mark.parametrize("text", [
    "import subprocess\ndef test_x():\n    subprocess.run(['true'])\n",
    "from subprocess import run\n",
    "import os\ndef test_x():\n    os.system('true')\n",
])
def test_process_starts_are_found(tmp_path: Path, text: str) -> None:
    assert suite_kit.subprocess_calls(_probe(tmp_path, text))


def test_test_module_imports_are_found(tmp_path: Path) -> None:
    probe = _probe(tmp_path, "import test_other\nfrom test_more import x\ndef f():\n    from test_late import y\n")
    assert suite_kit.test_imports(probe) == ["test_other", "test_more", "test_late"]


@pytest.mark.parametrize("text", [
    "BASE = {'name': 't', 'model': {}, 'train': {}}\n",
    "SPEC: dict = {'model': {}, 'train': {}}\n",
    "TOML = '''\nname = \"t\"\n[model]\nnum_layers = 2\n[train]\nseq_length = 64\n'''\n",
])
def test_spec_literals_are_found(tmp_path: Path, text: str) -> None:
    assert suite_kit.spec_literals(_probe(tmp_path, text))


@pytest.mark.parametrize("text", [
    "import tomli_w\ndef spec_file(p, d):\n    p.write_text(tomli_w.dumps(d))\n",
    "from tomli_w import dumps\ndef _w(p, d):\n    p.write_text(dumps(d))\n",
    "import tomli_w\nclass K:\n    def write(self, f, d):\n        tomli_w.dump(d, f)\n",
])
def test_spec_writers_are_found(tmp_path: Path, text: str) -> None:
    assert suite_kit.spec_writers(_probe(tmp_path, text))


def test_hand_written_toml_in_a_spec_helper_is_a_spec_writer(tmp_path: Path) -> None:
    text = "def write_spec(p, name):\n    p.write_text(BASE.replace('t', name))\n"
    assert suite_kit.spec_writers(_probe(tmp_path, text)) == ["write_spec (line 1)"]


def test_toml_made_only_to_parse_is_no_spec_writer(tmp_path: Path) -> None:
    text = "import tomli_w\ndef _loads(d):\n    return load_text(tomli_w.dumps(d))\n"
    assert suite_kit.spec_writers(_probe(tmp_path, text)) == []


def test_a_test_that_dumps_toml_inline_is_no_spec_writer(tmp_path: Path) -> None:
    text = "import tomli_w\ndef test_x(tmp_path):\n    (tmp_path / 'a.toml').write_text(tomli_w.dumps({}))\n"
    assert suite_kit.spec_writers(_probe(tmp_path, text)) == []


def test_a_table_alone_is_no_spec_literal(tmp_path: Path) -> None:
    assert suite_kit.spec_literals(_probe(tmp_path, "MODEL = {'model': {'num_layers': 2}}\n")) == []


@pytest.mark.parametrize(("name", "bad"), [
    ("test_prefix_and_suffix_are_kept", False), ("test_fixture_is_shared", False),
    ("test_rule_fix_validates", True), ("test_issues_are_sorted", True), ("test_session_twelve", True),
])
def test_name_words_are_whole_words(name: str, bad: bool) -> None:
    assert bool(NAME_WORDS.search(name)) is bad


@pytest.mark.parametrize(("line", "bad"), [
    ("# issue 12's rules", True), ("see #35", True), ("measured in session 10", True),
    ("colour '#fff' and ids [3, 4]", False), ("a tissue 3 cm", False), ('"#1: --set tp=2"', False),
])
def test_citations_are_found(line: str, bad: bool) -> None:
    assert bool(CITATION.search(line)) is bad


def _probe(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "test_probe.py"
    path.write_text(text, encoding="utf-8")
    return path
