"""Sampling from a masked-diffusion LM (and left-to-right from an AR LM) against a logits function.

The model is anything that maps tokens to logits, so a megatron-core ``GPTModel``, a Hugging Face
model and a test model serve alike (:class:`LogitsFn`). :func:`generate` is masked-diffusion
sampling: the prompt followed by ``gen_length`` mask tokens, unmasked over ``steps`` denoising steps
in semi-autoregressive blocks (LLaDA, arXiv:2502.09992 Sec. 2.4 and its appendix algorithms;
github:ML-GSAI/LLaDA generate.py). :func:`generate_ar` decodes left to right. Settings:
:class:`GenerateConfig`. The algorithms, their sources and what is not built yet: docs/generate.md.
Plain torch; runs on CPU.

Prompts of different lengths are **left-padded** (LLaDA generate.py's choice): every row's
generated region then occupies the same columns ``[P, P + gen_length)``, so blocks, the transfer
schedule, EOS skipping and guidance work column-wise for the whole batch, and a row's relative
positions (RoPE) are those of the prompt alone. Padding keys are hidden by a key-padding mask
handed to the logits function (see :class:`LogitsFn`), which may also derive position ids from it
(``attention_mask.cumsum(-1) - 1``) so that every prompt starts at position 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import torch
from torch import Tensor

from dlmspec import objectives
from dlmspec.backends.generate.block_cache import BlockLogitsFn, FullCanvas, call_logits_fn
from dlmspec.backends.generate.config import GenerateConfig
from dlmspec.generate_settings import PARALLEL_REMASKING
from dlmspec.objectives.schedules import MaskingSchedule

Prompts = Union[Tensor, Sequence[Sequence[int]]]


class LogitsFn(Protocol):
    """A model as the sampler sees it.

    Called as ``logits_fn(tokens)`` when no row of the batch is padded, and as
    ``logits_fn(tokens, attention_mask)`` when some row is, so a one-argument function serves
    batches of prompts of one length.

    Args:
        tokens: ``LongTensor[B, L]`` token ids.
        attention_mask: ``BoolTensor[B, L]``, ``True`` at real tokens and ``False`` at left padding;
            a padding key must not be attended (megatron-core's ``GPTModel`` takes the inverse,
            ``[B, 1, 1, L]`` with ``True`` = hidden; Hugging Face models take it as it is).

    Returns:
        ``FloatTensor[B, L, V]`` logits at every position (a diffusion model: the prediction of the
        token at that position; an AR model: of the token after it).
    """

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor: ...


class ARStepFn(Protocol):
    """One step of AR decoding: the seam for a KV cache (megatron-core's:
    :class:`~dlmspec.backends.generate.models.GPTKVCacheStep`; transformers':
    :class:`~dlmspec.backends.generate.hf_model.HFKVCacheStep`).

    Called once per generated token with the whole sequence so far; each call extends the previous
    one by one column, so an implementation with a KV cache may run only ``tokens[:, -1:]`` against
    its cache. :func:`full_recompute` is the cache-less implementation.

    Args:
        tokens: ``LongTensor[B, T]``, the left-padded prompts and the tokens generated so far.
        attention_mask: ``BoolTensor[B, T]`` (``True`` = real token) or ``None`` when no row is padded.

    Returns:
        ``FloatTensor[B, V]``: logits of the next token of each row.
    """

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor]) -> Tensor: ...


@dataclass
class StepEvent:
    """What the per-step callback (``on_step``) receives, for streaming.

    Attributes:
        step: 0-based index of this step over the whole run (a forward pass each).
        block: 0-based block index (AR: 0).
        tokens: ``LongTensor[B, L]``, the canvas after this step's commits (the sampler's own
            tensor: clone it to keep it; do not modify it).
        committed: ``BoolTensor[B, L]``, the positions committed at this step.
        prompt_length: ``P``, the column where generation starts (the longest prompt).
    """

    step: int
    block: int
    tokens: Tensor
    committed: Tensor
    prompt_length: int


@dataclass
class GenerateOutput:
    """The result of :func:`generate` or :func:`generate_ar`.

    Attributes:
        sequences: ``LongTensor[B, P + n]``: left-padded prompts and the generated region (mask
            tokens never remain; positions of skipped blocks hold EOS).
        prompt_length: ``P``, the column where the generated region starts.
        generated: per row, the generated token ids up to (not including) the first EOS.
        finish_reasons: per row, ``"eos"`` (an EOS ended it) or ``"length"`` (``gen_length`` reached).
        forward_passes: number of calls of the logits function (a guided step is one call of ``2B`` rows).
        steps: number of sampler steps run.
        config: ``GenerateConfig.to_dict()``, recorded with the output.
        forward_passes_per_row: per row, the forward passes in which it still had a masked position
            in the current block (what decoding it alone would take; :func:`generate_ar`: its steps
            until its EOS). Rows stay in the batch until their block ends, so ``forward_passes``
            counts the batch's calls.
        cache: the block KV cache run (``"none"``, ``"prefix"``, ``"dual"``; AR: ``"none"``).
        cache_fallback: why ``cache`` is not ``config["cache"]`` (e.g. Transformer Engine layers,
            a Hugging Face model), or ``None``.
        compile_fallback: why ``config["compile"]`` is set and the model runs uncompiled, or ``None``.
        cuda_graph_fallback: why ``config["cuda_graph"]`` is set and the model's forward runs eager
            (on the CPU, at TP > 1, a logits function that is not a megatron-core ``GPTModel``'s, a
            failed capture: :mod:`~dlmspec.backends.generate.cuda_graphs`), or ``None``.
    """

    sequences: Tensor
    prompt_length: int
    generated: List[List[int]]
    finish_reasons: List[str]
    forward_passes: int
    steps: int
    config: Dict[str, Any]
    forward_passes_per_row: List[int] = field(default_factory=list)
    cache: str = "none"
    cache_fallback: Optional[str] = None
    compile_fallback: Optional[str] = None
    cuda_graph_fallback: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        """The output as JSON-ready values (what ``--json`` would print)."""
        return {
            "generated": self.generated,
            "finish_reasons": self.finish_reasons,
            "forward_passes": self.forward_passes,
            "forward_passes_per_row": self.forward_passes_per_row,
            "steps": self.steps,
            "cache": self.cache,
            "cache_fallback": self.cache_fallback,
            "compile_fallback": self.compile_fallback,
            "cuda_graph_fallback": self.cuda_graph_fallback,
            "config": self.config,
        }


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


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
    return _filtered(logits.clone(), top_k, top_p, temperature)


def _filtered(out: Tensor, top_k: Optional[int], top_p: Optional[float], temperature: float) -> Tensor:
    """:func:`filter_logits` without its copy: ``out`` itself when nothing is filtered, else a new
    tensor (``out`` is never written)."""
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
                  top_p: Optional[float] = None, generator: Optional[torch.Generator] = None,
                  exclude: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """Draw one token per position, and the confidence of each draw.

    ``temperature = 0`` takes the argmax. Above 0, Gumbel-max in float64: ``argmax(l / T + g)``
    with ``g = -log(-log u)``, ``u ~ U[0, 1)``, draws exactly from ``softmax(l / T)``. LLaDA's
    ``add_gumbel_noise`` (generate.py) computes ``exp(l) / (-log u) ** T``, whose argmax is the same
    token; the log form here does not overflow at large logits. Float64, as LLaDA: low-precision
    Gumbel noise lowers generation quality of MDMs (arXiv:2409.02908).

    The confidence is the probability of the drawn token under ``softmax`` of the filtered logits
    *without* the temperature, LLaDA's ``x0_p`` (generate.py; Fast-dLLM's ``get_transfer_index``).

    One float64 copy of ``logits`` is made (``exclude`` is written into it); the noise is
    transformed in place; ``l / T`` is skipped at ``T = 1`` (an exact identity in IEEE arithmetic),
    so the draws are those of the plain formula above, bit for bit.

    Args:
        logits: ``FloatTensor[..., V]`` (never written).
        temperature: >= 0.
        top_k, top_p: see :func:`filter_logits`.
        generator: the source of the Gumbel noise (on ``logits.device``).
        exclude: a token id that is never drawn (its logit set to ``-inf`` first; the sampler's mask
            token), or ``None``; an id ``>= V`` is ignored.

    Returns:
        ``(tokens LongTensor[...], confidence Float64Tensor[...])``.
    """
    x = logits.to(torch.float64)
    if exclude is not None and exclude < x.shape[-1]:
        if x is logits:  # float64 already: copy before writing
            x = x.clone()
        x[..., exclude].fill_(float("-inf"))
    filtered = _filtered(x, top_k, top_p, temperature)
    if temperature > 0:
        noise = torch.rand(filtered.shape, generator=generator, dtype=torch.float64, device=filtered.device)
        noise = noise.log_().neg_().log_()  # -g = log(-log u)
        scaled = filtered if temperature == 1 else filtered / temperature
        tokens = torch.argmax(torch.sub(scaled, noise, out=noise), dim=-1)
    else:
        tokens = torch.argmax(filtered, dim=-1)
    probs = torch.softmax(filtered, dim=-1)
    confidence = torch.gather(probs, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, confidence


def classifier_free_guidance(cond: Tensor, uncond: Tensor, scale: float) -> Tensor:
    """LLaDA's unsupervised classifier-free guidance: ``uncond + (scale + 1) * (cond - uncond)``.

    Source: arXiv:2502.09992 App. B.3 (after Nie et al. 2024, arXiv:2410.18514) and LLaDA
    generate.py. ``scale = 0`` returns ``cond`` exactly.

    Args:
        cond: logits with the prompt, ``[..., V]``.
        uncond: logits with the prompt masked, same shape.
        scale: the guidance ``w >= 0``.
    """
    if scale == 0:
        return cond
    return uncond + (scale + 1.0) * (cond - uncond)


def commit_positions(confidence: Tensor, masked: Tensor, *, count: Optional[Tensor] = None,
                     threshold: Optional[float] = None, factor: Optional[float] = None,
                     ranks: Optional[Tensor] = None) -> Tensor:
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
        count: ``LongTensor[B]`` or ``[B, 1]``, at most the number of masked positions of the row.
        threshold: in ``(0, 1]``.
        factor: ``f > 0``.
        ranks: ``torch.arange(N)`` (int64, on the device), for a caller that calls once a step with
            one ``N`` (built here when ``None``).

    Returns:
        ``BoolTensor[B, N]``, a subset of ``masked``.
    """
    scores = torch.where(masked, confidence.to(torch.float64), float("-inf"))
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    if ranks is None:
        ranks = torch.arange(order.shape[-1], device=order.device)
    rank = torch.empty_like(order).scatter_(-1, order, ranks.expand_as(order))
    if threshold is not None:
        chosen = (scores >= threshold) | (rank == 0)
    elif factor is not None:
        sorted_scores = torch.gather(scores, -1, order)
        passes = sorted_scores >= 1.0 - factor / (ranks.to(torch.float64) + 2.0)
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
    # one host tensor for the batch (not one per row), then one copy to the device
    tokens = torch.tensor([[pad_id] * (width - len(row)) + row for row in rows], dtype=torch.int64).to(device or "cpu")
    if min(lengths) == width:
        return tokens, None, lengths
    starts = torch.tensor([width - n for n in lengths], dtype=torch.int64).unsqueeze(1)  # [B, 1] on the host
    mask = (torch.arange(width).unsqueeze(0) >= starts).to(tokens.device)
    return tokens, mask, lengths


def _generator(config: GenerateConfig, generator: Optional[torch.Generator], device: torch.device) -> torch.Generator:
    if generator is not None:
        return generator
    g = torch.Generator(device=device)
    g.manual_seed(config.seed)
    return g


def _finish(sequences: Tensor, start: int, eos: Optional[int], row_passes: Optional[Tensor] = None
            ) -> Tuple[List[List[int]], List[str], List[int]]:
    """Per row, the generated ids up to the first EOS and the finish reason, and ``row_passes``
    (``LongTensor[B]``) as a list: one device->host copy for all three."""
    rows = sequences[:, start:]
    if row_passes is not None:
        rows = torch.cat([rows, row_passes.to(rows.dtype).unsqueeze(1)], dim=1)
    passes: List[int] = []
    generated, reasons = [], []
    for row in rows.tolist():
        if row_passes is not None:
            passes.append(row.pop())
        if eos is not None and eos in row:
            generated.append(row[: row.index(eos)])
            reasons.append("eos")
        else:
            generated.append(row)
            reasons.append("length")
    return generated, reasons, passes


# --------------------------------------------------------------------------------------------
# Masked diffusion
# --------------------------------------------------------------------------------------------


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
    the end test of ``threshold`` / ``factor``). Host synchronisations of a call: the prompts'
    mask-token test, one per block after the first when ``eos_token_id`` is set (which rows still
    run), one per step under ``threshold`` / ``factor``, and one at the end (the output as lists);
    what is the same at every step of a block (the block's view of the canvas, the commit counts,
    the ranks) is made once per block (``bench/sampling/host_overhead.py`` counts the ops and
    syncs per step).
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
    has_mask_token = prompt_tokens == mask_id
    if prompt_attn is not None:
        has_mask_token &= prompt_attn
    if bool(has_mask_token.any()):
        raise ValueError(f"prompts contain the mask token {mask_id}; a prompt is given text (infilling is not built)")
    batch, plen = prompt_tokens.shape
    dev = prompt_tokens.device
    gen = _generator(config, generator, dev)
    length = plen + config.gen_length
    width = config.block_length

    x = torch.full((batch, length), mask_id, dtype=torch.int64, device=dev)
    x[:, :plen] = prompt_tokens
    attn = None
    if prompt_attn is not None:
        attn = torch.cat([prompt_attn, torch.ones(batch, config.gen_length, dtype=torch.bool, device=dev)], dim=1)
    given = None  # prompt positions (masked for CFG)
    if config.cfg_scale > 0:
        given = torch.zeros(batch, length, dtype=torch.bool, device=dev)
        given[:, :plen] = True if prompt_attn is None else prompt_attn

    block_fn, cache_fallback = block_logits_for(logits_fn, config)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    row_passes = torch.zeros(batch, dtype=torch.int64, device=dev)
    ranks = torch.arange(width, device=dev)  # commit_positions' [block_length] ranks, made once
    forward_passes = step = 0
    parallel = config.remasking in PARALLEL_REMASKING
    # tensor parallelism at temperature 0: argmax and confidence from each rank's vocabulary shard
    # (block_cache.vocab_parallel_greedy), never the gathered logits
    vocab_parallel = (bool(getattr(block_fn, "vocab_parallel", False)) and config.temperature == 0
                      and config.top_k is None and config.top_p in (None, 1.0) and config.cfg_scale == 0)
    # a greedy step's commit (argmax, confidence, the remasking rule, the write into the block) replayed as
    # one CUDA graph beside the forward's: ~20 launches of host work a step become one
    commit = commit_graphs(block_fn, config, eligible=on_step is None and given is None and not vocab_parallel)
    if commit is not None:
        commit_fn, commit_key = commit_step(config, ranks), ("commit", config.remasking, config.threshold,
                                                             config.factor, mask_id)
    for block in range(config.num_blocks):
        start = plen + block * width
        end = start + width
        # the rows decoded in this block: fixed for the whole block (static shapes); one sync per
        # block after the first, and only with an EOS (before block 0 no row is done)
        index: Optional[Tensor] = None
        if eos is not None and block > 0:
            running = (~done).nonzero().squeeze(1)
            if running.numel() == 0:
                x[:, start:end] = eos
                continue
            if running.numel() < batch:
                x[:, start:end].masked_fill_(done.unsqueeze(1), eos)
                index = running
        xs = x if index is None else x[index]
        attn_s = attn if attn is None or index is None else attn[index]
        given_s = None if given is None else given if index is None else given[index]
        view = xs[:, start:end]  # [B', block_length], a view: commits are written through it
        masked = view == mask_id
        schedule = num_transfer_tokens(masked.sum(dim=1), config.steps_per_block, noise_schedule)
        counts = schedule.t().unsqueeze(-1).unbind(0)  # per block step, LongTensor[B', 1]
        block_step = 0
        while True:
            if block_step > 0:
                masked = view == mask_id
            if parallel:
                if block_step > 0 and not bool(masked.any()):  # the block's end: one sync a step
                    break
            elif block_step >= config.steps_per_block:
                break
            refresh = block_step == 0 or (config.cache_refresh is not None and block_step % config.cache_refresh == 0)
            if given_s is not None:
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
            if index is None:
                row_passes += masked.any(dim=1)
            else:
                row_passes.index_add_(0, index, masked.any(dim=1).to(torch.int64))

            if (commit is not None and logits is not None and commit.fallback is None
                    and logits.numel() * 8 <= COMMIT_GRAPH_MAX_BYTES):
                count = None if parallel else counts[block_step]
                view.copy_(commit.run((*commit_key, tuple(logits.shape), logits.dtype, logits.device), commit_fn,
                                      [logits, view, count]))
            else:
                if logits is not None:
                    # the mask token is never an output (else a commit would stay masked)
                    x0, confidence = sample_tokens(logits, temperature=config.temperature, top_k=config.top_k,
                                                   top_p=config.top_p, generator=gen, exclude=mask_id)
                if config.remasking == "random":
                    confidence = torch.rand(masked.shape, generator=gen, dtype=torch.float64, device=dev)
                chosen = _commit(config, confidence, masked, None if parallel else counts[block_step], ranks)
                view.copy_(torch.where(chosen, x0, view))

            if on_step is not None:
                if index is not None:
                    x[index, start:end] = view
                committed = torch.zeros(batch, length, dtype=torch.bool, device=dev)
                if index is None:
                    committed[:, start:end] = chosen
                else:
                    committed[index, start:end] = chosen
                on_step(StepEvent(step=step, block=block, tokens=x, committed=committed, prompt_length=plen))
            step += 1
            block_step += 1
        if index is not None and on_step is None:
            x[index, start:end] = view
        if eos is not None and block + 1 < config.num_blocks:
            done |= (x[:, start:end] == eos).all(dim=1)

    generated, reasons, passes = _finish(x, plen, eos, row_passes)
    return GenerateOutput(sequences=x, prompt_length=plen, generated=generated, finish_reasons=reasons,
                          forward_passes=forward_passes, steps=step, config=config.to_dict(),
                          forward_passes_per_row=passes, cache=block_fn.cache,
                          cache_fallback=cache_fallback,
                          compile_fallback=getattr(block_fn, "compile_fallback", None) if config.compile else None,
                          cuda_graph_fallback=(getattr(block_fn, "cuda_graph_fallback", None)
                                               or (commit.fallback if commit is not None else None)
                                               if config.cuda_graph else None))


def _commit(config: GenerateConfig, confidence: Tensor, masked: Tensor, count: Optional[Tensor], ranks: Tensor) -> Tensor:
    """:func:`commit_positions` under ``config.remasking`` (``count`` is used by the count rules only)."""
    if config.remasking == "threshold":
        return commit_positions(confidence, masked, threshold=config.threshold, ranks=ranks)
    if config.remasking == "factor":
        return commit_positions(confidence, masked, factor=config.factor, ranks=ranks)
    return commit_positions(confidence, masked, count=count, ranks=ranks)


#: The largest float64 copy of a step's logits (``B x block x V x 8`` bytes) whose commit step runs as a
#: graph: a graph keeps its intermediates (that copy and its softmax) in the graph pool for as long as it
#: is kept, where an eager step frees them. 256 MiB holds batch 32 x block 32 x 32,768 columns, or batch
#: 32 x block 8 of GPT-2's 50,304; larger steps are device-bound anyway, and run eager.
COMMIT_GRAPH_MAX_BYTES = 256 * 2**20

#: The remasking rules whose greedy commit step :func:`commit_graphs` replays as a CUDA graph
#: (``random`` draws its confidences from the generator, which a replay would not advance).
GRAPHED_COMMITS = ("low_confidence", "threshold", "factor")


def commit_graphs(block_fn: Any, config: GenerateConfig, *, eligible: bool) -> Any:
    """The model's graph cache for :func:`commit_step` (``GPTBlockLogits.commit_graphs``), or ``None``
    (the step runs eager): only with ``[generate] cuda_graph`` on a block function whose forward runs
    as graphs, at temperature 0 without top-k / top-p (no random draw), under :data:`GRAPHED_COMMITS`,
    and when ``eligible`` (the caller's own conditions: no ``on_step`` callback, which reads the
    step's commit mask; no guidance; not the vocabulary-parallel greedy path). A step whose logits
    exceed :data:`COMMIT_GRAPH_MAX_BYTES` as float64 commits eager even then."""
    cache = getattr(block_fn, "commit_graphs", None)
    if (cache is None or not eligible or not config.cuda_graph or config.temperature != 0
            or config.top_k is not None or config.top_p not in (None, 1.0) or config.remasking not in GRAPHED_COMMITS):
        return None
    return cache


def commit_step(config: GenerateConfig, ranks: Tensor) -> Callable[[Tensor, Tensor, Optional[Tensor]], Tensor]:
    """``(logits [B, W, V], block [B, W], count [B, 1] or None) -> block'``: the greedy step of
    :func:`generate` after the forward, as one function of tensors with no host synchronisation
    (so it can be captured): the masked positions of ``block``, the argmax and its confidence
    (:func:`sample_tokens` at temperature 0, the mask token excluded), the positions the remasking
    rule commits (:func:`commit_positions`; ``count`` for ``low_confidence``) and the block with them
    written. ``ranks`` is ``arange(W)`` (read by the graph by address; every call passes equal values)."""
    mask_id = config.mask_token_id

    def step(logits: Tensor, block: Tensor, count: Optional[Tensor]) -> Tensor:
        masked = block == mask_id
        x0, confidence = sample_tokens(logits, temperature=0.0, exclude=mask_id)
        return torch.where(_commit(config, confidence, masked, count, ranks), x0, block)

    return step


def block_logits_for(logits_fn: Any, config: GenerateConfig) -> Tuple[BlockLogitsFn, Optional[str]]:
    """The :class:`~dlmspec.backends.generate.block_cache.BlockLogitsFn` :func:`generate` runs, and
    why it runs no cache although ``config.cache`` asks for one (``None`` when it runs what is asked).

    A logits function with a ``block_logits(config)`` attribute (the megatron-core ``GPTModel``'s of
    :func:`~dlmspec.backends.generate.models.gpt_logits_fn`) builds its own (current block's logits
    only; ``config.cache``; ``config.compile``); any other runs the whole canvas each step
    (:class:`~dlmspec.backends.generate.block_cache.FullCanvas`: a Hugging Face model, a test model).
    """
    factory = getattr(logits_fn, "block_logits", None)
    if factory is not None:
        return factory(config)
    fallback = None
    if config.cache != "none":
        fallback = (f"cache = {config.cache!r} needs a megatron-core GPTModel of the runtime "
                    "(gpt_logits_fn); this logits function runs the whole canvas each step")
    return FullCanvas(logits_fn), fallback


# --------------------------------------------------------------------------------------------
# Autoregressive
# --------------------------------------------------------------------------------------------


def full_recompute(logits_fn: LogitsFn) -> ARStepFn:
    """The cache-less :class:`ARStepFn`: the whole sequence through ``logits_fn``, the last position's logits."""

    def step_fn(tokens: Tensor, attention_mask: Optional[Tensor]) -> Tensor:
        return call_logits_fn(logits_fn, tokens, attention_mask)[:, -1]

    return step_fn


@torch.no_grad()
def generate_ar(logits_fn: Optional[LogitsFn], prompts: Prompts, config: GenerateConfig, *,
                step_fn: Optional[ARStepFn] = None,
                on_step: Optional[Callable[[StepEvent], None]] = None,
                generator: Optional[torch.Generator] = None,
                device: Optional[Union[str, torch.device]] = None) -> GenerateOutput:
    """Left-to-right decoding: greedy (``temperature = 0``) or sampled (temperature, top-k, top-p).

    One token per step for every row until ``gen_length`` tokens or every row has emitted EOS;
    a finished row gets ``pad_id`` afterwards (it stays in the batch, so a KV cache keeps one
    shape). Uses ``config.gen_length``, ``temperature``, ``top_k``, ``top_p``, ``eos_token_id``,
    ``pad_token_id`` and ``seed``; the diffusion settings are ignored.

    Args:
        logits_fn: the model (:class:`LogitsFn`, logits at position ``i`` predict token ``i + 1``);
            may be ``None`` when ``step_fn`` is given.
        prompts: ``LongTensor[B, P]`` or token-id sequences (left-padded).
        config: the settings (``kind = "ar"``; an ``"mdm"`` config is refused).
        step_fn: next-token logits (:class:`ARStepFn`); default ``full_recompute(logits_fn)``.
        on_step, generator, device: as :func:`generate`.

    Returns:
        A :class:`GenerateOutput` (``forward_passes`` counts ``step_fn`` calls).

    Raises:
        ValueError: ``config.kind`` is not ``"ar"`` or neither ``logits_fn`` nor ``step_fn`` is given.
    """
    if config.kind not in objectives.kinds() or objectives.get(config.kind).diffusion:
        raise ValueError(f"kind = {config.kind!r}: generate_ar() decodes left to right; use generate() or kind = 'ar'")
    if step_fn is None:
        if logits_fn is None:
            raise ValueError("generate_ar needs logits_fn or step_fn")
        step_fn = full_recompute(logits_fn)
    eos = config.eos_token_id
    x, attn, _ = left_pad(prompts, config.pad_id, device)
    batch, plen = x.shape
    dev = x.device
    gen = _generator(config, generator, dev)
    done = torch.zeros(batch, dtype=torch.bool, device=dev)
    row_passes = torch.zeros(batch, dtype=torch.int64, device=dev)
    steps = 0
    while steps < config.gen_length and not bool(done.all()):
        row_passes += (~done).to(torch.int64)
        logits = step_fn(x, attn)
        token, _ = sample_tokens(logits, temperature=config.temperature, top_k=config.top_k,
                                 top_p=config.top_p, generator=gen)
        token = token.masked_fill(done, config.pad_id)
        x = torch.cat([x, token.unsqueeze(1)], dim=1)
        if attn is not None:
            attn = torch.cat([attn, torch.ones(batch, 1, dtype=torch.bool, device=dev)], dim=1)
        if on_step is not None:
            committed = torch.zeros_like(x, dtype=torch.bool)
            committed[:, -1] = ~done
            on_step(StepEvent(step=steps, block=0, tokens=x, committed=committed, prompt_length=plen))
        if eos is not None:
            done |= token == eos
        steps += 1
    generated, reasons, passes = _finish(x, plen, eos, row_passes)
    return GenerateOutput(sequences=x, prompt_length=plen, generated=generated, finish_reasons=reasons,
                          forward_passes=steps, steps=steps, config=config.to_dict(),
                          forward_passes_per_row=passes)
