"""Tiny models for the CPU tests of dlmspec.backends.generate: logits functions of a few-token vocabulary.

- :class:`TinyTransformer`: one attention layer with a distance bias (shift-invariant, as RoPE is)
  and a key-padding mask, bidirectional or causal; random weights from a seed.
- :class:`PositionTable`: logits that depend on the column only (schedules, EOS).
- :class:`ExactJoint`: the exact conditionals of a joint distribution over ``V ** L`` sequences,
  so likelihoods can be computed by enumeration (:func:`exact_elbo`, :func:`exact_nll`).
"""

from __future__ import annotations

import itertools
import math
from typing import Optional

import torch
from torch import Tensor


class TinyTransformer:
    """``logits_fn`` of a one-layer transformer over ``vocab`` ids (the mask id is one of them)."""

    def __init__(self, vocab: int, dim: int = 16, seed: int = 0, causal: bool = False) -> None:
        g = torch.Generator().manual_seed(seed)
        def w(*shape: int) -> Tensor:
            return torch.randn(*shape, generator=g) / math.sqrt(shape[0])
        self.emb = torch.randn(vocab, dim, generator=g)
        self.wq, self.wk, self.wv, self.wo = w(dim, dim), w(dim, dim), w(dim, dim), w(dim, dim)
        self.w1, self.w2 = w(dim, 4 * dim), w(4 * dim, dim)
        self.out = w(dim, vocab) * 4.0
        self.causal = causal
        self.calls: list[tuple[int, ...]] = []  # shapes of the token batches seen

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        self.calls.append(tuple(tokens.shape))
        h = self.emb[tokens]  # [B, L, D]
        q, k, v = h @ self.wq, h @ self.wk, h @ self.wv
        pos = torch.arange(tokens.shape[1])
        bias = -0.3 * (pos.view(-1, 1) - pos.view(1, -1)).abs().float()  # depends on i - j only
        scores = q @ k.transpose(1, 2) / math.sqrt(q.shape[-1]) + bias
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask[:, None, :], float("-inf"))
        if self.causal:
            scores = scores.masked_fill(pos.view(1, -1) > pos.view(-1, 1), float("-inf"))
        h = h + torch.softmax(scores, dim=-1) @ v @ self.wo
        h = h + torch.relu(h @ self.w1) @ self.w2
        return h @ self.out


class PositionTable:
    """Logits ``table[column]`` for every row: ``table`` is ``[L, V]``."""

    def __init__(self, table: Tensor) -> None:
        self.table = table
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        self.calls.append(tuple(tokens.shape))
        return self.table[: tokens.shape[1]].unsqueeze(0).expand(tokens.shape[0], -1, -1).clone()


class ExactJoint:
    """The exact model of a joint distribution ``p`` over sequences of ``length`` tokens in ``range(vocab)``.

    As a diffusion model (``causal=False``): the logits at a masked position are the log marginal
    of that token given the unmasked positions, ``log p(x_i | x_unmasked)``; this is the optimum of
    the MDM objective, so its ELBO is a bound on the true NLL. As an AR model: the logits at
    position ``i`` are ``log p(x_{i+1} | x_{<=i})``. The mask id is ``vocab`` (logit ``-inf``).
    """

    def __init__(self, vocab: int, length: int, seed: int = 0, causal: bool = False, sharpness: float = 2.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.vocab, self.length, self.causal = vocab, length, causal
        self.mask_id = vocab
        self.seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)), dtype=torch.int64)
        logp = torch.randn(len(self.seqs), generator=g, dtype=torch.float64) * sharpness
        self.p = torch.softmax(logp, dim=0)

    def prob(self, seq: Tensor) -> float:
        """``p(seq)`` for a ``[length]`` tensor."""
        return float(self.p[(self.seqs == seq.view(1, -1)).all(dim=1)].sum())

    def __call__(self, tokens: Tensor, attention_mask: Optional[Tensor] = None) -> Tensor:
        b, n = tokens.shape
        assert n == self.length
        onehot = torch.nn.functional.one_hot(self.seqs, self.vocab).to(torch.float64)  # [N, L, V]
        match = self.seqs.unsqueeze(0) == tokens.unsqueeze(1)  # [b, N, L]
        if self.causal:
            prefix = torch.cumprod(match.to(torch.float64), dim=2) * self.p.view(1, -1, 1)  # [b, N, L]
            mass = torch.einsum("bni,nlv->bilv", prefix[:, :, :-1], onehot[:, 1:]).diagonal(dim1=1, dim2=2)
            mass = torch.cat([mass.permute(0, 2, 1), torch.ones(b, 1, self.vocab, dtype=torch.float64)], dim=1)
        else:
            known = tokens != self.mask_id
            fits = (match | ~known.unsqueeze(1)).all(dim=2).to(torch.float64) * self.p  # [b, N]
            mass = torch.einsum("bn,nlv->blv", fits, onehot)
        logits = torch.log(mass / mass.sum(dim=-1, keepdim=True))
        return torch.cat([logits, torch.full((b, n, 1), float("-inf"), dtype=torch.float64)], dim=-1)


def exact_elbo(model: ExactJoint, seq: Tensor, target: Tensor) -> float:
    """The MDM bound on ``-log p(seq[target] | seq[~target])`` in nats, by enumerating the masks.

    ``sum_{l=1..L} 1/l * mean_{|M| = l} sum_{i in M} -log p(x_i | x_{-M})`` over subsets ``M`` of the
    ``L`` target positions: the expectation of both estimators (docs/generate.md, "Likelihood").
    """
    positions = target.nonzero().squeeze(1).tolist()
    subsets = [c for size in range(1, len(positions) + 1) for c in itertools.combinations(positions, size)]
    noised = seq.repeat(len(subsets), 1)
    for row, subset in enumerate(subsets):
        noised[row, list(subset)] = model.mask_id
    logp = torch.log_softmax(model(noised).to(torch.float64), dim=-1)  # one forward for every mask
    picked = torch.gather(logp, -1, seq.view(1, -1, 1).expand(len(subsets), -1, 1)).squeeze(-1)
    total = 0.0
    for row, subset in enumerate(subsets):
        size = len(subset)
        total += float(-picked[row, list(subset)].sum()) / math.comb(len(positions), size) / size
    return total


def exact_nll(model: ExactJoint, seq: Tensor, target: Tensor) -> float:
    """``-log p(seq[target] | seq[~target])`` in nats, by summing the joint."""
    known = ~target
    fits = ((model.seqs == seq) | ~known).all(dim=1)
    return -math.log(model.prob(seq) / float(model.p[fits].sum()))
