"""Packaging: the wheel holds the compiler, the runtime (``dlmspec.backends``), the
templates and the bundled specs, and works from a directory outside the checkout; the compiler
side never imports torch or megatron.

The wheel test builds the wheel from this checkout, installs it with ``--no-deps`` into a fresh
virtual environment that sees this environment's packages (pydantic, torch, megatron-core...)
through a ``.pth`` line, and runs ``new``, ``validate``, ``plan`` and ``compile`` there, then
imports every runtime module the generated train.py imports.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A folder with an ``__init__.py`` under a mapped folder that pyproject.toml does not list
    would be missing from the wheel (setuptools' explicit ``packages`` list)."""
    setuptools = _pyproject()["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for package, folder in setuptools["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join([package, *rel.parts]) if rel.parts else package)
    assert found == listed


def _fresh_venv(tmp_path: Path) -> Path:
    """A virtual environment without pip that sees this one's site-packages (not its .pth files,
    so not the editable install of this checkout)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    return python


def test_wheel_installs_and_compiles_outside_the_checkout(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("dlmspec-*.whl")
    python = _fresh_venv(tmp_path)
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                                "--no-index", "-q", str(wheel)], capture_output=True, text=True)
    assert installed.returncode == 0, installed.stderr

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    def dlmspec(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(python), "-m", "dlmspec.cli", *argv], cwd=work, env=env,
                              capture_output=True, text=True)

    where = subprocess.run([str(python), "-c", "import dlmspec, dlmspec.backends; print(dlmspec.__file__, "
                            "dlmspec.backends.__file__)"], cwd=work, env=env, capture_output=True, text=True)
    assert where.returncode == 0, where.stderr
    assert str(ROOT) not in where.stdout and "site-packages" in where.stdout
    for argv in (["new", "starter.toml", "--preset", "qwen3-0.6b", "--gpu", "h200", "--gpus-per-node", "1"],
                 ["new", "demo.toml", "--from", "demo-ar"],
                 ["validate", "starter.toml"],
                 ["plan", "starter.toml"],
                 ["compile", "starter.toml", "-o", "out"]):
        done = dlmspec(*argv)
        assert done.returncode == 0, (argv, done.stdout, done.stderr)
    assert "dlmspec new --from demo-ar" in (work / "demo.toml").read_text()

    tree = ast.parse((work / "out" / "train.py").read_text())
    runtime = sorted({node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dlmspec.")})
    assert runtime, "train.py imports no dlmspec runtime module"
    imported = subprocess.run([str(python), "-c", "import importlib, sys\nfor m in sys.argv[1:]: "
                               "print(importlib.import_module(m).__file__)", *runtime],
                              cwd=work, env=env, capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert str(ROOT) not in imported.stdout


def test_new_from_refuses_an_unknown_bundled_spec(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "dlmspec.cli", "new", str(tmp_path / "x.toml"), "--from", "nope"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "demo-dlm" in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.toml").exists()


@pytest.mark.parametrize("argv", [["compile", "specs/demo-dlm.toml", "-o", "{out}"],
                                  ["show", "specs/demo-dlm.toml"], ["new", "{out}.toml", "--from", "demo-dlm"]])
def test_the_compiler_never_imports_torch_or_megatron(tmp_path: Path, argv: list[str]) -> None:
    """validate and plan are covered by tests/integration/cli/test_cli.py; compile, show and new here."""
    argv = [a.replace("{out}", str(tmp_path / "out")) for a in argv]
    code = ("import sys\nfrom dlmspec.cli import main\n"
            f"code = main({argv!r})\n"
            "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron', "
            "'transformer_engine') or m.startswith('dlmspec.backends')))\nsys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rsplit("HEAVY", 1)[1].strip() == "[]"
