"""The runtime half of an objective: one signature, ``prepare(batch, rng) -> ObjectiveBatch``.

An objective sits around megatron-core's ``GPTModel``, which returns the per-token cross entropy
``[b, s]`` when given labels: :meth:`RuntimeObjective.prepare` builds the model input, the labels,
a per-token weight, the position ids and the attention mask before the forward pass;
:func:`reduce_loss` turns the cross entropy into megatron's ``(loss_sum, num_tokens, {"lm loss":
tensor([loss_sum, num_tokens])})`` after it. Each kind registers a factory here
(:func:`register_runtime`) and its compiler half in :mod:`dlmspec.objectives`; the stages build
the run's objective with :func:`build_objective` and never compare ``kind`` with a string. Plain
torch, runs on CPU. The losses and their sources: docs/runtime.md, "Objectives".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

#: ``train.loss_normalization`` (docs/recipes.md, "Loss normalisation"): ``"global_token"`` is
#: megatron-core's ``calculate_per_token_loss=True``, the others ``False``.
LOSS_NORMALIZATIONS = ("global_token", "micro_batch", "sequence", "micro_batch_masked")
#: The normalisations megatron divides per micro-batch by its own ``num_tokens``: :func:`loss_triple`
#: reports their micro-batch means.
PER_MICRO_BATCH = ("micro_batch", "micro_batch_masked")


@dataclass(frozen=True)
class ObjectiveRng:
    """The random streams an objective may draw from for one micro-batch.

    Attributes:
        masking: generator on the batch's device
            (:func:`~dlmspec.backends.megatron.rng.masking_generator`: seed, iteration, DP rank,
            micro-batch index, stream).
        cut: CPU generator of the micro-batch cut, the same on every rank
            (:func:`~dlmspec.backends.megatron.rng.variable_length_generator`), or ``None`` (no cut:
            evaluation, or an objective whose ``draws_cut`` is false).
    """

    masking: Optional[torch.Generator] = None
    cut: Optional[torch.Generator] = None


@dataclass
class ObjectiveBatch:
    """What an objective hands to the model and to :func:`reduce_loss`.

    Attributes:
        input_ids: ``[b, s]`` int64, the model input (noised tokens for MDM).
        labels: ``[b, s]`` int64, target token ids; every entry is a valid
            vocabulary id (megatron's cross entropy has no ignore index), entries
            with zero weight are ignored through ``loss_weights``.
        loss_weights: ``[b, s]`` float32, weight of each position's cross
            entropy in the loss sum (MDM: ``1[masked] / t`` or ``1[masked] / r``;
            AR: the loss mask).
        num_tokens: ``[]`` int32 (``torch.int``, megatron's dtype for it), the
            normaliser: number of positions that count (MDM: non-truncated,
            non-padding positions, ``b * s`` without truncation; AR: sum of the
            loss mask).
        token_mask: ``[b, s]`` bool, the positions counted in ``num_tokens``.
        attention_mask: ``[b, 1, 1, s]`` bool key-padding mask (``True`` = key
            not attended) when some sequence was truncated, else ``None``.
        mask_ratio: ``[b]`` float32, the noise level ``t`` per sequence (MDM),
            ``None`` for AR.
        masked: ``[b, s]`` bool, which positions were replaced by the mask token
            (MDM), ``None`` for AR.
        lengths: ``[b]`` int64, effective length of each sequence (MDM), ``None``
            for AR.
        normalization: the :data:`LOSS_NORMALIZATIONS` entry :func:`apply_loss_normalization`
            applied (``"global_token"``: none); :func:`loss_triple` reports in its units.
        shifted: ``True`` when ``labels`` and ``loss_weights`` are one position left of
            ``masked`` (MDM ``shift``: output position ``i`` predicts input position ``i + 1``).
        position_ids: ``[b, s]`` int64, the position ids of ``input_ids`` (the batch's, cut and
            shifted as the input was), ``None`` when the batch had none.
        source_ids: ``[b, s]`` int64, the clean ids in input positions (what a document mask
            is computed from), ``None`` when the objective did not set them.
    """

    input_ids: Tensor
    labels: Tensor
    loss_weights: Tensor
    num_tokens: Tensor
    token_mask: Tensor
    attention_mask: Optional[Tensor] = None
    mask_ratio: Optional[Tensor] = None
    masked: Optional[Tensor] = None
    lengths: Optional[Tensor] = None
    normalization: str = "global_token"
    shifted: bool = False
    position_ids: Optional[Tensor] = None
    source_ids: Optional[Tensor] = None


def check_tokens(tokens: Tensor) -> None:
    """Raise ``ValueError`` unless ``tokens`` is a ``[b, s >= 1]`` int32/int64 tensor."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.shape[1] < 1:
        raise ValueError("tokens must have at least one position")


def valid_from_loss_mask(tokens: Tensor, loss_mask: Optional[Tensor]) -> Tensor:
    """``[b, s]`` bool: ``loss_mask > 0`` (all true without one).

    Raises:
        ValueError: ``loss_mask`` of another shape than ``tokens``.
    """
    if loss_mask is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    if loss_mask.shape != tokens.shape:
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} != tokens shape {tuple(tokens.shape)}"
        )
    return loss_mask > 0


class RuntimeObjective:
    """Base of the runtime objectives. A subclass sets ``kind`` and ``attention`` (the attention
    the layers must run: ``"bidirectional"`` or ``"causal"``) and implements :meth:`prepare_batch`.

    Attributes:
        kind: the ``objective.kind`` it answers.
        attention: what its layers' attention must be.
        draws_cut: whether :meth:`prepare` reads ``rng.cut`` (the stage builds that generator
            for training micro-batches only when it is true).
        diffusion: whether it writes ``mask_token_id`` (the runtime checks that id against the
            vocabulary).
    """

    kind: str = ""
    attention: str = "causal"
    draws_cut: bool = False
    diffusion: bool = False

    def prepare(self, batch: Mapping[str, Optional[Tensor]],
                rng: Union[ObjectiveRng, torch.Generator, None] = None) -> ObjectiveBatch:
        """The one entry point: ``prepare(batch, rng) -> ObjectiveBatch``.

        Args:
            batch: a mapping with ``"tokens"`` (``[b, s]`` int ids, required) and any of
                ``"labels"``, ``"loss_mask"`` (``[b, s]``) and ``"position_ids"`` (``[b, s]``).
            rng: :class:`ObjectiveRng` (a bare ``torch.Generator`` is its ``masking``; ``None``:
                no generator, the objective draws from torch's default one).

        Returns:
            The :class:`ObjectiveBatch` (see :meth:`prepare_batch` of each objective).

        Raises:
            TypeError: a batch that is not a mapping with ``"tokens"`` (a bare tensor included:
                pass ``{"tokens": tensor}``).
            ValueError: as :meth:`prepare_batch`.
        """
        if isinstance(rng, torch.Generator):
            rng = ObjectiveRng(rng)
        if not isinstance(batch, Mapping) or "tokens" not in batch:
            raise TypeError(f"prepare(batch, rng) needs a mapping with 'tokens' ({{'tokens': tensor}}), "
                            f"got {type(batch).__name__}")
        return self.prepare_batch(batch, rng if rng is not None else ObjectiveRng())

    def prepare_batch(self, batch: Mapping[str, Optional[Tensor]], rng: ObjectiveRng,
                      **options: Any) -> ObjectiveBatch:
        """The objective's work (see :meth:`prepare`)."""
        raise NotImplementedError

    def dataset_extra_token(self) -> bool:
        """megatron-core's ``add_extra_token_to_sequence`` for this objective (see
        :func:`dlmspec.backends.megatron.objective.dataset_extra_token`)."""
        return False


#: ``kind`` -> factory ``(config, **build options) -> RuntimeObjective``; ``config`` is an
#: :class:`~dlmspec.backends.megatron.config.ObjectiveConfig` (or anything with its attributes).
_RUNTIME: Dict[str, Callable[..., RuntimeObjective]] = {}


def register_runtime(kind: str, factory: Callable[..., RuntimeObjective]) -> None:
    """Register the runtime factory of ``kind`` (a second registration replaces the first)."""
    if not kind:
        raise ValueError("an objective needs a kind")
    _RUNTIME[kind] = factory


def unregister_runtime(kind: str) -> None:
    """Remove ``kind`` (a test's toy)."""
    _RUNTIME.pop(kind, None)


def runtime_kinds() -> Tuple[str, ...]:
    """The registered kinds."""
    return tuple(_RUNTIME)


def build_from_config(config: Any, **options: Any) -> RuntimeObjective:
    """The objective of ``config.kind`` built from ``config`` (an ``ObjectiveConfig``).

    Args:
        config: has ``kind`` and the objective's own settings.
        **options: layout values the factory may take (``length_multiple``).

    Raises:
        ValueError: an unregistered kind (naming the registered ones) or a bad setting.
    """
    factory = _RUNTIME.get(config.kind)
    if factory is None:
        raise ValueError(f"objective kind must be one of {sorted(_RUNTIME)}, got {config.kind!r}")
    return factory(config, **options)


def reduce_loss(
    per_token_loss: Tensor, batch: ObjectiveBatch
) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
    """Reduce per-token cross entropy to megatron's ``forward_step`` triple.

    Args:
        per_token_loss: ``[b, s]`` cross entropy in nats (as returned by
            ``GPTModel.forward(..., labels=batch.labels)``).
        batch: The :class:`ObjectiveBatch` the forward pass consumed.

    Returns:
        ``(loss_sum, num_tokens, {"lm loss": report})`` where ``loss_sum`` is the
        float32 scalar ``sum(per_token_loss * loss_weights)`` (carries the
        gradient), ``num_tokens`` is ``batch.num_tokens`` (int32 scalar) and
        ``report`` is the detached float32 ``[2]`` tensor ``[loss_sum,
        num_tokens]``; summing reports over microbatches and data-parallel ranks
        and dividing gives the batch loss (LLaDA's normalisation for MDM).

    Raises:
        ValueError: If the shapes differ.
    """
    if per_token_loss.shape != batch.loss_weights.shape:
        raise ValueError(
            f"per-token loss shape {tuple(per_token_loss.shape)} != loss weights shape "
            f"{tuple(batch.loss_weights.shape)}"
        )
    return loss_triple((per_token_loss.float() * batch.loss_weights).sum(), batch)


def loss_triple(loss_sum: Tensor, batch: ObjectiveBatch) -> Tuple[Tensor, Tensor, Dict[str, Tensor]]:
    """megatron's ``forward_step`` triple from an already weighted loss sum.

    Args:
        loss_sum: fp32 scalar ``sum(CE * loss_weights)`` (carries the gradient).
        batch: The :class:`ObjectiveBatch` it was computed on.

    Returns:
        ``(loss_sum, batch.num_tokens, {"lm loss": [loss_sum, num_tokens]})`` as in
        :func:`reduce_loss`.
    """
    num_tokens = batch.num_tokens
    report_sum, report_count = loss_sum.detach().float(), num_tokens.detach().to(torch.float32)
    if batch.normalization in PER_MICRO_BATCH:
        # megatron divides this micro-batch by its own tokens: report its mean, counted once
        report_sum, report_count = report_sum / report_count.clamp(min=1.0), torch.ones_like(report_count)
    return loss_sum, num_tokens, {"lm loss": torch.stack([report_sum, report_count])}


def apply_loss_normalization(batch: ObjectiveBatch, normalization: str, *,
                             context_parallel_size: int = 1) -> ObjectiveBatch:
    """``batch`` made ready for ``train.loss_normalization`` (docs/recipes.md, "Loss normalisation").

    megatron-core's schedule divides the loss function's ``loss_sum`` by the step's summed
    ``num_tokens`` with ``calculate_per_token_loss=True`` and by the micro-batch's own
    ``num_tokens`` and the number of micro-batches without it (``schedules.py``
    ``forward_step_calc_loss``), the data-parallel all-reduce averaging the ranks then.

    * ``"global_token"``: unchanged (``calculate_per_token_loss=True``): every loss-carrying token of
      the global batch weighs the same.
    * ``"micro_batch"``: unchanged weights and ``num_tokens`` (``False``): each micro-batch's mean
      over its own tokens weighs the same (MegaDLMs ``pretrain_difflm.py:265-268``).
    * ``"micro_batch_masked"``: ``num_tokens`` = the micro-batch's masked positions (MDM:
      ``masked.sum()``, at least 1; AR: its loss-mask positions, as ``"micro_batch"``), weights
      times ``context_parallel_size`` (the count is the whole micro-batch's, taken before the
      context-parallel slice, and megatron averages the CP ranks' losses): megatron's division
      gives ``sum_n w_n CE_n / #masked`` per micro-batch, averaged over micro-batches and
      data-parallel ranks. This is the Dream team's SFT trainers' loss
      (DreamLM/Dream-Coder@87409da ``instruct/src/trainer/fsdp_sft_trainer.py:830-831``:
      ``torch.sum(loss) / valid_token_this_rank`` with ``valid_token_this_rank`` the masked
      positions of the rank's micro-batch, then ``/ n_micro_batches`` at 850-853, FSDP averaging
      the ranks). A micro-batch without a masked position counts 1 (its loss sum is 0).
    * ``"sequence"``: each row's weights divided by its loss-carrying positions ``n_j`` (rows of
      none keep weight 0) and ``num_tokens`` = the rows with ``n_j > 0``: megatron's division
      then gives the mean of the rows' means (LLaDA's SFT). Under context parallelism (call it
      before the sequence is sliced: ``n_j`` counts the whole row) megatron averages the CP
      ranks' losses, so the weights are multiplied by ``context_parallel_size`` and the average
      of the ranks' shares is the row mean. An SFT stage reuses it with its response mask as
      ``token_mask``.

    Returns:
        A new :class:`ObjectiveBatch` whose ``normalization`` is ``normalization``.

    Raises:
        ValueError: ``normalization`` not in :data:`LOSS_NORMALIZATIONS`.
    """
    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(f"loss normalization must be one of {LOSS_NORMALIZATIONS}, got {normalization!r}")
    if normalization == "micro_batch_masked":
        counted = batch.masked if batch.masked is not None else batch.token_mask
        masked = counted.sum().clamp(min=1).to(torch.int)
        return dataclasses.replace(batch, loss_weights=batch.loss_weights * float(context_parallel_size),
                                   num_tokens=masked, normalization=normalization)
    if normalization != "sequence":
        return dataclasses.replace(batch, normalization=normalization)
    per_row = batch.token_mask.sum(dim=1)  # [b]
    scale = float(context_parallel_size) / per_row.clamp(min=1).to(torch.float32)
    return dataclasses.replace(
        batch,
        loss_weights=batch.loss_weights * scale.unsqueeze(1),
        num_tokens=(per_row > 0).sum().to(torch.int),
        normalization=normalization,
    )


