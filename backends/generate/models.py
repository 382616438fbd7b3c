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
            whole logits and runs the sampler alike (tested at TP = 2 on CPU against TP = 1:
            tests/integration/generate/test_tensor_parallel_generation.py). With sequence
            parallelism (a training model: ``[eval.generation]``, RL rollouts) megatron-core splits
            the sequence over the TP ranks and asserts that its length divides by TP; a canvas of
            another length gets ``-s mod TP`` columns on the right, hidden by the key-padding mask
            (no real column attends to them: the logits of the real columns are unchanged), and
            their logits are dropped.

    Returns:
        A function ``(tokens [b, s], attention_mask [b, s] or None) -> logits [b, s, V]`` (float32).
        Its attribute ``block_logits(config, columns=None)`` gives the sampler's
        :class:`~dlmspec.backends.generate.block_cache.BlockLogitsFn` for a
        :class:`~dlmspec.backends.generate.config.GenerateConfig` and why it runs no cache when
        ``config.cache`` asks for one (:func:`gpt_block_logits`).
    """
    gather = None
    multiple = 1  # the sequence length megatron-core's sequence parallelism needs a multiple of
    if tensor_model_parallel_size > 1:
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region as gather
        from megatron.core.utils import unwrap_model

        if getattr(getattr(unwrap_model(model), "config", None), "sequence_parallel", False):
            multiple = tensor_model_parallel_size

    @torch.no_grad()
    def logits_fn(tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        b, s = tokens.shape
        extra = -s % multiple
        if extra:  # hidden right padding up to a multiple of TP (sequence parallelism)
            real = (torch.ones(b, s, dtype=torch.bool, device=tokens.device) if attention_mask is None
                    else attention_mask.bool())
            attention_mask = torch.cat([real, torch.zeros(b, extra, dtype=torch.bool, device=tokens.device)], dim=1)
            tokens = torch.cat([tokens, tokens.new_zeros(b, extra)], dim=1)
            s += extra
        if attention_mask is None:
            position_ids = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
            hidden_mask = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention_mask.bool()).view(b, 1, 1, s)
        logits = model(tokens, position_ids, hidden_mask)
        if gather is not None:
            logits = gather(logits.contiguous())
        return (logits[:, : s - extra] if extra else logits).float()

    def block_logits(config: Any, columns: Optional[Any] = None) -> Any:
        return gpt_block_logits(model, config, columns=columns, tensor_model_parallel_size=tensor_model_parallel_size,
                                full=logits_fn if columns is None else (lambda t, m=None: columns(logits_fn(t, m))))

    logits_fn.block_logits = block_logits  # type: ignore[attr-defined]
    logits_fn.model = model  # type: ignore[attr-defined]
    return logits_fn


def gpt_block_logits(model: Any, config: Any, *, columns: Optional[Any] = None, tensor_model_parallel_size: int = 1,
                     full: Optional[Any] = None) -> tuple[Any, Optional[str]]:
    """The block sampler's logits function of a megatron-core ``GPTModel`` for ``config``, and the
    reason it runs no cache when ``config.cache`` asks for one (``None`` when it runs it).

    :class:`~dlmspec.backends.generate.block_cache.GPTBlockLogits` with ``config.cache``,
    ``config.compile`` and ``config.cuda_graph``; where :func:`~dlmspec.backends.generate.block_cache.block_cache_unsupported`
    refuses the cache (Transformer Engine core attention, ...), the same without cache (the current
    block's logits only); where it refuses even that, the whole canvas through ``full`` (the
    model's :func:`gpt_logits_fn`, columns selected).
    """
    from dlmspec.backends.generate.block_cache import FullCanvas, GPTBlockLogits, block_cache_unsupported

    cache = getattr(config, "cache", "none")
    why = block_cache_unsupported(model, cache)
    fallback = None
    if why is not None and cache != "none":
        fallback = f"cache = {cache!r} is not run: {why}"
        cache = "none"
        why = block_cache_unsupported(model, cache)
    if why is not None:
        return FullCanvas(full), fallback
    return GPTBlockLogits(model, cache=cache, columns=columns, tensor_model_parallel_size=tensor_model_parallel_size,
                          compile=bool(getattr(config, "compile", False)),
                          cuda_graph=bool(getattr(config, "cuda_graph", False))), fallback


# --------------------------------------------------------------------------- AR decoding with a KV cache


def kv_cache_unsupported(model: Any) -> Optional[str]:
    """Why :class:`GPTKVCacheStep` cannot decode ``model``, or ``None`` when it can.

    The cache is megatron-core's own (``StaticInferenceContext`` passed as ``inference_context=``
    to ``GPTModel.forward``: each attention layer keeps its keys and values in
    ``key_value_memory_dict`` and attends the new column's query to all of them). What it needs of
    the model: every core attention is the runtime's local
    :class:`~dlmspec.backends.megatron.attention.SDPACoreAttention` in ``"causal"`` mode (an AR
    model of the local layer spec). Refused, with the reason: bidirectional or block-causal
    attention (a diffusion LM: earlier keys change with every new token), Transformer Engine core
    attention (its key-padding wrapper takes one mask for queries and keys), megatron-core's
    ``flash_decode`` or CUDA-graph inference (a different decode path), multi-latent attention.

    Args:
        model: a ``GPTModel`` (or a wrapper, e.g. ``Float16Module``, with the same ``forward``).
    """
    from megatron.core.utils import unwrap_model

    from dlmspec.backends.megatron.attention import SDPACoreAttention

    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    if config is None:
        return "not a megatron-core model (no config)"
    if getattr(config, "flash_decode", False):
        return "TransformerConfig.flash_decode is set (megatron-core's flash-decode path is not used here)"
    if getattr(config, "cuda_graph_impl", "none") not in (None, "none"):
        return f"TransformerConfig.cuda_graph_impl = {config.cuda_graph_impl!r} (CUDA-graph inference is not used here)"
    if getattr(config, "multi_latent_attention", False):
        return "multi-latent attention (its cache holds latents, not keys and values)"
    cores = [m.core_attention for m in inner.modules() if hasattr(m, "core_attention")]
    if not cores:
        return "the model has no attention layer on this rank"
    for core in cores:
        if not isinstance(core, SDPACoreAttention):
            return (f"core attention {type(core).__name__} (Transformer Engine layers): the cache runs the local "
                    "layer spec's SDPACoreAttention only")
        if core.mode != "causal":
            return f"{core.mode} attention: a KV cache decodes a causal (AR) model only"
    return None


class GPTKVCacheStep:
    """AR next-token logits of a megatron-core ``GPTModel`` with megatron-core's KV cache (an ``ARStepFn``).

    The first call runs the whole (left-padded) prompt with a fresh ``StaticInferenceContext``
    (megatron-core ``megatron.core.inference.contexts.static_context``; 0.16.1 and later take
    ``(max_batch_size, max_sequence_length)``), which fills every layer's key/value buffers; each
    later call whose ``tokens`` extend the previous call's by one column (the contract of
    :func:`~dlmspec.backends.generate.sampler.generate_ar`) runs only that column: its embedding,
    the cached keys and values of the earlier columns, the context's ``sequence_len_offset`` giving
    RoPE its position. Any other call (another batch, a jump in length, a sequence longer than the
    context holds) starts over with a new context, so a reused instance stays correct.

    Left padding: the key-padding mask (``[b, 1, 1, T]``, ``True`` = hidden) covers every cached
    key, and position ids come from it as in :func:`gpt_logits_fn` (learned absolute embeddings;
    RoPE uses column positions, relative, as the full forward does). One query against all cached
    keys is causal attention already, so the single-column calls run the layers'
    :class:`~dlmspec.backends.megatron.attention.SDPACoreAttention` unmasked by position (its
    ``mode`` is ``"bidirectional"`` for the duration of that call and restored after); the prompt's
    call runs it causal as usual. At TP > 1 megatron-core gathers the vocabulary-parallel logits
    itself (``runtime_gather_output=True``, which its inference path requires).

    Args:
        model: the ``GPTModel`` (eval mode) that :func:`kv_cache_unsupported` accepts.
        max_new_tokens: columns the context holds beyond the prompt (``gen_length``); a longer
            decode starts over with a larger context.
        columns: ``logits [..., V_padded] -> logits [..., V]``, the column selection of the loaded
            model (``load.logits_columns``); default: all columns.

    Raises:
        ValueError: :func:`kv_cache_unsupported` gives a reason.
    """

    def __init__(self, model: Any, *, max_new_tokens: int = 128, columns: Optional[Any] = None) -> None:
        why = kv_cache_unsupported(model)
        if why is not None:
            raise ValueError(f"no KV cache for this model: {why}; decode with full_recompute()")
        from megatron.core.utils import unwrap_model

        from dlmspec.backends.megatron.attention import SDPACoreAttention

        self.model = model
        self.max_new_tokens = max(1, int(max_new_tokens))
        self.columns = columns
        self._cores = [m for m in unwrap_model(model).modules() if isinstance(m, SDPACoreAttention)]
        self.context: Any = None
        self.length = 0
        self.batch = 0
        #: forward calls over the whole sequence (prefill or start-over) and over one column.
        self.full_calls = 0
        self.incremental_calls = 0

    def _new_context(self, batch: int, length: int) -> Any:
        from megatron.core.inference.contexts.static_context import StaticInferenceContext

        context = StaticInferenceContext(batch, length + self.max_new_tokens)
        if not hasattr(context, "materialize_only_last_token_logits"):
            # GPTModel reads it; megatron-core 0.16.1 sets it True (newer ones through their InferenceConfig,
            # True too). Either way only the last column is used (``_logits``).
            context.materialize_only_last_token_logits = True
        return context

    def _logits(self, out: Tensor) -> Tensor:
        last = out[:, -1].float()
        return self.columns(last) if self.columns is not None else last

    @torch.no_grad()
    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
        """Next-token logits ``[B, V]`` (float32) for ``tokens [B, T]`` (see the class docstring)."""
        b, t = tokens.shape
        if attention_mask is None:
            position_ids = torch.arange(t, device=tokens.device).unsqueeze(0).expand(b, t)
            hidden = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden = (~attention_mask.bool()).view(b, 1, 1, t)
        ctx = self.context
        extends = (ctx is not None and b == self.batch and t == self.length + 1 and t <= ctx.max_sequence_length)
        if not extends:
            ctx = self.context = self._new_context(b, t)
            if hasattr(ctx, "enable_prefill_mode"):
                ctx.enable_prefill_mode()
            out = self.model(tokens, position_ids, hidden, inference_context=ctx, runtime_gather_output=True)
            self.full_calls += 1
        else:
            if hasattr(ctx, "enable_decode_mode"):
                ctx.enable_decode_mode()
            modes = [core.mode for core in self._cores]
            try:
                for core in self._cores:
                    core.mode = "bidirectional"  # one query over every cached key: causal by construction
                out = self.model(tokens[:, -1:], position_ids[:, -1:], hidden, inference_context=ctx,
                                 runtime_gather_output=True)
            finally:
                for core, mode in zip(self._cores, modes):
                    core.mode = mode
            self.incremental_calls += 1
        ctx.sequence_len_offset = t  # the columns the cache now holds
        self.length, self.batch = t, b
        return self._logits(out)
