"""Attention annealing: adapting an autoregressive model to a masked-diffusion one by relaxing its
causal mask to full attention over the first ``objective.attention_anneal_iters`` training steps
(DiffuLLaMA / DiffuGPT: Gong et al. 2024, "Scaling Diffusion Language Models via Adaptation from
Autoregressive Models", arXiv:2410.17891, sec. 3.2 "attention mask annealing").

The schedule is the one of the paper's code (HKUNLP/DiffuLLaMA@c17e897,
``LLaMA-Factory/src/llamafactory/train/ddm/trainer.py``: ``attn_mask_ratio = min(1.0,
(global_step + 1) / anneal_steps)`` and ``get_anneal_attn_mask``): at 0-based training step ``k``
with ``K = attention_anneal_iters``

    r_k = min(1, (k + 1) / K),

and query ``i`` attends key ``j`` iff ``j <= i`` (the causal mask) or ``U[i, j] < r_k`` with one
``U ~ U(0, 1)^{s x s}`` drawn per micro-batch and shared by its rows and heads (the code's
``torch.bernoulli(full((s, s), r))`` OR the causal mask, expanded over the batch). From step
``K - 1`` on ``r = 1``: full (bidirectional) attention, no mask at all. ``K = 1`` is no annealing
(the DiffuLLaMA README's ``anneal_steps: 1`` for fine-tuning). Runtime half:
:func:`dlmspec.backends.megatron.masks.annealed_causal`, drawn by the ``mdm`` objective
(:meth:`~dlmspec.backends.megatron.objectives.mdm.MaskedDiffusionObjective.set_iteration`); rules:
:mod:`dlmspec.check.block_diffusion` (its ``attention-anneal-*`` rules); docs/block-diffusion.md, "Adapting an AR model".

No torch here: the planner and the rules import it.
"""

from __future__ import annotations

from typing import Optional


def anneal_ratio(iteration: int, anneal_iters: Optional[int]) -> float:
    """``r_k = min(1, (k + 1) / K)``: the probability that a key above the diagonal is attended at
    0-based training step ``k = iteration`` (1.0: full attention). ``anneal_iters`` unset or
    ``<= 1``: 1.0 at every step.

    Raises:
        ValueError: a negative ``iteration``.
    """
    if int(iteration) < 0:
        raise ValueError(f"iteration must be >= 0, got {iteration}")
    if anneal_iters is None or int(anneal_iters) <= 1:
        return 1.0
    return min(1.0, (int(iteration) + 1) / int(anneal_iters))


def annealed_steps(anneal_iters: Optional[int], train_iters: int) -> int:
    """The training steps that run with a mask (``r_k < 1``): ``min(K - 1, train_iters)``; 0 when
    unset."""
    if anneal_iters is None or int(anneal_iters) <= 1:
        return 0
    return max(0, min(int(anneal_iters) - 1, int(train_iters)))
