"""Per-token log-probability estimators of a completion, one interface for every RL algorithm.

An autoregressive model gives ``log pi(o | c) = sum_k log p(o_k | c, o_<k)`` exactly. A
masked-diffusion LM has no tractable likelihood; its evidence lower bound (ELBO) is

    ``log pi(o | c) >= ELBO(o | c) = sum_{M != {}} w(|M|) sum_{k in M} log p(o_k | c, o with M masked)``

with ``w(l) = 1 / (l * C(T, l))`` over the subsets ``M`` of the ``T`` completion positions (MDLM,
Sahoo et al. 2024, arXiv:2406.07524, eq. 10 with the linear schedule; LLaDA, Nie et al. 2025,
arXiv:2502.09992, eq. 3 written over masks: ``E_t[(1/t) sum_{k in M_t} ...]`` with
``P(M | t) = t^|M| (1-t)^(T-|M|)`` integrates to ``w(|M|)``; its eq. 6 draws ``l ~ U{1..T}`` and
weights ``T / l``, the same expectation). It also equals the expectation over uniformly random
generation orders of the any-order autoregressive log-likelihood (Ou et al. 2024,
arXiv:2406.03736, sec. 4; Hoogeboom et al. 2022, ARDM, arXiv:2110.02037, sec. 3), hence at most
``log E_sigma p_sigma(o | c)`` by Jensen.

Every estimator here returns ``Tensor[N, T]``, one value per completion position (0 where
``completion_mask`` is ``False``); the row sum estimates ``log pi(o | c)`` (``"ar"``: exactly) or
``ELBO(o | c)``. They are written as *views*: view ``v`` masks positions ``M_v`` of the
completion and scores them with coefficient ``c_v``, the estimate at position ``k`` being
``sum_v c_v [k in M_v] log p(o_k | view v)``; :meth:`MaskedEstimator.support` lists the exact
distribution of one draw of views for a completion of ``T`` tokens, so that tests compute each
estimator's expectation exactly.

- ``"one-step"`` (d1's diffu-GRPO: Zhao et al. 2025, arXiv:2504.12216, sec. 3, "one-step
  per-token log-probability estimation with prompt masking", the mean-field decomposition
  ``log pi(o | c) ~ sum_k log p(o_k | c')``): one view, the whole completion masked, ``c = 1``. One
  forward pass; biased (it scores each token with no completion token visible); its gap to the
  ELBO is what ``tests/integration/rl/test_estimators_match_exact_elbo.py`` reports.
- ``"coupled"`` (DiffuCoder's coupled-GRPO: Gong et al. 2025, arXiv:2506.20639, the
  coupled-GRPO section, "coupled sampling", and fig. 2): pairs of complementary masks ``(M, M^c)``, so every completion
  token is masked, and scored, exactly once per pair. dlmspec draws ``l ~ U{0..T}`` and ``M``
  uniform of size ``l``, coefficients ``(T+1) / (2 l)`` and ``(T+1) / (2 (T - l))``: unbiased for
  the ELBO (``P(|M| = l) = 1/(T+1)`` is symmetric under ``l -> T - l``, each view contributes half
  of it), each weight at most ``(T+1)/2``. Two forward passes per pair. DiffuCoder's reference
  code (github:apple/ml-diffucoder ``src/open_r1/coupled_grpo.py``, ``forward_process``) instead
  draws a mask ratio ``t ~ U(0.2, 0.8)``, masks each token with probability ``t``, weights
  ``1/t`` and ``1/(1-t)`` and averages the pair with a fully masked pass: ``sampling = "time"``,
  ``t_range = (0.2, 0.8)`` and ``full_mask_pass = True`` reproduce that estimate (one ``t`` per
  row here, one per batch there). It is biased
  for the ELBO (the range leaves part of the integral over ``t`` out; the third pass adds half
  of the one-step term) and is not the default.
- ``"mc-elbo"``: ``k`` independent views, each ``l ~ U{1..T}``, ``M`` uniform of size ``l``,
  coefficient ``T / (l k)`` (LLaDA eq. 6; the estimator of VRPO, Zhu et al. 2025 "LLaDA 1.5",
  arXiv:2505.19223, sec. 3, with ``k`` samples). ``k`` forward passes; unbiased.
- ``"ar"``: exact next-token log-probabilities of a causal model; one forward pass.

``prompt_mask_prob`` (d1: 0.15) masks each prompt token with that probability, one draw per call
shared by the call's views (d1 draws a fresh prompt mask per inner iteration: call once per
iteration with a fresh generator state). The estimate is then of the completion given the
partly masked prompt, d1's regulariser. Completion positions where ``completion_mask`` is
``False`` (after the end of the completion) are masked in every view and never scored.

What the RL loss uses (:meth:`MaskedEstimator.score`): per position, the coefficient-weighted
mean of the conditional log-probabilities of the views that mask it and the sum of those
coefficients; the ratio and the KL are taken of the first, the second weighs the token's loss
(``backends/rl/loss.py``), so no coefficient reaches an exponential.

Randomness: every draw comes from ``generator``, in this order: the prompt uniforms ``[N, P]``
(only when ``prompt_mask_prob > 0``), then per view (per pair for ``"coupled"``) the size
uniforms ``[N]`` and the position uniforms ``[N, T]``, float64. The old policy, the reference and
the current policy must be scored on the same views in one inner iteration (the ratio compares
like with like, as d1's ``mask_seeds``): give each a generator in the same state.
"""

from __future__ import annotations

import abc
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Protocol, Tuple, runtime_checkable

import torch
from torch import Tensor

#: ``model_fn(tokens [N, P+T]) -> logits [N, P+T, V]``, with grad when training.
ModelFn = Callable[[Tensor], Tensor]

__all__ = ["ModelFn", "LogProbEstimator", "MaskedEstimator", "OneStepEstimator", "CoupledEstimator",
           "MonteCarloELBOEstimator", "AutoregressiveEstimator", "register", "get", "names", "elbo_weight",
           "token_log_probs"]


@runtime_checkable
class LogProbEstimator(Protocol):
    """What the RL stage calls: ``name``, ``forward_passes`` (``model_fn`` calls per call, each on
    ``N`` rows), ``deterministic`` (``True`` when the result does not depend on ``generator``: the
    stage then scores the rollout policy and the reference once per rollout batch, not once per
    inner iteration), ``__call__`` returning ``Tensor[N, T]`` (module docstring) and ``score``
    returning ``(log_probs, weights)``, both ``[N, T]``, whose product is ``__call__``'s estimate
    (the policy loss exponentiates ``log_probs`` and weighs tokens by ``weights``)."""

    name: str
    forward_passes: int
    deterministic: bool

    def __call__(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
                 mask_id: int, generator: torch.Generator, prompt_mask_prob: float = 0.0) -> Tensor: ...

    def score(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
              mask_id: int, generator: torch.Generator, prompt_mask_prob: float = 0.0) -> Tuple[Tensor, Tensor]: ...


def elbo_weight(size: int, length: int) -> float:
    """``w(l) = 1 / (l * C(T, l))``: the ELBO's weight of one mask of ``l`` of ``T`` positions
    (module docstring). Raises ``ValueError`` unless ``1 <= l <= T``."""
    if not 1 <= size <= length:
        raise ValueError(f"elbo_weight: size {size} must be in [1, {length}]")
    return 1.0 / (size * math.comb(length, size))


def token_log_probs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[..., targets]`` in float32 (or wider): ``logits [N, T, V]``,
    ``targets [N, T]`` -> ``[N, T]``."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def _check_call(prompt: Tensor, completion: Tensor, completion_mask: Tensor, prompt_mask_prob: float) -> None:
    if prompt.dim() != 2 or completion.dim() != 2 or prompt.shape[0] != completion.shape[0]:
        raise ValueError(f"prompt [N, P] and completion [N, T] are needed, got {tuple(prompt.shape)} and "
                         f"{tuple(completion.shape)}")
    if completion_mask.shape != completion.shape or completion_mask.dtype != torch.bool:
        raise ValueError(f"completion_mask: a bool tensor of completion's shape {tuple(completion.shape)} is needed, "
                         f"got {completion_mask.dtype} {tuple(completion_mask.shape)}")
    if not 0.0 <= prompt_mask_prob < 1.0:
        raise ValueError(f"prompt_mask_prob = {prompt_mask_prob!r}: must be in [0, 1); use 0.15 (d1) or 0")


def _uniform_subset(sizes: Tensor, valid: Tensor, generator: torch.Generator) -> Tensor:
    """``BoolTensor[N, T]``: per row, ``sizes[i]`` positions among ``valid[i]``, uniformly without
    replacement (the ``sizes[i]`` smallest of i.i.d. uniforms; invalid positions rank last).
    Draws ``[N, T]`` float64 uniforms."""
    u = torch.rand(valid.shape, generator=generator, dtype=torch.float64, device=valid.device)
    u = torch.where(valid, u, torch.full_like(u, 2.0))
    rank = u.argsort(dim=1).argsort(dim=1)
    return (rank < sizes.unsqueeze(1)) & valid


@dataclass
class View:
    """One forward pass of an estimator: ``masked [N, T]`` completion positions masked (and
    scored), ``coef [N]`` their coefficient."""

    masked: Tensor
    coef: Tensor


class MaskedEstimator(abc.ABC):
    """Base of the masked-diffusion estimators: draws views (:meth:`draw`), runs ``model_fn`` once
    per view and sums ``coef * log p`` over each view's masked positions. Subclasses give
    :meth:`draw` and :meth:`support`."""

    name = "masked"
    forward_passes = 1
    deterministic = False  # fresh masks per inner iteration

    @abc.abstractmethod
    def draw(self, valid: Tensor, generator: torch.Generator) -> List[View]:
        """The views (masks and coefficients) of one call."""

    @abc.abstractmethod
    def support(self, length: int) -> List[Tuple[float, List[Tuple[Tuple[int, ...], float]]]]:
        """The exact distribution of one draw for a completion of ``length`` valid tokens:
        ``[(probability, [(masked positions, coefficient), ...]), ...]``, probabilities summing
        to 1 (for several samples or pairs: the distribution of one of them, whose average the
        estimate is; the expectation is the same)."""

    def __call__(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
                 mask_id: int, generator: torch.Generator, prompt_mask_prob: float = 0.0) -> Tensor:
        return self._views(model_fn, prompt, completion, completion_mask, mask_id=mask_id, generator=generator,
                           prompt_mask_prob=prompt_mask_prob)[0]

    def score(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
              mask_id: int, generator: torch.Generator, prompt_mask_prob: float = 0.0) -> Tuple[Tensor, Tensor]:
        """``(log_probs [N, T], weights [N, T])``: per position ``k``, ``weights = sum_v c_v [k in M_v]``
        and ``log_probs`` the ``c_v``-weighted mean of ``log p(o_k | view v)`` over the views that
        mask ``k`` (0 and 0 where no view does), so that ``weights * log_probs`` is the estimate of
        :meth:`__call__` (same draws from ``generator``).

        The policy loss takes importance ratios and the KL on ``log_probs`` and weighs each token's
        loss by ``weights`` (:func:`dlmspec.backends.rl.loss.policy_loss`, ``token_weight``): the
        coefficients stay outside the exponential. Exponentiating the weighted estimate instead gives
        ``exp(c (log p - log p_old))``, a ratio and a k3 KL raised to the power ``c`` (``"coupled"``:
        up to ``(T+1)/2``), whose KL spikes (1e5 and more) swamp the reward's gradient."""
        _, weight, conditional = self._views(model_fn, prompt, completion, completion_mask, mask_id=mask_id,
                                                 generator=generator, prompt_mask_prob=prompt_mask_prob)
        return conditional, weight

    def _views(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
               mask_id: int, generator: torch.Generator, prompt_mask_prob: float) -> Tuple[Tensor, Tensor, Tensor]:
        """``(estimate, weights, log_probs)``, each ``[N, T]`` (:meth:`score`)."""
        _check_call(prompt, completion, completion_mask, prompt_mask_prob)
        rows, plen = prompt.shape
        noisy_prompt = prompt
        if prompt_mask_prob > 0 and plen:
            u = torch.rand(prompt.shape, generator=generator, dtype=torch.float64, device=prompt.device)
            noisy_prompt = torch.where(u < prompt_mask_prob, torch.full_like(prompt, mask_id), prompt)
        valid = completion_mask
        out = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)
        weight = torch.zeros(completion.shape, dtype=torch.float32, device=completion.device)
        for view in self.draw(valid, generator):
            hidden = view.masked | ~valid
            tokens = torch.cat([noisy_prompt, torch.where(hidden, torch.full_like(completion, mask_id), completion)], dim=1)
            logits = model_fn(tokens)
            lp = token_log_probs(logits[:, plen:, :], completion)
            zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
            coef = torch.where(view.masked, view.coef.to(lp.dtype).unsqueeze(1), zero)
            out = out.to(lp.dtype) + torch.where(view.masked, lp * coef, zero)
            weight = weight.to(lp.dtype) + coef
        has = weight > 0
        conditional = torch.where(has, out / torch.where(has, weight, torch.ones_like(weight)), torch.zeros_like(out))
        return out, weight.detach(), conditional


class OneStepEstimator(MaskedEstimator):
    """d1's one-step estimator (module docstring): the completion fully masked, one pass."""

    name = "one-step"
    forward_passes = 1

    def draw(self, valid: Tensor, generator: torch.Generator) -> List[View]:
        return [View(valid.clone(), torch.ones(valid.shape[0], dtype=torch.float64, device=valid.device))]

    def support(self, length: int):
        return [(1.0, [(tuple(range(length)), 1.0)])]


class CoupledEstimator(MaskedEstimator):
    """DiffuCoder's coupled sampling (module docstring): ``pairs`` complementary pairs, each
    completion token masked in exactly one view of each pair; ``2 * pairs`` forward passes (one
    more with ``full_mask_pass``).

    Args:
        pairs: complementary pairs per call, >= 1 (DiffuCoder: 1); the estimate averages them.
        sampling: ``"count"`` (default: ``l ~ U{0..T}``, ``M`` uniform of size ``l``, weights
            ``(T+1) / (2 l)`` and ``(T+1) / (2 (T-l))``; unbiased, weights at most ``(T+1)/2``) or
            ``"time"`` (DiffuCoder's reference code: a mask ratio ``t ~ U(t_range)`` per row, each
            token masked with probability ``t``, weights ``1 / (2 t)`` and ``1 / (2 (1-t))``;
            unbiased only with ``t_range = (0, 1)``, where the weights are unbounded).
        t_range: ``(low, high)``, ``0 <= low < high <= 1``, the ``"time"`` draw's range
            (DiffuCoder: ``(0.2, 0.8)``).
        full_mask_pass: add half of the fully masked pass's log-probabilities (one more forward
            pass), as DiffuCoder's reference code averages the pair with it; biased by half the
            one-step term. Default off.
    """

    name = "coupled"
    SAMPLINGS = ("count", "time")

    def __init__(self, pairs: int = 1, *, sampling: str = "count", t_range: Tuple[float, float] = (0.2, 0.8),
                 full_mask_pass: bool = False) -> None:
        if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
            raise ValueError(f"coupled estimator: pairs = {pairs!r}, an integer >= 1 is needed (DiffuCoder: 1)")
        if sampling not in self.SAMPLINGS:
            raise ValueError(f"coupled estimator: sampling = {sampling!r}, use 'count' (unbiased) or 'time' (DiffuCoder's)")
        try:
            low, high = (float(v) for v in t_range)
        except (TypeError, ValueError):
            raise ValueError(f"coupled estimator: t_range = {t_range!r}, give (low, high), e.g. (0.2, 0.8)") from None
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"coupled estimator: t_range = {t_range!r}, need 0 <= low < high <= 1, e.g. (0.2, 0.8)")
        self.pairs = pairs
        self.sampling = sampling
        self.t_range = (low, high)
        self.full_mask_pass = bool(full_mask_pass)
        self.forward_passes = 2 * pairs + int(self.full_mask_pass)

    def draw(self, valid: Tensor, generator: torch.Generator) -> List[View]:
        lengths = valid.sum(dim=1).to(torch.float64)
        views: List[View] = []
        for _ in range(self.pairs):
            u = torch.rand(valid.shape[0], generator=generator, dtype=torch.float64, device=valid.device)
            if self.sampling == "count":
                sizes = torch.minimum(torch.floor(u * (lengths + 1)), lengths)  # l ~ U{0..T}
                first = _uniform_subset(sizes.to(torch.int64), valid, generator)
                scale = (lengths + 1) / (2.0 * self.pairs)
                rest = lengths - sizes
                coef_a = torch.where(sizes > 0, scale / sizes.clamp(min=1), torch.zeros_like(scale))
                coef_b = torch.where(rest > 0, scale / rest.clamp(min=1), torch.zeros_like(scale))
            else:
                low, high = self.t_range
                ratio = low + (high - low) * u
                draws = torch.rand(valid.shape, generator=generator, dtype=torch.float64, device=valid.device)
                first = valid & (draws < ratio.unsqueeze(1))
                coef_a = 1.0 / (2.0 * self.pairs * ratio.clamp(min=1e-12))
                coef_b = 1.0 / (2.0 * self.pairs * (1.0 - ratio).clamp(min=1e-12))
            views.append(View(first, coef_a))
            views.append(View(valid & ~first, coef_b))
        if self.full_mask_pass:
            views.append(View(valid.clone(), torch.full((valid.shape[0],), 0.5, dtype=torch.float64, device=valid.device)))
        return views

    def support(self, length: int):
        """For ``"time"`` the draw is continuous; this is a finite distribution with the same
        expectation: Gauss-Legendre nodes of ``t`` over ``t_range`` (``length // 2 + 2`` of them,
        exact for the polynomials in ``t`` of degree ``<= length`` that the expectation integrates)."""
        pairs: List[Tuple[float, Tuple[int, ...], float, float]] = []
        subsets = [c for size in range(length + 1) for c in itertools.combinations(range(length), size)]
        if self.sampling == "count":
            for chosen in subsets:
                size = len(chosen)
                pairs.append((1.0 / ((length + 1) * math.comb(length, size)), chosen,
                              (length + 1) / (2.0 * size) if size else 0.0,
                              (length + 1) / (2.0 * (length - size)) if size < length else 0.0))
        else:
            import numpy as np

            low, high = self.t_range
            nodes, weights = np.polynomial.legendre.leggauss(length // 2 + 2)
            for x, w in zip(nodes.tolist(), weights.tolist()):
                ratio = low + (high - low) * (x + 1.0) / 2.0
                for chosen in subsets:
                    size = len(chosen)
                    pairs.append((w / 2.0 * ratio ** size * (1.0 - ratio) ** (length - size), chosen,
                                  1.0 / (2.0 * ratio), 1.0 / (2.0 * (1.0 - ratio))))
        full = tuple(range(length))
        out = []
        for prob, chosen, coef_a, coef_b in pairs:
            rest = tuple(k for k in range(length) if k not in chosen)
            views = [(chosen, coef_a), (rest, coef_b)] + ([(full, 0.5)] if self.full_mask_pass else [])
            out.append((prob, views))
        return out


class MonteCarloELBOEstimator(MaskedEstimator):
    """``k`` independent ELBO samples (module docstring), ``k`` forward passes.

    Args:
        k: samples per call, >= 1.
    """

    name = "mc-elbo"

    def __init__(self, k: int = 4) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"mc-elbo estimator: k = {k!r}, an integer >= 1 is needed (e.g. 4)")
        self.k = k
        self.forward_passes = k

    def draw(self, valid: Tensor, generator: torch.Generator) -> List[View]:
        lengths = valid.sum(dim=1).to(torch.float64)
        views = []
        for _ in range(self.k):
            u = torch.rand(valid.shape[0], generator=generator, dtype=torch.float64, device=valid.device)
            sizes = torch.minimum(torch.floor(u * lengths) + 1, lengths.clamp(min=1))  # l ~ U{1..T}
            chosen = _uniform_subset(sizes.to(torch.int64), valid, generator)
            views.append(View(chosen, lengths / (sizes * self.k)))
        return views

    def support(self, length: int):
        out = []
        for size in range(1, length + 1):
            for chosen in itertools.combinations(range(length), size):
                out.append((1.0 / (length * math.comb(length, size)), [(chosen, length / size)]))
        return out


class AutoregressiveEstimator:
    """Exact next-token log-probabilities of a causal ``model_fn``: the logits at position
    ``P + k - 1`` score completion token ``k`` (GRPO on AR models, arXiv:2402.03300 eq. 3's
    ``pi(o_t | q, o_<t)``). ``mask_id``, ``generator`` and ``prompt_mask_prob`` are not used
    (``prompt_mask_prob`` must be 0: masking has no meaning for a causal model)."""

    name = "ar"
    forward_passes = 1
    deterministic = True  # exact log-probabilities: no draw

    def __call__(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
                 mask_id: int = -1, generator: Optional[torch.Generator] = None, prompt_mask_prob: float = 0.0) -> Tensor:
        _check_call(prompt, completion, completion_mask, prompt_mask_prob)
        if prompt_mask_prob:
            raise ValueError(f"prompt_mask_prob = {prompt_mask_prob}: the 'ar' estimator masks nothing; use 0")
        plen = prompt.shape[1]
        if plen < 1:
            raise ValueError("the 'ar' estimator needs a prompt of at least one token (the first completion "
                             "token is predicted from the last prompt token); prepend BOS")
        logits = model_fn(torch.cat([prompt, completion], dim=1))
        lp = token_log_probs(logits[:, plen - 1:-1, :], completion)
        return torch.where(completion_mask, lp, torch.zeros((), dtype=lp.dtype, device=lp.device))

    def score(self, model_fn: ModelFn, prompt: Tensor, completion: Tensor, completion_mask: Tensor, *,
              mask_id: int = -1, generator: Optional[torch.Generator] = None,
              prompt_mask_prob: float = 0.0) -> Tuple[Tensor, Tensor]:
        """``(log_probs [N, T], weights [N, T])``: :meth:`__call__`'s exact log-probabilities and
        weight 1 on every completion position (0 elsewhere)."""
        lp = self(model_fn, prompt, completion, completion_mask, mask_id=mask_id, generator=generator,
                  prompt_mask_prob=prompt_mask_prob)
        return lp, completion_mask.to(lp.dtype)


_REGISTRY: Dict[str, Callable[..., LogProbEstimator]] = {}


def register(name: str, factory: Callable[..., LogProbEstimator]) -> None:
    """Make ``get(name, **options)`` return ``factory(**options)``. Raises ``ValueError`` if
    ``name`` is taken (a second method needs its own name)."""
    if name in _REGISTRY:
        raise ValueError(f"estimator {name!r} is already registered")
    _REGISTRY[name] = factory


def names() -> Tuple[str, ...]:
    """The registered estimator names."""
    return tuple(_REGISTRY)


def get(name: str, **options) -> LogProbEstimator:
    """The estimator ``name`` built with ``options`` (``"coupled"``: ``pairs``, ``sampling``,
    ``t_range``, ``full_mask_pass``; ``"mc-elbo"``: ``k``).

    Raises:
        ValueError: an unknown name (the known ones listed) or a bad option.
    """
    if name not in _REGISTRY:
        raise ValueError(f"estimator = {name!r}: use one of {', '.join(map(repr, _REGISTRY))}")
    try:
        return _REGISTRY[name](**options)
    except TypeError as exc:
        raise ValueError(f"estimator {name!r}: bad options {sorted(options)} ({exc})") from None


register("one-step", OneStepEstimator)
register("coupled", CoupledEstimator)
register("mc-elbo", MonteCarloELBOEstimator)
register("ar", AutoregressiveEstimator)
