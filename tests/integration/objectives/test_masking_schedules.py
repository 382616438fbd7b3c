"""Masking schedules (dlmspec/objectives/schedules.py) against their closed forms, and their path
through the objective's registration to the training loss (backends/megatron/objectives/mdm.py),
the sampler's transfer schedule (backends/generate/sampler.py) and eval's ELBO
(backends/generate/likelihood.py). The linear schedule keeps the loss of before bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from dlmspec import objectives
from dlmspec.backends.generate.likelihood import elbo_nll
from dlmspec.backends.generate.sampler import num_transfer_tokens
from dlmspec.backends.megatron.objective import MaskedDiffusionObjective, build_objective, reduce_loss
from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.objectives.schedules import SCHEDULES, MaskingSchedule, masking_schedule

MASK = 63
T = [0.001, 0.05, 0.2, 0.37, 0.5, 0.71, 0.9, 0.999, 1.0]
SCHEDULE_CASES = [MaskingSchedule("linear"), MaskingSchedule("cosine"), MaskingSchedule("polynomial", 2.0),
                  MaskingSchedule("polynomial", 0.5), MaskingSchedule("polynomial", 3.5)]


def _closed_form(schedule: MaskingSchedule, t: float) -> tuple[float, float]:
    """(alpha(t), weight(t)) written out: linear 1 - t, 1/t; cosine 1 - cos(pi/2 (1-t)),
    pi/2 tan(pi/2 (1-t)); polynomial 1 - t^a, a/t (MD4's table; MDLM eq. 10's weight)."""
    a = schedule.exponent
    if schedule.name == "linear":
        return 1 - t, 1 / t
    if schedule.name == "cosine":
        return 1 - math.cos(math.pi / 2 * (1 - t)), math.pi / 2 * math.tan(math.pi / 2 * (1 - t))
    return 1 - t ** a, a / t


@pytest.mark.parametrize("schedule", SCHEDULE_CASES, ids=lambda s: f"{s.name}-{s.exponent:g}")
def test_alpha_and_weight_equal_the_closed_forms(schedule: MaskingSchedule) -> None:
    for t in T:
        alpha, weight = _closed_form(schedule, t)
        assert schedule.alpha(t) == pytest.approx(alpha, rel=1e-12, abs=1e-15)
        assert schedule.weight(t) == pytest.approx(weight, rel=1e-9)


@pytest.mark.parametrize("schedule", SCHEDULE_CASES, ids=lambda s: f"{s.name}-{s.exponent:g}")
def test_alpha_runs_from_clean_to_fully_masked(schedule: MaskingSchedule) -> None:
    assert schedule.alpha(0.0) == pytest.approx(1.0, abs=1e-15)
    assert schedule.alpha(1.0) == pytest.approx(0.0, abs=1e-15)
    values = [schedule.alpha(t) for t in T]
    assert values == sorted(values, reverse=True)  # monotone: more masked as t grows


@pytest.mark.parametrize("schedule", SCHEDULE_CASES, ids=lambda s: f"{s.name}-{s.exponent:g}")
def test_derivative_matches_a_central_difference(schedule: MaskingSchedule) -> None:
    h = 1e-6
    for t in [0.05, 0.2, 0.5, 0.8, 0.95]:
        numeric = (schedule.alpha(t + h) - schedule.alpha(t - h)) / (2 * h)
        assert schedule.alpha_derivative(t) == pytest.approx(numeric, rel=1e-6)
        assert schedule.weight(t) == pytest.approx(-numeric / (1 - schedule.alpha(t)), rel=1e-6)


@pytest.mark.parametrize("schedule", SCHEDULE_CASES, ids=lambda s: f"{s.name}-{s.exponent:g}")
def test_weight_integrates_to_the_schedule_free_nelbo(schedule: MaskingSchedule) -> None:
    """MDLM sec. 3.2: int_d^1 w(t) (1 - alpha(t)) dt = alpha(d) - alpha(1) (-> 1 as d -> 0) whatever the
    schedule (the expected weight of one token), checked by the midpoint rule on [d, 1]."""
    n, d = 200_000, 1e-3
    h = (1 - d) / n
    total = sum(schedule.weight(d + (i + 0.5) * h) * schedule.mask_probability(d + (i + 0.5) * h) for i in range(n)) * h
    assert total == pytest.approx(schedule.alpha(d) - schedule.alpha(1.0), rel=1e-6)


def test_torch_and_math_evaluate_the_same_formula() -> None:
    t = torch.tensor(T, dtype=torch.float64)
    for schedule in SCHEDULE_CASES:
        assert torch.allclose(schedule.weight(t, torch), torch.tensor([schedule.weight(x) for x in T],
                                                                      dtype=torch.float64), rtol=1e-12)


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(ValueError, match="noise_schedule must be one of"):
        MaskingSchedule("sqrt")
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="noise_schedule_exponent"):
            MaskingSchedule("polynomial", bad)
    assert masking_schedule(None, None) == MaskingSchedule("linear") and SCHEDULES == ("linear", "cosine", "polynomial")
    assert MaskingSchedule("polynomial", 1.0).is_linear and not MaskingSchedule("cosine").is_linear


# ---- the training loss ------------------------------------------------------------------------


def _old_linear(tokens: torch.Tensor, seed: int, eps: float = 1e-3):
    """The linear MDM estimator as it was written before schedules: t = eps + (1 - eps) u, masked
    where the per-token uniform is below t, weight 1/t (the same draws, in the same order)."""
    g = torch.Generator().manual_seed(seed)
    b, s = tokens.shape
    u = torch.rand(b, generator=g, dtype=torch.float32)
    t = eps + (1.0 - eps) * u
    draws = torch.rand(b, s, generator=g, dtype=torch.float32)
    masked = draws < t.unsqueeze(1)
    weights = torch.where(masked, 1.0 / t.unsqueeze(1), torch.zeros(b, s))
    return masked, weights


def test_linear_loss_is_bit_identical_to_the_estimator_before_schedules() -> None:
    tokens = torch.randint(0, 60, (64, 32), generator=torch.Generator().manual_seed(1))
    ce = torch.rand(64, 32, generator=torch.Generator().manual_seed(2))
    for objective in (MaskedDiffusionObjective(MASK), build_objective(ObjectiveConfig(mask_token_id=MASK)),
                      MaskedDiffusionObjective(MASK, noise_schedule="polynomial", noise_schedule_exponent=1.0)):
        ob = objective.prepare({"tokens": tokens}, torch.Generator().manual_seed(7))
        masked, weights = _old_linear(tokens, 7)
        assert torch.equal(ob.masked, masked) and torch.equal(ob.loss_weights, weights)
        old = (ce * weights).sum()
        assert torch.equal(reduce_loss(ce, ob)[0], old)


@pytest.mark.parametrize("name,exponent,share", [("cosine", 1.0, 2 / math.pi), ("polynomial", 2.0, 1 / 3),
                                                 ("polynomial", 0.5, 2 / 3)])
def test_schedule_reaches_the_mask_rate_and_the_loss_weight(name: str, exponent: float, share: float) -> None:
    config = ObjectiveConfig(mask_token_id=MASK, eps=1e-3, noise_schedule=name, noise_schedule_exponent=exponent)
    objective = build_objective(config)
    schedule = objectives.get("mdm").schedule(config)
    tokens = torch.zeros(20_000, 16, dtype=torch.int64)
    ob = objective.prepare({"tokens": tokens}, torch.Generator().manual_seed(3))
    # the draws of t are the linear schedule's; each row's mask rate is 1 - alpha(t) of its t
    assert float(ob.masked.float().mean()) == pytest.approx(share, abs=0.01)
    expected = schedule.weight(ob.mask_ratio.double(), torch).float()
    rows, cols = ob.masked.nonzero(as_tuple=True)
    assert torch.allclose(ob.loss_weights[rows, cols], expected[rows], rtol=1e-6)
    assert (ob.loss_weights[~ob.masked] == 0).all()
    # the estimator's expectation is the schedule-free one: E[sum w 1[masked]] / s = (alpha(eps) - 0) / (1 - eps)
    per_token = float(ob.loss_weights.double().sum()) / ob.loss_weights.numel()
    assert per_token == pytest.approx(schedule.alpha(1e-3) / (1 - 1e-3), rel=0.05)


# ---- the sampler ------------------------------------------------------------------------------


def test_linear_transfer_schedule_is_llada_split() -> None:
    counts = torch.tensor([10, 7, 0, 33])
    for schedule in (None, MaskingSchedule("linear"), MaskingSchedule("polynomial", 1.0)):
        got = num_transfer_tokens(counts, 4, schedule)
        assert got.tolist() == [[3, 3, 2, 2], [2, 2, 2, 1], [0, 0, 0, 0], [9, 8, 8, 8]]


@pytest.mark.parametrize("schedule", [MaskingSchedule("cosine"), MaskingSchedule("polynomial", 2.0),
                                      MaskingSchedule("polynomial", 0.5)], ids=lambda s: f"{s.name}-{s.exponent:g}")
def test_transfer_schedule_follows_alpha(schedule: MaskingSchedule) -> None:
    counts = torch.tensor([64, 17, 1, 0])
    steps = 8
    got = num_transfer_tokens(counts, steps, schedule)
    assert got.sum(dim=1).tolist() == counts.tolist() and bool((got >= 0).all())
    remaining = counts.unsqueeze(1) - got.cumsum(dim=1)
    for k in range(steps):
        t_next = 1 - (k + 1) / steps
        want = [math.floor(n * (1 - schedule.alpha(t_next)) + 0.5) if k < steps - 1 else 0 for n in counts.tolist()]
        assert remaining[:, k].tolist() == want


def test_cosine_unmasks_fewer_tokens_first_than_linear() -> None:
    counts = torch.tensor([64])
    cosine, linear = num_transfer_tokens(counts, 8, MaskingSchedule("cosine")), num_transfer_tokens(counts, 8)
    # 1 - alpha(7/8) = cos(pi/16) = 0.981: the cosine schedule commits 1 token in its first step, linear 8
    assert cosine[0, 0] == 1 and linear[0, 0] == 8


# ---- eval's ELBO ------------------------------------------------------------------------------


def _uniform_logits(vocab: int):
    def logits_fn(tokens, attention_mask=None):
        return torch.zeros(*tokens.shape, vocab)
    return logits_fn


@pytest.mark.parametrize("schedule", [None, MaskingSchedule("cosine"), MaskingSchedule("polynomial", 2.0)],
                         ids=["linear", "cosine", "polynomial-2"])
def test_time_elbo_has_the_schedule_free_expectation(schedule) -> None:
    """A model of uniform logits over V tokens: each masked token costs log V, so the time estimator's
    expectation is L log V int_eps^1 w(t)(1 - alpha(t)) dt / (1 - eps) = L log V alpha(eps) / (1 - eps)."""
    vocab, length, eps = 50, 12, 1e-3
    tokens = torch.randint(0, vocab - 1, (1, length), generator=torch.Generator().manual_seed(0))
    res = elbo_nll(_uniform_logits(vocab), tokens, mask_token_id=vocab - 1, generator=torch.Generator().manual_seed(5),
                   estimator="time", num_samples=4000, samples_per_forward=500, eps=eps, schedule=schedule)
    alpha_eps = (schedule or MaskingSchedule("linear")).alpha(eps)
    want = length * math.log(vocab) * alpha_eps / (1 - eps)
    assert float(res.nll[0]) == pytest.approx(want, abs=4 * float(res.stderr[0]))


def test_linear_elbo_draws_are_unchanged_by_the_schedule_argument() -> None:
    vocab = 20
    tokens = torch.randint(0, vocab - 1, (2, 9), generator=torch.Generator().manual_seed(0))
    a = elbo_nll(_uniform_logits(vocab), tokens, mask_token_id=vocab - 1, generator=torch.Generator().manual_seed(1),
                 estimator="time", num_samples=8)
    b = elbo_nll(_uniform_logits(vocab), tokens, mask_token_id=vocab - 1, generator=torch.Generator().manual_seed(1),
                 estimator="time", num_samples=8, schedule=MaskingSchedule("linear"))
    assert torch.equal(a.samples, b.samples)
