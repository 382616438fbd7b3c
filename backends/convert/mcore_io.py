"""Write and read megatron-core distributed checkpoints (``torch_dist`` format).

The sharded state dict is built with megatron-core 0.16.1's own helpers, mirroring what
``GPTModel.sharded_state_dict()`` produces, so the runtime can load the checkpoint at any
TP/PP/EP by calling ``dist_checkpointing.load(model.sharded_state_dict(), path)``:

* tensors are wrapped by ``make_sharded_tensors_for_checkpoint`` with the TP axis megatron
  uses (``linear_qkv``/embedding/output dim 0, ``linear_proj``/``linear_fc2`` dim 1);
* gated ``linear_fc1`` (dense, expert and shared expert) goes through
  ``apply_swiglu_sharded_factory`` exactly as ``MLP.sharded_state_dict`` does, so the
  checkpoint holds ``[gate; up]`` as one global tensor that any TP re-splits per rank;
* ``_extra_state`` objects are written as ``None`` (what local-spec linears hold), because a
  model asking for a ``ShardedObject`` the checkpoint lacks fails to load;
* decoder layers use megatron's default homogeneous layout (``layer_layout="stacked"``): keys
  ``decoder.layers.<suffix>`` with a leading layer axis of size ``num_layers``; experts add an
  expert axis (``decoder.layers.mlp.experts.experts.linear_fc1.weight`` is
  ``[L, E, 2*f, h]``). ``layer_layout="per_layer"`` writes ``decoder.layers.N.<suffix>`` keys
  (megatron's ``non_homogeneous_layers`` layout) instead;
* layer norms use the keys both layer specs map to: ``input_layernorm`` ->
  ``self_attention.linear_qkv.layer_norm_weight``, dense ``pre_mlp_layernorm`` ->
  ``mlp.linear_fc1.layer_norm_weight``. For MoE layers the local spec maps
  ``pre_mlp_layernorm`` to ``mlp.linear_fc1.layer_norm_weight`` while the TE spec keeps
  ``pre_mlp_layernorm.weight``; both keys are written so either spec loads.

megatron-core's stock save path needs CUDA (``torch.cuda.synchronize`` while staging, a CUDA
tensor in the finalize broadcast) and ``psutil`` (see :func:`_without_psutil_ok`). Without CUDA, :func:`save_mcore_checkpoint`
uses a subclass of ``TorchDistSaveShardedStrategy`` that stages tensors without the CUDA
sync and finalizes without the CUDA broadcast (world size 1 only); files are identical.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dlmspec.backends import checkpoint_safety
from dlmspec.backends.convert import checks, families
from dlmspec.backends.convert._atomic import atomic_directory, signals_held, write_new
from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.errors import ConversionError
from dlmspec.backends.convert.hf_io import read_json_object
from dlmspec.backends.tracker import TrackerError, latest_checkpoint, tracker_path
from dlmspec.credentials import redact
from dlmspec.files import FileRefused, read_text

SIDECAR_NAME = "dlmspec_convert.json"
LAYER_LAYOUTS = ("stacked", "per_layer")

#: File names (``fnmatch`` patterns) :func:`save_mcore_checkpoint` writes; with ``overwrite`` only
#: these are replaced in an existing folder, everything else there is kept. ``metadata.json``,
#: which marks a complete dist checkpoint, is written last.
OWNED_NAMES = (".metadata", "*.distcp", "common.pt", "metadata.json", SIDECAR_NAME)

#: What megatron-core / torch raise reading a truncated or corrupt dist checkpoint.
_READ_ERRORS = (EOFError, OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError)


@contextmanager
def process_group() -> Iterator[None]:
    """Ensure a torch.distributed group exists for megatron's checkpoint code.

    If none is initialised, starts a gloo group of world size 1 on a ``HashStore`` (no TCP
    port) and destroys it on exit; an existing world-size-1 group is reused as is.

    Raises:
        ConversionError: an existing group has world size > 1 (conversion runs on one process).
    """
    created = False
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        created = True
    elif dist.get_world_size() != 1:
        raise ConversionError(
            f"checkpoint conversion runs in one process, torch.distributed has world size "
            f"{dist.get_world_size()}",
            tensor="torch.distributed",
            expected="world size 1",
        )
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def _save_strategy() -> Any:
    from megatron.core.dist_checkpointing.strategies.filesystem_async import FileSystemWriterAsync
    from megatron.core.dist_checkpointing.strategies.state_dict_saver import _get_failure_dict
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy
    from torch.distributed.checkpoint.api import CheckpointException

    if torch.cuda.is_available():
        return TorchDistSaveShardedStrategy("torch_dist", 1)

    class _CPUTorchDistSaveShardedStrategy(TorchDistSaveShardedStrategy):
        """``torch_dist`` saving without CUDA calls (world size 1)."""

        def _get_save_and_finalize_callbacks(self, writer, save_state_dict_ret, *more):
            # megatron-core 0.19 passes a third argument (async_strategy); 0.16 passes two
            request = super()._get_save_and_finalize_callbacks(writer, save_state_dict_ret, *more)
            storage_writer, global_metadata, dist_wrapper = save_state_dict_ret

            def finalize() -> None:
                results = dist_wrapper.gather_object(storage_writer.retrieve_write_results())
                failures = _get_failure_dict(results)
                if failures:
                    raise CheckpointException("write", failures)
                storage_writer.finish(global_metadata, results)

            preload = request.preload_fn
            if preload is not None:
                preload = partial(FileSystemWriterAsync.preload_tensors, writer.write_buckets, False)
            return request._replace(preload_fn=preload, finalize_fns=[finalize])

    return _CPUTorchDistSaveShardedStrategy("torch_dist", 1)


@contextmanager
def _without_psutil_ok() -> Iterator[None]:
    """Let megatron's checkpoint writer run where ``psutil`` is not installed.

    megatron-core 0.16.1's forked writer calls ``filesystem_async._process_memory()`` (only to
    log memory use), which raises without ``psutil``; the parent then waits forever for the
    dead worker. When megatron found no psutil, this swaps in a function returning 0 for the
    duration of the save (the fork inherits it) and restores the original afterwards.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if filesystem_async.HAVE_PSUTIL:
        yield
        return
    original = filesystem_async._process_memory
    filesystem_async._process_memory = lambda: 0
    try:
        yield
    finally:
        filesystem_async._process_memory = original


# --------------------------------------------------------------------------------------
# Sharded state dict construction
def _groups() -> dict[str, Any]:
    return {"tp_group": dist.group.WORLD, "dp_cp_group": dist.group.WORLD}


def _module(
    prefix: str,
    local_prefix: str,
    tensors: Mapping[str, torch.Tensor | None],
    tp_axes: Mapping[str, int],
    offsets: tuple[tuple[int, int, int], ...],
    gated: tuple[str, ...] = (),
    extra_state: bool = True,
) -> dict[str, Any]:
    """ShardedTensors for one module, keyed by the module's state-dict names."""
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    sd = {k: v for k, v in tensors.items() if v is not None}
    if extra_state:
        sd["_extra_state"] = None
    sharded = make_sharded_tensors_for_checkpoint(sd, prefix, dict(tp_axes), offsets, **_groups())
    out: dict[str, Any] = {}
    for name in sd:
        item = sharded[f"{prefix}{name}"]
        if name in gated:
            item = apply_swiglu_sharded_factory(item, offsets)
        out[f"{local_prefix}{name}"] = item
    return out


def build_sharded_state_dict(
    state_dict: Mapping[str, torch.Tensor],
    dims: ModelDims,
    *,
    spec: str = "local",
    layer_layout: str = "stacked",
    extra_state: bool = True,
    aliases: bool = True,
) -> dict[str, Any]:
    """Megatron ``ShardedStateDict`` of a full (TP=1) GPTModel state dict.

    Args:
        state_dict: megatron name -> full tensor (names of ``spec``; shapes as
            :func:`dlmspec.backends.convert.families.expected_mcore_shapes`). For reading, pass
            empty tensors of the stored shapes and dtypes.
        dims: model dimensions.
        spec: layer-norm naming of ``state_dict`` keys.
        layer_layout: ``"stacked"`` (megatron default) or ``"per_layer"``.
        extra_state: add ``_extra_state`` ``ShardedObject``\\ s (``None``) for every linear
            and norm (for writing; reading skips them).
        aliases: for MoE layers also write the TE-spec key of ``pre_mlp_layernorm``.

    Returns:
        dict keyed by the ``state_dict`` names (plus ``#te`` alias and ``_extra_state``
        entries) whose values are ``ShardedTensor``/``ShardedTensorFactory``/``ShardedObject``;
        must be built inside :func:`process_group`.

    Raises:
        ConversionError: unknown ``layer_layout`` or ``spec``.
    """
    if layer_layout not in LAYER_LAYOUTS:
        raise ConversionError(f"unknown layer_layout {layer_layout!r}", tensor="layer_layout", expected=LAYER_LAYOUTS)
    sd = state_dict
    out: dict[str, Any] = {}
    out.update(_module("embedding.word_embeddings.", "embedding.word_embeddings.",
                       {"weight": sd["embedding.word_embeddings.weight"]}, {"weight": 0}, (), extra_state=False))
    out["embedding.word_embeddings.weight"].allow_shape_mismatch = True
    out.update(_module("decoder.final_layernorm.", "decoder.final_layernorm.",
                       {"weight": sd["decoder.final_layernorm.weight"]}, {}, (), extra_state=extra_state))
    if not dims.tied:
        out.update(_module("output_layer.", "output_layer.", {"weight": sd["output_layer.weight"]},
                           {"weight": 0}, (), extra_state=False))
        out["output_layer.weight"].allow_shape_mismatch = True
    L = dims.num_layers
    for i in range(L):
        n = families.mcore_layer_names(dims, i, spec)
        lp = f"decoder.layers.{i}."
        if layer_layout == "stacked":
            kp, off = "decoder.layers.", ((0, i, L),)
        else:
            kp, off = f"decoder.layers.{i}.", ()

        def mod(suffix: str, local: str, tensors: Mapping[str, torch.Tensor | None], axes: Mapping[str, int],
                offsets: tuple = off, gated: tuple[str, ...] = (), es: bool = extra_state) -> None:
            out.update(_module(kp + suffix, local, tensors, axes, offsets, gated, es))

        # layer norm fused into linear_qkv in the checkpoint key space (both specs)
        out.update(_module(kp + "self_attention.linear_qkv.layer_norm_", lp + "input_norm.",
                           {"weight": sd[n["input_norm"]]}, {}, off, extra_state=False))
        mod("self_attention.linear_qkv.", lp + "self_attention.linear_qkv.",
            {"weight": sd[n["qkv"]], "bias": sd.get(n.get("qkv_bias", ""))}, {"weight": 0, "bias": 0})
        if dims.qk_layernorm:
            mod("self_attention.q_layernorm.", lp + "self_attention.q_layernorm.", {"weight": sd[n["q_norm"]]}, {})
            mod("self_attention.k_layernorm.", lp + "self_attention.k_layernorm.", {"weight": sd[n["k_norm"]]}, {})
        mod("self_attention.linear_proj.", lp + "self_attention.linear_proj.", {"weight": sd[n["proj"]]}, {"weight": 1})
        out.update(_module(kp + "mlp.linear_fc1.layer_norm_", lp + "pre_mlp_norm.",
                           {"weight": sd[n["pre_mlp_norm"]]}, {}, off, extra_state=False))
        if not dims.is_moe:
            mod("mlp.linear_fc1.", lp + "mlp.linear_fc1.", {"weight": sd[n["fc1"]]}, {"weight": 0}, gated=("weight",))
            mod("mlp.linear_fc2.", lp + "mlp.linear_fc2.", {"weight": sd[n["fc2"]]}, {"weight": 1})
            continue
        if aliases:
            mod("pre_mlp_layernorm.", lp + "pre_mlp_norm#te.", {"weight": sd[n["pre_mlp_norm"]]}, {})
        mod("mlp.router.", lp + "mlp.router.", {"weight": sd[n["router"]]}, {}, es=False)
        E = dims.num_experts
        for e in range(E):
            eoff = (*off, (len(off), e, E))
            ep = f"{lp}mlp.experts.local_experts.{e}."
            mod("mlp.experts.experts.linear_fc1.", ep + "linear_fc1.", {"weight": sd[n[f"fc1.{e}"]]},
                {"weight": 0}, offsets=eoff, gated=("weight",))
            mod("mlp.experts.experts.linear_fc2.", ep + "linear_fc2.", {"weight": sd[n[f"fc2.{e}"]]},
                {"weight": 1}, offsets=eoff)
        if dims.shared_expert_ffn_hidden_size:
            mod("mlp.shared_experts.linear_fc1.", lp + "mlp.shared_experts.linear_fc1.",
                {"weight": sd[n["shared_fc1"]]}, {"weight": 0}, gated=("weight",))
            mod("mlp.shared_experts.linear_fc2.", lp + "mlp.shared_experts.linear_fc2.",
                {"weight": sd[n["shared_fc2"]]}, {"weight": 1})
    return out


def _local_to_state_name(local: str, dims: ModelDims, spec: str) -> str | None:
    """Map an outer key of :func:`build_sharded_state_dict` back to a state-dict name."""
    if local.endswith("_extra_state") or "#te." in local:
        return None
    if ".input_norm." in local or ".pre_mlp_norm." in local:
        i = int(local.split(".")[2])
        slot = "input_norm" if ".input_norm." in local else "pre_mlp_norm"
        return families.mcore_layer_names(dims, i, spec)[slot]
    return local


# --------------------------------------------------------------------------------------
# Public I/O
def save_mcore_checkpoint(
    dst: str | os.PathLike[str],
    state_dict: Mapping[str, torch.Tensor],
    dims: ModelDims,
    *,
    spec: str = "local",
    layer_layout: str = "stacked",
    hf_config: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a full (TP=1) GPTModel state dict as a megatron-core dist checkpoint.

    The directory holds megatron's files (``.metadata``, ``*.distcp``, ``common.pt``,
    ``metadata.json``) and ``dlmspec_convert.json`` (the :class:`ModelDims`, layer layout and
    the source ``config.json``, used by :func:`load_mcore_checkpoint` and ``mcore_to_hf``).
    It is written into a temporary sibling and renamed to ``dst`` when complete; over an existing
    ``dst`` (``overwrite``) only the files of :data:`OWNED_NAMES` are replaced. Ctrl-C and SIGTERM
    during megatron-core's save take effect when it returns (its forked writers finish), then
    the temporary folder is removed.

    Args:
        dst: target directory (must not exist unless ``overwrite``).
        state_dict: megatron name -> full tensor; checked against ``dims`` first.
        dims: model dimensions.
        spec: layer-norm naming of ``state_dict``.
        layer_layout: ``"stacked"`` (default, megatron's homogeneous layout) or ``"per_layer"``.
        hf_config: the Hugging Face config to remember for the way back.
        overwrite: write into an existing ``dst`` (other files there are kept).

    Returns:
        ``dst`` as a :class:`~pathlib.Path`.

    Raises:
        ConversionError: a missing/unexpected/wrongly shaped tensor, or ``dst`` exists.
    """
    from megatron.core import dist_checkpointing

    checks.check_tensors(state_dict, families.expected_mcore_shapes(dims, spec),
                           f"megatron-core {dims.family}", ignore=("_extra_state",))
    with atomic_directory(dst, overwrite=overwrite, owned=OWNED_NAMES, marker="metadata.json") as tmp, \
            process_group(), _without_psutil_ok():
        ckpt = tmp / "ckpt"
        ckpt.mkdir()
        sharded = build_sharded_state_dict(state_dict, dims, spec=spec, layer_layout=layer_layout)
        with signals_held():  # Ctrl-C / SIGTERM wait for megatron's writers, then clean up
            dist_checkpointing.save(sharded, str(ckpt), sharded_strategy=_save_strategy())
        for entry in ckpt.iterdir():
            os.replace(entry, tmp / entry.name)
        ckpt.rmdir()
        sidecar = {
            "format_version": 1,
            "dims": dims.to_dict(),
            "layer_layout": layer_layout,
            # a token-shaped value in the source config.json is not copied into the record
            "hf_config": redact(dict(hf_config or {})),
        }
        write_new(tmp / SIDECAR_NAME, json.dumps(sidecar, indent=2, sort_keys=True, default=str) + "\n")
    return Path(dst)


def _read_line(path: Path) -> str:
    try:
        return read_text(path, limit=1 << 16).strip()
    except FileRefused as exc:
        raise ConversionError(f"{path}: {exc.why}", tensor=str(path), expected="a text file") from None


def resolve_checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The dist-checkpoint directory at ``path``.

    Accepts the directory itself (holding ``metadata.json``), a dlmspec run's checkpoint root
    (a ``latest`` file naming the ``iter_*`` directory) or a Megatron-LM save directory with
    ``latest_checkpointed_iteration.txt`` (``release`` or an iteration number).

    Raises:
        ConversionError: neither layout is found, or the iteration tracker holds no iteration.
    """
    path = Path(path)

    def is_file(candidate: Path) -> bool:  # a name from a tracker may be too long for the OS
        try:
            return candidate.is_file()
        except (OSError, ValueError):
            return False

    if is_file(path / "metadata.json"):
        return path
    latest = Path(tracker_path(path))  # dlmspec runtime (backends/megatron/checkpointing.py): "iter_0000100"
    if os.path.lexists(latest):
        try:
            folder = latest_checkpoint(path)  # the one reader of the tracker (dlmspec.backends.tracker)
        except TrackerError as exc:
            raise ConversionError(f"{exc.path}: {exc.why}. Fix: {exc.fix}", tensor=str(latest),
                                  expected="the name of a checkpoint folder") from None
        if folder is not None and is_file(Path(folder) / "metadata.json"):
            return Path(folder)
    tracker = path / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        it = _read_line(tracker)
        if it != "release" and not (it.isascii() and it.isdigit()):
            saved = sorted(p.name for p in path.glob("iter_*") if (p / "metadata.json").is_file())
            example = str(int(saved[-1][len("iter_"):])) if saved and saved[-1][5:].isdigit() else "100"
            raise ConversionError(
                f"{tracker}: holds {it!r}, expected an iteration number or 'release'. Fix: write the iteration "
                f"of a saved checkpoint there, e.g. {example}, or pass the iter_* folder itself",
                tensor=str(tracker), expected="an iteration number")
        sub = path / ("release" if it == "release" else f"iter_{int(it):07d}")
        if is_file(sub / "metadata.json"):
            return sub
    raise ConversionError(
        f"{path} is not a megatron-core dist checkpoint (no metadata.json)",
        tensor=str(path),
        expected="a dist-checkpoint directory",
    )


def read_sidecar(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``dlmspec_convert.json`` of a checkpoint written by :func:`save_mcore_checkpoint`, or None.

    Raises:
        ConversionError: the file is not a JSON object, or its ``hf_config`` is not an object.
    """
    f = resolve_checkpoint_dir(path) / SIDECAR_NAME
    if not f.is_file():
        return None
    sidecar = read_json_object(f, "dlmspec's conversion record")
    if sidecar.get("hf_config") is not None and not isinstance(sidecar["hf_config"], dict):
        raise ConversionError(
            f"{f}: hf_config is a {type(sidecar['hf_config']).__name__}, expected the source config.json (an "
            "object). Fix: restore the file, or remove hf_config from it (a config is then made from dims)",
            tensor="hf_config", expected="an object")
    return sidecar


def dims_from_sidecar(sidecar: Mapping[str, Any], ckpt: str | os.PathLike[str]) -> ModelDims:
    """The :class:`ModelDims` recorded in the sidecar of the checkpoint ``ckpt``.

    Raises:
        ConversionError: no ``dims`` there, or values :meth:`ModelDims.from_dict` refuses (the
            message starts with the sidecar's path).
    """
    f = resolve_checkpoint_dir(ckpt) / SIDECAR_NAME
    if "dims" not in sidecar:
        raise ConversionError(
            f"{f}: has no dims (the model's dimensions). Fix: restore the file, or convert again from the "
            "Hugging Face checkpoint", tensor="dims", expected="an object of ModelDims fields")
    try:
        return ModelDims.from_dict(sidecar["dims"])
    except ConversionError as exc:
        raise ConversionError(f"{f}: {exc}. Fix: restore the file, or convert again from the Hugging Face "
                              "checkpoint", tensor=exc.tensor, expected=exc.expected) from None


def check_checkpoint_files(ckpt: Path) -> None:
    """Refuse a dist checkpoint with a file that is corrupt or shorter than ``.metadata`` says.

    Reads ``metadata.json`` (a JSON object), ``.metadata`` (torch's index of where each tensor's
    bytes are), compares every ``*.distcp`` file's size with the last byte ``.metadata`` places
    in it, and checks ``common.pt`` is a torch (zip) file: a copy that stopped early is named
    here instead of failing inside torch's reader. ``.metadata`` and ``common.pt`` are read
    without running code in them (:mod:`dlmspec.backends.checkpoint_safety`).

    Raises:
        ConversionError: naming the file and what is wrong with it (a global that could run
            code: the file and the ``(module, name)``).
    """
    again = "Fix: copy (or save) the checkpoint again; an unfinished copy or save leaves files like this"
    read_json_object(ckpt / "metadata.json", "megatron-core's checkpoint metadata")
    index = ckpt / ".metadata"
    if not index.is_file():
        raise ConversionError(f"{index}: missing, so {ckpt} is not a complete torch_dist checkpoint. {again}",
                              tensor=str(index), expected="torch's checkpoint index")
    try:
        metadata = checkpoint_safety.read_metadata(ckpt)
    except checkpoint_safety.CheckpointRefused as exc:
        raise _refused(exc) from None
    except Exception as exc:  # unpickling a damaged file can raise almost anything
        raise ConversionError(f"{index}: cannot be read ({type(exc).__name__}: {exc}); it is truncated or corrupt. "
                              f"{again}", tensor=str(index), expected="torch's checkpoint index") from None
    ends: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        if isinstance(rel, str):
            ends[rel] = max(ends.get(rel, 0), int(info.offset) + int(info.length))
    for rel, end in sorted(ends.items()):
        f = ckpt / rel
        if not f.is_file():
            raise ConversionError(f"{f}: missing; {index.name} lists tensor data in it. {again}", tensor=str(f),
                                  expected="a .distcp file")
        size = f.stat().st_size
        if size < end:
            raise ConversionError(f"{f}: truncated: {size} bytes, but {index.name} places tensor data up to byte "
                                  f"{end}. {again}", tensor=str(f), expected=f">= {end} bytes")
    common = ckpt / "common.pt"
    if common.is_file() and not zipfile.is_zipfile(common):
        raise ConversionError(f"{common}: not a readable torch file (truncated or corrupt). {again}",
                              tensor=str(common), expected="a torch.save file")
    try:
        checkpoint_safety.check_common_file(ckpt)
    except checkpoint_safety.CheckpointRefused as exc:
        raise _refused(exc) from None
    except _READ_ERRORS as exc:
        raise ConversionError(f"{common}: cannot be read ({type(exc).__name__}: {exc}). {again}",
                              tensor=str(common), expected="a torch.save file") from None


def _refused(exc: checkpoint_safety.CheckpointRefused) -> ConversionError:
    """The ``ConversionError`` (exit code 2 in the CLI) of a checkpoint file that could run code."""
    return ConversionError(str(exc), tensor=exc.path,
                           expected="tensors, numbers, strings and torch's checkpoint index only")


def _stored_layers(meta: Mapping[str, Any], layer_layout: str) -> int:
    if layer_layout == "stacked":
        return int(meta["decoder.layers.self_attention.linear_qkv.weight"].global_shape[0])
    held = set()
    for key in meta:
        parts = key.split(".", 3)
        if key.startswith("decoder.layers.") and len(parts) > 2 and parts[2].isdigit():
            held.add(int(parts[2]))
    return len(held)


def load_mcore_checkpoint(
    path: str | os.PathLike[str],
    dims: ModelDims | None = None,
    *,
    spec: str = "local",
) -> tuple[dict[str, torch.Tensor], ModelDims]:
    """Read a megatron-core dist checkpoint back into a full (TP=1) GPTModel state dict.

    Works on checkpoints this module wrote and on ones a GPTModel saved itself (any TP/PP/EP,
    stacked or per-layer layout, local or TE spec keys); optimizer state and other extra
    keys are ignored.

    Args:
        path: checkpoint directory (see :func:`resolve_checkpoint_dir`).
        dims: model dimensions; default: the ``dlmspec_convert.json`` sidecar.
        spec: layer-norm naming of the returned state dict.

    Returns:
        ``(state_dict, dims)``; vocabulary tensors keep the stored padded row count.

    Raises:
        ConversionError: no dims (no sidecar and none given), a corrupt sidecar or truncated file
            (:func:`check_checkpoint_files`), a layer count, tensor or stored shape that
            disagrees with ``dims``, a weight that is not floating point or not finite (named), a
            checkpoint file naming a global that could run code (the file and the global).
    """
    ckpt = resolve_checkpoint_dir(path)
    sidecar = read_sidecar(ckpt)
    origin, fix = "the target config", ""
    if dims is None:
        if sidecar is None:
            raise ConversionError(
                f"{ckpt} has no {SIDECAR_NAME}; pass dims=ModelDims(...)",
                tensor=SIDECAR_NAME,
                expected="a sidecar or explicit dims",
            )
        dims = dims_from_sidecar(sidecar, ckpt)
        origin = f"the dims in {ckpt / SIDECAR_NAME}"
        fix = ". Fix: restore that file, or convert again from the Hugging Face checkpoint"
    check_checkpoint_files(ckpt)
    with process_group():
        try:
            meta = checkpoint_safety.dist_load_tensors_metadata(ckpt)
        except checkpoint_safety.CheckpointRefused as exc:
            raise _refused(exc) from None
        except _READ_ERRORS as exc:
            raise ConversionError(f"{ckpt}: megatron-core cannot read the checkpoint's metadata ({type(exc).__name__}: "
                                  f"{exc}). Fix: copy (or save) the checkpoint again", tensor=str(ckpt),
                                  expected="a readable dist checkpoint") from None
        if "decoder.layers.self_attention.linear_qkv.weight" in meta:
            layer_layout = "stacked"
        elif "decoder.layers.0.self_attention.linear_qkv.weight" in meta:
            layer_layout = "per_layer"
        else:
            raise ConversionError(
                f"{ckpt} holds no decoder.layers[.0].self_attention.linear_qkv.weight",
                tensor="decoder.layers.self_attention.linear_qkv.weight",
                expected="a GPTModel checkpoint",
            )
        stored_layers = _stored_layers(meta, layer_layout)
        if stored_layers != dims.num_layers:
            raise ConversionError(
                f"{origin}: num_layers = {dims.num_layers}, but {ckpt} holds {stored_layers} layers"
                f"{fix or f'. Fix: pass dims with num_layers = {stored_layers}'}",
                tensor="num_layers",
                expected=stored_layers,
            )
        expected = families.expected_mcore_shapes(dims, spec)
        empties: dict[str, torch.Tensor] = {}
        for name, shape in expected.items():
            dtype = torch.float32
            key = _sharded_key(name, dims, spec, layer_layout, meta)
            if key is not None:
                dtype = meta[key].dtype
                checks.check_dtype(key, dtype, str(ckpt))
                # the stored shape is the layer (and expert) axes, then ``shape`` (vocabulary
                # rows may differ); compared here, before ``torch.empty`` of dims' sizes
                stored = tuple(meta[key].global_shape)
                vocab = name in ("embedding.word_embeddings.weight", "output_layer.weight")
                if vocab:
                    want = (stored[0] if stored else shape[0], *shape[1:])
                else:
                    want = stored[: max(len(stored) - len(shape), 0)] + tuple(shape)
                if stored != want:
                    raise ConversionError(
                        f"megatron-core tensor {key!r} has global shape {stored} in {ckpt}, expected {want} "
                        f"from {origin}{fix}",
                        tensor=key,
                        expected=want,
                    )
                if vocab:
                    stored_rows = stored[0]
                    if stored_rows < dims.vocab_size:
                        raise ConversionError(
                            f"{key} has {stored_rows} rows in {ckpt}, fewer than vocab_size={dims.vocab_size}",
                            tensor=key,
                            expected=f">= {dims.vocab_size} rows",
                        )
                    shape = (stored_rows, *shape[1:])
            empties[name] = torch.empty(shape, dtype=dtype)
        sharded = build_sharded_state_dict(empties, dims, spec=spec, layer_layout=layer_layout,
                                           extra_state=False, aliases=False)
        if dims.is_moe:
            _prefer_present_norm_key(sharded, meta)
        _check_present(sharded, meta, ckpt)
        try:
            loaded = checkpoint_safety.dist_load(sharded, ckpt)
        except checkpoint_safety.CheckpointRefused as exc:
            raise _refused(exc) from None
        except _READ_ERRORS as exc:
            raise ConversionError(f"{ckpt}: megatron-core cannot read the checkpoint ({type(exc).__name__}: {exc}). "
                                  "Fix: copy (or save) the checkpoint again", tensor=str(ckpt),
                                  expected="a readable dist checkpoint") from None
    out: dict[str, torch.Tensor] = {}
    for local, value in loaded.items():
        name = _local_to_state_name(local, dims, spec)
        if name is not None:
            checks.check_weight(name, value, str(ckpt))
            out[name] = value
    if out["embedding.word_embeddings.weight"].shape[0] != dims.padded_vocab_size:
        import dataclasses

        dims = dataclasses.replace(dims, padded_vocab_size=out["embedding.word_embeddings.weight"].shape[0])
    return out, dims


def _sharded_key(name: str, dims: ModelDims, spec: str, layer_layout: str, meta: Mapping[str, Any]) -> str | None:
    """Checkpoint key holding the state-dict tensor ``name`` (None if absent)."""
    if not name.startswith("decoder.layers."):
        return name if name in meta else None
    parts = name.split(".")
    i = int(parts[2])
    n = families.mcore_layer_names(dims, i, spec)
    slot = next(s for s, v in n.items() if v == name)
    suffix = {
        "input_norm": ["self_attention.linear_qkv.layer_norm_weight"],
        "pre_mlp_norm": ["mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"],
    }.get(slot)
    if suffix is None:
        rest = ".".join(parts[3:])
        rest = rest.replace("mlp.experts.local_experts.", "mlp.experts.experts.", 1)
        if "mlp.experts.experts." in rest:
            rest = "mlp.experts.experts." + rest.split(".", 4)[4]
        suffix = [rest]
    base = "decoder.layers." if layer_layout == "stacked" else f"decoder.layers.{i}."
    for s in suffix:
        if base + s in meta:
            return base + s
    return None


def _prefer_present_norm_key(sharded: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """MoE: read ``pre_mlp_layernorm`` from whichever of its two keys the checkpoint has."""
    for local, item in sharded.items():
        if ".pre_mlp_norm." in local and item.key not in meta:
            alt = item.key.replace("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight")
            if alt in meta:
                item.key = alt


def _check_present(sharded: Mapping[str, Any], meta: Mapping[str, Any], ckpt: Path) -> None:
    for local, item in sharded.items():
        if item.key not in meta:
            raise ConversionError(
                f"megatron-core checkpoint {ckpt} is missing tensor {item.key!r} (for {local})",
                tensor=item.key,
                expected=f"global shape {tuple(getattr(item, 'global_shape', ()) or ())}",
            )
        stored = tuple(meta[item.key].global_shape)
        wanted = _global_shape(item)
        if wanted is not None and stored != wanted and not getattr(item, "allow_shape_mismatch", False):
            raise ConversionError(
                f"megatron-core tensor {item.key!r} has global shape {stored} in {ckpt}, "
                f"expected {wanted} from the target config",
                tensor=item.key,
                expected=wanted,
            )


def _global_shape(item: Any) -> tuple[int, ...] | None:
    gs = getattr(item, "global_shape", None)
    if gs is not None:
        return tuple(gs)
    # ShardedTensorFactory (gated fc1): build once to learn the global shape
    built = item.build()
    if isinstance(built, list):
        first = built[0]
        return tuple(first.global_shape)
    return None
