"""CPU tests of the MDM / AR objectives (backends/megatron/objective.py)."""

import math

import pytest
import torch

from dlmspec.backends.megatron.objective import (
    AutoregressiveObjective,
    MaskedDiffusionObjective,
    build_objective,
    reduce_loss,
)

MASK = 99


def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _tokens(b, s, vocab=90, seed=1):
    return torch.randint(0, vocab, (b, s), generator=_gen(seed))


def test_noise_level_is_uniform_on_eps_one():
    eps = 0.2
    obj = MaskedDiffusionObjective(MASK, eps=eps)
    ob = obj.prepare({"tokens": _tokens(20000, 4)}, _gen())
    t = ob.mask_ratio
    assert float(t.min()) >= eps and float(t.max()) <= 1.0
    assert abs(float(t.mean()) - (1 + eps) / 2) < 0.01
    # Uniform on [eps, 1]: the CDF at the midpoint is 1/2.
    assert abs(float((t < (1 + eps) / 2).float().mean()) - 0.5) < 0.01


def test_empirical_masking_rate_matches_t():
    obj = MaskedDiffusionObjective(MASK, eps=1e-3)
    ob = obj.prepare({"tokens": _tokens(64, 8192)}, _gen(3))
    rate = ob.masked.float().mean(dim=1)
    # Binomial(8192, t) / 8192 has std <= 0.0056; 6 sigma bound for every sequence.
    assert torch.all((rate - ob.mask_ratio).abs() < 0.034)
    # Regression of the realised rate on t has slope ~1 and intercept ~0.
    t = ob.mask_ratio
    slope = float(((t - t.mean()) * (rate - rate.mean())).sum() / ((t - t.mean()) ** 2).sum())
    assert abs(slope - 1.0) < 0.02
    assert abs(float(rate.mean() - t.mean())) < 0.005


def test_masked_positions_hold_mask_id_and_labels_are_unshifted():
    tokens = _tokens(8, 64)
    ob = MaskedDiffusionObjective(MASK).prepare({"tokens": tokens}, _gen(5))
    assert torch.equal(ob.labels, tokens)
    assert torch.all(ob.input_ids[ob.masked] == MASK)
    assert torch.equal(ob.input_ids[~ob.masked], tokens[~ob.masked])
    assert ob.input_ids.dtype == torch.int64 and ob.loss_weights.dtype == torch.float32
    assert ob.num_tokens.dtype == torch.int32 and int(ob.num_tokens) == 8 * 64
    assert ob.attention_mask is None


def test_llada_weights_are_one_over_t_on_masked_tokens_only():
    ob = MaskedDiffusionObjective(MASK).prepare({"tokens": _tokens(16, 128)}, _gen(7))
    expected = ob.masked.float() / ob.mask_ratio.unsqueeze(1)
    torch.testing.assert_close(ob.loss_weights, expected)
    assert torch.all(ob.loss_weights[~ob.masked] == 0)


def test_weighted_mask_count_is_unbiased_for_sequence_length():
    # E_t[ #masked / t ] = L: the Monte-Carlo estimate of LLaDA Eq. 3 is unbiased.
    L = 64
    obj = MaskedDiffusionObjective(MASK, eps=1e-3)
    ob = obj.prepare({"tokens": _tokens(40000, L)}, _gen(11))
    ratio = ob.loss_weights.sum(dim=1).mean() / L
    assert abs(float(ratio) - 1.0) < 0.03


def test_expected_loss_equals_mean_per_token_nll():
    # With a per-token NLL that does not depend on x_t, E[loss] = mean NLL (the
    # ELBO of a model with those conditionals): the 1/t weighting undoes the
    # masking probability.
    L = 32
    nll = torch.rand(1, L, generator=_gen(2)) * 5
    ob = MaskedDiffusionObjective(MASK, eps=1e-3).prepare({"tokens": _tokens(40000, L)}, _gen(13))
    loss_sum, num_tokens, _ = reduce_loss(nll.expand(40000, L), ob)
    estimate = float(loss_sum) / int(num_tokens)
    assert abs(estimate - float(nll.mean())) / float(nll.mean()) < 0.03


def test_reduce_loss_matches_llada_reference_formula():
    b, s = 6, 50
    tokens = _tokens(b, s)
    ob = MaskedDiffusionObjective(MASK).prepare({"tokens": tokens}, _gen(17))
    ce = torch.rand(b, s, generator=_gen(4)) * 3
    loss_sum, num_tokens, report = reduce_loss(ce, ob)
    # LLaDA GUIDELINES.md pre-training loss: CE[masked] / p_mask[masked], summed, / (b * l).
    p_mask = ob.mask_ratio.unsqueeze(1).expand(b, s)
    reference = (ce[ob.masked] / p_mask[ob.masked]).sum() / (b * s)
    torch.testing.assert_close(loss_sum / num_tokens, reference)
    torch.testing.assert_close(report["lm loss"], torch.stack([loss_sum, num_tokens.float()]))


def test_only_masked_tokens_contribute_to_loss_and_gradient():
    b, s = 4, 40
    ob = MaskedDiffusionObjective(MASK).prepare({"tokens": _tokens(b, s)}, _gen(19))
    ce = torch.rand(b, s, requires_grad=True)
    loss_sum, _, _ = reduce_loss(ce, ob)
    loss_sum.backward()
    assert torch.all(ce.grad[~ob.masked] == 0)
    assert torch.all(ce.grad[ob.masked] > 0)
    poisoned = ce.detach().clone()
    poisoned[~ob.masked] = 1e6
    torch.testing.assert_close(reduce_loss(poisoned, ob)[0], loss_sum.detach())


def test_realised_weighting_normalises_each_sequence_to_its_length():
    b, s = 200, 33
    ob = MaskedDiffusionObjective(MASK, loss_weighting="realised").prepare({"tokens": _tokens(b, s)}, _gen(23))
    n_masked = ob.masked.sum(dim=1)
    sums = ob.loss_weights.sum(dim=1)
    has = n_masked > 0
    torch.testing.assert_close(sums[has], torch.full_like(sums[has], float(s)))
    assert torch.all(sums[~has] == 0)
    # Each sequence contributes the mean CE of its masked tokens.
    ce = torch.rand(b, s, generator=_gen(6))
    loss_sum, num_tokens, _ = reduce_loss(ce, ob)
    per_seq = torch.stack([ce[i][ob.masked[i]].mean() if has[i] else torch.tensor(0.0) for i in range(b)])
    torch.testing.assert_close(loss_sum / num_tokens, per_seq.sum() / b)


def test_variable_length_truncation_excludes_tail_from_loss_and_attention():
    b, s = 64, 40
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=1.0)
    ob = obj.prepare({"tokens": _tokens(b, s)}, _gen(29))
    assert ob.attention_mask is not None and ob.attention_mask.shape == (b, 1, 1, s)
    positions = torch.arange(s)
    beyond = positions.unsqueeze(0) >= ob.lengths.unsqueeze(1)
    assert torch.equal(ob.attention_mask[:, 0, 0, :], beyond)
    assert torch.all(ob.lengths >= 1) and torch.all(ob.lengths <= s)
    assert len(set(ob.lengths.tolist())) > 5  # lengths are drawn, not fixed
    assert not torch.any(ob.masked & beyond)
    assert torch.all(ob.loss_weights[beyond] == 0)
    assert int(ob.num_tokens) == int(ob.lengths.sum())
    assert torch.equal(ob.token_mask, ~beyond)


def test_variable_length_probability_is_respected():
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=0.1)
    ob = obj.prepare({"tokens": _tokens(20000, 16)}, _gen(31))
    # lengths < s only for truncated sequences (a truncated one keeps s w.p. 1/16).
    frac_short = float((ob.lengths < 16).float().mean())
    assert abs(frac_short - 0.1 * 15 / 16) < 0.01
    none = MaskedDiffusionObjective(MASK, variable_length_prob=0.0).prepare({"tokens": _tokens(64, 16)}, _gen(1))
    assert none.attention_mask is None and torch.all(none.lengths == 16)


def test_padding_from_loss_mask_is_never_masked_or_counted():
    tokens = _tokens(4, 20)
    loss_mask = torch.ones(4, 20)
    loss_mask[:, 15:] = 0
    ob = MaskedDiffusionObjective(MASK, eps=0.99).prepare({"tokens": tokens, "loss_mask": loss_mask}, _gen(1))
    assert not ob.masked[:, 15:].any()
    assert int(ob.num_tokens) == 4 * 15


def test_same_generator_state_gives_the_same_batch():
    tokens = _tokens(4, 100)
    obj = MaskedDiffusionObjective(MASK, variable_length_prob=0.5)
    a = obj.prepare({"tokens": tokens}, _gen(42))
    b = obj.prepare({"tokens": tokens}, _gen(42))
    c = obj.prepare({"tokens": tokens}, _gen(43))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_weights, b.loss_weights)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_autoregressive_shifts_labels_and_masks_last_position():
    tokens = _tokens(3, 10)
    ob = AutoregressiveObjective().prepare({"tokens": tokens})
    assert torch.equal(ob.input_ids, tokens)
    assert torch.equal(ob.labels[:, :-1], tokens[:, 1:])
    assert torch.all(ob.loss_weights[:, -1] == 0) and torch.all(ob.loss_weights[:, :-1] == 1)
    assert int(ob.num_tokens) == 3 * 9
    assert ob.attention_mask is None and ob.masked is None


def test_autoregressive_uses_dataset_labels_and_loss_mask():
    tokens = _tokens(2, 8)
    labels = _tokens(2, 8, seed=9)
    loss_mask = torch.ones(2, 8)
    loss_mask[0, 3] = 0  # e.g. eod_mask_loss at an EOD input
    ob = AutoregressiveObjective().prepare({"tokens": tokens, "labels": labels, "loss_mask": loss_mask})
    assert torch.equal(ob.labels, labels)
    assert torch.equal(ob.loss_weights, loss_mask)
    assert int(ob.num_tokens) == 15
    ce = torch.rand(2, 8)
    loss_sum, num_tokens, _ = reduce_loss(ce, ob)
    torch.testing.assert_close(loss_sum / num_tokens, (ce * loss_mask).sum() / 15)


@pytest.mark.parametrize(
    "kwargs",
    [dict(eps=1.0), dict(eps=-0.1), dict(loss_weighting="mean"), dict(variable_length_prob=1.5)],
)
def test_invalid_mdm_arguments_raise(kwargs):
    with pytest.raises(ValueError):
        MaskedDiffusionObjective(MASK, **kwargs)


def test_build_objective_and_shape_errors():
    assert isinstance(build_objective("ar"), AutoregressiveObjective)
    assert build_objective("mdm", mask_token_id=5).mask_token_id == 5
    with pytest.raises(ValueError):
        build_objective("mdm")
    with pytest.raises(ValueError):
        build_objective("bert")
    with pytest.raises(ValueError):
        MaskedDiffusionObjective(MASK).prepare({"tokens": torch.zeros(3, dtype=torch.long)}, _gen())
    ob = MaskedDiffusionObjective(MASK).prepare({"tokens": _tokens(2, 5)}, _gen())
    with pytest.raises(ValueError):
        reduce_loss(torch.zeros(2, 6), ob)
    assert math.isfinite(float(reduce_loss(torch.zeros(2, 5), ob)[0]))
