"""The clipped ratio objective with asymmetric bounds, the k3 KL penalty and the three loss
normalisations, on hand-made tensors checked against the formulas computed token by token."""

from __future__ import annotations

import math

import pytest
import torch

from dlmspec.backends.rl.loss import PolicyLossConfig, k3_kl, policy_loss


def _token_terms(logp, old, ref, adv, cfg):
    """Per-token loss by hand (Python floats): -min(r A, clip(r) A) + beta * k3."""
    out = []
    for i in range(len(logp)):
        row = []
        for t in range(len(logp[i])):
            r = math.exp(logp[i][t] - old[i][t])
            c = min(max(r, 1 - cfg.eps_low), 1 + cfg.eps_high)
            j = min(r * adv[i], c * adv[i])
            d = ref[i][t] - logp[i][t]
            row.append(-j + cfg.kl_beta * (math.exp(d) - d - 1))
        out.append(row)
    return out


LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.9], [-2.0, -0.1, -0.7], [-1.5, -1.5, -0.2]]
OLD = [[-1.4, -0.5, -1.5], [-0.3, -0.6, -1.1], [-2.2, -0.5, -0.7], [-1.0, -1.9, -0.2]]
REF = [[-1.1, -0.7, -1.9], [-0.2, -1.0, -1.0], [-2.1, -0.3, -0.5], [-1.2, -1.6, -0.4]]
ADV = [1.0, -0.5, 2.0, -1.5]
MASK = [[True, True, True], [True, True, False], [True, False, False], [True, True, True]]


def _tensors():
    f = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return f(LOGP).requires_grad_(), f(OLD), f(REF), f(ADV), torch.tensor(MASK)


@pytest.mark.parametrize("normalisation", ["token", "sequence", "group"])
@pytest.mark.parametrize("eps_low,eps_high,beta", [(0.2, 0.2, 0.0), (0.2, 0.28, 0.04), (0.1, 0.5, 0.3)])
def test_loss_equals_the_formula_token_by_token(normalisation, eps_low, eps_high, beta):
    cfg = PolicyLossConfig(eps_low=eps_low, eps_high=eps_high, kl_beta=beta, normalisation=normalisation)
    logp, old, ref, adv, mask = _tensors()
    loss, stats = policy_loss(logp, old, adv, mask, cfg, ref_logp=ref, group_size=2)
    terms = _token_terms(LOGP, OLD, REF, ADV, cfg)
    kept = [[terms[i][t] for t in range(3) if MASK[i][t]] for i in range(4)]
    if normalisation == "token":
        want = sum(map(sum, kept)) / sum(map(len, kept))
    elif normalisation == "sequence":
        want = sum(sum(k) / len(k) for k in kept) / 4
    else:
        want = sum((sum(kept[g]) + sum(kept[g + 1])) / (len(kept[g]) + len(kept[g + 1])) for g in (0, 2)) / 2
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    assert logp.grad is not None and float(logp.grad[~mask].abs().sum()) == 0.0  # no gradient off the mask


def test_asymmetric_clip_bounds_and_clip_fraction_by_hand():
    # Ratios e^0.4 = 1.49 (A > 0: clipped by eps_high = 0.28), e^-0.6 = 0.55 (A < 0: clipped by
    # eps_low = 0.2), e^0.1 = 1.105 (inside), e^0.25 = 1.284 (A > 0, just above 1.28: clipped),
    # e^-0.6 with A > 0 (below the lower bound but min() keeps the unclipped, lower, value).
    old = torch.zeros(5, 1, dtype=torch.float64)
    logp = torch.tensor([[0.4], [-0.6], [0.1], [0.25], [-0.6]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    cfg = PolicyLossConfig(eps_low=0.2, eps_high=0.28)
    loss, stats = policy_loss(logp, old, adv, torch.ones(5, 1, dtype=torch.bool), cfg)
    want = -(1.28 * 1 + 0.8 * -1 + math.exp(0.1) + 1.28 + math.exp(-0.6)) / 5
    assert loss.item() == pytest.approx(want, rel=1e-12)
    assert stats["clip_fraction"] == pytest.approx(3 / 5)
    assert stats["clip_high_fraction"] == pytest.approx(2 / 5)
    assert stats["clip_low_fraction"] == pytest.approx(1 / 5)
    loss.backward()
    # Clipped tokens give no gradient; the others d/dlogp of -(r A)/5 = -r A / 5.
    grads = logp.grad.squeeze(1).tolist()
    assert grads[0] == 0 and grads[1] == 0 and grads[3] == 0
    assert grads[2] == pytest.approx(-math.exp(0.1) / 5) and grads[4] == pytest.approx(-math.exp(-0.6) / 5)


def test_k3_kl_equals_formula_and_is_zero_only_at_equality():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.0, -1.5, -1.5], dtype=torch.float64)
    got = k3_kl(logp, ref)
    want = [math.exp(r - l) - (r - l) - 1 for l, r in zip(logp.tolist(), ref.tolist())]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))
    assert float(got[0]) == 0.0 and bool((got[1:] > 0).all())


def test_kl_statistic_is_the_token_mean_of_k3_over_the_mask():
    logp, old, ref, adv, mask = _tensors()
    _, stats = policy_loss(logp, old, adv, mask, PolicyLossConfig(kl_beta=0.1), ref_logp=ref)
    values = [math.exp(REF[i][t] - LOGP[i][t]) - (REF[i][t] - LOGP[i][t]) - 1
              for i in range(4) for t in range(3) if MASK[i][t]]
    assert stats["kl"] == pytest.approx(sum(values) / len(values), rel=1e-12)
    assert stats["tokens"] == len(values)


def test_rows_with_a_failed_reward_give_no_gradient_and_are_counted():
    logp, old, ref, adv, mask = _tensors()
    adv = adv.clone()
    adv[1] = float("nan")
    loss, stats = policy_loss(logp, old, adv, mask, PolicyLossConfig(kl_beta=0.04), ref_logp=ref)
    assert math.isfinite(loss.item()) and stats["rows_dropped"] == 1.0
    loss.backward()
    assert float(logp.grad[1].abs().sum()) == 0.0 and bool(torch.isfinite(logp.grad).all())
    # Same as the loss of the other three rows alone.
    keep = [0, 2, 3]
    logp2 = torch.tensor(LOGP, dtype=torch.float64)[keep]
    alone, _ = policy_loss(logp2, old[keep], adv[keep], mask[keep], PolicyLossConfig(kl_beta=0.04), ref_logp=ref[keep])
    assert loss.item() == pytest.approx(alone.item(), rel=1e-12)


def test_on_policy_first_iteration_gradient_is_minus_advantage_per_token():
    logp, _, _, adv, mask = _tensors()
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, PolicyLossConfig())
    loss.backward()
    tokens = int(mask.sum())
    want = torch.where(mask, -adv.unsqueeze(1) / tokens, torch.zeros_like(logp))
    torch.testing.assert_close(logp.grad, want)
    assert stats["clip_fraction"] == 0.0 and stats["ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"cfg": PolicyLossConfig(eps_low=1.0)}, "eps_low = 1.0"),
    ({"cfg": PolicyLossConfig(eps_high=-0.1)}, "eps_high = -0.1"),
    ({"cfg": PolicyLossConfig(normalisation="batch")}, "normalisation = 'batch'"),
    ({"cfg": PolicyLossConfig(kl_beta=0.1)}, "needs ref_logp"),
    ({"cfg": PolicyLossConfig(normalisation="group"), "group_size": 3}, "group_size"),
    ({"cfg": PolicyLossConfig(), "mask": torch.ones(4, 3)}, "bool"),
])
def test_bad_settings_are_refused_with_a_remedy(kwargs, message):
    logp, old, _, adv, mask = _tensors()
    args = {"cfg": PolicyLossConfig(), "mask": mask, **kwargs}
    with pytest.raises(ValueError, match=message):
        policy_loss(logp, old, adv, args["mask"], args["cfg"], group_size=kwargs.get("group_size"))


def test_sequence_and_group_means_skip_rows_and_groups_without_tokens():
    logp, old, ref, adv, mask = _tensors()
    mask = mask.clone()
    mask[2:] = False  # the second group has no token at all
    cfg = PolicyLossConfig(kl_beta=0.04, normalisation="sequence")
    terms = _token_terms(LOGP, OLD, REF, ADV, cfg)
    kept = [[terms[i][t] for t in range(3) if MASK[i][t]] for i in range(2)]
    loss, _ = policy_loss(logp, old, adv, mask, cfg, ref_logp=ref)
    assert loss.item() == pytest.approx(sum(sum(k) / len(k) for k in kept) / 2, rel=1e-12)
    cfg.normalisation = "group"
    loss, _ = policy_loss(logp, old, adv, mask, cfg, ref_logp=ref, group_size=2)
    assert loss.item() == pytest.approx(sum(map(sum, kept)) / sum(map(len, kept)), rel=1e-12)
    empty, stats = policy_loss(logp, old, adv, torch.zeros_like(mask), cfg, ref_logp=ref, group_size=2)
    assert empty.item() == 0.0 and stats["tokens"] == 0.0 and empty.requires_grad
