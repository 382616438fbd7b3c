"""The NELBO of a block-diffusion model (backends/generate/likelihood.py ``bd3_nelbo``): each sample
equals the same draws computed directly, block by block, on the inference form (the clean blocks
before, then the noised block, under block-causal attention); its mean agrees, within its standard
error, with the bound's exact value enumerated over every mask pattern and integrated over t."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from block_diffusion_kit import TinyMaskedLM

from dlmspec.backends.generate.likelihood import bd3_nelbo
from dlmspec.backends.megatron.masks import MaskFunction

MASK, VOCAB = 15, 16


def _model() -> TinyMaskedLM:
    return TinyMaskedLM(vocab=VOCAB, seed=3)


def _forward(model):
    return lambda ids, pos, mask: model(ids, pos, mask)


def _prefix_then_block(prefix_len: int, block: int):
    """The inference form's mask: the clean prefix block-causal in itself, the noised block sees it all."""
    def fn(b, h, q, k):
        in_prefix_q, in_prefix_k = q < prefix_len, k < prefix_len
        clean = in_prefix_q & in_prefix_k & (k // block <= q // block)
        noised = ~in_prefix_q
        return clean | noised
    return MaskFunction(fn, block_size=block, name="prefix_then_block")


def _direct_samples(model, tokens, block, num_samples, seed, low=1e-3, high=1.0):
    """The same draws as bd3_nelbo, each block scored on [x_0 blocks before, x_t block]."""
    g = torch.Generator().manual_seed(seed)
    b, n = tokens.shape
    blocks = n // block
    out = torch.zeros(num_samples, b, dtype=torch.float64)
    for s in range(num_samples):
        u = torch.rand(b, blocks, generator=g, dtype=torch.float64)
        draws = torch.rand(b, n, generator=g, dtype=torch.float64)
        for r in range(b):
            for j in range(blocks):
                t = low + (high - low) * float(u[r, j])
                lo, hi = j * block, (j + 1) * block
                masked = draws[r, lo:hi] < t
                noised = torch.where(masked, torch.full_like(tokens[r, lo:hi], MASK), tokens[r, lo:hi])
                ids = torch.cat([tokens[r, :lo], noised]).unsqueeze(0)
                pos = torch.arange(hi).unsqueeze(0)
                logits = model(ids, pos, _prefix_then_block(lo, block))[0, lo:hi].double()
                ce = F.cross_entropy(logits, tokens[r, lo:hi], reduction="none")
                out[s, r] += float((ce * masked).sum()) / t
    return out


def test_each_sample_equals_the_block_by_block_computation_of_the_same_draws() -> None:
    model, tokens = _model(), torch.randint(0, 14, (2, 8), generator=torch.Generator().manual_seed(0))
    res = bd3_nelbo(_forward(model), tokens, block_size=4, mask_token_id=MASK,
                    generator=torch.Generator().manual_seed(11), num_samples=6, samples_per_forward=4)
    direct = _direct_samples(model, tokens, 4, 6, seed=11)
    torch.testing.assert_close(res.samples, direct, rtol=1e-4, atol=1e-4)
    assert res.estimator == "bd3" and res.num_tokens.tolist() == [8, 8]
    torch.testing.assert_close(res.stderr, direct.std(dim=0) / math.sqrt(6))


def _integral(k: int, rest: int, low: float) -> float:
    """E_{t ~ U(low, 1)}[t^k (1 - t)^rest / t] = int_low^1 t^(k-1) (1-t)^rest dt / (1 - low), expanded."""
    return sum(math.comb(rest, j) * (-1) ** j * (1 - low ** (k + j)) / (k + j) for j in range(rest + 1)) / (1 - low)


def _exact_nelbo(model, tokens, block, low) -> float:
    """sum_blocks sum_{masks m} E_t[t^|m| (1 - t)^(B - |m|) / t] sum_{i in m} CE_i: the estimator's
    expectation with t ~ U(low, 1), every pattern of every block enumerated."""
    n = tokens.shape[1]
    total = 0.0
    for j in range(n // block):
        lo, hi = j * block, (j + 1) * block
        for pattern in itertools.product([False, True], repeat=block):
            m = torch.tensor(pattern)
            k = int(m.sum())
            if k == 0:
                continue
            beta = _integral(k, block - k, low)
            noised = torch.where(m, torch.full_like(tokens[0, lo:hi], MASK), tokens[0, lo:hi])
            ids = torch.cat([tokens[0, :lo], noised]).unsqueeze(0)
            logits = model(ids, torch.arange(hi).unsqueeze(0), _prefix_then_block(lo, block))[0, lo:hi].double()
            ce = F.cross_entropy(logits, tokens[0, lo:hi], reduction="none")
            total += beta * float((ce * m).sum())
    return total


def test_the_mean_agrees_with_the_exact_bound_within_its_standard_error() -> None:
    model, tokens = _model(), torch.tensor([[3, 7, 1, 12, 5, 0]])
    exact = _exact_nelbo(model, tokens, 3, 0.05)
    res = bd3_nelbo(_forward(model), tokens, block_size=3, mask_token_id=MASK,
                    generator=torch.Generator().manual_seed(5), num_samples=3000, samples_per_forward=500,
                    noise_range=(0.05, 1.0))
    nll, err = float(res.nll[0]), float(res.stderr[0])
    assert err > 0 and abs(nll - exact) < 4 * err, (nll, err, exact)


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_size=5), "block_size"), (dict(num_samples=1), "num_samples"),
    (dict(noise_range=(0.5, 0.5)), "noise_range"),
])
def test_bad_arguments_are_refused_with_a_value_that_works(kwargs, match) -> None:
    args = dict(block_size=4, mask_token_id=MASK, generator=torch.Generator(), num_samples=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        bd3_nelbo(_forward(_model()), torch.zeros(1, 8, dtype=torch.long), **args)
