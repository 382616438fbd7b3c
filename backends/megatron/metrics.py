"""What a run reports: the console line, metrics.jsonl, TensorBoard, MFU and the exit status.

Only the logging rank (the last global rank, which holds the last pipeline stage) writes.
:class:`IntervalMeter` turns the steps since the last log line into loss, step time, tokens/s,
TFLOP/s per GPU and MFU (:func:`model_flops_per_token`, the planner's count), progress, tokens
seen and the time left (:func:`eta_seconds`); :func:`dlm_loss_sums` adds what people look at in
a masked-diffusion run (the loss by noise-level bucket, the realised mask ratio); :func:`phase`
times the long phases of a start. W&B gets the same scalars as TensorBoard
(:mod:`dlmspec.backends.megatron.wandb_log`); the host launch probe is
:mod:`dlmspec.backends.megatron.hostbench`, the profiler :mod:`dlmspec.backends.megatron.profiling`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.flops import model_flops_per_data_token as _model_flops_per_data_token

from .config import CheckpointConfig, LoggingConfig, RunConfig, TrainState
from .distributed import parallel_layout
from .init_from import InitSource
from .layers import (
    count_parameters,
    layer_spec_attention,
    layer_spec_backend,
    layer_spec_block_size,
    layer_spec_fusions,
    layer_spec_sdpa_backend,
)
from .spec_record import ResumeCheck, SpecLock
from .wandb_log import WandbRun


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
    extra_seq_length: int = 0,
    keys: Optional[float] = None,
    output_length: Optional[int] = None,
) -> int:
    """Training FLOPs (forward + backward) of the model's matmuls per data token: MFU's numerator.

    The count is :func:`dlmspec.flops.model_flops_per_data_token`, the planner's (one definition;
    see :mod:`dlmspec.flops` for the rules and sources): the ``seq_length + extra_seq_length`` input
    positions through the decoder at ``keys`` keys per query (the objective's mask; ``None``: the
    layer pattern's), ``output_length`` rows (``None``: all) through the output layer, per
    ``seq_length`` data tokens. Without extra positions it is
    :func:`dlmspec.flops.model_flops_per_token`. This adapter takes megatron-core's conventions:
    ``None`` for unset MoE sizes, ``moe_ffn_hidden_size`` defaulting to ``ffn_hidden_size``, and
    every layer MoE unless ``num_moe_layers`` says otherwise.

    Returns:
        FLOPs per data token, rounded to an int.

    Raises:
        ValueError: For an unknown ``attention``, a missing ``block_size`` or an ``output_length``
            outside the input.
    """
    moe_layers = (num_layers if num_moe_layers is None else num_moe_layers) if num_experts else 0
    return int(round(_model_flops_per_data_token(
        num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
        vocab_size, seq_length, extra_seq_length=extra_seq_length, keys=keys, output_length=output_length,
        gated=gated_mlp, attention=attention, block_size=block_size,
        num_experts=num_experts or 0, moe_router_topk=moe_router_topk if num_experts else 0,
        moe_ffn_hidden_size=(moe_ffn_hidden_size or ffn_hidden_size) if num_experts else 0,
        moe_shared_expert_intermediate_size=moe_shared_expert_intermediate_size or 0,
        num_moe_layers=moe_layers,
    )))


@dataclasses.dataclass(frozen=True)
class ObjectiveInput:
    """What an objective does to the model's input, for the FLOP count (the planner's
    :func:`dlmspec.plan.shape.input_length`, :func:`~dlmspec.plan.shape.output_length` and
    ``ModelShape.attended_keys``, from the same compiler plugin).

    Attributes:
        extra_seq_length: positions beyond ``seq_length`` in the model's input (block diffusion: ``L``).
        keys: mean keys per query under the objective's own mask (``None``: the layer pattern's).
        output_length: rows per sequence reaching the output layer (``None``: every input position).
    """

    extra_seq_length: int = 0
    keys: Optional[float] = None
    output_length: Optional[int] = None


def objective_input(objective: Any, seq_length: int, train_iters: int = 0, *,
                    sequence_parallel: bool = False) -> ObjectiveInput:
    """:class:`ObjectiveInput` of a run's ``ObjectiveConfig`` (:class:`~dlmspec.backends.megatron.config.ObjectiveConfig`):
    the compiler half of its kind (:mod:`dlmspec.objectives`, standard library only) read with the
    config's fields and its ``options`` (``block_size``, ``ar_loss_weight``, ``block_size_schedule``
    for block diffusion: the names of the spec's ``[objective]`` keys). The extra positions reach the
    output layer unless the plugin drops them (``extra_positions_output``: block diffusion without
    an AR loss, whose decoder hands on the ``x_t`` half only) and the decoder's output is whole (no
    ``sequence_parallel``: ``backends/megatron/objectives/bd3lm.py`` ``_pass_noised_half``). A kind
    without a compiler half, or ``None``: no extra positions."""
    from types import SimpleNamespace

    from dlmspec.objectives import find

    plugin = find(getattr(objective, "kind", None))
    if plugin is None:
        return ObjectiveInput()
    fields = dataclasses.asdict(objective) if dataclasses.is_dataclass(objective) else {}
    options = dict(fields.pop("options", None) or {})
    view = SimpleNamespace(**{**fields, **options})
    extra = int(plugin.extra_seq_length(view, seq_length))
    if not extra:
        return ObjectiveInput()
    keys = plugin.attended_keys(view, seq_length, train_iters)
    output = None if (plugin.extra_positions_output(view) or sequence_parallel) else seq_length
    return ObjectiveInput(extra_seq_length=extra, keys=None if keys is None else float(keys), output_length=output)


def model_flops_per_token_from_config(
    config: TransformerConfig, *, vocab_size: int, seq_length: int, attention: str, block_size: Optional[int] = None,
    objective_terms: Optional[ObjectiveInput] = None,
) -> int:
    """:func:`model_flops_per_token` with the sizes read from a ``TransformerConfig`` (and the
    objective's input, :func:`objective_input`)."""
    terms = objective_terms or ObjectiveInput()
    return model_flops_per_token(
        extra_seq_length=terms.extra_seq_length,
        keys=terms.keys,
        output_length=terms.output_length,
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


def run_flops_per_token(config: TransformerConfig, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any],
                        seq_length: int, objective: Any, train_iters: int) -> Tuple[int, Optional[int]]:
    """``(step FLOPs per data token, data tokens' own FLOPs per token or None)`` of a run, both by
    :func:`model_flops_per_token_of`: the first counts the objective's input (block diffusion: ``2 L``
    positions at the mask's density, the output layer on the rows reaching it; the planner's
    ``model_per_step / data tokens``), the second only where the objective's input is longer than
    the data (then both MFUs are logged), else None."""
    step = model_flops_per_token_of(config, layer_spec, model_kwargs, seq_length, objective, train_iters)
    data = model_flops_per_token_of(config, layer_spec, model_kwargs, seq_length, data_only=True)
    return step, (data if data != step else None)


def model_flops_per_token_of(config: TransformerConfig, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any],
                             seq_length: int, objective: Any = None, train_iters: int = 0,
                             data_only: bool = False) -> int:
    """:func:`model_flops_per_token_from_config` of a run: the model's (padded) vocabulary from
    ``model_kwargs``, the attention pattern and block size from its layer spec, the objective's
    input from ``objective`` (the run's ``ObjectiveConfig``; :func:`objective_input` over
    ``train_iters`` steps): per data token, the FLOPs of the whole step (block diffusion: ``2 L``
    positions at the mask's density, the output layer on the rows reaching it), what the planner's
    ``flops.model_per_step / (global_batch * seq_length)`` counts. ``data_only``: the model FLOPs of
    the ``seq_length`` data tokens alone under the layer pattern (what an MDM step over the same
    tokens counts; the planner's ``data_mfu``)."""
    terms = None if data_only else objective_input(objective, seq_length, train_iters,
                                                   sequence_parallel=bool(config.sequence_parallel))
    return model_flops_per_token_from_config(
        config, vocab_size=int(model_kwargs["vocab_size"]), seq_length=seq_length,
        attention=layer_spec_attention(layer_spec), block_size=layer_spec_block_size(layer_spec),
        objective_terms=terms,
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


class MetricsLogger:
    """Console (rich or plain), TensorBoard and JSON-lines metrics of one rank.

    Only the logging rank (the last global rank, which holds the last
    pipeline stage) writes; on other ranks every method is a no-op.

    With ``config.wandb_project`` set, :meth:`start_wandb` opens the W&B run and :meth:`record`
    sends it the scalars TensorBoard gets (:class:`~dlmspec.backends.megatron.wandb_log.WandbRun`).

    Args:
        config: :class:`~dlmspec.backends.megatron.config.LoggingConfig`.
        enabled: Whether this rank logs.
    """

    def __init__(self, config: LoggingConfig, enabled: bool) -> None:
        self.enabled = enabled
        self.config = config
        self.run_dir = config.run_dir
        self._console = None
        self._tb = None
        self._file = None
        self.wandb: Optional[WandbRun] = None
        if not enabled:
            return
        os.makedirs(config.run_dir, exist_ok=True)
        self._file = open(os.path.join(config.run_dir, "metrics.jsonl"), "a", buffering=1)
        if config.console in ("auto", "rich"):
            try:
                from rich.console import Console

                self._console = Console(soft_wrap=True)  # one line per record in log files too
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

    def start_wandb(self, *, name: str, config: Dict[str, Any]) -> None:
        """Open (or resume) the W&B run of ``logging.wandb_project`` on the logging rank, with
        ``config`` (the run's settings and provenance) as its config; nothing without a project."""
        if self.enabled and self.config.wandb_project:
            self.wandb = WandbRun.start(self.config, name=name, config_values=config)

    def record(self, event: str, values: Dict[str, Any], step: Optional[int] = None) -> None:
        """Append ``{"event": event, **values}`` to metrics.jsonl, and with a ``step`` its numeric
        values to TensorBoard and W&B as ``<event>/<key>`` (:func:`scalars`)."""
        if not self.enabled:
            return
        self._file.write(json.dumps({"event": event, "time": time.time(), **values}, default=str) + "\n")
        if step is None:
            return
        found = scalars(event, values)
        if self._tb is not None:
            for key, value in found.items():
                self._tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(found, step)

    def close(self) -> None:
        """Flush and close the outputs (and finish the W&B run)."""
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._file is not None:
            self._file.close()


def scalars(event: str, values: Dict[str, Any]) -> Dict[str, float]:
    """The numbers of a record that TensorBoard and W&B get: ``{"<event>/<key>": value}`` for each
    int or float (not bools, not ``iteration``: that is the step)."""
    return {f"{event}/{key}": value for key, value in values.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "iteration"}


def write_exit_status(run_dir: str, enabled: bool, reason: str, iteration: int, checkpoint: Optional[str],
                      sig: Optional[str]) -> None:
    """Write ``<run_dir>/exit_status.json`` (``reason``, ``iteration``, ``checkpoint``, ``signal``)
    when ``enabled`` (the logging rank): how the run ended, for launch scripts and benchmarks."""
    if not enabled:
        return
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "exit_status.json"), "w") as f:
        json.dump({"reason": reason, "iteration": iteration, "checkpoint": checkpoint, "signal": sig}, f)


def now() -> float:
    """``time.perf_counter()`` once the GPU has finished the work queued so far."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def eta_seconds(iteration: int, train_iters: int, step_time_s: float) -> float:
    """Seconds left: the steps left (``train_iters - iteration``, never below 0) at ``step_time_s``
    seconds each (the last log interval's measured step time; evaluation and checkpoint saves,
    which the step time leaves out, come on top)."""
    return max(train_iters - iteration, 0) * step_time_s


def format_duration(seconds: float) -> str:
    """A duration for the console: ``"45s"``, ``"3m05s"``, ``"2h07m"``, ``"3d04h"`` (rounded down
    to the unit shown; ``"?"`` for a negative or non-finite value)."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_count(n: float) -> str:
    """A count for the console with an SI suffix: ``"950"``, ``"12.3K"``, ``"4.56M"``, ``"1.20B"``, ``"3.40T"``."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= size:
            value = n / size
            return f"{value:.3g}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{n:.0f}"


#: Noise-level buckets of :func:`dlm_loss_sums`: ``t`` in ``[edge[i], edge[i+1])`` (the last one
#: closed), for ``train/loss_t<lo>-<hi>`` records.
T_BUCKET_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0)
#: Length of :func:`dlm_loss_sums`' vector: a loss sum and a count per bucket, then the masked
#: positions and the counted positions.
DLM_SUMS = 2 * (len(T_BUCKET_EDGES) - 1) + 2
#: The loss-report key (beside ``"lm loss"``) of a microbatch's :func:`dlm_loss_sums`.
DLM_REPORT = "dlm sums"


def dlm_loss_sums(per_token_loss: Optional[torch.Tensor], loss_weights: torch.Tensor, t: torch.Tensor,
                  masked: Optional[torch.Tensor], token_mask: torch.Tensor) -> torch.Tensor:
    """The sums behind the masked-diffusion scalars of one microbatch (detached, float32).

    Args:
        per_token_loss: ``[b, s]`` cross entropy in nats, or ``None`` where the loss is computed
            fused with the output layer (no per-token loss: the buckets' sums stay 0).
        loss_weights: ``[b, s]`` the objective's weights (``ObjectiveBatch.loss_weights``).
        t: ``[b]`` the noise level drawn per sequence (``ObjectiveBatch.mask_ratio``).
        masked: ``[b, s]`` which positions were masked (``ObjectiveBatch.masked``); where its shape
            is not the loss's (context parallelism slices the sequence after masking) the
            positions with a non-zero weight stand for it (MDM weighs exactly the masked ones).
        token_mask: ``[b, s]`` the positions that count (not padding or a truncated tail).

    Returns:
        ``[DLM_SUMS]``: per :data:`T_BUCKET_EDGES` bucket the sum of the unweighted cross entropy
        over the masked positions of the sequences whose ``t`` falls in it, then per bucket their
        number, then the masked positions and the counted positions of the microbatch. Summed
        over microbatches and ranks, :func:`dlm_record` turns them into means.
    """
    counted = token_mask.bool()
    if masked is None or masked.shape != counted.shape:
        masked = loss_weights != 0
    masked = masked.bool() & counted
    edges = torch.tensor(T_BUCKET_EDGES[1:-1], dtype=t.dtype, device=t.device)
    bucket = torch.bucketize(t.detach(), edges, right=True)  # [b] in 0 .. buckets - 1
    onehot = torch.nn.functional.one_hot(bucket, len(T_BUCKET_EDGES) - 1).to(torch.float32)  # [b, buckets]
    masked_f = masked.to(torch.float32)
    if per_token_loss is None:
        loss_sums = torch.zeros(onehot.shape[1], dtype=torch.float32, device=masked_f.device)
        loss_counts = torch.zeros_like(loss_sums)
    else:
        per_row = (per_token_loss.detach().float() * masked_f).sum(dim=1)  # [b]
        loss_sums, loss_counts = per_row @ onehot, masked_f.sum(dim=1) @ onehot
    return torch.cat([loss_sums, loss_counts, torch.stack([masked_f.sum(), counted.sum().to(torch.float32)])])


def dlm_record(sums: torch.Tensor) -> Dict[str, Optional[float]]:
    """``train`` record entries from summed :func:`dlm_loss_sums` vectors: ``loss_t0.00-0.25`` ...
    (mean cross entropy in nats over the masked positions of each bucket; a bucket with no
    masked position is left out) and ``mask_ratio`` (masked / counted positions)."""
    values = [float(v) for v in sums.tolist()]
    buckets = len(T_BUCKET_EDGES) - 1
    out: Dict[str, Optional[float]] = {}
    for i in range(buckets):
        if values[buckets + i] > 0:
            out[f"loss_t{T_BUCKET_EDGES[i]:.2f}-{T_BUCKET_EDGES[i + 1]:.2f}"] = values[i] / values[buckets + i]
    masked, counted = values[-2], values[-1]
    out["mask_ratio"] = masked / counted if counted > 0 else None
    return out


@contextlib.contextmanager
def phase(logger: "MetricsLogger", what: str, timings: Dict[str, float], key: str) -> Iterator[None]:
    """Say ``[dlmspec] <what> ...`` before a long phase of the start (data index building, a
    checkpoint load, converting ``init_from``) and ``[dlmspec] <what>: <s> s`` after; the seconds
    go into ``timings[key]`` (the ``start`` record's ``phases_s``)."""
    logger.text(f"[dlmspec] {what} ...")
    t0 = time.perf_counter()
    yield
    timings[key] = seconds = time.perf_counter() - t0
    logger.text(f"[dlmspec] {what}: {seconds:.1f} s")


class IntervalMeter:
    """The steps since the last log line: their loss, skipped updates, grad norm and wall time.

    Evaluation, saving and writing a profile are left out of the time (:meth:`exclude`).

    Args:
        device: Where the loss sums live.
        tokens_per_step: Global batch size x sequence length.
        flops_per_token: Model FLOPs of the step per data token (:func:`model_flops_per_token_of`;
            block diffusion: its ``2 L`` input positions at the mask's density): ``tflops_per_gpu``
            and ``mfu``.
        world_size: Number of GPUs.
        peak_tflops: ``LoggingConfig.peak_tflops_per_gpu`` (MFU's denominator), or ``None``.
        data_flops_per_token: for an objective whose input is longer than its data, the model FLOPs
            of the data tokens alone (``model_flops_per_token_of(..., data_only=True)``): the record
            adds ``data_tflops_per_gpu`` and ``data_mfu`` (the planner's ``data_mfu``); ``None``: not
            recorded (equal to the above).
    """

    def __init__(self, device: torch.device, *, tokens_per_step: int, flops_per_token: int, world_size: int,
                 peak_tflops: Optional[float], data_flops_per_token: Optional[int] = None) -> None:
        self.device = device
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.data_flops_per_token = data_flops_per_token
        self.world_size = world_size
        self.peak = peak_tflops
        self._reset()
        self.start = now()

    def _reset(self) -> None:
        self.loss = torch.zeros(2, dtype=torch.float32, device=self.device)
        #: the stage's report sums of the interval by key (``"lm loss"`` is :attr:`loss`)
        self.sums: Dict[str, torch.Tensor] = {}
        self.iters = 0
        self.skipped = 0
        self.grad_norm = 0.0

    @property
    def dlm(self) -> Optional[torch.Tensor]:
        """The interval's summed :func:`dlm_loss_sums` (``None`` unless the steps gave them)."""
        return self.sums.get(DLM_REPORT)

    def add(self, loss: torch.Tensor, update_ok: bool, grad_norm: float, dlm: Optional[torch.Tensor] = None,
            sums: Optional[Dict[str, torch.Tensor]] = None) -> None:
        """Count one step: its ``[loss sum, tokens]``, whether the optimizer updated, its grad norm
        and its other report sums by key (``sums``: the stage's
        :meth:`~dlmspec.backends.megatron.stage.StageBase.reduce_reports` without ``"lm loss"``;
        ``dlm``: masked diffusion's summed :func:`dlm_loss_sums`, the ``DLM_REPORT`` entry)."""
        if not update_ok:
            self.skipped += 1
        self.loss += loss
        extra = dict(sums or {})
        extra.pop("lm loss", None)
        if dlm is not None:
            extra[DLM_REPORT] = dlm
        for key, value in extra.items():
            self.sums[key] = value.clone() if key not in self.sums else self.sums[key] + value
        self.iters += 1
        self.grad_norm = grad_norm

    def exclude(self, since: float) -> None:
        """Leave the time from ``since`` (a :func:`now`) until now out of the interval."""
        self.start += now() - since

    def log(self, logger: MetricsLogger, state: TrainState, *, train_iters: int, lr: float,
            metrics: Optional[Callable[[Dict[str, torch.Tensor]], Dict[str, Any]]] = None) -> float:
        """Write the interval's ``train`` record and console line (at ``state.iteration``, with the
        learning rate ``lr``), then start a new interval.

        The line shows the progress (``iter N/train_iters (P%)``), the tokens seen (``iteration x
        tokens_per_step``) and the time left (:func:`eta_seconds` at this interval's step time);
        the record has them as ``train_iters``, ``tokens_seen`` and ``eta_s``, then the stage's
        entries: ``metrics(sums)`` of the interval's report sums (the stage's
        :meth:`~dlmspec.backends.megatron.stage.StageBase.interval_metrics`; without it the
        masked-diffusion scalars of :func:`dlm_record` when the steps gave them). TensorBoard and
        W&B get every number of the record as ``train/<key>``.

        Collective: the peak memory is the maximum over all ranks. Returns the interval's loss.
        """
        iteration, consumed_train_samples = state.iteration, state.consumed_train_samples
        elapsed = now() - self.start
        loss_sum, ntok = self.loss.tolist()
        loss = loss_sum / max(ntok, 1.0)
        step_time = elapsed / self.iters
        tokens_per_s = self.tokens_per_step / step_time
        tflops = self.flops_per_token * tokens_per_s / self.world_size / 1e12
        peak = self.peak
        mem = torch.zeros(2, dtype=torch.float64, device=self.device)
        if torch.cuda.is_available():
            mem[0] = torch.cuda.max_memory_allocated() / 2**30
            mem[1] = torch.cuda.max_memory_reserved() / 2**30
        dist.all_reduce(mem, op=dist.ReduceOp.MAX)
        record = {
            "iteration": iteration, "loss": loss, "lr": lr,
            "grad_norm": self.grad_norm, "step_time_s": step_time, "tokens_per_s": tokens_per_s,
            "tflops_per_gpu": tflops, "mfu": (tflops / peak) if peak else None,
            "peak_mem_gib": float(mem[0]), "peak_reserved_gib": float(mem[1]),
            "consumed_train_samples": consumed_train_samples, "skipped_iters": self.skipped,
            "train_iters": train_iters, "tokens_seen": iteration * self.tokens_per_step,
            "eta_s": eta_seconds(iteration, train_iters, step_time),
        }
        if self.data_flops_per_token is not None:  # the data tokens' FLOPs alone (block diffusion: L of 2L)
            data_tflops = self.data_flops_per_token * tokens_per_s / self.world_size / 1e12
            record["data_tflops_per_gpu"] = data_tflops
            record["data_mfu"] = (data_tflops / peak) if peak else None
        if metrics is not None:
            entries = metrics(self.sums)
            taken = sorted(set(entries) & set(record))
            if taken:
                raise ValueError(f"the stage's interval metrics {taken} would replace the loop's own record entries")
            record.update(entries)
        elif self.dlm is not None:
            record.update(dlm_record(self.dlm))
        logger.record("train", record, step=iteration)
        mfu_text = f" | MFU {100 * tflops / peak:5.1f}%" if peak else ""
        logger.text(
            f"iter {iteration:>7d}/{train_iters} ({100 * iteration / max(train_iters, 1):.0f}%) | loss {loss:.4f} | "
            f"lr {record['lr']:.3e} | grad norm {record['grad_norm']:.3f} | {step_time * 1000:.0f} ms/step | "
            f"{tokens_per_s:,.0f} tok/s | {tflops:.1f} TFLOP/s/GPU{mfu_text} | "
            f"mem {record['peak_mem_gib']:.1f} GiB | {format_count(record['tokens_seen'])} tokens | "
            f"ETA {format_duration(record['eta_s'])}"
        )
        self._reset()
        self.start = now()
        return loss


def weights_record(resume_from: Optional[str], init_source: Optional[InitSource], ckpt: CheckpointConfig,
                   seed: int) -> Tuple[Dict[str, Any], str]:
    """Where the run's weights came from: the ``start`` record's ``weights`` entry and its console
    text (a resume, ``checkpoint.init_from``'s :class:`~dlmspec.backends.megatron.init_from.InitSource`, or
    random initialisation with ``seed``)."""
    if resume_from is not None:
        ignored = f" (checkpoint.init_from {ckpt.init_from!r} not used: a resume continues the run)" if ckpt.init_from else ""
        return {"from": "resume", "checkpoint": resume_from, "init_from_ignored": ckpt.init_from}, \
            f"resumed from {resume_from}{ignored}"
    if init_source is not None:
        return {"from": "init_from", **init_source.to_record()}, init_source.describe()
    return {"from": "random", "seed": seed}, f"random initialisation (seed {seed})"


def log_start(logger: MetricsLogger, *, run: RunConfig, objective: str, layer_spec: ModuleSpec,
              model: List[torch.nn.Module], iteration: int, num_microbatches: int, flops_per_token: int,
              cross_entropy: str, rope_fusion: Optional[str], parallel_sizes: Dict[str, Optional[int]],
              lock: SpecLock, resume_from: Optional[str], resume_check: Optional[ResumeCheck],
              init_source: Optional[InitSource], provenance: Optional[Dict[str, Any]] = None,
              phases: Optional[Dict[str, float]] = None) -> None:
    """Write the ``start`` record (the run's layout, model, kernels, weights and spec, its
    ``provenance`` (:func:`dlmspec.backends.megatron.provenance.collect`) and the seconds of the
    start's long ``phases``) and its console lines: the summary, where the weights come from
    (``resume_from``, ``init_source`` or random), and every warning of the start (the spec
    ``lock``'s, the ``resume_check``'s); then open the W&B run (:meth:`MetricsLogger.start_wandb`)
    with the start record as its config."""
    backend, attention = layer_spec_backend(layer_spec), layer_spec_attention(layer_spec)
    world = dist.get_world_size()
    local_params = count_parameters(model)
    fusions = layer_spec_fusions(layer_spec)
    start_info = {
        "name": run.name, "iteration": iteration, "world_size": world, "layer_spec": backend,
        "attention": attention, "objective": objective, "num_microbatches": num_microbatches,
        "params_on_logging_rank": local_params, "model_flops_per_token": flops_per_token,
        "parallel_layout": parallel_layout(), "run_config": dataclasses.asdict(run),
        "cross_entropy": cross_entropy, "sdpa_backend": layer_spec_sdpa_backend(layer_spec),
        "rope_fusion": rope_fusion, **fusions,
    }
    start_info["weights"], weights_text = weights_record(resume_from, init_source, run.checkpoint, run.seed)
    start_info["spec_hash"] = lock.content_hash
    start_info["spec_lock"] = lock.path if lock.text is not None else None
    if resume_check is not None:
        start_info["resume_check"] = resume_check.to_record()
    start_info["provenance"], start_info["phases_s"] = provenance, dict(phases or {})
    logger.record("start", start_info)
    logger.start_wandb(name=run.logging.wandb_exp_name or run.name,
                       config=json.loads(json.dumps(start_info, default=str)))  # plain JSON values
    sizes = parallel_sizes
    logger.text(
        f"[dlmspec] {run.name}: layer spec {backend}, attention {attention}, objective {objective}, "
        f"world {world} (tp {sizes['tensor_model_parallel_size']} pp {sizes['pipeline_model_parallel_size']} "
        f"dp {parallel_state.get_data_parallel_world_size()} cp {sizes['context_parallel_size']} "
        f"ep {sizes['expert_model_parallel_size']}), {num_microbatches} microbatches/step, "
        f"{local_params / 1e6:.1f}M params on this rank, {flops_per_token / 1e9:.2f} GFLOP/token, "
        f"cross entropy {cross_entropy}, RoPE {'fused (' + rope_fusion + ')' if rope_fusion else 'unfused'}"
        + "".join(f", {name}" for name, used in fusions.items() if used)
    )
    logger.text(f"[dlmspec] weights: {weights_text}")
    for warning in lock.warnings:
        logger.text(f"[dlmspec] warning: {warning}")
    for line in resume_check.report_lines() if resume_check is not None else ():
        logger.text(f"[dlmspec] {line}")
    for warning in init_source.warnings if init_source is not None else ():
        logger.text(f"[dlmspec] warning: checkpoint.init_from: {warning}")
    if provenance is not None:
        git = provenance.get("git") or {}
        commit = f"{git['commit'][:12]}{' (dirty)' if git.get('dirty') else ''}" if git.get("commit") else "none"
        versions = provenance.get("versions") or {}
        logger.text(f"[dlmspec] provenance: spec {provenance.get('spec_hash')}, "
                    f"dlmspec {provenance.get('dlmspec_version')}, git {commit}, torch {versions.get('torch')}, "
                    f"megatron-core {versions.get('megatron_core')}, "
                    f"transformer-engine {versions.get('transformer_engine')}")


def log_validation(logger: MetricsLogger, iteration: int, loss: float) -> None:
    """The ``valid`` record and console line of an evaluation."""
    logger.text(f"iter {iteration:>7d} | validation loss {loss:.4f}")
    logger.record("valid", {"iteration": iteration, "loss": loss}, step=iteration)


def log_exit(logger: MetricsLogger, state: TrainState, signal: Optional[str] = None) -> None:
    """The ``exit`` record and, on the logging rank, ``exit_status.json`` (:func:`write_exit_status`)
    of a run that ends normally (``state.exit_reason``, with the last losses) or on stop ``signal``."""
    if signal is not None:
        logger.record("exit", {"iteration": state.iteration, "reason": f"signal {signal}",
                               "checkpoint": state.last_checkpoint})
        write_exit_status(logger.run_dir, logger.enabled, "signal", state.iteration, state.last_checkpoint, signal)
        return
    logger.record("exit", {"iteration": state.iteration, "reason": state.exit_reason,
                           "checkpoint": state.last_checkpoint, "train_loss": state.last_train_loss,
                           "valid_loss": state.last_valid_loss})
    write_exit_status(logger.run_dir, logger.enabled, state.exit_reason, state.iteration, state.last_checkpoint, None)
