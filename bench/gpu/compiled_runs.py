"""What the GPU drivers of compiled configurations share (``te_matrix.py``, ``te_calibration.py``):
``dlmspec compile`` in this process, a compiled train.py's checks (its literal keywords, its build
functions), killing a launch with every process below it, and the versions a run records.

Standard library only at import time: the drivers' ``--dry`` runs on CPU.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import signal
from pathlib import Path
from typing import Any, Dict, List


def compile_in_process(spec: str, dest: Path, sets: List[str]) -> tuple[int, str]:
    """``dlmspec compile SPEC -o DEST --force --set S ...`` in this process; (exit code, console output)."""
    from dlmspec.cli import main as dlmspec

    argv = ["compile", spec, "-o", str(dest), "--force"] + [a for s in sets for a in ("--set", s)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = dlmspec(argv)
        except SystemExit as exc:  # typer's standalone mode
            code = int(exc.code or 0)
    return int(code or 0), buf.getvalue()


def train_py_keywords(text: str) -> Dict[str, Any]:
    """The literal keyword arguments of every call in a train.py (last one wins per name)."""
    out: Dict[str, Any] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg:
                    try:
                        out[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        pass
    return out


def flags_wrong(want: Dict[str, Any], text: str) -> List[str]:
    """What a train.py (``text``) says other than ``want`` (keyword -> literal value; ``None``: the
    keyword must be absent): ``["keyword: want X, got Y", ...]`` ([] = right)."""
    got = train_py_keywords(text)
    return [f"{key}: want {value!r}, got {got.get(key)!r}" for key, value in want.items() if got.get(key) != value]


def call_train_py(train_py: Path, module_name: str, *functions: str) -> List[Any]:
    """Execute a compiled train.py as module ``module_name`` and call its ``functions`` (no
    arguments, in order) with warnings silenced; returns their results. Raises what the file raises
    (megatron-core's config checks: no CUDA needed for ``build_configs`` / ``build_run``)."""
    import warnings

    spec = importlib.util.spec_from_file_location(module_name, train_py)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
        return [getattr(module, f)() for f in functions]


def descendants(pid: int) -> List[int]:
    """The ids of every process below ``pid`` (children first), read from ``/proc``."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to every process below ``pid``, then to its process group (``pid`` started in a
    session of its own): torchrun starts its workers in sessions of their own
    (torch.distributed.elastic's subprocess handler), which a signal to the group alone would leave running."""
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def versions() -> Dict[str, Any]:
    """torch, megatron-core, Transformer Engine, dlmspec (each import's version or file, or why it
    does not import) and ``gpu`` (device 0's name; ``None`` without CUDA)."""
    out: Dict[str, Any] = {}
    for mod in ("torch", "megatron.core", "transformer_engine", "dlmspec"):
        try:
            m = __import__(mod, fromlist=["x"])
            out[mod] = getattr(m, "__version__", None) or str(getattr(m, "__file__", ""))
        except Exception as exc:
            out[mod] = f"not importable: {type(exc).__name__}"
    with contextlib.suppress(Exception):
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out
