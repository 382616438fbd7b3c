"""The training loop: megatron-core's model, optimizer and schedules around a stage's objective.

A compiled ``train.py`` builds megatron-core's configs, a layer spec and a
:class:`~dlmspec.backends.megatron.config.RunConfig`, and calls :func:`train`, which checks the run
(:mod:`.checks`), sets up the process groups (:mod:`.distributed`), builds the model,
optimizer and learning-rate schedule (:mod:`.optim`), resumes (:mod:`.checkpointing`), then
runs the steps: :func:`train_step` with the stage's forward step (:mod:`.stage`: pre-training
today), logging (:mod:`.metrics`), evaluation, checkpoints and a clean exit on SIGTERM /
SIGUSR1 (:mod:`.signals`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from .checkpointing import CheckpointManager, prestart_checkpoint_helpers
from .checks import check_loss_normalization, check_parallel_config, microbatches_per_step, start_checks
from .config import KernelConfig, RunConfig, TrainResult, TrainState
from .distributed import current_device, initialize_distributed, seed_like_megatron, shutdown
from .generation_eval import build_generation_eval, log_generation_eval
from .hostbench import record_host_launch
from .init_from import InitFromError, InitSource, default_cache_dir, initialize_from
from .layers import BACKEND_TRANSFORMER_ENGINE, build_model, layer_spec_backend
from .metrics import (
    DLM_REPORT,
    IntervalMeter,
    MetricsLogger,
    log_exit,
    log_start,
    log_validation,
    run_flops_per_token,
    now,
    phase,
)
from .microbatches import MicrobatchFeed
from .optim import build_scheduler, install_schedule_hooks, set_param_sync_hooks
from .profiling import StepProfiler, format_summary
from .provenance import collect as collect_provenance
from .rope import install_fused_rope
from .signals import ExitSignalWatcher, stop_watcher
from .spec_record import spec_metadata
from .stage import LM_LOSS, ModelFactory, PretrainStage, Stage, StageContext, StageResources, StageSeam


@dataclass
class StepParts:
    """What a step and an evaluation run on.

    Attributes:
        model: This rank's model chunks (megatron DDP-wrapped).
        optimizer: megatron's optimizer (``step()`` returns ``(update_ok, grad_norm, _)``).
        scheduler: The ``OptimizerParamScheduler``, stepped after each update.
        forward_backward: megatron's schedule (``get_forward_backward_func()``).
        num_microbatches: Microbatches per step on this data-parallel rank.
        micro_batch_size, seq_length: Sequences per microbatch and tokens per sequence.
        device: Where the loss sums live.
        ddp_config: For the parameter-gather hooks around evaluation (``None``: none).
        generation_eval: ``[eval.generation]``'s evaluator, run after the validation loss at the
            steps it is due (:mod:`.generation_eval`; ``None``: none). The prompts are read when it
            is built, before the first step.
    """

    model: List[torch.nn.Module]
    optimizer: Any
    scheduler: Any
    forward_backward: Callable[..., List[Dict[str, torch.Tensor]]]
    num_microbatches: int
    micro_batch_size: int
    seq_length: int
    device: torch.device
    ddp_config: Optional[DistributedDataParallelConfig] = None
    generation_eval: Any = None

    def run_schedule(self, stage: Stage, feed: MicrobatchFeed, *, forward_only: bool):
        """megatron's schedule over one step's microbatches of ``feed``; the loss reports."""
        return self.forward_backward(
            forward_step_func=stage.forward_step, data_iterator=feed.data_iterator(), model=self.model,
            num_microbatches=self.num_microbatches, seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size, decoder_seq_length=self.seq_length, forward_only=forward_only,
        )


@dataclass
class StepOutput:
    """One step's result: ``loss`` = ``[loss sum, tokens]`` over the data-parallel group,
    whether the optimizer updated (fp16 skips steps with overflowing gradients), the grad norm
    (NaN when the optimizer gave none), the step's summed
    :func:`~dlmspec.backends.megatron.metrics.dlm_loss_sums` (``None`` unless the loss reports
    carry them: masked diffusion), and every report sum by key (the stage's
    :meth:`~dlmspec.backends.megatron.stage.StageBase.reduce_reports`)."""

    loss: torch.Tensor
    update_ok: bool
    grad_norm: float
    dlm: Optional[torch.Tensor] = None
    sums: Dict[str, torch.Tensor] = field(default_factory=dict)


def sum_loss_reports(reports, device: torch.device) -> torch.Tensor:
    """``[loss sum, tokens]`` of the ``"lm loss"`` reports of a step's microbatches, summed over
    the data-parallel group (with context parallelism) when a process group exists."""
    return sum_step_reports(reports, device)[0]


def sum_step_reports(reports, device: torch.device) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`sum_loss_reports` and the summed ``DLM_REPORT`` vectors of the same reports
    (``None`` when none has one), in one all-reduce (:func:`~dlmspec.backends.megatron.stage.sum_reports`)."""
    sums = StageSeam(None, None).reduce_reports(reports, device)
    return sums[LM_LOSS], sums.get(DLM_REPORT)


def train_step(parts: StepParts, stage: Stage, feed: MicrobatchFeed, iteration: int) -> StepOutput:
    """One optimizer step: zero the gradients, the stage's per-step work, forward and backward over
    the step's microbatches, ``optimizer.step()`` and (after an update) the scheduler."""
    for m in parts.model:
        m.zero_grad_buffer()
    parts.optimizer.zero_grad()
    stage.before_step(iteration, parts.model)
    feed.start(iteration)
    reports = parts.run_schedule(stage, feed, forward_only=False)
    update_ok, grad_norm, _ = parts.optimizer.step()
    if update_ok:
        parts.scheduler.step(increment=1)
    sums = StageSeam(stage, None).reduce_reports(reports, parts.device)  # the stage's, or every report summed
    return StepOutput(sums[LM_LOSS], bool(update_ok), float(grad_norm) if grad_norm is not None else float("nan"),
                      sums.get(DLM_REPORT), sums)


def evaluate(parts: StepParts, stage: Stage, make_feed: Optional[Callable[[], MicrobatchFeed]],
             eval_iters: int) -> Optional[float]:
    """Mean loss over ``eval_iters`` steps of the validation feed (``None`` without one), forward
    only, with the model in eval mode; the same batches and masks at every evaluation."""
    if make_feed is None:
        return None
    set_param_sync_hooks(parts.model, parts.ddp_config, enable=False)
    for m in parts.model:
        m.eval()
    feed, reduce = make_feed(), StageSeam(stage, None).reduce_reports
    total = torch.zeros(2, dtype=torch.float32, device=parts.device)
    with torch.no_grad():
        for step in range(eval_iters):
            feed.start(step)
            total += reduce(parts.run_schedule(stage, feed, forward_only=True), parts.device)[LM_LOSS]
    for m in parts.model:
        m.train()
    set_param_sync_hooks(parts.model, parts.ddp_config, enable=True)
    return float(total[0] / total[1].clamp(min=1.0))


def log_evaluations(logger: MetricsLogger, parts: StepParts, iteration: int, valid_loss: Optional[float],
                    tensor_model_parallel_size: int) -> None:
    """The validation loss's record, then ``[eval.generation]``'s where it is due at ``iteration``
    (:func:`~dlmspec.backends.megatron.generation_eval.log_generation_eval`). Without a validation
    loss (``valid_loss`` None: no validation data, as in an RL stage) only the latter."""
    if valid_loss is not None:
        log_validation(logger, iteration, valid_loss)
    log_generation_eval(parts.generation_eval, parts, logger, iteration, tensor_model_parallel_size)


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
    stage: Optional[Stage] = None,
) -> TrainResult:
    """Train a GPTModel on a stage's objective; resume and checkpoint as configured.

    Args:
        run: The :class:`~dlmspec.backends.megatron.config.RunConfig`.
        transformer_config, ddp_config, optimizer_config: megatron-core's configs (the parallel
            sizes of ``transformer_config`` equal the ones passed here).
        layer_spec, model_kwargs: :func:`dlmspec.backends.megatron.layers.build_model`'s other arguments.
        tensor_model_parallel_size ... expert_tensor_parallel_size: For megatron-core's
            ``parallel_state.initialize_model_parallel``; ``distributed_timeout_minutes`` too.
        stage: What the run trains (:class:`~dlmspec.backends.megatron.stage.Stage`); default:
            :class:`~dlmspec.backends.megatron.stage.PretrainStage`.

    Returns:
        :class:`~dlmspec.backends.megatron.config.TrainResult` after the last step or at ``stop_at_iteration``.

    Raises:
        SystemExit: ``CheckpointConfig.signal_exit_code`` after a signal-triggered checkpoint; 2
            after a message when a start check fails, ``init_from`` cannot be loaded or a save fails.
        ValueError: On inconsistent configuration (:mod:`dlmspec.backends.megatron.checks`).
    """
    sched, ckpt = run.schedule, run.checkpoint
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
    # Installed first so a signal that arrives during setup is honoured after the first step.
    watcher = stop_watcher(ckpt.exit_signals)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = current_device()
    check_parallel_config(transformer_config, ddp_config, optimizer_config, parallel_sizes, world_size=world,
                          cross_entropy=run.kernels.cross_entropy, init_from=ckpt.init_from)
    check_loss_normalization(run.objective, transformer_config, parallel_sizes["pipeline_model_parallel_size"])
    parallel_state.initialize_model_parallel(**parallel_sizes, distributed_timeout_minutes=distributed_timeout_minutes)
    dp_size, dp_rank = parallel_state.get_data_parallel_world_size(), parallel_state.get_data_parallel_rank()
    num_microbatches = microbatches_per_step(sched, dp_size)
    stage = stage if stage is not None else PretrainStage(run)
    seam, factory = StageSeam(stage, run), ModelFactory(transformer_config, layer_spec, model_kwargs, ddp_config,
                                                        build_model)
    resources = StageResources(factory, record=start.record, tensor_model_parallel_size=tensor_model_parallel_size)
    stage.setup(StageContext(run, device, dp_rank, dp_size, context_parallel_size, resources),
                layer_spec=layer_spec, model_kwargs=model_kwargs)
    rope_fusion = _apply_rope_fusion(run.kernels, transformer_config, layer_spec, model_kwargs)
    seed_like_megatron(run.seed)

    logger = MetricsLogger(run.logging, enabled=(rank == world - 1))  # the last stage's last rank
    # what produced the run, read where it is written (rank 0: checkpoints; the logging rank); long phases' seconds
    provenance, phases = collect_provenance(run.spec_hash) if rank in (0, world - 1) else None, {}
    model = factory.build(wrap_ddp=True)  # the policy; a stage builds more with the same factory
    # The weights: the latest checkpoint (a resume, loaded below with the optimizer), else init_from,
    # loaded now: megatron's optimizers copy their fp32 main weights from the model when built.
    init_source = None if start.init_from is None else _load_init_from(
        run, start.init_from, model, transformer_config, model_kwargs, rank, watcher, created_pg, logger, phases)
    optimizer = get_megatron_optimizer(optimizer_config, model)
    scheduler = build_scheduler(optimizer, optimizer_config, sched, ckpt)
    install_schedule_hooks(model, optimizer, ddp_config)

    checkpoints = CheckpointManager(
        ckpt, model=model, optimizer=optimizer, scheduler=scheduler, ddp_config=ddp_config, seed=run.seed,
        logger=logger, metadata={**stage.checkpoint_metadata(), "layer_spec": layer_spec_backend(layer_spec),
                                 "spec": spec_metadata(start.lock, start.record), "provenance": provenance},
        spec_lock_text=start.lock.text, stage=seam)
    state = _resume(checkpoints, start.resume_from, logger, phases)
    with phase(logger, "building the datasets (index files are built on first use)", phases, "build_data"):
        data = stage.build_data(consumed_samples=state.consumed_train_samples, num_chunks=len(model))
    cross_entropy = stage.prepare_model(model)
    parts = StepParts(model, optimizer, scheduler, get_forward_backward_func(), num_microbatches,
                      sched.micro_batch_size, run.data.seq_length, device, ddp_config, build_generation_eval(run))
    flops_per_token, data_flops = run_flops_per_token(transformer_config, layer_spec, model_kwargs,
                                                      run.data.seq_length, run.objective, sched.train_iters)
    log_start(logger, run=run, objective=stage.kind, layer_spec=layer_spec, model=model, iteration=state.iteration,
              num_microbatches=num_microbatches, flops_per_token=flops_per_token, cross_entropy=cross_entropy,
              rope_fusion=rope_fusion, parallel_sizes=parallel_sizes, lock=start.lock, resume_from=start.resume_from,
              resume_check=start.resume_check, init_source=init_source, provenance=provenance, phases=phases)
    for m in model:
        m.train()
    profiler = (StepProfiler(run.logging.run_dir, run.logging.profile_step_start, run.logging.profile_step_end,
                             run.logging.profile_ranks, rank) if run.logging.profile else None)
    record_host_launch(logger, "start", state.iteration)  # the host's launch speed, next to the step times
    meter = IntervalMeter(device, tokens_per_step=sched.global_batch_size * run.data.seq_length,
                          flops_per_token=flops_per_token, world_size=world,
                          peak_tflops=run.logging.peak_tflops_per_gpu, data_flops_per_token=data_flops)
    checkpoints.continue_run(meter)  # a resume's RNG states, set after everything above drew from them
    try:
        while state.iteration < sched.train_iters:
            if sched.stop_at_iteration is not None and state.iteration >= sched.stop_at_iteration:
                state.exit_reason = "stop_at_iteration"
                break
            if profiler:
                profiler.before_step(state.iteration)
            out = train_step(parts, stage, data.train, state.iteration)
            state.iteration += 1
            state.consumed_train_samples += seam.samples_consumed(state.iteration - 1)
            meter.add(out.loss, out.update_ok, out.grad_norm, sums=out.sums)
            if profiler:
                _profile_after_step(profiler, meter, state.iteration)

            if state.iteration % run.logging.log_interval == 0 or state.iteration == sched.train_iters:
                state.last_train_loss = meter.log(logger, state, train_iters=sched.train_iters,
                                                  lr=float(optimizer.param_groups[0]["lr"]),
                                                  metrics=seam.interval_metrics)
            do_eval = bool(sched.eval_interval) and state.iteration % sched.eval_interval == 0
            do_save = bool(ckpt.save_dir and ckpt.save_interval) and state.iteration % ckpt.save_interval == 0
            if do_eval or do_save:
                paused = now()  # evaluation and saving are excluded from the throughput
                if do_eval:
                    state.last_valid_loss = evaluate(parts, stage, data.valid, sched.eval_iters)
                    log_evaluations(logger, parts, state.iteration, state.last_valid_loss, tensor_model_parallel_size)
                if do_save:
                    checkpoints.save(state, "interval", meter)
                meter.exclude(paused)

            _exit_on_signal(watcher, device, logger, checkpoints, state, meter, ckpt)

        if ckpt.save_dir and ckpt.save_at_end and state.saved_at != state.iteration:
            checkpoints.save(state, state.exit_reason, meter)
        record_host_launch(logger, "end", state.iteration)
        log_exit(logger, state)
    except _SignalExit as exc:
        data.train.close()
        _teardown(watcher, logger, created_pg)
        raise SystemExit(exc.code)
    finally:
        data.train.close()  # workers never outlive train(), whatever ends it
    _teardown(watcher, logger, created_pg)
    return state.result()


class _SignalExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit_on_signal(watcher: Optional[ExitSignalWatcher], device: torch.device, logger: MetricsLogger,
                    checkpoints: CheckpointManager, state: TrainState, meter: IntervalMeter, ckpt) -> None:
    """After a step: when any rank received a stop signal, save (unless this step is saved), write
    the ``exit`` record and raise :class:`_SignalExit` with ``ckpt.signal_exit_code``."""
    received = watcher.any_rank_received(device) if watcher else None
    if received:
        logger.text(f"signal {received} received: saving and exiting")
        if ckpt.save_dir and state.saved_at != state.iteration:
            checkpoints.save(state, f"signal {received}", meter)
        log_exit(logger, state, signal=received)
        raise _SignalExit(ckpt.signal_exit_code)


def _resume(checkpoints: CheckpointManager, resume_from: Optional[str], logger: MetricsLogger,
            phases: Dict[str, float]) -> TrainState:
    """The progress of the checkpoint a resume loads (timed as the ``load_checkpoint`` phase), or
    a fresh :class:`TrainState` without one."""
    if resume_from is None:
        return TrainState()
    with phase(logger, f"loading checkpoint {resume_from}", phases, "load_checkpoint"):
        return checkpoints.resume(resume_from)


def _apply_rope_fusion(kernels: KernelConfig, transformer_config: TransformerConfig, layer_spec: ModuleSpec,
                       model_kwargs: Dict[str, Any]) -> Optional[str]:
    """``kernels.apply_rope_fusion`` with RoPE: megatron-core's TE kernel on the Transformer Engine
    path, :func:`~dlmspec.backends.megatron.rope.install_fused_rope` on the local path with CUDA; returns
    which (``None``: unfused)."""
    if not (kernels.apply_rope_fusion and model_kwargs.get("position_embedding_type", "rope") == "rope"):
        return None
    if layer_spec_backend(layer_spec) == BACKEND_TRANSFORMER_ENGINE:
        transformer_config.apply_rope_fusion = True  # megatron-core's TE kernel
        return "transformer_engine"
    if torch.cuda.is_available():
        install_fused_rope()
        return "torch.compile"
    return None


def _load_init_from(run: RunConfig, init_from: str, model: List[torch.nn.Module], transformer_config: TransformerConfig,
                    model_kwargs: Dict[str, Any], rank: int, watcher: Optional[ExitSignalWatcher],
                    created_pg: bool, logger: MetricsLogger, phases: Dict[str, float]) -> InitSource:
    """Load ``checkpoint.init_from``'s weights into the fresh model
    (:func:`~dlmspec.backends.megatron.init_from.initialize_from`), timed as the ``init_from``
    phase (a Hugging Face checkpoint is converted on the first launch, then read from the cache).

    Raises:
        SystemExit: code 2 after rank 0 printed the :class:`~dlmspec.backends.megatron.init_from.InitFromError`
            (every rank has it), with the signal handlers and the parallel state undone.
    """
    ckpt = run.checkpoint
    try:
        with phase(logger, f"loading checkpoint.init_from {init_from} (a Hugging Face checkpoint is converted "
                   "on the first launch)", phases, "init_from"):
            return initialize_from(
                init_from, model=model, transformer_config=transformer_config, model_kwargs=model_kwargs,
                cache_dir=ckpt.init_cache_dir or default_cache_dir(ckpt.save_dir, run.logging.run_dir),
            )
    except InitFromError as exc:  # every rank has it (rank 0 told them); named, exit code 2
        if rank == 0:
            print(f"train.py: {exc}", file=sys.stderr, flush=True)
        if watcher is not None:
            watcher.restore()
        logger.close()
        shutdown(created_pg, barrier=False)
        raise SystemExit(2) from None


def _profile_after_step(profiler: StepProfiler, meter: IntervalMeter, iteration: int) -> None:
    """End a profiled step; the profiler's summary (once its window ends) is printed, and writing
    the trace is left out of the interval's time."""
    paused = now()
    summary = profiler.after_step(iteration)
    if summary:
        print(format_summary(summary), flush=True)
        meter.exclude(paused)  # writing the trace is not training time


def _teardown(watcher: Optional[ExitSignalWatcher], logger: MetricsLogger, created_pg: bool) -> None:
    if watcher is not None:
        watcher.restore()
    logger.close()
    shutdown(created_pg)
