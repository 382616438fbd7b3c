"""Every checkpoint load in backends/ and templates/ goes through
``dlmspec.backends.checkpoint_safety``: no other module calls ``dist_checkpointing.load`` /
``load_tensors_metadata``, ``torch.distributed.checkpoint.load``, ``FileSystemReader`` /
``read_metadata``, ``pickle.load(s)``, or ``torch.load`` without ``weights_only=True``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SAFE_MODULE = ROOT / "backends" / "checkpoint_safety.py"

#: Modules whose ``load``-like functions unpickle a checkpoint.
_CKPT_MODULES = {"megatron.core.dist_checkpointing", "megatron.core.dist_checkpointing.serialization",
                 "torch.distributed.checkpoint", "torch.distributed.checkpoint.state_dict_loader"}
_LOADS = {"load", "load_tensors_metadata", "load_state_dict", "load_common_state_dict", "load_sharded_metadata",
          "load_plain_tensors", "load_content_metadata", "async_load"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def bypasses(source: str, name: str = "<source>") -> list[str]:
    """``"name:line: what"`` for each checkpoint read in Python ``source`` that does not go
    through ``checkpoint_safety``."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> module it is bound to
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                aliases[a.asname or a.name] = full
                if (node.module in _CKPT_MODULES and a.name in _LOADS) or a.name == "FileSystemReader":
                    found.append(f"{name}:{node.lineno}: imports {full}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Name, ast.Attribute)):
            leaf = node.id if isinstance(node, ast.Name) else node.attr
            if leaf == "FileSystemReader" and not isinstance(getattr(node, "ctx", None), ast.Store):
                found.append(f"{name}:{node.lineno}: uses FileSystemReader")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if not isinstance(func, ast.Attribute):
            continue
        owner = _dotted(func.value)
        head, _, rest = owner.partition(".")
        module = aliases.get(head, head) + (f".{rest}" if rest else "")
        if func.attr in _LOADS and module in _CKPT_MODULES:
            found.append(f"{name}:{node.lineno}: calls {module}.{func.attr}")
        elif func.attr == "read_metadata" and aliases.get(owner, owner) != "dlmspec.backends.checkpoint_safety":
            found.append(f"{name}:{node.lineno}: calls {owner}.read_metadata")
        elif func.attr in ("load", "loads") and aliases.get(owner, owner) == "pickle":
            found.append(f"{name}:{node.lineno}: calls pickle.{func.attr}")
        elif func.attr == "load" and aliases.get(owner, owner) == "torch":
            weights_only = [k for k in node.keywords if k.arg == "weights_only"]
            if not (weights_only and isinstance(weights_only[0].value, ast.Constant)
                    and weights_only[0].value.value is True):
                found.append(f"{name}:{node.lineno}: calls torch.load without weights_only=True")
    return found


_TEMPLATE_READS = re.compile(r"dist_checkpointing\.load|load_tensors_metadata|FileSystemReader|read_metadata|"
                             r"dcp\.load|checkpoint\.load\(|torch\.load\(|pickle\.loads?\(")


def test_the_checker_finds_each_kind_of_direct_checkpoint_read() -> None:
    source = "\n".join([
        "import pickle, torch",
        "import torch.distributed.checkpoint as dcp",
        "from megatron.core import dist_checkpointing",
        "from megatron.core import dist_checkpointing as dc",
        "from torch.distributed.checkpoint import FileSystemReader",
        "dist_checkpointing.load(s, p)",
        "dc.load_tensors_metadata(p)",
        "dcp.load(s, storage_reader=r)",
        "r.read_metadata()",
        "pickle.loads(b)",
        "torch.load(f)",
        "torch.load(f, weights_only=False)",
    ])
    found = bypasses(source)
    assert sorted(int(f.split(":")[1]) for f in found) == list(range(5, 13)), found
    assert bypasses("from dlmspec.backends import checkpoint_safety\n"
                    "checkpoint_safety.read_metadata(p)\ncheckpoint_safety.dist_load(s, p)\n"
                    "torch.load(f, weights_only=True)\n") == []


def test_no_module_in_backends_reads_a_checkpoint_around_checkpoint_safety() -> None:
    found = []
    for path in sorted((ROOT / "backends").rglob("*.py")):
        if path != SAFE_MODULE:
            found += bypasses(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], "checkpoint reads that bypass dlmspec.backends.checkpoint_safety:\n" + "\n".join(found)


def test_no_template_reads_a_checkpoint_around_checkpoint_safety() -> None:
    found = []
    for path in sorted((ROOT / "templates").glob("*.j2")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if _TEMPLATE_READS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == [], "checkpoint reads in templates that bypass checkpoint_safety:\n" + "\n".join(found)
