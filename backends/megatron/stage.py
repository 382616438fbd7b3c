"""The seam between the training loop and a stage: what it trains on, its objective, its step work.

:func:`dlmspec.backends.megatron.training.train` runs what every stage shares (process groups, model,
optimizer and learning-rate schedule, checkpoints, logging, the step, evaluation and save
cadence) and asks a :class:`Stage` for the rest: pre-training (:class:`PretrainStage`) and
supervised fine-tuning (:class:`~dlmspec.backends.megatron.sft.SftStage`); :class:`Stage` says
what RL will supply. A stage is chosen by ``[stage] kind`` from
:data:`dlmspec.backends.megatron.stages.STAGES`.

What a stage receives (:class:`StageResources`, on :attr:`StageContext.resources`): a
:class:`ModelFactory` (megatron-core models built as train() builds the policy, e.g. a frozen
reference copy sharded like it), the run's tokenizer (built on first use), and a
``LogitsFn`` of a model chunk that works across tensor-parallel shards
(:func:`dlmspec.backends.generate.models.gpt_logits_fn`). What it gives back besides the loss:
the step's metrics (:meth:`StageBase.reduce_reports` / :meth:`StageBase.interval_metrics`), the
samples a step consumed (:meth:`StageBase.samples_consumed`) and its own checkpoint state
(:meth:`StageBase.state_dict` / :meth:`StageBase.load_state_dict`). :class:`StageBase` holds
those defaults (pre-training's behaviour); the loop falls back to them for a stage without them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple, runtime_checkable

import torch
import torch.distributed as dist

from megatron.core import parallel_state
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.utils import get_batch_on_this_cp_rank, get_model_config, unwrap_model

from .checks import check_masks_supported, check_objective, check_sequence_length
from .config import ObjectiveConfig, RunConfig
from .data import (
    batch_to_device,
    build_dataloader,
    build_datasets,
    combine_attention_masks,
    document_attention_mask,
)
from .fsdp import model_uses_megatron_fsdp
from .layers import build_model, layer_spec_attention
from .metrics import DLM_REPORT, dlm_loss_sums, dlm_record
from .microbatches import MicrobatchFeed, MicrobatchItem
from .objective import (ObjectiveBatch, apply_loss_normalization, build_objective, dataset_extra_token, loss_triple,
                        reduce_loss, ObjectiveRng)
from .output_loss import defer_output_projection, linear_cross_entropy, resolve_fused_linear_impl
from .rng import TRAIN_STREAM, VALID_STREAM, masking_generator, variable_length_generator


#: The loss-report key of every stage's loss function: ``tensor([loss_sum, num_tokens])``
#: (megatron-core's ``forward_step_func`` convention); the loop logs ``sum / num_tokens`` as ``loss``.
LM_LOSS = "lm loss"


class StageResourceError(ValueError):
    """A resource a stage asked for cannot be had here (the message says why and what works)."""


class ModelFactory:
    """Builds megatron-core ``GPTModel`` chunks the way :func:`~dlmspec.backends.megatron.training.train`
    builds the policy (:func:`~dlmspec.backends.megatron.layers.build_model` with the run's
    ``TransformerConfig``, layer spec and sizes), so what a stage builds is sharded like the policy:
    the same tensor-, pipeline- and expert-parallel slices on this rank, one chunk per virtual
    pipeline stage.

    Args:
        transformer_config: The run's ``TransformerConfig`` (read when :meth:`build` runs, so
            changes train() makes before building the policy, e.g. RoPE fusion, apply).
        layer_spec: The run's layer spec.
        model_kwargs: ``build_model``'s other keywords (``vocab_size``, ...).
        ddp_config: The policy's ``DistributedDataParallelConfig`` (``build(wrap_ddp=True)``).
        builder: The model construction (default:
            :func:`~dlmspec.backends.megatron.layers.build_model`; train() passes the one it uses).
    """

    def __init__(self, transformer_config: Any, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any],
                 ddp_config: Any = None, builder: Optional[Callable[..., List[torch.nn.Module]]] = None) -> None:
        self.transformer_config = transformer_config
        self.layer_spec = layer_spec
        self.model_kwargs = dict(model_kwargs)
        self.ddp_config = ddp_config
        self.builder = builder if builder is not None else build_model

    def build(self, *, wrap_ddp: bool = False, initialize: bool = True) -> List[torch.nn.Module]:
        """This rank's chunks of a new model.

        Args:
            wrap_ddp: Wrap them in megatron DDP (or Megatron-FSDP) with ``ddp_config``, as the
                policy is; ``False``: forward-only chunks (a reference model), no gradient buffers.
            initialize: Draw initial weights (``TransformerConfig.perform_initialization``);
                ``False`` leaves them unset and draws no random numbers (for a copy that loads
                weights next: the run's RNG streams stay where they were).

        Raises:
            RuntimeError: megatron-core's model-parallel state is not initialised.
        """
        config = self.transformer_config
        if not initialize:
            config = copy.copy(config)
            config.perform_initialization = False
        return self.builder(config, layer_spec=self.layer_spec, ddp_config=self.ddp_config if wrap_ddp else None,
                            **self.model_kwargs)

    def frozen_copy(self, model: List[torch.nn.Module]) -> List[torch.nn.Module]:
        """A frozen copy of ``model`` (the policy's chunks): built without DDP and without drawing
        weights, its weights copied from ``model`` (:meth:`copy_weights`), in eval mode, every
        parameter with ``requires_grad = False``. Memory: one more copy of this rank's weights in
        the run's dtype (the planner's stage terms count it, :mod:`dlmspec.plan.memory`).

        Raises:
            StageResourceError: ``model`` is sharded by Megatron-FSDP (its chunks hold a shard of
                each weight, not the layer: no copy of the same layout can be built here).
        """
        if model_uses_megatron_fsdp(model):
            raise StageResourceError("a frozen copy of a Megatron-FSDP model cannot be built (each rank holds a "
                                     "shard of every weight); use parallel.fsdp = \"none\" for a stage with a "
                                     "reference model")
        chunks = self.build(initialize=False)
        self.copy_weights(model, chunks)
        for chunk in chunks:
            chunk.eval()
            chunk.requires_grad_(False)
        return chunks

    @staticmethod
    def copy_weights(source: List[torch.nn.Module], target: List[torch.nn.Module]) -> None:
        """Copy ``source``'s weights into ``target`` chunk by chunk (same layout: built by the
        same factory), e.g. to refresh a reference model. Under ``overlap_param_gather`` the
        policy's weights are gathered by its next forward: copy after one, or before the step.

        Raises:
            ValueError: another number of chunks, or (``load_state_dict``, strict) other weights.
        """
        if len(source) != len(target):
            raise ValueError(f"copy_weights: {len(source)} source chunk(s) and {len(target)} target chunk(s)")
        with torch.no_grad():
            for src, dst in zip(source, target):
                unwrap_model(dst).load_state_dict(unwrap_model(src).state_dict(), strict=True)


def tokenizer_from_record(record: Optional[Dict[str, Any]]) -> Any:
    """The run's tokenizer from its spec record's ``data.tokenizer.*`` entries (the lock's
    ``[data.tokenizer]`` table; :func:`dlmspec.tokenizers.build_tokenizer`, relative paths from the
    working directory, as the data was prepared).

    Raises:
        StageResourceError: the record has no tokenizer, or it cannot be built (why, and the fix).
    """
    record = record or {}
    kind = record.get("data.tokenizer.type")
    if not kind:
        raise StageResourceError("this stage needs the run's tokenizer and the spec records none: set "
                                 "[data.tokenizer] in the spec and compile again")
    from dlmspec.tokenizers import TokenizerError, build_tokenizer

    try:
        return build_tokenizer(kind, tokenizer_model=record.get("data.tokenizer.model"),
                               vocab_file=record.get("data.tokenizer.vocab_file"),
                               merge_file=record.get("data.tokenizer.merge_file"),
                               vocab_size=record.get("data.tokenizer.vocab_size"))
    except (TokenizerError, OSError, ImportError) as exc:
        raise StageResourceError(f"the run's tokenizer ({kind}) cannot be built: {exc}; relative paths are "
                                 "relative to the directory train.py is launched from") from None


class StageResources:
    """What the loop lends a stage (:attr:`StageContext.resources`).

    Args:
        model_factory: :class:`ModelFactory` of the run.
        record: The run's spec record (``data.tokenizer.*`` entries build :attr:`tokenizer`).
        tensor_model_parallel_size: The run's TP (:meth:`logits_fn` gathers the vocabulary over it).
        tokenizer: A tokenizer to lend instead of building one from ``record`` (tests).
    """

    def __init__(self, model_factory: ModelFactory, *, record: Optional[Dict[str, Any]] = None,
                 tensor_model_parallel_size: int = 1, tokenizer: Any = None) -> None:
        self.model_factory = model_factory
        self.record = record
        self.tensor_model_parallel_size = int(tensor_model_parallel_size)
        self._tokenizer = tokenizer

    @property
    def tokenizer(self) -> Any:
        """The run's tokenizer (``encode(text) -> ids``, ``detokenize(ids) -> text``,
        :class:`dlmspec.tokenizers.Tokenizer`), built on first use (a stage that never decodes text
        needs no tokenizer files).

        Raises:
            StageResourceError: as :func:`tokenizer_from_record`.
        """
        if self._tokenizer is None:
            self._tokenizer = tokenizer_from_record(self.record)
        return self._tokenizer

    def logits_fn(self, chunk: torch.nn.Module) -> Callable[..., torch.Tensor]:
        """``logits_fn(tokens [b, s], attention_mask [b, s] or None) -> logits [b, s, V]`` (float32,
        the whole padded vocabulary on every tensor-parallel rank) of ``chunk``, the sampler's
        interface (:func:`dlmspec.backends.generate.models.gpt_logits_fn`, no gradients). Put the
        chunk in eval mode for sampling, and back in train mode after.

        Raises:
            StageResourceError: ``chunk`` is not both pipeline ends (pipeline parallelism: the
                logits of a whole model are not on one rank).
        """
        inner = unwrap_model(chunk)
        if not (getattr(inner, "pre_process", True) and getattr(inner, "post_process", True)):
            raise StageResourceError("a logits function needs a model chunk holding the embedding and the output "
                                     "layer: pipeline_model_parallel_size must be 1 for this stage")
        from dlmspec.backends.generate.models import gpt_logits_fn

        return gpt_logits_fn(chunk, tensor_model_parallel_size=self.tensor_model_parallel_size)


@dataclass(frozen=True)
class StageContext:
    """What a stage knows of the run once megatron-core's parallel state exists.

    Attributes:
        run: The :class:`~dlmspec.backends.megatron.config.RunConfig`.
        device: The device this rank computes on.
        data_parallel_rank, data_parallel_size: This rank's data-parallel rank and size
            (without context parallelism): which slice of each global batch it takes.
        context_parallel_size: CP size (the sequence is sliced over CP ranks after the
            objective drew its masks on the full sequence).
        resources: The model factory, tokenizer and logits function the loop lends
            (:class:`StageResources`; ``None`` where a stage is set up outside the loop).
    """

    run: RunConfig
    device: torch.device
    data_parallel_rank: int
    data_parallel_size: int
    context_parallel_size: int = 1
    resources: Optional[StageResources] = None


@dataclass
class StageData:
    """A stage's data, as the loop uses it.

    Attributes:
        train: The training microbatches, starting after the samples a resumed checkpoint
            consumed; the loop reads one step's microbatches per step and closes it on every way
            out of :func:`~dlmspec.backends.megatron.training.train`.
        valid: Makes a fresh feed of the validation microbatches (the same batches, and masks,
            at every evaluation), or ``None`` without a validation set.
    """

    train: MicrobatchFeed
    valid: Optional[Callable[[], MicrobatchFeed]] = None


@runtime_checkable
class Stage(Protocol):
    """What a training stage supplies to the loop, in the order the loop calls it.

    1. :meth:`setup` once megatron-core's parallel state exists, before the model is built:
       build the objective, refuse what this stage cannot train with these layers. Its
       ``ctx.resources`` (:class:`StageResources`) lends the model factory, the tokenizer and
       logits functions.
    2. :meth:`build_data` once the weights (and a resumed checkpoint) are loaded.
    3. :meth:`prepare_model`: change the model chunks for the loss, if the stage computes it
       differently (pre-training: the fused output layer and cross entropy); a stage builds
       what it needs beside the policy here, the weights loaded (a frozen reference:
       ``ctx.resources.model_factory.frozen_copy(model)``).
    4. Every step :meth:`before_step`, then megatron's schedule calls :meth:`forward_step` once
       per microbatch (and model chunk); evaluation calls it on the validation feed, forward only.
       After the step the loop reduces the loss reports (:meth:`StageBase.reduce_reports`),
       counts the samples (:meth:`StageBase.samples_consumed`) and, every ``log_interval``
       steps, logs :meth:`StageBase.interval_metrics` of the summed reports.
    5. :meth:`checkpoint_metadata` goes into every checkpoint's ``dlmspec.json``;
       :meth:`StageBase.state_dict` into every checkpoint, per rank, and
       :meth:`StageBase.load_state_dict` gets it back on a resume (same parallel layout);
       :meth:`StageBase.sharded_state_dict` into the distributed checkpoint beside the policy,
       and :meth:`StageBase.load_sharded_state_dict` gets it back on a resume in any layout.

    :attr:`kind` names the objective in the start record and the console line. The members
    of :class:`StageBase` are optional: the loop uses its defaults for a stage without them.

    The loss follows megatron-core's ``forward_step_func`` contract: ``forward_step`` returns
    ``(output, loss_func)`` and ``loss_func(output)`` returns ``(loss_sum, num_tokens,
    {"lm loss": tensor([loss_sum, num_tokens])})``. With
    ``TransformerConfig.calculate_per_token_loss=True`` megatron divides the gradient by the
    ``num_tokens`` of the whole step (every microbatch on every data-parallel rank), so
    ``num_tokens`` *is* the loss normalisation; the loop logs ``sum / num_tokens`` of
    ``"lm loss"``. Ranks that process the same data (tensor-, pipeline- and context-parallel
    peers) must build identical inputs: random draws are seeded from the item's stream,
    iteration and index (:func:`~dlmspec.backends.megatron.rng.masking_generator`), never from a
    stateful generator (or from one that :meth:`StageBase.state_dict` saves, identical on those
    peers).

    Supervised fine-tuning (:class:`~dlmspec.backends.megatron.sft.SftStage`) supplies batches of
    conversations with a response mask (labels and loss weights on response tokens only, prompts
    never carry loss), padded or packed with segment masks, and the loss normalisation of
    ``train.loss_normalization`` over the response tokens (``"sequence"``: weights ``1 /
    len(response)`` and ``num_tokens`` = sequences).

    What RL will supply: rollouts per step: :meth:`before_step` generates them with the current
    policy (model chunks in eval mode, no gradients, ``ctx.resources.logits_fn(chunk)`` for the
    sampler; rewards decode text with ``ctx.resources.tokenizer``; reference log-probabilities
    from a frozen copy) and hands them to its training feed, so the step's microbatches are those
    rollouts; a policy-gradient ``loss_func`` (clipped ratio, KL to the reference) with its own
    normalisation and report entries (reward, KL, clip fraction: :meth:`StageBase.reduce_reports`);
    its own sample count (prompts, not sequences); and what its checkpoints keep besides the
    policy (the rollout RNG and prompt order: :meth:`StageBase.state_dict`).
    """

    kind: str

    def setup(self, ctx: StageContext, *, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any]) -> None:
        """Build the objective; raise ``ValueError`` for what this stage cannot train here."""

    def build_data(self, *, consumed_samples: int, num_chunks: int) -> StageData:
        """The training feed after ``consumed_samples`` samples, and the validation feeds."""

    def prepare_model(self, model: List[torch.nn.Module]) -> str:
        """Adapt the model chunks to the loss; returns how the cross entropy is computed."""

    def before_step(self, iteration: int, model: List[torch.nn.Module]) -> None:
        """Per-step work before the step's microbatches are drawn (RL: the rollouts)."""

    def forward_step(self, data_iterator: Iterator[MicrobatchItem], model: torch.nn.Module):
        """megatron-core's ``forward_step_func``: ``(output, loss_func)`` of the next microbatch."""

    def checkpoint_metadata(self) -> Dict[str, Any]:
        """Entries of every checkpoint's ``dlmspec.json`` (e.g. ``"objective"``)."""


def sum_reports(reports: List[Any], device: torch.device) -> Dict[str, torch.Tensor]:
    """The loss reports of a step's microbatches summed by key (float32, flattened), then over the
    data-parallel group (with context parallelism) in one all-reduce when a process group exists.

    ``"lm loss"`` (:data:`LM_LOSS`) is always there (zeros on a rank without the last pipeline
    stage). Every rank of a data-parallel group holds the same pipeline stage and stage code, so
    their reports have the same keys and sizes (summed in sorted key order).

    Returns:
        ``{key: summed tensor}``, ``"lm loss"`` = ``[loss sum, tokens]``.
    """
    parts: Dict[str, torch.Tensor] = {}
    for report in reports:
        if not isinstance(report, dict):
            continue
        for key, value in report.items():
            if not isinstance(value, torch.Tensor):
                continue
            value = value.detach().to(device=device, dtype=torch.float32).reshape(-1)
            parts[key] = value.clone() if key not in parts else parts[key] + value
    if LM_LOSS not in parts:
        parts[LM_LOSS] = torch.zeros(2, dtype=torch.float32, device=device)
    keys = sorted(parts)
    total = torch.cat([parts[k] for k in keys])
    if dist.is_initialized():
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    out, at = {}, 0
    for key in keys:
        n = parts[key].numel()
        out[key] = total[at:at + n]
        at += n
    return out


class StageBase:
    """The optional members of a :class:`Stage`, with pre-training's behaviour (the loop uses
    these for a stage that lacks them: :class:`StageSeam`).

    Args:
        run: The run's settings.
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run

    def start_checks(self) -> None:
        """What this stage checks before megatron-core starts (``train.py --check`` calls it, after
        the run's :func:`~dlmspec.backends.megatron.checks.start_checks`): nothing here. A refusal
        is one message and exit code 2 (:func:`~dlmspec.backends.megatron.checks.refuse`)."""

    def reduce_reports(self, reports: List[Any], device: torch.device) -> Dict[str, torch.Tensor]:
        """A step's loss reports as global sums by key (:func:`sum_reports`: every tensor of the
        reports, ``"lm loss"`` always). Collective over the data-parallel group."""
        return sum_reports(reports, device)

    def interval_metrics(self, sums: Dict[str, torch.Tensor]) -> Dict[str, Optional[float]]:
        """The ``train`` record's entries (TensorBoard and W&B scalars ``train/<key>``) of the
        :meth:`reduce_reports` sums added over the steps since the last record (the loop writes
        ``loss`` from ``"lm loss"`` itself): here the masked-diffusion scalars of
        :func:`~dlmspec.backends.megatron.metrics.dlm_record` when the reports carry
        ``DLM_REPORT``."""
        dlm = sums.get(DLM_REPORT)
        return dlm_record(dlm) if dlm is not None else {}

    def samples_consumed(self, iteration: int) -> int:
        """Samples of the training feed the step at ``iteration`` consumed (the resume position
        of :meth:`Stage.build_data`): one global batch."""
        return int(self.run.schedule.global_batch_size)

    def state_dict(self) -> Dict[str, Any]:
        """This rank's stage state to keep in checkpoints (tensors, numbers, strings, lists and
        dicts of them: read back without running code); ``{}`` keeps nothing."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict` of a resumed checkpoint (called after :meth:`Stage.build_data`
        and :meth:`Stage.prepare_model`, before the first step and before the RNG states are set).
        Not called after a resume into another parallel layout (the state is per rank, as the RNG
        states are): the stage then starts its own state afresh."""

    def sharded_state_dict(self) -> Dict[str, Any]:
        """State kept in the checkpoint's megatron-core distributed checkpoint beside the policy
        (:func:`~dlmspec.backends.megatron.checkpointing.save_checkpoint`, key ``"stage"``), which
        a resume in any parallel layout reads back: megatron-core ``ShardedTensor`` s (a model's
        ``sharded_state_dict(prefix=...)``, keys distinct from the policy's) and plain values
        (numbers, strings: megatron-core's common state, written by rank 0, the same on every
        rank). ``{}`` keeps nothing."""
        return {}

    def load_sharded_state_dict(self, common: Optional[Dict[str, Any]],
                                load: Callable[[Dict[str, Any]], Dict[str, Any]], *, checkpoint: str,
                                iteration: int) -> None:
        """Restore :meth:`sharded_state_dict` on a resume in any layout (every rank; after
        :meth:`Stage.prepare_model` and :meth:`load_state_dict`, before the first step).

        Args:
            common: The plain values :meth:`sharded_state_dict` saved; ``None``: the checkpoint
                holds none (saved by a stage or a dlmspec version that kept none).
            load: Collective: ``load(template)`` reads ``template``'s sharded tensors (the
                entries as :meth:`sharded_state_dict` saved them, built on this run's layout) and
                returns the saved entries with them loaded (megatron-core's ``load``: the common
                values too).
            checkpoint: The checkpoint folder (for messages); ``iteration``: its step.
        """


class StageSeam:
    """The loop's view of a stage: its :class:`StageBase` members, or the defaults for a stage
    without them (``samples_consumed``: ``run``'s global batch).

    Args:
        stage: The stage.
        run: The run's settings.
    """

    def __init__(self, stage: Any, run: RunConfig) -> None:
        self.stage = stage
        self._default = StageBase(run)

    def _member(self, name: str) -> Callable[..., Any]:
        found = getattr(self.stage, name, None)
        return found if callable(found) else getattr(self._default, name)

    def reduce_reports(self, reports: List[Any], device: torch.device) -> Dict[str, torch.Tensor]:
        return self._member("reduce_reports")(reports, device)

    def interval_metrics(self, sums: Dict[str, torch.Tensor]) -> Dict[str, Optional[float]]:
        return self._member("interval_metrics")(sums)

    def samples_consumed(self, iteration: int) -> int:
        return int(self._member("samples_consumed")(iteration))

    def state_dict(self) -> Dict[str, Any]:
        return self._member("state_dict")()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._member("load_state_dict")(state)

    def sharded_state_dict(self) -> Dict[str, Any]:
        return self._member("sharded_state_dict")()

    def load_sharded_state_dict(self, common: Optional[Dict[str, Any]],
                                load: Callable[[Dict[str, Any]], Dict[str, Any]], *, checkpoint: str,
                                iteration: int) -> None:
        self._member("load_sharded_state_dict")(common, load, checkpoint=checkpoint, iteration=iteration)


def stage_feeds(run: RunConfig, ctx: StageContext, train_ds: Any, valid_ds: Any, *, consumed_samples: int,
                num_chunks: int) -> StageData:
    """A stage's datasets as this rank's microbatch feeds: the training one from
    ``consumed_samples`` on (``run.data.num_workers`` loader workers), and a validation feed made
    afresh at every evaluation (the same batches each time; no workers), ``None`` without one."""
    sched = run.schedule
    train_loader = build_dataloader(
        train_ds, consumed_samples=consumed_samples, micro_batch_size=sched.micro_batch_size,
        data_parallel_rank=ctx.data_parallel_rank, data_parallel_size=ctx.data_parallel_size,
        num_workers=run.data.num_workers,
    )
    valid = None
    if valid_ds is not None:
        def valid() -> MicrobatchFeed:
            loader = build_dataloader(
                valid_ds, consumed_samples=0, micro_batch_size=sched.micro_batch_size,
                data_parallel_rank=ctx.data_parallel_rank, data_parallel_size=ctx.data_parallel_size,
                num_workers=0,
            )
            return MicrobatchFeed(loader, num_chunks, VALID_STREAM)
    return StageData(train=MicrobatchFeed(train_loader, num_chunks, TRAIN_STREAM), valid=valid)


class PretrainStage(StageBase):
    """Pre-training: megatron's GPT datasets of packed documents, a masked-diffusion or
    autoregressive objective (:mod:`dlmspec.backends.megatron.objective`), and the loss
    normalisation of ``ObjectiveConfig.loss_normalization`` (default: the per-token loss of the
    global batch, every position with a non-zero weight counting in ``num_tokens``).

    Args:
        run: The run's settings (objective, data, schedule, kernels, seed).
        options: The stage's own options (``[stage.<kind>]``): pre-training has none (``None``).
    """

    def __init__(self, run: RunConfig, options: Any = None) -> None:
        super().__init__(run)
        self.options = options
        self.kind = run.objective.kind
        self.objective = None
        self._ctx: Optional[StageContext] = None
        self._forward_step: Optional[ObjectiveForwardStep] = None

    def start_checks(self) -> None:
        """What this stage checks before megatron-core starts (``train.py --check``, and first in
        :meth:`setup`): nothing more for pre-training (:func:`~dlmspec.backends.megatron.checks.start_checks`
        checks the run)."""

    def objective_config(self) -> ObjectiveConfig:
        """The objective settings this stage trains with: the run's."""
        return self.run.objective

    def check_layers(self, ctx: StageContext, objective: Any, layer_spec: ModuleSpec) -> None:
        """Refuse attention masks the layers cannot take
        (:func:`~dlmspec.backends.megatron.checks.check_masks_supported`)."""
        check_masks_supported(layer_spec, self.run.objective, self.run.data)

    def kind_of(self, objective: Any) -> str:
        """The name of the start record and console line: the objective's kind."""
        return objective.kind

    def make_forward_step(self, objective: Any, ctx: StageContext) -> "ObjectiveForwardStep":
        """The forward step of this stage's batches: :class:`ObjectiveForwardStep` with document
        masks and the micro-batch cut's length multiple."""
        run = self.run
        return ObjectiveForwardStep(
            objective, seed=run.seed, data_parallel_rank=ctx.data_parallel_rank, eod_id=run.data.eod_id,
            reset_attention_mask=run.data.reset_attention_mask, device=ctx.device,
            context_parallel_size=ctx.context_parallel_size,
            loss_normalization=run.objective.loss_normalization,
            # the CP split needs 2 x CP whatever train.py says (megatron-core get_batch_on_this_cp_rank)
            length_multiple=math.lcm(int(run.objective.variable_length_multiple),
                                     2 * ctx.context_parallel_size if ctx.context_parallel_size > 1 else 1),
        )

    def setup(self, ctx: StageContext, *, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any]) -> None:
        """Check, build the objective of :meth:`objective_config` and check it against the layers
        and the model's sizes, then make the forward step: :meth:`start_checks`,
        :meth:`check_layers` and :meth:`make_forward_step` are what a derived stage changes.

        Raises:
            ValueError: an unknown objective, attention the objective cannot train with, a mask
                id outside the vocabulary, sequences longer than the model's, or attention masks
                on the Transformer Engine path (:mod:`dlmspec.backends.megatron.checks`).
        """
        self.start_checks()
        o = self.objective_config()
        # the CP split needs 2 x CP whatever train.py says (megatron-core get_batch_on_this_cp_rank)
        length_multiple = math.lcm(int(o.variable_length_multiple),
                                   2 * ctx.context_parallel_size if ctx.context_parallel_size > 1 else 1)
        objective = build_objective(o, length_multiple=length_multiple)
        check_objective(objective, layer_spec_attention(layer_spec), int(model_kwargs["vocab_size"]))
        check_sequence_length(self.run.data, model_kwargs)
        self.check_layers(ctx, objective, layer_spec)
        self.objective, self.kind, self._ctx = objective, self.kind_of(objective), ctx
        self._forward_step = self.make_forward_step(objective, ctx)

    def build_data(self, *, consumed_samples: int, num_chunks: int) -> StageData:
        """megatron's GPT datasets (:func:`~dlmspec.backends.megatron.data.build_datasets`) in Megatron-LM's
        pre-training order, this rank's slice of each global batch; ``eval_iters`` global batches
        of validation data when the run evaluates."""
        run, sched, ctx = self.run, self.run.schedule, self._ctx
        eval_batches = sched.eval_iters * sched.global_batch_size if sched.eval_interval else 0
        train_ds, valid_ds = build_datasets(
            run.data,
            seed=run.seed,
            train_samples=sched.train_iters * sched.global_batch_size,
            valid_samples=eval_batches,
            add_extra_token_to_sequence=dataset_extra_token(self.objective),
        )
        return stage_feeds(run, ctx, train_ds, valid_ds, consumed_samples=consumed_samples, num_chunks=num_chunks)

    def prepare_model(self, model: List[torch.nn.Module]) -> str:
        """Let the objective adapt the model (its ``prepare_model(model)``, where it has one), then
        apply ``kernels.cross_entropy``: ``"fused_linear"`` moves the last stage's output layer
        into the loss (:meth:`ObjectiveForwardStep.use_fused_linear_cross_entropy`).

        Returns:
            The cross entropy used, for the start record (``"megatron (fused)"``,
            ``"fused_linear (liger)"``, ...).

        Raises:
            ValueError: an unknown ``kernels.cross_entropy``.
        """
        prepare = getattr(self.objective, "prepare_model", None)
        if prepare is not None:  # an objective that adapts the model (block diffusion's repeated RoPE)
            prepare(model)
        cross_entropy = self.run.kernels.cross_entropy
        if cross_entropy == "fused_linear":
            fused_impl = self._forward_step.use_fused_linear_cross_entropy(model, self.run.kernels.fused_linear_impl)
            if fused_impl is not None:
                cross_entropy = f"fused_linear ({fused_impl})"
        elif cross_entropy != "megatron":
            raise ValueError(f"kernels.cross_entropy must be 'megatron' or 'fused_linear', got {cross_entropy!r}")
        else:
            cross_entropy = "megatron (fused)" if get_model_config(model[0]).cross_entropy_loss_fusion else "megatron"
        return cross_entropy

    def before_step(self, iteration: int, model: List[torch.nn.Module]) -> None:
        """Tell the objective the step (its ``set_iteration``, where it has one: block diffusion's
        block-size schedule); pre-training's microbatches come from its datasets."""
        set_iteration = getattr(self.objective, "set_iteration", None)
        if set_iteration is not None:
            set_iteration(iteration)

    def forward_step(self, data_iterator: Iterator[MicrobatchItem], model: torch.nn.Module):
        """:class:`ObjectiveForwardStep` on the next microbatch."""
        return self._forward_step(data_iterator, model)

    def checkpoint_metadata(self) -> Dict[str, Any]:
        """``{"objective": <the run's ObjectiveConfig as a dict>}``."""
        return {"objective": dataclasses.asdict(self.run.objective)}


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
        loss_normalization: ``train.loss_normalization``
            (:func:`~dlmspec.backends.megatron.objective.apply_loss_normalization`, applied
            before the CP slice).
        length_multiple: The micro-batch cut's length multiple (``variable_length =
            "micro_batch"``: the cut is drawn from
            :func:`~dlmspec.backends.megatron.rng.variable_length_generator`, training stream
            only: evaluation never cuts).
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
        loss_normalization: str = "global_token",
        length_multiple: int = 1,
    ) -> None:
        self.objective = objective
        self.loss_normalization = loss_normalization
        self.length_multiple = length_multiple
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
        cut = None
        if getattr(self.objective, "draws_cut", False) and item.stream == TRAIN_STREAM:
            cut = variable_length_generator(self.seed, item.iteration, item.index, stream=item.stream)
        # the objective cuts / unshifts tokens and position ids alike (source_ids: the clean ids it kept)
        ob = self.objective.prepare({"tokens": tokens, "position_ids": batch["position_ids"],
                                     "labels": batch.get("labels"), "loss_mask": batch.get("loss_mask")},
                                    ObjectiveRng(generator, cut))
        tokens, position_ids = ob.source_ids, ob.position_ids
        ob = apply_loss_normalization(ob, self.loss_normalization, context_parallel_size=self.context_parallel_size)
        doc_mask = document_attention_mask(tokens, self.eod_id) if self.reset_attention_mask else None
        return self.slice_for_context_parallel(ob, position_ids, combine_attention_masks(ob.attention_mask, doc_mask))

    def slice_for_context_parallel(self, ob: ObjectiveBatch, position_ids: torch.Tensor,
                                   attention_mask: Optional[torch.Tensor]):
        """``(ob, position_ids, attention_mask)`` of this context-parallel rank (unchanged at CP
        size 1): megatron-core's ``get_batch_on_this_cp_rank`` slice, after the objective drew its
        masks on the full sequence.

        Raises:
            ValueError: an attention mask under context parallelism.
        """
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
                # "sequence" counts rows and "micro_batch_masked" the masked positions (both set before the
                # slice, the weights scaled by the CP size), the others this rank's positions
                num_tokens=(ob.num_tokens if ob.normalization in ("sequence", "micro_batch_masked")
                            else sliced["token_mask"].sum().to(torch.int)),
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
    return _with_dlm_sums(reduce_loss(output_tensor, ob), ob, output_tensor)


def _fused_loss_func(ob: ObjectiveBatch, weight: torch.Tensor, impl: str, hidden: torch.Tensor):
    loss_sum = linear_cross_entropy(hidden, weight, ob.labels, ob.loss_weights, impl=impl)
    return _with_dlm_sums(loss_triple(loss_sum, ob), ob, None)  # fused: no per-token loss, mask ratio only


def _with_dlm_sums(triple, ob: ObjectiveBatch, per_token_loss: Optional[torch.Tensor]):
    """The loss triple with (masked diffusion) the report's ``DLM_REPORT`` sums (metrics.dlm_loss_sums)."""
    if ob.mask_ratio is not None:
        # shifted labels: the weights' non-zero positions (output positions) stand for the masked ones
        masked = None if ob.shifted else ob.masked
        triple[2][DLM_REPORT] = dlm_loss_sums(per_token_loss, ob.loss_weights, ob.mask_ratio, masked, ob.token_mask)
    return triple

