"""The RL stage's rollout engine (backends/rl/rollout.py) on a tiny CPU model: groups of
completions from the sampler, rewards and group advantages, failed rewards and flat groups left out
of the loss, the truncated-completion policy, the prompt order over ranks, training steps, the
samples file, and a resume that draws the rollouts of an uninterrupted run."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch

from dlmspec.backends.rl.rollout import (RLConfig, completion_mask, estimator_generator, rollout_metrics,
                                         write_samples)
from dlmspec.files import FileRefused

from dlmspec.backends.rl.rollout import RolloutEngine
from rl_kit import EOS, MASK, PAD, ROWS, CharTokenizer, TinyLM, config, core, engine, logits_fn, train_steps


def test_a_rollout_is_groups_of_completions_with_group_normalised_advantages() -> None:
    eng = engine()
    r = eng.rollout(logits_fn(TinyLM()))
    G, P = 4, r.prompt_length
    assert r.tokens.shape == (8, P + 6) and r.completion_mask.shape == (8, 6)
    # group-major: the 4 rows of a group share their prompt
    assert all(torch.equal(r.tokens[g * G, :P], r.tokens[g * G + k, :P]) for g in range(2) for k in range(G))
    totals = torch.tensor([s["total"] for s in r.samples])
    for g in range(2):
        t = totals[g * G:(g + 1) * G]
        want = (t - t.mean()) / (t.std() + 1e-4)
        assert torch.allclose(r.advantages[g * G:(g + 1) * G].cpu(), want, atol=1e-5)
    assert r.stats.completions == 8 and r.stats.groups == 2 and r.stats.seconds > 0
    assert r.stats.generated_tokens == int(r.completion_mask.sum())


def test_completion_mask_ends_at_the_first_eos() -> None:
    mask, ended = completion_mask(torch.tensor([[3, EOS, 4, EOS], [1, 2, 3, 4]]), EOS)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, True]]
    assert ended.tolist() == [True, False]


def test_a_failed_reward_gives_its_completion_no_gradient_and_is_counted() -> None:
    def flaky(prompt, completion, prompt_id=0, **row):
        if prompt_id % 2 == 0:
            raise RuntimeError("boom")
        return "not a number" if prompt_id == 1 else 1.0

    eng = engine(config(rewards=(("bad.py:flaky", 1.0),)), rl_core=core([flaky], [1.0]))
    eng.order = torch.arange(len(ROWS))  # prompts 0 (raises) and 1 (not a number)
    r = eng.rollout(logits_fn(TinyLM()))
    assert not bool(r.keep.any()) and float(r.advantages.abs().sum()) == 0.0
    assert r.stats.failures == 8 and r.stats.total_count == 0
    assert all(s["total"] is None for s in r.samples)


def test_filter_groups_drops_groups_whose_rewards_do_not_vary() -> None:
    constant = core([lambda prompt, completion, **row: 1.0], [1.0])
    eng = engine(config(filter_groups=True, rewards=(("c.py:one", 1.0),)), rl_core=constant)
    r = eng.rollout(logits_fn(TinyLM()))
    assert not bool(r.keep.any()) and r.stats.flat_groups == 2 and r.stats.filtered_groups == 2
    kept = engine(config(filter_groups=False, rewards=(("c.py:one", 1.0),)), rl_core=core([lambda p, c, **r: 1.0], [1.0]))
    r2 = kept.rollout(logits_fn(TinyLM()))
    assert bool(r2.keep.all()) and r2.stats.flat_groups == 2 and r2.stats.filtered_groups == 0


@pytest.mark.parametrize("policy", ["keep", "mask", "zero_reward"])
def test_truncated_completions_follow_the_configured_policy(policy: str) -> None:
    one = core([lambda prompt, completion, **row: 1.0], [1.0])
    eng = engine(config(truncated_completions=policy, rewards=(("c.py:one", 1.0),)), rl_core=one)
    # a model that never says EOS: every completion reaches gen_length
    model = TinyLM()
    with torch.no_grad():
        model.out.bias[EOS] = -1e4
    r = eng.rollout(logits_fn(model))
    assert r.stats.truncated == 8 and r.stats.eos_terminated == 0
    totals = [s["total"] for s in r.samples]
    assert bool(r.keep.all()) == (policy != "mask")
    assert totals == ([0.0] * 8 if policy == "zero_reward" else [1.0] * 8)


def test_ranks_take_disjoint_shares_of_each_prompt_batch_in_a_seeded_order() -> None:
    cfg = config(grpo_prompts_per_step=4)
    a, b, whole = engine(cfg, rank=0, ranks=2), engine(cfg, rank=1, ranks=2), engine(cfg)
    for _ in range(3):  # 6 prompts, 4 a batch: each batch starts a new epoch's order (the tail of 2 is dropped)
        pa, pb, pw = a.next_prompts(), b.next_prompts(), whole.next_prompts()
        assert pa + pb == pw and not set(pa) & set(pb) and len(set(pw)) == 4
    assert whole.epoch == 2
    with pytest.raises(ValueError, match="does not split over 3"):
        engine(config(grpo_prompts_per_step=4), ranks=3)


def test_training_steps_move_the_policy_and_the_ratio_starts_at_one() -> None:
    eng = engine(config(grpo_iterations=2, grpo_clamp_eps_lower=0.2, grpo_clamp_eps_upper=0.28))
    model = TinyLM()
    before = [p.detach().clone() for p in model.parameters()]
    r = eng.rollout(logits_fn(model), policy_fn=logits_fn(model))
    # the first inner iteration compares with the training forward's own values; the second was scored
    assert r.old_logp is not None and len(r.old_logp) == 2 and r.old_logp[0] is None
    assert r.old_logp[1].shape == r.completion_mask.shape
    for inner in (0, 1):  # before any update, with the second iteration's draws: the ratio is exactly 1
        _, stats = eng.loss(model, r, slice(0, 4), inner, 0)
        assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_fraction"] == 0.0
    made, losses = train_steps(eng, model, 2)
    assert len(made) == 2 and len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_the_ar_algorithm_samples_left_to_right_and_scores_exact_log_probabilities() -> None:
    eng = engine(config(algorithm="grpo", generate=dict(gen_length=6, temperature=1.0)))
    model = TinyLM(causal=True)
    r = eng.rollout(logits_fn(model))
    assert r.tokens.shape[1] == r.prompt_length + 6
    logp = eng.logp(model, r, slice(0, 2), 0, 0)
    full = torch.log_softmax(model(r.tokens[:2], r.attention[:2] if r.attention is not None else None), -1)
    P = r.prompt_length
    want = full[:, P - 1:-1].gather(-1, r.tokens[:2, P:].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logp, want, atol=1e-5)


class _Counted:
    """``logits_fn(model)`` counting the rows it is called on."""

    def __init__(self, model) -> None:
        self.fn, self.rows = logits_fn(model), 0

    def __call__(self, tokens, attention=None):
        self.rows += tokens.shape[0]
        return self.fn(tokens, attention)


@pytest.mark.parametrize("algorithm", ["grpo", "diffu-grpo"])
def test_the_ar_estimator_scores_the_old_policy_and_the_reference_once_per_rollout_batch(algorithm) -> None:
    from dlmspec.backends.rl import estimators

    mu = 3
    causal = algorithm == "grpo"
    real = dataclasses.replace(core(causal=causal), estimator=estimators.get("ar" if causal else "one-step"))
    eng = engine(config(algorithm=algorithm, grpo_iterations=mu, grpo_kl_beta=0.04,
                        generate=dict(gen_length=6, steps=6, block_length=6, temperature=1.0)), rl_core=real)
    policy, reference = TinyLM(causal=causal, seed=0), TinyLM(causal=causal, seed=1)
    old, ref = _Counted(policy), _Counted(reference)
    r = eng.rollout(logits_fn(policy), policy_fn=old, reference_fn=ref)
    rows = r.rows
    assert r.old_logp[0] is None and len(r.old_logp) == len(r.ref_logp) == mu
    if causal:  # no draws: one pass each, shared by the iterations
        assert (old.rows, ref.rows) == (rows, rows)
        assert all(t is r.old_logp[1] for t in r.old_logp[1:]) and all(t is r.ref_logp[0] for t in r.ref_logp)
    else:  # fresh masks per iteration: the old policy for iterations 2..mu, the reference for each
        assert (old.rows, ref.rows) == ((mu - 1) * rows, mu * rows)
        assert not torch.equal(r.ref_logp[0], r.ref_logp[1])
    mb = eng.micro_batch_size
    for inner in range(mu):  # every iteration's scores are what that iteration's draws give, microbatch by microbatch
        want = torch.cat([eng.logp(logits_fn(reference), r, slice(s, s + mb), inner, k).float()
                          for k, s in enumerate(range(0, rows, mb))])
        assert torch.allclose(r.ref_logp[inner], want, atol=1e-6)


def test_the_reference_log_probabilities_are_made_with_the_rollout() -> None:
    eng = engine(config(grpo_kl_beta=0.04))
    policy, reference = TinyLM(seed=0), TinyLM(seed=1)
    r = eng.rollout(logits_fn(policy), reference_fn=logits_fn(reference))
    assert r.ref_logp is not None and r.ref_logp[0].shape == r.completion_mask.shape
    _, stats = eng.loss(policy, r, slice(0, 4), 0, 0)
    assert stats["kl"] > 0


def test_resume_draws_the_rollouts_of_an_uninterrupted_run() -> None:
    cfg = config(grpo_prompts_per_step=4, grpo_group_size=2)
    straight, model = engine(cfg), TinyLM()
    runs, _ = train_steps(straight, model, 4)

    first, model_b = engine(cfg), TinyLM()
    train_steps(first, model_b, 2)
    state = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in first.state_dict().items()}
    weights = {k: v.clone() for k, v in model_b.state_dict().items()}

    resumed, model_c = engine(cfg), TinyLM(seed=99)
    model_c.load_state_dict(weights)
    resumed.load_state_dict(state)
    rest, _ = train_steps(resumed, model_c, 2)
    for a, b in zip(runs[2:], rest):
        assert torch.equal(a.tokens, b.tokens) and a.index == b.index
        assert torch.equal(a.advantages, b.advantages)
    # without the saved state the draws differ
    fresh, model_d = engine(cfg), TinyLM(seed=99)
    model_d.load_state_dict(weights)
    other, _ = train_steps(fresh, model_d, 1)
    assert not torch.equal(other[0].tokens, runs[2].tokens)


def test_estimator_draws_differ_per_inner_iteration_and_repeat_per_rollout() -> None:
    a = torch.rand(5, generator=estimator_generator(1, 2, 0, 0, 3))
    assert torch.equal(a, torch.rand(5, generator=estimator_generator(1, 2, 0, 0, 3)))
    assert not torch.equal(a, torch.rand(5, generator=estimator_generator(1, 2, 1, 0, 3)))


def test_rollout_metrics_are_means_and_stds_of_the_summed_reports() -> None:
    eng = engine()
    r = eng.rollout(logits_fn(TinyLM()))
    m = rollout_metrics(r.stats.vector(), eng.functions)
    totals = torch.tensor([s["total"] for s in r.samples])
    assert m["rl/reward_mean"] == pytest.approx(float(totals.mean()), abs=1e-6)
    assert m["rl/reward_std"] == pytest.approx(float(totals.std(unbiased=False)), abs=1e-5)
    exact = [s["rewards"]["builtin:exact_match"] for s in r.samples]
    assert m["rl/accuracy"] == pytest.approx(sum(exact) / 8)
    assert m["rl/completion_length"] == pytest.approx(float(r.completion_mask.sum()) / 8)
    assert m["rl/rollout_tokens_per_s"] == pytest.approx(r.stats.generated_tokens / r.stats.seconds)


def test_reward_seconds_are_the_scoring_of_the_batch_apart_from_the_samplers() -> None:
    """``rl/reward_seconds`` holds the reward functions' time (host work the plan does not price);
    ``rl/rollout_seconds`` stays the sampler's: a scorer that takes 0.3 s adds it to the first only."""
    import time

    class Slow:
        def __init__(self, inner):
            self.inner = inner

        def score(self, rows):
            time.sleep(0.3)
            return self.inner.score(rows)

        def close(self):
            self.inner.close()

    eng = engine()
    eng._scorer = Slow(eng.scorer)
    r = eng.rollout(logits_fn(TinyLM()))
    m = rollout_metrics(r.stats.vector(), eng.functions)
    assert m["rl/reward_seconds"] == r.stats.reward_seconds >= 0.3
    assert m["rl/rollout_seconds"] == r.stats.seconds
    two_ranks = [a + b for a, b in zip(r.stats.vector(), r.stats.vector())]
    assert rollout_metrics(two_ranks, eng.functions)["rl/reward_seconds"] == pytest.approx(r.stats.reward_seconds)


def test_samples_are_appended_as_json_lines_and_never_through_a_link(tmp_path) -> None:
    eng = engine()
    r = eng.rollout(logits_fn(TinyLM()))
    write_samples(str(tmp_path), r.samples, 0)
    write_samples(str(tmp_path), r.samples, 1)
    lines = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == 16 and {x["step"] for x in lines} == {0, 1}
    assert set(lines[0]) >= {"prompt", "completion", "rewards", "total", "advantage", "finish_reason"}
    target, link = tmp_path / "elsewhere.txt", tmp_path / "linked"
    target.write_text("kept\n")
    link.mkdir()
    os.symlink(target, link / "rollouts.jsonl")
    with pytest.raises(FileRefused, match="symbolic link"):
        write_samples(str(link), r.samples, 2)
    assert target.read_text() == "kept\n"


def test_config_refuses_unknown_choices() -> None:
    with pytest.raises(ValueError, match="algorithm"):
        RLConfig(algorithm="ppo")
    with pytest.raises(ValueError, match="truncated_completions"):
        RLConfig(truncated_completions="drop")
    assert RLConfig(algorithm="coupled-grpo").estimator_name == "coupled"
    assert not RLConfig(algorithm="grpo").diffusion and PAD != EOS


@pytest.mark.parametrize("algorithm", ["diffu-grpo", "coupled-grpo", "grpo"])
def test_the_rl_package_runs_a_rollout_and_a_loss(algorithm: str, tmp_path) -> None:
    """The engine with backends/rl's own modules (reward workers, estimators, loss): each
    algorithm's rollout is scored and its loss has a gradient."""
    from dlmspec.backends.rl.rollout import default_core

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    cfg = config(algorithm=algorithm, prompts=str(prompts), reward_workers=1,
                 rewards=(("builtin:exact_match", 1.0), ("builtin:format", 0.5)))
    causal = algorithm == "grpo"
    eng = RolloutEngine(cfg, tokenizer=CharTokenizer(), mask_id=None if causal else MASK, eos_id=EOS, pad_id=PAD,
                        seed=3, micro_batch_size=4, core=default_core(cfg))
    try:
        model = TinyLM(causal=causal)
        r = eng.rollout(logits_fn(model))
        assert r.stats.completions == 8 and r.stats.failures == 0 and r.stats.judged == 8
        loss, stats = eng.loss(model, r, slice(0, 4), 0, 0)
        loss.backward()
        assert math.isfinite(float(loss)) and "clip_fraction" in stats
        assert any(p.grad is not None for p in model.parameters())
    finally:
        eng.close()
