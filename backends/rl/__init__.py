"""Reinforcement learning for diffusion and autoregressive LMs (``[stage] kind = "rl"``): group
advantages, the clipped policy loss, log-probability estimators, rewards, prompts, and the RL
stage of the training loop (:mod:`dlmspec.backends.rl.stage`)."""
