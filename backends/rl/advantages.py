"""Group-relative advantages of GRPO and the filter of groups whose rewards do not vary.

Rows are laid out prompt by prompt: ``N = prompts x G`` rewards, the ``G`` completions of one
prompt next to each other (row ``i`` belongs to group ``i // G``), as the sampler returns them.

A reward of ``nan`` marks a completion whose reward failed (a reward function raised, hung,
returned a non-number or crashed its worker: :class:`~dlmspec.backends.rl.rewards.RewardScores`):
it takes no part in its group's statistics and its advantage is ``nan``, which
:func:`~dlmspec.backends.rl.loss.policy_loss` reads as "no gradient from this row".

Sources:

- GRPO: Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, sec. 4.1.2 (outcome supervision):
  ``A_i = (r_i - mean(r)) / std(r)`` over the ``G`` outputs of one question. The standard
  deviation is the sample one (``ddof = 1``) and ``eps = 1e-4`` is added to it, as in the code of
  d1 (github:dllm-reasoning/d1 ``diffu-grpo/diffu_grpo_trainer.py``) and DiffuCoder
  (github:apple/ml-diffucoder ``src/open_r1/coupled_grpo.py``), both built on TRL's GRPOTrainer.
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, sec. 3
  (their "Dr. GRPO" objective): the division by ``std(r)`` removed (``scale = "none"``). d1's released trainer also
  uses ``r - mean(r)`` without the division.
- DAPO: Yu et al. 2025, arXiv:2503.14476, sec. 3.2 "dynamic sampling" (the objective's constraint
  ``0 < |{o_i correct}| < G``): groups whose rewards are all equal give every completion a zero
  advantage, hence no policy gradient, and are filtered out (:func:`varying_groups`).
"""

from __future__ import annotations

import torch
from torch import Tensor

SCALES = ("std", "none")

__all__ = ["SCALES", "group_advantages", "varying_groups", "group_view"]


def group_view(rewards: Tensor, group_size: int) -> Tensor:
    """``rewards`` ``[N]`` as ``[N // G, G]`` (one row per prompt).

    Raises:
        ValueError: ``rewards`` is not 1-D floating point, ``group_size`` is not a positive
            integer, or ``N`` is not a multiple of it.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size = {group_size!r}: the completions per prompt, an integer >= 1 (d1: 6, DiffuCoder: 10)")
    if not isinstance(rewards, Tensor) or rewards.dim() != 1 or not rewards.is_floating_point():
        shape = tuple(rewards.shape) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(f"rewards: a 1-D floating-point tensor [N] is needed, got {shape}")
    if rewards.numel() % group_size:
        raise ValueError(f"rewards: {rewards.numel()} rows is not a multiple of group_size = {group_size}; "
                         "give G completions for every prompt")
    return rewards.view(-1, group_size)


def group_advantages(rewards: Tensor, group_size: int, *, scale: str = "std", eps: float = 1e-4) -> Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_g(r)) / (std_g(r) + eps)`` (GRPO), or
    ``r_i - mean_g(r)`` with ``scale = "none"`` (Dr. GRPO).

    Args:
        rewards: ``FloatTensor[N]``, ``N = prompts x group_size``, the ``G`` completions of one prompt
            adjacent; ``nan`` where the reward failed.
        group_size: ``G``, completions per prompt.
        scale: ``"std"`` (divide by the group's sample standard deviation plus ``eps``) or ``"none"``.
        eps: added to the standard deviation, > 0 (TRL, d1 and DiffuCoder: 1e-4).

    Returns:
        ``Tensor[N]`` of ``rewards``' dtype: the advantages; ``nan`` where the reward was ``nan``.
        Mean and standard deviation are over the group's finite rewards only; a group with fewer
        than two finite rewards has standard deviation 0 (its advantages are 0).

    Raises:
        ValueError: see :func:`group_view`; an unknown ``scale``; ``eps <= 0``.
    """
    groups = group_view(rewards, group_size)
    if scale not in SCALES:
        raise ValueError(f"scale = {scale!r}: use 'std' (GRPO) or 'none' (Dr. GRPO: no division by the group's std)")
    if not eps > 0:
        raise ValueError(f"eps = {eps!r}: must be > 0; use 1e-4")
    valid = torch.isfinite(groups)
    count = valid.sum(dim=1, keepdim=True)
    filled = torch.where(valid, groups, torch.zeros_like(groups))
    mean = filled.sum(dim=1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(valid, groups - mean, torch.zeros_like(groups))
    if scale == "std":
        var = (centred ** 2).sum(dim=1, keepdim=True) / (count - 1).clamp(min=1)
        std = torch.where(count >= 2, var.sqrt(), torch.zeros_like(var))
        centred = centred / (std + eps)
    out = torch.where(valid, centred, torch.full_like(centred, float("nan")))
    return out.reshape(-1)


def varying_groups(rewards: Tensor, group_size: int) -> Tensor:
    """Which groups' rewards vary: ``BoolTensor[N // G]``, ``True`` where the group's finite
    rewards are not all equal (``max > min``), DAPO's dynamic-sampling filter (sec. 3.2). A group
    with fewer than two finite rewards does not vary.

    Raises:
        ValueError: see :func:`group_view`.
    """
    groups = group_view(rewards, group_size)
    valid = torch.isfinite(groups)
    high = torch.where(valid, groups, torch.full_like(groups, float("-inf"))).amax(dim=1)
    low = torch.where(valid, groups, torch.full_like(groups, float("inf"))).amin(dim=1)
    return (valid.sum(dim=1) >= 2) & (high > low)
