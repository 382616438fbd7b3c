"""The clipped policy-gradient objective of GRPO with asymmetric bounds and a KL penalty.

Per completion token ``t`` of row ``i`` (``A_i`` its advantage, ``log pi`` from a
:mod:`~dlmspec.backends.rl.estimators` estimator):

- ratio ``rho = exp(logp - old_logp)``;
- objective ``J = min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``
  (PPO, Schulman et al. 2017, arXiv:1707.06347, eq. 7; GRPO, Shao et al. 2024, arXiv:2402.03300,
  eq. 3; the two bounds apart, "clip-higher", DAPO, Yu et al. 2025, arXiv:2503.14476, sec. 3.1;
  DiffuCoder's trainer has ``epsilon_low`` / ``epsilon_high``);
- KL to the frozen reference, the k3 estimator ``exp(ref - logp) - (ref - logp) - 1 >= 0``
  (GRPO eq. 4; Schulman 2020, "Approximating KL Divergence"; d1 and DiffuCoder use it);
- token loss ``w * (-J + kl_beta * KL)``, ``w`` the estimator's weight of the token (``token_weight``;
  1 for ``"one-step"`` and ``"ar"``).

With a weighted estimator (``"coupled"``, ``"mc-elbo"``: an ELBO term ``c * log p(o_t | view)``
per token), ``logp`` is the token's conditional log-probability ``log p(o_t | view)`` and the
coefficient ``c`` is ``token_weight``, outside the exponential: the ratio is then a ratio of
probabilities (1 +- eps is a trust region whatever ``c``) and the KL a k3 of conditionals; at
``rho = 1`` the gradient is ``c * A * grad log p``, the ELBO's. Exponentiating ``c * log p`` instead
(DiffuCoder's reference code, with ``c`` at most 2.5 there) makes the ratio ``rho ** c`` and the k3
term ``exp(c (ref - logp))``: with dlmspec's coupled weights (up to ``(T+1)/2``) a token whose
log-probability moved a few nats gave KL values of 1e5 - 1e7 on the addition task and the run
lost accuracy (docs/rl.md).

Normalisation (how token losses become one number; ``|o_i|`` = row ``i``'s masked tokens):

- ``"token"``: ``sum_{i,t} / sum_i |o_i|`` over the whole batch (the released trainers of d1 and
  DiffuCoder: ``(loss * mask).sum() / mask.sum()``);
- ``"sequence"``: ``mean_i (sum_t / |o_i|)``, each completion weighted equally (GRPO eq. 3);
- ``"group"``: ``mean_g (sum_{i in g, t} / sum_{i in g} |o_i|)``, each prompt weighted equally,
  tokens within the group (DAPO sec. 3.3, "token-level policy gradient loss", whose sum runs over
  the G outputs of one question).

A row whose advantage is not finite (its reward failed: :func:`~dlmspec.backends.rl.advantages.group_advantages`
gives ``nan``) is left out entirely, KL included: it contributes no gradient and is counted in
``rows_dropped``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

NORMALISATIONS = ("token", "sequence", "group")

__all__ = ["NORMALISATIONS", "PolicyLossConfig", "policy_loss", "k3_kl"]


@dataclass
class PolicyLossConfig:
    """Settings of :func:`policy_loss`.

    Attributes:
        eps_low: lower clip bound ``1 - eps_low`` of the ratio, in ``[0, 1)`` (Megatron-LM
            ``grpo_clamp_eps_lower``; GRPO/d1: 0.2).
        eps_high: upper clip bound ``1 + eps_high``, ``>= 0`` (``grpo_clamp_eps_upper``; DAPO: 0.28).
        kl_beta: weight of the KL penalty, ``>= 0`` (``grpo_kl_beta``; d1: 0.04; 0: no reference).
        normalisation: ``"token"``, ``"sequence"`` or ``"group"`` (module docstring).
    """

    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_beta: float = 0.0
    normalisation: str = "token"

    def check(self) -> None:
        """Raises ``ValueError`` naming the bad setting and a value that works."""
        if not 0.0 <= self.eps_low < 1.0:
            raise ValueError(f"eps_low = {self.eps_low!r}: must be in [0, 1); use 0.2")
        if not self.eps_high >= 0.0:
            raise ValueError(f"eps_high = {self.eps_high!r}: must be >= 0; use 0.2 (or DAPO's 0.28)")
        if not self.kl_beta >= 0.0:
            raise ValueError(f"kl_beta = {self.kl_beta!r}: must be >= 0; use 0.04 (d1) or 0 (no KL)")
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation = {self.normalisation!r}: use one of {', '.join(map(repr, NORMALISATIONS))}")


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(pi || pi_ref)``: ``exp(ref - logp) - (ref - logp) - 1``
    (GRPO, arXiv:2402.03300 eq. 4), elementwise, ``>= 0``."""
    diff = ref_logp - logp
    return torch.exp(diff) - diff - 1.0


def _check_shapes(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, ref_logp: Optional[Tensor]) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp: a [N, T] tensor is needed, got shape {tuple(logp.shape)}")
    for name, value in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if value is not None and value.shape != logp.shape:
            raise ValueError(f"{name}: shape {tuple(value.shape)} != logp's {tuple(logp.shape)}")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages: shape {tuple(advantages.shape)} != [N] = [{logp.shape[0]}]")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: a bool tensor is needed (True = a completion token), got {mask.dtype}")


def policy_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: PolicyLossConfig,
                ref_logp: Optional[Tensor] = None, group_size: Optional[int] = None,
                token_weight: Optional[Tensor] = None) -> Tuple[Tensor, Dict[str, float]]:
    """The clipped, KL-penalised GRPO loss (module docstring) and its statistics.

    Args:
        logp: ``Tensor[N, T]``, the policy's per-token log-probabilities (with grad).
        old_logp: ``Tensor[N, T]``, the same under the policy that sampled the rollouts (no grad;
            on the first inner iteration ``logp.detach()``), same estimator and masks.
        advantages: ``Tensor[N]``; a non-finite entry drops its row.
        mask: ``BoolTensor[N, T]``, ``True`` = a completion token that counts.
        cfg: :class:`PolicyLossConfig`.
        ref_logp: ``Tensor[N, T]``, the frozen reference's log-probabilities; needed when
            ``cfg.kl_beta > 0`` (also used for the ``kl`` statistic when given).
        group_size: ``G``; needed for ``normalisation = "group"``.
        token_weight: ``Tensor[N, T]``, finite and ``>= 0``, each token's weight in the loss (the
            estimator's coefficient: :meth:`~dlmspec.backends.rl.estimators.MaskedEstimator.score`);
            ``None``: 1. The normalisations count tokens, not weights (the coupled and
            ``mc-elbo`` weights have expectation 1 per token).

    Returns:
        ``(loss, stats)``: the scalar loss (float32 or ``logp``'s dtype if wider) and floats:
        ``clip_fraction`` (tokens whose objective took the clipped branch, i.e. the gradient is
        zero: ``rho > 1 + eps_high`` with ``A > 0`` or ``rho < 1 - eps_low`` with ``A < 0``),
        ``clip_low_fraction``, ``clip_high_fraction``, ``kl`` (token mean of k3; 0 without a
        reference), ``ratio_mean``, ``ratio_max``, ``tokens`` and ``rows_dropped``.
        With no token left (all masked out) the loss is ``0 * logp.sum()`` (a zero with a graph).

    Raises:
        ValueError: a bad setting, shape or dtype; ``kl_beta > 0`` without ``ref_logp``;
            ``"group"`` without a ``group_size`` dividing ``N``.
    """
    cfg.check()
    _check_shapes(logp, old_logp, advantages, mask, ref_logp)
    if token_weight is not None:
        if token_weight.shape != logp.shape:
            raise ValueError(f"token_weight: shape {tuple(token_weight.shape)} != logp's {tuple(logp.shape)}")
        bad = mask & ~(torch.isfinite(token_weight) & (token_weight >= 0))
        if bool(bad.any()):
            raise ValueError("token_weight: weights must be finite and >= 0 on the tokens that count "
                             "(the estimator's coefficients)")
    if cfg.kl_beta > 0 and ref_logp is None:
        raise ValueError(f"kl_beta = {cfg.kl_beta}: the KL penalty needs ref_logp (the reference model's "
                         "log-probabilities); pass it, or set kl_beta = 0")
    rows = logp.shape[0]
    if cfg.normalisation == "group" and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                         or group_size < 1 or rows % group_size):
        raise ValueError(f"normalisation = 'group' needs group_size, a positive integer dividing N = {rows}; "
                         f"got {group_size!r}")
    dtype = torch.promote_types(logp.dtype, torch.float32)
    finite = torch.isfinite(advantages)
    keep = mask & finite.unsqueeze(1)
    weight = keep.to(dtype)
    adv = torch.where(finite, advantages, torch.zeros_like(advantages)).to(dtype).unsqueeze(1)
    log_ratio = torch.where(keep, logp.to(dtype) - old_logp.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    objective = torch.minimum(ratio * adv, clipped * adv)
    token_loss = -objective
    kl = None
    if ref_logp is not None:
        ref = torch.where(keep, ref_logp.to(dtype), logp.to(dtype).detach())
        kl = k3_kl(torch.where(keep, logp.to(dtype), logp.to(dtype).detach()), ref)
        if cfg.kl_beta > 0:
            token_loss = token_loss + cfg.kl_beta * kl
    if token_weight is not None:
        token_loss = token_loss * torch.where(keep, token_weight.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    else:
        token_loss = token_loss * weight

    tokens = weight.sum()
    if cfg.normalisation == "token":
        loss = token_loss.sum() / tokens.clamp(min=1.0)
    elif cfg.normalisation == "sequence":
        per_row = weight.sum(dim=1)
        has = per_row > 0
        row_loss = token_loss.sum(dim=1) / per_row.clamp(min=1.0)
        loss = (row_loss * has.to(dtype)).sum() / has.to(dtype).sum().clamp(min=1.0)
    else:
        group_tokens = weight.view(-1, group_size, weight.shape[1]).sum(dim=(1, 2))
        group_sum = token_loss.view(-1, group_size, weight.shape[1]).sum(dim=(1, 2))
        has = group_tokens > 0
        loss = (group_sum / group_tokens.clamp(min=1.0) * has.to(dtype)).sum() / has.to(dtype).sum().clamp(min=1.0)
    if float(tokens) == 0:
        loss = logp.sum() * 0.0

    with torch.no_grad():
        count = max(float(tokens), 1.0)
        high = (ratio > 1.0 + cfg.eps_high) & (adv > 0) & keep
        low = (ratio < 1.0 - cfg.eps_low) & (adv < 0) & keep
        stats = {
            "clip_fraction": float((high | low).sum()) / count,
            "clip_low_fraction": float(low.sum()) / count,
            "clip_high_fraction": float(high.sum()) / count,
            "kl": float((kl * weight).sum()) / count if kl is not None else 0.0,
            "ratio_mean": float((ratio * weight).sum()) / count if float(tokens) else 1.0,
            "ratio_max": float(torch.where(keep, ratio, torch.zeros_like(ratio)).max()) if float(tokens) else 1.0,
            "tokens": float(tokens),
            "rows_dropped": float((~finite).sum()),
        }
    return loss, stats
