"""Sampling a block-diffusion (BD3-LM) model block by block, with or without an exact KV cache of
the clean prefix; and its NELBO forward. docs/block-diffusion.md, "Sampling".

A BD3-LM model (``objective.kind = "bd3lm"``) was trained on ``x_t (+) x_0``: a noised block saw
itself and the clean blocks before it, a clean block itself and the clean blocks before it
(block-causal). At inference the model is run block-causally on ``[clean prefix, current noised
block]`` (Arriola et al. 2025, sec. 4, Algorithm 2; bd3lms ``_semi_ar_sampler``): the prefix's
keys and values depend only on the blocks up to theirs, so once a block is decoded they never
change, and a cache of them is exact.

* :func:`bd3_generate` with ``cache=False`` recomputes ``[prefix, block]`` at every denoising step
  under :func:`prefix_block_mask`;
* with ``cache=True`` (a megatron-core ``GPTModel`` on the local layers) the prefix's keys and
  values are stored per layer (:class:`~dlmspec.backends.generate.block_cache.GPTBlockCache`,
  beside the Fast-dLLM caches of the masked-diffusion sampler) and every step runs the current block alone
  (its RoPE at its own positions), attending the stored keys and itself; a decoded block is run once
  more to append its keys and values.

Each block is denoised as LLaDA's low-confidence remasking does (``steps_per_block`` steps,
:func:`~dlmspec.backends.generate.sampler.num_transfer_tokens` tokens committed per step, the most
confident first, greedy or with a temperature). Plain torch; the GPTModel parts run on CPU as on GPU.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import torch
from torch import Tensor

from dlmspec.backends.generate.block_cache import GPTBlockCache
from dlmspec.backends.generate.sampler import commit_positions, num_transfer_tokens, sample_tokens
from dlmspec.backends.megatron.masks import MaskFunction

#: ``forward(input_ids [b, n], position_ids [b, n], attention_mask) -> logits [b, n, V]``.
Forward = Callable[[Tensor, Tensor, Any], Tensor]


def prefix_block_mask(prefix_len: int, block_size: int) -> MaskFunction:
    """The inference mask of ``[prefix, block]``: the prefix (``prefix_len`` positions, whole blocks
    of ``block_size`` from position 0) block-causal in itself, the block after it sees everything
    up to and including itself.

    Raises:
        ValueError: ``prefix_len`` not a multiple of ``block_size``.
    """
    p, bs = int(prefix_len), int(block_size)
    if bs < 1 or p < 0 or p % bs:
        raise ValueError(f"prefix length {p} must be a whole number of blocks of {bs}")

    def fn(b, h, q, k):
        return (k // bs <= q // bs) | (q >= p)

    return MaskFunction(fn, block_size=bs, name=f"prefix_block(prefix={p}, block={bs})")


@torch.no_grad()
def bd3_generate(model_or_forward: Any, prompt: Tensor, *, gen_length: int, block_size: int, steps_per_block: int,
                 mask_token_id: int, cache: bool = False, temperature: float = 0.0,
                 generator: Optional[torch.Generator] = None, vocab_size: Optional[int] = None) -> Tensor:
    """Sample ``gen_length`` tokens after ``prompt`` block by block.

    Args:
        model_or_forward: a ``GPTModel`` (required for ``cache=True``), or a :data:`Forward`.
        prompt: ``LongTensor[b, P]`` with ``P`` a multiple of ``block_size`` (blocks start at 0).
        gen_length: a multiple of ``block_size``.
        block_size: the model's training block.
        steps_per_block: denoising steps per block (``1 .. block_size``).
        mask_token_id: the model's mask id.
        cache: keep the prefix's keys and values (:class:`GPTBlockCache`) instead of recomputing it.
        temperature: 0 greedy, else sampled with ``generator``.
        vocab_size: logits columns past it are never sampled (the padded vocabulary, the mask).

    Returns:
        ``LongTensor[b, P + gen_length]``.

    Raises:
        ValueError: a length that is not whole blocks, or ``cache=True`` without a ``GPTModel``.
    """
    b, p = prompt.shape
    bs = int(block_size)
    if bs < 1 or p % bs or gen_length % bs or gen_length < bs:
        raise ValueError(f"prompt length {p} and gen_length {gen_length} must be whole blocks of {bs} "
                         "(left-pad the prompt with EOS to a multiple of block_size)")
    if not 1 <= int(steps_per_block) <= bs:
        raise ValueError(f"steps_per_block = {steps_per_block}: use 1 .. block_size ({bs})")
    from megatron.core.utils import unwrap_model

    is_model = hasattr(unwrap_model(model_or_forward), "decoder")
    if cache and not is_model:
        raise ValueError("cache=True needs a megatron-core GPTModel (its layers' keys and values are cached)")
    forward = (lambda ids, pos, mask: model_or_forward(ids, pos, mask)) if is_model else model_or_forward
    seq = prompt.to(torch.int64)

    def pick(logits: Tensor) -> tuple:
        logits = logits.float()
        if vocab_size is not None:
            logits[..., int(vocab_size):] = float("-inf")
        logits[..., mask_token_id] = float("-inf")
        return sample_tokens(logits, temperature=temperature, generator=generator)

    def denoise(logits_of: Callable[[Tensor], Tensor]) -> Tensor:
        block = torch.full((b, bs), mask_token_id, dtype=torch.int64, device=seq.device)
        counts = num_transfer_tokens(torch.full((b,), bs, device=seq.device), int(steps_per_block))
        for step in range(int(steps_per_block)):
            masked = block == mask_token_id
            tokens, confidence = pick(logits_of(block))
            chosen = commit_positions(confidence, masked, count=counts[:, step])
            block = torch.where(chosen, tokens, block)
        return block

    if not cache:
        for _ in range(gen_length // bs):
            prefix = seq.shape[1]
            mask = prefix_block_mask(prefix, bs)
            positions = torch.arange(prefix + bs, device=seq.device).unsqueeze(0).expand(b, -1)
            block = denoise(lambda blk: forward(torch.cat([seq, blk], dim=1), positions, mask)[:, prefix:])
            seq = torch.cat([seq, block], dim=1)
        return seq
    with GPTBlockCache(model_or_forward) as kv:
        for start in range(0, p, bs):  # the prompt, block by block: each attends the ones before
            kv.append(seq[:, start:start + bs], start)
        for _ in range(gen_length // bs):
            prefix = seq.shape[1]
            block = denoise(lambda blk: kv.step(blk, prefix))
            kv.append(block, prefix)
            seq = torch.cat([seq, block], dim=1)
    return seq


def bd3_forward(model: Any) -> Forward:
    """The :data:`~dlmspec.backends.generate.likelihood.BlockForwardFn` of a ``GPTModel`` for
    :func:`~dlmspec.backends.generate.likelihood.bd3_nelbo`: ``x_t (+) x_0`` with RoPE repeated for
    the two halves (a :class:`~dlmspec.backends.megatron.objectives.bd3lm.RepeatedHalvesRotary`
    around the model's rotary embedding for the call only)."""
    from dlmspec.backends.megatron.objectives.bd3lm import RepeatedHalvesRotary

    from megatron.core.utils import unwrap_model

    gpt = unwrap_model(model)

    @torch.no_grad()
    def forward(ids: Tensor, positions: Tensor, mask: Any) -> Tensor:
        inner = gpt.rotary_pos_emb
        gpt.rotary_pos_emb = RepeatedHalvesRotary(inner)
        try:
            return model(ids, positions, mask).float()
        finally:
            gpt.rotary_pos_emb = inner

    return forward


def bd3_continuation_nll(model: Any, context: List[int], continuation: List[int], *, block_size: int,
                         mask_token_id: int, pad_token_id: int, generator: torch.Generator,
                         **nelbo_kwargs: Any) -> tuple:
    """``-log p(continuation | context)`` of a block-diffusion ``GPTModel`` as its NELBO bound:
    ``context + continuation`` left-padded with ``pad_token_id`` (an end of document, as between
    documents in training) to whole blocks, only the continuation scored
    (:func:`~dlmspec.backends.generate.likelihood.bd3_nelbo`, the context and the padding clean).

    Returns:
        ``(nll, stderr, num_tokens)`` in nats.

    Raises:
        ValueError: an empty continuation.
    """
    from dlmspec.backends.generate.likelihood import bd3_nelbo

    if not continuation:
        raise ValueError("continuation: empty; give at least one token to score")
    bs = int(block_size)
    ids = list(context) + list(continuation)
    pad = (-len(ids)) % bs
    device = next(model.parameters()).device
    seq = torch.tensor([[int(pad_token_id)] * pad + ids], dtype=torch.int64, device=device)
    target = torch.zeros_like(seq, dtype=torch.bool)
    target[0, pad + len(context):] = True
    res = bd3_nelbo(bd3_forward(model), seq, block_size=bs, mask_token_id=mask_token_id, generator=generator,
                    target_mask=target, **nelbo_kwargs)
    return float(res.nll[0]), float(res.stderr[0]), len(continuation)
