"""Fully sharded data parallelism with megatron-core's own Megatron-FSDP.

``parallel.fsdp = "megatron"``: the runtime does what Megatron-LM does for
``--use-megatron-fsdp``, with megatron-core 0.16.1's classes: the ``FullyShardedDataParallel``
wrapper (:func:`wrap`), the ``DistributedOptimizer``'s FSDP branch, and ``fsdp_dtensor``
checkpoints (:func:`save_checkpoint_fsdp`, :func:`load_checkpoint_fsdp`).
:func:`check_megatron_fsdp` refuses what it cannot run (no CUDA, no ``einops``, pipelining,
``CUDA_DEVICE_MAX_CONNECTIONS=1``, ...). Details: docs/runtime.md, "Megatron-FSDP".
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import io
import json
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

#: ``CheckpointConfig`` / ``dlmspec.json`` name of the format of a Megatron-FSDP checkpoint.
FSDP_CHECKPOINT_FORMAT = "fsdp_dtensor"
#: The format of every other checkpoint (``megatron.core.dist_checkpointing``).
DIST_CHECKPOINT_FORMAT = "torch_dist"
#: Key of the run state (iteration, samples, seed, scheduler; JSON text of :func:`encode_state`)
#: in a Megatron-FSDP checkpoint.
RUN_STATE_KEY = "dlmspec_state"
#: Tensor dtypes :func:`decode_state` rebuilds (the RNG states are ``uint8``).
_STATE_DTYPES = {str(d): d for d in (torch.uint8, torch.int8, torch.int32, torch.int64, torch.float32, torch.float64)}


def uses_megatron_fsdp(ddp_config: Any) -> bool:
    """True when ``ddp_config`` asks for Megatron-FSDP (``use_megatron_fsdp``)."""
    return bool(getattr(ddp_config, "use_megatron_fsdp", False))


def model_uses_megatron_fsdp(model: List[torch.nn.Module]) -> bool:
    """True when the model chunks were wrapped by :func:`wrap`."""
    return bool(model) and uses_megatron_fsdp(getattr(model[0], "ddp_config", None))


def fsdp_problems(
    ddp_config: Any,
    *,
    optimizer_config: Any = None,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: Optional[int] = None,
    cross_entropy: str = "megatron",
    init_from: Optional[str] = None,
    cuda_available: Optional[bool] = None,
    environ: Optional[Dict[str, str]] = None,
) -> List[str]:
    """Why this run cannot use Megatron-FSDP, one sentence each with the fix ([] when it can).

    The compiler refuses the spec-level ones first (the ``runtime-fsdp-*`` rules of ``dlmspec.check.runtime``); this is
    the runtime's own check, for hand-written configs and for the machine (CUDA, einops, the
    environment).
    """
    if not uses_megatron_fsdp(ddp_config):
        return []
    env = os.environ if environ is None else environ
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    problems = []
    if not cuda:
        problems.append("Megatron-FSDP needs CUDA: megatron-core's FullyShardedDataParallel allocates its "
                        "buffers, streams and DeviceMesh on cuda; run on GPUs or set parallel.fsdp = \"none\"")
    if importlib.util.find_spec("einops") is None:
        problems.append("Megatron-FSDP needs the einops package (megatron-core's mcore_fsdp_adapter builds its "
                        "device mesh with it): pip install einops")
    if not ddp_config.use_distributed_optimizer or (
            optimizer_config is not None and not optimizer_config.use_distributed_optimizer):
        problems.append("Megatron-FSDP keeps the fp32 main weights in its own sharded buffers, which only "
                        "megatron's DistributedOptimizer steps: set use_distributed_optimizer=True in "
                        "DistributedDataParallelConfig and OptimizerConfig (parallel.use_distributed_optimizer = true)")
    if pipeline_model_parallel_size > 1 or virtual_pipeline_model_parallel_size:
        problems.append("Megatron-FSDP shards over data parallelism with one model chunk per rank; it is not "
                        "wired for pipeline parallelism here: set parallel.pipeline_model_parallel_size = 1")
    if cross_entropy == "fused_linear":
        problems.append("the fused linear cross entropy holds the output weight outside the model's forward, "
                        "which Megatron-FSDP shards and gathers only inside it: set kernels.cross_entropy = \"megatron\"")
    if init_from:
        problems.append("checkpoint.init_from loads weights into unsharded parameters, and Megatron-FSDP's are "
                        "sharded DTensors: start without init_from, or with parallel.fsdp = \"none\"")
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS") == "1":
        problems.append("Megatron-FSDP overlaps its all-gathers and reduce-scatters on side streams and "
                        "Megatron-LM refuses CUDA_DEVICE_MAX_CONNECTIONS=1 with it: unset it (launch.sh sets it "
                        "for tensor parallelism without FSDP only)")
    return problems


def check_megatron_fsdp(ddp_config: Any, **kwargs: Any) -> None:
    """Raise ``ValueError`` listing :func:`fsdp_problems` (nothing without Megatron-FSDP)."""
    problems = fsdp_problems(ddp_config, **kwargs)
    if problems:
        raise ValueError("parallel.fsdp = \"megatron\" cannot run: " + "; ".join(problems))


def wrap(chunks: List[torch.nn.Module], config, ddp_config) -> List[torch.nn.Module]:
    """Wrap model chunks as Megatron-LM's ``get_model`` does for ``--use-megatron-fsdp``:
    megatron-core's ``FullyShardedDataParallel``, bucketing only on chunk 0."""
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    return [
        FullyShardedDataParallel(config=config, ddp_config=ddp_config, module=m, disable_bucketing=(i > 0))
        for i, m in enumerate(chunks)
    ]


# --------------------------------------------------------------------------- checkpoints


def _fsdp_module(model: List[torch.nn.Module]):
    """The ``MegatronFSDP`` module of the (single) chunk: what Megatron-LM's ``unwrap_model`` returns
    for a Megatron-FSDP chunk and what its checkpoint helpers take."""
    from megatron.core.utils import unwrap_model

    if len(model) != 1:
        raise ValueError("Megatron-FSDP checkpoints hold one model chunk (no virtual pipeline stages)")
    return unwrap_model(model[0])


def _optimizer_metadata() -> Dict[str, Any]:
    # Megatron-LM's _build_sharded_state_dict_metadata for --ckpt-format fsdp_dtensor.
    from megatron.core import parallel_state

    return {
        "distrib_optim_sharding_type": FSDP_CHECKPOINT_FORMAT,
        "singleton_local_shards": False,
        "chained_optim_avoid_prefix": True,
        "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True),
    }


def _state_dict(model: List[torch.nn.Module], optimizer, is_loading: bool) -> Dict[str, Any]:
    """Model and optimizer state of a Megatron-FSDP run (Megatron-LM ``generate_state_dict``)."""
    fsdp_module = _fsdp_module(model)
    state: Dict[str, Any] = {"model": fsdp_module.state_dict_for_save_checkpoint()}
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=is_loading, metadata=_optimizer_metadata()
        )
    return state


def _optimizer_states(optimizer, state: Any) -> List[Tuple[Any, Dict[str, Any]]]:
    """``(DistributedOptimizer, its fsdp_dtensor state dict)`` pairs of ``optimizer`` and the
    dict its ``sharded_state_dict`` returned (``ChainedOptimizer``: one per chained optimizer,
    under its index, or the only one's state dict unkeyed)."""
    opts = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    if len(opts) == 1:
        return [(opts[0], state)]
    return [(opt, state[i]) for i, opt in enumerate(opts)]


def _symmetric_optimizer_state(state: Dict[str, Any], optimizer) -> Dict[str, Any]:
    """``state`` with every rank's optimizer state holding the same DTensors in the same order.

    Megatron-FSDP shards each parameter group's flat buffer evenly over the data-parallel ranks,
    so a parameter can lie wholly in other ranks' shards; megatron-core 0.16.1 then gives it
    ``grad = None`` on this rank (``param_and_grad_buffer`` ``if optimizer_grad.numel() == 0``),
    the torch optimizer never creates its state here (``_init_optimizer_states_with_dummy_values``
    skips it too), and ``DistributedOptimizer.sharded_param_state_fsdp_dtensor`` returns different
    parameters on different ranks, in first-step order. ``preprocess_state_dict_for_uneven_dtensor``
    runs one ``all_gather_object`` per DTensor over its mesh, so the ranks entered different
    numbers of collectives and the save hung (H200, DP 2: nothing after the step-20 validation
    until the job was killed). Megatron-LM's fully_shard path mocks these states the same way.

    Here the state dict of each optimizer is rebuilt in its ``param_groups`` order, identical on
    every rank, and a parameter without state gets zero DTensors of its (empty) local shard
    under the DTensor keys the other ranks have (agreed by one ``all_gather_object``). Empty
    shards write nothing; the ``step`` counters stay those of the ranks that hold a shard. The
    per-parameter dicts that were there are the same objects, so a DCP load fills them in place;
    ``state`` itself and the optimizer are not modified (the placeholders never reach
    ``optimizer.load_state_dict``). A rank whose parameter names differ raises on every rank.
    """
    from megatron.core import parallel_state
    from torch.distributed.tensor import DTensor

    if optimizer is None or "optimizer" not in state:
        return state
    pairs = _optimizer_states(optimizer, state["optimizer"])
    local = []
    for opt, sd in pairs:
        keys = sorted({k for entry in sd["state"].values() if isinstance(entry, dict)
                       for k, v in entry.items() if isinstance(v, DTensor)})
        names = [opt._param_name(p) for group in opt.optimizer.param_groups for p in group["params"]]
        local.append((keys, names))
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    gathered: List[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    if parallel_state.get_expert_model_parallel_world_size() == 1:
        for rank_local in gathered:
            if [n for _, n in rank_local] != [n for _, n in local]:
                raise RuntimeError("Megatron-FSDP checkpoint: the optimizers of the data-parallel ranks hold "
                                   "different parameters; refusing to enter DCP's per-tensor collectives")
    new_optimizer: Any = {} if len(pairs) > 1 else None
    for i, (opt, sd) in enumerate(pairs):
        keys = sorted({k for rank_local in gathered for k in rank_local[i][0]})
        packed = sd["state"]
        ordered: Dict[str, Any] = {}
        for group_ in opt.optimizer.param_groups:
            for p in group_["params"]:
                name = opt._param_name(p)
                entry = packed.get(name)
                if entry is None and isinstance(p, DTensor) and keys:
                    entry = {k: DTensor.from_local(torch.zeros_like(p.to_local()), p.device_mesh, p.placements,
                                                   run_check=False, shape=p.shape, stride=p.stride())
                             for k in keys}
                if entry is not None:
                    ordered[name] = entry
        ordered.update((k, v) for k, v in packed.items() if k not in ordered)
        completed = {**sd, "state": ordered}
        if new_optimizer is None:
            new_optimizer = completed
        else:
            new_optimizer[i] = completed
    return {**state, "optimizer": new_optimizer}


def _preprocess(state: Dict[str, Any], model: List[torch.nn.Module]) -> Dict[str, Any]:
    """Megatron-LM's ``preprocess_fsdp_dtensor_state_dict`` with megatron-core 0.16.1's helpers:
    drop fp8 extra state, split gated-linear-unit ``linear_fc1`` into ``_w``/``_v``, localise
    expert indices, and attach the chunk metadata of unevenly sharded DTensors."""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer.fsdp_dtensor_checkpoint import (
        handle_experts_in_state_dict,
        handle_fp8_extra_state_case,
        handle_swiglu_in_state_dict,
    )

    fsdp_module = _fsdp_module(model)
    config = fsdp_module.config
    state = dict(state)
    handle_fp8_extra_state_case(state["model"])
    if config.gated_linear_unit:
        state["model"], optimizer_state = handle_swiglu_in_state_dict(
            fsdp_module, state["model"], state.get("optimizer")
        )
        if optimizer_state is not None:
            state["optimizer"] = optimizer_state
    if config.num_moe_experts:
        state["model"] = handle_experts_in_state_dict(state["model"], config.num_moe_experts)
    preprocess_state_dict_for_uneven_dtensor(state)
    return state


def _rng_key() -> str:
    return f"rank{dist.get_rank()}"


def _encodable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if str(t.dtype) not in _STATE_DTYPES:
            raise TypeError(f"run/RNG state tensor of dtype {t.dtype}: not one of {sorted(_STATE_DTYPES)}")
        return {"__tensor__": base64.b64encode(t.numpy().tobytes()).decode("ascii"), "dtype": str(t.dtype),
                "shape": list(t.shape)}
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):  # ndarray, numpy scalars
        return _encodable(value.tolist())
    if isinstance(value, tuple):
        return {"__tuple__": [_encodable(v) for v in value]}
    if isinstance(value, list):
        return [_encodable(v) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"run/RNG state dict with a key that is not a string: {sorted(map(repr, value))[:3]}")
        if {"__tensor__", "__tuple__"} & set(value):
            raise TypeError("run/RNG state dict with a key __tensor__ or __tuple__ (the encoding's own)")
        return {k: _encodable(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"run/RNG state value of type {type(value).__name__}: not JSON, a tuple or a tensor")


def encode_state(value: Any) -> str:
    """JSON text of the run state or RNG state of a Megatron-FSDP checkpoint (no pickle).

    ``value``: nested dicts (string keys), lists, tuples, numbers, strings, ``None``, numpy
    arrays (written as lists) and CPU/CUDA tensors of :data:`_STATE_DTYPES` (written as
    ``{"__tensor__": base64 of the bytes, "dtype", "shape"}``); tuples as ``{"__tuple__": [...]}``
    so that ``random.setstate`` and ``np.random.set_state`` get theirs back.

    Raises:
        TypeError: a value of another type.
    """
    return json.dumps(_encodable(value), separators=(",", ":"))


def _decoded(value: Any) -> Any:
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    if isinstance(value, dict):
        if "__tuple__" in value:
            return tuple(_decoded(v) for v in value["__tuple__"])
        if "__tensor__" in value:
            dtype = _STATE_DTYPES[value["dtype"]]
            data = bytearray(base64.b64decode(value["__tensor__"], validate=True))
            flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
            return flat.reshape([int(n) for n in value["shape"]]).clone()
        return {k: _decoded(v) for k, v in value.items()}
    return value


def decode_state(text: str) -> Any:
    """The value :func:`encode_state` wrote.

    Raises:
        ValueError: not such JSON text (a ``json.JSONDecodeError``, an unknown tensor dtype, a
            shape that does not fit the bytes).
    """
    try:
        return _decoded(json.loads(text))
    except (KeyError, TypeError, RuntimeError, binascii.Error) as exc:
        raise ValueError(f"not a run/RNG state dlmspec wrote ({type(exc).__name__}: {exc})") from None


class _PlainUnpickler(pickle.Unpickler):
    """Reads a pickle of plain data only (dicts, lists, tuples, numbers, strings, ``None``):
    every global is refused, so nothing in it can run code."""

    def find_class(self, module: str, name: str) -> Any:
        from dlmspec.backends.checkpoint_safety import CheckpointRefused

        raise CheckpointRefused(self.path, f"the run state names the global ({module!r}, {name!r})",
                                global_name=(module, name))


def _read_run_state(stored: Any, path: str) -> Dict[str, Any]:
    """The run state loaded from a checkpoint: :func:`encode_state`'s JSON text, or (written
    before that) a pickle of plain data read by :class:`_PlainUnpickler`."""
    if isinstance(stored, (bytes, bytearray)):
        unpickler = _PlainUnpickler(io.BytesIO(bytes(stored)))
        unpickler.path = os.path.join(path, RUN_STATE_KEY)
        value = unpickler.load()
    elif isinstance(stored, str):
        value = decode_state(stored)
    else:
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: the run state ({RUN_STATE_KEY}) is a {type(stored).__name__}, not the "
                         "JSON text dlmspec writes; save the checkpoint again")
    return value


def dlmspec_entries(run_state: Dict[str, Any], rng_state: Dict[str, Any]) -> Dict[str, Any]:
    """The entries :func:`save_checkpoint_fsdp` adds to the DCP state dict:
    ``{"dlmspec_state": JSON text, "rng_state": {"rank<N>": JSON text}}`` (:func:`encode_state`;
    strings, which DCP stores as byte objects)."""
    return {RUN_STATE_KEY: encode_state(run_state), "rng_state": {_rng_key(): encode_state(rng_state)}}


def save_checkpoint_fsdp(
    path: str,
    *,
    model: List[torch.nn.Module],
    optimizer=None,
    run_state: Dict[str, Any],
    rng_state: Dict[str, Any],
) -> None:
    """Write a Megatron-FSDP checkpoint into the existing directory ``path`` (collective).

    One ``torch.distributed.checkpoint.save`` of: ``model`` (DTensors), ``optimizer``
    (``fsdp_dtensor`` state), ``run_state`` (iteration, consumed samples, seed, scheduler state:
    equal on every rank, JSON text of :func:`encode_state` once under ``dlmspec_state``) and every
    rank's RNG state (JSON text too) under ``rng_state.rank<N>``.
    """
    import torch.distributed.checkpoint as dcp

    state = _state_dict(model, optimizer, is_loading=False)
    state = _preprocess(_symmetric_optimizer_state(state, optimizer), model)
    state.update(dlmspec_entries(run_state, rng_state))
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path))


def load_checkpoint_fsdp(
    path: str,
    *,
    model: List[torch.nn.Module],
    optimizer=None,
    load_rng: bool,
) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """Load a checkpoint of :func:`save_checkpoint_fsdp` into the live model and optimizer
    (collective), as Megatron-LM's ``_load_base_checkpoint`` does for ``fsdp_dtensor``: DCP loads
    in place into the preprocessed DTensors, then the unprocessed model and optimizer state dicts
    (the same storage) go to ``FullyShardedDataParallel.load_state_dict`` and
    ``DistributedOptimizer.load_state_dict``. Read through
    :func:`~dlmspec.backends.checkpoint_safety.dcp_load`: nothing in the checkpoint runs code.
    An RNG state written pickled (before the JSON text) is not restored (``None``).

    Returns:
        ``(run_state, rng_state)``: the ``run_state`` given to :func:`save_checkpoint_fsdp` and
        this rank's RNG state (``None`` unless ``load_rng`` and the checkpoint has this rank's).

    Raises:
        CheckpointRefused: a checkpoint file names a global that could run code.
        ValueError: a run state that is not what dlmspec writes.
    """
    from dlmspec.backends.checkpoint_safety import dcp_load, read_metadata

    raw = _state_dict(model, optimizer, is_loading=True)
    raw_model = dict(raw["model"])
    raw_optimizer = dict(raw["optimizer"]) if "optimizer" in raw else None
    state = _preprocess(_symmetric_optimizer_state(raw, optimizer), model)
    stored = read_metadata(path).state_dict_metadata
    state[RUN_STATE_KEY] = ""
    rng_fqn = f"rng_state.{_rng_key()}"
    if load_rng and rng_fqn in stored:
        state["rng_state"] = {_rng_key(): ""}
    dcp_load(state, path)

    model[0].load_state_dict(raw_model, strict=True)
    if optimizer is not None and raw_optimizer is not None:
        with torch.no_grad():
            optimizer.load_state_dict(raw_optimizer)
    blob = state.get("rng_state", {}).get(_rng_key()) if load_rng else None
    rng = decode_state(blob) if isinstance(blob, str) and blob else None
    return _read_run_state(state[RUN_STATE_KEY], path), rng
