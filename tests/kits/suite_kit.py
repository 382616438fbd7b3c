"""What the suite's own rules read from a test module's source (tests/unit/suite/test_suite_rules.py).

Every answer comes from the module's syntax tree (``ast``), never from importing it:

- :func:`heavy_imports`: the torch / megatron imports a module runs when it is imported: its
  module-level statements (class bodies, ``if`` and ``try`` blocks included; function bodies
  excluded), ``pytest.importorskip("torch")`` among them, and those of every dlmspec, bench or kit
  module it imports at module level, followed transitively through their own module-level imports.
- :func:`subprocess_calls`: the calls anywhere in a module that start another process
  (``subprocess.*``, ``os.system``, ``os.popen``, ``os.exec*``, ``os.spawn*``, ``os.fork``,
  ``os.posix_spawn*``, ``multiprocessing``, ``asyncio.create_subprocess_*``, ``pty.spawn``), and
  those of the kit modules it imports. typer's ``CliRunner`` runs a command in-process: allowed.
- :func:`test_imports`: the test modules (``test_*.py``) a module imports.
- :func:`spec_literals`: module-level dict or string literals that hold a whole spec: a dict
  display with both ``"model"`` and ``"train"`` keys, or a string (or f-string) holding both a
  ``[model]`` and a ``[train]`` TOML table header.
- :func:`spec_writers`: the functions (tests excepted) whose own body turns a dict into TOML
  (``tomli_w.dumps`` / ``tomli_w.dump``) and writes it, or, named ``*spec*``, writes text: a
  spec-file writer of the module's own.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
KITS = TESTS / "kits"

#: Top-level packages whose import at module level keeps a test out of the unit tier.
HEAVY = ("torch", "megatron", "transformer_engine")

#: Where ``dlmspec.<x>`` and ``bench.<x>`` live in the checkout (backends/ installs as dlmspec.backends).
_PACKAGE_ROOTS = {"dlmspec.backends": ROOT / "backends", "dlmspec": ROOT / "dlmspec", "bench": ROOT / "bench"}

_PROCESS_CALLS = re.compile(
    r"^(subprocess\.\w+|os\.system|os\.popen|os\.exec\w*|os\.spawn\w*|os\.fork\w*|os\.posix_spawn\w*"
    r"|multiprocessing\.\w+|asyncio\.create_subprocess_\w+|pty\.spawn)$")
_PROCESS_MODULES = ("subprocess", "multiprocessing")


def _show(path: Path) -> str:
    """``path`` relative to the checkout when it lies inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _tree(path: Path) -> ast.Module:
    return _parse(str(path.resolve()))


@functools.lru_cache(maxsize=None)
def _parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def _module_level(tree: ast.Module):
    """The statements Python runs when the module is imported (not those inside functions)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                stack.append(child)
            elif isinstance(child, (ast.ExceptHandler, ast.match_case)):
                stack.extend(child.body)
        if isinstance(node, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
            yield from (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _imported_names(node: ast.AST, path: Path) -> list[str]:
    """Dotted module names an import statement (or ``pytest.importorskip``) loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            package = _package_of(path, node.level)
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        return [base] + [f"{base}.{alias.name}" for alias in node.names]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "importorskip"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [node.args[0].value]
    return []


def _package_of(path: Path, level: int) -> str:
    """The dotted package a relative import of ``level`` dots in ``path`` starts from."""
    if not path.resolve().is_relative_to(ROOT):
        return ""
    rel = path.resolve().relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "backends":
        parts = ["dlmspec", *parts]
    return ".".join(parts[:-level])


def _source_of(name: str) -> Path | None:
    """The file of a dlmspec, bench or kit module in the checkout, or None for anything else."""
    if "." not in name and (KITS / f"{name}.py").is_file():
        return KITS / f"{name}.py"
    for prefix, folder in _PACKAGE_ROOTS.items():
        if name == prefix or name.startswith(prefix + "."):
            rest = name[len(prefix):].lstrip(".").split(".") if name != prefix else []
            base = folder.joinpath(*rest) if rest else folder
            for candidate in (base.with_suffix(".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def _packages_along(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


_HEAVY_DONE: dict[str, frozenset[str]] = {}
_HEAVY_BUSY: set[str] = set()


def _heavy(path: Path) -> frozenset[str]:
    """The torch / megatron imports importing ``path`` runs (memoised; an import cycle adds nothing)."""
    key = str(path.resolve())
    if key in _HEAVY_DONE:
        return _HEAVY_DONE[key]
    if key in _HEAVY_BUSY:
        return frozenset()
    _HEAVY_BUSY.add(key)
    found: set[str] = set()
    for node in _module_level(_tree(path)):
        for name in _imported_names(node, path):
            if name.split(".")[0] in HEAVY:
                found.add(f"{name} ({_show(path)})")
                continue
            for step in _packages_along(name):
                source = _source_of(step)
                if source is not None:
                    found |= _heavy(source)
    _HEAVY_BUSY.discard(key)
    _HEAVY_DONE[key] = frozenset(found)
    return _HEAVY_DONE[key]


def heavy_imports(path: Path) -> list[str]:
    """``name (file)`` for each torch / megatron import that importing ``path`` runs."""
    return sorted(_heavy(path))


def _direct_process_calls(path: Path) -> list[str]:
    hits = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name and _PROCESS_CALLS.match(name):
                hits.append(f"{name} ({_show(path)}:{node.lineno})")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _PROCESS_MODULES:
            hits.append(f"from {node.module} import ... ({_show(path)}:{node.lineno})")
    return hits


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def subprocess_calls(path: Path) -> list[str]:
    """``call (file:line)`` for each process the module (or a kit it imports) can start."""
    hits = _direct_process_calls(path)
    for node in ast.walk(_tree(path)):
        for name in _imported_names(node, path) if isinstance(node, (ast.Import, ast.ImportFrom)) else []:
            source = _source_of(name)
            if source is not None and source.parent == KITS:
                hits += _direct_process_calls(source)
    return sorted(set(hits))


def test_imports(path: Path) -> list[str]:
    """The test modules (``test_*``) that ``path`` imports, anywhere in it."""
    names = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for name in _imported_names(node, path):
                if any(part.startswith("test_") for part in name.split(".")) and name not in names:
                    names.append(name)
    return [n for n in names if not any(m != n and n.startswith(m + ".") for m in names)]


def spec_literals(path: Path) -> list[str]:
    """``NAME (file:line)`` for each module-level literal that holds a whole spec."""
    hits = []
    for node in _tree(path).body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        if _is_spec_literal(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = ", ".join(ast.unparse(t) for t in targets)
            hits.append(f"{names} ({_show(path)}:{node.lineno})")
    return hits


def _is_spec_literal(value: ast.AST) -> bool:
    if isinstance(value, ast.Dict):
        keys = {k.value for k in value.keys if isinstance(k, ast.Constant)}
        return {"model", "train"} <= keys
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        text = value.value
    elif isinstance(value, ast.JoinedStr):
        text = "".join(v.value for v in value.values if isinstance(v, ast.Constant))
    else:
        return False
    return bool(re.search(r"^\s*\[model\]", text, re.M) and re.search(r"^\s*\[train\]", text, re.M))


#: Calls that write a file.
_FILE_WRITES = re.compile(r"(^|\.)(write_text|write_bytes|write|open|dump)$")


def _own_nodes(func: ast.AST):
    """The nodes of a function's own body: nested functions and classes left out (they are their own)."""
    stack = list(ast.iter_child_nodes(func))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def spec_writers(path: Path) -> list[str]:
    """``"name (line N)"`` for each function of the module at ``path`` (at any depth; ``test_*``
    functions excepted) whose own body both turns a dict into TOML (``tomli_w.dumps`` /
    ``tomli_w.dump``, imported as ``tomli_w`` or by name from it) and writes a file
    (``write_text``, ``write_bytes``, ``write``, ``open`` or ``tomli_w.dump``), or whose name holds
    ``spec`` and whose own body calls ``write_text`` (TOML text written by hand): a helper that
    writes a spec file itself instead of ``spec_kit.spec_file`` / ``spec_kit.write_toml``. A
    function that only parses the TOML text it made (never writes it) is no writer."""
    tree = _tree(path)
    by_name = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module == "tomli_w" for alias in node.names if alias.name in ("dumps", "dump")}
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or func.name.startswith("test_"):
            continue
        calls = [name for node in _own_nodes(func) if isinstance(node, ast.Call)
                 for name in [_dotted(node.func) or getattr(node.func, "attr", None)] if name]
        toml = any(name in ("tomli_w.dumps", "tomli_w.dump") or name in by_name for name in calls)
        named = "spec" in func.name.lower() and any(name.endswith("write_text") for name in calls)
        if (toml or named) and any(_FILE_WRITES.search(name) for name in calls):
            found.append(f"{func.name} (line {func.lineno})")
    return sorted(found, key=lambda hit: int(hit.rsplit(" ", 1)[1].rstrip(")")))


def harness_marks(path: Path) -> list[int]:
    """Lines where ``path`` marks a test ``harness`` (``pytest.mark.harness`` or ``mark.harness``: the
    bench tier, which README's test command leaves out)."""
    return sorted({node.lineno for node in ast.walk(_tree(path))
                   if isinstance(node, ast.Attribute) and node.attr == "harness"
                   and (_dotted(node.value) or "").endswith("mark")})
