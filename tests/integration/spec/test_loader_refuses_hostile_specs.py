"""dlmspec.spec.load on hostile files: deep nesting, endless or blocking files, huge files, long
``extends`` chains and deep ``--set`` values are refused with one issue (file, key, value, why,
fix), the same with and without the fast path (dlmspec.spec.fast), never a RecursionError,
MemoryError or hang."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from dlmspec.errors import SpecError, SpecIssue
from dlmspec.spec.dotted import MAX_DEPTH
from dlmspec.spec.load import load
from dlmspec.spec.read import MAX_EXTENDS, MAX_SPEC_BYTES

ROOT = Path(__file__).resolve().parents[3]
DEMO = (ROOT / "specs" / "demo-dlm.toml").read_text(encoding="utf-8")


def _issue(path: Path, overrides: tuple[str, ...] = ()) -> SpecIssue:
    """The one issue both loaders (fast and pydantic) report for ``path``; they must agree."""
    found = []
    for fast in (True, False):
        with pytest.raises(SpecError) as info:
            load(path, overrides, fast=fast)
        found.append(info.value.issues)
    assert found[0] == found[1], "the fast path and the pydantic path disagree"
    (issue,) = found[0]
    assert issue.severity == "error" and issue.hint and issue.value is not None and issue.file, issue
    return issue


def _spec(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``dlmspec ARGS`` in a subprocess under a 1 GiB address-space limit and a 20 s timeout."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dlmspec.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=20, preexec_fn=limit)


# --- deep nesting ---------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 3000])
@pytest.mark.parametrize("kind", ["array", "inline-table"])
def test_deeply_nested_values_are_refused(tmp_path: Path, kind: str, depth: int) -> None:
    value = "[" * depth + "]" * depth if kind == "array" else "{a = " * depth + "1" + "}" * depth
    description = next(line for line in DEMO.splitlines() if line.startswith("description = "))
    path = _spec(tmp_path, DEMO.replace(description, f"description = {value}"))
    issue = _issue(path)
    line = DEMO.splitlines().index(description) + 1  # the demo's description line
    assert issue.key.startswith("description") and issue.line == line and issue.file == str(path)
    assert "nested" in issue.message and str(MAX_DEPTH) in issue.message


@pytest.mark.parametrize("form", ["dotted", "header"])
def test_deeply_dotted_keys_and_tables_are_refused(tmp_path: Path, form: str) -> None:
    dotted = ".".join(["a"] * 3000)
    extra = f"x.{dotted} = 1\n" if form == "dotted" else f"[x.{dotted}]\nb = 1\n"
    path = _spec(tmp_path, extra + DEMO)
    issue = _issue(path)
    assert issue.key.startswith("x.a.a") and issue.line == 1 and "nested" in issue.message


def test_nesting_at_the_limit_loads(tmp_path: Path) -> None:
    """The limit is far above real specs: a value nested MAX_DEPTH - 2 deep under cluster.slurm.env
    reaches the schema (which refuses it as a wrong type, not as too deep)."""
    inner = "[" * (MAX_DEPTH - 4) + "]" * (MAX_DEPTH - 4)
    path = _spec(tmp_path, DEMO + f"\n[cluster.slurm.env]\nX = {inner}\n")
    with pytest.raises(SpecError) as info:
        load(path)
    assert [i.rule for i in info.value.issues] == ["schema"]


def test_a_python_spec_that_builds_a_deep_or_cyclic_dict_is_refused(tmp_path: Path) -> None:
    for body in ("d = {}\nnode = d\nfor _ in range(5000):\n    node['a'] = {}\n    node = node['a']\nspec = d\n",
                 "d = {'name': 'x'}\nd['model'] = d\nspec = d\n"):
        path = _spec(tmp_path, body, "deep.py")
        issue = _issue(path)
        assert issue.key.split(".")[0] in ("a", "model") and "nested" in issue.message


# --- files that are not regular, or too large -----------------------------------------------


def test_extends_dev_zero_is_refused(tmp_path: Path) -> None:
    path = _spec(tmp_path, 'extends = "/dev/zero"\n')
    issue = _issue(path)
    assert (issue.key, issue.value, issue.line) == ("extends", "/dev/zero", 1)
    assert "character device" in issue.message and "not a regular file" in issue.message


def test_a_large_file_is_refused_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    with open(big, "wb") as handle:
        handle.truncate(MAX_SPEC_BYTES + 1)  # sparse: nothing is written
    issue = _issue(big)
    assert issue.key == "<file>" and "4 MiB" in issue.message
    child = _spec(tmp_path, 'name = "x"\nextends = "big.toml"\n', "child.toml")
    issue = _issue(child)
    assert (issue.key, issue.value, issue.line, issue.file) == ("extends", "big.toml", 2, str(child))
    assert "4 MiB" in issue.message
    py = tmp_path / "big.py"
    os.link(big, py)
    assert "4 MiB" in _issue(py).message


def test_python_spec_that_is_a_device_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.py"
    link.symlink_to("/dev/zero")
    issue = _issue(link)
    assert "character device" in issue.message


@pytest.mark.parametrize("command, target", [("validate", "fifo.toml"), ("validate", "fifo.py"),
                                             ("validate", "/dev/zero"), ("validate", "child.toml"),
                                             ("plan", "fifo.toml"), ("show", "child.toml")])
def test_cli_refuses_fifos_and_devices_without_hanging(tmp_path: Path, command: str, target: str) -> None:
    os.mkfifo(tmp_path / "fifo.toml")
    os.mkfifo(tmp_path / "fifo.py")
    _spec(tmp_path, 'extends = "fifo.toml"\n', "child.toml")
    done = _cli(command, target, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "not a regular file" in done.stderr
    assert ("named pipe" if target != "/dev/zero" else "character device") in done.stderr


# --- extends chains -------------------------------------------------------------------------


def _chain(tmp_path: Path, length: int) -> Path:
    _spec(tmp_path, DEMO, "c0.toml")
    for i in range(1, length):
        _spec(tmp_path, f'extends = "c{i - 1}.toml"\n', f"c{i}.toml")
    return tmp_path / f"c{length - 1}.toml"


@pytest.mark.parametrize("length", [MAX_EXTENDS + 1, 1000])
def test_long_extends_chains_are_refused(tmp_path: Path, length: int) -> None:
    issue = _issue(_chain(tmp_path, length))
    assert issue.key == "extends" and issue.line == 1 and "chain" in issue.message
    assert str(MAX_EXTENDS) in issue.message


def test_extends_chain_at_the_limit_loads_and_cycles_are_still_found(tmp_path: Path) -> None:
    loaded = load(_chain(tmp_path, MAX_EXTENDS), fast=True)
    name_line = DEMO.splitlines().index('name = "demo-dlm"') + 1
    assert loaded.spec.name == "demo-dlm" and loaded.origins["name"] == (str(tmp_path / "c0.toml"), name_line)
    _spec(tmp_path, 'extends = "b.toml"\n', "a.toml")
    _spec(tmp_path, 'extends = "a.toml"\n', "b.toml")
    issue = _issue(tmp_path / "a.toml")
    assert issue.key == "extends" and "circular extends" in issue.message


# --- --set ----------------------------------------------------------------------------------


def test_deep_set_values_and_keys_are_refused(tmp_path: Path) -> None:
    path = _spec(tmp_path, DEMO)
    deep_key = ".".join(["a"] * 3000) + "=1"
    for item, key in (("description=" + "[" * 3000 + "]" * 3000, "description"),
                      ("description=" + "[" * MAX_DEPTH + "]" * MAX_DEPTH, "description"),
                      ("cluster.slurm.env.X=" + "[" * (MAX_DEPTH - 3) + "]" * (MAX_DEPTH - 3), "cluster.slurm.env.X"),
                      (deep_key, "a.a.a.a...")):
        issue = _issue(path, (item,))
        assert (issue.rule, issue.key, issue.file) == ("set", key, "--set"), item[:80]
        assert "nested" in issue.message and str(MAX_DEPTH) in issue.message
        assert issue.value == (item if len(item) <= 60 else item[:60] + "...")
