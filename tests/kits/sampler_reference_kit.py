"""The masked-diffusion sampler as it was before its per-step host work was cut (backends/generate/
sampler.py ``generate`` and its building blocks, block_cache.py ``GPTBlockLogits``'s per-step methods,
copied verbatim from commit 9284fc4): the slow reference the faster sampler must equal token for token,
forward pass for forward pass, step event for step event, for fixed seeds."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from dlmspec import objectives
from dlmspec.backends.generate.block_cache import GPTBlockLogits, allowed_keys, vocab_parallel_greedy
from dlmspec.backends.generate.config import GenerateConfig
from dlmspec.backends.generate.sampler import GenerateOutput, StepEvent, classifier_free_guidance
from dlmspec.generate_settings import PARALLEL_REMASKING
from dlmspec.objectives.schedules import MaskingSchedule

Prompts = Union[Tensor, Sequence[Sequence[int]]]


class ReferenceGPTBlockLogits(GPTBlockLogits):
    """:class:`GPTBlockLogits` with the per-step methods of commit 9284fc4 (``__call__``, the hooks
    and the installation are the live class's)."""

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
            mask = allowed_keys(core.mode, core.block_size, state["q_columns"], state["k_columns"], state["padding"])
            return SDPACoreAttention._attend(core, query, full_k, full_v, mask, False)

        return forward

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
        ids = torch.arange(vocab_start, vocab_start + out.shape[-1], device=out.device)
        invalid = torch.zeros_like(ids, dtype=torch.bool)
        if self.columns is not None:
            invalid |= ids >= int(self.columns.width)
            blocked = list(getattr(self.columns, "blocked", ()))
            if blocked:
                invalid |= torch.isin(ids, torch.tensor(blocked, device=out.device))
        if exclude is not None:
            invalid |= ids == exclude
        out = out.masked_fill(invalid, float("-inf"))
        return vocab_parallel_greedy(out, group=group, vocab_start=vocab_start)

    def _block(self, tokens: Tensor, attention_mask: Optional[Tensor], start: int, end: int, refresh: bool) -> Tensor:
        """The output layer's ``[B, end - start, V_r]`` for the block (this rank's vocabulary shard)."""
        b, length = tokens.shape
        if attention_mask is None:
            position_ids = torch.arange(length, device=tokens.device).unsqueeze(0).expand(b, length)
            hidden_mask = None
        else:
            position_ids = (attention_mask.to(torch.int64).cumsum(-1) - 1).clamp(min=0)
            hidden_mask = (~attention_mask.bool()).view(b, 1, 1, length)
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
            self._state.update(
                phase="step", q_lo=q_lo, q_hi=q_hi, logits=(0, end - start),
                q_columns=torch.arange(q_lo, q_hi, device=device),
                k_columns=torch.arange(length, device=device),
                padding=attention_mask,
            )
            with self._installed(rope=True):
                out = self._forward(tokens[:, q_lo:q_hi], position_ids[:, q_lo:q_hi], None)
            self.cached_steps += 1
        return out


def num_transfer_tokens(masked_counts: Tensor, steps: int, schedule: Optional[MaskingSchedule] = None) -> Tensor:
    """How many tokens each step of a block commits (LLaDA generate.py ``get_num_transfer_tokens``).

    LLaDA's noise schedule is linear (arXiv:2502.09992 Eq. 8), so the reverse process over ``steps``
    equal intervals of ``t`` unmasks the same expected number each step: ``n // steps`` per step,
    and one more in the first ``n % steps`` steps. Another masking schedule ``alpha(t)``
    (:mod:`dlmspec.objectives.schedules`, the model's ``objective.noise_schedule``) runs the same
    ``steps`` equal intervals of ``t`` from 1 to 0: after step ``k`` the expected masked share is
    ``1 - alpha(1 - (k + 1) / steps)`` (MDLM, arXiv:2406.07524 sec. 3.2.3: a masked token is
    unmasked between ``t`` and ``s`` with probability ``(alpha_s - alpha_t) / (1 - alpha_t)``), so
    ``R_k = round(n (1 - alpha(t_(k+1))))`` stay masked and step ``k`` commits ``R_(k-1) - R_k``
    (``R_(-1) = n``; every schedule ends at ``R = 0``).

    Args:
        masked_counts: ``LongTensor[B]``, masked positions of each row in the block.
        steps: steps of the block (>= 1).
        schedule: the masking schedule (``None`` or linear: LLaDA's split above, unchanged).

    Returns:
        ``LongTensor[B, steps]``; row ``b`` sums to ``masked_counts[b]``.
    """
    counts = masked_counts.to(torch.int64).reshape(-1, 1)
    if schedule is not None and not schedule.is_linear:
        t_next = 1.0 - torch.arange(1, steps + 1, dtype=torch.float64, device=counts.device) / steps
        share = schedule.mask_probability(t_next, torch).clamp(0.0, 1.0)  # [steps], ends at 0
        share[-1] = 0.0
        remaining = torch.floor(counts.to(torch.float64) * share.unsqueeze(0) + 0.5).to(torch.int64)
        before = torch.cat([counts, remaining[:, :-1]], dim=1)
        return before - remaining
    base = counts // steps
    remainder = counts % steps
    column = torch.arange(steps, device=counts.device).unsqueeze(0)
    return base + (column < remainder).to(torch.int64)


def filter_logits(logits: Tensor, top_k: Optional[int] = None, top_p: Optional[float] = None,
                  temperature: float = 0.0) -> Tensor:
    """``logits`` with the tokens outside the top-k and the nucleus set to ``-inf``.

    Top-k keeps the ``top_k`` largest logits (ties at the k-th value kept); top-p (Holtzman et
    al. 2020, "The Curious Case of Neural Text Degeneration") keeps the smallest set of most
    probable tokens whose probability under ``softmax(logits / temperature)`` (``temperature = 0``:
    ``softmax(logits)``) reaches ``top_p``; the most probable token is always kept.

    Args:
        logits: ``FloatTensor[..., V]``.
        top_k: ``None`` or >= 1.
        top_p: ``None`` or in ``(0, 1]``.
        temperature: >= 0, used only for the nucleus.

    Returns:
        A new tensor of ``logits``' shape and dtype.
    """
    out = logits.clone()
    vocab = out.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = torch.topk(out, top_k, dim=-1).values[..., -1:]
        out = out.masked_fill(out < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        scaled = out / temperature if temperature > 0 else out
        probs = torch.softmax(scaled.to(torch.float64), dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # probability of the more probable tokens
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        out = out.masked_fill(drop, float("-inf"))
    return out


def sample_tokens(logits: Tensor, *, temperature: float, top_k: Optional[int] = None,
                  top_p: Optional[float] = None, generator: Optional[torch.Generator] = None
                  ) -> Tuple[Tensor, Tensor]:
    """Draw one token per position, and the confidence of each draw.

    ``temperature = 0`` takes the argmax. Above 0, Gumbel-max in float64: ``argmax(l / T + g)``
    with ``g = -log(-log u)``, ``u ~ U[0, 1)``, draws exactly from ``softmax(l / T)``. LLaDA's
    ``add_gumbel_noise`` (generate.py) computes ``exp(l) / (-log u) ** T``, whose argmax is the same
    token; the log form here does not overflow at large logits. Float64, as LLaDA: low-precision
    Gumbel noise lowers generation quality of MDMs (arXiv:2409.02908).

    The confidence is the probability of the drawn token under ``softmax`` of the filtered logits
    *without* the temperature, LLaDA's ``x0_p`` (generate.py; Fast-dLLM's ``get_transfer_index``).

    Args:
        logits: ``FloatTensor[..., V]``.
        temperature: >= 0.
        top_k, top_p: see :func:`filter_logits`.
        generator: the source of the Gumbel noise (on ``logits.device``).

    Returns:
        ``(tokens LongTensor[...], confidence Float64Tensor[...])``.
    """
    filtered = filter_logits(logits.to(torch.float64), top_k, top_p, temperature)
    if temperature > 0:
        u = torch.rand(filtered.shape, generator=generator, dtype=torch.float64, device=filtered.device)
        tokens = torch.argmax(filtered / temperature - torch.log(-torch.log(u)), dim=-1)
    else:
        tokens = torch.argmax(filtered, dim=-1)
    probs = torch.softmax(filtered, dim=-1)
    confidence = torch.gather(probs, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, confidence


def commit_positions(confidence: Tensor, masked: Tensor, *, count: Optional[Tensor] = None,
                     threshold: Optional[float] = None, factor: Optional[float] = None) -> Tensor:
    """Which masked positions a step commits.

    With ``count`` (``low_confidence`` and ``random``), the ``count[b]`` masked positions of row
    ``b`` with the highest ``confidence`` (LLaDA generate.py: ``topk`` over the confidence, non-masked
    positions at ``-inf``). With ``threshold``, every masked position whose confidence is
    ``>= threshold``, and the most confident one whatever its confidence, so each row with a mask
    commits at least one (Fast-dLLM llada/generate.py ``get_transfer_index``). With ``factor`` ``f``
    (Fast-dLLM's factor-based parallel decoding, arXiv:2505.22618 Sec. 3.3; llada/generate.py
    ``get_transfer_index_dynamic``): with the row's ``N`` masked confidences sorted
    ``c_(1) >= ... >= c_(N)``, commit the ``n`` most confident, ``n`` the length of the leading run
    of ``c_(k) >= 1 - f / (k + 1)`` (``k = 1`` always passes); as Fast-dLLM's code, ``n = N - 1``
    becomes ``N`` (its loop commits every masked position when only the last one fails). Ties go to
    the leftmost position.

    Args:
        confidence: ``FloatTensor[B, N]``.
        masked: ``BoolTensor[B, N]``, the positions that may be committed.
        count: ``LongTensor[B]``, at most the number of masked positions of the row.
        threshold: in ``(0, 1]``.
        factor: ``f > 0``.

    Returns:
        ``BoolTensor[B, N]``, a subset of ``masked``.
    """
    scores = confidence.to(torch.float64).masked_fill(~masked, float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(order.shape[-1], device=order.device).expand_as(order))
    if threshold is not None:
        chosen = (scores >= threshold) | (rank == 0)
    elif factor is not None:
        ranks = torch.arange(order.shape[-1], device=order.device, dtype=torch.float64)
        sorted_scores = torch.gather(scores, -1, order)
        passes = sorted_scores >= 1.0 - factor / (ranks + 2.0)
        passes[..., 0] = True
        lead = torch.cumprod(passes.to(torch.int64), dim=-1).sum(dim=-1, keepdim=True)
        total = masked.sum(dim=-1, keepdim=True)
        n = torch.where(lead == total - 1, total, lead)
        chosen = rank < n
    else:
        assert count is not None
        chosen = rank < count.reshape(-1, 1)
    return chosen & masked


def left_pad(prompts: Prompts, pad_id: int, device: Optional[Union[str, torch.device]] = None
             ) -> Tuple[Tensor, Optional[Tensor], List[int]]:
    """Left-pad prompts to one length.

    Args:
        prompts: a ``LongTensor[B, P]`` (no padding), a 1-D ``LongTensor`` (one prompt) or a sequence
            of token-id sequences of any lengths >= 1.
        pad_id: id written at padding positions.
        device: where the result lives (default: the tensor's device, else CPU).

    Returns:
        ``(tokens LongTensor[B, P], attention_mask BoolTensor[B, P] or None when no row is padded,
        lengths)``.

    Raises:
        ValueError: no prompt, an empty prompt, or a tensor of more than 2 dimensions.
    """
    if isinstance(prompts, Tensor):
        if prompts.dim() == 1:
            prompts = prompts.unsqueeze(0)
        if prompts.dim() != 2:
            raise ValueError(f"prompts: a [batch, length] tensor, got shape {tuple(prompts.shape)}")
        if prompts.shape[0] == 0 or prompts.shape[1] == 0:
            raise ValueError(f"prompts: need at least one prompt of at least one token, got shape {tuple(prompts.shape)}")
        tokens = prompts.to(device=device if device is not None else prompts.device, dtype=torch.int64)
        return tokens, None, [tokens.shape[1]] * tokens.shape[0]
    rows = [list(map(int, p)) for p in prompts]
    if not rows:
        raise ValueError("prompts: need at least one prompt, got none")
    lengths = [len(r) for r in rows]
    if min(lengths) == 0:
        raise ValueError(f"prompts: prompt {lengths.index(0)} is empty; give each prompt at least one token (e.g. BOS)")
    width = max(lengths)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):] = torch.tensor(row, dtype=torch.int64)
    tokens = tokens.to(device or "cpu")
    if min(lengths) == width:
        return tokens, None, lengths
    columns = torch.arange(width, device=tokens.device).unsqueeze(0)
    mask = columns >= torch.tensor([width - n for n in lengths], device=tokens.device).unsqueeze(1)
    return tokens, mask, lengths


def _generator(config: GenerateConfig, generator: Optional[torch.Generator], device: torch.device) -> torch.Generator:
    if generator is not None:
        return generator
    g = torch.Generator(device=device)
    g.manual_seed(config.seed)
    return g


def _finish(sequences: Tensor, start: int, eos: Optional[int]) -> Tuple[List[List[int]], List[str]]:
    generated, reasons = [], []
    for row in sequences[:, start:].tolist():
        if eos is not None and eos in row:
            generated.append(row[: row.index(eos)])
            reasons.append("eos")
        else:
            generated.append(row)
            reasons.append("length")
    return generated, reasons


@torch.no_grad()
def generate(logits_fn: LogitsFn, prompts: Prompts, config: GenerateConfig, *,
             on_step: Optional[Callable[[StepEvent], None]] = None,
             generator: Optional[torch.Generator] = None,
             device: Optional[Union[str, torch.device]] = None,
             noise_schedule: Optional[MaskingSchedule] = None) -> GenerateOutput:
    """Masked-diffusion sampling (LLaDA Sec. 2.4, semi-autoregressive blocks; Fast-dLLM's threshold).

    The canvas is the left-padded prompts followed by ``gen_length`` mask tokens. Blocks of
    ``block_length`` are decoded left to right; a block gets ``steps // num_blocks`` steps, and step
    ``i`` commits ``num_transfer_tokens(...)[i]`` of its masked positions (``low_confidence``: the most
    confident predictions; ``random``: random ones) or, under ``threshold`` / ``factor``, what
    :func:`commit_positions` selects (at least one), until the block has no mask left. A committed
    token is never changed again; positions right of the current block are never committed, and
    only the current block's logits are asked for (:func:`block_logits_for`: a megatron-core model
    runs its output layer on the block only, with the block KV cache ``config.cache`` refreshed at
    the block's first step and every ``config.cache_refresh`` steps). The rows decoded in a block
    stay in the batch until the block ends (static shapes; the only host sync inside a block is
    the end test of ``threshold`` / ``factor``).
    With ``cfg_scale > 0`` each step runs the batch twice in one call, the second copy with the
    prompt masked, and combines them (:func:`classifier_free_guidance`). With ``eos_token_id`` set, a
    row whose block came out all EOS is finished: its later blocks are filled with EOS without a
    forward pass, and it leaves the batch handed to ``logits_fn`` from the next block on; its output
    ends at its first EOS.

    Args:
        logits_fn: the model (:class:`LogitsFn`).
        prompts: ``LongTensor[B, P]`` or token-id sequences of different lengths (left-padded).
        config: the settings, ``kind = "mdm"``.
        on_step: called after every step with a :class:`StepEvent`.
        generator: the random source (default: a generator seeded with ``config.seed``), on ``device``.
        device: where the canvas lives (default: the prompts tensor's, else CPU).
        noise_schedule: the model's masking schedule (its objective's registration:
            ``dlmspec.objectives.get(kind).schedule(objective)``); ``None``: linear (LLaDA's).
            Sets how many tokens each step commits (:func:`num_transfer_tokens`).

    Returns:
        A :class:`GenerateOutput`.

    Raises:
        ValueError: ``config.kind`` is not ``"mdm"``, a prompt contains the mask token, or
            ``logits_fn`` returns a wrong shape.
    """
    if config.kind not in objectives.kinds() or not objectives.get(config.kind).diffusion:
        raise ValueError(f"kind = {config.kind!r}: generate() samples masked diffusion; use generate_ar() or kind = 'mdm'")
    mask_id = config.mask_token_id
    eos = config.eos_token_id
    prompt_tokens, prompt_attn, _ = left_pad(prompts, config.pad_id, device)
    real = prompt_attn if prompt_attn is not None else torch.ones_like(prompt_tokens, dtype=torch.bool)
    if bool((prompt_tokens == mask_id)[real].any()):
        raise ValueError(f"prompts contain the mask token {mask_id}; a prompt is given text (infilling is not built)")
    batch, plen = prompt_tokens.shape
    dev = prompt_tokens.device
    gen = _generator(config, generator, dev)
    length = plen + config.gen_length

    x = torch.full((batch, length), mask_id, dtype=torch.int64, device=dev)
    x[:, :plen] = prompt_tokens
    attn = None
    if prompt_attn is not None:
        attn = torch.cat([prompt_attn, torch.ones(batch, config.gen_length, dtype=torch.bool, device=dev)], dim=1)
    given = torch.zeros(batch, length, dtype=torch.bool, device=dev)  # prompt positions (masked for CFG)
    given[:, :plen] = True if prompt_attn is None else prompt_attn

    block_fn, cache_fallback = block_logits_for(logits_fn, config)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    row_passes = torch.zeros(batch, dtype=torch.int64, device=dev)
    forward_passes = step = 0
    parallel = config.remasking in PARALLEL_REMASKING
    # tensor parallelism at temperature 0: argmax and confidence from each rank's vocabulary shard
    # (block_cache.vocab_parallel_greedy), never the gathered logits
    vocab_parallel = (bool(getattr(block_fn, "vocab_parallel", False)) and config.temperature == 0
                      and config.top_k is None and config.top_p in (None, 1.0) and config.cfg_scale == 0)
    for block in range(config.num_blocks):
        start = plen + block * config.block_length
        end = start + config.block_length
        # the rows decoded in this block: fixed for the whole block (static shapes, one sync per block)
        index: Optional[Tensor] = None
        if eos is not None and bool(done.any()):
            x[done, start:end] = eos
            index = (~done).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
        xs = x if index is None else x[index]
        attn_s = attn if attn is None or index is None else attn[index]
        given_s = given if index is None else given[index]
        schedule = num_transfer_tokens((xs[:, start:end] == mask_id).sum(dim=1), config.steps_per_block,
                                       noise_schedule)
        block_step = 0
        while True:
            masked = xs[:, start:end] == mask_id
            if parallel:
                if block_step > 0 and not bool(masked.any()):  # the block's end: one sync a step
                    break
            elif block_step >= config.steps_per_block:
                break
            refresh = block_step == 0 or (config.cache_refresh is not None and block_step % config.cache_refresh == 0)
            if config.cfg_scale > 0:
                uncond = xs.masked_fill(given_s, mask_id)
                both = block_fn(torch.cat([xs, uncond]), None if attn_s is None else torch.cat([attn_s, attn_s]),
                                start, end, refresh=refresh)
                cond_l, uncond_l = both.chunk(2, dim=0)
                logits = classifier_free_guidance(cond_l, uncond_l, config.cfg_scale)
            elif vocab_parallel:
                logits = None
                x0, confidence = block_fn.greedy(xs, attn_s, start, end, refresh=refresh, exclude=mask_id)
            else:
                logits = block_fn(xs, attn_s, start, end, refresh=refresh)
            forward_passes += 1
            has_mask = masked.any(dim=1).to(torch.int64)
            if index is None:
                row_passes += has_mask
            else:
                row_passes.index_add_(0, index, has_mask)

            if logits is not None:
                if mask_id < logits.shape[-1]:  # the mask token is never an output (else a commit would stay masked)
                    logits = logits.clone()
                    logits[..., mask_id] = float("-inf")
                x0, confidence = sample_tokens(logits, temperature=config.temperature, top_k=config.top_k,
                                               top_p=config.top_p, generator=gen)
            if config.remasking == "random":
                confidence = torch.rand(masked.shape, generator=gen, dtype=torch.float64, device=dev)
            if config.remasking == "threshold":
                chosen = commit_positions(confidence, masked, threshold=config.threshold)
            elif config.remasking == "factor":
                chosen = commit_positions(confidence, masked, factor=config.factor)
            else:
                chosen = commit_positions(confidence, masked, count=schedule[:, block_step])
            xs[:, start:end] = torch.where(chosen, x0, xs[:, start:end])
            if index is not None:
                x[index, start:end] = xs[:, start:end]

            if on_step is not None:
                committed = torch.zeros(batch, length, dtype=torch.bool, device=dev)
                if index is None:
                    committed[:, start:end] = chosen
                else:
                    committed[index, start:end] = chosen
                on_step(StepEvent(step=step, block=block, tokens=x, committed=committed, prompt_length=plen))
            step += 1
            block_step += 1
        if eos is not None:
            done |= (x[:, start:end] == eos).all(dim=1)

    generated, reasons = _finish(x, plen, eos)
    return GenerateOutput(sequences=x, prompt_length=plen, generated=generated, finish_reasons=reasons,
                          forward_passes=forward_passes, steps=step, config=config.to_dict(),
                          forward_passes_per_row=row_passes.tolist(), cache=block_fn.cache,
                          cache_fallback=cache_fallback,
                          compile_fallback=getattr(block_fn, "compile_fallback", None) if config.compile else None)


def block_logits_for(logits_fn: Any, config: GenerateConfig) -> Tuple[Any, Optional[str]]:
    """The live sampler's choice of block logits function, a ``GPTBlockLogits`` turned into a
    :class:`ReferenceGPTBlockLogits`."""
    from dlmspec.backends.generate import sampler

    block_fn, fallback = sampler.block_logits_for(logits_fn, config)
    if type(block_fn) is GPTBlockLogits:
        block_fn.__class__ = ReferenceGPTBlockLogits
    return block_fn, fallback
