"""The shape of the code base (docs/architecture.md, "Layers"): no import cycle among dlmspec's
modules, no import from a later layer to an earlier one (:data:`LAYERS`: base, spec, resolve, the
planner's model, check, the layout search, render, cli), and no module over 800 lines in dlmspec/
or backends/ except generated files (which start with dlmspec.generated.MARKER)."""

from __future__ import annotations

import ast
from pathlib import Path

from dlmspec.generated import MARKER

ROOT = Path(__file__).resolve().parents[3]

#: The layers, earliest first: a module may import its own layer and the layers before it, never a
#: later one. Matched by the longest prefix of the module name; docs/architecture.md shows the
#: same table. The shared base (errors, files, escaping, catalogs, data) is below the pipeline.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("dlmspec", "dlmspec.errors", "dlmspec.files", "dlmspec.escape", "dlmspec.credentials", "dlmspec.gpus",
              "dlmspec.params", "dlmspec.flops", "dlmspec.tokenizers", "dlmspec.generate_settings",
              "dlmspec.generated", "dlmspec.data", "dlmspec.names", "dlmspec.layout", "dlmspec.pipeline_split",
              "dlmspec.attention",
              "dlmspec.objectives", "dlmspec.stages", "dlmspec.tasks", "dlmspec.generate_presets",
              "dlmspec.wording", "dlmspec.rl")),
    ("spec", ("dlmspec.spec",)),
    ("resolve", ("dlmspec.resolve",)),
    ("plan", ("dlmspec.plan",)),
    ("check", ("dlmspec.check",)),
    ("search", ("dlmspec.plan.search", "dlmspec.plan.report")),
    ("render", ("dlmspec.render",)),
    ("cli", ("dlmspec.cli", "dlmspec.data.cli", "dlmspec.dsl", "dlmspec.scaling")),
]

#: Known arrows back up, each with its reason; the lead removes an entry when its arrow goes.
BACKWARD_ALLOWED: set[tuple[str, str]] = set()

#: Modules still over 800 lines that other work splits; the lead removes entries at merge.
LONG_ALLOWED: set[str] = set()

MAX_LINES = 800


def _modules() -> dict[str, Path]:
    """dlmspec module name -> file, for dlmspec/ (the compiler; backends/ is the runtime)."""
    out = {}
    for path in sorted((ROOT / "dlmspec").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The dlmspec modules ``name`` (at ``path``) imports, anywhere in the file (functions
    included), leaving out ``if TYPE_CHECKING:`` blocks (never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (its longest matching prefix; the package root
    ``dlmspec`` matches only itself, so a new top-level module must be placed in the table)."""
    best, rank = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (prefix != "dlmspec" and module.startswith(prefix + "."))
            if matches and len(prefix) > best:
                best, rank = len(prefix), index
    assert rank is not None, f"{module} is in no layer of LAYERS: add it to the table (and docs/architecture.md)"
    return rank


def test_no_import_runs_from_a_later_pipeline_stage_back_to_an_earlier_one() -> None:
    backwards = sorted(f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
                       for a, targets in _graph().items() for b in targets
                       if not b.startswith(a + ".") and _layer(b) > _layer(a) and (a, b) not in BACKWARD_ALLOWED)
    assert not backwards, "\n".join(backwards)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_among_dlmspec_modules() -> None:
    """Counting every import (those inside functions too, but not a package's import of its own
    modules, which Python runs first)."""
    graph = {a: {b for b in targets if not b.startswith(a + ".") and not a.startswith(b + ".")}
             for a, targets in _graph().items()}
    assert not _cycles(graph), _cycles(graph)


def test_no_module_over_800_lines_except_generated_files() -> None:
    """dlmspec/ and backends/: a module past 800 lines is split by concern; a generated file (its
    first line dlmspec.generated.MARKER) is exempt; LONG_ALLOWED lists those other work splits."""
    long = []
    for folder in ("dlmspec", "backends"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            relative = path.relative_to(ROOT).as_posix()
            if text.count("\n") > MAX_LINES and not text.startswith(MARKER + "\n") and relative not in LONG_ALLOWED:
                long.append(f"{relative}: {text.count(chr(10))} lines")
    assert not long, "\n".join(long)
