"""A megatron-core ``GPTModel`` as a logits function (:class:`~dlmspec.backends.generate.sampler.LogitsFn`).

The sampler and the likelihood estimators take ``logits_fn(tokens[, attention_mask])``; this module
adapts the model the runtime builds (``dlmspec.backends.megatron.layers.build_model``), called as
``model(input_ids, position_ids, attention_mask)``. No megatron-core import at TP = 1: the model is only called. Loading a checkpoint into it:
:mod:`dlmspec.backends.generate.load`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor


def gpt_logits_fn(model: Any, *, tensor_model_parallel_size: int = 1):
    """``logits_fn`` of a megatron-core ``GPTModel`` chunk (one pipeline stage holding both ends).

    Position ids restart at 0 at each row's first real token (``attention_mask.cumsum(-1) - 1``), so a
    left-padded prompt sees the positions it would see alone; the key-padding mask goes to the model
    as megatron-core takes it, ``[b, 1, 1, s]`` with ``True`` = not attended. The model runs in eval
    mode, without gradients.

    Args:
        model: the ``GPTModel`` (or a wrapper of it with the same ``forward``), in eval mode.
        tensor_model_parallel_size: the model's TP. Above 1 each rank's output holds a slice of the
            vocabulary; the slices are all-gathered over the tensor-parallel group
            (megatron-core's ``gather_from_tensor_model_parallel_region``), so every rank gets the
            whole logits and runs the sampler alike (written for any TP; tested at TP = 1).

    Returns:
        A function ``(tokens [b, s], attention_mask [b, s] or None) -> logits [b, s, V]`` (float32).
    """
    gather = None
    if tensor_model_parallel_size > 1:
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region as gather

    @torch.no_grad()
    def logits_fn(tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        if attention_mask is None:
            position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
            hidden_mask = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention_mask.bool()).view(b, 1, 1, s)
        logits = model(tokens, position_ids, hidden_mask)
        if gather is not None:
            logits = gather(logits.contiguous())
        return logits.float()

    return logits_fn
