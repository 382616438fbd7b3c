"""The training loop: megatron-core objects glued to dlmspec's objectives.

A compiled ``train.py`` constructs megatron-core's ``TransformerConfig``,
``DistributedDataParallelConfig`` and ``OptimizerConfig``, a layer spec
(:func:`dlmspec.backends.megatron.layers.build_layer_spec`) and a :class:`RunConfig`, and
calls :func:`train`.  ``train`` then

1. initialises ``torch.distributed`` from the ``torchrun`` environment (NCCL on
   GPU, gloo on CPU; a plain ``python train.py`` runs as a world of one) and
   ``parallel_state.initialize_model_parallel(tp, pp, vpp, cp, ep, etp)``,
2. seeds like Megatron-LM (``seed + 100 * pp_rank``,
   ``model_parallel_cuda_manual_seed``),
3. builds the model chunks (``GPTModel`` -> ``Float16Module`` -> megatron DDP),
   ``get_megatron_optimizer`` (bf16/fp16 training keeps fp32 main weights in
   megatron's ``Float16OptimizerWithFloat16Params`` / ``DistributedOptimizer``;
   gradient clipping is ``OptimizerConfig.clip_grad``) and an
   ``OptimizerParamScheduler`` (linear warm-up, then cosine / linear / WSD /
   constant decay to ``OptimizerConfig.min_lr``, stepped once per iteration),
4. resumes from the ``latest`` checkpoint of the save directory if there is one,
   else loads ``CheckpointConfig.init_from``'s weights (a Hugging Face folder,
   converted once into a cache, or a megatron-core checkpoint:
   :mod:`dlmspec.backends.megatron.init_from`) and starts at iteration 0,
5. runs ``get_forward_backward_func()`` (no pipelining, 1F1B or interleaved 1F1B
   depending on the parallel sizes) with :class:`ObjectiveForwardStep`, then
   ``optimizer.step()`` and the scheduler, and
6. logs, evaluates, checkpoints (``megatron.core.dist_checkpointing``) and
   exits cleanly on SIGTERM / SIGUSR1.

Checkpoint layout (``CheckpointConfig.save_dir``)::

    save_dir/iter_0000100/   megatron distributed checkpoint (model, optimizer,
                             scheduler, iteration, consumed samples, seed, RNG)
    save_dir/iter_0000100/dlmspec.json   human-readable metadata, with the
                             record of the spec that wrote it
                             (backends/megatron/spec_record.py)
    save_dir/iter_0000100/spec.lock.toml the lock file beside train.py
                             (with Megatron-FSDP the directory is a
                             torch.distributed.checkpoint instead:
                             backends/megatron/fsdp.py)
    save_dir/latest          "iter_0000100" - written last, atomically
                             (write temp file, fsync, rename)

A checkpoint directory only counts once ``latest`` names it, so an interrupted
save is never resumed from; a save that fails (a full disk) removes its
directory and leaves ``latest`` as it was (:class:`CheckpointSaveError`, exit
code 2).  Before megatron-core starts, ``train`` checks the data files, the
checkpoint to resume from (its spec record against this run's) and the CUDA
device (:func:`start_checks`); it then loads the checkpoint named by ``latest``
in ``load_dir`` (default: ``save_dir``), with this spec's learning-rate
schedule where it changed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import get_batch_on_this_cp_rank, get_model_config, unwrap_model

from dlmspec.errors import REQUEUE_EXIT_CODE  # "saved, requeue me": launch.sbatch requeues on it
from dlmspec.flops import model_flops_per_token as _model_flops_per_token

from .data import (
    missing_data_files,
    data_problems,
    DataConfig,
    batch_to_device,
    build_dataloader,
    build_datasets,
    combine_attention_masks,
    document_attention_mask,
)
from .fsdp import (
    DIST_CHECKPOINT_FORMAT,
    FSDP_CHECKPOINT_FORMAT,
    check_megatron_fsdp,
    load_checkpoint_fsdp,
    model_uses_megatron_fsdp,
    save_checkpoint_fsdp,
    uses_megatron_fsdp,
)
from .hostbench import record_host_launch
from .init_from import InitFromError, InitSource, default_cache_dir, initialize_from
from .layers import (
    BACKEND_TRANSFORMER_ENGINE,
    build_model,
    count_parameters,
    layer_spec_attention,
    layer_spec_backend,
    layer_spec_fusions,
)
from .objective import ObjectiveBatch, build_objective, loss_triple, reduce_loss
from .output_loss import defer_output_projection, linear_cross_entropy, resolve_fused_linear_impl
from .profiling import StepProfiler, format_summary
from .rope import install_fused_rope
from .rng import TRAIN_STREAM, VALID_STREAM, check_resume_seed, masking_generator
from .spec_record import (
    LOCK_FILENAME,
    ResumeCheck,
    ResumeRefused,
    SpecLock,
    check_resume,
    load_scheduler_state,
    read_spec_lock,
    spec_metadata,
    spec_record,
)

TRACKER_FILENAME = "latest"
METADATA_FILENAME = "dlmspec.json"


# --------------------------------------------------------------------------- config


@dataclass
class ObjectiveConfig:
    """Which loss to train (see :mod:`dlmspec.backends.megatron.objective`).

    Attributes:
        kind: ``"mdm"`` (masked diffusion, bidirectional attention) or ``"ar"``
            (next-token prediction, causal attention).
        mask_token_id: MDM mask id (< padded vocab size).
        eps: MDM minimum noise level, ``t ~ U(eps, 1)``.
        loss_weighting: MDM ``"llada"`` (1/t) or ``"realised"`` (1/realised ratio).
        variable_length_prob: MDM probability of truncating a sequence to a
            random length (LLaDA: 0.01).
    """

    kind: str = "mdm"
    mask_token_id: Optional[int] = None
    eps: float = 1e-3
    loss_weighting: str = "llada"
    variable_length_prob: float = 0.0


@dataclass
class ScheduleConfig:
    """Batch sizes, length of the run, learning-rate schedule and evaluation.

    The peak and final learning rates are ``OptimizerConfig.lr`` and
    ``OptimizerConfig.min_lr``; the weight decay is
    ``OptimizerConfig.weight_decay`` unless ``start/end_weight_decay`` are set.

    Attributes:
        micro_batch_size: Sequences per microbatch per data-parallel rank.
        global_batch_size: Sequences per optimizer step over all ranks; a
            multiple of ``micro_batch_size * data_parallel_size``.
        train_iters: Optimizer steps of the whole run.
        lr_warmup_iters: Linear warm-up steps from ``lr_warmup_init``.
        lr_warmup_init: Learning rate at step 0.
        lr_decay_iters: Step at which decay reaches ``min_lr`` (default
            ``train_iters``).
        lr_decay_style: ``"cosine"``, ``"linear"``, ``"constant"``, ``"WSD"``
            or ``"inverse-square-root"`` (megatron's names).
        lr_wsd_decay_iters: WSD: length of the final decay phase.
        lr_wsd_decay_style: WSD decay shape: ``"linear"``, ``"cosine"``,
            ``"exponential"``, ``"minus_sqrt"``.
        start_weight_decay, end_weight_decay, weight_decay_incr_style:
            megatron's weight-decay schedule (``"constant"``, ``"linear"``,
            ``"cosine"``); ``None`` = ``OptimizerConfig.weight_decay``.
        eval_interval: Evaluate every this many steps (``None``: never).
        eval_iters: Global batches per evaluation (always the same batches and
            masks, so evaluations are comparable).
        stop_at_iteration: Save and stop once this step count is reached
            (splits a run over several jobs); ``None``: run to ``train_iters``.
    """

    micro_batch_size: int = 1
    global_batch_size: int = 1
    train_iters: int = 1000
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0
    lr_decay_iters: Optional[int] = None
    lr_decay_style: str = "cosine"
    lr_wsd_decay_iters: Optional[int] = None
    lr_wsd_decay_style: str = "linear"
    start_weight_decay: Optional[float] = None
    end_weight_decay: Optional[float] = None
    weight_decay_incr_style: str = "constant"
    eval_interval: Optional[int] = None
    eval_iters: int = 10
    stop_at_iteration: Optional[int] = None


@dataclass
class CheckpointConfig:
    """Saving and resuming.

    Attributes:
        save_dir: Checkpoint root (``None``: never save).
        save_interval: Save every this many steps (``None``: only at the end,
            on a signal and at ``stop_at_iteration``).
        load_dir: Where to resume from (default ``save_dir``).
        resume: Resume from ``load_dir``'s ``latest`` checkpoint if it exists.
        save_at_end: Save after the last step.
        exit_signals: Signals that trigger save-and-exit (SLURM sends SIGTERM
            at the time limit and, with ``--signal=USR1@<s>``, SIGUSR1 earlier).
        signal_exit_code: Process exit code after a signal-triggered save
            (default :data:`REQUEUE_EXIT_CODE` = 85, which dlmspec's SLURM script
            requeues on).
        keep_last: Keep only this many newest checkpoints (``None``: all).
        override_scheduler_on_resume: On resume use this run's schedule
            settings instead of requiring them to equal the checkpoint's.
        optimizer_sharding: ``"dp_reshardable"`` (fast; on resume only the
            data-parallel size may change) or ``"fully_reshardable"`` (resume
            with any parallel layout) - megatron's ``DistributedOptimizer``
            checkpoint formats; ``"fsdp_dtensor"``, the only one megatron takes
            under Megatron-FSDP (:mod:`dlmspec.backends.megatron.fsdp`), is used there
            whatever this says.
        init_from: Initial weights of a fresh run: ``"hf:PATH"`` (a Hugging
            Face folder, converted once into ``init_cache_dir``) or
            ``"mcore:PATH"`` (a megatron-core dist checkpoint); model weights
            only, the optimizer and schedule start at iteration 0.  Ignored
            when there is a checkpoint to resume from (:func:`start_point`).
            ``None``: random initialisation.
        init_cache_dir: Where ``hf:`` weights are converted to (default
            ``<save_dir>/init_from_hf``, or ``<run_dir>/init_from_hf``); must
            be on a filesystem every node sees.
    """

    save_dir: Optional[str] = None
    save_interval: Optional[int] = None
    load_dir: Optional[str] = None
    resume: bool = True
    save_at_end: bool = True
    exit_signals: Tuple[str, ...] = ("SIGTERM", "SIGUSR1")
    signal_exit_code: int = REQUEUE_EXIT_CODE
    keep_last: Optional[int] = None
    override_scheduler_on_resume: bool = False
    optimizer_sharding: str = "dp_reshardable"
    init_from: Optional[str] = None
    init_cache_dir: Optional[str] = None


@dataclass
class LoggingConfig:
    """Console, TensorBoard and metrics-file logging.

    Attributes:
        run_dir: Directory of ``metrics.jsonl`` and ``tensorboard/``.
        log_interval: Log every this many steps.
        tensorboard: Write TensorBoard scalars if ``torch.utils.tensorboard``
            imports.
        console: ``"auto"`` (rich if importable), ``"rich"`` or ``"plain"``.
        peak_tflops_per_gpu: Dense bf16 peak of one GPU in TFLOP/s for MFU
            (H100/H200 SXM: 989); ``None``: MFU not reported.
        profile: Record steps ``profile_step_start .. profile_step_end - 1`` with
            ``torch.profiler`` on ``profile_ranks`` (Megatron-LM's ``--profile
            --use-pytorch-profiler``); :mod:`dlmspec.backends.megatron.profiling` writes the trace
            and a per-category kernel summary to ``<run_dir>/profile/``.
        profile_step_start, profile_step_end, profile_ranks: The window and the ranks.
    """

    run_dir: str = "runs/dlmspec"
    log_interval: int = 10
    tensorboard: bool = True
    console: str = "auto"
    peak_tflops_per_gpu: Optional[float] = None
    profile: bool = False
    profile_step_start: int = 10
    profile_step_end: int = 12
    profile_ranks: Sequence[int] = (0,)


@dataclass
class KernelConfig:
    """Kernel choices of the runtime that change speed and memory, not the result.

    Attributes:
        cross_entropy: ``"megatron"`` (``GPTModel`` computes ``[s, b, V]`` logits and
            megatron's vocab-parallel cross entropy, fused or not per
            ``TransformerConfig.cross_entropy_loss_fusion``) or ``"fused_linear"``
            (:mod:`dlmspec.backends.megatron.output_loss`: the output projection and the cross
            entropy in row chunks, on the positions with a non-zero loss weight only;
            tensor-parallel size 1 only).
        fused_linear_impl: ``"auto"``, ``"liger"`` or ``"torch"``
            (:func:`~dlmspec.backends.megatron.output_loss.resolve_fused_linear_impl`).
        apply_rope_fusion: Fused RoPE: on the Transformer Engine path megatron-core's
            ``TransformerConfig.apply_rope_fusion`` (TE's kernel); on the local path
            :func:`dlmspec.backends.megatron.rope.install_fused_rope` (``torch.compile``, CUDA only).
    """

    cross_entropy: str = "megatron"
    fused_linear_impl: str = "auto"
    apply_rope_fusion: bool = False


@dataclass
class RunConfig:
    """Everything about a run that is not a megatron-core config object.

    Attributes:
        objective: :class:`ObjectiveConfig`.
        data: :class:`dlmspec.backends.megatron.data.DataConfig`.
        schedule: :class:`ScheduleConfig`.
        checkpoint: :class:`CheckpointConfig`.
        logging: :class:`LoggingConfig`.
        seed: Base seed: weight init, megatron's data shuffling and the
            masking RNG (stored in checkpoints, checked on resume).
        name: Run name (logged).
        kernels: :class:`KernelConfig`.
        spec_hash: ``[lock] content_hash`` of the spec train.py was compiled from (a literal in
            train.py); recorded in every checkpoint and compared on resume.
        spec_lock_file: The ``spec.lock.toml`` beside train.py; copied into every checkpoint
            when its hash is ``spec_hash`` (:mod:`dlmspec.backends.megatron.spec_record`).
        layer_path: Why the layer spec takes its path (Transformer Engine or local), as the
            compiler resolved ``transformer_impl``; logged with the start record.
    """

    objective: ObjectiveConfig
    data: DataConfig
    schedule: ScheduleConfig
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    seed: int = 1234
    name: str = "dlmspec"
    kernels: KernelConfig = field(default_factory=KernelConfig)
    spec_hash: Optional[str] = None
    spec_lock_file: Optional[str] = None
    layer_path: str = ""


@dataclass
class TrainResult:
    """What :func:`train` returns after a normal end.

    Attributes:
        iteration: Steps completed (counting those before a resume).
        consumed_train_samples: Samples drawn by all ranks.
        exit_reason: ``"completed"`` or ``"stop_at_iteration"``.
        last_train_loss: Loss of the last logged interval (``None`` off the
            logging rank or before any log).
        last_valid_loss: Loss of the last evaluation, if any.
        checkpoint: Directory of the last checkpoint written or loaded.
        resumed_from: Iteration resumed from, ``None`` for a fresh start.
    """

    iteration: int
    consumed_train_samples: int
    exit_reason: str
    last_train_loss: Optional[float] = None
    last_valid_loss: Optional[float] = None
    checkpoint: Optional[str] = None
    resumed_from: Optional[int] = None


# --------------------------------------------------------------------------- FLOPs


def model_flops_per_token(
    *,
    num_layers: int,
    hidden_size: int,
    ffn_hidden_size: int,
    num_attention_heads: int,
    num_query_groups: int,
    kv_channels: int,
    vocab_size: int,
    seq_length: int,
    gated_mlp: bool = True,
    attention: str = "bidirectional",
    block_size: Optional[int] = None,
    num_experts: Optional[int] = None,
    moe_router_topk: int = 1,
    moe_ffn_hidden_size: Optional[int] = None,
    moe_shared_expert_intermediate_size: Optional[int] = None,
    num_moe_layers: Optional[int] = None,
) -> int:
    """Training FLOPs (forward + backward) per token of the model's matmuls: MFU's numerator.

    The count is :func:`dlmspec.flops.model_flops_per_token`, the planner's (one definition; see
    its docstring for the rules and sources). This adapter takes megatron-core's conventions:
    ``None`` for unset MoE sizes, ``moe_ffn_hidden_size`` defaulting to ``ffn_hidden_size``, and
    every layer MoE unless ``num_moe_layers`` says otherwise.

    Returns:
        FLOPs per token, rounded to an int.

    Raises:
        ValueError: For an unknown ``attention`` or a missing ``block_size``.
    """
    moe_layers = (num_layers if num_moe_layers is None else num_moe_layers) if num_experts else 0
    return int(round(_model_flops_per_token(
        num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
        vocab_size, seq_length, gated=gated_mlp, attention=attention, block_size=block_size,
        num_experts=num_experts or 0, moe_router_topk=moe_router_topk if num_experts else 0,
        moe_ffn_hidden_size=(moe_ffn_hidden_size or ffn_hidden_size) if num_experts else 0,
        moe_shared_expert_intermediate_size=moe_shared_expert_intermediate_size or 0,
        num_moe_layers=moe_layers,
    )))


def model_flops_per_token_from_config(
    config: TransformerConfig, *, vocab_size: int, seq_length: int, attention: str, block_size: Optional[int] = None
) -> int:
    """:func:`model_flops_per_token` with the sizes read from a ``TransformerConfig``."""
    return model_flops_per_token(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        ffn_hidden_size=config.ffn_hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_query_groups=config.num_query_groups or config.num_attention_heads,
        kv_channels=config.kv_channels,
        vocab_size=vocab_size,
        seq_length=seq_length,
        gated_mlp=bool(config.gated_linear_unit),
        attention=attention,
        block_size=block_size,
        num_experts=config.num_moe_experts,
        moe_router_topk=config.moe_router_topk,
        moe_ffn_hidden_size=config.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=config.moe_shared_expert_intermediate_size,
        num_moe_layers=_num_moe_layers(config),
    )


def _num_moe_layers(config: TransformerConfig) -> int:
    """MoE layers of the model (megatron-core ``moe_layer_freq``: an int N makes layers 0, N, 2N...
    MoE; a list gives one 0/1 per layer)."""
    if not config.num_moe_experts:
        return 0
    freq = config.moe_layer_freq
    if isinstance(freq, int):
        return sum(1 for i in range(config.num_layers) if i % freq == 0)
    return int(sum(freq))


# --------------------------------------------------------------------------- distributed


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def initialize_distributed(timeout_minutes: int = 30) -> bool:
    """Initialise ``torch.distributed`` from the torchrun environment.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
    ``MASTER_PORT``; without them (a plain ``python train.py``) it sets up a
    world of one on a free local port.  Uses NCCL and ``cuda:LOCAL_RANK`` when
    CUDA is available, gloo otherwise.

    Returns:
        ``True`` if this call created the process group (the caller should
        destroy it), ``False`` if it already existed.
    """
    if dist.is_initialized():
        return False
    if "RANK" not in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        os.environ.setdefault("LOCAL_RANK", "0")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(minutes=timeout_minutes))
    return True


def cuda_problem(local_rank: Optional[int] = None, processes_per_node: Optional[int] = None) -> Optional[str]:
    """One line saying why this process cannot train on a GPU, or ``None`` when it can.

    megatron-core's optimizers and schedules allocate on ``cuda`` (``MixedPrecisionOptimizer``,
    ``forward_backward_no_pipelining``), so :func:`train` needs a CUDA device per process.

    Args:
        local_rank: This process's ``LOCAL_RANK`` (default: the environment's, else 0); it must
            be below the number of visible devices.
        processes_per_node: When given (``train.py --check``, before the processes start), the
            node must show at least this many devices.
    """
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not torch.cuda.is_available():
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return (f"no CUDA device: this torch {torch.__version__} is a CPU-only build; megatron-core trains on "
                    "NVIDIA GPUs: install a CUDA build of torch and run on a GPU node")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return (f"no CUDA device visible to this process{shown}: megatron-core trains on NVIDIA GPUs; run it on "
                "a GPU node (launch.sh, launch.sbatch) and check nvidia-smi there")
    count = torch.cuda.device_count()
    if processes_per_node is not None and count < processes_per_node:
        return (f"{processes_per_node} processes per node need {processes_per_node} GPUs, {count} CUDA device(s) "
                "visible: set [cluster] gpus_per_node to the GPUs a node has (and compile again), or check "
                "CUDA_VISIBLE_DEVICES")
    if local_rank >= count:
        return (f"LOCAL_RANK {local_rank} but only {count} CUDA device(s) visible: start one process per GPU "
                "([cluster] gpus_per_node, CUDA_VISIBLE_DEVICES)")
    return None


def _refuse(message: str) -> None:
    """Print ``train.py: message`` (once per node: local rank 0) and exit with code 2."""
    if os.environ.get("LOCAL_RANK", "0") in ("", "0"):
        print(f"train.py: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------- microbatches


@dataclass
class MicrobatchItem:
    """One microbatch as handed to :class:`ObjectiveForwardStep`.

    Attributes:
        stream: :data:`~dlmspec.backends.megatron.rng.TRAIN_STREAM` or ``VALID_STREAM``.
        iteration: Step index used for the masking RNG.
        index: Microbatch index inside the step on this data-parallel rank.
        batch: Collated CPU batch (``tokens``, ``labels``, ``loss_mask``,
            ``position_ids``, each ``[mbs, s]``).
    """

    stream: int
    iteration: int
    index: int
    batch: Dict[str, torch.Tensor]


class MicrobatchFeed:
    """Feeds one step's microbatches to every model chunk of this rank.

    Megatron's schedules call ``next(data_iterator)`` once per microbatch on
    each pipeline stage and, with virtual pipelining, on each model chunk's own
    iterator.  All chunks of a rank must see the same microbatches in the same
    order, so one loader is read once and the batches of the current step are
    shared by per-chunk views (:attr:`iterators`).

    Args:
        loader: Iterable of collated batches (a DataLoader).
        num_chunks: Number of model chunks on this rank.
        stream: RNG stream id of these microbatches.
    """

    def __init__(self, loader, num_chunks: int, stream: int) -> None:
        self._source = iter(loader)
        self._stream = stream
        self._iteration = 0
        self._batches: List[Dict[str, torch.Tensor]] = []
        self.iterators = [_ChunkView(self) for _ in range(num_chunks)]

    def start(self, iteration: int) -> None:
        """Begin a step: the next ``next()`` on every view returns microbatch 0."""
        self._iteration = iteration
        self._batches = []
        for view in self.iterators:
            view.index = 0

    def get(self, index: int) -> MicrobatchItem:
        """Microbatch ``index`` of the current step (read from the loader on first use).

        Raises:
            StopIteration: When the loader is exhausted.
        """
        while len(self._batches) <= index:
            self._batches.append(next(self._source))
        return MicrobatchItem(self._stream, self._iteration, index, self._batches[index])

    def data_iterator(self):
        """What to pass as ``data_iterator`` to megatron's schedule."""
        return self.iterators if len(self.iterators) > 1 else self.iterators[0]

    def close(self) -> None:
        """Stop the loader's worker processes now (idempotent).

        The views and the feed refer to each other, so the loader's iterator is only freed by
        the garbage collector, possibly never before the interpreter exits. Its workers ignore
        stop signals (:func:`~dlmspec.backends.megatron.data.ignore_exit_signals`), and Python's
        ``multiprocessing`` exit hook SIGTERMs daemonic children and then joins them, so a
        worker still alive at exit hangs the rank for ever after training has finished (seen on
        the H200: runs printed their result and were killed by the runner's time limit).
        ``_shutdown_workers`` is what PyTorch's iterator runs when it is deleted: it tells each
        worker to stop and joins it.
        """
        source, self._source = self._source, iter(())
        shutdown = getattr(source, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self._batches = []


class _ChunkView:
    def __init__(self, feed: MicrobatchFeed) -> None:
        self.feed = feed
        self.index = 0

    def __iter__(self) -> "_ChunkView":
        return self

    def __next__(self) -> MicrobatchItem:
        item = self.feed.get(self.index)
        self.index += 1
        return item


class ObjectiveForwardStep:
    """megatron ``forward_step_func``: objective inputs -> model -> loss function.

    Called by megatron's schedule as ``forward_step(data_iterator, model)``; it
    draws the microbatch's masks with the generator of
    ``(seed, stream, iteration, data_parallel_rank, microbatch_index)``, so all
    pipeline stages and tensor-parallel peers build identical inputs, labels,
    weights and masks, and returns ``(output, loss_func)`` where ``output`` is the
    per-token cross entropy ``[b, s]`` on the last stage (hidden states
    elsewhere) and ``loss_func(output)`` returns
    :func:`~dlmspec.backends.megatron.objective.reduce_loss`'s triple.

    Args:
        objective: A :class:`MaskedDiffusionObjective` or
            :class:`AutoregressiveObjective`.
        seed: The run's base seed.
        data_parallel_rank: This rank's data-parallel rank (without CP).
        eod_id: EOD id (for document masks).
        reset_attention_mask: Build a document mask per microbatch.
        device: Device to compute on.
        context_parallel_size: CP size; >1 slices the sequence with megatron's
            ``get_batch_on_this_cp_rank`` after the objective drew its masks on
            the full sequence (no attention mask allowed then).
    """

    def __init__(
        self,
        objective,
        *,
        seed: int,
        data_parallel_rank: int,
        eod_id: int,
        reset_attention_mask: bool = False,
        device: torch.device,
        context_parallel_size: int = 1,
    ) -> None:
        self.objective = objective
        self.seed = seed
        self.data_parallel_rank = data_parallel_rank
        self.eod_id = eod_id
        self.reset_attention_mask = reset_attention_mask
        self.device = device
        self.context_parallel_size = context_parallel_size
        self._fused_outputs: Dict[int, Tuple[torch.Tensor, str]] = {}

    def prepare(self, item: MicrobatchItem) -> Tuple[ObjectiveBatch, torch.Tensor, Optional[torch.Tensor]]:
        """Return ``(objective_batch, position_ids, attention_mask)`` for a microbatch."""
        batch = batch_to_device(item.batch, self.device)
        tokens = batch["tokens"]
        generator = masking_generator(
            self.seed, item.iteration, self.data_parallel_rank, item.index,
            stream=item.stream, device=self.device,
        )
        if self.objective.kind == "mdm":
            ob = self.objective.prepare(tokens, generator=generator)
        else:
            ob = self.objective.prepare(
                tokens, generator=generator, labels=batch.get("labels"), loss_mask=batch.get("loss_mask")
            )
        doc_mask = document_attention_mask(tokens, self.eod_id) if self.reset_attention_mask else None
        attention_mask = combine_attention_masks(ob.attention_mask, doc_mask)
        position_ids = batch["position_ids"]
        if self.context_parallel_size > 1:
            if attention_mask is not None:
                raise ValueError(
                    "context parallelism cannot take attention masks (variable length / "
                    "document masks); disable them or use context_parallel_size=1"
                )
            sliced = get_batch_on_this_cp_rank(
                {
                    "input_ids": ob.input_ids,
                    "labels": ob.labels,
                    "loss_weights": ob.loss_weights,
                    "token_mask": ob.token_mask,
                    "position_ids": position_ids,
                }
            )
            ob = dataclasses.replace(
                ob,
                input_ids=sliced["input_ids"],
                labels=sliced["labels"],
                loss_weights=sliced["loss_weights"],
                token_mask=sliced["token_mask"],
                num_tokens=sliced["token_mask"].sum().to(torch.int),
            )
            position_ids = sliced["position_ids"]
        return ob, position_ids, attention_mask

    def use_fused_linear_cross_entropy(self, model: List[torch.nn.Module], impl: str) -> Optional[str]:
        """Switch the last stage's chunk(s) to :mod:`~dlmspec.backends.megatron.output_loss`.

        Their output layers then return hidden states and :meth:`__call__` computes the
        loss with :func:`~dlmspec.backends.megatron.output_loss.linear_cross_entropy` and the
        output weight. Returns the implementation used (``"liger"`` / ``"torch"``), or
        ``None`` when this rank holds no last stage.

        Raises:
            ValueError: Tensor-parallel output layer, or an unusable ``impl``.
        """
        resolved = resolve_fused_linear_impl(impl, self.device)
        used = None
        for chunk in model:
            weight = defer_output_projection(chunk)
            if weight is not None:
                self._fused_outputs[id(unwrap_model(chunk))] = (weight, resolved)
                used = resolved
        return used

    def __call__(self, data_iterator: Iterator[MicrobatchItem], model: torch.nn.Module):
        item = next(data_iterator)
        ob, position_ids, attention_mask = self.prepare(item)
        fused = self._fused_outputs.get(id(unwrap_model(model)))
        if fused is not None:
            hidden = model(ob.input_ids, position_ids, attention_mask)  # [b, s, h]: output layer deferred
            return hidden, functools.partial(_fused_loss_func, ob, fused[0], fused[1])
        output = model(ob.input_ids, position_ids, attention_mask, labels=ob.labels)
        return output, functools.partial(_loss_func, ob)


def _loss_func(ob: ObjectiveBatch, output_tensor: torch.Tensor):
    return reduce_loss(output_tensor, ob)


def _fused_loss_func(ob: ObjectiveBatch, weight: torch.Tensor, impl: str, hidden: torch.Tensor):
    loss_sum = linear_cross_entropy(hidden, weight, ob.labels, ob.loss_weights, impl=impl)
    return loss_triple(loss_sum, ob)


def _sum_reports(reports: Sequence[Dict[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    total = torch.zeros(2, dtype=torch.float32, device=device)
    for report in reports:
        if isinstance(report, dict) and "lm loss" in report:
            total += report["lm loss"].to(device=device, dtype=torch.float32)
    if dist.is_initialized():
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    return total


# --------------------------------------------------------------------------- signals


class ExitSignalWatcher:
    """Records exit signals and agrees across ranks on whether one arrived.

    The handler only sets a flag; the loop calls :meth:`any_rank_received`
    after each step, which all-reduces the flag (MAX) over the world so every
    rank saves the same step and exits together, whichever ranks got the
    signal.

    Args:
        names: Signal names (``"SIGTERM"``, ``"SIGUSR1"``, ...).

    Raises:
        ValueError: For an unknown signal name.
    """

    def __init__(self, names: Sequence[str]) -> None:
        self.received: Optional[str] = None
        self._previous = {}
        for name in names:
            sig = getattr(signal, name, None)
            if not isinstance(sig, signal.Signals):
                raise ValueError(f"unknown signal {name!r}")
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def any_rank_received(self, device: torch.device) -> Optional[str]:
        """The signal name if any rank received one (``"remote"`` if not this one)."""
        flag = torch.tensor([1 if self.received else 0], dtype=torch.int32, device=device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) == 0:
            return None
        return self.received or "remote"

    def restore(self) -> None:
        """Reinstall the previous handlers."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


# --------------------------------------------------------------------------- checkpoints


#: Signals that stop a run (and that torchrun / SLURM send to the whole process group).
EXIT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")


def prestart_checkpoint_helpers() -> None:
    """Start megatron-core's checkpoint-writer helper process now, immune to stop signals.

    ``dist_checkpointing.save`` gets its write-results queue from a ``multiprocessing`` manager
    that it spawns on the first save (``filesystem_async._get_write_results_queue``). torchrun
    forwards a stop signal to the rank's whole process group, so a manager started before or
    during that signal died of it and the save made on the signal failed with ``EOFError``
    (seen on the H200: the stop arrived during the save at step 100 and no checkpoint was
    left). Started here with the exit signals set to ``SIG_IGN`` (a disposition that survives
    spawn's fork and exec, unlike handlers and the signal mask), the manager ignores them for
    its life; the rank's own handlers are restored at once. The writers that ``save`` forks
    inherit the rank's Python handler, which only records the signal, so they survive too.
    A stop signal arriving in the few milliseconds of the swap is lost (torchrun then kills the
    rank after its grace period); it is called once, before training starts.
    """
    import threading

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if threading.current_thread() is not threading.main_thread():
        filesystem_async._get_write_results_queue()
        return
    numbers = [getattr(signal, name) for name in EXIT_SIGNALS]
    previous = {n: signal.signal(n, signal.SIG_IGN) for n in numbers}
    try:
        filesystem_async._get_write_results_queue()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def checkpoint_name(iteration: int) -> str:
    """Directory name of the checkpoint after ``iteration`` steps."""
    return f"iter_{iteration:07d}"


def read_latest_checkpoint(root: Optional[str]) -> Optional[str]:
    """Path of the checkpoint named by ``root/latest``, or ``None`` if there is none.

    Raises:
        FileNotFoundError: If ``latest`` names a directory that does not exist.
    """
    if not root:
        return None
    tracker = os.path.join(root, TRACKER_FILENAME)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        name = f.read().strip()
    path = os.path.join(root, name)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{tracker} names {name!r} but {path} does not exist")
    return path


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


def _weights_record(resume_from: Optional[str], init_source: Optional[InitSource], ckpt: CheckpointConfig,
                    seed: int) -> Tuple[Dict[str, Any], str]:
    """The ``start`` record's ``weights`` entry and its console text."""
    if resume_from is not None:
        ignored = f" (checkpoint.init_from {ckpt.init_from!r} not used: a resume continues the run)" if ckpt.init_from else ""
        return {"from": "resume", "checkpoint": resume_from, "init_from_ignored": ckpt.init_from}, \
            f"resumed from {resume_from}{ignored}"
    if init_source is not None:
        return {"from": "init_from", **init_source.to_record()}, init_source.describe()
    return {"from": "random", "seed": seed}, f"random initialisation (seed {seed})"


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


def _parallel_layout() -> Dict[str, int]:
    return {
        "tp": parallel_state.get_tensor_model_parallel_world_size(),
        "pp": parallel_state.get_pipeline_model_parallel_world_size(),
        "dp": parallel_state.get_data_parallel_world_size(),
        "cp": parallel_state.get_context_parallel_world_size(),
        "ep": parallel_state.get_expert_model_parallel_world_size(),
    }


def _rng_state() -> Dict[str, Any]:
    state: Dict[str, Any] = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: Dict[str, Any]) -> None:
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


def _set_param_sync_hooks(model: List[torch.nn.Module], ddp_config: Optional[DistributedDataParallelConfig], enable: bool) -> None:
    # With overlapped parameter all-gather the DistributedOptimizer's updated
    # weights only reach the modules in their next forward pre-hook; force the
    # gather before anything reads the weights outside a training forward.
    if ddp_config is None or not (ddp_config.use_distributed_optimizer and ddp_config.overlap_param_gather):
        return
    if uses_megatron_fsdp(ddp_config):
        return  # Megatron-FSDP gathers parameters in its own pre-forward hooks, also outside training
    for chunk in model:
        if enable:
            chunk.enable_forward_pre_hook()
        else:
            chunk.disable_forward_pre_hook(param_sync=True)


def _optimizer_metadata(sharding: str) -> Dict[str, Any]:
    if sharding not in ("dp_reshardable", "fully_reshardable"):
        raise ValueError(f"optimizer_sharding must be 'dp_reshardable' or 'fully_reshardable', got {sharding!r}")
    # As Megatron-LM passes it (checkpointing.py): no per-optimizer key prefix
    # for chained optimizers.
    return {"distrib_optim_sharding_type": sharding, "chained_optim_avoid_prefix": True}


def _prime_optimizer_state(optimizer) -> None:
    """Give a fresh ``DistributedOptimizer`` the state tensors a load fills in.

    Without Apex/TE, ``DistributedOptimizer.state_dict()`` reads Adam's
    ``step`` from the inner torch optimizer's state, which is empty until the
    first step, so building the *loading* sharded state dict of a new optimizer
    fails.  megatron's ``_init_optimizer_states_with_dummy_values`` (one Adam
    step with zero gradients on the fp32 main weights) creates them; the load
    then overwrites main weights, moments and ``step`` from the checkpoint.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, DistributedOptimizer) and len(opt.optimizer.state) == 0:
            opt._init_optimizer_states_with_dummy_values()


#: Param-group values that come from the spec (``OptimizerConfig`` and megatron-core's
#: ``_get_param_groups``: ``max_lr``/``min_lr`` per group, which ``OptimizerParamScheduler.get_lr``
#: reads before its own); torch's ``load_state_dict`` would bring the checkpoint's back.
GROUP_HYPERPARAMETERS = ("max_lr", "min_lr", "betas", "eps", "start_wd", "end_wd", "wd_mult")


def _group_hyperparameters(optimizer) -> Optional[List[Dict[str, Any]]]:
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    return [{k: group[k] for k in GROUP_HYPERPARAMETERS if k in group} for group in groups]


def _restore_group_hyperparameters(optimizer, before: Optional[List[Dict[str, Any]]]) -> None:
    """Put this run's param-group hyperparameters back after loading an optimizer state.

    Seen on the H200: a resume with ``train.lr`` 1e-3 -> 5e-4 logged lr 1.714e-4 at step 50 of
    the new cosine schedule, the value for ``max_lr`` 1e-3: megatron-core's param groups carry
    ``max_lr``, and the loaded optimizer state restored the checkpoint's. The learning rate and
    weight decay themselves are set by the scheduler each step.
    """
    groups = getattr(optimizer, "param_groups", None)
    if before is None or groups is None or len(before) != len(groups):
        return
    for group, values in zip(groups, before):
        group.update(values)


def _unshare_optimizer_steps(optimizer) -> int:
    """Give every parameter its own Adam ``step`` tensor again; returns how many were replaced.

    megatron-core 0.16.1's ``DistributedOptimizer.load_state_dict`` (the path
    without Apex/TE) assigns *one* ``step`` tensor object to the state of every
    parameter, and torch's Adam increments each parameter's step in place, so
    after a resume the shared step grew by the number of parameters per
    optimizer step and Adam's bias corrections ``1 - beta**step`` jumped to 1
    (an effective learning-rate change of up to ``sqrt(1 - beta2**t) / (1 -
    beta1**t)``).  Seen on the GPU as a resumed run drifting from the
    uninterrupted one; cloning restores per-parameter counters.
    """
    replaced = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None or not hasattr(inner, "state"):
            continue
        for state in inner.state.values():
            step = state.get("step") if isinstance(state, dict) else None
            if torch.is_tensor(step):
                state["step"] = step.clone()
                replaced += 1
    return replaced


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
            optimizer_sharding=optimizer_sharding, spec_lock_text=spec_lock_text,
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
                           optimizer_sharding: str, spec_lock_text: Optional[str]) -> None:
    """:func:`save_checkpoint`'s writes, up to and including the ``latest`` tracker."""
    name = os.path.basename(path)
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        if os.path.isdir(path):
            shutil.rmtree(path)  # a leftover of an interrupted save (latest never named it)
        os.makedirs(path)
    dist.barrier()

    fsdp = model_uses_megatron_fsdp(model)
    if fsdp:
        # megatron's DistributedOptimizer takes only "fsdp_dtensor" under Megatron-FSDP: a
        # torch.distributed.checkpoint of DTensors (backends/megatron/fsdp.py).
        optimizer_sharding = FSDP_CHECKPOINT_FORMAT
        save_checkpoint_fsdp(
            path, model=model, optimizer=optimizer, rng_state=_rng_state(),
            run_state={"iteration": iteration, "consumed_train_samples": consumed_train_samples, "seed": seed,
                       "opt_param_scheduler": scheduler.state_dict() if scheduler is not None else None},
        )
    else:
        state = _model_sharded_state_dict(model)
        if optimizer is not None:
            state["optimizer"] = optimizer.sharded_state_dict(state, metadata=_optimizer_metadata(optimizer_sharding))
        if scheduler is not None:
            state["opt_param_scheduler"] = scheduler.state_dict()
        state["iteration"] = iteration
        state["consumed_train_samples"] = consumed_train_samples
        state["seed"] = seed
        state["rng_state"] = _rng_sharded_object(_rng_state())
        dist_checkpointing.save(state, path)

    if rank == 0:
        meta = {
            "iteration": iteration,
            "consumed_train_samples": consumed_train_samples,
            "seed": seed,
            "parallel_layout": _parallel_layout(),
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
    """

    path: str
    iteration: int
    consumed_train_samples: int
    seed: int
    rng_restored: bool
    scheduler_changes: List[Tuple[str, Any, Any]] = field(default_factory=list)


def load_checkpoint(
    path: str,
    *,
    model: List[torch.nn.Module],
    optimizer=None,
    scheduler: Optional[OptimizerParamScheduler] = None,
    seed: int,
) -> LoadedCheckpoint:
    """Load a checkpoint written by :func:`save_checkpoint` into live objects.

    Collective.  The RNG states are restored only when the parallel layout is
    unchanged (they are per rank); weights and optimizer state reshard freely
    as far as megatron's distributed checkpointing allows.

    Raises:
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
    same_layout = meta.get("parallel_layout") == _parallel_layout()
    if fmt == FSDP_CHECKPOINT_FORMAT:
        return _load_checkpoint_fsdp(path, model=model, optimizer=optimizer, scheduler=scheduler, seed=seed,
                                     same_layout=same_layout)

    state = _model_sharded_state_dict(model)
    if optimizer is not None:
        _prime_optimizer_state(optimizer)
        sharding = meta.get("optimizer_sharding", "dp_reshardable")
        state["optimizer"] = optimizer.sharded_state_dict(
            state, is_loading=True, metadata=_optimizer_metadata(sharding)
        )
    if same_layout:
        state["rng_state"] = _rng_sharded_object(None)
    loaded = dist_checkpointing.load(state, path)
    check_resume_seed(loaded.get("seed"), seed)

    if len(model) == 1:
        unwrap_model(model[0]).load_state_dict(loaded["model"])
    else:
        for i, chunk in enumerate(model):
            unwrap_model(chunk).load_state_dict(loaded[f"model{i}"])
    if optimizer is not None:
        hyper = _group_hyperparameters(optimizer)
        # Under no_grad: with fp32 weights the distributed optimizer's main parameters are views
        # of the model's leaf parameters, and megatron-core 0.16.1 copies the loaded state into
        # them in place (DistributedOptimizer._set_main_param_and_optimizer_states), which
        # autograd refuses with grad mode on (seen on the H200: resuming an fp32 run failed).
        with torch.no_grad():
            optimizer.load_state_dict(loaded["optimizer"])
        _restore_group_hyperparameters(optimizer, hyper)
        _unshare_optimizer_steps(optimizer)
    changes = []
    if scheduler is not None and "opt_param_scheduler" in loaded:
        changes = load_scheduler_state(scheduler, loaded["opt_param_scheduler"])
    if same_layout and loaded.get("rng_state") is not None:
        _set_rng_state(loaded["rng_state"])
    dist.barrier()
    return LoadedCheckpoint(
        path=path,
        iteration=int(loaded["iteration"]),
        consumed_train_samples=int(loaded["consumed_train_samples"]),
        seed=int(loaded["seed"]),
        rng_restored=bool(same_layout),
        scheduler_changes=changes,
    )


def _load_checkpoint_fsdp(path: str, *, model, optimizer, scheduler, seed: int, same_layout: bool) -> LoadedCheckpoint:
    """:func:`load_checkpoint` for a Megatron-FSDP (``fsdp_dtensor``) checkpoint."""
    hyper = _group_hyperparameters(optimizer) if optimizer is not None else None
    run_state, rng = load_checkpoint_fsdp(path, model=model, optimizer=optimizer, load_rng=same_layout)
    if optimizer is not None:
        _restore_group_hyperparameters(optimizer, hyper)
    check_resume_seed(run_state.get("seed"), seed)
    if optimizer is not None:
        _unshare_optimizer_steps(optimizer)
    changes = []
    if scheduler is not None and run_state.get("opt_param_scheduler") is not None:
        changes = load_scheduler_state(scheduler, run_state["opt_param_scheduler"])
    if rng is not None:
        _set_rng_state(rng)
    dist.barrier()
    return LoadedCheckpoint(
        path=path,
        iteration=int(run_state["iteration"]),
        consumed_train_samples=int(run_state["consumed_train_samples"]),
        seed=int(run_state["seed"]),
        rng_restored=rng is not None,
        scheduler_changes=changes,
    )


# --------------------------------------------------------------------------- logging


class MetricsLogger:
    """Console (rich or plain), TensorBoard and JSON-lines metrics of one rank.

    Only the logging rank (the last global rank, which holds the last
    pipeline stage) writes; on other ranks every method is a no-op.

    Args:
        config: :class:`LoggingConfig`.
        enabled: Whether this rank logs.
    """

    def __init__(self, config: LoggingConfig, enabled: bool) -> None:
        self.enabled = enabled
        self._console = None
        self._tb = None
        self._file = None
        if not enabled:
            return
        os.makedirs(config.run_dir, exist_ok=True)
        self._file = open(os.path.join(config.run_dir, "metrics.jsonl"), "a", buffering=1)
        if config.console in ("auto", "rich"):
            try:
                from rich.console import Console

                self._console = Console()
            except ImportError:
                if config.console == "rich":
                    raise
        if config.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(config.run_dir, "tensorboard"))
            except ImportError:
                self._tb = None

    def text(self, message: str) -> None:
        """Print a line to the console."""
        if not self.enabled:
            return
        if self._console is not None:
            self._console.print(message, highlight=False, markup=False)
        else:
            print(message, flush=True)

    def record(self, event: str, values: Dict[str, Any], step: Optional[int] = None) -> None:
        """Append ``{"event": event, **values}`` to metrics.jsonl and numeric values to TensorBoard."""
        if not self.enabled:
            return
        self._file.write(json.dumps({"event": event, "time": time.time(), **values}, default=str) + "\n")
        if self._tb is not None and step is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration":
                    self._tb.add_scalar(f"{event}/{key}", value, step)

    def close(self) -> None:
        """Flush and close the outputs."""
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._file is not None:
            self._file.close()


# --------------------------------------------------------------------------- train


def _check_sizes(
    config: TransformerConfig,
    ddp_config: DistributedDataParallelConfig,
    optimizer_config: OptimizerConfig,
    sizes: Dict[str, Optional[int]],
) -> None:
    expected = {
        "tensor_model_parallel_size": sizes["tp"],
        "pipeline_model_parallel_size": sizes["pp"],
        "virtual_pipeline_model_parallel_size": sizes["vpp"],
        "context_parallel_size": sizes["cp"],
        "expert_model_parallel_size": sizes["ep"],
    }
    for attr, value in expected.items():
        have = getattr(config, attr)
        if have != value:
            raise ValueError(f"TransformerConfig.{attr}={have} but train() was given {value}")
    if sizes["etp"] is not None and config.expert_tensor_parallel_size != sizes["etp"]:
        raise ValueError(
            f"TransformerConfig.expert_tensor_parallel_size={config.expert_tensor_parallel_size} "
            f"but train() was given {sizes['etp']}"
        )
    if ddp_config.use_distributed_optimizer != optimizer_config.use_distributed_optimizer:
        raise ValueError("DDP and optimizer configs disagree on use_distributed_optimizer")
    if bool(optimizer_config.bf16) != bool(config.bf16) or bool(optimizer_config.fp16) != bool(config.fp16):
        raise ValueError("OptimizerConfig.bf16/fp16 must equal TransformerConfig.bf16/fp16")


def check_masks_supported(backend: str, objective: ObjectiveConfig, data: DataConfig) -> None:
    """Refuse attention masks on the Transformer Engine path.

    Variable-length MDM sequences and ``reset_attention_mask`` pass a boolean
    ``attention_mask`` to the model; :class:`SDPACoreAttention` applies it, but
    TE's attention with the ``no_mask``/``causal`` mask type of our TE spec
    would ignore it silently.

    Raises:
        ValueError: If ``backend`` is ``"transformer_engine"`` and a mask would be used.
    """
    if backend != "transformer_engine":
        return
    if objective.kind == "mdm" and objective.variable_length_prob > 0:
        raise ValueError("variable_length_prob > 0 needs the local+sdpa layer spec (use_transformer_engine=False)")
    if data.reset_attention_mask:
        raise ValueError("reset_attention_mask needs the local+sdpa layer spec (use_transformer_engine=False)")


@dataclass
class StartChecks:
    """What :func:`start_checks` found, for :func:`train` to use once megatron-core runs.

    Attributes:
        lock: The run's :class:`~dlmspec.backends.megatron.spec_record.SpecLock`.
        record: This run's :func:`~dlmspec.backends.megatron.spec_record.spec_record`.
        resume_from: The checkpoint to resume from (:func:`start_point`), or ``None``.
        init_from: ``checkpoint.init_from`` to load when not resuming, or ``None``.
        resume_check: The resume comparison (``None`` without a resume).
    """

    lock: SpecLock
    record: Dict[str, Any]
    resume_from: Optional[str]
    init_from: Optional[str]
    resume_check: Optional[ResumeCheck]


def start_checks(run: RunConfig, *, transformer_config: TransformerConfig, layer_spec: ModuleSpec,
                 model_kwargs: Dict[str, Any], optimizer_config: OptimizerConfig,
                 parallel_sizes: Dict[str, Optional[int]], world_size: Optional[int] = None,
                 processes_per_node: Optional[int] = None) -> StartChecks:
    """:func:`train`'s checks before megatron-core starts (no process group, no CUDA yet).

    In order: the data files exist, and each ``.bin``/``.idx`` pair is sound
    (:func:`~dlmspec.backends.megatron.data.data_problems`); the spec lock beside train.py is read;
    a resume's checkpoint records a spec this one may continue
    (:func:`~dlmspec.backends.megatron.spec_record.check_resume`); a CUDA device is there
    (:func:`cuda_problem`). :func:`train` runs them in every process; ``train.py --check``
    (what launch.sh runs before torchrun, which would report a worker's exit code 2 as its own
    exit code 1 under a traceback) runs them once, with ``world_size`` (default: the
    environment's ``WORLD_SIZE``) and ``processes_per_node`` (the GPUs the node must have) as
    compiled. The other arguments are :func:`train`'s.

    Raises:
        SystemExit: code 2 after a message on stderr (``train.py: ...``, printed by local
            rank 0 of each node) naming the file, key or device and the fix.
    """
    missing = missing_data_files(run.data)
    if missing:
        shown = "\n  ".join(missing[:10]) + (f"\n  ... and {len(missing) - 10} more" if len(missing) > 10 else "")
        _refuse(f"data files not found (relative to {os.getcwd()}):\n  {shown}\n"
                "Prepare them with `dlmspec data prepare`, or fix [data] train/valid in the spec.")
    problems = data_problems(run.data)
    if problems:
        _refuse(f"the data cannot be trained on (relative to {os.getcwd()}):\n  " + "\n  ".join(problems))
    lock = read_spec_lock(run.spec_lock_file, run.spec_hash)
    record = spec_record(
        run, transformer_config=transformer_config, model_kwargs=model_kwargs, optimizer_config=optimizer_config,
        attention=layer_spec_attention(layer_spec), block_size=_spec_block_size(layer_spec),
        parallel_sizes=parallel_sizes,
        world_size=world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1") or 1),
        tokenizer=lock.tokenizer,
    )
    try:
        resume_from, init_from = start_point(run.checkpoint)
    except FileNotFoundError as exc:
        _refuse(f"cannot resume: {exc}. Fix: restore that checkpoint, or write the name of an existing iter_* "
                "folder into the 'latest' file (or remove it to start the run again)")
    resume_check = None
    if resume_from is not None:
        try:
            resume_check = check_resume(resume_from, record, content_hash=lock.content_hash)
        except ResumeRefused as exc:
            _refuse(str(exc))
    problem = cuda_problem(processes_per_node=processes_per_node)
    if problem is not None:
        _refuse(problem)
    return StartChecks(lock=lock, record=record, resume_from=resume_from, init_from=init_from,
                       resume_check=resume_check)


def train(
    run: RunConfig,
    *,
    transformer_config: TransformerConfig,
    layer_spec: ModuleSpec,
    model_kwargs: Dict[str, Any],
    ddp_config: DistributedDataParallelConfig,
    optimizer_config: OptimizerConfig,
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    virtual_pipeline_model_parallel_size: Optional[int] = None,
    context_parallel_size: int = 1,
    expert_model_parallel_size: int = 1,
    expert_tensor_parallel_size: Optional[int] = None,
    distributed_timeout_minutes: int = 30,
) -> TrainResult:
    """Train a GPTModel with the run's objective; resume and checkpoint as configured.

    Args:
        run: The :class:`RunConfig`.
        transformer_config: megatron ``TransformerConfig``; its parallel sizes
            must equal the ones passed here.  ``calculate_per_token_loss=True``
            is recommended (exact global-batch normalisation of the loss).
        layer_spec: From :func:`dlmspec.backends.megatron.layers.build_layer_spec`;
            its attention must fit the objective (MDM: bidirectional or
            block_causal, AR: causal).
        model_kwargs: Keyword arguments of
            :func:`dlmspec.backends.megatron.layers.build_model` other than
            ``config``/``layer_spec``/``ddp_config``: ``vocab_size`` (padded),
            ``max_sequence_length``, ``position_embedding_type``,
            ``rotary_base``, ``rotary_percent``,
            ``share_embeddings_and_output_weights``.
        ddp_config: megatron ``DistributedDataParallelConfig``.
        optimizer_config: megatron ``OptimizerConfig`` (``lr`` = peak,
            ``min_lr`` = final, ``clip_grad``, ``weight_decay``, Adam betas...).
        tensor_model_parallel_size ... expert_tensor_parallel_size: Passed to
            ``parallel_state.initialize_model_parallel``; their product with the
            data-parallel size is the world size.
        distributed_timeout_minutes: Collective timeout.

    Returns:
        :class:`TrainResult` after the last step or at ``stop_at_iteration``.

    Raises:
        SystemExit: With ``CheckpointConfig.signal_exit_code`` after a
            signal-triggered checkpoint; with 2 after a message when a start check
            fails (:func:`start_checks`: data, resume record, CUDA) or a checkpoint
            save fails (:class:`CheckpointSaveError`).
        ValueError: On inconsistent configuration (sizes, batch divisibility,
            objective vs attention, mask id vs vocabulary, resume seed).
    """
    sched = run.schedule
    ckpt = run.checkpoint
    parallel_sizes = dict(
        tensor_model_parallel_size=tensor_model_parallel_size, pipeline_model_parallel_size=pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        context_parallel_size=context_parallel_size, expert_model_parallel_size=expert_model_parallel_size,
        expert_tensor_parallel_size=expert_tensor_parallel_size,
    )
    start = start_checks(run, transformer_config=transformer_config, layer_spec=layer_spec, model_kwargs=model_kwargs,
                         optimizer_config=optimizer_config, parallel_sizes=parallel_sizes)
    created_pg = initialize_distributed(distributed_timeout_minutes)
    if ckpt.save_dir:
        prestart_checkpoint_helpers()
    # Installed first so a signal that arrives during setup is honoured after
    # the first step.
    watcher = ExitSignalWatcher(ckpt.exit_signals) if ckpt.exit_signals else None
    rank, world = dist.get_rank(), dist.get_world_size()
    device = _device()
    sizes = dict(
        tp=tensor_model_parallel_size, pp=pipeline_model_parallel_size, vpp=virtual_pipeline_model_parallel_size,
        cp=context_parallel_size, ep=expert_model_parallel_size, etp=expert_tensor_parallel_size,
    )
    _check_sizes(transformer_config, ddp_config, optimizer_config, sizes)
    check_megatron_fsdp(
        ddp_config, optimizer_config=optimizer_config, pipeline_model_parallel_size=pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        cross_entropy=run.kernels.cross_entropy, init_from=ckpt.init_from,
    )
    model_parallel = tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size
    if world % model_parallel != 0:
        raise ValueError(f"world size {world} not divisible by tp*pp*cp={model_parallel}")

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        context_parallel_size=context_parallel_size,
        expert_model_parallel_size=expert_model_parallel_size,
        expert_tensor_parallel_size=expert_tensor_parallel_size,
        distributed_timeout_minutes=distributed_timeout_minutes,
    )
    dp_size = parallel_state.get_data_parallel_world_size()
    dp_rank = parallel_state.get_data_parallel_rank()
    micro_global = sched.micro_batch_size * dp_size
    if sched.global_batch_size % micro_global != 0:
        raise ValueError(
            f"global_batch_size {sched.global_batch_size} not a multiple of micro_batch_size * "
            f"data_parallel_size = {micro_global}"
        )
    num_microbatches = sched.global_batch_size // micro_global

    objective = build_objective(
        run.objective.kind,
        mask_token_id=run.objective.mask_token_id,
        eps=run.objective.eps,
        loss_weighting=run.objective.loss_weighting,
        variable_length_prob=run.objective.variable_length_prob,
    )
    spec_attention = layer_spec_attention(layer_spec)
    allowed = ("bidirectional", "block_causal") if objective.kind == "mdm" else ("causal",)
    if spec_attention not in allowed:
        raise ValueError(f"objective {objective.kind!r} needs attention in {allowed}, layer spec has {spec_attention!r}")
    vocab_size = int(model_kwargs["vocab_size"])
    if objective.kind == "mdm" and not 0 <= objective.mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id {objective.mask_token_id} outside the model vocabulary [0, {vocab_size})")
    if run.data.seq_length > int(model_kwargs.get("max_sequence_length", run.data.seq_length)):
        raise ValueError("data.seq_length exceeds model max_sequence_length")
    backend = layer_spec_backend(layer_spec)
    check_masks_supported(backend, run.objective, run.data)
    rope_fusion = None
    if run.kernels.apply_rope_fusion and model_kwargs.get("position_embedding_type", "rope") == "rope":
        if backend == BACKEND_TRANSFORMER_ENGINE:
            transformer_config.apply_rope_fusion = True  # megatron-core's TE kernel
            rope_fusion = "transformer_engine"
        elif torch.cuda.is_available():
            install_fused_rope()
            rope_fusion = "torch.compile"

    # Seeds as Megatron-LM: differ per pipeline stage, equal across DP replicas.
    init_seed = run.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(init_seed)
    np.random.seed(init_seed)
    torch.manual_seed(init_seed)
    if torch.cuda.is_available():
        tensor_parallel.model_parallel_cuda_manual_seed(init_seed)

    model = build_model(transformer_config, layer_spec=layer_spec, ddp_config=ddp_config, **model_kwargs)
    # The weights: the latest checkpoint (resume, loaded below with the optimizer), else
    # checkpoint.init_from, loaded now: megatron's optimizers copy their fp32 main weights from
    # the model when they are built.
    resume_from, init_from = start.resume_from, start.init_from
    init_source = None
    if init_from is not None:
        try:
            init_source = initialize_from(
                init_from, model=model, transformer_config=transformer_config, model_kwargs=model_kwargs,
                cache_dir=ckpt.init_cache_dir or default_cache_dir(ckpt.save_dir, run.logging.run_dir),
            )
        except InitFromError as exc:  # every rank has it (rank 0 told them); named, exit code 2
            if rank == 0:
                print(f"train.py: {exc}", file=sys.stderr, flush=True)
            if watcher is not None:
                watcher.restore()
            parallel_state.destroy_model_parallel()
            if created_pg:
                dist.destroy_process_group()
            raise SystemExit(2) from None
    optimizer = get_megatron_optimizer(optimizer_config, model)
    decay_iters = sched.lr_decay_iters or sched.train_iters
    wd = optimizer_config.weight_decay
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=sched.lr_warmup_init,
        max_lr=optimizer_config.lr,
        min_lr=optimizer_config.min_lr or 0.0,
        lr_warmup_steps=sched.lr_warmup_iters,
        lr_decay_steps=decay_iters,
        lr_decay_style=sched.lr_decay_style,
        start_wd=wd if sched.start_weight_decay is None else sched.start_weight_decay,
        end_wd=wd if sched.end_weight_decay is None else sched.end_weight_decay,
        wd_incr_steps=sched.train_iters,
        wd_incr_style=sched.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=ckpt.override_scheduler_on_resume,
        wsd_decay_steps=sched.lr_wsd_decay_iters,
        lr_wsd_decay_style=sched.lr_wsd_decay_style,
    )

    # Hooks Megatron-LM's setup_model_and_optimizer installs on the config.
    config = get_model_config(model[0])
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if ddp_config.overlap_grad_reduce:
        no_sync = [m.no_sync for m in model]
        grad_sync = [m.start_grad_sync for m in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if ddp_config.overlap_param_gather and ddp_config.align_param_gather:
        param_sync = [m.start_param_sync for m in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync

    logger = MetricsLogger(run.logging, enabled=(rank == world - 1))
    iteration = 0
    consumed = 0
    resumed_from = None
    last_checkpoint = None
    if resume_from is not None:
        latest = resume_from
        loaded = load_checkpoint(latest, model=model, optimizer=optimizer, scheduler=scheduler, seed=run.seed)
        iteration, consumed = loaded.iteration, loaded.consumed_train_samples
        resumed_from, last_checkpoint = iteration, latest
        logger.text(f"resumed from {latest} at iteration {iteration} (consumed {consumed} samples)")
        if loaded.scheduler_changes:
            logger.text("[dlmspec] resume: the learning-rate schedule follows this spec, not the checkpoint: " + ", ".join(
                f"{key} {old!r} -> {new!r}" for key, old, new in loaded.scheduler_changes))
        logger.record("resume", {"iteration": iteration, "checkpoint": latest, "consumed_train_samples": consumed,
                                 "scheduler_changes": [list(c) for c in loaded.scheduler_changes]})

    seq = run.data.seq_length
    eval_batches = sched.eval_iters * sched.global_batch_size if sched.eval_interval else 0
    train_ds, valid_ds = build_datasets(
        run.data,
        seed=run.seed,
        train_samples=sched.train_iters * sched.global_batch_size,
        valid_samples=eval_batches,
        add_extra_token_to_sequence=(objective.kind == "ar"),
    )
    train_loader = build_dataloader(
        train_ds, consumed_samples=consumed, micro_batch_size=sched.micro_batch_size,
        data_parallel_rank=dp_rank, data_parallel_size=dp_size, num_workers=run.data.num_workers,
    )
    train_feed = MicrobatchFeed(train_loader, len(model), TRAIN_STREAM)
    forward_step = ObjectiveForwardStep(
        objective, seed=run.seed, data_parallel_rank=dp_rank, eod_id=run.data.eod_id,
        reset_attention_mask=run.data.reset_attention_mask, device=device,
        context_parallel_size=context_parallel_size,
    )
    cross_entropy = run.kernels.cross_entropy
    if cross_entropy == "fused_linear":
        fused_impl = forward_step.use_fused_linear_cross_entropy(model, run.kernels.fused_linear_impl)
        if fused_impl is not None:
            cross_entropy = f"fused_linear ({fused_impl})"
    elif cross_entropy != "megatron":
        raise ValueError(f"kernels.cross_entropy must be 'megatron' or 'fused_linear', got {cross_entropy!r}")
    else:
        cross_entropy = "megatron (fused)" if transformer_config.cross_entropy_loss_fusion else "megatron"
    forward_backward = get_forward_backward_func()

    flops_per_token = model_flops_per_token_from_config(
        transformer_config, vocab_size=vocab_size, seq_length=seq, attention=spec_attention,
        block_size=_spec_block_size(layer_spec),
    )
    tokens_per_step = sched.global_batch_size * seq
    peak = run.logging.peak_tflops_per_gpu
    local_params = count_parameters(model)
    fusions = layer_spec_fusions(layer_spec)
    start_info = {
        "name": run.name, "iteration": iteration, "world_size": world, "layer_spec": backend,
        "attention": spec_attention, "objective": objective.kind, "num_microbatches": num_microbatches,
        "params_on_logging_rank": local_params, "model_flops_per_token": flops_per_token,
        "parallel_layout": _parallel_layout(), "run_config": dataclasses.asdict(run),
        "cross_entropy": cross_entropy, "sdpa_backend": _spec_sdpa_backend(layer_spec), "rope_fusion": rope_fusion,
        **fusions,
    }
    start_info["weights"], weights_text = _weights_record(resume_from, init_source, ckpt, run.seed)
    start_info["spec_hash"] = start.lock.content_hash
    start_info["spec_lock"] = start.lock.path if start.lock.text is not None else None
    if start.resume_check is not None:
        start_info["resume_check"] = start.resume_check.to_record()
    logger.record("start", start_info)
    logger.text(
        f"[dlmspec] {run.name}: layer spec {backend}, attention {spec_attention}, objective {objective.kind}, "
        f"world {world} (tp {tensor_model_parallel_size} pp {pipeline_model_parallel_size} dp {dp_size} "
        f"cp {context_parallel_size} ep {expert_model_parallel_size}), {num_microbatches} microbatches/step, "
        f"{local_params / 1e6:.1f}M params on this rank, {flops_per_token / 1e9:.2f} GFLOP/token, "
        f"cross entropy {cross_entropy}, RoPE {'fused (' + rope_fusion + ')' if rope_fusion else 'unfused'}"
        + "".join(f", {name}" for name, used in fusions.items() if used)
    )
    logger.text(f"[dlmspec] weights: {weights_text}")
    for warning in start.lock.warnings:
        logger.text(f"[dlmspec] warning: {warning}")
    for line in start.resume_check.report_lines() if start.resume_check is not None else ():
        logger.text(f"[dlmspec] {line}")
    for warning in init_source.warnings if init_source is not None else ():
        logger.text(f"[dlmspec] warning: checkpoint.init_from: {warning}")

    def evaluate() -> Optional[float]:
        """Mean validation loss over ``eval_iters`` fixed global batches (``None`` without a set)."""
        if valid_ds is None:
            return None
        _set_param_sync_hooks(model, ddp_config, enable=False)
        for m in model:
            m.eval()
        loader = build_dataloader(
            valid_ds, consumed_samples=0, micro_batch_size=sched.micro_batch_size,
            data_parallel_rank=dp_rank, data_parallel_size=dp_size, num_workers=0,
        )
        feed = MicrobatchFeed(loader, len(model), VALID_STREAM)
        total = torch.zeros(2, dtype=torch.float32, device=device)
        with torch.no_grad():
            for step in range(sched.eval_iters):
                feed.start(step)
                reports = forward_backward(
                    forward_step_func=forward_step, data_iterator=feed.data_iterator(), model=model,
                    num_microbatches=num_microbatches, seq_length=seq, micro_batch_size=sched.micro_batch_size,
                    decoder_seq_length=seq, forward_only=True,
                )
                total += _sum_reports(reports, device)
        for m in model:
            m.train()
        _set_param_sync_hooks(model, ddp_config, enable=True)
        return float(total[0] / total[1].clamp(min=1.0))

    def save(reason: str) -> str:
        """Checkpoint the current step; returns the directory."""
        _set_param_sync_hooks(model, ddp_config, enable=False)
        # Said before the (collective) save starts, so a save that never returns is visible.
        fmt = FSDP_CHECKPOINT_FORMAT if model_uses_megatron_fsdp(model) else DIST_CHECKPOINT_FORMAT
        logger.text(f"saving checkpoint {os.path.join(ckpt.save_dir, checkpoint_name(iteration))} "
                    f"({reason}, {fmt}) ...")
        t0 = time.perf_counter()
        try:
            path = save_checkpoint(
                ckpt.save_dir, iteration=iteration, model=model, optimizer=optimizer, scheduler=scheduler,
                consumed_train_samples=consumed, seed=run.seed, keep_last=ckpt.keep_last,
                optimizer_sharding=ckpt.optimizer_sharding,
                metadata={"reason": reason, "objective": dataclasses.asdict(run.objective), "layer_spec": backend,
                          "spec": spec_metadata(start.lock, start.record)},
                spec_lock_text=start.lock.text,
            )
        except CheckpointSaveError as exc:
            # Every rank that failed says it (no collective: the other ranks may be stuck in the
            # save; torchrun ends them once this one exits).
            logger.record("exit", {"iteration": iteration, "reason": "checkpoint save failed", "error": str(exc),
                                   "checkpoint": last_checkpoint})
            _write_exit_status(run.logging.run_dir, rank == world - 1, "checkpoint_save_failed", iteration,
                               last_checkpoint, None)
            print(f"train.py: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        _set_param_sync_hooks(model, ddp_config, enable=True)
        seconds = time.perf_counter() - t0
        logger.text(f"saved checkpoint {path} ({reason}, {seconds:.1f} s)")
        logger.record("checkpoint", {"iteration": iteration, "path": path, "reason": reason, "seconds": seconds})
        return path

    last_train_loss = None
    last_valid_loss = None
    exit_reason = "completed"
    saved_at = iteration if last_checkpoint else None
    interval = {"loss": torch.zeros(2, dtype=torch.float32, device=device), "iters": 0, "skipped": 0, "grad_norm": 0.0}
    for m in model:
        m.train()

    def _now() -> float:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()

    profiler = (StepProfiler(run.logging.run_dir, run.logging.profile_step_start, run.logging.profile_step_end,
                             run.logging.profile_ranks, rank) if run.logging.profile else None)
    record_host_launch(logger, "start", iteration)  # the host's launch speed, next to the step times
    interval_start = _now()
    try:
        while iteration < sched.train_iters:
            if sched.stop_at_iteration is not None and iteration >= sched.stop_at_iteration:
                exit_reason = "stop_at_iteration"
                break
            if profiler:
                profiler.before_step(iteration)
            for m in model:
                m.zero_grad_buffer()
            optimizer.zero_grad()
            train_feed.start(iteration)
            reports = forward_backward(
                forward_step_func=forward_step, data_iterator=train_feed.data_iterator(), model=model,
                num_microbatches=num_microbatches, seq_length=seq, micro_batch_size=sched.micro_batch_size,
                decoder_seq_length=seq, forward_only=False,
            )
            update_ok, grad_norm, _ = optimizer.step()
            if update_ok:
                scheduler.step(increment=1)
            else:
                interval["skipped"] += 1
            iteration += 1
            consumed += sched.global_batch_size
            interval["loss"] += _sum_reports(reports, device)
            interval["iters"] += 1
            interval["grad_norm"] = float(grad_norm) if grad_norm is not None else float("nan")
            if profiler:
                paused = _now()
                summary = profiler.after_step(iteration)
                if summary:
                    print(format_summary(summary), flush=True)
                    interval_start += _now() - paused  # writing the trace is not training time

            if iteration % run.logging.log_interval == 0 or iteration == sched.train_iters:
                elapsed = _now() - interval_start
                loss_sum, ntok = interval["loss"].tolist()
                loss = loss_sum / max(ntok, 1.0)
                step_time = elapsed / interval["iters"]
                tokens_per_s = tokens_per_step / step_time
                tflops = flops_per_token * tokens_per_s / world / 1e12
                mem = torch.zeros(2, dtype=torch.float64, device=device)
                if torch.cuda.is_available():
                    mem[0] = torch.cuda.max_memory_allocated() / 2**30
                    mem[1] = torch.cuda.max_memory_reserved() / 2**30
                dist.all_reduce(mem, op=dist.ReduceOp.MAX)
                record = {
                    "iteration": iteration, "loss": loss, "lr": float(optimizer.param_groups[0]["lr"]),
                    "grad_norm": interval["grad_norm"], "step_time_s": step_time, "tokens_per_s": tokens_per_s,
                    "tflops_per_gpu": tflops, "mfu": (tflops / peak) if peak else None,
                    "peak_mem_gib": float(mem[0]), "peak_reserved_gib": float(mem[1]),
                    "consumed_train_samples": consumed, "skipped_iters": interval["skipped"],
                }
                last_train_loss = loss
                logger.record("train", record, step=iteration)
                mfu_text = f" | MFU {100 * tflops / peak:5.1f}%" if peak else ""
                logger.text(
                    f"iter {iteration:>7d}/{sched.train_iters} | loss {loss:.4f} | lr {record['lr']:.3e} | "
                    f"grad norm {record['grad_norm']:.3f} | {step_time * 1000:.0f} ms/step | "
                    f"{tokens_per_s:,.0f} tok/s | {tflops:.1f} TFLOP/s/GPU{mfu_text} | "
                    f"mem {record['peak_mem_gib']:.1f} GiB"
                )
                interval = {"loss": torch.zeros(2, dtype=torch.float32, device=device), "iters": 0, "skipped": 0, "grad_norm": 0.0}
                interval_start = _now()

            do_eval = bool(sched.eval_interval) and iteration % sched.eval_interval == 0
            do_save = bool(ckpt.save_dir and ckpt.save_interval) and iteration % ckpt.save_interval == 0
            if do_eval or do_save:
                paused = _now()  # evaluation and saving are excluded from the throughput
                if do_eval:
                    last_valid_loss = evaluate()
                    logger.text(f"iter {iteration:>7d} | validation loss {last_valid_loss:.4f}")
                    logger.record("valid", {"iteration": iteration, "loss": last_valid_loss}, step=iteration)
                if do_save:
                    last_checkpoint = save("interval")
                    saved_at = iteration
                interval_start += _now() - paused

            received = watcher.any_rank_received(device) if watcher else None
            if received:
                logger.text(f"signal {received} received: saving and exiting")
                if ckpt.save_dir and saved_at != iteration:
                    last_checkpoint = save(f"signal {received}")
                logger.record("exit", {"iteration": iteration, "reason": f"signal {received}", "checkpoint": last_checkpoint})
                _write_exit_status(run.logging.run_dir, rank == world - 1, "signal", iteration, last_checkpoint, received)
                raise _SignalExit(ckpt.signal_exit_code)

        if ckpt.save_dir and ckpt.save_at_end and saved_at != iteration:
            last_checkpoint = save(exit_reason)
            saved_at = iteration
        record_host_launch(logger, "end", iteration)
        logger.record("exit", {"iteration": iteration, "reason": exit_reason, "checkpoint": last_checkpoint,
                               "train_loss": last_train_loss, "valid_loss": last_valid_loss})
        _write_exit_status(run.logging.run_dir, rank == world - 1, exit_reason, iteration, last_checkpoint, None)
    except _SignalExit as exc:
        train_feed.close()
        _teardown(watcher, logger, created_pg)
        raise SystemExit(exc.code)
    finally:
        train_feed.close()  # workers never outlive train(), whatever ends it
    _teardown(watcher, logger, created_pg)
    return TrainResult(
        iteration=iteration, consumed_train_samples=consumed, exit_reason=exit_reason,
        last_train_loss=last_train_loss, last_valid_loss=last_valid_loss, checkpoint=last_checkpoint,
        resumed_from=resumed_from,
    )


class _SignalExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _spec_sdpa_backend(spec: ModuleSpec) -> Optional[str]:
    core = spec.submodules.self_attention.submodules.core_attention
    params = getattr(core, "params", None) or {}
    return params.get("sdpa_backend")


def _spec_block_size(spec: ModuleSpec) -> Optional[int]:
    core = spec.submodules.self_attention.submodules.core_attention
    params = getattr(core, "params", None) or {}
    return params.get("block_size")


def _write_exit_status(run_dir: str, enabled: bool, reason: str, iteration: int, checkpoint: Optional[str], sig: Optional[str]) -> None:
    if not enabled:
        return
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "exit_status.json"), "w") as f:
        json.dump({"reason": reason, "iteration": iteration, "checkpoint": checkpoint, "signal": sig}, f)


def _teardown(watcher: Optional[ExitSignalWatcher], logger: MetricsLogger, created_pg: bool) -> None:
    if watcher is not None:
        watcher.restore()
    logger.close()
    if dist.is_initialized():
        dist.barrier()
    parallel_state.destroy_model_parallel()
    if created_pg and dist.is_initialized():
        dist.destroy_process_group()
