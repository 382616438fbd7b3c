"""Checkpoints: megatron distributed checkpoints, the ``latest`` tracker, resume and failed saves.

Layout of ``CheckpointConfig.save_dir`` (details in docs/runtime.md, "Checkpoints")::

    save_dir/iter_0000100/               megatron distributed checkpoint (model, optimizer,
                                         scheduler, iteration, consumed samples, seed, RNG;
                                         the stage's sharded state, e.g. an RL reference model)
    save_dir/iter_0000100/dlmspec.json   metadata, with the record of the spec that wrote it
    save_dir/iter_0000100/spec.lock.toml the lock file beside train.py
    save_dir/latest                      "iter_0000100", written last and atomically

A directory counts only once ``latest`` names it; a failed save removes its directory and
leaves ``latest`` as it was (:class:`CheckpointSaveError`). :class:`CheckpointManager` is the
loop's side: resume at start, save at intervals, on a stop signal and at the end.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.utils import unwrap_model

from dlmspec.backends.checkpoint_safety import dist_load
from dlmspec.backends.tracker import TrackerError, latest_checkpoint
from dlmspec.names import CHECKPOINT_RECORD, CHECKPOINT_TRACKER

from .config import CheckpointConfig, TrainState
from .distributed import parallel_layout
from .fsdp import (
    DIST_CHECKPOINT_FORMAT,
    FSDP_CHECKPOINT_FORMAT,
    load_checkpoint_fsdp,
    model_uses_megatron_fsdp,
    save_checkpoint_fsdp,
)
from .metrics import MetricsLogger, write_exit_status
from .optim import (
    checkpoint_adam_steps,
    group_hyperparameters,
    optimizer_sharding_metadata,
    prime_optimizer_state,
    restore_group_hyperparameters,
    restore_optimizer_steps,
    set_param_sync_hooks,
    unshare_optimizer_steps,
)
from .rng import check_resume_seed
from .signals import EXIT_SIGNALS, signals_ignored
from .spec_record import LOCK_FILENAME, load_scheduler_state

TRACKER_FILENAME = CHECKPOINT_TRACKER
METADATA_FILENAME = CHECKPOINT_RECORD
#: The distributed checkpoint's entry of the stage's sharded state
#: (:meth:`~dlmspec.backends.megatron.stage.StageBase.sharded_state_dict`).
STAGE_KEY = "stage"


def prestart_checkpoint_helpers() -> None:
    """Start megatron-core's checkpoint-writer helper process now, immune to stop signals.

    ``dist_checkpointing.save`` gets its write-results queue from a ``multiprocessing`` manager
    that it spawns on the first save (``filesystem_async._get_write_results_queue``, renamed
    ``get_write_results_queue`` in megatron-core 0.19). torchrun
    forwards a stop signal to the rank's whole process group, so a manager started before or
    during that signal died of it and the save made on the signal failed with ``EOFError``
    (seen on the H200: the stop arrived during the save at step 100 and no checkpoint was
    left). Started here with the exit signals set to ``SIG_IGN`` (:func:`~dlmspec.backends.megatron.signals.signals_ignored`:
    a disposition that survives spawn's fork and exec), the manager ignores them for
    its life; the rank's own handlers are restored at once. The writers that ``save`` forks
    inherit the rank's Python handler, which records the signal and does not exit, so they survive too.
    A stop signal arriving in the few milliseconds of the swap is lost (torchrun then kills the
    rank after its grace period); it is called once, before training starts.
    """
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    # megatron-core 0.16: _get_write_results_queue; 0.19: get_write_results_queue (renamed)
    start = (getattr(filesystem_async, "get_write_results_queue", None)
             or getattr(filesystem_async, "_get_write_results_queue", None))
    if start is None:  # a megatron-core without the shared queue: save() starts what it needs
        return
    with signals_ignored(EXIT_SIGNALS):
        start()


def checkpoint_name(iteration: int) -> str:
    """Directory name of the checkpoint after ``iteration`` steps."""
    return f"iter_{iteration:07d}"


def read_latest_checkpoint(root: Optional[str]) -> Optional[str]:
    """Path of the checkpoint named by ``root/latest``, or ``None`` if there is none
    (:func:`dlmspec.backends.tracker.latest_checkpoint`, the one reader of the tracker).

    Raises:
        FileNotFoundError: ``latest`` names a directory that does not exist, or is not a regular
            file of one folder name (UTF-8, at most 4 KiB).
    """
    if not root:
        return None
    try:
        return latest_checkpoint(root)
    except TrackerError as exc:
        raise FileNotFoundError(str(exc)) from None


def start_point(ckpt: CheckpointConfig) -> Tuple[Optional[str], Optional[str]]:
    """Where a run's weights come from: ``(checkpoint to resume from, init_from to load)``.

    A resume always wins: with ``ckpt.resume`` and a ``latest`` checkpoint in
    ``load_dir`` (default ``save_dir``) it returns ``(that checkpoint, None)``
    even when ``init_from`` is set, so a restarted job continues its own run
    instead of starting again from the initial weights.  Otherwise
    ``(None, ckpt.init_from)``; ``(None, None)`` means random initialisation.

    Raises:
        FileNotFoundError: If ``latest`` names a directory that does not exist.
    """
    load_root = ckpt.load_dir or ckpt.save_dir
    latest = read_latest_checkpoint(load_root) if ckpt.resume and load_root else None
    if latest is not None:
        return latest, None
    return None, ckpt.init_from or None


def _write_tracker_atomically(root: str, name: str) -> None:
    tmp = os.path.join(root, f".{TRACKER_FILENAME}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(root, TRACKER_FILENAME))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)  # a full disk leaves the old tracker and no temporary file
        raise
    try:
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _rng_state(interval_loss: Optional[List[float]] = None, stage_state: Optional[Dict[str, Any]] = None,
               interval_sums: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """This rank's RNG states (Python, numpy, torch CPU; with CUDA the current device's generator
    and megatron-core's model-parallel RNG tracker), plus ``interval_loss`` when given: the
    ``[loss sum, tokens, skipped updates]`` of the steps since the last train record, which only
    the last pipeline stage's ranks hold (why this is per rank, not common state); and, when not
    empty, the stage's own state (``"stage"``: :meth:`~dlmspec.backends.megatron.stage.StageBase.state_dict`)
    and the interval's report sums (``"interval_sums"``: :func:`interval_sums_state`), so the first
    ``train`` record after a resume averages the stage's metrics over the same steps as an
    uninterrupted run's."""
    state: Dict[str, Any] = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    if interval_loss is not None:
        state["interval_loss"] = [float(v) for v in interval_loss]
    if stage_state:
        state["stage"] = stage_state
    if interval_sums:
        state["interval_sums"] = interval_sums
    return state


def interval_sums_state(sums: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    """The :class:`~dlmspec.backends.megatron.metrics.IntervalMeter`'s report sums as plain values
    (``{key: {"dtype": "float32", "shape": [...], "values": [...]}}``: read back without running
    code, exactly for float32 and float64)."""
    return {str(k): {"dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape),
                     "values": [float(x) for x in v.detach().flatten().tolist()]} for k, v in sums.items()}


def restore_interval_sums(saved: Any, device: torch.device) -> Dict[str, torch.Tensor]:
    """:func:`interval_sums_state`'s inverse; entries that are not of that form are left out."""
    out: Dict[str, torch.Tensor] = {}
    if not isinstance(saved, dict):
        return out
    for key, entry in saved.items():
        dtype = getattr(torch, str(entry.get("dtype")), None) if isinstance(entry, dict) else None
        if not isinstance(dtype, torch.dtype) or not isinstance(entry.get("values"), list):
            continue
        out[key] = torch.tensor(entry["values"], dtype=dtype, device=device).reshape(entry.get("shape") or [-1])
    return out


def _set_rng_state(state: Dict[str, Any]) -> None:
    """Set the RNG states :func:`_rng_state` returned (its ``interval_loss`` is the caller's)."""
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


def _rng_sharded_object(state: Optional[Dict[str, Any]]) -> ShardedObject:
    # Every rank keeps its own RNG state: shard over (pp, tp, dp*cp).
    return ShardedObject(
        "rng_state",
        state,
        (
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_data_parallel_world_size(with_context_parallel=True),
        ),
        (
            parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(with_context_parallel=True),
        ),
        replica_id=0,
    )


def _model_sharded_state_dict(model: List[torch.nn.Module]) -> Dict[str, Any]:
    if len(model) == 1:
        return {"model": unwrap_model(model[0]).sharded_state_dict()}
    return {f"model{i}": unwrap_model(m).sharded_state_dict() for i, m in enumerate(model)}


class CheckpointSaveError(RuntimeError):
    """A checkpoint save failed; the message names the folder, the error, the free space and
    the checkpoint ``latest`` still names (:func:`save_checkpoint`)."""


def _folder_bytes(path: str) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except OSError:
                pass
    return total


def _error_line(exc: BaseException) -> str:
    """The line of ``exc``'s text that says what went wrong: torch's ``CheckpointException``
    holds each rank's traceback, whose last ``...Error: ...`` line is the cause."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]*(Error|Exception)\b[^:]*: ", line)]
    text = f"{type(exc).__name__}: " + (causes[-1] if causes else (lines[0] if lines else ""))
    return text if len(text) <= 400 else text[:397] + "..."


def save_failure_message(root: str, path: str, exc: BaseException) -> str:
    """What a failed save of ``path`` (under ``root``) tells the user: the error
    (:func:`_error_line`), the free space on ``root``'s filesystem (``shutil.disk_usage``), the
    checkpoint ``latest`` still names (and its size: about what the next save needs) and the fix."""
    where = root
    while where and not os.path.isdir(where):
        where = os.path.dirname(where)
    try:
        usage = shutil.disk_usage(where or ".")
        space = f"{usage.free / 2**30:.1f} GiB free of {usage.total / 2**30:.1f} GiB on its filesystem"
    except OSError as err:
        space = f"free space unknown ({err.strerror or err})"
    try:
        previous = read_latest_checkpoint(root)
    except OSError:
        previous = None
    if previous is not None:
        keep = (f"latest still names {os.path.basename(previous)} ({_folder_bytes(previous) / 2**30:.1f} GiB), the "
                "checkpoint a relaunch resumes from")
    else:
        keep = "no earlier checkpoint: a relaunch starts the run again"
    return (f"saving checkpoint {path} failed: {_error_line(exc)}\n"
            f"  {root}: {space}; {keep}; the unfinished {os.path.basename(path)} was removed\n"
            "Fix: free space there, or set checkpoint.save (and checkpoint.load) to a folder with room and compile "
            "again, then launch again")


def save_checkpoint(
    root: str,
    *,
    iteration: int,
    model: List[torch.nn.Module],
    optimizer=None,
    scheduler: Optional[OptimizerParamScheduler] = None,
    consumed_train_samples: int,
    seed: int,
    metadata: Optional[Dict[str, Any]] = None,
    keep_last: Optional[int] = None,
    optimizer_sharding: str = "dp_reshardable",
    spec_lock_text: Optional[str] = None,
    interval_loss: Optional[List[float]] = None,
    stage_state: Optional[Dict[str, Any]] = None,
    stage_sharded_state: Optional[Dict[str, Any]] = None,
    interval_sums: Optional[Dict[str, Any]] = None,
) -> str:
    """Write a megatron distributed checkpoint and then the ``latest`` tracker.

    Collective: every rank must call it.  Holds the model chunks' sharded state
    dicts (``model`` or ``model0..``), the optimizer's (if given), the
    scheduler state, ``iteration``, ``consumed_train_samples``, ``seed`` and the
    per-rank RNG states; rank 0 also writes ``dlmspec.json`` (with ``metadata``)
    and, given ``spec_lock_text``, the run's ``spec.lock.toml``.  ``latest`` is
    replaced atomically only after all ranks finished writing.

    ``optimizer_sharding`` is megatron's ``distrib_optim_sharding_type`` for a
    ``DistributedOptimizer``: ``"dp_reshardable"`` (each rank writes its own
    shard, no communication; on resume only the data-parallel size may change)
    or ``"fully_reshardable"`` (gathered to DP rank 0; any layout on resume).

    ``interval_loss``: this rank's ``[loss sum, tokens, skipped updates]`` of the steps since the
    last train record, kept with its RNG states (:func:`_rng_state`) so that a resumed run's first
    record averages the same steps as an uninterrupted run's. ``stage_state``: this rank's stage
    state, kept there too (nothing when empty). ``stage_sharded_state``: the stage's
    :meth:`~dlmspec.backends.megatron.stage.StageBase.sharded_state_dict`, saved in the same
    distributed checkpoint under the key :data:`STAGE_KEY` (its ``ShardedTensor`` s beside the
    policy's, under their own key prefix, so any parallel layout reads them back; its plain values in
    megatron-core's common state, ``common.pt``); nothing when empty.

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointSaveError: writing failed on this rank (a full disk: ``enforce fail at
            inline_container.cc``, ``No space left on device``): the unfinished directory is
            removed, ``latest`` still names the previous checkpoint, and the message
            (:func:`save_failure_message`) says so with the free space.
    """
    name = checkpoint_name(iteration)
    path = os.path.join(root, name)
    rank = dist.get_rank()
    try:
        _save_checkpoint_files(
            root, path, rank=rank, iteration=iteration, model=model, optimizer=optimizer, scheduler=scheduler,
            consumed_train_samples=consumed_train_samples, seed=seed, metadata=metadata,
            optimizer_sharding=optimizer_sharding, spec_lock_text=spec_lock_text, interval_loss=interval_loss,
            stage_state=stage_state, stage_sharded_state=stage_sharded_state, interval_sums=interval_sums,
        )
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - torch's is a BaseException
        shutil.rmtree(path, ignore_errors=True)  # the partial folder must not stay (latest never names it)
        raise CheckpointSaveError(save_failure_message(root, path, exc)) from exc
    except BaseException:  # KeyboardInterrupt, SystemExit: no partial folder either
        shutil.rmtree(path, ignore_errors=True)
        raise
    if rank == 0 and keep_last:
        old = sorted(d for d in os.listdir(root) if d.startswith("iter_") and d != name)
        for d in old[: max(0, len(old) - (keep_last - 1))]:
            shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    dist.barrier()
    return path


def _save_checkpoint_files(root: str, path: str, *, rank: int, iteration: int, model, optimizer, scheduler,
                           consumed_train_samples: int, seed: int, metadata: Optional[Dict[str, Any]],
                           optimizer_sharding: str, spec_lock_text: Optional[str],
                           interval_loss: Optional[List[float]] = None,
                           stage_state: Optional[Dict[str, Any]] = None,
                           stage_sharded_state: Optional[Dict[str, Any]] = None,
                           interval_sums: Optional[Dict[str, Any]] = None) -> None:
    """:func:`save_checkpoint`'s writes, up to and including the ``latest`` tracker."""
    name = os.path.basename(path)
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        if os.path.isdir(path):
            shutil.rmtree(path)  # a leftover of an interrupted save (latest never named it)
        os.makedirs(path)
    dist.barrier()

    fsdp = model_uses_megatron_fsdp(model)
    if fsdp and stage_sharded_state:
        raise ValueError("a stage's sharded state is saved in megatron-core distributed checkpoints only, not in "
                         "Megatron-FSDP's fsdp_dtensor ones: use parallel.fsdp = \"none\" for this stage")
    if fsdp:
        # megatron's DistributedOptimizer takes only "fsdp_dtensor" under Megatron-FSDP: a
        # torch.distributed.checkpoint of DTensors (backends/megatron/fsdp.py).
        optimizer_sharding = FSDP_CHECKPOINT_FORMAT
        save_checkpoint_fsdp(
            path, model=model, optimizer=optimizer, rng_state=_rng_state(interval_loss, stage_state, interval_sums),
            run_state={"iteration": iteration, "consumed_train_samples": consumed_train_samples, "seed": seed,
                       "opt_param_scheduler": scheduler.state_dict() if scheduler is not None else None},
        )
    else:
        state = _model_sharded_state_dict(model)
        if optimizer is not None:
            state["optimizer"] = optimizer.sharded_state_dict(
                state, metadata=optimizer_sharding_metadata(optimizer_sharding))
        if scheduler is not None:
            state["opt_param_scheduler"] = scheduler.state_dict()
        state["iteration"] = iteration
        state["consumed_train_samples"] = consumed_train_samples
        state["seed"] = seed
        state["rng_state"] = _rng_sharded_object(_rng_state(interval_loss, stage_state, interval_sums))
        if stage_sharded_state:
            # after the optimizer's sharded_state_dict, which maps the model entries of ``state``
            state[STAGE_KEY] = stage_sharded_state
        dist_checkpointing.save(state, path)

    if rank == 0:
        meta = {
            "iteration": iteration,
            "consumed_train_samples": consumed_train_samples,
            "seed": seed,
            "parallel_layout": parallel_layout(),
            "optimizer_sharding": optimizer_sharding,
            "checkpoint_format": FSDP_CHECKPOINT_FORMAT if fsdp else DIST_CHECKPOINT_FORMAT,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        meta.update(metadata or {})
        if spec_lock_text is not None:
            with open(os.path.join(path, LOCK_FILENAME), "w", encoding="utf-8") as f:
                f.write(spec_lock_text)
        with open(os.path.join(path, METADATA_FILENAME), "w") as f:
            json.dump(meta, f, indent=2, default=str)
    dist.barrier()
    if rank == 0:
        _write_tracker_atomically(root, name)


@dataclass
class LoadedCheckpoint:
    """State restored by :func:`load_checkpoint`.

    ``scheduler_changes``: ``(spec key, checkpoint value, this run's value)`` of the schedule
    values this run's scheduler kept instead of the checkpoint's
    (:func:`~dlmspec.backends.megatron.spec_record.load_scheduler_state`).
    ``rank_state``: this rank's saved RNG states (and ``interval_loss``) when the parallel layout
    is the checkpoint's (``rng_restored``), else ``None``; with ``restore_rng=False`` they are
    not set yet (:meth:`CheckpointManager.continue_run` sets them).
    """

    path: str
    iteration: int
    consumed_train_samples: int
    seed: int
    rng_restored: bool
    scheduler_changes: List[Tuple[str, Any, Any]] = field(default_factory=list)
    rank_state: Optional[Dict[str, Any]] = None


def load_checkpoint(
    path: str,
    *,
    model: List[torch.nn.Module],
    optimizer=None,
    scheduler: Optional[OptimizerParamScheduler] = None,
    seed: int,
    restore_rng: bool = True,
) -> LoadedCheckpoint:
    """Load a checkpoint written by :func:`save_checkpoint` into live objects.

    Collective.  The RNG states are restored only when the parallel layout is
    unchanged (they are per rank); weights and optimizer state reshard freely
    as far as megatron's distributed checkpointing allows. ``restore_rng=False`` leaves them to
    the caller (``LoadedCheckpoint.rank_state``): the training loop sets them after building its
    data loaders, whose iterators draw from torch's CPU generator.

    Every file is read without running code in it (:mod:`dlmspec.backends.checkpoint_safety`).

    Raises:
        CheckpointRefused: a checkpoint file names a global that could run code.
        ValueError: If the checkpoint's seed differs from ``seed``
            (:func:`~dlmspec.backends.megatron.rng.check_resume_seed`).
        FileNotFoundError: If ``dlmspec.json`` is missing.
    """
    meta_path = os.path.join(path, METADATA_FILENAME)
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{meta_path} missing: not a dlmspec checkpoint")
    with open(meta_path) as f:
        meta = json.load(f)
    check_resume_seed(meta.get("seed"), seed)
    fmt = meta.get("checkpoint_format", DIST_CHECKPOINT_FORMAT)
    want = FSDP_CHECKPOINT_FORMAT if model_uses_megatron_fsdp(model) else DIST_CHECKPOINT_FORMAT
    if fmt != want:
        raise ValueError(
            f"{path} is a {fmt!r} checkpoint and this run writes {want!r} ones: resume it with the "
            f"parallel.fsdp setting it was saved with ({'megatron' if fmt == FSDP_CHECKPOINT_FORMAT else 'none'})"
        )
    same_layout = meta.get("parallel_layout") == parallel_layout()
    if fmt == FSDP_CHECKPOINT_FORMAT:
        return _load_checkpoint_fsdp(path, model=model, optimizer=optimizer, scheduler=scheduler, seed=seed,
                                     same_layout=same_layout, restore_rng=restore_rng)

    state = _model_sharded_state_dict(model)
    if optimizer is not None:
        prime_optimizer_state(optimizer)
        sharding = meta.get("optimizer_sharding", "dp_reshardable")
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=True, metadata=optimizer_sharding_metadata(sharding)
        )
    if same_layout:
        state["rng_state"] = _rng_sharded_object(None)
    loaded = dist_load(state, path)
    check_resume_seed(loaded.get("seed"), seed)

    if len(model) == 1:
        unwrap_model(model[0]).load_state_dict(loaded["model"])
    else:
        for i, chunk in enumerate(model):
            unwrap_model(chunk).load_state_dict(loaded[f"model{i}"])
    if optimizer is not None:
        hyper = group_hyperparameters(optimizer)
        # Under no_grad: with fp32 weights the distributed optimizer's main parameters are views
        # of the model's leaf parameters, and megatron-core 0.16.1 copies the loaded state into
        # them in place (DistributedOptimizer._set_main_param_and_optimizer_states), which
        # autograd refuses with grad mode on (seen on the H200: resuming an fp32 run failed).
        steps = checkpoint_adam_steps(optimizer, loaded["optimizer"])
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
        restore_group_hyperparameters(optimizer, hyper)
        restore_optimizer_steps(optimizer, steps)
    changes = []
    if scheduler is not None and "opt_param_scheduler" in loaded:
        changes = load_scheduler_state(scheduler, loaded["opt_param_scheduler"])
    rank_state = loaded.get("rng_state") if same_layout else None
    if rank_state is not None and restore_rng:
        _set_rng_state(rank_state)
    dist.barrier()
    return LoadedCheckpoint(
        path=path,
        iteration=int(loaded["iteration"]),
        consumed_train_samples=int(loaded["consumed_train_samples"]),
        seed=int(loaded["seed"]),
        rng_restored=bool(same_layout),
        scheduler_changes=changes,
        rank_state=rank_state,
    )


def _load_checkpoint_fsdp(path: str, *, model, optimizer, scheduler, seed: int, same_layout: bool,
                          restore_rng: bool = True) -> LoadedCheckpoint:
    """:func:`load_checkpoint` for a Megatron-FSDP (``fsdp_dtensor``) checkpoint."""
    hyper = group_hyperparameters(optimizer) if optimizer is not None else None
    run_state, rng = load_checkpoint_fsdp(path, model=model, optimizer=optimizer, load_rng=same_layout)
    if optimizer is not None:
        restore_group_hyperparameters(optimizer, hyper)
    check_resume_seed(run_state.get("seed"), seed)
    if optimizer is not None:
        unshare_optimizer_steps(optimizer)
    changes = []
    if scheduler is not None and run_state.get("opt_param_scheduler") is not None:
        changes = load_scheduler_state(scheduler, run_state["opt_param_scheduler"])
    if rng is not None and restore_rng:
        _set_rng_state(rng)
    dist.barrier()
    return LoadedCheckpoint(
        path=path,
        iteration=int(run_state["iteration"]),
        consumed_train_samples=int(run_state["consumed_train_samples"]),
        seed=int(run_state["seed"]),
        rng_restored=rng is not None,
        scheduler_changes=changes,
        rank_state=rng,
    )


class CheckpointManager:
    """The loop's checkpoints: the resume at start, and saves at intervals, on a signal and at the end.

    :func:`save_checkpoint` and :func:`load_checkpoint` with this run's objects, logged through
    ``logger``; every rank calls :meth:`save` and :meth:`resume` (they are collective).

    Args:
        config: The run's :class:`~dlmspec.backends.megatron.config.CheckpointConfig`.
        model, optimizer, scheduler: What a checkpoint holds.
        ddp_config: For the parameter-gather hooks around a save
            (:func:`~dlmspec.backends.megatron.optim.set_param_sync_hooks`).
        seed: The run's seed (saved, and compared on resume).
        logger: The rank's :class:`~dlmspec.backends.megatron.metrics.MetricsLogger`.
        metadata: Entries of every checkpoint's ``dlmspec.json`` besides the ``reason``.
        spec_lock_text: The run's ``spec.lock.toml`` (copied into every checkpoint), or ``None``.
        stage: The stage's ``state_dict()`` / ``load_state_dict()`` (a
            :class:`~dlmspec.backends.megatron.stage.StageSeam`): saved per rank with the RNG states,
            restored by :meth:`continue_run`; and its ``sharded_state_dict()`` /
            ``load_sharded_state_dict()``: saved in the distributed checkpoint (:data:`STAGE_KEY`),
            restored by :meth:`continue_run` in any parallel layout; ``None``: nothing.
    """

    def __init__(self, config: CheckpointConfig, *, model: List[torch.nn.Module], optimizer, scheduler,
                 ddp_config: Optional[DistributedDataParallelConfig], seed: int, logger: MetricsLogger,
                 metadata: Dict[str, Any], spec_lock_text: Optional[str], stage: Any = None) -> None:
        self.config = config
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.ddp_config = ddp_config
        self.seed = seed
        self.logger = logger
        self.metadata = metadata
        self.spec_lock_text = spec_lock_text
        self.stage = stage
        self._rank_state: Optional[Dict[str, Any]] = None
        self._resumed: Optional[Tuple[str, int]] = None

    def resume(self, path: str) -> TrainState:
        """Load the checkpoint at ``path`` (:func:`load_checkpoint`) and return the progress it holds.

        The RNG states and the interval's loss sums wait for :meth:`continue_run`.

        Raises:
            ValueError: as :func:`load_checkpoint` (another seed, another checkpoint format).
        """
        loaded = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                 seed=self.seed, restore_rng=False)
        self._rank_state = loaded.rank_state
        self._resumed = (path, loaded.iteration)
        iteration, consumed = loaded.iteration, loaded.consumed_train_samples
        self.logger.text(f"resumed from {path} at iteration {iteration} (consumed {consumed} samples)")
        if loaded.scheduler_changes:
            self.logger.text("[dlmspec] resume: the learning-rate schedule follows this spec, not the checkpoint: "
                             + ", ".join(f"{key} {old!r} -> {new!r}" for key, old, new in loaded.scheduler_changes))
        self.logger.record("resume", {"iteration": iteration, "checkpoint": path, "consumed_train_samples": consumed,
                                      "scheduler_changes": [list(c) for c in loaded.scheduler_changes]})
        return TrainState(iteration=iteration, consumed_train_samples=consumed, resumed_from=iteration,
                          last_checkpoint=path, saved_at=iteration)

    def continue_run(self, meter) -> None:
        """What a resumed run restores last, just before its first step: this rank's RNG states,
        and into ``meter`` (the loop's :class:`~dlmspec.backends.megatron.metrics.IntervalMeter`)
        the loss sums and skipped updates of the log interval the stop fell in, and the stage's own
        state (``stage.load_state_dict``). Nothing without a resume, or after one into another
        parallel layout. Then, after any resume (any layout), the stage's sharded state
        (:meth:`_load_stage_sharded`). Collective.

        Last, because what the loop builds after loading the checkpoint draws random numbers: each
        DataLoader iterator draws its base seed from torch's CPU generator, so the RNG states
        restored before the data were one draw ahead of the uninterrupted run's at its next step.
        And after the stage's ``prepare_model``: what a stage keeps in its sharded state (the RL
        stage's reference model) is built there.
        """
        rank_state, self._rank_state = self._rank_state, None
        resumed, self._resumed = self._resumed, None
        if self.stage is not None and rank_state is not None and "stage" in rank_state:
            self.stage.load_state_dict(rank_state["stage"])
        if self.stage is not None and resumed is not None:
            self._load_stage_sharded(*resumed)
        if rank_state is None:
            return
        _set_rng_state(rank_state)
        if "interval_loss" in rank_state:
            loss_sum, tokens, skipped = rank_state["interval_loss"]
            meter.loss += torch.tensor([loss_sum, tokens], dtype=meter.loss.dtype, device=meter.loss.device)
            meter.skipped += int(skipped)
        for key, value in restore_interval_sums(rank_state.get("interval_sums"), meter.loss.device).items():
            meter.sums[key] = value if key not in meter.sums else meter.sums[key] + value

    def _load_stage_sharded(self, path: str, iteration: int) -> None:
        """Hand the stage its sharded state of the checkpoint at ``path``: ``common``, the plain
        values it saved under :data:`STAGE_KEY` (megatron-core's ``common.pt``, read without
        running code: :func:`~dlmspec.backends.checkpoint_safety.check_common_file`; ``None`` for
        a checkpoint without them: written before the stage kept any, or a Megatron-FSDP one), and
        ``load(template)``, a collective ``dist_checkpointing.load`` of ``template``'s sharded
        tensors (:func:`~dlmspec.backends.checkpoint_safety.dist_load`, resharded to this run's
        layout) returning the loaded entries."""
        common = None
        if not model_uses_megatron_fsdp(self.model):
            from dlmspec.backends.checkpoint_safety import check_common_file

            saved = check_common_file(path)
            entry = saved.get(STAGE_KEY) if isinstance(saved, dict) else None
            common = entry if isinstance(entry, dict) else None

        def load(template: Dict[str, Any]) -> Dict[str, Any]:
            return dist_load({STAGE_KEY: template}, path)[STAGE_KEY]

        self.stage.load_sharded_state_dict(common, load, checkpoint=path, iteration=iteration)

    def save(self, state: TrainState, reason: str, meter=None) -> str:
        """Checkpoint the current step and record it in ``state``; returns the directory.

        With ``meter`` (the loop's :class:`~dlmspec.backends.megatron.metrics.IntervalMeter`), the
        loss sums and skipped updates since the last train record go into the checkpoint
        (:meth:`continue_run` adds them back on resume).

        Raises:
            SystemExit: code 2 after the message of a :class:`CheckpointSaveError` on stderr (and an
                ``exit`` record and ``exit_status.json``): every rank that failed says it, with no
                collective (the other ranks may be stuck in the save; torchrun ends them once this
                one exits).
        """
        root, iteration = self.config.save_dir, state.iteration
        set_param_sync_hooks(self.model, self.ddp_config, enable=False)
        # Said before the (collective) save starts, so a save that never returns is visible.
        fmt = FSDP_CHECKPOINT_FORMAT if model_uses_megatron_fsdp(self.model) else DIST_CHECKPOINT_FORMAT
        self.logger.text(f"saving checkpoint {os.path.join(root, checkpoint_name(iteration))} ({reason}, {fmt}) ...")
        t0 = time.perf_counter()
        try:
            path = save_checkpoint(
                root, iteration=iteration, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                consumed_train_samples=state.consumed_train_samples, seed=self.seed, keep_last=self.config.keep_last,
                optimizer_sharding=self.config.optimizer_sharding, metadata={"reason": reason, **self.metadata},
                spec_lock_text=self.spec_lock_text,
                interval_loss=None if meter is None else [*meter.loss.tolist(), meter.skipped],
                interval_sums=None if meter is None else interval_sums_state(meter.sums),
                stage_state=None if self.stage is None else self.stage.state_dict(),
                stage_sharded_state=None if self.stage is None else self.stage.sharded_state_dict(),
            )
        except CheckpointSaveError as exc:
            self.logger.record("exit", {"iteration": iteration, "reason": "checkpoint save failed", "error": str(exc),
                                        "checkpoint": state.last_checkpoint})
            write_exit_status(self.logger.run_dir, self.logger.enabled, "checkpoint_save_failed", iteration,
                              state.last_checkpoint, None)
            print(f"train.py: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        set_param_sync_hooks(self.model, self.ddp_config, enable=True)
        seconds = time.perf_counter() - t0
        self.logger.text(f"saved checkpoint {path} ({reason}, {seconds:.1f} s)")
        self.logger.record("checkpoint", {"iteration": iteration, "path": path, "reason": reason, "seconds": seconds})
        state.last_checkpoint, state.saved_at = path, iteration
        return path
