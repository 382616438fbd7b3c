"""Likelihoods of a trained model: the Monte-Carlo ELBO of a masked-diffusion LM, the NELBO of a
block-diffusion LM (:func:`bd3_nelbo`), AR log-likelihood, multiple-choice scoring.

A masked-diffusion LM has no exact likelihood; its ELBO bounds the negative log-likelihood:
``-log p(x) <= E_t[ 1/t * sum_{i masked in x_t} -log p(x_i | x_t) ]`` with ``t ~ U(0, 1)`` and each
token masked with probability ``t`` (MDLM, Sahoo et al. 2024, arXiv:2406.07524, its continuous-time
NELBO with the linear schedule; LLaDA, arXiv:2502.09992 Eq. 3-4). Two unbiased estimators of that bound are built here:

- ``"count"`` (the default): draw the *number* of masked tokens ``l ~ U{1..L}``, mask ``l`` of the ``L``
  target tokens uniformly without replacement, weight ``L / l`` (LLaDA Eq. 6; its
  get_log_likelihood.py). Lower variance: ``l`` is never 0 and the weight is at most ``L``.
- ``"time"``: ``t = eps + (1 - eps) u``, ``u ~ U(0, 1]``, each target token masked with probability
  ``t``, weight ``1 / t`` (Eq. 3, the training objective's estimator; ``eps`` bounds the weight,
  which has infinite variance at ``eps = 0``, at the price of an ``O(eps)`` bias).

Both have the same expectation, ``sum_{l=1..L} (1/l) E_{|M|=l}[ sum_{i in M} -log p(x_i | x_{-M}) ]``
(docs/generate.md, "Likelihood", derives it). With another masking schedule ``alpha(t)`` (the model's
``objective.noise_schedule``, :mod:`dlmspec.objectives.schedules`) ``"time"`` masks each target token
with probability ``1 - alpha(t)`` and weights by ``-alpha'(t) / (1 - alpha(t))`` (MDLM eq. 10): the same
bound (MDLM sec. 3.2: the NELBO does not depend on the schedule), another variance; ``"count"`` has no
schedule. A conditional likelihood masks only the
continuation; the context is always given. Every draw comes from the ``torch.Generator`` passed in,
in a fixed order, so a result is reproducible from its seed. Plain torch; runs on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from dlmspec import objectives
from dlmspec.backends.generate.sampler import LogitsFn, call_logits_fn
from dlmspec.objectives.schedules import MaskingSchedule

ESTIMATORS = ("count", "time")
#: LLaDA's Monte-Carlo sample count (get_log_likelihood.py ``mc_num``) and forward batch (``batch_size``).
DEFAULT_NUM_SAMPLES = 128
DEFAULT_SAMPLES_PER_FORWARD = 16


@dataclass
class ELBOResult:
    """Monte-Carlo estimate of the ELBO bound on ``-log p(target | context)``, one per row.

    Attributes:
        nll: ``Float64Tensor[B]``, the mean of the samples: nats per sequence (a bound on the NLL).
        stderr: ``Float64Tensor[B]``, its standard error ``std / sqrt(num_samples)`` (``ddof = 1``).
        num_tokens: ``LongTensor[B]``, target tokens ``L`` of each row.
        samples: ``Float64Tensor[num_samples, B]``, the single-sample estimates.
        estimator: ``"count"`` or ``"time"``.
        eps: the ``"time"`` estimator's lower bound of ``t`` (recorded for both).
    """

    nll: Tensor
    stderr: Tensor
    num_tokens: Tensor
    samples: Tensor
    estimator: str
    eps: float

    @property
    def num_samples(self) -> int:
        """Monte-Carlo samples per row."""
        return int(self.samples.shape[0])

    @property
    def nll_per_token(self) -> Tensor:
        """``nll / num_tokens``, nats per token, ``[B]``."""
        return self.nll / self.num_tokens

    @property
    def stderr_per_token(self) -> Tensor:
        """``stderr / num_tokens``, ``[B]``."""
        return self.stderr / self.num_tokens

    def total(self) -> Dict[str, float]:
        """All rows together: NLL per token ``sum(nll) / sum(L)``, its standard error (rows'
        samples are independent: ``sqrt(sum stderr^2) / sum(L)``) and the perplexity bound ``exp``."""
        tokens = float(self.num_tokens.sum())
        per_token = float(self.nll.sum()) / tokens
        return {
            "nll_per_token": per_token,
            "stderr_per_token": math.sqrt(float((self.stderr ** 2).sum())) / tokens,
            "perplexity_bound": math.exp(per_token),
            "num_tokens": int(tokens),
            "num_sequences": int(self.nll.shape[0]),
            "num_samples": self.num_samples,
            "estimator": self.estimator,
            "eps": self.eps,
        }


def merge_elbo_results(results: Sequence[ELBOResult]) -> ELBOResult:
    """The rows of several :class:`ELBOResult` as one (a dataset scored batch by batch), so that
    :meth:`ELBOResult.total` covers them all.

    Raises:
        ValueError: no result, or results of different estimators, ``eps`` or sample counts.
    """
    if not results:
        raise ValueError("merge_elbo_results: no result given")
    first = results[0]
    for r in results[1:]:
        if (r.estimator, r.eps, r.num_samples) != (first.estimator, first.eps, first.num_samples):
            raise ValueError(
                f"merge_elbo_results: results of {r.estimator!r} (eps {r.eps}, {r.num_samples} samples) and "
                f"{first.estimator!r} (eps {first.eps}, {first.num_samples} samples) do not merge; score all with one setting"
            )
    return ELBOResult(nll=torch.cat([r.nll for r in results]), stderr=torch.cat([r.stderr for r in results]),
                      num_tokens=torch.cat([r.num_tokens for r in results]),
                      samples=torch.cat([r.samples for r in results], dim=1), estimator=first.estimator, eps=first.eps)


#: Rows of logits cast to float64 at once by :func:`masked_cross_entropy` (at a 126k vocabulary,
#: 4,096 rows are 4 GiB in float64; a whole [16 x 8 x 512, V] batch would be 60 GiB).
CE_ROWS_PER_CHUNK = 4096


def masked_cross_entropy(logits: Tensor, targets: Tensor, masked: Tensor, *,
                         rows_per_chunk: int = CE_ROWS_PER_CHUNK) -> Tensor:
    """Per-position cross entropy in float64 at the ``masked`` positions, 0 elsewhere.

    Args:
        logits: ``[..., V]`` (any float dtype). targets: ``[...]`` token ids. masked: ``[...]`` bool.
        rows_per_chunk: masked rows cast to float64 at a time: the result does not depend on it (each
            row's cross entropy is computed alone), only the peak memory does.

    Returns:
        ``[...]`` float64: ``-log softmax(logits)[target]`` where ``masked``, else 0.
    """
    ce = torch.zeros(masked.shape, dtype=torch.float64, device=logits.device)
    index = masked.nonzero(as_tuple=True)
    rows = index[0].numel()
    flat = torch.empty(rows, dtype=torch.float64, device=logits.device)
    for lo in range(0, rows, rows_per_chunk):
        part = tuple(i[lo:lo + rows_per_chunk] for i in index)
        flat[lo:lo + rows_per_chunk] = F.cross_entropy(logits[part].to(torch.float64), targets[part], reduction="none")
    ce[index] = flat
    return ce


def _check_inputs(tokens: Tensor, target_mask: Optional[Tensor], attention_mask: Optional[Tensor]) -> Tensor:
    if tokens.dim() != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"tokens: an integer [batch, length] tensor, got {tokens.dtype} of shape {tuple(tokens.shape)}")
    if target_mask is None:
        target_mask = torch.ones_like(tokens, dtype=torch.bool)
    if target_mask.shape != tokens.shape:
        raise ValueError(f"target_mask: shape {tuple(target_mask.shape)} != tokens' {tuple(tokens.shape)}")
    if attention_mask is not None:
        if attention_mask.shape != tokens.shape:
            raise ValueError(f"attention_mask: shape {tuple(attention_mask.shape)} != tokens' {tuple(tokens.shape)}")
        target_mask = target_mask & attention_mask.bool()
    return target_mask.bool()


@torch.no_grad()
def elbo_nll(logits_fn: LogitsFn, tokens: Tensor, *, mask_token_id: int, generator: torch.Generator,
             target_mask: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
             estimator: str = "count", num_samples: int = DEFAULT_NUM_SAMPLES,
             samples_per_forward: int = DEFAULT_SAMPLES_PER_FORWARD, eps: float = 1e-3,
             schedule: Optional[MaskingSchedule] = None) -> ELBOResult:
    """Monte-Carlo ELBO bound on ``-log p(x[target] | x[~target])`` of a masked-diffusion LM, per row.

    Each sample masks some target positions of every row (the estimator's draw, see the module
    docstring), runs ``logits_fn`` once on the noised batch and sums the weighted cross entropy at
    the masked positions. ``samples_per_forward`` samples run in one call (the batch repeated,
    ``[k * B, S]``), as LLaDA's ``batch_size``. Draws per sample, in this order, from ``generator``:
    ``u`` ``[B]`` float64, then the per-position uniforms ``[B, S]`` float64; so the samples do not
    depend on ``samples_per_forward`` (a memory setting).

    Args:
        logits_fn: the model (:class:`~dlmspec.backends.generate.sampler.LogitsFn`), bidirectional.
        tokens: ``LongTensor[B, S]``, the clean sequences.
        mask_token_id: the model's mask token.
        generator: the random source, on ``tokens.device``.
        target_mask: ``BoolTensor[B, S]``, the positions whose likelihood is estimated (the
            continuation); the others are context and never masked. Default: every position.
        attention_mask: ``BoolTensor[B, S]`` key-padding mask (``True`` = real), handed to
            ``logits_fn``; padding is never a target.
        estimator: ``"count"`` (LLaDA Eq. 6, the default) or ``"time"`` (Eq. 3).
        num_samples: Monte-Carlo samples per row, >= 2 (LLaDA: 128).
        samples_per_forward: samples per ``logits_fn`` call, >= 1 (LLaDA: 16).
        eps: ``"time"``: lower bound of ``t``, in ``[0, 1)`` (the training default 1e-3).
        schedule: ``"time"``: the model's masking schedule ``alpha(t)``
            (:mod:`dlmspec.objectives.schedules`; its objective's registration gives it): each target
            token is masked with probability ``1 - alpha(t)`` and the sample weighted by
            ``-alpha'(t) / (1 - alpha(t))`` (MDLM eq. 10); ``None`` or linear: ``t`` and ``1 / t`` as
            before. The bound's value does not depend on it (MDLM sec. 3.2), its variance does.
            ``"count"`` draws the number of masked tokens and has no schedule.

    Returns:
        An :class:`ELBOResult`.

    Raises:
        ValueError: a bad argument (named, with a value that works) or a row without a target.
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator = {estimator!r}: use one of {', '.join(map(repr, ESTIMATORS))}")
    if not isinstance(num_samples, int) or num_samples < 2:
        raise ValueError(f"num_samples = {num_samples!r}: a standard error needs >= 2 samples; use 128 (LLaDA's)")
    if not isinstance(samples_per_forward, int) or samples_per_forward < 1:
        raise ValueError(f"samples_per_forward = {samples_per_forward!r}: use 16 (LLaDA's) or 1")
    if not 0.0 <= eps < 1.0:
        raise ValueError(f"eps = {eps!r}: must be in [0, 1); use 1e-3")
    target = _check_inputs(tokens, target_mask, attention_mask)
    lengths = target.sum(dim=1)
    if bool((lengths == 0).any()):
        row = int((lengths == 0).nonzero()[0, 0])
        raise ValueError(f"row {row} has no target position; give each row at least one token to score")
    batch, seq = tokens.shape
    dev = tokens.device
    tokens = tokens.to(torch.int64)
    samples: List[Tensor] = []
    done = 0
    while done < num_samples:
        k = min(samples_per_forward, num_samples - done)
        us, ds = [], []
        for _ in range(k):  # sample by sample, so that samples_per_forward changes no draw
            us.append(torch.rand(batch, generator=generator, dtype=torch.float64, device=dev))
            ds.append(torch.rand(batch, seq, generator=generator, dtype=torch.float64, device=dev))
        u, draws = torch.stack(us), torch.stack(ds)  # [k, B], [k, B, S]
        big_l = lengths.to(torch.float64).unsqueeze(0)  # [1, B]
        if estimator == "time":
            t = eps + (1.0 - eps) * (1.0 - u)  # (eps, 1]: never 0
            if schedule is None or schedule.is_linear:
                masked = (draws < t.unsqueeze(-1)) & target
                weight = 1.0 / t
            else:
                p_mask = schedule.mask_probability(t, torch).clamp(0.0, 1.0)
                masked = (draws < p_mask.unsqueeze(-1)) & target
                weight = schedule.weight(t, torch)
        else:
            count = torch.minimum(torch.floor(u * big_l) + 1.0, big_l)  # U{1..L}
            scores = draws.masked_fill(~target, 2.0)  # context and padding sort last
            rank = scores.argsort(dim=-1).argsort(dim=-1)
            masked = rank < count.unsqueeze(-1)
            weight = big_l / count
        noised = torch.where(masked, torch.full_like(tokens, mask_token_id), tokens.unsqueeze(0).expand(k, -1, -1))
        attn = None if attention_mask is None else attention_mask.bool().unsqueeze(0).expand(k, -1, -1).reshape(k * batch, seq)
        logits = call_logits_fn(logits_fn, noised.reshape(k * batch, seq), attn).reshape(k, batch, seq, -1)
        ce = masked_cross_entropy(logits, tokens.unsqueeze(0).expand(k, -1, -1), masked)
        samples.append(ce.sum(dim=-1) * weight)
        done += k
    stacked = torch.cat(samples, dim=0)  # [num_samples, B]
    return ELBOResult(nll=stacked.mean(dim=0), stderr=stacked.std(dim=0, unbiased=True) / math.sqrt(num_samples),
                      num_tokens=lengths, samples=stacked, estimator=estimator, eps=float(eps))


#: ``forward(input_ids [N, 2L], position_ids [N, 2L], attention_mask) -> logits [N, 2L, V]``: a model run
#: on block diffusion's ``x_t (+) x_0`` input under the mask object
#: :func:`dlmspec.backends.megatron.masks.block_diffusion` (its training form).
BlockForwardFn = Callable[[Tensor, Tensor, Any], Tensor]


@torch.no_grad()
def bd3_nelbo(forward: BlockForwardFn, tokens: Tensor, *, block_size: int, mask_token_id: int,
              generator: torch.Generator, target_mask: Optional[Tensor] = None,
              num_samples: int = DEFAULT_NUM_SAMPLES, samples_per_forward: int = DEFAULT_SAMPLES_PER_FORWARD,
              noise_range: Tuple[float, float] = (1e-3, 1.0), schedule: Optional[MaskingSchedule] = None) -> ELBOResult:
    """Monte-Carlo NELBO of a block-diffusion LM (BD3-LM, Arriola et al. 2025, arXiv:2503.09573 eq. 7),
    per row, with its standard error.

    ``-log p(x) <= sum_b E_{t_b} E_{x_t^b}[ w(t_b) sum_{i in block b masked} -log p(x_i | x_t^b, x^{<b}) ]``:
    each block ``b`` draws its own ``t_b = low + (high - low) u_b`` and masks each target token with
    probability ``1 - alpha(t_b)``, weight ``w = -alpha'(t) / (1 - alpha(t))`` (linear: ``t`` and
    ``1/t``); one sample noises every block at once and runs the model once on ``x_t (+) x_0`` under
    the block-diffusion mask, which makes each block's term condition on the clean blocks before it
    only (bd3lms ``_loss`` in evaluation: ``(low, high) = (1e-3, 1)``, an ``O(eps)`` bias; ``(1, 1)``
    there is its AR check, not offered here). Draws per sample, in this order: ``u`` ``[B, n]``
    float64, then the per-position uniforms ``[B, L]`` float64; ``samples_per_forward`` changes no draw.

    Args:
        forward: :data:`BlockForwardFn` (a megatron ``GPTModel`` with the repeated RoPE of
            ``backends/megatron/objectives/bd3lm.py``, or any model taking the mask object).
        tokens: ``LongTensor[B, L]`` clean ids, ``L`` a multiple of ``block_size``.
        block_size: the model's training block.
        mask_token_id: its mask id.
        generator: the random source on ``tokens.device``.
        target_mask: ``BoolTensor[B, L]``: the scored positions (the others are context, never
            masked). Default: all.
        num_samples: samples per row, >= 2. samples_per_forward: >= 1.
        noise_range: ``(low, high)``, ``0 <= low < high <= 1``.
        schedule: ``alpha(t)``; ``None``: linear.

    Returns:
        :class:`ELBOResult` with ``estimator = "bd3"`` and ``eps = low``.

    Raises:
        ValueError: a bad argument, ``L`` not a multiple of ``block_size``, or a row without a target.
    """
    from dlmspec.backends.megatron.masks import block_diffusion

    if not isinstance(num_samples, int) or num_samples < 2:
        raise ValueError(f"num_samples = {num_samples!r}: a standard error needs >= 2 samples; use 128")
    if not isinstance(samples_per_forward, int) or samples_per_forward < 1:
        raise ValueError(f"samples_per_forward = {samples_per_forward!r}: use 16 or 1")
    low, high = (float(x) for x in noise_range)
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"noise_range = {tuple(noise_range)!r}: needs 0 <= low < high <= 1; use (1e-3, 1.0)")
    target = _check_inputs(tokens, target_mask, None)
    batch, seq = tokens.shape
    if isinstance(block_size, bool) or int(block_size) < 1 or seq % int(block_size):
        raise ValueError(f"block_size = {block_size!r}: must divide the sequence length {seq}")
    lengths = target.sum(dim=1)
    if bool((lengths == 0).any()):
        row = int((lengths == 0).nonzero()[0, 0])
        raise ValueError(f"row {row} has no target position; give each row at least one token to score")
    bs, dev = int(block_size), tokens.device
    n = seq // bs
    tokens = tokens.to(torch.int64)
    mask = block_diffusion(seq, bs)
    positions = torch.arange(seq, device=dev).repeat(2)
    samples: List[Tensor] = []
    done = 0
    while done < num_samples:
        k = min(samples_per_forward, num_samples - done)
        us, ds = [], []
        for _ in range(k):
            us.append(torch.rand(batch, n, generator=generator, dtype=torch.float64, device=dev))
            ds.append(torch.rand(batch, seq, generator=generator, dtype=torch.float64, device=dev))
        t = (low + (high - low) * torch.stack(us)).repeat_interleave(bs, dim=-1)  # [k, B, L]
        draws = torch.stack(ds)
        if schedule is None or schedule.is_linear:
            p_mask, weight = t, 1.0 / t.clamp(min=1e-300)
        else:
            p_mask, weight = schedule.mask_probability(t, torch).clamp(0.0, 1.0), schedule.weight(t, torch)
        masked = (draws < p_mask) & target
        clean = tokens.unsqueeze(0).expand(k, -1, -1)
        noised = torch.where(masked, torch.full_like(clean, mask_token_id), clean)
        inputs = torch.cat([noised, clean], dim=-1).reshape(k * batch, 2 * seq)
        logits = forward(inputs, positions.unsqueeze(0).expand(k * batch, -1), mask)
        logits = logits.reshape(k, batch, 2 * seq, -1)[:, :, :seq]
        ce = masked_cross_entropy(logits, clean, masked)
        samples.append((ce * torch.where(masked, weight, torch.zeros_like(weight))).sum(dim=-1))
        done += k
    stacked = torch.cat(samples, dim=0)
    return ELBOResult(nll=stacked.mean(dim=0), stderr=stacked.std(dim=0, unbiased=True) / math.sqrt(num_samples),
                      num_tokens=lengths, samples=stacked, estimator="bd3", eps=low)


@dataclass
class ARResult:
    """Exact negative log-likelihood of an AR model, per row.

    Attributes:
        nll: ``Float64Tensor[B]``, nats per sequence (over its target tokens).
        num_tokens: ``LongTensor[B]``, target tokens per row.
    """

    nll: Tensor
    num_tokens: Tensor

    @property
    def nll_per_token(self) -> Tensor:
        """``nll / num_tokens``, ``[B]``."""
        return self.nll / self.num_tokens

    def total(self) -> Dict[str, float]:
        """All rows together: NLL per token and perplexity ``exp(sum nll / sum tokens)``."""
        tokens = float(self.num_tokens.sum())
        per_token = float(self.nll.sum()) / tokens
        return {"nll_per_token": per_token, "perplexity": math.exp(per_token), "num_tokens": int(tokens),
                "num_sequences": int(self.nll.shape[0])}


@torch.no_grad()
def ar_nll(logits_fn: LogitsFn, tokens: Tensor, *, target_mask: Optional[Tensor] = None,
           attention_mask: Optional[Tensor] = None) -> ARResult:
    """``-log p(x[target] | the tokens before each)`` of an AR (causal) model, exact: one forward pass.

    The logits at position ``i`` predict token ``i + 1``. Position 0 has nothing before it and
    is never a target (the default ``target_mask`` is every position but the first).

    Args:
        logits_fn: the model (causal).
        tokens: ``LongTensor[B, S]``, ``S >= 2``.
        target_mask: ``BoolTensor[B, S]``, the positions scored (a continuation); column 0 must be False.
        attention_mask: ``BoolTensor[B, S]`` key-padding mask (``True`` = real).

    Returns:
        An :class:`ARResult`.

    Raises:
        ValueError: bad shapes, a target at column 0, or a row without a target.
    """
    if target_mask is None:
        target_mask = torch.ones_like(tokens, dtype=torch.bool)
        target_mask[:, 0] = False
    target = _check_inputs(tokens, target_mask, attention_mask)
    if tokens.shape[1] < 2:
        raise ValueError(f"tokens: an AR model needs >= 2 positions to score one, got {tokens.shape[1]}")
    if bool(target[:, 0].any()):
        raise ValueError("target_mask: column 0 has no token before it; prepend a BOS token to score the first token")
    lengths = target.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError(f"row {int((lengths == 0).nonzero()[0, 0])} has no target position")
    logits = call_logits_fn(logits_fn, tokens.to(torch.int64), attention_mask)
    # float64 a chunk of rows at a time (masked_cross_entropy), not the whole [B, S, V]: B x S x V x 8 bytes,
    # twice over with the cast (1.6 GB each for 8 windows of 512 at GPT-2's vocabulary, 4.1 GB at a 126k one)
    nll = masked_cross_entropy(logits[:, :-1], tokens[:, 1:].to(torch.int64), target[:, 1:]).sum(dim=1)
    return ARResult(nll=nll, num_tokens=lengths)


def continuation_nll(logits_fn: LogitsFn, context: Sequence[int], continuation: Sequence[int], *, kind: str,
                     mask_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                     device: Optional[torch.device] = None, **elbo_kwargs: Any) -> Tuple[float, float, int]:
    """``-log p(continuation | context)`` in nats: the ELBO bound for ``kind = "mdm"``, exact for ``"ar"``.

    Args:
        logits_fn: the model.
        context: token ids given (for ``"ar"`` at least one: BOS).
        continuation: token ids scored (at least one).
        kind: ``"mdm"`` or ``"ar"``.
        mask_token_id, generator: required for ``"mdm"``.
        device: where the tokens go (default CPU).
        elbo_kwargs: ``estimator``, ``num_samples``, ``samples_per_forward``, ``eps``, ``schedule`` of
            :func:`elbo_nll`.

    Returns:
        ``(nll, stderr, num_tokens)``; ``stderr`` is 0 for ``"ar"``.
    """
    if len(continuation) == 0:
        raise ValueError("continuation: empty; give at least one token to score")
    seq = torch.tensor([list(context) + list(continuation)], dtype=torch.int64, device=device)
    target = torch.zeros_like(seq, dtype=torch.bool)
    target[0, len(context):] = True
    if kind not in objectives.kinds():
        raise ValueError(f"kind = {kind!r}: use 'mdm' or 'ar'")
    if not objectives.get(kind).diffusion:
        if len(context) == 0:
            raise ValueError("context: an AR model scores a continuation after at least one token; prepend BOS")
        res = ar_nll(logits_fn, seq, target_mask=target)
        return float(res.nll[0]), 0.0, len(continuation)
    if mask_token_id is None or generator is None:
        raise ValueError("kind = 'mdm' needs mask_token_id and generator")
    res = elbo_nll(logits_fn, seq, mask_token_id=mask_token_id, generator=generator, target_mask=target, **elbo_kwargs)
    return float(res.nll[0]), float(res.stderr[0]), len(continuation)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> Tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927; Brown, Cai & DasGupta 2001).

    Args:
        successes: ``0 <= successes <= n``.
        n: trials, >= 1.
        z: the normal quantile (default: 95 % two-sided).

    Returns:
        ``(low, high)`` within ``[0, 1]``.
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class MultipleChoiceResult:
    """Multiple-choice scoring of items ``{"context", "choices", "label"}``.

    Attributes:
        predictions: per item, the index of the chosen choice (lowest NLL; ties: the first).
        labels: per item, the correct index.
        nll: per item, per choice, the score compared (nats; per token when ``normalize = "mean"``).
        stderr: the same shape, its Monte-Carlo standard error (0 for AR).
        accuracy: fraction of items with ``prediction == label``.
        interval: the Wilson 95 % interval of the accuracy.
        normalize: ``"sum"`` (lm-eval's ``acc``) or ``"mean"`` (per continuation token).
    """

    predictions: List[int]
    labels: List[int]
    nll: List[List[float]]
    stderr: List[List[float]]
    accuracy: float
    interval: Tuple[float, float]
    normalize: str

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready values."""
        return {"accuracy": self.accuracy, "interval_95": list(self.interval), "n": len(self.labels),
                "interval_method": "wilson", "normalize": self.normalize, "predictions": self.predictions,
                "labels": self.labels, "nll": self.nll, "stderr": self.stderr}


def split_pair(encode: Callable[[str], List[int]], context: str, continuation: str) -> Tuple[List[int], List[int]]:
    """``(context ids, continuation ids)`` of a text pair, as lm-eval HFLM's and LLaDA's
    ``_encode_pair``: trailing spaces of the context move to the continuation, and the continuation
    is ``encode(context + continuation)`` after ``encode(context)`` (so a word keeps its leading
    space and a merge across the boundary is the tokenizer's own). ``dlmspec eval --choices`` and
    the lm-eval model both split this way, so they score the same tokens."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation = context[-spaces:] + continuation
        context = context[:-spaces]
    ctx = encode(context) if context else []
    whole = encode(context + continuation)
    return list(ctx), list(whole[len(ctx):])


def multiple_choice(logits_fn: LogitsFn, items: Iterable[Mapping[str, Any]], *, kind: str,
                    mask_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                    seed: Optional[int] = None, normalize: str = "sum", device: Optional[torch.device] = None,
                    on_item: Optional[Callable[[int], None]] = None, **elbo_kwargs: Any) -> MultipleChoiceResult:
    """Conditional-likelihood multiple choice: each choice scored as ``-log p(choice | context)``.

    Args:
        logits_fn: the model.
        items: mappings with ``"context"`` (token ids), ``"choices"`` (a list of token-id lists, at
            least 2) and ``"label"`` (the correct index), as tokenized from an ``eval --choices`` JSONL file.
        kind: ``"mdm"`` (ELBO, :func:`elbo_nll`) or ``"ar"`` (exact).
        mask_token_id, generator: for ``"mdm"``; the generator is drawn from item by item, choice by choice.
        seed: for ``"mdm"``, instead of ``generator``: every choice is scored with a new generator
            seeded with ``seed`` (on ``device``), the lm-eval model's rule (``DlmspecLM.score``): a
            choice's number does not depend on the items before it, and the choices of an item share
            random numbers (a lower-variance difference between them).
        normalize: ``"sum"`` compares total NLL (lm-eval ``acc``); ``"mean"`` per token.
        device: where the tokens go.
        on_item: called with each item's index after it is scored (a progress bar's hook).
        elbo_kwargs: ``estimator``, ``num_samples``, ``samples_per_forward``, ``eps``.

    Returns:
        A :class:`MultipleChoiceResult`.

    Raises:
        ValueError: an item without a key, with fewer than 2 choices or a label out of range
            (naming the item's index and the key), no items, or a bad ``normalize``.
    """
    if normalize not in ("sum", "mean"):
        raise ValueError(f"normalize = {normalize!r}: use 'sum' (lm-eval acc) or 'mean' (per token)")
    predictions, labels, all_nll, all_se = [], [], [], []
    for index, item in enumerate(items):
        for key in ("context", "choices", "label"):
            if key not in item:
                raise ValueError(f"item {index}: no {key!r}; an item is {{\"context\", \"choices\", \"label\"}}")
        choices = list(item["choices"])
        label = item["label"]
        if len(choices) < 2:
            raise ValueError(f"item {index}: 'choices' has {len(choices)}; give at least 2")
        if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(choices):
            raise ValueError(f"item {index}: 'label' = {label!r}; use an index in 0..{len(choices) - 1}")
        scores, errors = [], []
        for choice in choices:
            gen = generator
            if seed is not None and kind in objectives.kinds() and objectives.get(kind).diffusion:
                gen = torch.Generator(device=device if device is not None else "cpu").manual_seed(seed)
            nll, se, n = continuation_nll(logits_fn, item["context"], choice, kind=kind, mask_token_id=mask_token_id,
                                          generator=gen, device=device, **elbo_kwargs)
            div = n if normalize == "mean" else 1
            scores.append(nll / div)
            errors.append(se / div)
        predictions.append(min(range(len(scores)), key=lambda i: scores[i]))
        labels.append(label)
        all_nll.append(scores)
        all_se.append(errors)
        if on_item is not None:
            on_item(index)
    if not labels:
        raise ValueError("items: none given; give at least one {\"context\", \"choices\", \"label\"}")
    correct = sum(int(p == y) for p, y in zip(predictions, labels))
    return MultipleChoiceResult(predictions=predictions, labels=labels, nll=all_nll, stderr=all_se,
                                accuracy=correct / len(labels), interval=wilson_interval(correct, len(labels)),
                                normalize=normalize)
