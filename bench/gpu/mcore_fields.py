"""megatron-core's config field names, read from its source without importing it.

train.py passes keywords to three megatron-core dataclasses: ``TransformerConfig`` (with the fields
it inherits from ``ModelParallelConfig``), ``DistributedDataParallelConfig`` and ``OptimizerConfig``.
This reads their fields from a megatron-core wheel, an installed package folder or a source tree
with :mod:`ast` (the annotated assignments of each class body and its bases in the same files, minus
``ClassVar``s), so a version that needs another Python (0.19.2: Python 3.12) is recorded on any
machine, and writes ``{"version": ..., "source": ..., "classes": {name: [field, ...]}, "literals":
{"Class.field": [value, ...]}}`` (the string values of each ``Literal``-typed field, e.g.
``TransformerConfig.fp8_recipe``).

    python3 bench/gpu/mcore_fields.py .whl/mc19/megatron_core-0.19.2-*.whl bench/results/mcore_0.19.2_fields.json
    python3 bench/gpu/mcore_fields.py --installed OUT.json    # the megatron-core this Python imports

The CPU tests check the extractor against ``dataclasses.fields`` of the installed 0.16.1 and every
keyword train.py writes against the recorded 0.19.2 fields (tests/unit/runtime/test_te_mcore_fields.py).
Exit code 2 on a file that is not megatron-core.
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from pathlib import Path
from typing import Callable, Dict, List, Optional

#: class -> (module file under megatron/core, base classes to include from the files read).
CLASSES: Dict[str, str] = {
    "ModelParallelConfig": "megatron/core/model_parallel_config.py",
    "TransformerConfig": "megatron/core/transformer/transformer_config.py",
    "DistributedDataParallelConfig": "megatron/core/distributed/distributed_data_parallel_config.py",
    "OptimizerConfig": "megatron/core/optimizer/optimizer_config.py",
}
#: The classes recorded (ModelParallelConfig's fields are TransformerConfig's too).
RECORDED = ("TransformerConfig", "DistributedDataParallelConfig", "OptimizerConfig")


def _reader(source: Path) -> Callable[[str], Optional[str]]:
    """``path -> text`` (``None`` when absent) for a wheel, or a folder holding ``megatron/``."""
    if source.is_file() and source.suffix == ".whl":
        archive = zipfile.ZipFile(source)
        names = set(archive.namelist())
        return lambda path: archive.read(path).decode("utf-8") if path in names else None
    return lambda path: (source / path).read_text(encoding="utf-8") if (source / path).is_file() else None


def _class_nodes(text: str) -> Dict[str, ast.ClassDef]:
    return {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}


def _own_fields(node: ast.ClassDef) -> List[str]:
    out = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            out.append(stmt.target.id)
    return out


def read_fields(source: Path) -> Dict[str, object]:
    """``{"version", "classes": {class: sorted fields}}`` of the megatron-core at ``source``.

    Raises:
        ValueError: when a class's file or the class itself is not there.
    """
    read = _reader(source)
    nodes: Dict[str, ast.ClassDef] = {}
    for name, path in CLASSES.items():
        text = read(path)
        if text is None:
            raise ValueError(f"{source}: no {path} (not a megatron-core wheel or folder)")
        found = _class_nodes(text)
        if name not in found:
            raise ValueError(f"{source}: {path} defines no class {name}")
        nodes[name] = found[name]

    def fields(name: str) -> List[str]:
        node = nodes[name]
        inherited: List[str] = []
        for base in node.bases:
            base_name = ast.unparse(base).split(".")[-1]
            if base_name in nodes:
                inherited += fields(base_name)
        return inherited + [f for f in _own_fields(node) if f not in inherited]

    version = None
    text = read("megatron/core/package_info.py")
    if text:
        scope: Dict[str, object] = {}
        for stmt in ast.parse(text).body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name) and isinstance(stmt.value, ast.Constant):
                scope[stmt.targets[0].id] = stmt.value.value
        if {"MAJOR", "MINOR", "PATCH"} <= set(scope):
            version = f"{scope['MAJOR']}.{scope['MINOR']}.{scope['PATCH']}"
    literals: Dict[str, List[str]] = {}
    for name in RECORDED:
        for cls in [name] + [ast.unparse(b).split(".")[-1] for b in nodes[name].bases if ast.unparse(b).split(".")[-1] in nodes]:
            for stmt in nodes[cls].body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    values = [n.value for n in ast.walk(stmt.annotation) if isinstance(n, ast.Constant)
                              and isinstance(n.value, str)]
                    if "Literal" in ast.unparse(stmt.annotation) and values:
                        literals.setdefault(f"{name}.{stmt.target.id}", sorted(set(values)))
    return {"version": version, "source": source.name, "classes": {n: sorted(fields(n)) for n in RECORDED},
            "literals": dict(sorted(literals.items()))}


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    src, out = argv
    if src == "--installed":
        import megatron.core  # noqa: F401  (only for its location)

        source = Path(megatron.core.__file__).parents[2]
    else:
        source = Path(src)
    try:
        record = read_fields(source)
    except (ValueError, OSError, zipfile.BadZipFile, SyntaxError) as exc:
        print(f"mcore_fields.py: {exc}", file=sys.stderr)
        return 2
    if src == "--installed":
        record["source"] = "installed"
    Path(out).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"megatron-core {record['version']}: " + ", ".join(f"{k} {len(v)}" for k, v in record["classes"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
