"""The RL stage's own modules (backends/rl: advantages, estimators, the clipped policy loss) with a
real optimizer raise the mean reward of a reward a tiny model can learn, for each algorithm: the
direction of the whole update (advantage sign, ratio, estimator, loss normalisation) is right. The
loop is the stage's (a rollout batch, ``grpo_iterations`` optimizer steps over its microbatches);
rewards are scored in this process, the worker pool being tested on its own."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dlmspec.backends.rl.rollout import RLCore, default_core

from rl_kit import InProcessScorer, TinyLM, config, engine, logits_fn


def digit_share(prompt: str, completion: str, **row) -> float:
    """The share of the completion's characters that are digits (0 for an empty completion)."""
    return sum(c.isdigit() for c in completion) / len(completion) if completion else 0.0


def real_core(cfg, *, advantage_sign: float = 1.0) -> RLCore:
    """dlmspec's RL modules for ``cfg`` (``default_core``), rewards scored in this process; with
    ``advantage_sign = -1`` the advantages negated (the control: a wrong sign must lower the reward)."""
    base = default_core(cfg)
    scorer = InProcessScorer([digit_share], [1.0])
    advantages = base.group_advantages
    return dataclasses.replace(base, make_scorer=lambda rewards, workers, timeout: scorer,
                               group_advantages=lambda *a, **k: advantage_sign * advantages(*a, **k))


def mean_reward(eng, model, batches: int) -> float:
    totals = [s["total"] for _ in range(batches) for s in eng.rollout(logits_fn(model)).samples]
    return sum(totals) / len(totals)


def before_and_after(algorithm: str, advantage_sign: float = 1.0) -> tuple:
    """Mean reward of 6 rollout batches, then 40 rollout batches of training (2 Adam steps each, over
    microbatches of 4 rows), then 6 more rollout batches."""
    cfg = config(algorithm=algorithm, rewards=(("digits.py:digit_share", 1.0),), grpo_iterations=2,
                 grpo_group_size=4, grpo_prompts_per_step=2, grpo_kl_beta=0.0)
    model = TinyLM(causal=algorithm == "grpo", seed=1)
    eng = engine(cfg, rl_core=real_core(cfg, advantage_sign=advantage_sign), seed=3)
    before = mean_reward(eng, model, 6)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(40):
        r = eng.rollout(logits_fn(model), policy_fn=logits_fn(model))
        for inner in range(cfg.grpo_iterations):
            opt.zero_grad()
            for k, start in enumerate(range(0, r.rows, eng.micro_batch_size)):
                loss, _ = eng.loss(model, r, slice(start, start + eng.micro_batch_size), inner, k)
                loss.backward()
            opt.step()
    return before, mean_reward(eng, model, 6)


@pytest.mark.parametrize("algorithm", ["diffu-grpo", "coupled-grpo", "grpo"])
def test_each_algorithm_raises_the_mean_reward_of_a_learnable_reward(algorithm) -> None:
    before, after = before_and_after(algorithm)
    assert after > before + 0.5, (algorithm, before, after)  # measured: about 0.2 -> 1.0


@pytest.mark.parametrize("algorithm", ["diffu-grpo", "grpo"])
def test_negated_advantages_lower_it(algorithm) -> None:
    before, after = before_and_after(algorithm, advantage_sign=-1.0)
    assert after < before - 0.1, (algorithm, before, after)  # measured: about 0.2 -> 0.0
