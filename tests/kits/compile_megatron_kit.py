"""Helpers shared by tests (moved from test_compile_megatron.py): _counter, _import."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import warnings
from pathlib import Path
from types import ModuleType


_counter = itertools.count()


def _import(train: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"compiled_train_{next(_counter)}", train)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(module)
    return module
