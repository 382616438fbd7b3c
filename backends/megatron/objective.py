"""Training objectives: the names every caller imports, from :mod:`.objectives`.

The objectives are plugins (:mod:`dlmspec.backends.megatron.objectives`: ``prepare(batch, rng) ->
ObjectiveBatch`` for every kind; compiler halves in :mod:`dlmspec.objectives`). This module keeps
the import path ``dlmspec.backends.megatron.objective`` and :func:`build_objective`, which builds a
kind from an ``ObjectiveConfig`` through the registry (or, as before, from ``kind`` and keywords).
The losses (LLaDA's MDM estimator and weightings, variable length, AR's loss mask) and their
sources: docs/runtime.md, "Objectives".
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from dlmspec.objectives.mdm import CART_P_DEFAULT

from .objectives.ar import AutoregressiveObjective
from .objectives.base import (LOSS_NORMALIZATIONS, PER_MICRO_BATCH, ObjectiveBatch, ObjectiveRng, RuntimeObjective,
                              apply_loss_normalization, build_from_config, loss_triple, reduce_loss)
from .objectives.mdm import (LOSS_WEIGHTINGS, VARIABLE_LENGTHS, MaskedDiffusionObjective, cart_weights,
                             unshift_window)

__all__ = ["CART_P_DEFAULT", "LOSS_NORMALIZATIONS", "LOSS_WEIGHTINGS", "PER_MICRO_BATCH", "VARIABLE_LENGTHS",
           "AutoregressiveObjective", "MaskedDiffusionObjective", "ObjectiveBatch", "ObjectiveRng",
           "RuntimeObjective", "apply_loss_normalization", "build_objective", "cart_weights",
           "dataset_extra_token", "loss_triple", "reduce_loss", "unshift_window"]

#: An ``ObjectiveConfig``'s defaults, for :func:`build_objective`'s keyword form.
_KEYWORD_DEFAULTS = dict(mask_token_id=None, eps=1e-3, loss_weighting="llada", variable_length_prob=0.0,
                         min_masked_tokens=0, variable_length="sequence", shift=False, cart_p=CART_P_DEFAULT,
                         unshift=False, noise_schedule="linear", noise_schedule_exponent=1.0)


def build_objective(config: Any, *, length_multiple: int = 1, **settings: Any) -> RuntimeObjective:
    """The runtime objective of ``config`` through the registry (:func:`.objectives.build_from_config`).

    Args:
        config: an ``ObjectiveConfig`` (anything with ``kind`` and the objective's settings), or a
            kind name with the settings as keywords (``build_objective("mdm", mask_token_id=5)``).
        length_multiple: what a micro-batch cut's length is a multiple of (the layout's).

    Raises:
        ValueError: an unregistered kind, a missing ``mask_token_id`` for MDM, a bad setting.
        TypeError: keywords beside a config object.
    """
    if isinstance(config, str):
        config = SimpleNamespace(kind=config, **{**_KEYWORD_DEFAULTS, **settings})
    elif settings:
        raise TypeError(f"build_objective(config) takes no settings keywords, got {sorted(settings)}")
    return build_from_config(config, length_multiple=length_multiple)


def dataset_extra_token(objective: RuntimeObjective) -> bool:
    """megatron-core's ``GPTDatasetConfig.add_extra_token_to_sequence`` for ``objective``: ``True``
    (``seq_length + 1`` ids a sample, ``tokens = text[:-1]``, ``labels = text[1:]``) for next-token
    prediction and for the MDM ``unshift`` window (MegaDLMs' GPTDataset draws 2,049 ids and keeps its
    default ``True``, ``megatron/core/datasets/gpt_dataset.py:55,190-192``), else ``False`` (``seq_length``
    ids, all of which the MDM objective trains on). Each objective answers for itself."""
    return objective.dataset_extra_token()
