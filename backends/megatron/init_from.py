"""Initial weights for a fresh run: ``checkpoint.init_from = "hf:PATH"`` or ``"mcore:PATH"``.

:func:`initialize_from` loads model weights only (the optimizer, scheduler and iteration start
fresh) when there is no checkpoint to resume from: a megatron-core dist checkpoint, or a Hugging
Face folder that global rank 0 converts once into a fingerprinted cache. Only ``backends`` and
megatron-core are imported (no dlmspec spec models). The cache, the checks and the loading
convention: docs/runtime.md, "Initial weights".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import unwrap_model

from dlmspec.backends.checkpoint_safety import CheckpointRefused, check_checkpoint, dist_load
from dlmspec.files import FileRefused

#: ``init_from`` prefixes: Hugging Face folder, megatron-core dist checkpoint.
INIT_KINDS = ("hf", "mcore")
#: Directory name of the converted cache inside the checkpoint save directory.
CACHE_NAME = "init_from_hf"
#: Completion marker inside the cache: written last, before the rename.
MARKER_NAME = "dlmspec_init_from.json"
#: How long the other ranks wait for rank 0's conversion (a gloo group of its own, so the
#: NCCL collective timeout does not apply).
CONVERT_WAIT = timedelta(hours=4)


class InitFromError(ValueError):
    """``checkpoint.init_from`` cannot be used: malformed, missing, a model that disagrees with
    the run's dimensions, or a failed conversion. The message names the source and the fix."""


@dataclass
class InitSource:
    """Where a fresh run's weights came from (the ``start`` record's ``weights``).

    Attributes:
        init_from: the setting as given (``"hf:PATH"`` / ``"mcore:PATH"``).
        kind: ``"hf"`` or ``"mcore"``.
        source: absolute path of the Hugging Face folder or megatron checkpoint named.
        checkpoint: the dist-checkpoint directory loaded (the cache for ``hf``).
        cache: ``"converted"`` (this launch converted), ``"reused"`` or ``None`` (``mcore``).
        reason: why it was converted (``None`` when reused or ``mcore``).
        convert_seconds: conversion wall time (0 when not converted).
        load_seconds: wall time of the load into the model.
        warnings: dimensions that do not change shapes but differ from the run's (RoPE base,
            norm epsilon, RoPE scaling, activation), one sentence each.
    """

    init_from: str
    kind: str
    source: str
    checkpoint: str
    cache: Optional[str] = None
    reason: Optional[str] = None
    convert_seconds: float = 0.0
    load_seconds: float = 0.0
    warnings: Tuple[str, ...] = ()

    def to_record(self) -> Dict[str, Any]:
        """JSON-ready dict for the metrics ``start`` record."""
        out = asdict(self)
        out["warnings"] = list(self.warnings)
        return out

    def describe(self) -> str:
        """One console line."""
        how = {"converted": f", converted into {self.checkpoint} in {self.convert_seconds:.1f} s ({self.reason})",
               "reused": f", converted copy reused from {self.checkpoint}"}.get(self.cache or "", "")
        return (f"weights from {self.init_from} ({self.kind}: {self.source}{how}; loaded in "
                f"{self.load_seconds:.1f} s), fresh optimizer and schedule at iteration 0")


def parse_init_from(value: str) -> Tuple[str, str]:
    """Split ``"hf:PATH"`` / ``"mcore:PATH"`` into ``(kind, path)``.

    Raises:
        InitFromError: neither prefix, or an empty path.
    """
    kind, sep, path = str(value).partition(":")
    if not sep or kind not in INIT_KINDS or not path.strip():
        raise InitFromError(
            f"checkpoint.init_from = {value!r} does not say which format to read: use 'hf:PATH' "
            "(a Hugging Face folder) or 'mcore:PATH' (a megatron-core checkpoint)")
    return kind, path


def default_cache_dir(save_dir: Optional[str], run_dir: str) -> str:
    """``<save_dir>/init_from_hf``, or ``<run_dir>/init_from_hf`` for a run that saves nothing."""
    return os.path.join(save_dir or run_dir, CACHE_NAME)


# --------------------------------------------------------------------------- dimensions


def _run_values(config: TransformerConfig, model_kwargs: Dict[str, Any]) -> Dict[str, Tuple[str, Any]]:
    """ModelDims field -> (spec key, the run's value), for the shape checks."""
    out = {
        "num_layers": ("model.num_layers", config.num_layers),
        "hidden_size": ("model.hidden_size", config.hidden_size),
        "num_attention_heads": ("model.num_attention_heads", config.num_attention_heads),
        "num_query_groups": ("model.num_query_groups", config.num_query_groups or config.num_attention_heads),
        "kv_channels": ("model.kv_channels", config.kv_channels),
        "qk_layernorm": ("model.qk_layernorm", bool(config.qk_layernorm)),
        "add_qkv_bias": ("model.add_qkv_bias", bool(config.add_qkv_bias)),
        "num_experts": ("model.num_experts", int(config.num_moe_experts or 0)),
    }
    if config.num_moe_experts:
        out["moe_ffn_hidden_size"] = ("model.moe_ffn_hidden_size", config.moe_ffn_hidden_size)
        out["moe_router_topk"] = ("model.moe_router_topk", config.moe_router_topk)
        out["shared_expert_ffn_hidden_size"] = ("model.moe_shared_expert_intermediate_size",
                                                int(config.moe_shared_expert_intermediate_size or 0))
    else:
        out["ffn_hidden_size"] = ("model.ffn_hidden_size", config.ffn_hidden_size)
    return out


def check_dims(dims: Any, config: TransformerConfig, model_kwargs: Dict[str, Any]) -> List[str]:
    """Compare a checkpoint's :class:`dlmspec.backends.convert.ModelDims` with the run's model.

    Args:
        dims: the checkpoint's dimensions (vocabulary padded to the run's size).
        config: the run's ``TransformerConfig``.
        model_kwargs: the run's GPTModel keyword arguments (``vocab_size`` padded,
            ``share_embeddings_and_output_weights``, ``rotary_base``, ``position_embedding_type``).

    Returns:
        Warnings: settings that change the computation but not the shapes (RoPE base, norm
        epsilon, Llama-3 RoPE scaling, the MLP activation), one sentence each.

    Raises:
        InitFromError: every disagreement that changes a tensor shape or the set of tensors,
            each naming the spec key and the checkpoint's value.
    """
    errors = []
    for field, (key, ours) in _run_values(config, model_kwargs).items():
        theirs = getattr(dims, field)
        if ours != theirs:
            errors.append(f"{key}: the run has {ours!r}, the checkpoint {theirs!r} (set {key} = {theirs!r})")
    tied = bool(model_kwargs.get("share_embeddings_and_output_weights", False))
    if tied != dims.tied:
        errors.append(f"model.untie_embeddings_and_output_weights: the run has {not tied}, the checkpoint's "
                      f"tie_word_embeddings is {dims.tied} (set it to {str(not dims.tied).lower()})")
    if config.num_moe_experts:
        freq = config.moe_layer_freq
        every = freq == 1 if isinstance(freq, int) else all(int(f) == 1 for f in freq)
        if not every:
            errors.append(f"model.moe_layer_freq: the run has {freq!r}, the checkpoint has experts in every layer "
                          "(set model.moe_layer_freq = 1)")
    structure = [
        ("model.activation", bool(config.gated_linear_unit), True, "a gated MLP (swiglu)", "'swiglu'"),
        ("model.add_bias_linear", bool(config.add_bias_linear), False, "no linear biases", "false"),
        ("model.normalization", config.normalization, "RMSNorm", "RMSNorm", "'RMSNorm'"),
        ("model.position_embedding_type", model_kwargs.get("position_embedding_type", "rope"), "rope", "RoPE",
         "'rope'"),
    ]
    for key, ours, want, what, fix in structure:
        if ours != want:
            errors.append(f"{key}: the checkpoint has {what}, the run does not (set {key} = {fix})")
    if errors:
        raise InitFromError("the checkpoint's model differs from this run's:\n  " + "\n  ".join(errors))
    warnings = []
    base = float(model_kwargs.get("rotary_base", 10000))
    if base != float(dims.rotary_base):
        warnings.append(f"model.rotary_base is {base:g}, the checkpoint was trained with {dims.rotary_base:g}")
    if abs(float(config.layernorm_epsilon) - float(dims.norm_epsilon)) > 1e-12:
        warnings.append(f"model.layernorm_epsilon is {config.layernorm_epsilon:g}, the checkpoint's is "
                        f"{dims.norm_epsilon:g}")
    if dims.rope_scaling_factor is not None:
        warnings.append(f"the checkpoint uses Llama-3 RoPE scaling (factor {dims.rope_scaling_factor:g}), which the "
                        "runtime's GPTModel does not apply")
    if config.activation_func is not torch.nn.functional.silu:
        warnings.append("the checkpoint's MLP is SwiGLU (SiLU gate), the run's activation is not SiLU")
    return warnings


def hf_dims(hf_path: str, *, padded_vocab_size: int) -> Any:
    """:class:`dlmspec.backends.convert.ModelDims` of a Hugging Face folder, vocabulary padded to
    ``padded_vocab_size`` (this run's embedding rows).

    Raises:
        InitFromError: no readable ``config.json``, a family or feature the converter does not
            handle, or a vocabulary larger than ``padded_vocab_size``.
    """
    from dlmspec.backends.convert import ConversionError, dims_from_hf_config
    from dlmspec.backends.convert.hf_io import read_hf_config

    try:
        config = read_hf_config(hf_path)
        return dims_from_hf_config(config, padded_vocab=padded_vocab_size)
    except ConversionError as exc:
        raise InitFromError(f"checkpoint.init_from: {exc}") from None


def hf_fingerprint(hf_path: str, dims: Any) -> Dict[str, Any]:
    """What the cache was made from: the folder's absolute path, the sha256 of its
    ``config.json``, ``[name, bytes, mtime_ns]`` of its ``*.safetensors`` and index files, and
    the target dimensions. Equal fingerprints mean the cache can be reused."""
    folder = os.path.abspath(hf_path)
    with open(os.path.join(folder, "config.json"), "rb") as f:
        config_sha = hashlib.sha256(f.read()).hexdigest()
    files = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            st = os.stat(os.path.join(folder, name))
            files.append([name, st.st_size, st.st_mtime_ns])
    return {"format_version": 1, "source": folder, "config_sha256": config_sha, "weights": files,
            "dims": dims.to_dict()}


# --------------------------------------------------------------------------- the cache


def read_marker(cache_dir: str) -> Optional[Dict[str, Any]]:
    """The cache's completion marker, or ``None`` (no cache, or a half-written one)."""
    try:
        with open(os.path.join(cache_dir, MARKER_NAME)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def cache_status(cache_dir: str, fingerprint: Dict[str, Any]) -> Optional[str]:
    """``None`` if the cache is complete and made from ``fingerprint``, else why it is not."""
    if not os.path.isdir(cache_dir):
        return "no converted copy yet"
    marker = read_marker(cache_dir)
    if marker is None:
        return "the cache has no completion marker (an interrupted conversion)"
    if marker.get("fingerprint") != fingerprint:
        return "the cache was made from another source or for other dimensions"
    return None


_CONVERT_CHILD = """\
import json, sys
from dlmspec.backends.convert import ConversionError, ModelDims, hf_to_mcore
args = json.loads(sys.argv[1])
try:
    hf_to_mcore(args["src"], args["dst"], dims=ModelDims.from_dict(args["dims"]))
except ConversionError as exc:
    sys.exit(f"conversion failed: {exc}")
"""

#: torchrun's variables, kept from the conversion process (it is a world of one).
_TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def run_converter(src: str, dst: str, dims: Any) -> None:
    """Run :func:`dlmspec.backends.convert.hf_to_mcore` ``(src, dst, dims=dims)`` in a child process.

    The child sees no GPU (``CUDA_VISIBLE_DEVICES=""``) and no torchrun variables: the
    converter writes megatron's dist-checkpoint format in a world of one process on CPU (it
    refuses to run inside this run's multi-process ``torch.distributed`` world), and the
    memory it takes is given back when it exits.

    Raises:
        InitFromError: the child failed (its last output lines are in the message).
    """
    # The child imports dlmspec.backends from the same installed dlmspec (same interpreter and environment).
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    args = json.dumps({"src": src, "dst": dst, "dims": dims.to_dict()})
    proc = subprocess.run([sys.executable, "-c", _CONVERT_CHILD, args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise InitFromError(f"converting {src} to megatron-core failed (exit code {proc.returncode}):\n{tail}")


def convert_into_cache(hf_path: str, cache_dir: str, dims: Any, fingerprint: Dict[str, Any]) -> None:
    """Convert ``hf_path`` into ``cache_dir`` so that the directory is complete or absent.

    Leftovers of interrupted conversions beside the cache (``.<name>.tmp-*``,
    ``.<name>.old-*``) are removed; the converter writes into ``.<name>.tmp-<id>/ckpt``, the
    marker is written there last (flushed to disk), then it is renamed to ``cache_dir`` (an
    existing stale cache is moved aside first and deleted after).

    Raises:
        InitFromError: the conversion failed (the cache is left as it was).
    """
    cache_dir = os.path.abspath(cache_dir)
    parent, name = os.path.split(cache_dir)
    os.makedirs(parent, exist_ok=True)
    for entry in os.listdir(parent):
        if entry.startswith((f".{name}.tmp-", f".{name}.old-")):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    work = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(work)
    try:
        ckpt = os.path.join(work, "ckpt")
        run_converter(os.path.abspath(hf_path), ckpt, dims)
        marker = {"fingerprint": fingerprint, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        with open(os.path.join(ckpt, MARKER_NAME), "w") as f:
            json.dump(marker, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if os.path.lexists(cache_dir):
            old = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(cache_dir, old)
            os.replace(ckpt, cache_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(ckpt, cache_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- collective steps


def _prepare_on_rank0(init_from: str, cache_dir: str, config: TransformerConfig,
                      model_kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Resolve (``mcore``) or convert / reuse (``hf``) the checkpoint; a JSON-ready status."""
    kind, path = parse_init_from(init_from)
    source = os.path.abspath(path)
    if kind == "mcore":
        from dlmspec.backends.convert import ConversionError
        from dlmspec.backends.convert.mcore_io import resolve_checkpoint_dir

        if not os.path.exists(source):
            raise InitFromError(f"checkpoint.init_from = {init_from!r}: {source} does not exist (paths are "
                                f"read from {os.getcwd()})")
        try:
            checkpoint = str(resolve_checkpoint_dir(source))
        except ConversionError as exc:
            raise InitFromError(f"checkpoint.init_from = {init_from!r}: {exc}") from None
        return {"kind": kind, "source": source, "checkpoint": checkpoint, "cache": None, "reason": None,
                "convert_seconds": 0.0, "warnings": [], "fingerprint": None}
    if not os.path.isfile(os.path.join(source, "config.json")):
        raise InitFromError(f"checkpoint.init_from = {init_from!r}: {source} is not a Hugging Face folder "
                            f"(no config.json; paths are read from {os.getcwd()})")
    dims = hf_dims(source, padded_vocab_size=int(model_kwargs["vocab_size"]))
    warnings = check_dims(dims, config, model_kwargs)
    fingerprint = hf_fingerprint(source, dims)
    reason = cache_status(cache_dir, fingerprint)
    seconds = 0.0
    if reason is not None:
        t0 = time.perf_counter()
        convert_into_cache(source, cache_dir, dims, fingerprint)
        seconds = time.perf_counter() - t0
    return {"kind": kind, "source": source, "checkpoint": os.path.abspath(cache_dir),
            "cache": "reused" if reason is None else "converted", "reason": reason, "convert_seconds": seconds,
            "warnings": warnings, "fingerprint": fingerprint}


def _chunk_keys(model: List[torch.nn.Module]) -> List[str]:
    # the key layout of checkpointing.save_checkpoint: "model", or "model0".. for virtual pipeline chunks
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


#: A ``sharded_state_dict()`` name of an ``_extra_state`` entry: ``..._extra_state``, and
#: Transformer Engine's grouped-GEMM experts (``TEGroupedLinear``, megatron-core 0.16.1
#: ``extensions/transformer_engine.py`` ``_sharded_state_dict_grouped``) name expert ``i > 0``'s
#: ``..._extra_state<i>`` (one ShardedObject per expert under one checkpoint key).
_EXTRA_STATE = re.compile(r"_extra_state\d*$")


def is_extra_state(name: str) -> bool:
    """True for an ``_extra_state`` entry of a (sharded) state dict, numbered or not."""
    return _EXTRA_STATE.search(name) is not None


def load_model_weights(path: str, model: List[torch.nn.Module]) -> None:
    """Load only the model weights of the dist checkpoint ``path`` into ``model`` (collective).

    ``dist_checkpointing.load`` (through :func:`~dlmspec.backends.checkpoint_safety.dist_load`:
    nothing in the checkpoint runs code) of the chunks' ``sharded_state_dict()`` (any TP/PP: each rank
    reads its shards; a padded vocabulary of another size is cut or zero-padded, megatron's
    ``allow_shape_mismatch``), then ``load_state_dict`` per chunk. ``_extra_state`` entries
    (Transformer Engine's FP8 scaling history; ``None`` in local-spec modules), including the
    grouped-GEMM experts' ``_extra_state1`` .. ``_extra_state<E-1>`` (:func:`is_extra_state`),
    are neither read nor required: a fresh run starts its own, and a converted checkpoint has
    none for Transformer Engine's attention modules. Every other tensor must be there.
    Optimizer state, iteration and RNG states in the checkpoint are not read.

    Raises:
        CheckpointRefused: a checkpoint file names a global that could run code
            (:mod:`dlmspec.backends.checkpoint_safety`).
        megatron's ``CheckpointingException`` / ``KeyError``: a tensor the model has is missing
            from the checkpoint, or its shape disagrees.
        RuntimeError: a model parameter or buffer was not loaded, or the checkpoint gave one
            the model lacks.
    """
    keys = _chunk_keys(model)
    chunks = [unwrap_model(m) for m in model]
    state = {key: {k: v for k, v in chunk.sharded_state_dict().items() if not is_extra_state(k)}
             for key, chunk in zip(keys, chunks)}
    loaded = dist_load(state, path)
    for key, chunk in zip(keys, chunks):
        result = chunk.load_state_dict(loaded[key], strict=False)
        missing = [k for k in result.missing_keys if not is_extra_state(k)]
        if missing or result.unexpected_keys:
            raise RuntimeError(f"loading {path} into the model: not loaded {missing[:5]}, "
                               f"not in the model {list(result.unexpected_keys)[:5]}")


def initialize_from(
    init_from: str,
    *,
    model: List[torch.nn.Module],
    cache_dir: str,
    transformer_config: TransformerConfig,
    model_kwargs: Dict[str, Any],
) -> InitSource:
    """Load ``init_from``'s weights into ``model`` (collective over the default group).

    Global rank 0 resolves the source and, for ``hf:``, converts it into ``cache_dir`` unless
    a complete cache of the same source is there; the other ranks wait (on a gloo group with
    a :data:`CONVERT_WAIT` timeout), then every rank checks that it sees the checkpoint and
    loads its shards (:func:`load_model_weights`). Call it before the optimizer is built.

    Args:
        init_from: ``"hf:PATH"`` or ``"mcore:PATH"`` (relative paths: from the working
            directory).
        model: this rank's model chunks (megatron DDP / Float16Module wrappers are unwrapped).
        cache_dir: where ``hf:`` weights are converted to (see :func:`default_cache_dir`); it
            must be on a filesystem every node sees, like the checkpoint directory.
        transformer_config: the run's ``TransformerConfig`` (dimension check).
        model_kwargs: the run's GPTModel keyword arguments (padded ``vocab_size``, tying, RoPE).

    Returns:
        :class:`InitSource`.

    Raises:
        InitFromError: on every rank when rank 0 failed (malformed value, missing folder,
            dimensions that differ from the run's, conversion error, a checkpoint file that would
            run code when loaded: :func:`~dlmspec.backends.checkpoint_safety.check_checkpoint`) or
            when a rank cannot see the checkpoint.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    group = dist.new_group(backend="gloo", timeout=CONVERT_WAIT) if world > 1 else None
    try:
        status: Dict[str, Any] = {}
        failure: Optional[BaseException] = None
        if rank == 0:
            try:
                status = {"ok": True, **_prepare_on_rank0(init_from, cache_dir, transformer_config, model_kwargs)}
                try:
                    check_checkpoint(status["checkpoint"])  # nothing in it may run code when loaded
                except FileRefused as exc:
                    raise InitFromError(f"checkpoint.init_from = {init_from!r}: {exc}") from None
            except Exception as exc:  # told to every rank first, so none waits for ever
                failure = exc
                text = str(exc) if isinstance(exc, InitFromError) else f"{type(exc).__name__}: {exc}"
                status = {"ok": False, "error": text}
        if world > 1:
            box = [status if rank == 0 else None]
            dist.broadcast_object_list(box, src=0, group=group)
            status = box[0]
        if failure is not None:
            raise failure
        if not status["ok"]:
            raise InitFromError(f"rank 0 could not prepare checkpoint.init_from: {status['error']}")
        checkpoint = status["checkpoint"]
        visible = os.path.isfile(os.path.join(checkpoint, "metadata.json"))
        if status["fingerprint"] is not None:
            marker = read_marker(checkpoint)
            visible = visible and marker is not None and marker.get("fingerprint") == status["fingerprint"]
        if world > 1:
            flag = torch.tensor([1 if visible else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
            all_visible = bool(flag.item())
        else:
            all_visible = visible
        if not all_visible:
            raise InitFromError(
                f"checkpoint.init_from = {init_from!r}: {checkpoint} is not readable on every node"
                f"{'' if visible else ' (not on this one)'}; put the checkpoint directory on a filesystem all "
                "nodes share")
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    t0 = time.perf_counter()
    try:
        load_model_weights(checkpoint, model)
    except CheckpointRefused as exc:
        raise InitFromError(f"checkpoint.init_from = {init_from!r}: {exc}") from None
    if dist.is_initialized():
        dist.barrier()
    return InitSource(
        init_from=init_from, kind=status["kind"], source=status["source"], checkpoint=checkpoint,
        cache=status["cache"], reason=status["reason"], convert_seconds=float(status["convert_seconds"]),
        load_seconds=time.perf_counter() - t0, warnings=tuple(status["warnings"]),
    )
