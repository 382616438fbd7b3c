"""The optimizer-state options of ``[train]`` with their defaults filled in: the values
megatron-core's ``OptimizerConfig`` gets (``templates/train.py.j2``), the rules read
(:mod:`dlmspec.check.optimizer`) and the planner counts (:mod:`dlmspec.plan.optimizer_state`).

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

#: megatron-core ``OptimizerConfig`` dtype field values per spec dtype name (Megatron-LM
#: ``arguments.py`` ``dtype_map``: fp8 is ``torch.uint8``, Transformer Engine's FusedAdam fp8 state).
TORCH_DTYPES: dict[str, str] = {
    "fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.uint8",
}

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
    def any_set(self) -> bool:
        """Whether any option differs from megatron-core's plain optimizer (the compiled job
        then passes them to ``OptimizerConfig``)."""
        return self != OptimizerOptions()

    @property
    def low_precision_dtypes(self) -> list[str]:
        """The dtype keys set to something other than fp32, in :data:`KEYS` order."""
        return [k for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
                if getattr(self, k) != "fp32"]

    def config_kwargs(self) -> dict[str, str]:
        """``OptimizerConfig`` keyword -> Python source of its value (dtypes as ``torch.*``), for
        the options that differ from megatron-core's defaults, plus ``optimizer_offload_fraction``
        whenever CPU offload is on (megatron-core's default 0.0 is not the spec's)."""
        out: dict[str, str] = {}
        core_defaults = {**DEFAULTS, "optimizer_offload_fraction": 0.0}
        for key in KEYS:
            value = getattr(self, key)
            if key == "optimizer_offload_fraction" and not self.optimizer_cpu_offload:
                continue
            if value == core_defaults[key]:
                continue
            out[key] = TORCH_DTYPES[value] if key.endswith("_dtype") else repr(value)
        return out


def optimizer_options(train: Any) -> OptimizerOptions:
    """The :class:`OptimizerOptions` of a ``[train]`` table (a spec model, the fast path's table
    or anything with the keys as attributes; a missing or ``None`` key takes :data:`DEFAULTS`)."""
    values = {}
    for key in KEYS:
        value = getattr(train, key, None)
        values[key] = DEFAULTS[key] if value is None else value
    return OptimizerOptions(**values)
