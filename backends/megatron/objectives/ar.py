"""Next-token prediction (``objective.kind = "ar"``), runtime half: causal attention, megatron's
``GPTDataset`` labels and loss mask. Compiler half: :mod:`dlmspec.objectives.ar`."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from .base import ObjectiveBatch, ObjectiveRng, RuntimeObjective, check_tokens, register_runtime, valid_from_loss_mask


class AutoregressiveObjective(RuntimeObjective):
    """Next-token prediction with causal attention. It draws nothing from ``rng``."""

    attention = "causal"
    kind = "ar"

    def prepare_batch(self, batch: Mapping[str, Optional[Tensor]], rng: ObjectiveRng,
                      **options: Any) -> ObjectiveBatch:
        """Build inputs, shifted labels and weights for next-token prediction.

        Args:
            batch: ``"tokens"`` ``[b, s]`` integer input ids; ``"loss_mask"`` optional ``[b, s]``
                weights (megatron ``GPTDataset``'s ``loss_mask``: 0 at padding and, with
                ``eod_mask_loss``, at EOD inputs whose label is the next document's first token);
                ``"labels"`` ``[b, s]`` next-token ids: when absent or ``None`` they are derived as
                ``labels[:, i] = tokens[:, i + 1]`` and the last position (which has no next
                token) gets weight 0; ``"position_ids"`` passed through.
            rng: unused.

        Returns:
            An :class:`ObjectiveBatch` with ``input_ids = tokens``.

        Raises:
            ValueError: On shape mismatches.
        """
        del rng, options
        tokens = batch["tokens"]
        loss_mask, labels = batch.get("loss_mask"), batch.get("labels")
        check_tokens(tokens)
        weights = valid_from_loss_mask(tokens, None).to(torch.float32)
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
            position_ids=batch.get("position_ids"),
            source_ids=tokens,
        )

    def dataset_extra_token(self) -> bool:
        return True  # tokens = text[:-1], labels = text[1:]


def _from_config(config: Any, **options: Any) -> AutoregressiveObjective:
    return AutoregressiveObjective()


register_runtime("ar", _from_config)
