"""Read and write Hugging Face safetensors checkpoints (single file or sharded with index)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from dlmspec.backends.convert._atomic import atomic_directory, write_new
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.files import FileRefused, read_json

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3


#: File names (``fnmatch`` patterns) :func:`write_hf_checkpoint` writes; with ``overwrite`` only
#: these are replaced in an existing folder, everything else there is kept.
OWNED_NAMES = (CONFIG_NAME, SINGLE_NAME, INDEX_NAME, "model-*-of-*.safetensors")


def read_json_object(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """The JSON object in the file ``path`` (``what`` says what the file is, for messages).

    Read with :func:`dlmspec.files.read_json`: a regular file (a FIFO or device is refused
    unread), at most :data:`dlmspec.files.MAX_RECORD_BYTES`, nested at most
    :data:`dlmspec.files.MAX_NESTING` levels.

    Raises:
        ConversionError: the file is missing, not a regular file, too large, too deeply nested,
            not UTF-8 JSON, or its top level is not an object.
    """
    path = Path(path)
    try:
        data = read_json(path, what=what)
    except FileRefused as exc:
        raise ConversionError(f"{path}: {exc.why}. Fix: restore the file from the original checkpoint",
                              tensor=str(path), expected=what) from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path}: the top level of {what} is a {type(data).__name__}, expected a JSON object "
                              "({...}). Fix: restore the file from the original checkpoint", tensor=str(path),
                              expected="a JSON object")
    return data


def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``config.json`` of the checkpoint directory ``path``.

    Raises:
        ConversionError: no readable ``config.json`` there, or not a JSON object.
    """
    return read_json_object(Path(path) / CONFIG_NAME, "the Hugging Face config")


def open_safetensors(path: Path) -> Any:
    """``safe_open`` of ``path``, refusing an empty, truncated or corrupt file by name.

    Raises:
        ConversionError: the file is empty, or its header does not parse or does not cover the file.
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConversionError(f"{path}: cannot read it: {exc.strerror}", tensor=str(path),
                              expected="a safetensors file") from None
    if size == 0:
        raise ConversionError(f"{path}: the safetensors file is empty (0 bytes), an unfinished download or copy? "
                              "Fix: download or copy it again", tensor=str(path), expected="a safetensors file")
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConversionError(
            f"{path}: not a readable safetensors file ({exc}); it is truncated or corrupt ({size} bytes), an "
            "unfinished download or copy? Fix: download or copy it again",
            tensor=str(path), expected="a safetensors file") from None


class SafetensorsReader(Mapping[str, torch.Tensor]):
    """Lazy ``name -> tensor`` view of a Hugging Face safetensors checkpoint directory.

    Accepts ``model.safetensors.index.json`` plus shards, a single ``model.safetensors``, or
    exactly one other ``*.safetensors`` file. Every file's header is read (and checked) when the
    reader is made; tensors are read on ``__getitem__`` (CPU, the stored dtype); :meth:`get_shape`
    and :meth:`get_dtype` read only the header.

    Raises:
        ConversionError: no safetensors file, an unreadable index, an index naming a missing
            shard, an empty, truncated or corrupt file, or a tensor listed in the index but absent
            from its shard.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        index = self.path / INDEX_NAME
        if index.is_file():
            weight_map = read_json_object(index, "the safetensors index").get("weight_map", {})
            if not isinstance(weight_map, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
                raise ConversionError(
                    f"{index}: weight_map is a {type(weight_map).__name__}, expected an object of tensor name -> "
                    "shard file name. Fix: restore the index from the original checkpoint",
                    tensor=str(index), expected="weight_map: {name: file}")
            self._where = {name: self.path / fname for name, fname in weight_map.items()}
        else:
            files = [self.path / SINGLE_NAME] if (self.path / SINGLE_NAME).is_file() else sorted(self.path.glob("*.safetensors"))
            if len(files) != 1:
                raise ConversionError(
                    f"{self.path} has no {INDEX_NAME} and {len(files)} *.safetensors files "
                    "(pytorch_model.bin checkpoints are not read; convert them to safetensors first)",
                    tensor=str(self.path),
                    expected="model.safetensors or an index with shards",
                )
            self._where = {name: files[0] for name in open_safetensors(files[0]).keys()}
        self._handles: dict[Path, Any] = {}
        for fname in sorted(set(self._where.values())):
            if not fname.is_file():
                raise ConversionError(
                    f"shard {fname.name} listed in {INDEX_NAME} is missing",
                    tensor=str(fname),
                    expected="an existing shard file",
                )
            self._handles[fname] = open_safetensors(fname)
        held = {fname: set(handle.keys()) for fname, handle in self._handles.items()}
        for name, fname in self._where.items():
            if name not in held[fname]:
                raise ConversionError(
                    f"{fname}: tensor {name!r} is listed for this shard in {INDEX_NAME} but is not in it. "
                    "Fix: restore the shard and the index from the original checkpoint",
                    tensor=name, expected="present in its shard")

    def file_of(self, name: str) -> Path:
        """The safetensors file holding ``name``."""
        return self._where[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(name)
        try:
            return self._handles[self._where[name]].get_tensor(name)
        except Exception as exc:  # safetensors raises its own error type for a missing name
            raise ConversionError(
                f"{self._where[name]}: tensor {name!r} cannot be read: {exc}",
                tensor=name,
                expected="present in its shard",
            ) from exc

    def get_shape(self, name: str) -> tuple[int, ...]:
        """Shape of ``name`` from the safetensors header, without reading the data."""
        return tuple(self._handles[self._where[name]].get_slice(name).get_shape())

    def get_dtype(self, name: str) -> str:
        """safetensors dtype code of ``name`` (``"BF16"``, ``"F32"``, ``"I8"``...), from the header."""
        return self._handles[self._where[name]].get_slice(name).get_dtype()

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone()
    return t


def write_hf_checkpoint(
    dst: str | os.PathLike[str],
    state_dict: Mapping[str, torch.Tensor],
    config: Mapping[str, Any],
    *,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> Path:
    """Write ``state_dict`` and ``config`` as a Hugging Face checkpoint directory.

    Tensors are written in name order into ``model.safetensors`` or, when they exceed
    ``max_shard_bytes``, into ``model-0000i-of-0000n.safetensors`` shards plus
    ``model.safetensors.index.json`` (``metadata.total_size`` and ``weight_map``), the layout
    ``from_pretrained`` reads. Everything is written into a temporary sibling directory that is
    renamed to ``dst`` only when complete; over an existing ``dst`` (``overwrite``) only the
    files of :data:`OWNED_NAMES` are replaced, ``config.json`` last (see
    :func:`dlmspec.backends.convert._atomic.atomic_directory`).

    Args:
        dst: target directory.
        state_dict: HF name -> tensor.
        config: ``config.json`` content (see :func:`dlmspec.backends.convert.hf_config.hf_config_from_dims`).
        dtype: cast floating-point tensors to this dtype (``None`` keeps them).
        max_shard_bytes: shard size limit.
        overwrite: write into an existing ``dst`` (other files there are kept).

    Returns:
        ``dst`` as a :class:`~pathlib.Path`.

    Raises:
        ConversionError: ``dst`` exists without ``overwrite``.
    """
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(state_dict):
        t = state_dict[name]
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        tensors[name] = _own_storage(t)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    cfg = dict(config)
    if dtype is not None:
        cfg["dtype"] = str(dtype).removeprefix("torch.")
    dst = Path(dst)
    with atomic_directory(dst, overwrite=overwrite, owned=OWNED_NAMES, marker=CONFIG_NAME) as tmp:
        if len(shards) == 1:
            save_file(shards[0], str(tmp / SINGLE_NAME), metadata={"format": "pt"})
        else:
            weight_map: dict[str, str] = {}
            for i, shard in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({name: fname for name in shard})
            total = sum(t.numel() * t.element_size() for t in tensors.values())
            write_new(tmp / INDEX_NAME,
                      json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
        write_new(tmp / CONFIG_NAME, json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
    return dst
