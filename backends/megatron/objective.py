"""Training objectives: masked diffusion (MDM) and autoregressive (AR).

Both sit around megatron-core's ``GPTModel``, which returns the per-token cross entropy
``[b, s]`` when given labels: :meth:`prepare` builds the model input, the labels and a per-token
weight before the forward pass; :func:`reduce_loss` turns the cross entropy into megatron's
``(loss_sum, num_tokens, {"lm loss": tensor([loss_sum, num_tokens])})`` after it. Plain torch,
runs on CPU. The losses (LLaDA's MDM estimator and weightings, variable length, AR's loss mask)
and their sources: docs/runtime.md, "Objectives".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

LOSS_WEIGHTINGS = ("llada", "realised")


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


def _check_tokens(tokens: Tensor) -> None:
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, seq], got shape {tuple(tokens.shape)}")
    if tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.shape[1] < 1:
        raise ValueError("tokens must have at least one position")


def _valid_from_loss_mask(tokens: Tensor, loss_mask: Optional[Tensor]) -> Tensor:
    if loss_mask is None:
        return torch.ones_like(tokens, dtype=torch.bool)
    if loss_mask.shape != tokens.shape:
        raise ValueError(
            f"loss_mask shape {tuple(loss_mask.shape)} != tokens shape {tuple(tokens.shape)}"
        )
    return loss_mask > 0


class MaskedDiffusionObjective:
    """LLaDA / MDM masked-diffusion objective (see the module docstring).

    Args:
        mask_token_id: Token id written at masked positions; must be a valid
            input id of the model's embedding (``0 <= id < padded vocab``).
        eps: Lower bound of the noise level, ``t = eps + (1 - eps) * u``;
            ``0 <= eps < 1`` (LLaDA uses 1e-3).  Bounds the weight ``1/t`` by
            ``1/eps``.
        loss_weighting: ``"llada"`` (weight ``1/t``, LLaDA Eq. 3) or
            ``"realised"`` (weight ``1/r`` with ``r`` the realised mask ratio of
            the sequence).
        variable_length_prob: Probability that a sequence is truncated to a
            length drawn uniformly from ``{1, ..., s}`` (LLaDA: 0.01).

    Raises:
        ValueError: On an out-of-range argument.
    """

    attention = "bidirectional"
    kind = "mdm"

    def __init__(
        self,
        mask_token_id: int,
        *,
        eps: float = 1e-3,
        loss_weighting: str = "llada",
        variable_length_prob: float = 0.0,
    ) -> None:
        if int(mask_token_id) < 0:
            raise ValueError(f"mask_token_id must be >= 0, got {mask_token_id}")
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        if loss_weighting not in LOSS_WEIGHTINGS:
            raise ValueError(f"loss_weighting must be one of {LOSS_WEIGHTINGS}, got {loss_weighting!r}")
        if not 0.0 <= variable_length_prob <= 1.0:
            raise ValueError(f"variable_length_prob must be in [0, 1], got {variable_length_prob}")
        self.mask_token_id = int(mask_token_id)
        self.eps = float(eps)
        self.loss_weighting = loss_weighting
        self.variable_length_prob = float(variable_length_prob)

    def prepare(
        self,
        tokens: Tensor,
        *,
        generator: torch.Generator,
        loss_mask: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
    ) -> ObjectiveBatch:
        """Noise a batch of clean sequences.

        The draws are made in a fixed order with ``generator`` (``u`` [b], then
        the per-token uniforms [b, s], then - only if ``variable_length_prob >
        0`` - the truncation coin [b] and lengths [b]), so the same generator
        state always yields the same batch.

        Args:
            tokens: ``[b, s]`` integer clean token ids ``x0``.
            generator: Generator on ``tokens.device`` (see
                :func:`dlmspec.backends.megatron.rng.masking_generator`).
            loss_mask: Optional ``[b, s]``; positions with ``loss_mask == 0``
                (padding) are never masked, get weight 0 and are not counted.
            labels: Ignored (MDM predicts the input positions themselves; the
                shifted labels of megatron's ``GPTDataset`` are for AR).

        Returns:
            An :class:`ObjectiveBatch` with ``labels = tokens``.

        Raises:
            ValueError: If ``tokens`` is not ``[b, s]`` integer or ``loss_mask``
                has another shape.
        """
        del labels
        _check_tokens(tokens)
        b, s = tokens.shape
        device = tokens.device
        valid = _valid_from_loss_mask(tokens, loss_mask)

        u = torch.rand(b, generator=generator, device=device, dtype=torch.float32)
        t = self.eps + (1.0 - self.eps) * u
        draws = torch.rand(b, s, generator=generator, device=device, dtype=torch.float32)

        attention_mask = None
        lengths = torch.full((b,), s, dtype=torch.int64, device=device)
        if self.variable_length_prob > 0.0:
            coin = torch.rand(b, generator=generator, device=device, dtype=torch.float32)
            random_lengths = torch.randint(
                1, s + 1, (b,), generator=generator, device=device, dtype=torch.int64
            )
            truncate = coin < self.variable_length_prob
            lengths = torch.where(truncate, random_lengths, lengths)
            positions = torch.arange(s, device=device)
            beyond = positions.unsqueeze(0) >= lengths.unsqueeze(1)  # [b, s]
            valid = valid & ~beyond
            if bool(truncate.any()):
                attention_mask = beyond.view(b, 1, 1, s)

        masked = (draws < t.unsqueeze(1)) & valid
        input_ids = torch.where(masked, torch.full_like(tokens, self.mask_token_id), tokens)

        masked_f = masked.to(torch.float32)
        if self.loss_weighting == "llada":
            loss_weights = masked_f / t.unsqueeze(1)
        else:
            n_masked = masked_f.sum(dim=1)
            n_valid = valid.to(torch.float32).sum(dim=1)
            ratio = n_masked / n_valid.clamp(min=1.0)
            # A sequence with nothing masked has all-zero weights (0 / clamp).
            loss_weights = masked_f / ratio.clamp(min=1e-12).unsqueeze(1)

        return ObjectiveBatch(
            input_ids=input_ids,
            labels=tokens.to(torch.int64),
            loss_weights=loss_weights,
            num_tokens=valid.sum().to(torch.int),
            token_mask=valid,
            attention_mask=attention_mask,
            mask_ratio=t,
            masked=masked,
            lengths=lengths,
        )


class AutoregressiveObjective:
    """Next-token prediction with causal attention (see the module docstring).

    The objective draws nothing; it accepts a ``generator`` only so that both
    objectives share one call signature.
    """

    attention = "causal"
    kind = "ar"

    def prepare(
        self,
        tokens: Tensor,
        *,
        generator: Optional[torch.Generator] = None,
        loss_mask: Optional[Tensor] = None,
        labels: Optional[Tensor] = None,
    ) -> ObjectiveBatch:
        """Build inputs, shifted labels and weights for next-token prediction.

        Args:
            tokens: ``[b, s]`` integer input ids.
            generator: Unused.
            loss_mask: Optional ``[b, s]`` weights (megatron ``GPTDataset``'s
                ``loss_mask``: 0 at padding and, with ``eod_mask_loss``, at EOD
                inputs whose label is the next document's first token).
            labels: ``[b, s]`` next-token ids.  When ``None`` they are derived
                as ``labels[:, i] = tokens[:, i + 1]`` and the last position
                (which has no next token) gets weight 0.

        Returns:
            An :class:`ObjectiveBatch` with ``input_ids = tokens``.

        Raises:
            ValueError: On shape mismatches.
        """
        del generator
        _check_tokens(tokens)
        weights = _valid_from_loss_mask(tokens, None).to(torch.float32)
        if loss_mask is not None:
            if loss_mask.shape != tokens.shape:
                raise ValueError(
                    f"loss_mask shape {tuple(loss_mask.shape)} != tokens shape {tuple(tokens.shape)}"
                )
            weights = loss_mask.to(torch.float32)
        if labels is None:
            labels = torch.roll(tokens, shifts=-1, dims=1)
            weights = weights.clone()
            weights[:, -1] = 0.0
        elif labels.shape != tokens.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} != tokens shape {tuple(tokens.shape)}")
        return ObjectiveBatch(
            input_ids=tokens.to(torch.int64),
            labels=labels.to(torch.int64),
            loss_weights=weights,
            num_tokens=(weights > 0).sum().to(torch.int),
            token_mask=weights > 0,
        )


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
    report = torch.stack([loss_sum.detach().float(), num_tokens.detach().to(torch.float32)])
    return loss_sum, num_tokens, {"lm loss": report}


def build_objective(
    kind: str,
    *,
    mask_token_id: Optional[int] = None,
    eps: float = 1e-3,
    loss_weighting: str = "llada",
    variable_length_prob: float = 0.0,
):
    """Build the objective named by ``kind`` (``"mdm"`` or ``"ar"``).

    Raises:
        ValueError: If ``kind`` is unknown or ``mask_token_id`` is missing for MDM.
    """
    if kind == "mdm":
        if mask_token_id is None:
            raise ValueError("the mdm objective needs mask_token_id")
        return MaskedDiffusionObjective(
            mask_token_id,
            eps=eps,
            loss_weighting=loss_weighting,
            variable_length_prob=variable_length_prob,
        )
    if kind == "ar":
        return AutoregressiveObjective()
    raise ValueError(f"objective kind must be 'mdm' or 'ar', got {kind!r}")
