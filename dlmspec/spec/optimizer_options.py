"""The optimizer-state options of ``[train]`` with their defaults filled in: the values the rules
read (:mod:`dlmspec.check.optimizer`) and the planner counts (:mod:`dlmspec.plan.optimizer_state`);
``templates/train.py.j2`` writes the keys a spec sets into megatron-core's ``OptimizerConfig``.

The spec leaves each key unset (``None``) by default so a spec that does not use them compiles to
the same bytes as before they existed; "unset" means megatron-core's default, except
``optimizer_offload_fraction``, whose unset value is Megatron-LM's ``--optimizer-offload-fraction``
default 1.0 (megatron-core's field defaults to 0.0, which offloads nothing).

Where the keys live: ``[train]``, beside the other ``OptimizerConfig`` fields (``optimizer``,
``lr``, ``adam_beta1``, ``weight_decay``, ``clip_grad``): one table per megatron-core config
(docs/spec.md, "Optimizer state").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Bytes per element of each state dtype (fp8: one byte, Transformer Engine's ``Float8Tensor``
#: with one fp32 scale per tensor, which is not counted).
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}

#: The ``[train]`` keys of this module, in the order ``OptimizerConfig`` declares its fields.
KEYS: tuple[str, ...] = (
    "use_precision_aware_optimizer", "store_param_remainders", "main_grads_dtype", "main_params_dtype",
    "exp_avg_dtype", "exp_avg_sq_dtype", "optimizer_cpu_offload", "optimizer_offload_fraction",
    "overlap_cpu_optimizer_d2h_h2d",
)

#: The value of each key when it is unset.
DEFAULTS: dict[str, Any] = {
    "use_precision_aware_optimizer": False, "store_param_remainders": True, "main_grads_dtype": "fp32",
    "main_params_dtype": "fp32", "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32",
    "optimizer_cpu_offload": False, "optimizer_offload_fraction": 1.0, "overlap_cpu_optimizer_d2h_h2d": False,
}


@dataclass(frozen=True)
class OptimizerOptions:
    """The optimizer-state options with defaults filled in (see the module docstring)."""

    use_precision_aware_optimizer: bool = False
    store_param_remainders: bool = True
    main_grads_dtype: str = "fp32"
    main_params_dtype: str = "fp32"
    exp_avg_dtype: str = "fp32"
    exp_avg_sq_dtype: str = "fp32"
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 1.0
    overlap_cpu_optimizer_d2h_h2d: bool = False

    @property
    def low_precision_dtypes(self) -> list[str]:
        """The dtype keys set to something other than fp32, in :data:`KEYS` order."""
        return [k for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
                if getattr(self, k) != "fp32"]


def optimizer_options(train: Any) -> OptimizerOptions:
    """The :class:`OptimizerOptions` of a ``[train]`` table (a spec model, the fast path's table
    or anything with the keys as attributes; a missing or ``None`` key takes :data:`DEFAULTS`)."""
    values = {}
    for key in KEYS:
        value = getattr(train, key, None)
        values[key] = DEFAULTS[key] if value is None else value
    return OptimizerOptions(**values)
