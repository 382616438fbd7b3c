"""Each log-probability estimator's expectation against the exact ELBO of a tiny model,
enumerated over all masks of a completion of at most 6 tokens; the ELBO against the exact
any-order log-likelihood; the one-step estimator's gap, reported."""

from __future__ import annotations

import math

import pytest
import torch

from dlmspec.backends.rl import estimators
from estimator_kit import (MASK_ID, TinyBidirectional, estimator_expectation, exact_elbo_per_token, masked_log_probs,
                           order_log_likelihoods)

PROMPT = [1, 3]
CASES = [[2], [0, 4], [1, 1, 3], [4, 0, 2, 2], [3, 1, 0, 4, 2, 1]]


def _model(length: int, seed: int = 0) -> TinyBidirectional:
    return TinyBidirectional(len(PROMPT) + length, seed=seed)


@pytest.mark.parametrize("completion", CASES, ids=lambda c: f"T{len(c)}")
@pytest.mark.parametrize("name,options", [("coupled", {}), ("mc-elbo", {"k": 1}), ("mc-elbo", {"k": 3}),
                                          ("coupled", {"pairs": 2})])
def test_unbiased_estimator_expectation_equals_exact_elbo_per_token(name, options, completion):
    model = _model(len(completion))
    table = masked_log_probs(model, PROMPT, completion)
    exact = exact_elbo_per_token(table, len(completion))
    estimator = estimators.get(name, **options)
    expected = estimator_expectation(estimator, table, len(completion))
    torch.testing.assert_close(expected, exact, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("completion", CASES, ids=lambda c: f"T{len(c)}")
def test_elbo_equals_mean_order_likelihood_and_is_below_any_order_likelihood(completion):
    model = _model(len(completion), seed=1)
    table = masked_log_probs(model, PROMPT, completion)
    elbo = float(exact_elbo_per_token(table, len(completion)).sum())
    per_order = order_log_likelihoods(table, len(completion))
    # The ELBO is the average over uniformly random orders of the order's log-likelihood
    # (Ou et al. 2024, arXiv:2406.03736), hence below the log of the average likelihood (Jensen).
    assert elbo == pytest.approx(sum(per_order) / len(per_order), rel=1e-10, abs=1e-12)
    any_order = math.log(sum(math.exp(v) for v in per_order) / len(per_order))
    assert elbo <= any_order + 1e-12
    if len(completion) > 1:
        assert elbo < any_order  # the orders disagree for this model: Jensen's gap is strict


def test_one_step_gap_to_exact_elbo_is_reported(record_property, capsys):
    gaps = {}
    for completion in CASES:
        model = _model(len(completion), seed=2)
        table = masked_log_probs(model, PROMPT, completion)
        exact = float(exact_elbo_per_token(table, len(completion)).sum())
        one_step = float(estimator_expectation(estimators.get("one-step"), table, len(completion)).sum())
        # One-step scores every token with the whole completion masked: exactly the full-mask term.
        full = float(table[frozenset(range(len(completion)))].sum())
        assert one_step == pytest.approx(full, rel=1e-12)
        gaps[len(completion)] = one_step - exact
    for length, gap in gaps.items():
        record_property(f"one_step_minus_elbo_T{length}", gap)
    with capsys.disabled():
        print("\none-step estimate minus exact ELBO (nats per completion), tiny model: "
              + ", ".join(f"T={t}: {g:+.4f}" for t, g in gaps.items()))
    assert gaps[1] == pytest.approx(0.0, abs=1e-12)  # one token: the only mask is the full one
    assert any(abs(g) > 1e-3 for t, g in gaps.items() if t > 1)  # biased beyond one token


def _exact_spread(estimator, table, length):
    """Exact mean and standard deviation of one draw's sequence estimate (sum over positions)."""
    mean = second = 0.0
    for prob, views in estimator.support(length):
        value = sum(coef * float(table[frozenset(pos)][list(pos)].sum()) for pos, coef in views if pos)
        mean += prob * value
        second += prob * value * value
    return mean, math.sqrt(max(second - mean * mean, 0.0))


def _per_token_sd(estimator, table, length):
    """Exact standard deviation of one draw's estimate at each position, averaged over positions."""
    mean = torch.zeros(length, dtype=torch.float64)
    second = torch.zeros(length, dtype=torch.float64)
    for prob, views in estimator.support(length):
        value = torch.zeros(length, dtype=torch.float64)
        for pos, coef in views:
            for k in pos:
                value[k] += coef * table[frozenset(pos)][k]
        mean += prob * value
        second += prob * value * value
    return float((second - mean * mean).clamp(min=0).sqrt().mean())


def test_estimator_spread_per_forward_pass_is_reported(record_property, capsys):
    lines = []
    for completion in CASES[2:]:
        length = len(completion)
        table = masked_log_probs(_model(length, seed=2), PROMPT, completion)
        elbo = float(exact_elbo_per_token(table, length).sum())
        mean_c, sd_c = _exact_spread(estimators.get("coupled"), table, length)
        mean_m, sd_m = _exact_spread(estimators.get("mc-elbo", k=1), table, length)
        assert mean_c == pytest.approx(elbo, rel=1e-10) and mean_m == pytest.approx(elbo, rel=1e-10)
        assert sd_c > 0 and sd_m > 0
        # Two forward passes each: coupled (one pair) against mc-elbo with k = 2 (sd / sqrt(2)).
        tok_c = _per_token_sd(estimators.get("coupled"), table, length)
        tok_m = _per_token_sd(estimators.get("mc-elbo", k=1), table, length) / math.sqrt(2)
        record_property(f"coupled_sd_T{length}", sd_c)
        record_property(f"mc_elbo_k2_sd_T{length}", sd_m / math.sqrt(2))
        record_property(f"coupled_token_sd_T{length}", tok_c)
        record_property(f"mc_elbo_k2_token_sd_T{length}", tok_m)
        lines.append(f"T={length}: ELBO {elbo:.3f}; sequence sd: coupled {sd_c:.3f}, mc-elbo k=2 "
                     f"{sd_m / math.sqrt(2):.3f}; per-token sd: coupled {tok_c:.3f}, mc-elbo k=2 {tok_m:.3f}")
    with capsys.disabled():
        print("\nexact spread of one estimate (nats), tiny untrained model, two forward passes each:\n  " + "\n  ".join(lines))


@pytest.mark.parametrize("name,options", [("coupled", {}), ("mc-elbo", {"k": 2}), ("one-step", {})])
def test_sample_mean_of_estimator_calls_converges_to_its_exact_expectation(name, options):
    completion = [4, 0, 2, 2]
    model = _model(len(completion), seed=3)
    table = masked_log_probs(model, PROMPT, completion)
    estimator = estimators.get(name, **options)
    expected = estimator_expectation(estimator, table, len(completion))
    rows = 4000
    prompt = torch.tensor(PROMPT).expand(rows, -1)
    comp = torch.tensor(completion).expand(rows, -1)
    mask = torch.ones(rows, len(completion), dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        samples = estimator(model, prompt, comp, mask, mask_id=MASK_ID, generator=gen).to(torch.float64)
    mean = samples.mean(dim=0)
    stderr = samples.std(dim=0) / math.sqrt(rows)
    z = ((mean - expected).abs() / stderr.clamp(min=1e-12))
    assert bool((z < 4.5).all()), f"sample mean {mean.tolist()} vs exact {expected.tolist()} (z {z.tolist()})"


@pytest.mark.parametrize("pairs", [1, 3])
@pytest.mark.parametrize("sampling", ["count", "time"])
def test_coupled_masks_cover_every_completion_token_exactly_once_per_pair(pairs, sampling):
    gen = torch.Generator().manual_seed(5)
    valid = torch.tensor([[True] * 6, [True] * 3 + [False] * 3, [True] + [False] * 5, [True] * 5 + [False]])
    valid = valid.repeat(50, 1)
    views = estimators.get("coupled", pairs=pairs, sampling=sampling).draw(valid, gen)
    assert len(views) == 2 * pairs
    for first, second in zip(views[0::2], views[1::2]):
        count = first.masked.to(torch.int64) + second.masked.to(torch.int64)
        assert torch.equal(count, valid.to(torch.int64))  # each valid token once, padding never
    sizes = torch.stack([v.masked.sum(dim=1) for v in views[0::2]])
    if sampling == "count":
        assert int(sizes.min()) == 0 and int(sizes.max()) == 6  # l ~ U{0..T} reaches both ends


def test_estimators_leave_padding_positions_zero_and_masked():
    seen = []

    def model_fn(tokens):
        seen.append(tokens.clone())
        return torch.zeros(tokens.shape[0], tokens.shape[1], 6, dtype=torch.float64)

    prompt = torch.tensor([[1, 2]])
    comp = torch.tensor([[3, 4, 0]])
    mask = torch.tensor([[True, True, False]])
    for name in ("one-step", "coupled", "mc-elbo"):
        seen.clear()
        out = estimators.get(name)(model_fn, prompt, comp, mask, mask_id=MASK_ID,
                                   generator=torch.Generator().manual_seed(0))
        assert out[0, 2] == 0
        assert all(int(t[0, 4]) == MASK_ID for t in seen)  # the position after the end is always masked
        assert all(torch.equal(t[:, :2], prompt) for t in seen)  # prompt untouched with prompt_mask_prob 0
    assert len(seen) == estimators.get("mc-elbo").forward_passes


def test_one_step_masks_prompt_tokens_with_the_given_probability():
    seen = []

    def model_fn(tokens):
        seen.append(tokens.clone())
        return torch.zeros(tokens.shape[0], tokens.shape[1], 6)

    rows, plen = 200, 50
    prompt = torch.randint(0, 5, (rows, plen), generator=torch.Generator().manual_seed(1))
    comp = torch.zeros(rows, 2, dtype=torch.int64)
    estimators.get("one-step")(model_fn, prompt, comp, torch.ones(rows, 2, dtype=torch.bool), mask_id=MASK_ID,
                               generator=torch.Generator().manual_seed(2), prompt_mask_prob=0.15)
    share = float((seen[0][:, :plen] == MASK_ID).double().mean())
    assert share == pytest.approx(0.15, abs=0.01)  # 10,000 Bernoulli(0.15) draws: std 0.0036
    assert bool((seen[0][:, plen:] == MASK_ID).all())


def test_ar_estimator_equals_exact_next_token_log_probs_and_sums_to_the_sequence_log_likelihood():
    completion = [2, 0, 4]
    model = TinyBidirectional(len(PROMPT) + len(completion), seed=4, causal=True)
    prompt = torch.tensor([PROMPT])
    comp = torch.tensor([completion])
    with torch.no_grad():
        out = estimators.get("ar")(model, prompt, comp, torch.ones(1, 3, dtype=torch.bool), mask_id=MASK_ID,
                                   generator=torch.Generator())
    # By hand: feed the prefix, read the next token's log-softmax, one token at a time.
    total = 0.0
    for k, token in enumerate(completion):
        prefix = torch.tensor([PROMPT + completion[:k]])
        with torch.no_grad():
            logits = model(prefix)[0, -1]
        lp = float(torch.log_softmax(logits, dim=-1)[token])
        assert float(out[0, k]) == pytest.approx(lp, rel=1e-10)
        total += lp
    assert float(out.sum()) == pytest.approx(total, rel=1e-10)  # the chain rule: the sequence log-likelihood


def test_estimator_gradients_flow_to_the_model():
    completion = [1, 2, 3]
    model = _model(len(completion))
    for name in ("one-step", "coupled", "mc-elbo"):
        model.zero_grad()
        out = estimators.get(name)(model, torch.tensor([PROMPT]), torch.tensor([completion]),
                                   torch.ones(1, 3, dtype=torch.bool), mask_id=MASK_ID,
                                   generator=torch.Generator().manual_seed(0))
        out.sum().backward()
        assert model.out.grad is not None and float(model.out.grad.abs().sum()) > 0


def test_unknown_estimator_and_bad_options_name_the_remedy():
    with pytest.raises(ValueError, match="'one-step', 'coupled', 'mc-elbo', 'ar'"):
        estimators.get("spg")
    with pytest.raises(ValueError, match="k = 0"):
        estimators.get("mc-elbo", k=0)
    with pytest.raises(ValueError, match="pairs = 0"):
        estimators.get("coupled", pairs=0)
    with pytest.raises(ValueError, match="bad options"):
        estimators.get("one-step", k=2)
    assert [estimators.get(n, **o).forward_passes for n, o in
            [("one-step", {}), ("coupled", {"pairs": 2}), ("mc-elbo", {"k": 5}), ("ar", {})]] == [1, 4, 5, 1]


@pytest.mark.parametrize("completion", CASES[1:4], ids=lambda c: f"T{len(c)}")
def test_coupled_time_sampling_over_the_whole_unit_interval_is_unbiased(completion):
    table = masked_log_probs(_model(len(completion)), PROMPT, completion)
    exact = exact_elbo_per_token(table, len(completion))
    estimator = estimators.get("coupled", sampling="time", t_range=(0.0, 1.0))
    torch.testing.assert_close(estimator_expectation(estimator, table, len(completion)), exact, rtol=1e-10, atol=1e-12)


def test_diffucoder_reference_coupled_estimate_is_biased_by_its_range_and_full_mask_pass(record_property, capsys):
    completion = [3, 1, 0, 4, 2, 1]
    length = len(completion)
    table = masked_log_probs(_model(length, seed=2), PROMPT, completion)
    elbo = float(exact_elbo_per_token(table, length).sum())
    truncated = estimators.get("coupled", sampling="time", t_range=(0.2, 0.8))
    reference = estimators.get("coupled", sampling="time", t_range=(0.2, 0.8), full_mask_pass=True)
    assert reference.forward_passes == 3
    mean_truncated = float(estimator_expectation(truncated, table, length).sum())
    mean_reference = float(estimator_expectation(reference, table, length).sum())
    one_step = float(table[frozenset(range(length))].sum())
    assert mean_reference == pytest.approx(mean_truncated + one_step / 2, rel=1e-10)  # the third pass adds half
    assert abs(mean_truncated - elbo) > 1e-3  # the range (0.2, 0.8) leaves part of the ELBO out
    record_property("diffucoder_reference_minus_elbo_T6", mean_reference - elbo)
    with capsys.disabled():
        print(f"\nT=6: exact ELBO {elbo:.3f}; coupled t in (0.2, 0.8): {mean_truncated:.3f}; "
              f"with DiffuCoder's full-mask pass: {mean_reference:.3f}")


def test_sample_mean_of_diffucoder_reference_draws_converges_to_its_exact_expectation():
    completion = [4, 0, 2, 2]
    model = _model(len(completion), seed=3)
    table = masked_log_probs(model, PROMPT, completion)
    estimator = estimators.get("coupled", sampling="time", t_range=(0.2, 0.8), full_mask_pass=True)
    expected = estimator_expectation(estimator, table, len(completion))
    rows = 4000
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        samples = estimator(model, torch.tensor(PROMPT).expand(rows, -1), torch.tensor(completion).expand(rows, -1),
                            torch.ones(rows, len(completion), dtype=torch.bool), mask_id=MASK_ID,
                            generator=gen).to(torch.float64)
    z = (samples.mean(dim=0) - expected).abs() / (samples.std(dim=0) / math.sqrt(rows))
    assert bool((z < 4.5).all()), f"z {z.tolist()}"


@pytest.mark.parametrize("options,message", [({"sampling": "bernoulli"}, "sampling = 'bernoulli'"),
                                             ({"sampling": "time", "t_range": (0.8, 0.2)}, "low < high"),
                                             ({"t_range": "wide"}, "give \\(low, high\\)")])
def test_bad_coupled_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        estimators.get("coupled", **options)


@pytest.mark.parametrize("name,options", [("one-step", {}), ("coupled", {}), ("mc-elbo", {"k": 3}),
                                          ("coupled", {"sampling": "time", "full_mask_pass": True})])
def test_same_generator_state_gives_the_same_masks_so_old_and_new_policy_compare_like_with_like(name, options):
    completion = torch.tensor([[3, 1, 0, 4, 2, 1]] * 8)
    prompt = torch.tensor([PROMPT] * 8)
    mask = torch.ones(8, 6, dtype=torch.bool)
    model = _model(6)
    estimator = estimators.get(name, **options)
    seen = []

    def model_fn(tokens):
        seen.append(tokens.clone())
        return model(tokens)

    with torch.no_grad():
        first = estimator(model_fn, prompt, completion, mask, mask_id=MASK_ID,
                          generator=torch.Generator().manual_seed(11), prompt_mask_prob=0.5)
        views_first, seen[:] = list(seen), []
        second = estimator(model_fn, prompt, completion, mask, mask_id=MASK_ID,
                           generator=torch.Generator().manual_seed(11), prompt_mask_prob=0.5)
        views_second, seen[:] = list(seen), []
        other = estimator(model_fn, prompt, completion, mask, mask_id=MASK_ID,
                          generator=torch.Generator().manual_seed(12), prompt_mask_prob=0.5)
    assert torch.equal(first, second) and all(torch.equal(a, b) for a, b in zip(views_first, views_second))
    assert not all(torch.equal(a, b) for a, b in zip(views_first, seen))  # another seed, other masks
    assert not torch.equal(first, other)
    # One prompt mask per call, shared by all of the call's views.
    assert all(torch.equal(v[:, :2], views_first[0][:, :2]) for v in views_first)
