"""Checks of a checkpoint's tensors before conversion: names and shapes against the target
dimensions (:func:`check_tensors`, :func:`check_hf_checkpoint`, the layer count first), and each
weight's dtype and finiteness (:func:`check_weight`). Each failure is a
:class:`~dlmspec.backends.convert.errors.ConversionError` naming the tensor and what was expected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.families import IGNORED_HF_SUFFIXES, hf_global_names, expected_hf_shapes
from dlmspec.backends.convert.hf_config import config_key


def check_tensors(
    tensors: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    what: str,
    *,
    ignore: tuple[str, ...] = (),
    optional: frozenset[str] = frozenset(),
) -> None:
    """Raise on the first missing, unexpected or wrongly shaped tensor.

    Args:
        tensors: name -> tensor (anything with ``.shape``) or a lazy mapping whose values
            are only read through ``shape_of`` below (``.shape`` on a tensor, or a
            ``get_shape(name)`` method of the mapping).
        expected: name -> shape.
        what: a description of the checkpoint for the message ("Hugging Face llama").
        ignore: name suffixes that may be present and are skipped.
        optional: names that may be absent or present.

    Raises:
        ConversionError: naming the tensor and the expected shape (or that none was expected).
    """
    names = [n for n in tensors.keys() if not (ignore and n.endswith(ignore))]
    for name in expected:
        if name not in tensors and name not in optional:
            raise ConversionError(
                f"{what} checkpoint is missing tensor {name!r} (expected shape {expected[name]})",
                tensor=name,
                expected=expected[name],
            )
    for name in sorted(names):
        if name not in expected and name not in optional:
            raise ConversionError(
                f"{what} checkpoint has unexpected tensor {name!r} "
                f"(shape {_shape_of(tensors, name)}); no such tensor in the target config",
                tensor=name,
                expected=None,
            )
    for name, shape in expected.items():
        if name not in tensors:
            continue
        got = _shape_of(tensors, name)
        if tuple(got) != tuple(shape):
            raise ConversionError(
                f"{what} tensor {name!r} has shape {tuple(got)}, expected {tuple(shape)} "
                f"from the target config",
                tensor=name,
                expected=tuple(shape),
            )


def _shape_of(tensors: Mapping[str, Any], name: str) -> tuple[int, ...]:
    get_shape = getattr(tensors, "get_shape", None)
    if get_shape is not None:
        return tuple(get_shape(name))
    return tuple(tensors[name].shape)


def _layer_prefix(dims: ModelDims) -> str:
    return "model.transformer.blocks." if dims.family == "llada" else "model.layers."


def check_layer_count(hf: Mapping[str, Any], dims: ModelDims) -> None:
    """Refuse ``dims.num_layers`` larger than the layers a Hugging Face checkpoint holds.

    Runs before anything loops over the layers, so ``num_hidden_layers: 1000000000`` is an error
    at once, not an hour of building expected names. (More layers in the checkpoint than in the
    config are reported as unexpected tensors by :func:`check_tensors`.)

    Raises:
        ConversionError: naming the config key, its value and the layer count found.
    """
    prefix = _layer_prefix(dims)
    held = set()
    for name in hf.keys():
        if name.startswith(prefix):
            index = name[len(prefix):].split(".", 1)[0]
            if index.isdigit():
                held.add(int(index))
    if dims.num_layers <= len(held):
        return
    key = config_key(dims.family, "layers")
    path = getattr(hf, "path", None)
    where = f"{path / 'config.json'}: " if path is not None else ""
    span = f" ({prefix}{min(held)} to {prefix}{max(held)})" if held else ""
    raise ConversionError(
        f"{where}{key} = {dims.num_layers}, but the checkpoint holds {len(held)} layers{span}. "
        f"Fix: set {key} = {len(held)}",
        tensor=key,
        expected=len(held),
    )


def check_hf_checkpoint(hf: Mapping[str, Any], dims: ModelDims) -> None:
    """Check a Hugging Face checkpoint's tensor names and shapes against ``dims`` (header only
    for a :class:`dlmspec.backends.convert.hf_io.SafetensorsReader`).

    Raises:
        ConversionError: too few layers (:func:`check_layer_count`), or a missing, unexpected or
            wrongly shaped tensor (:func:`check_tensors`).
    """
    check_layer_count(hf, dims)
    g = hf_global_names(dims)
    optional = frozenset({g["lm_head"]}) if dims.tied else frozenset()
    check_tensors(hf, expected_hf_shapes(dims), f"Hugging Face {dims.family}", ignore=IGNORED_HF_SUFFIXES,
                  optional=optional)


#: Elements per ``isfinite`` pass (bounds the temporary mask to 16 MiB).
_FINITE_CHUNK = 1 << 24


def check_dtype(name: str, dtype: torch.dtype, where: str) -> None:
    """Refuse a weight dtype that is not floating point (int8, uint8, bool: a quantized checkpoint).

    Raises:
        ConversionError: naming the file (``where``), the tensor and its dtype.
    """
    if dtype.is_floating_point:
        return
    raise ConversionError(
        f"{where}: tensor {name!r} has dtype {str(dtype).removeprefix('torch.')}; the converter converts "
        "floating-point weights (float32, bfloat16, float16), not integer or quantized ones. Fix: convert an "
        "unquantized floating-point copy of the checkpoint",
        tensor=name,
        expected="a floating-point dtype",
    )


def check_weight(name: str, tensor: torch.Tensor, where: str) -> None:
    """Refuse a weight that is not floating point (int8, a quantized checkpoint) or holds NaN/Inf.

    Args:
        name: the tensor's name, for the message.
        tensor: the weight.
        where: the file or checkpoint it was read from, for the message.

    Raises:
        ConversionError: naming the file, the tensor, its dtype or its non-finite values.
    """
    check_dtype(name, tensor.dtype, where)
    flat = tensor.reshape(-1)
    if all(bool(torch.isfinite(chunk).all()) for chunk in flat.split(_FINITE_CHUNK)):
        return
    counts = [(int(torch.isnan(flat).sum()), "NaN"), (int(torch.isinf(flat).sum()), "Inf")]
    found = " and ".join(f"{n} {what}" for n, what in counts if n)
    raise ConversionError(
        f"{where}: tensor {name!r} holds non-finite values ({found} of {flat.numel()}), a diverged run or a "
        "corrupt file. Fix: convert an earlier checkpoint, or a fresh copy of the original",
        tensor=name,
        expected="finite values",
    )


class CheckedWeights(Mapping[str, torch.Tensor]):
    """``hf`` whose tensors pass :func:`check_weight` the first time each is read."""

    def __init__(self, hf: Mapping[str, torch.Tensor]):
        self._hf = hf
        self._checked: set[str] = set()

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self._hf[name]
        if name not in self._checked:
            file_of = getattr(self._hf, "file_of", None)
            check_weight(name, tensor, str(file_of(name)) if file_of else "the Hugging Face state dict")
            self._checked.add(name)
        return tensor

    def __iter__(self):
        return iter(self._hf)

    def __len__(self) -> int:
        return len(self._hf)

    def __contains__(self, name: object) -> bool:
        return name in self._hf
