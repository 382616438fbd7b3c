"""CPU tests of the likelihood estimators (backends/generate/likelihood.py), against enumeration.

The models are small enough (3 tokens, sequences of 3 or 4) for the exact values: the bound by
enumerating every mask (``exact_elbo``) and the true NLL by summing the joint (``exact_nll``).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dlmspec.backends.generate.likelihood import (
    ar_nll,
    continuation_nll,
    elbo_nll,
    merge_elbo_results,
    multiple_choice,
    wilson_interval,
)
from tiny_lm import ExactJoint, TinyTransformer, exact_elbo, exact_nll

V = 3  # text tokens 0..2; the mask is 3


def _gen(seed):
    return torch.Generator().manual_seed(seed)


class NoMaskOutput:
    """A random bidirectional model whose predictions exclude the mask token: its conditionals
    belong to no joint distribution, so its bound is not tight."""

    mask_id = V

    def __init__(self, seed=0):
        self.net = TinyTransformer(V + 1, seed=seed)
        self.net.out = self.net.out * 0.5

    def __call__(self, tokens, attention_mask=None):
        logits = self.net(tokens, attention_mask).double()
        logits[..., V] = float("-inf")
        return logits


def _any_order_prob(model, seqs):
    """``q(x)`` for each row of ``seqs`` under the reverse process that unmasks one random position
    at a time: the mean over orders of ``prod_k q(x_order[k] | the positions unmasked before)``."""
    n = seqs.shape[1]
    states = torch.tensor(list(itertools.product(range(V + 1), repeat=n)))  # every partly masked sequence
    probs = torch.softmax(model(states), dim=-1)  # one forward for all of them
    index = {tuple(s): i for i, s in enumerate(states.tolist())}
    out = []
    for seq in seqs.tolist():
        total = 0.0
        orders = list(itertools.permutations(range(n)))
        for order in orders:
            x = [V] * n
            prob = 1.0
            for pos in order:
                prob *= float(probs[index[tuple(x)], pos, seq[pos]])
                x[pos] = seq[pos]
            total += prob
        out.append(total / len(orders))
    return out


def test_the_bound_is_tight_for_the_exact_model():
    # The exact conditionals of one joint: every order's chain rule gives -log p(x), so the MDM
    # bound (an average over orders, Ou et al. 2024 arXiv:2406.03736) equals the NLL.
    model = ExactJoint(V, 3, seed=1)
    for seq in model.seqs[::4]:
        for target in ([True] * 3, [False, True, True]):
            t = torch.tensor(target)
            assert exact_elbo(model, seq, t) == pytest.approx(exact_nll(model, seq, t), abs=1e-9)


def test_the_bound_is_above_the_nll_of_an_inexact_model():
    model = NoMaskOutput(seed=3)
    target = torch.ones(3, dtype=torch.bool)
    seqs = torch.tensor(list(itertools.product(range(V), repeat=3)))
    q = _any_order_prob(model, seqs)
    assert sum(q) == pytest.approx(1.0, abs=1e-9)  # the reverse process' distribution over V^3
    elbos = [exact_elbo(model, s, target) for s in seqs]
    gaps = [e + math.log(p) for e, p in zip(elbos, q)]
    assert min(gaps) >= -1e-9 and max(gaps) > 1e-3  # a bound (Jensen over orders), not tight here
    # and under data from another distribution, its expected bound is above the data's entropy
    data = ExactJoint(V, 3, seed=4)
    entropy = -float((data.p * data.p.log()).sum())
    assert sum(data.prob(s) * e for s, e in zip(seqs, elbos)) > entropy


@pytest.mark.parametrize("estimator", ["count", "time"])
def test_the_estimators_are_unbiased(estimator):
    model = NoMaskOutput(seed=5)
    seq = torch.tensor([[2, 0, 1, 1]])
    target = torch.tensor([[False, True, True, True]])  # context of one token
    exact = exact_elbo(model, seq[0], target[0])
    zs, means = [], []
    for seed in range(20):
        res = elbo_nll(model, seq, mask_token_id=V, generator=_gen(seed), target_mask=target,
                       estimator=estimator, num_samples=200, samples_per_forward=100)
        zs.append((float(res.nll[0]) - exact) / float(res.stderr[0]))
        means.append(float(res.nll[0]))
        assert res.num_samples == 200 and int(res.num_tokens[0]) == 3
    assert max(abs(z) for z in zs) < 4.0
    pooled_se = float(torch.tensor(means).std()) / math.sqrt(len(means))
    assert abs(sum(means) / len(means) - exact) < 3 * pooled_se


def test_the_count_estimator_has_the_lower_variance():
    model = NoMaskOutput(seed=5)
    seq = torch.tensor([[2, 0, 1, 1, 0, 2]])
    var = {}
    for estimator in ("count", "time"):
        res = elbo_nll(model, seq, mask_token_id=V, generator=_gen(0), estimator=estimator,
                       num_samples=2000, samples_per_forward=500)
        var[estimator] = float(res.samples.var())
    assert var["count"] < var["time"]


def test_the_context_is_never_masked_and_the_count_is_uniform():
    seen = []
    model = NoMaskOutput(seed=6)

    def spy(tokens, attention_mask=None):
        seen.append(tokens.clone())
        return model(tokens, attention_mask)

    seq = torch.tensor([[0, 1, 2, 0, 1, 2]])
    target = torch.tensor([[False, False, True, True, True, True]])
    elbo_nll(spy, seq, mask_token_id=V, generator=_gen(0), target_mask=target, num_samples=400,
             samples_per_forward=100)
    noised = torch.cat(seen)
    assert noised.shape == (400, 6) and not bool((noised[:, :2] == V).any())
    counts = (noised == V).sum(dim=1)
    assert set(counts.tolist()) == {1, 2, 3, 4}  # l ~ U{1..L}, never 0
    assert bool(((noised == seq) | (noised == V)).all())  # only masks are written


def test_a_result_is_reproducible_from_the_generator():
    model = NoMaskOutput(seed=7)
    seq = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    a = elbo_nll(model, seq, mask_token_id=V, generator=_gen(3), num_samples=8)
    b = elbo_nll(model, seq, mask_token_id=V, generator=_gen(3), num_samples=8)
    c = elbo_nll(model, seq, mask_token_id=V, generator=_gen(4), num_samples=8)
    assert torch.equal(a.samples, b.samples) and not torch.equal(a.samples, c.samples)
    for k in (1, 3):  # samples_per_forward is a memory setting: it changes no draw
        other = elbo_nll(model, seq, mask_token_id=V, generator=_gen(3), num_samples=8, samples_per_forward=k)
        assert torch.allclose(other.samples, a.samples, atol=1e-9)
    total = a.total()
    assert total["num_tokens"] == 8 and total["nll_per_token"] == pytest.approx(float(a.nll.sum()) / 8)
    assert total["perplexity_bound"] == pytest.approx(math.exp(total["nll_per_token"]))


def test_batches_merge_into_one_total():
    model = NoMaskOutput(seed=7)
    seq = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 1]])
    a = elbo_nll(model, seq[:1], mask_token_id=V, generator=_gen(1), num_samples=8)
    b = elbo_nll(model, seq[1:, :3], mask_token_id=V, generator=_gen(2), num_samples=8)
    both = merge_elbo_results([a, b]).total()
    assert both["num_tokens"] == 7 and both["num_sequences"] == 2
    assert both["nll_per_token"] == pytest.approx((float(a.nll[0]) + float(b.nll[0])) / 7)
    assert both["stderr_per_token"] == pytest.approx(math.hypot(float(a.stderr[0]), float(b.stderr[0])) / 7)
    with pytest.raises(ValueError, match="do not merge"):
        merge_elbo_results([a, elbo_nll(model, seq[:1], mask_token_id=V, generator=_gen(1), num_samples=4)])


def test_padding_is_never_a_target():
    model = NoMaskOutput(seed=8)
    seq = torch.tensor([[0, 1, 2, 1]])
    attn = torch.tensor([[False, True, True, True]])
    seen = []

    def spy(tokens, attention_mask=None):
        seen.append(attention_mask)
        return model(tokens, attention_mask)

    res = elbo_nll(spy, seq, mask_token_id=V, generator=_gen(0), attention_mask=attn, num_samples=4)
    assert int(res.num_tokens[0]) == 3 and seen[0] is not None and seen[0].shape == (4, 4)


def test_ar_nll_is_exact():
    model = ExactJoint(V, 4, seed=9, causal=True)
    joint = ExactJoint(V, 4, seed=9)
    seqs = model.seqs[::7]
    res = ar_nll(model, seqs)
    for row, seq in enumerate(seqs):
        assert float(res.nll[row]) == pytest.approx(exact_nll(joint, seq, torch.tensor([False, True, True, True])))
    cond = ar_nll(model, seqs[:1], target_mask=torch.tensor([[False, False, True, True]]))
    assert float(cond.nll[0]) == pytest.approx(exact_nll(joint, seqs[0], torch.tensor([False, False, True, True])))
    total = res.total()
    assert total["perplexity"] == pytest.approx(math.exp(float(res.nll.sum()) / (3 * len(seqs))))
    with pytest.raises(ValueError, match="BOS"):
        ar_nll(model, seqs[:1], target_mask=torch.ones(1, 4, dtype=torch.bool))


def _items(joint):
    """Items with context = one token and two 3-token choices whose true probabilities differ by
    more than one nat; the label is the more likely choice, except in the last item."""
    items = []
    for context in range(V):
        rows = joint.seqs[joint.seqs[:, 0] == context]
        probs = torch.stack([joint.p[(joint.seqs == r).all(1)].sum() for r in rows])
        best, worst = int(probs.argmax()), int(probs.argmin())
        assert math.log(float(probs[best] / probs[worst])) > 1.0
        items.append({"context": [context], "choices": [rows[worst, 1:].tolist(), rows[best, 1:].tolist()], "label": 1})
    items[-1] = {**items[-1], "label": 0}
    return items


@pytest.mark.parametrize("kind", ["mdm", "ar"])
def test_multiple_choice_picks_the_higher_likelihood(kind):
    joint = ExactJoint(V, 4, seed=10, causal=(kind == "ar"))
    items = _items(ExactJoint(V, 4, seed=10))
    res = multiple_choice(joint, items, kind=kind, mask_token_id=V, generator=_gen(0), num_samples=64)
    assert res.predictions == [1, 1, 1]
    assert res.accuracy == pytest.approx(2 / 3) and res.interval == wilson_interval(2, 3)
    assert all(nll[1] < nll[0] for nll in res.nll)
    assert res.to_dict()["n"] == 3


def test_continuation_nll_of_the_exact_model_estimates_the_true_value():
    joint = ExactJoint(V, 4, seed=11)
    nll, se, n = continuation_nll(joint, [1], [0, 2, 2], kind="mdm", mask_token_id=V, generator=_gen(0),
                                  num_samples=256)
    true = exact_nll(joint, torch.tensor([1, 0, 2, 2]), torch.tensor([False, True, True, True]))
    assert n == 3 and abs(nll - true) < 3 * se + 1e-9


def test_wilson_interval_known_values():
    low, high = wilson_interval(5, 10)
    assert (round(low, 4), round(high, 4)) == (0.2366, 0.7634)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0


@pytest.mark.parametrize("item, match", [
    ({"context": [0], "choices": [[1], [2]]}, "item 0: no 'label'"),
    ({"context": [0], "choices": [[1], [2]], "label": 2}, r"'label' = 2; use an index in 0..1"),
    ({"context": [0], "choices": [[1]], "label": 0}, "at least 2"),
])
def test_a_bad_item_is_named(item, match):
    with pytest.raises(ValueError, match=match):
        multiple_choice(ExactJoint(V, 2), [item], kind="ar")


def test_bad_arguments_are_named():
    model = ExactJoint(V, 2)
    seq = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="estimator = 'exact'"):
        elbo_nll(model, seq, mask_token_id=V, generator=_gen(0), estimator="exact")
    with pytest.raises(ValueError, match="num_samples = 1"):
        elbo_nll(model, seq, mask_token_id=V, generator=_gen(0), num_samples=1)
    with pytest.raises(ValueError, match="row 0 has no target"):
        elbo_nll(model, seq, mask_token_id=V, generator=_gen(0), target_mask=torch.zeros(1, 2, dtype=torch.bool))
