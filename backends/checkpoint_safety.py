"""Opening checkpoints without running code that is in them: the one way backends and the
generated ``train.py`` read a ``torch.distributed.checkpoint`` (megatron-core ``torch_dist`` or
Megatron-FSDP ``fsdp_dtensor``).

Why: torch 2.13's ``FileSystemReader.read_metadata`` unpickles ``.metadata`` with plain
``pickle.load`` (any global: a ``.metadata`` reducing to ``os.system(...)`` runs it), and
``DefaultLoadPlanner.load_bytes`` (inherited by megatron-core's ``MCoreLoadPlanner``) reads
every stored byte object of a ``.distcp`` file (``rng_state``, ``_extra_state``, an optimizer's
sharded objects) with ``torch.load(..., weights_only=False)``. torch has no safe option (its
weights-only unpickler refuses ``.metadata``'s classes), so this module reads:

* ``.metadata`` with :class:`_MetadataUnpickler`, whose allow-list :data:`METADATA_GLOBALS`
  names exact ``(module, name)`` pairs (torch's checkpoint dataclasses and enums,
  ``torch.Size``, the dtypes, ``torch.serialization._get_layout``): no module prefix, no
  dotted name, so ``("torch.distributed.checkpoint.filesystem", "os.system")`` is refused;
  every ``_StorageInfo.relative_path`` must be a plain file name inside the checkpoint folder;
* each stored byte object and ``common.pt`` with ``torch.load(weights_only=True)`` under
  ``torch.serialization.safe_globals`` of :func:`byte_object_globals` (the numpy globals
  a ``np.random.get_state()`` needs; TE's ``_extra_state`` and the rest load without globals).

:func:`guarded` pre-checks a checkpoint folder and, while its body runs, puts the safe readers
in place of ``FileSystemReader.read_metadata``, ``DefaultLoadPlanner.load_bytes`` and
megatron-core's ``TorchCommonLoadStrategy.load_common``, so megatron-core's and torch's own
loaders read through them. :func:`dist_load`, :func:`dist_load_tensors_metadata` and
:func:`dcp_load` are the only callers of ``dist_checkpointing.load``,
``dist_checkpointing.load_tensors_metadata`` and ``dcp.load`` in backends/ and templates/
(tests/unit/checkpoint/test_checkpoint_loads_go_through_safety.py checks it).

Every refusal is a :class:`CheckpointRefused` (a :class:`~dlmspec.files.FileRefused`) naming
the file and the refused ``(module, name)``; the CLI commands that open checkpoints turn it
into exit code 2.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import re
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Tuple

from dlmspec.files import FileRefused, open_regular, read_bytes, read_json

#: Cap of a ``.metadata`` file: torch's index of every tensor chunk; a 70B model at TP8 x PP8
#: writes a few tens of MiB.
MAX_METADATA_BYTES = 1 << 30
#: Cap of ``common.pt`` (iteration, seed, scheduler and optimizer hyperparameters: KiBs).
MAX_COMMON_BYTES = 256 << 20
#: Stored byte objects up to this size are scanned before a load (:func:`scan_byte_objects`):
#: a rank's RNG state is ~15 KiB, a Transformer Engine module's ``_extra_state`` a few KiB.
MAX_SCANNED_OBJECT_BYTES = 4 << 20

_CKPT = "torch.distributed.checkpoint"
_DTYPE_NAMES = (
    "float32", "float64", "float16", "bfloat16", "complex32", "complex64", "complex128", "uint8", "uint16",
    "uint32", "uint64", "int8", "int16", "int32", "int64", "bool", "qint8", "quint8", "qint32", "quint4x2",
    "quint2x4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
)

#: Every global a ``.metadata`` may name: exact ``(module, name)`` pairs, nothing else.
#: Seen in files torch 2.13 + megatron-core 0.16.1 write (tests/fixtures/checkpoints); the
#: other checkpoint dataclasses and enums of the same modules are listed so that any torch
#: 2.x planner's ``.metadata`` reads. All are data holders (dataclasses, enums, ``torch.Size``,
#: dtypes) or a name lookup (``_get_layout``): none runs code with its arguments.
METADATA_GLOBALS: frozenset[Tuple[str, str]] = frozenset(
    [(f"{_CKPT}.metadata", n) for n in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "BytesStorageMetadata", "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")]
    + [(f"{_CKPT}.planner", n) for n in (
        "SavePlan", "LoadPlan", "WriteItem", "ReadItem", "TensorWriteData", "BytesIOWriteData", "WriteItemType",
        "LoadItemType")]
    + [(f"{_CKPT}.filesystem", "_StorageInfo"), (f"{_CKPT}.filesystem", "_StoragePrefix"),
       ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
       # StorageMeta.checkpoint_id of a dcp.save to a path (Megatron-FSDP): a path object, no I/O
       ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib._local", "PosixPath"),
       ("pathlib._local", "PurePosixPath"),
       ("builtins", "set"), ("builtins", "frozenset")]
    + [("torch", n) for n in _DTYPE_NAMES]
)

_CHECK_HINT = ("use a checkpoint you or dlmspec wrote; one from elsewhere must hold only tensors, numbers, "
               "strings and torch's checkpoint index (save it again with dlmspec, or convert it from Hugging Face "
               "safetensors with `dlmspec convert hf-to-mcore`)")


class CheckpointRefused(FileRefused):
    """A checkpoint file that would run code (or read outside its folder) when loaded.

    ``path``: the file; ``global_name``: the refused ``(module, name)`` (``None`` when the
    refusal is not about a global); ``why`` and ``hint`` as :class:`~dlmspec.files.FileRefused`.
    """

    def __init__(self, path: str | os.PathLike[str], why: str, hint: str = _CHECK_HINT,
                 global_name: Optional[Tuple[str, str]] = None) -> None:
        self.global_name = global_name
        super().__init__(path, why, hint)


def _refuse_global(path: str | os.PathLike[str], module: str, name: str, what: str) -> CheckpointRefused:
    return CheckpointRefused(
        path, f"{what} names the global ({module!r}, {name!r}), which dlmspec does not load: unpickling it "
        "could run code", global_name=(module, name))


class _MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` resolving only :data:`METADATA_GLOBALS`, by exact pair."""

    def __init__(self, file: io.BytesIO, path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in METADATA_GLOBALS:
            raise _refuse_global(self._path, module, name, "the checkpoint index")
        return getattr(importlib.import_module(module), name)

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointRefused(self._path, "the checkpoint index holds a persistent reference, which torch's "
                                "index never does")


def _check_storage_paths(metadata: Any, path: str) -> None:
    """Refuse an index placing bytes outside the checkpoint folder (``relative_path`` must be a
    plain file name: no separator, not ``..``)."""
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or rel in (".", "..") or "/" in rel or "\\" in rel or "\0" in rel:
            raise CheckpointRefused(path, f"the checkpoint index places tensor data in {rel!r}, not a file of the "
                                    "checkpoint's own folder")


def read_metadata_file(path: str | os.PathLike[str]) -> Any:
    """The ``torch.distributed.checkpoint.metadata.Metadata`` in the ``.metadata`` file ``path``.

    Raises:
        CheckpointRefused: a global outside :data:`METADATA_GLOBALS`, a persistent reference, a
            ``relative_path`` outside the folder, or an object that is not a ``Metadata``.
        FileRefused: not a regular file, or larger than :data:`MAX_METADATA_BYTES`.
        pickle.UnpicklingError, EOFError, ValueError, ...: a truncated or corrupt file (as torch's
            own reader raises them).
    """
    from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

    path = str(path)
    data = read_bytes(path, limit=MAX_METADATA_BYTES, what="checkpoint index (.metadata)")
    metadata = _MetadataUnpickler(io.BytesIO(data), path).load()
    if not isinstance(metadata, Metadata):
        raise CheckpointRefused(path, f"holds a {type(metadata).__name__}, not torch's checkpoint Metadata")
    _check_storage_paths(metadata, path)
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    return metadata


def read_metadata(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """:func:`read_metadata_file` of ``checkpoint_dir/.metadata``."""
    return read_metadata_file(os.path.join(str(checkpoint_dir), ".metadata"))


def byte_object_globals() -> list:
    """The globals :func:`load_object` allows besides torch's weights-only set: numpy's array
    rebuild (``np.random.get_state()`` holds a ``uint32`` array), by object, not by name."""
    import numpy as np

    out = [np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            out.append(importlib.import_module(module)._reconstruct)
            break
        except (ImportError, AttributeError):
            continue
    return out


#: How torch's weights-only unpickler names a refused global ("Unsupported global: GLOBAL posix.system").
_UNSUPPORTED = re.compile(r"Unsupported (?:global|class):?\s*(?:GLOBAL\s+)?([A-Za-z_][\w.]*)")


def _offending_global(source: Any, exc: BaseException) -> Optional[Tuple[str, str]]:
    """The first global torch's weights-only unpickler refused, as ``(module, name)`` (``None``
    when it refused something else: an opcode, a malformed pickle)."""
    import torch

    allowed = {f"{g.__module__}.{g.__qualname__}" for g in byte_object_globals()}
    try:
        if isinstance(source, (bytes, bytearray)):
            source = io.BytesIO(source)
        elif hasattr(source, "seek"):
            source.seek(0)
        names = [n for n in torch.serialization.get_unsafe_globals_in_checkpoint(source) if n not in allowed]
    except Exception:  # noqa: BLE001 - naming the global is best effort; the refusal stands
        names = []
    if not names:
        match = _UNSUPPORTED.search(str(exc))
        if match is None:
            return None
        names = [match.group(1)]
    module, _, name = names[0].rpartition(".")
    return module, name


def load_object(source: Any, *, where: str | os.PathLike[str], what: str = "a stored object") -> Any:
    """``torch.load(source, weights_only=True, map_location="cpu")`` with :func:`byte_object_globals`.

    Args:
        source: bytes, a binary file object, or a file path.
        where: the file named in a refusal.
        what: what the object is (``"common.pt"``, ``"the stored object 'rng_state'"``).

    Raises:
        CheckpointRefused: the object names a global outside torch's weights-only set and
            :func:`byte_object_globals` (``global_name`` is the first such global), or holds
            another pickle torch's weights-only loader refuses (``global_name`` ``None``).
        RuntimeError, EOFError, ...: a truncated or corrupt object, as ``torch.load`` raises them.
    """
    import torch

    f = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        with torch.serialization.safe_globals(byte_object_globals()):
            return torch.load(f, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        offending = _offending_global(source, exc)
        if offending is None:
            first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise CheckpointRefused(where, f"{what} is refused by torch's weights-only loader ({first[:200]})") from None
        raise _refuse_global(where, offending[0], offending[1], what) from None


def check_common_file(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """megatron-core's ``common.pt`` of ``checkpoint_dir`` read by :func:`load_object` (``None``
    when there is none). Also refuses a ``metadata.json`` naming another backend than
    ``torch_dist`` / ``torch`` (megatron-core's other loaders read ``.pt`` files with pickle)."""
    d = str(checkpoint_dir)
    meta_json = os.path.join(d, "metadata.json")
    if os.path.isfile(meta_json):
        config = read_json(meta_json)
        for key, want in (("sharded_backend", "torch_dist"), ("common_backend", "torch")):
            got = config.get(key, want) if isinstance(config, dict) else want
            if got != want:
                raise CheckpointRefused(meta_json, f"{key} is {got!r}; dlmspec loads only {want!r} checkpoints",
                                        f"save the checkpoint in megatron-core's {want!r} format")
    common = os.path.join(d, "common.pt")
    if not os.path.lexists(common):
        return None
    data = read_bytes(common, limit=MAX_COMMON_BYTES, what="checkpoint's common state (common.pt)")
    return load_object(data, where=common, what="common.pt")


def scan_byte_objects(checkpoint_dir: str | os.PathLike[str], metadata: Any,
                      limit: int = MAX_SCANNED_OBJECT_BYTES) -> int:
    """Refuse a checkpoint whose stored byte objects (``rng_state``, ``_extra_state``, ...) of at
    most ``limit`` bytes name a global :func:`load_object` would refuse, whether or not the
    caller loads them: a scan of the pickle opcodes (``torch.serialization.
    get_unsafe_globals_in_checkpoint``), nothing is unpickled. Larger ones (an optimizer's
    sharded objects) are checked when loaded. Returns the number scanned.

    Raises:
        CheckpointRefused: the ``.distcp`` file, the object's name and the first such global.
    """
    import torch
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    byte_keys = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    scanned = 0
    for index, info in metadata.storage_data.items():
        if index.fqn not in byte_keys or not 0 <= int(info.length) <= limit:
            continue
        f = os.path.join(str(checkpoint_dir), info.relative_path)
        if getattr(info, "transform_descriptors", None):
            continue  # compressed or otherwise transformed: checked when loaded
        fd = open_regular(f, what="checkpoint data file (.distcp)")
        with os.fdopen(fd, "rb") as handle:
            handle.seek(int(info.offset))
            data = handle.read(int(info.length))
        try:
            with torch.serialization.safe_globals(byte_object_globals()):
                names = torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data))
        except Exception:  # noqa: BLE001 - not a zip torch file: load_object refuses or fails on it later
            continue
        if names:
            module, _, name = names[0].rpartition(".")
            raise _refuse_global(f, module, name, f"the stored object {index.fqn!r}")
        scanned += 1
    return scanned


def check_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> Any:
    """Read ``.metadata`` (:func:`read_metadata`), ``common.pt`` (:func:`check_common_file`) and
    the small stored byte objects (:func:`scan_byte_objects`) of ``checkpoint_dir`` safely before
    any loader touches them; returns the ``Metadata``."""
    metadata = read_metadata(checkpoint_dir)
    check_common_file(checkpoint_dir)
    scan_byte_objects(checkpoint_dir, metadata)
    return metadata


# --------------------------------------------------------------------------- the swaps


def _safe_read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FileSystemReader.read_metadata`` through :func:`read_metadata_file`."""
    rank = kwargs.get("rank")
    try:
        path = self._get_metadata_path(rank) if rank is not None else self._get_metadata_path()
    except (AttributeError, TypeError):
        path = os.path.join(str(self.path), ".metadata")
    metadata = read_metadata_file(os.fspath(path))
    metadata.storage_meta.load_id = getattr(self, "load_id", None)
    return metadata


def _byte_object_file(planner: Any, read_item: Any) -> str:
    storage = getattr(getattr(planner, "metadata", None), "storage_data", None) or {}
    info = storage.get(getattr(read_item, "storage_index", None))
    rel = getattr(info, "relative_path", None)
    base = _STATE.paths[-1] if _STATE.paths else "checkpoint"
    return os.path.join(base, rel) if isinstance(rel, str) else base


def _safe_load_bytes(self: Any, read_item: Any, value: io.BytesIO) -> None:
    """``DefaultLoadPlanner.load_bytes`` with :func:`load_object` in place of
    ``torch.load(weights_only=False)`` (torch 2.13's body otherwise)."""
    fqn = read_item.dest_index.fqn
    obj = load_object(value, where=_byte_object_file(self, read_item), what=f"the stored object {fqn!r}")
    if self.flatten_state_dict:
        from torch.distributed.checkpoint._traverse import set_element

        set_element(self.original_state_dict, self.mappings[fqn], obj)
    else:
        self.state_dict[fqn] = obj


def _safe_load_common(self: Any, checkpoint_dir: Any) -> Any:
    """megatron-core's ``TorchCommonLoadStrategy.load_common`` through :func:`check_common_file`."""
    from megatron.core.dist_checkpointing.core import CheckpointingException

    loaded = check_common_file(checkpoint_dir)
    if loaded is None:
        raise CheckpointingException(f"Common file {os.path.join(str(checkpoint_dir), 'common.pt')} does not exist")
    return loaded


class _State(threading.local):
    def __init__(self) -> None:
        self.paths: list = []


_STATE = _State()
_LOCK = threading.RLock()
_DEPTH = [0]
_SAVED: list = []


def _swap_targets() -> list:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    targets = [(FileSystemReader, "read_metadata", _safe_read_metadata),
               (DefaultLoadPlanner, "load_bytes", _safe_load_bytes)]
    try:
        from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy
    except ImportError:  # megatron-core 0.19 has none, or the FSDP path without megatron-core
        pass
    else:
        targets.append((TorchCommonLoadStrategy, "load_common", _safe_load_common))
    try:  # megatron-core 0.19: a legacy common.pt is read by this module-level function
        from megatron.core.dist_checkpointing import serialization
    except ImportError:
        pass
    else:
        if callable(getattr(serialization, "load_common", None)):
            targets.append((serialization, "load_common", _safe_load_common_function))
    return targets


def _safe_load_common_function(checkpoint_dir: Any) -> Any:
    """megatron-core 0.19's ``serialization.load_common`` through :func:`check_common_file`."""
    return _safe_load_common(None, checkpoint_dir)


@contextmanager
def guarded(checkpoint_dir: str | os.PathLike[str], *, precheck: bool = True) -> Iterator[Any]:
    """Pre-check ``checkpoint_dir`` (:func:`check_checkpoint`, yielded: its ``Metadata``) and,
    while the body runs, swap torch's and megatron-core's unsafe readers for this module's
    (``FileSystemReader.read_metadata``, ``DefaultLoadPlanner.load_bytes``,
    ``TorchCommonLoadStrategy.load_common``). Re-entrant; the swap is undone on exit. A refusal
    inside torch's or megatron-core's load may reach the caller wrapped in their exceptions:
    :func:`dist_load`, :func:`dist_load_tensors_metadata` and :func:`dcp_load` unwrap it.

    Raises:
        CheckpointRefused: see :func:`read_metadata_file`, :func:`load_object`.
    """
    metadata = check_checkpoint(checkpoint_dir) if precheck else None
    with _LOCK:
        if _DEPTH[0] == 0:
            for cls, attr, safe in _swap_targets():
                _SAVED.append((cls, attr, cls.__dict__[attr]))
                setattr(cls, attr, safe)
        _DEPTH[0] += 1
    _STATE.paths.append(str(checkpoint_dir))
    try:
        yield metadata
    finally:
        _STATE.paths.pop()
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                while _SAVED:
                    cls, attr, original = _SAVED.pop()
                    setattr(cls, attr, original)


def _refusal_in(exc: BaseException) -> Optional[CheckpointRefused]:
    """The :class:`CheckpointRefused` inside ``exc``: torch's ``CheckpointException`` keeps each
    rank's failure in ``failures`` (``{rank: (exception, traceback)}`` or the exception), and
    megatron-core re-raises with ``__cause__``/``__context__``."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, CheckpointRefused):
            return e
        if isinstance(e, (tuple, list)):
            todo.extend(x for x in e if isinstance(x, (BaseException, tuple, list)))
            continue
        if not isinstance(e, BaseException):
            continue
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend([e.__cause__, e.__context__])
    return None


@contextmanager
def _refusals_unwrapped() -> Iterator[None]:
    """Re-raise a :class:`CheckpointRefused` that torch or megatron-core wrapped in their own
    exception (a refusal inside ``load_bytes`` reaches the caller as torch's
    ``CheckpointException``)."""
    try:
        yield
    except CheckpointRefused:
        raise
    except BaseException as exc:  # torch's CheckpointException is a BaseException
        refused = _refusal_in(exc)
        if refused is not None:
            raise refused from None
        raise


def dist_load(sharded_state_dict: Any, checkpoint_dir: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``megatron.core.dist_checkpointing.load`` under :func:`guarded`."""
    from megatron.core import dist_checkpointing

    with _refusals_unwrapped(), guarded(checkpoint_dir):
        return dist_checkpointing.load(sharded_state_dict, str(checkpoint_dir), **kwargs)


def dist_load_tensors_metadata(checkpoint_dir: str | os.PathLike[str], **kwargs: Any) -> Any:
    """``megatron.core.dist_checkpointing.load_tensors_metadata`` under :func:`guarded`."""
    from megatron.core import dist_checkpointing

    with _refusals_unwrapped(), guarded(checkpoint_dir):
        return dist_checkpointing.load_tensors_metadata(str(checkpoint_dir), **kwargs)


def dcp_load(state_dict: Any, checkpoint_dir: str | os.PathLike[str], *, planner: Any = None) -> Any:
    """``torch.distributed.checkpoint.load`` of ``checkpoint_dir`` (a ``FileSystemReader``;
    ``planner`` defaults to ``DefaultLoadPlanner()``) under :func:`guarded`. Returns the
    pre-check's ``Metadata``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    with _refusals_unwrapped(), guarded(checkpoint_dir) as metadata:
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(str(checkpoint_dir)),
                 planner=planner if planner is not None else DefaultLoadPlanner())
    return metadata
