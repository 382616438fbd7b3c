"""``dlmspec --help`` and ``dlmspec CMD --help`` import the command declarations only: not the spec's
pydantic models, the rules, the compiler (jinja2), torch, nor (for the root help) the lazy sub-apps
``data`` and ``convert``. A test on what is imported; the time itself is bench/'s to measure."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: Modules no help may import: the spec models (pydantic models built), the rules, the compiler.
NEVER = ("dlmspec.spec.models", "dlmspec.check", "dlmspec.resolve", "dlmspec.plan", "dlmspec.render.compile",
         "jinja2", "torch", "megatron", "scipy")


def _imported_by(argv: list[str]) -> tuple[int, str, set[str]]:
    code = (
        "import io, json, sys, contextlib\n"
        "from dlmspec.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = main({argv!r})\n"
        "print(json.dumps([rc, out.getvalue(), sorted(sys.modules)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rc, text, modules = json.loads(done.stdout.strip().splitlines()[-1])
    return rc, text, set(modules)


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER))


def test_root_help_imports_no_models_rules_compiler_nor_lazy_sub_apps():
    rc, text, modules = _imported_by(["--help"])
    assert rc == 0 and "validate" in text and "convert" in text and "data" in text
    assert _heavy(modules) == []
    assert "dlmspec.data.cli" not in modules and "dlmspec.cli.convert" not in modules


@pytest.mark.parametrize("argv", [["validate", "--help"], ["plan", "--help"], ["show", "--help"],
                                  ["new", "--help"], ["compile", "--help"], ["submit", "-h"], ["schema", "--help"],
                                  ["generate", "--help"], ["convert", "--help"], ["plot", "--help"],
                                  ["fit", "--help"]])
def test_command_help_imports_no_models_rules_nor_compiler(argv):
    rc, text, modules = _imported_by(argv)
    assert rc == 0 and "Usage" in text
    assert _heavy(modules) == []


def test_root_help_still_lists_the_lazy_groups_help():
    _, text, _ = _imported_by(["--help"])
    assert "hf-to-mcore" in text and "data prepare" in text


def test_a_lazy_group_still_runs_after_root_help_listed_it():
    rc, text, _ = _imported_by(["convert", "--help"])
    assert rc == 0 and "hf-to-mcore" in text
