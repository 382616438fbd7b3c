"""The runtime's stages by ``[stage] kind``: what a compiled ``train.py`` builds and hands to train().

``train.py`` reads ``STAGES[kind](run, options)`` (:func:`build_stage`), ``options`` being the
stage's own settings (``[stage.sft]``: :class:`~dlmspec.backends.megatron.sft.SftConfig`;
pre-training has none). A stage of another package registers itself with :func:`register_stage`
when its module is imported (the compiler's stage registry, :mod:`dlmspec.stages`, names that
module for ``train.py`` to import).
"""

from __future__ import annotations

import importlib
from typing import Any, Dict

from .config import RunConfig
from .sft import SftStage
from .stage import PretrainStage

#: ``[stage] kind`` -> the stage class (``cls(run, options)`` builds it; see
#: :class:`~dlmspec.backends.megatron.stage.Stage`).
STAGES: Dict[str, type] = {"pretrain": PretrainStage, "sft": SftStage}

#: Stages of this package kept out of the import of this module (they import it): ``kind`` ->
#: the module that registers it (:func:`build_stage` imports it on first use).
_STAGE_MODULES: Dict[str, str] = {"rl": "dlmspec.backends.rl.stage"}


def register_stage(kind: str, cls: type) -> None:
    """Make ``cls`` the runtime stage of ``[stage] kind = kind``.

    Raises:
        ValueError: ``kind`` is empty or already names another class.
    """
    if not kind or not isinstance(kind, str):
        raise ValueError(f"a stage kind is a non-empty string, got {kind!r}")
    if STAGES.get(kind, cls) is not cls:
        raise ValueError(f"stage kind {kind!r} is already {STAGES[kind].__module__}.{STAGES[kind].__qualname__}")
    STAGES[kind] = cls


def build_stage(kind: str, run: RunConfig, options: Any = None) -> Any:
    """The stage of ``[stage] kind = kind`` for ``run`` with its ``options``.

    Raises:
        SystemExit: code 2 naming the kinds this runtime has, when ``kind`` is not one of them
            (a train.py compiled for a stage whose module was not imported, or a newer dlmspec).
    """
    cls = STAGES.get(kind)
    if cls is None and kind in _STAGE_MODULES:  # registers itself on import
        importlib.import_module(_STAGE_MODULES[kind])
        cls = STAGES.get(kind)
    if cls is None:
        raise SystemExit(f"train.py: stage.kind = {kind!r} has no runtime stage here (known: "
                         f"{', '.join(sorted(STAGES))}); install the dlmspec that compiled this file, or the "
                         "package that registers the stage")
    return cls(run, options)
