"""A Hugging Face ``transformers`` causal-LM class as the sampler's logits function, and AR decoding with its KV cache.

:func:`hf_logits_fn` adapts ``model(input_ids, attention_mask, position_ids).logits`` to
:class:`~dlmspec.backends.generate.sampler.LogitsFn`; the attention the model runs with is its own
(a diffusion LM exported by ``convert mcore-to-hf`` has ``is_causal: false`` in its config, so it
runs bidirectionally: docs/generate.md, "Hugging Face export of a diffusion LM").
:class:`HFKVCacheStep` is an :class:`~dlmspec.backends.generate.sampler.ARStepFn` that feeds only the
newest token against ``transformers``' KV cache. No ``transformers`` import: the model is only called.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch
from torch import Tensor


def _positions(attention_mask: Tensor) -> Tensor:
    """Position ids that start at 0 at each row's first real token (left padding)."""
    return (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)


def _cache_kwarg(model: Any) -> str:
    """The name ``model.forward`` takes the KV cache by: ``cache`` (transformers >= 5.x) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_logits_fn(model: Any):
    """``logits_fn`` of a ``transformers`` ``*ForCausalLM`` (or any module returning ``.logits``).

    With a key-padding mask, the model gets it as ``attention_mask`` (``1`` = real) and position ids
    from it (``attention_mask.cumsum(-1) - 1``), so a left-padded row sees the positions of its
    prompt alone. Runs without gradients and without a cache; tokens go to the model's device.

    Args:
        model: the model, in eval mode.

    Returns:
        ``(tokens [b, s], attention_mask [b, s] or None) -> logits [b, s, V]`` (float32, on the
        tokens' device).
    """
    device = next(model.parameters()).device

    @torch.no_grad()
    def logits_fn(tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        kwargs: dict = {"use_cache": False}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(device=device, dtype=torch.int64)
            kwargs["position_ids"] = _positions(attention_mask).to(device)
        out = model(input_ids=tokens.to(device), **kwargs)
        return out.logits.float().to(tokens.device)

    return logits_fn


class HFKVCacheStep:
    """AR next-token logits with ``transformers``' KV cache (an ``ARStepFn``).

    The first call runs the whole prompt and keeps the cache; each later call, whose ``tokens`` extend
    the previous call's by one column (:func:`~dlmspec.backends.generate.sampler.generate_ar`'s
    contract), runs only the last column against it. A call that does not extend the previous one by
    exactly one column starts over (the whole sequence, a new cache), so a reused instance stays
    correct. For causal models only: a bidirectional model's earlier keys change when a token is
    added, which a cache cannot express.

    Args:
        model: a causal ``transformers`` ``*ForCausalLM`` in eval mode.

    Raises:
        ValueError: the model's config has ``is_causal: false`` (a diffusion LM).
    """

    def __init__(self, model: Any) -> None:
        if getattr(getattr(model, "config", None), "is_causal", True) is False:
            raise ValueError("a KV cache decodes a causal model; this model's config has is_causal = false "
                             "(a diffusion LM): sample it with generate(), or decode with full_recompute()")
        self.model = model
        self.device = next(model.parameters()).device
        self.kwarg = _cache_kwarg(model)
        self.cache: Any = None
        self.length = 0
        #: forward calls made over the whole sequence (prefill or start-over) and over one column.
        self.full_calls = 0
        self.incremental_calls = 0

    @torch.no_grad()
    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
        """Next-token logits ``[B, V]`` (float32) for ``tokens [B, T]`` (see the class docstring)."""
        b, t = tokens.shape
        mask = attention_mask if attention_mask is not None else torch.ones(b, t, dtype=torch.bool, device=tokens.device)
        kwargs: dict = {"use_cache": True, "attention_mask": mask.to(device=self.device, dtype=torch.int64)}
        positions = _positions(mask).to(self.device)
        if self.cache is not None and t == self.length + 1:
            kwargs[self.kwarg] = self.cache
            out = self.model(input_ids=tokens[:, -1:].to(self.device), position_ids=positions[:, -1:], **kwargs)
            self.incremental_calls += 1
        else:
            out = self.model(input_ids=tokens.to(self.device), position_ids=positions, **kwargs)
            self.full_calls += 1
        self.cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        self.length = t
        return out.logits[:, -1].float().to(tokens.device)
