"""Block logits for semi-autoregressive decoding: the current block's logits only, with Fast-dLLM's
block KV caches on megatron-core models.

The sampler (:func:`~dlmspec.backends.generate.sampler.generate`) asks, at every denoising step, for
the logits of the current block ``[start, end)`` of the canvas, through a :class:`BlockLogitsFn`:

- :class:`FullCanvas` serves any :class:`~dlmspec.backends.generate.sampler.LogitsFn` (a Hugging Face
  model, a test model): the whole canvas through the model, the block's columns kept. No cache.
- :class:`GPTBlockLogits` serves a megatron-core ``GPTModel`` of the runtime. Its output layer is
  run on the block's hidden states only (a forward pre-hook on ``output_layer`` slices
  ``hidden_states [s, b, h]`` before it), so the ``[b, s, V]`` logits of the whole canvas are never
  computed. With ``cache = "prefix"`` or ``"dual"`` it keeps every layer's keys and values:

  * **refresh** (a block's first step, and every ``cache_refresh`` steps): the whole canvas runs as
    without a cache; every core attention stores its keys and values ``[L, b, ng, hn]`` (after RoPE).
  * **prefix** (Fast-dLLM ``generate_with_prefix_cache``): later steps run the columns
    ``[start, L)`` (the block and the masked suffix); each layer's queries attend to the cached keys
    of ``[0, start)`` and their own keys.
  * **dual** (Fast-dLLM ``generate_with_dual_cache``): later steps run ``[start, end)`` only; the
    keys of ``[0, start)`` and of the suffix ``[end, L)`` come from the cache.

  Source: Wu et al. 2025, "Fast-dLLM", arXiv:2505.22618 Sec. 3.2 (Fig. 2), and its code
  github:NVlabs/Fast-dLLM llada/generate.py. Positions are those of the full canvas: learned
  absolute embeddings get the canvas' position ids of the columns run, RoPE gets the offset of the
  first column run (a forward pre-hook on ``rotary_pos_emb`` passes ``offset=start``), so a cached
  step's queries and keys are rotated as in the full forward. The attention pattern of the layer
  (causal, block-causal by ``block_size``, bidirectional) is applied with the canvas' column
  indices, and left padding by the key-padding mask of the canvas.

  On a causal model, and on a block-causal model whose blocks the sampler's blocks start on, no
  cached key depends on a column that changes after the refresh (and no query of the current block
  sees a suffix key), so the cached steps give the no-cache logits. On a bidirectional model
  they are Fast-dLLM's approximation (finished blocks no longer see the current block change).

The cache is implemented on the local layer spec's core attention
(:class:`~dlmspec.backends.megatron.attention.SDPACoreAttention` and its Flex subclass): while a
:class:`GPTBlockLogits` call runs, each core attention's ``forward`` is replaced (on the instance)
by one that stores or reads the cache and attends through the module's own ``_attend``; it is
restored after the call. Other core attentions (Transformer Engine layers) cannot take the cache:
:func:`block_cache_unsupported` says why, and the sampler falls back to ``cache = "none"`` (the
current block's logits still only) and records the reason in the output.

:class:`GPTBlockCache` is the exact clean-prefix cache of block diffusion (BD3-LM, Arriola et al.
2025, sec. 4, Algorithm 2; :func:`~dlmspec.backends.generate.block_diffusion.bd3_generate`): the
keys and values of the prompt and of every decoded block are appended once and never recomputed,
and a denoising step runs the current block alone. Both caches swap the core attentions' forward
on the instance (:func:`patched_core_forwards`) and offset RoPE with a pre-hook on the model's
rotary embedding (:func:`rope_offset_hook`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, List, Optional, Protocol

import torch
from torch import Tensor


class BlockLogitsFn(Protocol):
    """The model as the block sampler sees it.

    Attributes:
        cache: the cache it runs: ``"none"``, ``"prefix"`` or ``"dual"``.

    Called as ``fn(tokens, attention_mask, start, end, refresh=...)``:

    Args:
        tokens: ``LongTensor[B, L]``, the whole canvas (left-padded prompts, generated region).
        attention_mask: ``BoolTensor[B, L]`` (``True`` = real token) or ``None`` (no row padded).
        start, end: the current block's columns ``[start, end)``.
        refresh: recompute the whole canvas (and the cache); a call with ``refresh=False`` must
            follow a refresh of the same rows, canvas length and block.

    Returns:
        ``FloatTensor[B, end - start, V]``: the logits of the block's columns.
    """

    cache: str

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, *,
                 refresh: bool) -> Tensor: ...


def call_logits_fn(logits_fn: Callable[..., Tensor], tokens: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
    """Call ``logits_fn`` as :class:`~dlmspec.backends.generate.sampler.LogitsFn` says (no mask
    argument when ``attention_mask`` is None).

    Returns:
        ``[B, L, V]`` logits.

    Raises:
        ValueError: ``logits_fn`` returned another shape.
    """
    logits = logits_fn(tokens) if attention_mask is None else logits_fn(tokens, attention_mask)
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(tokens.shape):
        raise ValueError(
            f"logits_fn returned shape {tuple(logits.shape)} for tokens of shape {tuple(tokens.shape)}; "
            "it must return [batch, length, vocab]"
        )
    return logits


class FullCanvas:
    """:class:`BlockLogitsFn` of any logits function: the whole canvas each step, the block kept.

    Args:
        logits_fn: a :class:`~dlmspec.backends.generate.sampler.LogitsFn`.
    """

    cache = "none"
    compile_fallback = "compile = true needs a megatron-core GPTModel of the runtime (gpt_logits_fn)"
    cuda_graph_fallback = ("cuda_graph = true needs a megatron-core GPTModel of the runtime (gpt_logits_fn) on one "
                           "pipeline stage without sequence parallelism; this logits function runs eager")

    def __init__(self, logits_fn: Callable[..., Tensor]) -> None:
        self.logits_fn = logits_fn

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, *,
                 refresh: bool = True) -> Tensor:
        return call_logits_fn(self.logits_fn, tokens, attention_mask)[:, start:end]


def block_cache_unsupported(model: Any, cache: str) -> Optional[str]:
    """Why :class:`GPTBlockLogits` cannot run ``cache`` on ``model``, or ``None`` when it can.

    ``"none"`` needs a megatron-core ``GPTModel`` holding both ends (embedding and output layer) and
    no sequence parallelism (the block's hidden states are sliced before the output layer).
    ``"prefix"`` / ``"dual"`` need, besides, every core attention to be the local layer spec's
    :class:`~dlmspec.backends.megatron.attention.SDPACoreAttention` (or its Flex subclass), without
    context parallelism, and RoPE, learned absolute or no position embedding (not multi-latent
    attention, YaRN or multimodal RoPE).
    """
    from megatron.core.utils import unwrap_model

    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    if config is None or not hasattr(inner, "output_layer") or not hasattr(inner, "embedding"):
        return "not a megatron-core GPTModel holding the embedding and the output layer (one pipeline stage)"
    if getattr(config, "sequence_parallel", False):
        return "sequence parallelism (hidden states are split over the sequence before the output layer)"
    if cache == "none":
        return None
    from dlmspec.backends.megatron.attention import SDPACoreAttention

    if getattr(config, "multi_latent_attention", False):
        return "multi-latent attention (its keys are latents)"
    if getattr(inner, "position_embedding_type", "rope") not in ("rope", "learned_absolute", "none"):
        return f"position_embedding_type = {inner.position_embedding_type!r} (RoPE, learned_absolute or none are cached)"
    if int(getattr(config, "context_parallel_size", 1)) > 1:
        return "context parallelism (each rank holds part of the sequence)"
    cores = [m.core_attention for m in inner.modules() if hasattr(m, "core_attention")]
    if not cores:
        return "the model has no attention layer on this rank"
    for core in cores:
        if not isinstance(core, SDPACoreAttention):
            return (f"core attention {type(core).__name__} (Transformer Engine layers): the block cache runs the "
                    "local layer spec's SDPACoreAttention only")
    return None


def allowed_keys(mode: str, block_size: Optional[int], q_columns: Tensor, k_columns: Tensor,
                 key_padding: Optional[Tensor]) -> Optional[Tensor]:
    """The attention pattern of queries at canvas columns ``q_columns`` over keys at ``k_columns``.

    ``"causal"``: key ``j`` is seen by query ``i`` when ``j <= i``; ``"block_causal"``: when
    ``j // block_size <= i // block_size``; ``"bidirectional"``: always (the patterns of
    :class:`~dlmspec.backends.megatron.attention.SDPACoreAttention`, by column index). A padding key
    (``key_padding`` False) is never seen.

    Args:
        mode, block_size: the core attention's.
        q_columns: ``LongTensor[sq]``; k_columns: ``LongTensor[sk]``.
        key_padding: ``BoolTensor[b, sk]`` (``True`` = real) or ``None``.

    Returns:
        ``BoolTensor`` broadcastable to ``[b, heads, sq, sk]`` (``True`` = attended), or ``None``
        when everything is seen.
    """
    allowed = None
    if mode == "causal":
        allowed = (k_columns.view(1, -1) <= q_columns.view(-1, 1)).view(1, 1, len(q_columns), len(k_columns))
    elif mode == "block_causal":
        bs = int(block_size)
        allowed = ((k_columns // bs).view(1, -1) <= (q_columns // bs).view(-1, 1)).view(1, 1, len(q_columns), len(k_columns))
    if key_padding is not None:
        pad = key_padding.bool().view(key_padding.shape[0], 1, 1, -1)
        allowed = pad if allowed is None else allowed & pad
    return allowed


def core_attentions(model: Any) -> List[Any]:
    """The core attention of every attention layer of ``model`` (an unwrapped ``GPTModel``), in
    module order."""
    return [m.core_attention for m in model.modules() if hasattr(m, "core_attention")]


@contextlib.contextmanager
def patched_core_forwards(cores: List[Any], make_forward: Callable[[int, Any, Callable[..., Tensor]], Callable[..., Tensor]]):
    """For the duration, each core attention's ``forward`` is ``make_forward(index, core,
    original)`` (set on the instance; ``original`` is the forward it had: an instance-level
    forward someone else set is kept and restored, else the class's)."""
    patched = []
    for index, core in enumerate(cores):
        own = core.__dict__.get("forward")
        core.forward = make_forward(index, core, own if own is not None else type(core).forward.__get__(core))
        patched.append((core, own))
    try:
        yield
    finally:
        for core, own in patched:
            if own is None:
                del core.forward  # back to the class's forward
            else:
                core.forward = own


def rope_offset_hook(rotary: torch.nn.Module, offset: Callable[[], int]) -> Any:
    """A forward pre-hook on megatron-core's ``RotaryEmbedding`` that passes ``offset=offset()``
    (``RotaryEmbedding.forward(max_seq_len, offset=0)`` rotates positions ``offset ..
    offset + max_seq_len - 1``), so columns run alone get the angles of their canvas positions.
    Returns the hook's handle (``.remove()`` it)."""

    def hook(module: Any, args: tuple, kwargs: dict):
        kwargs = dict(kwargs)
        kwargs["offset"] = int(offset())
        return args, kwargs

    return rotary.register_forward_pre_hook(hook, with_kwargs=True)


class GPTBlockLogits:
    """:class:`BlockLogitsFn` of a megatron-core ``GPTModel``: the block's logits only, and a block KV cache.

    See the module docstring for the algorithm and its sources.

    Args:
        model: the ``GPTModel`` (or a wrapper with the same ``forward``), eval mode, one pipeline stage.
        cache: ``"none"``, ``"prefix"`` or ``"dual"`` (:func:`block_cache_unsupported` must accept it).
        columns: ``logits [..., V_padded] -> logits [..., V]``, the loaded model's column selection
            (``load.logits_columns``); default: all columns.
        tensor_model_parallel_size: the model's TP; above 1 the output layer's vocabulary shards
            are all-gathered for the block's columns only (``[b, block, V]``, never the canvas').
        compile: run the model through ``torch.compile(mode="reduce-overhead")`` (CUDA graphs) with
            ``cache = "none"``. With a block cache it is not run (``compile_fallback`` says why): the
            cache keeps keys and values made inside the model's forward, which a CUDA-graph replay
            would overwrite.
        cuda_graph: run every model forward as a replayed ``torch.cuda.CUDAGraph``
            (:mod:`~dlmspec.backends.generate.cuda_graphs`), one per shape, kept on the model:
            ``cache = "none"`` and the refreshes of a block cache by ``(rows, canvas length, block
            length)`` (the block's columns reach the output layer through a static index, so one
            graph serves every block); a block cache's cached steps by that and the block's start
            (their key columns, RoPE offset and concatenation of cached keys are baked in), tied to
            the refresh graph whose keys and values they read. Refused with the reason in
            ``cuda_graph_fallback`` (the forward runs eager) on the CPU, at TP > 1, under
            ``compile`` (torch.compile's own graphs) and where
            :func:`~dlmspec.backends.generate.cuda_graphs.cuda_graph_unsupported` says why.
        graph_backend: the capture backend (default: ``CUDAGraphBackend``; tests pass a stand-in,
            which also lifts the CUDA-device requirement).
        max_graphs: graphs kept on the model (least recently used evicted).

    Attributes:
        refreshes, cached_steps: calls that ran the whole canvas and calls that used the cache.
        keys, values: per core attention (in module order), the cached ``[L, b, ng, hn]`` tensors
            of the last refresh (empty for ``cache = "none"``).
        logit_rows: the number of positions the output layer ran on at the last call (``b x block``).
        compile_fallback: why ``compile`` was asked for and is not run, or ``None``.
        cuda_graph_fallback: why ``cuda_graph`` was asked for and the forward runs eager (also after
            a capture failed at a call), or ``None``.
        graphs: the model's :class:`~dlmspec.backends.generate.cuda_graphs.GraphCache`, or ``None``.
        commit_graphs: with ``graphs``, the model's cache of the sampler's commit-step graphs
            (``cuda_graphs.COMMIT_ATTRIBUTE``: :func:`~dlmspec.backends.generate.sampler.generate`
            replays a greedy step's argmax, confidence, remasking rule and write as one graph), or ``None``.

    The position ids and key-padding mask derived from ``attention_mask``, and a cached step's key
    pattern, are made at the first call with that mask tensor (by identity) and reused while it is
    the same tensor: the sampler hands one tensor to every step of a block and never writes it; a
    caller that changes a mask in place must hand a new tensor.

    Raises:
        ValueError: :func:`block_cache_unsupported` gives a reason.
    """

    def __init__(self, model: Any, *, cache: str = "none", columns: Optional[Callable[[Tensor], Tensor]] = None,
                 tensor_model_parallel_size: int = 1, compile: bool = False, cuda_graph: bool = False,
                 graph_backend: Any = None, max_graphs: Optional[int] = None) -> None:
        why = block_cache_unsupported(model, cache)
        if why is not None:
            raise ValueError(f"no {cache!r} block cache for this model: {why}")
        from megatron.core.utils import unwrap_model

        self.model = model
        self.cache = cache
        self.columns = columns
        self.compile = bool(compile) and cache == "none"
        self.compile_fallback = None
        if compile and cache != "none":
            self.compile_fallback = (f"compile = true is not run with cache = {cache!r}: the cache keeps keys and values "
                                     "made inside the forward, which a CUDA-graph replay would overwrite (not built)")
        self._inner = unwrap_model(model)
        self._cores = core_attentions(self._inner) if cache != "none" else []
        self._gather = None
        #: the sampler asks :meth:`greedy` (no gathered logits) at temperature 0 when set: at TP > 1
        #: with a column selection :meth:`greedy` can apply to a shard.
        self.vocab_parallel = tensor_model_parallel_size > 1 and (columns is None or hasattr(columns, "width"))
        if tensor_model_parallel_size > 1:
            from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

            self._gather = gather_from_tensor_model_parallel_region
        self._forward = model
        self._persistent = None
        if self.compile:
            # one hook for the object's life (a hook added per call would change what the compiled graph
            # guards on, so it would recompile at every call); outside a call it passes the input through
            self._persistent = self._inner.output_layer.register_forward_pre_hook(self._slice_hidden, with_kwargs=True)
            self._forward = torch.compile(model, mode="reduce-overhead", dynamic=False)
        self.graphs: Any = None
        self.commit_graphs: Any = None
        self._cuda_graph_refused: Optional[str] = None
        if cuda_graph:
            from dlmspec.backends.generate import cuda_graphs

            if self.compile:
                self._cuda_graph_refused = ("cuda_graph = true is not run with compile = true: torch.compile's "
                                            "reduce-overhead mode makes its own CUDA graphs")
            elif graph_backend is None:
                self._cuda_graph_refused = cuda_graphs.cuda_graph_unsupported(
                    model, tensor_model_parallel_size=tensor_model_parallel_size)
            if self._cuda_graph_refused is None:
                self.graphs = cuda_graphs.model_graph_cache(
                    model, graph_backend, max_graphs=max_graphs or cuda_graphs.DEFAULT_MAX_GRAPHS)
                # the sampler's commit step (greedy): its own graphs, on the forward graphs' backend and pool
                self.commit_graphs = cuda_graphs.model_graph_cache(
                    model, self.graphs.backend, max_graphs=max_graphs or cuda_graphs.DEFAULT_MAX_GRAPHS,
                    attribute=cuda_graphs.COMMIT_ATTRIBUTE, what="the sampler's commit step")
        self._columns_of: Optional[tuple] = None
        self._refresh_entry: Any = None
        self._aliased = False
        self.keys: List[Tensor] = []
        self.values: List[Tensor] = []
        self.refreshes = 0
        self.cached_steps = 0
        self.logit_rows = 0
        self._state: Dict[str, Any] = {}
        # what is the same at every step of a block, made at its first use (see _positions, _masks,
        # _invalid_ids); each is keyed by what it is made from (the attention mask by identity: the
        # sampler hands the same tensor to every step of a block and never writes it)
        self._positions_of: Optional[tuple] = None
        self._masks_of: Optional[tuple] = None
        self._invalid_of: Optional[tuple] = None

    # ------------------------------------------------------------------ hooks

    def _slice_hidden(self, module: Any, args: tuple, kwargs: dict):
        if self._state.get("logits") is None:  # not inside a call of this object
            return None
        hidden = args[0] if args else kwargs["input_"]
        where = self._state["logits"]
        if isinstance(where, Tensor):  # a CUDA graph's static column index: one graph for every block
            hidden = hidden.index_select(0, where)
        else:
            lo, hi = where
            hidden = hidden[lo:hi]
        self.logit_rows = hidden.shape[0] * hidden.shape[1]
        if args:
            return (hidden,) + tuple(args[1:]), kwargs
        kwargs = dict(kwargs)
        kwargs["input_"] = hidden
        return args, kwargs

    def _core_forward(self, index: int, core: Any, original: Callable[..., Tensor]) -> Callable[..., Tensor]:
        from dlmspec.backends.megatron.attention import SDPACoreAttention

        def forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Any = None, *args: Any,
                    **kwargs: Any) -> Tensor:
            state = self._state
            if state["phase"] == "refresh":
                if len(self.keys) <= index:
                    self.keys.append(key)
                    self.values.append(value)
                else:
                    self.keys[index], self.values[index] = key, value
                return original(query, key, value, attention_mask, *args, **kwargs)
            q_lo, q_hi = state["q_lo"], state["q_hi"]
            cached_k, cached_v = self.keys[index], self.values[index]
            parts_k, parts_v = [cached_k[:q_lo], key], [cached_v[:q_lo], value]
            if q_hi < cached_k.shape[0]:
                parts_k.append(cached_k[q_hi:])
                parts_v.append(cached_v[q_hi:])
            full_k, full_v = torch.cat(parts_k, dim=0), torch.cat(parts_v, dim=0)
            return SDPACoreAttention._attend(core, query, full_k, full_v, self._mask(core), False)

        return forward

    def _mask(self, core: Any) -> Optional[Tensor]:
        """:func:`allowed_keys` of this cached step for ``core``'s pattern, made once for every
        layer of that pattern and kept while the step's columns and key padding stay the same (the
        steps of a block)."""
        masks = self._state["masks"]
        key = (core.mode, core.block_size)
        if key not in masks:
            state = self._state
            masks[key] = allowed_keys(core.mode, core.block_size, state["q_columns"], state["k_columns"],
                                      state["padding"])
        return masks[key]

    def _positions(self, attention_mask: Optional[Tensor], b: int, length: int, device: Any
                   ) -> tuple[Tensor, Optional[Tensor]]:
        """``(position_ids [b, length], hidden_mask [b, 1, 1, length] or None)`` of the canvas: the
        positions restart at 0 at each row's first real token; ``True`` = hidden key. Made once per
        attention-mask tensor (by identity) and shape."""
        cached = self._positions_of
        if cached is not None and cached[0] is attention_mask and cached[1] == (b, length, device):
            return cached[2], cached[3]
        if attention_mask is None:
            position_ids = torch.arange(length, device=device).unsqueeze(0).expand(b, length)
            hidden_mask = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention_mask.bool()).view(b, 1, 1, length)
        self._positions_of = (attention_mask, (b, length, device), position_ids, hidden_mask)
        return position_ids, hidden_mask

    @contextlib.contextmanager
    def _installed(self, rope: bool):
        handles = [] if self._persistent is not None else [
            self._inner.output_layer.register_forward_pre_hook(self._slice_hidden, with_kwargs=True)]
        rotary = getattr(self._inner, "rotary_pos_emb", None)
        if rope and rotary is not None:
            handles.append(rope_offset_hook(rotary, lambda: self._state["q_lo"]))
        try:
            with patched_core_forwards(self._cores, self._core_forward):
                yield
        finally:
            self._state["logits"] = None
            for handle in handles:
                handle.remove()

    @property
    def cuda_graph_fallback(self) -> Optional[str]:
        """Why ``cuda_graph`` is asked for and not run (see the class docstring), or ``None``."""
        if self._cuda_graph_refused is not None:
            return self._cuda_graph_refused
        return None if self.graphs is None else self.graphs.fallback

    # ------------------------------------------------------------------ call

    @torch.no_grad()
    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, *,
                 refresh: bool = True) -> Tensor:
        """The logits ``[B, end - start, V]`` (float32) of the block's columns (see the class docstring)."""
        out = self._block(tokens, attention_mask, start, end, refresh)
        if self._gather is not None:
            out = self._gather(out.contiguous())
        if self._aliased and out.dtype == torch.float32:
            out = out.clone()  # a graph's static output: the next replay overwrites it
        out = out.float()
        return self.columns(out) if self.columns is not None else out

    @torch.no_grad()
    def greedy(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, *, refresh: bool,
               exclude: Optional[int] = None) -> tuple[Tensor, Tensor]:
        """The block's argmax tokens and their confidences ``([B, block], [B, block])`` from this rank's
        vocabulary shard, without gathering the logits (:func:`vocab_parallel_greedy`): what
        ``sample_tokens(logits, temperature=0)`` gives on the gathered, column-selected logits with the
        id ``exclude`` (the mask token) at ``-inf``.

        The column selection is applied to the shard by id: ids ``>= columns.width`` and
        ``columns.blocked`` are ``-inf`` (``load._columns``).
        """
        out = self._block(tokens, attention_mask, start, end, refresh).to(torch.float64)
        group, vocab_start = None, 0
        if self._gather is not None:
            from megatron.core import parallel_state

            group = parallel_state.get_tensor_model_parallel_group()
            vocab_start = parallel_state.get_tensor_model_parallel_rank() * out.shape[-1]
        out = out.masked_fill(self._invalid_ids(vocab_start, out.shape[-1], exclude, out.device), float("-inf"))
        return vocab_parallel_greedy(out, group=group, vocab_start=vocab_start)

    def _invalid_ids(self, vocab_start: int, width: int, exclude: Optional[int], device: Any) -> Tensor:
        """``BoolTensor[width]``: the ids ``vocab_start ..`` of this rank's shard that :meth:`greedy`
        never picks (beyond ``columns.width``, in ``columns.blocked``, ``exclude``); made once per
        shard, id and device (no host tensor is made and copied at every step)."""
        key = (vocab_start, width, exclude, device)
        if self._invalid_of is not None and self._invalid_of[0] == key:
            return self._invalid_of[1]
        ids = torch.arange(vocab_start, vocab_start + width, device=device)
        invalid = torch.zeros_like(ids, dtype=torch.bool)
        if self.columns is not None:
            invalid |= ids >= int(self.columns.width)
            blocked = list(getattr(self.columns, "blocked", ()))
            if blocked:
                invalid |= torch.isin(ids, torch.tensor(blocked, device=device))
        if exclude is not None:
            invalid |= ids == exclude
        self._invalid_of = (key, invalid)
        return invalid

    def _block(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, refresh: bool) -> Tensor:
        """The output layer's ``[B, end - start, V_r]`` for the block (this rank's vocabulary shard)."""
        b, length = tokens.shape
        position_ids, hidden_mask = self._positions(attention_mask, b, length, tokens.device)
        self._aliased = False
        if self.graphs is not None and self.graphs.fallback is None:
            out = self._graph_block(tokens, attention_mask, position_ids, hidden_mask, start, end, refresh)
            if out is not None:
                self._aliased = True
                return out
        if self.cache == "none" or refresh:
            self._state = {"phase": "refresh", "logits": (start, end)}
            with self._installed(rope=False):
                out = self._forward(tokens, position_ids, hidden_mask)
            if self.cache != "none":
                self.refreshes += 1
                self._state["shape"] = (b, length)
        else:
            if self._state.get("shape") != (b, length) or not self.keys:
                raise ValueError(f"a cached step needs a refresh of the same rows and length first (got {b} x {length})")
            q_lo, q_hi = start, (length if self.cache == "prefix" else end)
            device = tokens.device
            of = self._masks_of
            if of is None or of[0] is not attention_mask or of[1] != (q_lo, q_hi, length, device):
                # the columns run and the key patterns: the same at every cached step of a block
                of = (attention_mask, (q_lo, q_hi, length, device), torch.arange(q_lo, q_hi, device=device),
                      torch.arange(length, device=device), {})
                self._masks_of = of
            self._state.update(phase="step", q_lo=q_lo, q_hi=q_hi, logits=(0, end - start), q_columns=of[2],
                               k_columns=of[3], padding=attention_mask, masks=of[4])
            with self._installed(rope=True):
                out = self._forward(tokens[:, q_lo:q_hi], position_ids[:, q_lo:q_hi], None)
            self.cached_steps += 1
        return out

    def _block_columns(self, start: int, end: int, device: Any) -> Tensor:
        """``LongTensor[end - start]``: the block's canvas columns (the graphs' static index input),
        made once per block."""
        of = self._columns_of
        if of is None or of[0] != (start, end, device):
            of = self._columns_of = ((start, end, device), torch.arange(start, end, device=device))
        return of[1]

    def _graph_block(self, tokens: Tensor, attention_mask: Optional[Tensor], position_ids: Tensor,
                     hidden_mask: Optional[Tensor], start: int, end: int, refresh: bool) -> Optional[Tensor]:
        """:meth:`_block` through the model's CUDA graphs: the static output ``[B, end - start, V_r]``
        (overwritten by the next replay of that graph), or ``None`` to run eager (a cached step whose
        refresh did not run as a graph)."""
        graphs = self.graphs
        b, length = tokens.shape
        width = end - start
        training = bool(getattr(self._inner, "training", False))
        if self.cache == "none" or refresh:
            key = ("full", self.cache, b, length, width, hidden_mask is not None, training)

            def full(tok: Tensor, pos: Tensor, hidden: Optional[Tensor], columns: Tensor) -> Tensor:
                self._state = {"phase": "refresh", "logits": columns}
                with self._installed(rope=False):
                    return self._forward(tok, pos, hidden)

            def captured(entry: Any) -> None:
                entry.extras["kv"] = (list(self.keys), list(self.values))  # the capture's key/value tensors

            def replayed(entry: Any) -> None:
                self.keys, self.values = list(entry.extras["kv"][0]), list(entry.extras["kv"][1])
                self._refresh_entry = entry

            out = graphs.run(key, full, [tokens, position_ids, hidden_mask,
                                         self._block_columns(start, end, tokens.device)],
                             on_capture=captured if self.cache != "none" else None,
                             on_replay=replayed if self.cache != "none" else None)
            if graphs.fallback is not None:  # the capture failed: this call ran eager (its keys are eager)
                self._refresh_entry = None
            if self.cache != "none":
                self.refreshes += 1
                self._state = {"shape": (b, length)}
            self.logit_rows = b * width
            return out
        ref = self._refresh_entry
        if self._state.get("shape") != (b, length) or ref is None or graphs.get(ref.key) is not ref:
            return None  # the refresh ran eager (or its graph was evicted): this step runs eager too
        q_lo, q_hi = start, (length if self.cache == "prefix" else end)
        key = ("step", self.cache, b, length, q_lo, q_hi, width, attention_mask is not None, training, ref.serial)

        def step(tok: Tensor, pos: Tensor, padding: Optional[Tensor]) -> Tensor:
            dev = tok.device
            self._state = {"phase": "step", "q_lo": q_lo, "q_hi": q_hi, "logits": (0, width),
                           "q_columns": torch.arange(q_lo, q_hi, device=dev),
                           "k_columns": torch.arange(length, device=dev), "padding": padding, "masks": {},
                           "shape": (b, length)}
            with self._installed(rope=True):
                return self._forward(tok[:, q_lo:q_hi], pos[:, q_lo:q_hi], None)

        out = graphs.run(key, step, [tokens, position_ids, attention_mask])  # eager if the capture failed
        self._state = {"shape": (b, length)}
        self.cached_steps += 1
        self.logit_rows = b * width
        return out


class GPTBlockCache:
    """The exact clean-prefix KV cache of block diffusion for a megatron-core ``GPTModel`` on the
    local layers (a core attention of ``backends/megatron/attention.py``: SDPA or FlexAttention):
    each layer's keys and values arrive at its core attention ``[s, b, groups, head_dim]``, RoPE
    applied; the cache keeps those of the prompt and the decoded blocks, in order. Use it as a
    context manager; leaving restores the model (:func:`patched_core_forwards`,
    :func:`rope_offset_hook`).

    Modes: :meth:`step` runs a block at ``offset`` attending the stored keys and itself, storing
    nothing; :meth:`append` does the same and stores the block's keys and values after the others.
    The core attention is called with no mask (the block sees every stored key and itself: the
    block-causal pattern of ``[prefix, block]``, :func:`~dlmspec.backends.generate.block_diffusion.
    prefix_block_mask`, restricted to the block's queries).

    Args:
        model: the ``GPTModel`` or a megatron-core wrapper of it (``Float16Module``, DDP:
            ``megatron.core.utils.unwrap_model``); the unwrapped model is called.
    """

    def __init__(self, model: Any) -> None:
        from megatron.core.utils import unwrap_model

        self.model = unwrap_model(model)
        self._cores = core_attentions(self.model)
        self.keys: List[Optional[Tensor]] = [None] * len(self._cores)
        self.values: List[Optional[Tensor]] = [None] * len(self._cores)
        self.offset = 0
        self.store = False
        self._stack: Optional[contextlib.ExitStack] = None

    def _core_forward(self, index: int, core: Any, original: Callable[..., Tensor]) -> Callable[..., Tensor]:
        def forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Any = None, *args: Any,
                    **kwargs: Any) -> Tensor:
            if self.store:
                self.keys[index] = key if self.keys[index] is None else torch.cat([self.keys[index], key], dim=0)
                self.values[index] = value if self.values[index] is None else torch.cat([self.values[index], value], dim=0)
                key, value = self.keys[index], self.values[index]
            elif self.keys[index] is not None:
                key = torch.cat([self.keys[index], key], dim=0)
                value = torch.cat([self.values[index], value], dim=0)
            return original(query, key, value, None, *args, **kwargs)

        return forward

    def __enter__(self) -> "GPTBlockCache":
        stack = contextlib.ExitStack()
        stack.enter_context(patched_core_forwards(self._cores, self._core_forward))
        stack.callback(rope_offset_hook(self.model.rotary_pos_emb, lambda: self.offset).remove)
        self._stack = stack
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def _run(self, block: Tensor, offset: int, store: bool) -> Tensor:
        self.offset, self.store = int(offset), store
        b, n = block.shape
        positions = torch.arange(offset, offset + n, device=block.device).unsqueeze(0).expand(b, n)
        return self.model(block, positions, None)

    def step(self, block: Tensor, offset: int) -> Tensor:
        """Logits ``[b, n, V]`` of ``block`` at positions ``offset ..``, attending the cache."""
        return self._run(block, offset, False)

    def append(self, block: Tensor, offset: int) -> Tensor:
        """As :meth:`step`, and store the block's keys and values (a clean block, or the prompt)."""
        return self._run(block, offset, True)


def vocab_parallel_greedy(logits: Tensor, *, group: Any = None, vocab_start: int = 0) -> tuple[Tensor, Tensor]:
    """Argmax token and its probability from vocabulary-parallel logits, without gathering them.

    Each tensor-parallel rank holds the logits of its vocabulary shard ``[vocab_start, vocab_start
    + V_r)`` (megatron-core's ``ColumnParallelLinear`` output layer, ``gather_output=False``). Per
    position, each rank computes its shard's max ``m_r``, the global index of its first maximum and
    its log-sum-exp ``s_r``; ``m = max_r m_r`` and the token (the smallest global index reaching
    ``m``: ``torch.argmax``'s tie rule) by all-reduce (MAX of ``m_r``, then MIN of the indices of the
    ranks reaching ``m``), and ``log Z = m + log sum_r exp(s_r - m)`` by an all-reduce (SUM) of
    ``exp(s_r - m)``. The confidence is ``p = exp(m - log Z)``: the softmax probability of the argmax
    token, LLaDA's ``x0_p`` at temperature 0 (:func:`~dlmspec.backends.generate.sampler.sample_tokens`).
    Communication: three all-reduces of ``[b, s]``, never ``[b, s, V]``.

    Args:
        logits: ``FloatTensor[b, s, V_r]``, this rank's shard (float64 is used inside).
        group: the tensor-parallel process group (``None``: no communication, TP = 1).
        vocab_start: the global id of this shard's first column.

    Returns:
        ``(tokens LongTensor[b, s], confidence Float64Tensor[b, s])``, equal on every rank.
    """
    x = logits.to(torch.float64)
    local_max, local_arg = x.max(dim=-1)
    local_lse = torch.logsumexp(x, dim=-1)
    if group is None:
        return local_arg + vocab_start, torch.exp(local_max - local_lse)
    import torch.distributed as dist

    global_max = local_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    index = torch.where(local_max == global_max, local_arg + vocab_start,
                        torch.full_like(local_arg, torch.iinfo(torch.int64).max))
    dist.all_reduce(index, op=dist.ReduceOp.MIN, group=group)
    z = torch.exp(local_lse - global_max)
    dist.all_reduce(z, op=dist.ReduceOp.SUM, group=group)
    return index, torch.exp(-torch.log(z))
