"""Checkpoint conversion between Hugging Face and megatron-core (dlmspec).

Public API:

* :class:`ModelDims` (``dlmspec.backends.convert.dims``) — plain dimensions + family, frozen dataclass.
* :func:`hf_to_mcore`, :func:`mcore_to_hf`, :func:`verify` (``dlmspec.backends.convert.api``).
* :class:`ConversionError` — every failure the converter reports.
* Layout helpers (``dlmspec.backends.convert.layout``): fused QKV / fc1, TP split and merge,
  vocabulary padding.
* Tensor names and shapes per family (``dlmspec.backends.convert.families``), ``config.json`` <->
  dimensions (``hf_config``), tensor checks (``checks``), state-dict conversion (``state_dict``),
  HF I/O (``hf_io``), megatron
  dist-checkpoint I/O (``mcore_io``), CPU GPTModel construction (``mcore_model``).
"""

from dlmspec.backends.convert.api import VerifyResult, hf_to_mcore, mcore_to_hf, verify
from dlmspec.backends.convert.dims import FAMILIES, ModelDims, padded_vocab_size
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.hf_config import dims_from_hf_config, hf_config_from_dims

__all__ = [
    "FAMILIES",
    "ConversionError",
    "ModelDims",
    "VerifyResult",
    "dims_from_hf_config",
    "hf_config_from_dims",
    "hf_to_mcore",
    "mcore_to_hf",
    "padded_vocab_size",
    "verify",
]
