"""The RL stage's algorithms and the values its registration renders into ``train.py``.

Base layer (no spec, resolve or check import): :mod:`dlmspec.stages` registers the ``rl`` kind
with :func:`rollout_values`; the rules of :mod:`dlmspec.check.rl` read the same tables.
"""

from __future__ import annotations

from typing import Any

ALGORITHMS: dict[str, tuple[bool, str, str]] = {
    "diffu-grpo": (True, "one-step", "d1, Zhao et al. 2025, sec. 3.2 (one-step log-probability estimate)"),
    "coupled-grpo": (True, "coupled", "DiffuCoder, Gong et al. 2025, sec. 5 (complementary mask pairs)"),
    "grpo": (False, "ar", "GRPO, Shao et al. 2024, eq. 3 (exact token log-probabilities)"),
}

#: Estimators that score a masked-diffusion model (the others: an autoregressive one).
DIFFUSION_ESTIMATORS = ("one-step", "coupled", "mc-elbo")

#: Builtin rewards (backends/rl/rewards.py): ``builtin:<name>``.
BUILTIN_REWARDS = ("exact_match", "format")


def rewards_of(rl: Any) -> list[tuple[str, float]]:
    """``[(function, weight)]`` of ``stage.rl.rewards``; unset (empty): ``builtin:exact_match``, weight 1."""
    return [(r.function, float(r.weight)) for r in rl.rewards] or [("builtin:exact_match", 1.0)]


def estimator_of(rl: Any) -> str:
    """The estimator the stage uses: ``stage.rl.estimator``, else the algorithm's."""
    return rl.estimator or ALGORITHMS[rl.algorithm][1]


def rollout_values(rl: Any, gen: Any) -> dict[str, Any]:
    """What ``stage_rl.py.j2`` renders into ``train.py``'s ``build_rl()``.

    Args:
        rl: ``[stage.rl]`` with its defaults filled.
        gen: ``[generate]`` with its defaults filled (the rollout sampler's settings).

    Returns:
        ``section`` (``rl``), ``estimator`` (the algorithm's when unset), ``rewards``
        (``[(function, weight)]``) and ``generate`` (``GenerateConfig`` keywords).
    """
    keys = ("gen_length", "steps", "block_length", "remasking", "threshold", "temperature", "top_k", "top_p",
            "cfg_scale", "seed", "cuda_graph")
    return {"section": rl, "estimator": estimator_of(rl), "rewards": rewards_of(rl),
            "generate": {k: getattr(gen, k) for k in keys}}
