"""The import graph of dlmspec (the compiler) and dlmspec.backends (the runtime) has no cycle.

The graph is built from the AST of every module under dlmspec/ and backends/: every ``import``
and ``from ... import`` of a dlmspec module, at module level and inside functions alike (a lazy
import is an edge too: it runs whenever that function does). ``from pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. Importing ``a.b`` also runs ``a/__init__``;
that implicit edge is left out (a package's ``__init__`` importing its own submodules is no cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: Source folder -> its import name (pyproject's package-dir).
PACKAGES = {"dlmspec": "dlmspec", "backends": "dlmspec.backends"}


def modules() -> dict[str, Path]:
    """Every module: dotted name -> file."""
    found: dict[str, Path] = {}
    for folder, name in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([name, *parts])] = path
    return found


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def import_graph() -> dict[str, set[str]]:
    """Module -> the dlmspec modules it imports (anywhere in its code)."""
    mods = modules()
    graph: dict[str, set[str]] = {}
    for module, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:  # `import a.b.c` of a module a.b.c, else the deepest module named
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_graph_sees_lazy_and_relative_imports() -> None:
    """The graph holds function-level imports (the lazy ones) and the edges the folders promise."""
    graph = import_graph()
    assert "dlmspec.cli.commands" in graph["dlmspec.cli"]  # lazy, inside main()
    assert "dlmspec.cli.app" in graph["dlmspec.cli.commands"]
    assert "dlmspec.spec.models" in graph["dlmspec.spec.fast"]  # lazy, pydantic_twin()
    assert len(graph) > 50


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_package_inits_stay_light() -> None:
    """``import dlmspec.cli`` (the console script) and ``dlmspec.spec.load`` (validate's loader)
    import neither typer nor pydantic: the commands and the models are imported where used."""
    import subprocess
    import sys

    code = ("import sys, dlmspec.cli, dlmspec.spec.load, dlmspec.render\n"
            "print(sorted(m for m in ('typer', 'pydantic', 'jinja2', 'torch', 'dlmspec.cli.commands') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", out
