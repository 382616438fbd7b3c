"""A megatron-core ``GPTModel`` as a logits function (:class:`~dlmspec.backends.generate.sampler.LogitsFn`).

The sampler and the likelihood estimators take ``logits_fn(tokens[, attention_mask])``; this module
adapts the model the runtime builds (``dlmspec.backends.megatron.layers.build_model``), called as
``model(input_ids, position_ids, attention_mask)``. No megatron-core import: the model is only called.
Loading a checkpoint into it is not built yet (docs/generate.md, "Not built yet").
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
        tensor_model_parallel_size: 1 (the output's vocabulary is whole). With TP > 1 each rank holds
            a slice of the vocabulary, which would have to be gathered; not built.

    Returns:
        A function ``(tokens [b, s], attention_mask [b, s] or None) -> logits [b, s, V]`` (float32).

    Raises:
        NotImplementedError: ``tensor_model_parallel_size > 1``.
    """
    if tensor_model_parallel_size != 1:
        raise NotImplementedError(
            f"tensor_model_parallel_size = {tensor_model_parallel_size}: the vocabulary-parallel logits are not "
            "gathered yet; sample at tensor_model_parallel_size = 1"
        )

    @torch.no_grad()
    def logits_fn(tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        if attention_mask is None:
            position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
            hidden_mask = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention_mask.bool()).view(b, 1, 1, s)
        return model(tokens, position_ids, hidden_mask).float()

    return logits_fn
