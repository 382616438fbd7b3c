"""Coupled-GRPO's (and mc-elbo's) importance ratio and KL are those of each token's conditional
probability, whatever the estimator's coefficient of that token.

The policy, the old policy and the reference below ignore their input (constant logits), so every
completion token's conditional log-probability moves by the same known amount ``delta`` from the
old policy to the policy (and ``delta_ref`` from the policy to the reference) in every view. The
ratio of every token is then ``exp(delta)`` and its k3 KL ``k3(delta_ref)``; exponentiating the
coefficient-weighted estimate instead gives ``exp(c * delta)`` with ``c`` up to ``(T+1)/2``.
"""

from __future__ import annotations

import math

import pytest
import rl_kit
import torch

from dlmspec.backends.rl import estimators
from dlmspec.backends.rl.loss import PolicyLossConfig, policy_loss
from dlmspec.backends.rl.rollout import Rollout, default_core

TOKEN = 3          #: every completion token (a digit of rl_kit's vocabulary)
SHIFTED = (TOKEN, rl_kit.EOS)


def _logits(shift: float):
    """``logits(tokens, attention=None) -> [N, S, VOCAB]``, the same row everywhere: zeros with
    ``shift`` added on :data:`SHIFTED`, so ``log p(x)`` of ``x`` in ``SHIFTED`` moves by one amount."""
    row = torch.zeros(rl_kit.VOCAB, dtype=torch.float64)
    row[list(SHIFTED)] = shift

    def fn(tokens, attention=None):
        return row.expand(tokens.shape[0], tokens.shape[1], rl_kit.VOCAB).clone().requires_grad_(False)

    return fn, torch.log_softmax(row, dim=0)[TOKEN].item()


def _completions(rows: int, length: int) -> tuple:
    """``(completion [rows, length], mask)``: rows of :data:`TOKEN` ending in EOS at varied places."""
    completion = torch.full((rows, length), TOKEN, dtype=torch.long)
    for i in range(rows):
        end = 1 + i % length
        completion[i, end - 1] = rl_kit.EOS
        completion[i, end:] = rl_kit.EOS
    mask = torch.arange(length).unsqueeze(0) <= (torch.arange(rows) % length).unsqueeze(1)
    return completion, mask


@pytest.mark.parametrize("name, options", [("coupled", {}), ("coupled", {"sampling": "time", "full_mask_pass": True}),
                                           ("mc-elbo", {"k": 3}), ("one-step", {})])
def test_estimator_scores_give_conditional_ratios_and_weights_with_the_estimate(name, options):
    est = estimators.get(name, **options)
    rows, length = 16, 8
    prompt = torch.full((rows, 3), 1, dtype=torch.long)
    completion, mask = _completions(rows, length)
    old_fn, old_lp = _logits(0.0)
    new_fn, new_lp = _logits(0.3)
    delta = new_lp - old_lp

    def run(fn, what):
        g = torch.Generator().manual_seed(11)
        call = est.score if what == "score" else est
        return call(lambda t: fn(t), prompt, completion, mask, mask_id=rl_kit.MASK, generator=g, prompt_mask_prob=0.15)

    lp_new, w_new = run(new_fn, "score")
    lp_old, w_old = run(old_fn, "score")
    assert torch.equal(w_new, w_old)                          # same draws, same coefficients
    assert torch.allclose(w_new * lp_new, run(new_fn, "call").to(lp_new.dtype), atol=1e-6)
    scored = w_new > 0
    ratio = torch.exp(lp_new - lp_old)[scored]
    assert ratio.numel() and torch.allclose(ratio, torch.full_like(ratio, math.exp(delta)), atol=1e-6)
    assert bool((w_new[~mask] == 0).all())
    if name != "mc-elbo":   # a pair (or the one view) masks every completion token: each has a weight
        assert bool(scored[mask].all())


def _rollout(rows: int, length: int) -> Rollout:
    completion, mask = _completions(rows, length)
    tokens = torch.cat([torch.full((rows, 3), 1, dtype=torch.long), completion], dim=1)
    advantages = torch.linspace(-1.0, 1.0, rows)
    return Rollout(0, tokens, None, 3, mask, advantages, torch.ones(rows, dtype=torch.bool))


def test_coupled_grpo_ratio_and_kl_equal_the_conditional_ratio_and_k3_in_the_engine():
    """Through :meth:`RolloutEngine.loss` (old and reference scored by ``score_all``): a 10 %
    conditional probability change is a ratio of 1.1 on every token (nothing clipped at eps 0.2),
    and the KL statistic is the conditional k3 (not ``k3(c * delta)``, which reached 1e5 on a GPU)."""
    cfg = rl_kit.config(algorithm="coupled-grpo", grpo_iterations=2, grpo_kl_beta=0.04, grpo_group_size=4,
                        grpo_prompts_per_step=4)
    eng = rl_kit.engine(cfg, rl_core=default_core(cfg), micro_batch_size=8)
    rollout = _rollout(16, 8)
    old_fn, old_lp = _logits(0.0)
    shift = 0.0
    for _ in range(60):  # the shift whose conditional log-ratio is log 1.1
        _, lp = _logits(shift)
        shift += (math.log(1.1) - (lp - old_lp)) * 1.5
    new_fn, new_lp = _logits(shift)
    ref_fn, ref_lp = _logits(-2.0)
    rollout.old_logp = eng.score_all(old_fn, rollout)
    rollout.ref_logp = eng.score_all(ref_fn, rollout)
    for inner in range(2):
        for k, start in enumerate(range(0, 16, 8)):
            loss, stats = eng.loss(new_fn, rollout, slice(start, start + 8), inner, k)
            assert stats["ratio_max"] == pytest.approx(1.1, rel=1e-6)
            assert stats["ratio_mean"] == pytest.approx(1.1, rel=1e-6)
            assert stats["clip_fraction"] == 0.0
            d = ref_lp - new_lp
            assert stats["kl"] == pytest.approx(math.exp(d) - d - 1.0, rel=1e-6)


def test_policy_loss_weighs_tokens_by_token_weight_outside_the_ratio():
    logp = torch.tensor([[-1.0, -0.5], [-0.2, -0.7]])
    old = torch.tensor([[-1.1, -0.5], [-0.2, -0.9]])
    ref = torch.tensor([[-0.8, -0.6], [-0.4, -0.7]])
    adv = torch.tensor([1.0, -0.5])
    mask = torch.ones(2, 2, dtype=torch.bool)
    weight = torch.tensor([[2.0, 0.5], [1.5, 0.0]])
    cfg = PolicyLossConfig(eps_low=0.2, eps_high=0.2, kl_beta=0.1)
    loss, _ = policy_loss(logp, old, adv, mask, cfg, ref_logp=ref, token_weight=weight)
    expected = 0.0
    for i in range(2):
        for t in range(2):
            r = math.exp(float(logp[i, t] - old[i, t]))
            j = min(r * float(adv[i]), min(max(r, 0.8), 1.2) * float(adv[i]))
            d = float(ref[i, t] - logp[i, t])
            expected += float(weight[i, t]) * (-j + 0.1 * (math.exp(d) - d - 1))
    assert float(loss) == pytest.approx(expected / 4, rel=1e-6)
    with pytest.raises(ValueError, match="token_weight"):
        policy_loss(logp, old, adv, mask, cfg, ref_logp=ref, token_weight=-weight)
