"""Import a script of ``bench/`` (not a package) as a module, for the tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: Path, name: str) -> ModuleType:
    """Execute ``path`` as module ``name`` and register it in ``sys.modules`` (dataclasses and
    monkeypatch look modules up by name). ``path`` may be relative to the repository root."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name, path if path.is_absolute() else ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
