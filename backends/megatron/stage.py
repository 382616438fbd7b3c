"""The seam between the training loop and a stage: what it trains on, its objective, its step work.

:func:`dlmspec.backends.megatron.training.train` runs what every stage shares (process groups, model,
optimizer and learning-rate schedule, checkpoints, logging, the step, evaluation and save
cadence) and asks a :class:`Stage` for the rest: pre-training (:class:`PretrainStage`) and
supervised fine-tuning (:class:`~dlmspec.backends.megatron.sft.SftStage`); :class:`Stage` says
what RL will supply.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Tuple, runtime_checkable

import torch

from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.utils import get_batch_on_this_cp_rank, get_model_config, unwrap_model

from .checks import check_masks_supported, check_objective, check_sequence_length
from .config import RunConfig
from .data import (
    batch_to_device,
    build_dataloader,
    build_datasets,
    combine_attention_masks,
    document_attention_mask,
)
from .layers import layer_spec_attention
from .metrics import DLM_REPORT, dlm_loss_sums
from .microbatches import MicrobatchFeed, MicrobatchItem
from .objective import (ObjectiveBatch, apply_loss_normalization, build_objective, dataset_extra_token, loss_triple,
                        reduce_loss, ObjectiveRng)
from .output_loss import defer_output_projection, linear_cross_entropy, resolve_fused_linear_impl
from .rng import TRAIN_STREAM, VALID_STREAM, masking_generator, variable_length_generator


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
    """

    run: RunConfig
    device: torch.device
    data_parallel_rank: int
    data_parallel_size: int
    context_parallel_size: int = 1


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
       build the objective, refuse what this stage cannot train with these layers.
    2. :meth:`build_data` once the weights (and a resumed checkpoint) are loaded.
    3. :meth:`prepare_model`: change the model chunks for the loss, if the stage computes it
       differently (pre-training: the fused output layer and cross entropy).
    4. Every step :meth:`before_step`, then megatron's schedule calls :meth:`forward_step` once
       per microbatch (and model chunk); evaluation calls it on the validation feed, forward only.
    5. :meth:`checkpoint_metadata` goes into every checkpoint's ``dlmspec.json``.

    :attr:`kind` names the objective in the start record and the console line.

    The loss follows megatron-core's ``forward_step_func`` contract: ``forward_step`` returns
    ``(output, loss_func)`` and ``loss_func(output)`` returns ``(loss_sum, num_tokens,
    {"lm loss": tensor([loss_sum, num_tokens])})``. With
    ``TransformerConfig.calculate_per_token_loss=True`` megatron divides the gradient by the
    ``num_tokens`` of the whole step (every microbatch on every data-parallel rank), so
    ``num_tokens`` *is* the loss normalisation; the loop logs ``sum / num_tokens`` of
    ``"lm loss"``. Ranks that process the same data (tensor-, pipeline- and context-parallel
    peers) must build identical inputs: random draws are seeded from the item's stream,
    iteration and index (:func:`~dlmspec.backends.megatron.rng.masking_generator`), never from a
    stateful generator.

    Supervised fine-tuning (:class:`~dlmspec.backends.megatron.sft.SftStage`) supplies batches of
    conversations with a response mask (labels and loss weights on response tokens only, prompts
    never carry loss), padded or packed with segment masks, and the loss normalisation of
    ``train.loss_normalization`` over the response tokens (``"sequence"``: weights ``1 /
    len(response)`` and ``num_tokens`` = sequences).

    What RL will supply: rollouts per step: :meth:`before_step` generates them with the current
    policy (model chunks in eval mode, no gradients; rewards, advantages, reference
    log-probabilities) and hands them to its training feed, so the step's microbatches are those
    rollouts; a policy-gradient ``loss_func`` (clipped ratio, KL to the reference) with its own
    normalisation; and what its checkpoints must keep besides the policy.
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


class PretrainStage:
    """Pre-training: megatron's GPT datasets of packed documents, a masked-diffusion or
    autoregressive objective (:mod:`dlmspec.backends.megatron.objective`), and the loss
    normalisation of ``ObjectiveConfig.loss_normalization`` (default: the per-token loss of the
    global batch, every position with a non-zero weight counting in ``num_tokens``).

    Args:
        run: The run's settings (objective, data, schedule, kernels, seed).
    """

    def __init__(self, run: RunConfig) -> None:
        self.run = run
        self.kind = run.objective.kind
        self.objective = None
        self._ctx: Optional[StageContext] = None
        self._forward_step: Optional[ObjectiveForwardStep] = None

    def setup(self, ctx: StageContext, *, layer_spec: ModuleSpec, model_kwargs: Dict[str, Any]) -> None:
        """Build the objective and check it against the layers and the model's sizes.

        Raises:
            ValueError: an unknown objective, attention the objective cannot train with, a mask
                id outside the vocabulary, sequences longer than the model's, or attention masks
                on the Transformer Engine path (:mod:`dlmspec.backends.megatron.checks`).
        """
        run = self.run
        # the CP split needs 2 x CP whatever train.py says (megatron-core get_batch_on_this_cp_rank)
        length_multiple = math.lcm(int(run.objective.variable_length_multiple),
                                   2 * ctx.context_parallel_size if ctx.context_parallel_size > 1 else 1)
        objective = build_objective(run.objective, length_multiple=length_multiple)
        check_objective(objective, layer_spec_attention(layer_spec), int(model_kwargs["vocab_size"]))
        check_sequence_length(run.data, model_kwargs)
        check_masks_supported(layer_spec, run.objective, run.data)
        self.objective, self.kind, self._ctx = objective, objective.kind, ctx
        self._forward_step = ObjectiveForwardStep(
            objective, seed=run.seed, data_parallel_rank=ctx.data_parallel_rank, eod_id=run.data.eod_id,
            reset_attention_mask=run.data.reset_attention_mask, device=ctx.device,
            context_parallel_size=ctx.context_parallel_size,
            loss_normalization=run.objective.loss_normalization, length_multiple=length_multiple,
        )

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
        """Apply ``kernels.cross_entropy``: ``"fused_linear"`` moves the last stage's output layer
        into the loss (:meth:`ObjectiveForwardStep.use_fused_linear_cross_entropy`).

        Returns:
            The cross entropy used, for the start record (``"megatron (fused)"``,
            ``"fused_linear (liger)"``, ...).

        Raises:
            ValueError: an unknown ``kernels.cross_entropy``.
        """
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
        """Nothing: pre-training's microbatches come from its datasets."""

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

