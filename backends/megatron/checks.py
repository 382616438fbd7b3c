"""What the runtime refuses, before megatron-core starts and while it sets up.

:func:`start_checks` runs before any process group or CUDA call (in every process, and once in
``train.py --check`` before torchrun): the data files, the checkpoint a resume loads and its
spec record, the GPUs; a refusal is one message and exit code 2. The ``check_*`` functions run
once megatron-core's parallel state exists and raise ``ValueError``: parallel sizes, batch
divisibility, the objective against the layers.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec import objectives
from dlmspec.backends.checkpoint_safety import check_checkpoint
from dlmspec.files import FileRefused
from dlmspec.layout import batch_problem, num_microbatches, world_problem

from .checkpointing import start_point
from .config import ObjectiveConfig, RunConfig, ScheduleConfig
from .data import DataConfig, data_problems, missing_data_files
from .distributed import cuda_problem
from .fsdp import check_megatron_fsdp
from .layers import layer_spec_attention, layer_spec_backend, layer_spec_block_size, layer_spec_takes_key_padding
from .spec_record import ResumeCheck, ResumeRefused, SpecLock, check_resume, read_spec_lock, spec_record


def refuse(message: str) -> None:
    """Print ``train.py: message`` (once per node: local rank 0) and exit with code 2."""
    if os.environ.get("LOCAL_RANK", "0") in ("", "0"):
        print(f"train.py: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def check_parallel_config(
    config: TransformerConfig,
    ddp_config: DistributedDataParallelConfig,
    optimizer_config: OptimizerConfig,
    parallel_sizes: Dict[str, Optional[int]],
    *,
    world_size: int,
    cross_entropy: str,
    init_from: Optional[str],
) -> None:
    """The megatron-core configs agree with the parallel sizes ``train()`` was given and with each
    other, Megatron-FSDP can run (:func:`~dlmspec.backends.megatron.fsdp.check_megatron_fsdp`), and the
    world divides into model-parallel groups.

    Args:
        parallel_sizes: ``train()``'s ``tensor_model_parallel_size`` ... ``expert_tensor_parallel_size``.
        world_size: Processes of the run.
        cross_entropy, init_from: ``KernelConfig.cross_entropy`` and ``CheckpointConfig.init_from``
            (Megatron-FSDP takes neither ``"fused_linear"`` nor an initial checkpoint).

    Raises:
        ValueError: naming the first disagreement.
    """
    for attr in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size"):
        have, value = getattr(config, attr), parallel_sizes[attr]
        if have != value:
            raise ValueError(f"TransformerConfig.{attr}={have} but train() was given {value}")
    etp = parallel_sizes["expert_tensor_parallel_size"]
    if etp is not None and config.expert_tensor_parallel_size != etp:
        raise ValueError(
            f"TransformerConfig.expert_tensor_parallel_size={config.expert_tensor_parallel_size} "
            f"but train() was given {etp}"
        )
    if ddp_config.use_distributed_optimizer != optimizer_config.use_distributed_optimizer:
        raise ValueError("DDP and optimizer configs disagree on use_distributed_optimizer")
    if bool(optimizer_config.bf16) != bool(config.bf16) or bool(optimizer_config.fp16) != bool(config.fp16):
        raise ValueError("OptimizerConfig.bf16/fp16 must equal TransformerConfig.bf16/fp16")
    check_megatron_fsdp(
        ddp_config, optimizer_config=optimizer_config,
        pipeline_model_parallel_size=parallel_sizes["pipeline_model_parallel_size"],
        virtual_pipeline_model_parallel_size=parallel_sizes["virtual_pipeline_model_parallel_size"],
        cross_entropy=cross_entropy, init_from=init_from,
    )
    problem = world_problem(world_size, parallel_sizes["tensor_model_parallel_size"],
                            parallel_sizes["pipeline_model_parallel_size"], parallel_sizes["context_parallel_size"])
    if problem is not None:
        raise ValueError(problem)


def microbatches_per_step(schedule: ScheduleConfig, data_parallel_size: int) -> int:
    """Microbatches per step on each data-parallel rank: ``global_batch_size / (micro_batch_size * dp)``.

    The rule and the count are :mod:`dlmspec.layout`'s, the ones the compiler resolves with.

    Raises:
        ValueError: if the global batch is not a multiple of ``micro_batch_size * dp``.
    """
    problem = batch_problem(schedule.global_batch_size, schedule.micro_batch_size, data_parallel_size)
    if problem is not None:
        raise ValueError(problem)
    return num_microbatches(schedule.global_batch_size, schedule.micro_batch_size, data_parallel_size)


def check_objective(objective, attention: str, vocab_size: int) -> None:
    """The objective fits the layers: MDM needs bidirectional or block-causal attention, AR causal;
    the MDM mask id lies inside the model's (padded) vocabulary.

    Args:
        objective: A built objective (:func:`~dlmspec.backends.megatron.objective.build_objective`).
        attention: The layer spec's (:func:`~dlmspec.backends.megatron.layers.layer_spec_attention`).
        vocab_size: The model's padded vocabulary size.

    Raises:
        ValueError: naming the objective and what does not fit.
    """
    registered = objectives.get(objective.kind)
    allowed = registered.attentions
    if attention not in allowed:
        raise ValueError(f"objective {objective.kind!r} needs attention in {allowed}, layer spec has {attention!r}")
    if registered.diffusion and not 0 <= objective.mask_token_id < vocab_size:
        raise ValueError(f"mask_token_id {objective.mask_token_id} outside the model vocabulary [0, {vocab_size})")


def check_sequence_length(data: DataConfig, model_kwargs: Dict[str, Any]) -> None:
    """``data.seq_length`` fits the model's ``max_sequence_length`` (when given).

    Raises:
        ValueError: if it is longer.
    """
    if data.seq_length > int(model_kwargs.get("max_sequence_length", data.seq_length)):
        raise ValueError("data.seq_length exceeds model max_sequence_length")


def check_masks_supported(layers: Union[ModuleSpec, str], objective: ObjectiveConfig, data: DataConfig) -> None:
    """Refuse the attention masks the Transformer Engine layers cannot apply.

    Variable-length MDM sequences (``variable_length = "sequence"``; a ``"micro_batch"`` cut
    slices the micro-batch, dense, and passes none) pass a ``[b, 1, 1, s]`` key-padding mask,
    which the TE layer spec of :func:`~dlmspec.backends.megatron.layers.build_layer_spec` applies
    as TE's ``padding`` mask type (:func:`~dlmspec.backends.megatron.attention.with_key_padding`);
    a TE spec without that class (megatron-core's own, or only a backend name given) would ignore
    it silently under its ``no_mask`` type, so it is refused there. ``reset_attention_mask``
    passes a per-query document mask ``[b, 1, s, s]``, which no TE mask type of our layers
    takes: refused on the TE path.

    Args:
        layers: The layer spec (or its :func:`~dlmspec.backends.megatron.layers.layer_spec_backend`
            name, which counts as a TE spec without key padding).
        objective, data: The run's.

    Raises:
        ValueError: If the layers are Transformer Engine's and a mask they cannot apply would be used.
    """
    if isinstance(layers, str):
        backend, key_padding = layers, layers != "transformer_engine"
    else:
        backend, key_padding = layer_spec_backend(layers), layer_spec_takes_key_padding(layers)
    if backend != "transformer_engine":
        return
    if objectives.get(objective.kind).masked_variable_length_prob(objective) > 0 and not key_padding:
        raise ValueError("variable_length_prob > 0 with variable_length='sequence' needs a layer spec whose attention "
                         "applies key-padding masks: build_layer_spec's (use_transformer_engine=True takes them as "
                         "TE's padding mask type) or the local+sdpa one (use_transformer_engine=False); "
                         "variable_length='micro_batch' cuts a dense micro-batch")
    if data.reset_attention_mask:
        raise ValueError("reset_attention_mask needs the local+sdpa layer spec (use_transformer_engine=False): "
                         "a document mask [b, 1, s, s] is no key-padding mask, and the Transformer Engine layers "
                         "take no other")


def check_loss_normalization(objective: ObjectiveConfig, transformer_config: TransformerConfig,
                             pipeline_model_parallel_size: int = 1) -> None:
    """``ObjectiveConfig.loss_normalization`` agrees with ``TransformerConfig.calculate_per_token_loss``
    (True exactly for ``"global_token"``: megatron-core's schedule divides by the step's tokens then,
    by each micro-batch's otherwise), and a micro-batch cut runs without pipeline parallelism
    (megatron's pipeline sends activations of ``seq_length`` positions).

    Raises:
        ValueError: naming the setting that disagrees.
    """
    per_token = objective.loss_normalization == "global_token"
    if bool(transformer_config.calculate_per_token_loss) != per_token:
        raise ValueError(
            f"loss_normalization={objective.loss_normalization!r} needs TransformerConfig.calculate_per_token_loss="
            f"{per_token}, got {transformer_config.calculate_per_token_loss}")
    if (objectives.get(objective.kind).micro_batch_variable_length_prob(objective) > 0
            and pipeline_model_parallel_size > 1):
        raise ValueError("variable_length='micro_batch' needs pipeline_model_parallel_size=1 (the pipeline sends "
                         "activations of seq_length positions; a cut micro-batch is shorter)")


@dataclass
class StartChecks:
    """What :func:`start_checks` found, for the loop to use once megatron-core runs.

    Attributes:
        lock: The run's :class:`~dlmspec.backends.megatron.spec_record.SpecLock`.
        record: This run's :func:`~dlmspec.backends.megatron.spec_record.spec_record`.
        resume_from: The checkpoint to resume from
            (:func:`~dlmspec.backends.megatron.checkpointing.start_point`), or ``None``.
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
    """The checks before megatron-core starts (no process group, no CUDA yet).

    In order: the data files exist, and each ``.bin``/``.idx`` pair is sound
    (:func:`~dlmspec.backends.megatron.data.data_problems`); the spec lock beside train.py is read
    (one that is there but is no lock file is refused: ``SpecLock.error``);
    a resume's checkpoint records a spec this one may continue, of this run's name or of
    ``CheckpointConfig.resume_from_run`` (:func:`~dlmspec.backends.megatron.spec_record.check_resume`) and
    holds nothing that would run code when loaded
    (:func:`~dlmspec.backends.checkpoint_safety.check_checkpoint`); a CUDA device is there
    (:func:`~dlmspec.backends.megatron.distributed.cuda_problem`).
    :func:`~dlmspec.backends.megatron.training.train` runs them in every process; ``train.py --check``
    (what launch.sh runs before torchrun, which would report a worker's exit code 2 as its own
    exit code 1 under a traceback) runs them once, with ``world_size`` (default: the
    environment's ``WORLD_SIZE``) and ``processes_per_node`` (the GPUs the node must have) as
    compiled. The other arguments are ``train()``'s.

    Raises:
        SystemExit: code 2 after a message on stderr (``train.py: ...``, printed by local
            rank 0 of each node) naming the file, key or device and the fix.
    """
    missing = missing_data_files(run.data)
    if missing:
        shown = "\n  ".join(missing[:10]) + (f"\n  ... and {len(missing) - 10} more" if len(missing) > 10 else "")
        refuse(f"data files not found (relative to {os.getcwd()}):\n  {shown}\n"
               "Prepare them with `dlmspec data prepare`, or fix [data] train/valid in the spec.")
    problems = data_problems(run.data)
    if problems:
        refuse(f"the data cannot be trained on (relative to {os.getcwd()}):\n  " + "\n  ".join(problems))
    lock = read_spec_lock(run.spec_lock_file, run.spec_hash)
    if lock.error is not None:
        refuse(lock.error)
    record = spec_record(
        run, transformer_config=transformer_config, model_kwargs=model_kwargs, optimizer_config=optimizer_config,
        attention=layer_spec_attention(layer_spec), block_size=layer_spec_block_size(layer_spec),
        parallel_sizes=parallel_sizes,
        world_size=world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1") or 1),
        tokenizer=lock.tokenizer,
    )
    try:
        resume_from, init_from = start_point(run.checkpoint)
    except FileNotFoundError as exc:
        refuse(f"cannot resume: {exc}. Fix: restore that checkpoint, or write the name of an existing iter_* "
                "folder into the 'latest' file (or remove it to start the run again)")
    resume_check = None
    if resume_from is not None:
        try:
            resume_check = check_resume(resume_from, record, content_hash=lock.content_hash,
                                        resume_from_run=run.checkpoint.resume_from_run)
        except ResumeRefused as exc:
            refuse(str(exc))
        try:
            check_checkpoint(resume_from)  # nothing in it may run code when loaded
        except FileRefused as exc:
            refuse(f"cannot resume: {exc}")
        except Exception as exc:  # noqa: BLE001 - unpickling a damaged index can raise almost anything
            refuse(f"cannot resume: {os.path.join(resume_from, '.metadata')} cannot be read ({type(exc).__name__}: "
                   f"{str(exc)[:200]}); it is truncated or corrupt. Fix: restore that checkpoint, or write the name "
                   "of an earlier iter_* folder into the 'latest' file")
    problem = cuda_problem(processes_per_node=processes_per_node)
    if problem is not None:
        refuse(problem)
    return StartChecks(lock=lock, record=record, resume_from=resume_from, init_from=init_from,
                       resume_check=resume_check)
