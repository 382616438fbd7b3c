"""A tiny masked-diffusion model and exact enumerations of its ELBO and any-order likelihood,
for the estimator tests (a helper module, not a test module).

With ``T <= 6`` completion tokens there are at most 64 masks: each is one forward pass, and every
quantity below is an exact finite sum over them (no sampling).
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, FrozenSet, List, Sequence

import torch
from torch import nn

from dlmspec.backends.rl.estimators import elbo_weight, token_log_probs

VOCAB = 5          #: real tokens 0..4
MASK_ID = VOCAB    #: the mask token
SIZE = VOCAB + 1


class TinyBidirectional(nn.Module):
    """One bidirectional attention layer over token + position embeddings, float64, no dropout:
    ``tokens [N, S] -> logits [N, S, SIZE]`` (every output depends on every input, so masks
    change the conditionals). ``causal = True`` makes it an AR model."""

    def __init__(self, seq_len: int, *, seed: int = 0, causal: bool = False, width: int = 16) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.causal = causal
        self.tok = nn.Parameter(torch.randn(SIZE, width, generator=gen, dtype=torch.float64))
        self.pos = nn.Parameter(torch.randn(seq_len, width, generator=gen, dtype=torch.float64))
        self.qkv = nn.Parameter(torch.randn(width, 3 * width, generator=gen, dtype=torch.float64) / math.sqrt(width))
        self.out = nn.Parameter(torch.randn(width, SIZE, generator=gen, dtype=torch.float64) * 1.5 / math.sqrt(width))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok[tokens] + self.pos[: tokens.shape[1]]
        q, k, v = (x @ self.qkv).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1])
        if self.causal:
            seq = tokens.shape[1]
            scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
        h = x + torch.softmax(scores, dim=-1) @ v
        return torch.tanh(h) @ self.out


def masked_log_probs(model: nn.Module, prompt: Sequence[int], completion: Sequence[int]) -> Dict[FrozenSet[int], torch.Tensor]:
    """``{M: log p(o_k | c, o with M masked) for every k}`` for every subset ``M`` of completion
    positions: one batched forward over all ``2^T`` masks. Values are ``[T]`` float64 tensors."""
    length = len(completion)
    masks = [frozenset(c) for size in range(length + 1) for c in itertools.combinations(range(length), size)]
    comp = torch.tensor(completion)
    rows = []
    for m in masks:
        noisy = comp.clone()
        for k in m:
            noisy[k] = MASK_ID
        rows.append(torch.cat([torch.tensor(prompt), noisy]))
    with torch.no_grad():
        logits = model(torch.stack(rows))
    lp = token_log_probs(logits[:, len(prompt):, :], comp.expand(len(masks), -1))
    return {m: lp[i] for i, m in enumerate(masks)}


def exact_elbo_per_token(table: Dict[FrozenSet[int], torch.Tensor], length: int) -> torch.Tensor:
    """Per-position ELBO contributions ``sum_{M ∋ k} w(|M|) log p(o_k | o with M masked)``
    (``w`` = :func:`~dlmspec.backends.rl.estimators.elbo_weight`), ``[T]``; their sum is the ELBO."""
    out = torch.zeros(length, dtype=torch.float64)
    for m, lp in table.items():
        if m:
            w = elbo_weight(len(m), length)
            for k in m:
                out[k] += w * lp[k]
    return out


def order_log_likelihoods(table: Dict[FrozenSet[int], torch.Tensor], length: int) -> List[float]:
    """``log p_sigma(o)`` for every order ``sigma`` of the ``T`` positions: tokens revealed one at a
    time in that order, each scored with the not-yet-revealed positions masked."""
    out = []
    full = frozenset(range(length))
    for order in itertools.permutations(range(length)):
        revealed: set = set()
        total = 0.0
        for k in order:
            total += float(table[full - frozenset(revealed)][k])
            revealed.add(k)
        out.append(total)
    return out


def estimator_expectation(estimator, table: Dict[FrozenSet[int], torch.Tensor], length: int) -> torch.Tensor:
    """The exact expectation of ``estimator``'s per-position output over its draw distribution
    (:meth:`~dlmspec.backends.rl.estimators.MaskedEstimator.support`), ``[T]``; also checks that
    the probabilities sum to 1."""
    out = torch.zeros(length, dtype=torch.float64)
    mass = 0.0
    for prob, views in estimator.support(length):
        mass += prob
        for positions, coef in views:
            lp = table[frozenset(positions)]
            for k in positions:
                out[k] += prob * coef * lp[k]
    assert abs(mass - 1.0) < 1e-12, f"support probabilities sum to {mass}"
    return out
