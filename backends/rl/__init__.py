"""Reinforcement learning for diffusion and autoregressive LMs: the algorithmic core of the RL
stage (``[stage] kind = "rl"``).

- :mod:`~dlmspec.backends.rl.advantages`: group-normalised advantages (GRPO, Dr. GRPO) and the
  filter of groups whose rewards do not vary (DAPO).
- :mod:`~dlmspec.backends.rl.loss`: the clipped ratio objective with asymmetric bounds, the k3 KL
  penalty to a frozen reference and the per-token / per-sequence / per-group normalisations.
- :mod:`~dlmspec.backends.rl.estimators`: per-token log-probability estimators behind one
  interface: ``"one-step"`` (d1's diffu-GRPO), ``"coupled"`` (DiffuCoder's coupled-GRPO),
  ``"mc-elbo"`` (K Monte-Carlo ELBO samples) and ``"ar"`` (exact next-token log-probabilities).
- :mod:`~dlmspec.backends.rl.rewards`: reward functions run in a pool of worker processes, each
  call with a timeout; failures are reported, never raised.
- :mod:`~dlmspec.backends.rl.prompts`: the prompt file (JSON lines).
- :mod:`~dlmspec.backends.rl.rollout`: one rank's rollouts, rewards, advantages and policy loss
  (pure torch), and :mod:`~dlmspec.backends.rl.stage`: the RL stage of the training loop.

Importing this package imports nothing: each module is imported where it is used (the reward
workers import :mod:`~dlmspec.backends.rl.reward_worker` only, which needs no torch).
"""
