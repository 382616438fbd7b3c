"""Quiet megatron-core on a machine without a GPU, so the run's one-line refusal is what a user reads.

Importing megatron-core without Apex or Transformer Engine warns once per module (7 warnings, 14
lines with megatron-core 0.16: ``Transformer Engine and Apex are not installed. Falling back ...``,
``Apex is not installed. Falling back to Torch Norm``) and building a TransformerConfig may warn
again. On a GPU node those notes are worth reading; on a machine with no CUDA device the run stops
at its start checks (:func:`dlmspec.backends.megatron.distributed.cuda_problem`: "no CUDA
device ...", exit code 2) and the warnings only bury that line. The compiled ``train.py`` calls
:func:`quiet_megatron_without_gpu` before its first megatron-core import.
"""

from __future__ import annotations

import warnings

#: The modules whose warnings are ignored without a GPU (``warnings.filterwarnings``'s ``module``,
#: a regular expression matched against the module that warns).
MEGATRON_MODULES = r"megatron(\.|$)"


def quiet_megatron_without_gpu(cuda_available: bool | None = None) -> bool:
    """When no CUDA device is visible (``cuda_available``; ``None``: ``torch.cuda.is_available()``),
    ignore every warning megatron-core's modules raise for the rest of this process.

    Returns:
        Whether the warnings were silenced (``True``: no GPU).
    """
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return False
    warnings.filterwarnings("ignore", module=MEGATRON_MODULES)
    return True
