"""Block diffusion (``objective.kind = "bd3lm"``), compiler side: BD3-LM as Arriola et al. define
it (ICLR 2025, arXiv:2503.09573; code: kuleshov-group/bd3lms ``diffusion.py``). Runtime half:
:mod:`dlmspec.backends.megatron.objectives.bd3lm`; the mask: ``block_diffusion`` of
:mod:`dlmspec.backends.megatron.masks`; the rules: :mod:`dlmspec.check.block_diffusion`; the
design: docs/block-diffusion.md.

A sequence of ``L = train.seq_length`` tokens is cut into ``L / block_size`` blocks. Each block
``b`` draws its own noise level ``t_b ~ U(eps, 1)`` (or the clipped range ``U(noise_clip_min,
noise_clip_max)``, the paper's "clipped schedule", sec. 5.2), its tokens are masked with
probability ``1 - alpha(t_b)``, and the model reads ``x_t (+) x_0`` (``2 L`` positions, the position
ids of the two halves equal) under a three-part mask: block-diagonal within ``x_t``, offset
block-causal from ``x_t`` to ``x_0``, block-causal within ``x_0`` (eq. 8; causal within ``x_0``
when ``ar_loss_weight > 0``, Megatron-Bridge ``diffusion/common/dllm.py compute_block_mask``). The
loss is the masked tokens' cross entropy of the ``x_t`` half weighted ``-alpha'(t_b) / (1 -
alpha(t_b))`` (linear: ``1 / t_b``; eq. 7 and ``_forward_pass_diffusion``'s ``loss_scale``),
summed over the sequence and divided by its ``L`` data tokens (the NELBO per token), plus
``ar_loss_weight`` times the next-token cross entropy on the ``x_0`` half
(Megatron-Bridge ``diffusion/models/common/dgpt_step.py``'s ``ar_loss_weight``).
"""

from __future__ import annotations

from typing import Any, List, Tuple

from dlmspec.objectives.base import Objective, register
from dlmspec.objectives.schedules import MaskingSchedule, masking_schedule


def _get(objective: Any, key: str, default: Any = None) -> Any:
    value = getattr(objective, key, default)
    return default if value is None else value


def noise_range(objective: Any) -> Tuple[float, float]:
    """``(low, high)`` of the per-block noise level ``t ~ U(low, high)``: the clipped schedule
    ``(noise_clip_min, noise_clip_max)`` where set (either end alone: the other from ``(eps, 1)``),
    else ``(eps, 1)`` (bd3lms ``_sample_t``: ``t = u * (max - min) + min``)."""
    eps = float(_get(objective, "eps", 1e-3))
    return (float(_get(objective, "noise_clip_min", eps)), float(_get(objective, "noise_clip_max", 1.0)))


def attended_keys_block_diffusion(seq_length: int, block_size: int, *, clean_causal: bool = False) -> float:
    """Average keys a query of the ``2 L`` input attends under the block-diffusion mask.

    ``x_t`` block ``j`` (``B`` queries): itself and ``j`` clean blocks, ``(j + 1) B`` keys; ``x_0``
    block ``j``: ``(j + 1) B`` (block-causal) or ``i + 1`` for query ``i`` (causal). With
    ``n = L / B`` blocks the total is ``B^2 n (n + 1)`` (block-causal ``x_0``), so the mean over
    ``2 L`` queries is ``(L + B) / 2``; causal ``x_0``: ``(B^2 n (n + 1) / 2 + L (L + 1) / 2) / (2 L)``.

    Raises:
        ValueError: ``block_size`` < 1 or not dividing ``seq_length``.
    """
    L, B = int(seq_length), int(block_size)
    if B < 1 or L % B:
        raise ValueError(f"seq_length ({L}) must be a positive multiple of block_size ({B})")
    n = L // B
    noised = B * B * n * (n + 1) / 2
    clean = L * (L + 1) / 2 if clean_causal else noised
    return (noised + clean) / (2 * L)


def block_schedule(objective: Any) -> List[Tuple[int, int]]:
    """``[(step, block_size), ...]`` of ``objective.block_size_schedule``, or ``[(0, block_size)]``."""
    schedule = _get(objective, "block_size_schedule", None)
    if schedule:
        return [(int(step), int(size)) for step, size in schedule]
    block = _get(objective, "block_size", None)
    return [] if block is None else [(0, int(block))]


def block_at(schedule: List[Tuple[int, int]], step: int) -> int:
    """The block size at training step ``step`` (0-based): the size of the last entry whose step is
    at or before it (a piecewise-constant warm-up / stable / decay: the block-level WSD of the
    LLaDA 2.0 tech report, inclusionAI/LLaDA2.0 ``tech_report.pdf``).

    Raises:
        ValueError: an empty schedule, or one that does not start at step 0.
    """
    if not schedule or schedule[0][0] != 0:
        raise ValueError(f"a block-size schedule starts at step 0, got {schedule!r}")
    size = schedule[0][1]
    for start, block in schedule:
        if start <= step:
            size = block
    return size


class BlockDiffusion(Objective):
    kind = "bd3lm"
    description = "block diffusion (BD3-LM: per-block noise, x_t (+) x_0 input)"
    attention = "bidirectional"  # the layers' pattern; the x_t (+) x_0 mask arrives with each call
    attentions = ("bidirectional",)
    diffusion = True
    loss_row_fraction = 0.5
    input_bytes_per_token = 9
    predicts_next_token = False
    rl_algorithm = ""
    adjective = "block-diffusion"
    block_diffusion = True

    def extra_seq_length(self, objective: Any, seq_length: int) -> int:
        """The clean copy ``x_0``: ``seq_length`` more positions (the input is ``2 L`` long)."""
        return int(seq_length)

    def extra_positions_output(self, objective: Any) -> bool:
        """The clean half ``x_0`` reaches the output layer only with an AR loss on it: without one
        the runtime passes only the ``x_t`` half (``L`` rows) from the decoder to the output layer
        (``backends/megatron/objectives/bd3lm.py`` ``noised_half_output``; under sequence
        parallelism it keeps all ``2 L``: :func:`dlmspec.plan.shape.output_length`)."""
        return float(_get(objective, "ar_loss_weight", 0.0)) > 0

    def loss_row_fraction_of(self, objective: Any) -> float:
        """The share of the ``2 L`` output rows that carry loss: the masked ``x_t`` positions,
        ``E[1 - alpha(t)]`` over ``t ~ U(low, high)`` (linear: the mean of the range) over ``2 L``,
        plus the ``L - 1`` AR rows of ``x_0`` with ``ar_loss_weight > 0``."""
        low, high = noise_range(objective)
        masked = (low + high) / 2.0 if self.schedule(objective).is_linear else 0.5
        ar = 1.0 if float(_get(objective, "ar_loss_weight", 0.0)) > 0 else 0.0
        return (masked + ar) / 2.0

    def schedule(self, objective: Any) -> MaskingSchedule:
        return masking_schedule(_get(objective, "noise_schedule", "linear"),
                                _get(objective, "noise_schedule_exponent", None))

    def unsupervised_padding_segment(self, pad_eos_tokens: Any) -> bool:
        """SFT: no segment of its own for the unsupervised padding: it stays clean context after
        the response, and a block sees only itself and the clean blocks before it."""
        return False

    def attended_keys(self, objective: Any, seq_length: int, train_iters: int = 0) -> float:
        """Planner: mean keys per query of the ``2 * seq_length`` input
        (:func:`attended_keys_block_diffusion`); with a block-size schedule, the mean over the
        ``train_iters`` steps of each step's block (each phase weighted by its steps)."""
        causal = float(_get(objective, "ar_loss_weight", 0.0)) > 0
        schedule = block_schedule(objective) or [(0, seq_length)]
        if len(schedule) == 1 or train_iters <= 0:
            return attended_keys_block_diffusion(seq_length, schedule[0][1] if len(schedule) == 1 else seq_length,
                                                 clean_causal=causal)
        total = 0.0
        for i, (start, block) in enumerate(schedule):
            end = min(train_iters, schedule[i + 1][0] if i + 1 < len(schedule) else train_iters)
            if end > start and seq_length % block == 0:
                total += (end - start) * attended_keys_block_diffusion(seq_length, block, clean_causal=causal)
        return total / train_iters

    def runtime_options(self, objective: Any) -> List[Tuple[str, Any, str]]:
        block = _get(objective, "block_size", None)
        low, high = noise_range(objective)
        ar = float(_get(objective, "ar_loss_weight", 0.0))
        options = {"block_size": None if block is None else int(block), "noise_range": [low, high],
                   "ar_loss_weight": ar}
        if _get(objective, "block_size_schedule", None):
            options["block_size_schedule"] = [[int(s), int(b)] for s, b in block_schedule(objective)]
        schedule = self.schedule(objective)
        if schedule.name != "linear":
            options["noise_schedule"] = schedule.name
            if schedule.name == "polynomial":
                options["noise_schedule_exponent"] = float(schedule.exponent)
        return [("options", options,
                 "BD3-LM (arXiv:2503.09573): x_t (+) x_0 input of 2 x seq_length, t per block ~ U(noise_range), "
                 "loss weight -alpha'(t)/(1-alpha(t)), ar_loss_weight x next-token CE on x_0 (x_0 then causal)")]


BD3LM = register(BlockDiffusion())
