"""The run's settings that are not megatron-core config objects, and what the loop returns.

A compiled ``train.py`` fills these dataclasses (``build_run()``) and passes the
:class:`RunConfig` to :func:`dlmspec.backends.megatron.training.train`; one docstring per field says
what it sets. :class:`TrainState` is the loop's progress (saved in checkpoints),
:class:`TrainResult` what ``train`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dlmspec.errors import REQUEUE_EXIT_CODE  # "saved, requeue me": the batch script requeues on it
from dlmspec.objectives.mdm import CART_P_DEFAULT

from .data import DataConfig


@dataclass
class ObjectiveConfig:
    """Which loss to train (see :mod:`dlmspec.backends.megatron.objective`).

    Attributes:
        kind: ``"mdm"`` (masked diffusion, bidirectional attention) or ``"ar"``
            (next-token prediction, causal attention).
        mask_token_id: MDM mask id (< padded vocab size).
        eps: MDM minimum noise level, ``t ~ U(eps, 1)``.
        loss_weighting: MDM ``"llada"`` (1/t), ``"realised"`` (1/realised ratio) or ``"cart"``
            (Dream's context-adaptive weight, :func:`~dlmspec.backends.megatron.objective.cart_weights`).
        variable_length_prob: MDM probability of truncating a sequence (or a
            micro-batch) to a random length (LLaDA: 0.01).
        min_masked_tokens: MDM forced masks per row (``objective.min_masked_tokens``;
            MegaDLMs: 1).
        variable_length: MDM ``"sequence"`` (each sequence cut alone, key-padding mask,
            local layers) or ``"micro_batch"`` (one cut per micro-batch, the same on every
            rank, dense: either layer path).
        variable_length_multiple: The micro-batch cut's length is a multiple of it (2 x CP,
            TP under sequence parallelism: :func:`dlmspec.resolve.runtime_values`).
        loss_normalization: ``train.loss_normalization``: ``"global_token"``,
            ``"micro_batch"`` or ``"sequence"``
            (:func:`~dlmspec.backends.megatron.objective.apply_loss_normalization`);
            ``TransformerConfig.calculate_per_token_loss`` must be True exactly for
            ``"global_token"`` (:func:`~dlmspec.backends.megatron.checks.check_loss_normalization`).
        shift: MDM Dream's shifted predictions (``objective.shift``): output position ``i - 1``
            predicts the token at ``i``; position 0 is never masked.
        cart_p: MDM ``"cart"``'s geometric parameter (``objective.cart_p``; Dream's trainers: 0.1).
        unshift: MDM MegaDLMs' window (``objective.unshift``): the dataset draws ``seq_length + 1``
            ids and the model sees ids ``1 .. seq_length - 1`` at positions ``1 .. seq_length - 1``.
        noise_schedule, noise_schedule_exponent: MDM masking schedule ``alpha(t)``
            (``objective.noise_schedule``: ``"linear"``, ``"cosine"``, ``"polynomial"`` with its exponent;
            :mod:`dlmspec.objectives.schedules`).
        options: settings of an objective registered outside the bundled ones (its compiler half's
            ``runtime_options`` writes ``options={...}``; its runtime factory reads them).
    """

    kind: str = "mdm"
    mask_token_id: Optional[int] = None
    eps: float = 1e-3
    loss_weighting: str = "llada"
    variable_length_prob: float = 0.0
    min_masked_tokens: int = 0
    variable_length: str = "sequence"
    variable_length_multiple: int = 1
    loss_normalization: str = "global_token"
    shift: bool = False
    cart_p: float = CART_P_DEFAULT
    unshift: bool = False
    noise_schedule: str = "linear"
    noise_schedule_exponent: float = 1.0
    options: Dict[str, Any] = field(default_factory=dict)


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
        lr_points: ``lr_decay_style = "piecewise"``: ``[[step, lr], ...]`` (steps
            non-decreasing), linear between points, a repeated step a jump, the first
            point's lr before it and the last's after it; applied after the warm-up
            (:class:`~dlmspec.backends.megatron.optim.PiecewiseParamScheduler`).
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
    lr_points: Optional[List[List[float]]] = None
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
        resume_from_run: The spec ``name`` of another run whose checkpoints this run may
            resume (``checkpoint.resume_from_run``); ``None``: a checkpoint whose spec record
            holds another name than ``RunConfig.name`` is refused
            (:func:`~dlmspec.backends.megatron.spec_record.check_resume`).
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
            when there is a checkpoint to resume from
            (:func:`~dlmspec.backends.megatron.checkpointing.start_point`).
            ``None``: random initialisation.
        init_cache_dir: Where ``hf:`` weights are converted to (default
            ``<save_dir>/init_from_hf``, or ``<run_dir>/init_from_hf``); must
            be on a filesystem every node sees.
    """

    save_dir: Optional[str] = None
    save_interval: Optional[int] = None
    load_dir: Optional[str] = None
    resume: bool = True
    resume_from_run: Optional[str] = None
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
        wandb_project: W&B project (Megatron-LM's ``--wandb-project``); ``None``: no W&B.
        wandb_exp_name: The W&B run's name (``--wandb-exp-name``); ``None``: the run's name.
        wandb_save_dir: Where W&B writes its files (``--wandb-save-dir``); ``None``:
            ``<run_dir>/wandb``. The run's id is kept there, so a requeued job resumes it.
        wandb_entity: W&B entity (team or user); ``None``: the API key's default.
        wandb_mode: ``"online"`` or ``"offline"`` (files only; ``wandb sync`` uploads them).
        wandb_tags: Tags of the W&B run.
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
    wandb_project: Optional[str] = None
    wandb_exp_name: Optional[str] = None
    wandb_save_dir: Optional[str] = None
    wandb_entity: Optional[str] = None
    wandb_mode: str = "online"
    wandb_tags: Sequence[str] = ()


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
        name: Run name (the spec's ``name``): logged, and recorded in every checkpoint, so a
            resume from another run's checkpoint is refused.
        kernels: :class:`KernelConfig`.
        spec_hash: ``[lock] content_hash`` of the spec train.py was compiled from (a literal in
            train.py); recorded in every checkpoint and compared on resume.
        spec_lock_file: The ``spec.lock.toml`` beside train.py; copied into every checkpoint
            when its hash is ``spec_hash`` (:mod:`dlmspec.backends.megatron.spec_record`).
        layer_path: Why the layer spec takes its path (Transformer Engine or local), as the
            compiler resolved ``transformer_impl``; logged with the start record.
        generation_eval: ``[eval.generation]``
            (:class:`~dlmspec.backends.megatron.generation_eval.GenerationEvalConfig`); ``None``: none.
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
    generation_eval: Optional[Any] = None


@dataclass
class TrainResult:
    """What :func:`~dlmspec.backends.megatron.training.train` returns after a normal end.

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


@dataclass
class TrainState:
    """The loop's progress: what a checkpoint saves and a resume restores, and the last losses.

    Attributes:
        iteration: Steps completed (counting those before a resume).
        consumed_train_samples: Samples drawn by all ranks.
        resumed_from: Iteration resumed from, ``None`` for a fresh start.
        last_checkpoint: Directory of the last checkpoint written or loaded.
        saved_at: Iteration of :attr:`last_checkpoint` (a step is saved once).
        last_train_loss: Loss of the last logged interval (``None`` off the logging rank).
        last_valid_loss: Loss of the last evaluation.
        exit_reason: ``"completed"``, or ``"stop_at_iteration"`` when the loop stopped there.
    """

    iteration: int = 0
    consumed_train_samples: int = 0
    resumed_from: Optional[int] = None
    last_checkpoint: Optional[str] = None
    saved_at: Optional[int] = None
    last_train_loss: Optional[float] = None
    last_valid_loss: Optional[float] = None
    exit_reason: str = "completed"

    def result(self) -> TrainResult:
        """The :class:`TrainResult` of this state."""
        return TrainResult(
            iteration=self.iteration, consumed_train_samples=self.consumed_train_samples,
            exit_reason=self.exit_reason, last_train_loss=self.last_train_loss,
            last_valid_loss=self.last_valid_loss, checkpoint=self.last_checkpoint, resumed_from=self.resumed_from,
        )
