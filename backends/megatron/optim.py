"""The optimizer's learning-rate schedule, its hooks into megatron's schedules, and its state on resume.

megatron-core builds the optimizer (``get_megatron_optimizer``: fp32 main weights for bf16/fp16,
the ``DistributedOptimizer``, gradient clipping); here are the ``OptimizerParamScheduler`` of a
run's schedule, the config hooks Megatron-LM's ``setup_model_and_optimizer`` installs, and the
repairs a loaded optimizer state needs (per-parameter Adam steps, this spec's hyperparameters).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.utils import get_model_config

from .config import CheckpointConfig, ScheduleConfig
from .fsdp import uses_megatron_fsdp


#: What train.py prints before exiting 2 when the precision-aware optimizer cannot be built.
FUSED_ADAM_MISSING = (
    "train.py: [train] use_precision_aware_optimizer = true needs Transformer Engine on this machine, also on "
    "the local layers: {why}. Install Transformer Engine here, or remove use_precision_aware_optimizer (and "
    "the optimizer-state keys that need it) from [train]."
)


def fused_adam_problem(cpu_offload: bool = False) -> Optional[str]:
    """Why megatron-core 0.16.1's ``OptimizerConfig.__post_init__`` would refuse the precision-aware
    optimizer here, or None when it would not. It calls ``is_te_min_version("2.1.0")``, which raises
    a ``TypeError`` where Transformer Engine does not import (CPU offload included); without CPU
    offload it then imports ``transformer_engine.pytorch.optimizers.FusedAdam`` and asserts the
    keywords ``master_weight_dtype``, ``exp_avg_dtype``, ``exp_avg_sq_dtype``, ``use_decoupled_grad``."""
    import inspect

    try:
        import transformer_engine  # noqa: F401
    except ImportError as exc:
        return f"megatron-core reads Transformer Engine's version, and it does not import ({exc})"
    if cpu_offload:
        return None
    try:
        from transformer_engine.pytorch.optimizers import FusedAdam
    except ImportError as exc:
        return f"megatron-core builds Transformer Engine's FusedAdam, and it does not import ({exc})"
    names = inspect.signature(FusedAdam).parameters
    missing = [n for n in ("master_weight_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "use_decoupled_grad")
               if n not in names]
    return (f"this Transformer Engine's FusedAdam lacks {', '.join(missing)} (Transformer Engine >= 2.0 has them)"
            if missing else None)


def require_fused_adam(cpu_offload: bool = False) -> None:
    """Exit 2 with :data:`FUSED_ADAM_MISSING` when :func:`fused_adam_problem` finds one (train.py
    calls it before ``OptimizerConfig`` with the precision-aware optimizer, so a machine without
    Transformer Engine gets a message, not megatron-core's traceback).

    Raises:
        SystemExit: code 2.
    """
    why = fused_adam_problem(cpu_offload)
    if why is not None:
        import sys

        print(FUSED_ADAM_MISSING.format(why=why), file=sys.stderr)
        raise SystemExit(2)


def _plain_points(points) -> List[List[float]]:
    """``[[step, lr], ...]`` as plain lists of an int and a float (a checkpoint compares them)."""
    return [[int(step), float(lr)] for step, lr in points]


class PiecewiseParamScheduler(OptimizerParamScheduler):
    """megatron-core's ``OptimizerParamScheduler`` whose learning rate follows (step, lr) points
    after the warm-up: ``train.lr_decay_style = "piecewise"`` (LLaDA, arXiv:2502.09992 sec. 2.2:
    4e-4, a drop to 1e-4 after 1.2T tokens, linear to 1e-5 over the last 0.3T).

    For ``num_steps <= lr_warmup_steps`` (when warm-up is set) megatron's linear warm-up from
    ``init_lr`` to the group's ``max_lr``; after it :meth:`points_lr`, scaled by
    ``group max_lr / max_lr`` for a param group with its own peak. ``min_lr`` and
    ``lr_decay_steps`` are kept (megatron's checks and checkpoint keys) but unused. The points are
    saved in :meth:`state_dict` (``lr_points``) and checked on load as megatron checks its own
    values (``_check_and_set``: the same, or this run's with ``override_opt_param_scheduler``).
    """

    def __init__(self, *args, lr_points, **kwargs) -> None:
        if not lr_points:
            raise ValueError("the piecewise schedule needs at least one [step, lr] point (train.lr_points)")
        self.lr_points = _plain_points(lr_points)
        super().__init__(*args, **kwargs)

    def points_lr(self, step: int) -> float:
        """The points' lr at ``step``: linear between points, the later lr of a repeated step from
        that step on, the first point's lr before it and the last's after it (the same function as
        ``dlmspec.check.schedule.piecewise_lr``)."""
        points = self.lr_points
        if step < points[0][0]:
            return float(points[0][1])
        for (s0, lr0), (s1, lr1) in zip(points, points[1:]):
            if s0 <= step < s1:
                return float(lr0) + (float(lr1) - float(lr0)) * (step - s0) / (s1 - s0)
        return float(points[-1][1])

    def get_lr(self, param_group: dict) -> float:
        """The lr of ``param_group`` at ``num_steps`` (see the class)."""
        max_lr = param_group.get("max_lr", self.max_lr)
        if self.lr_warmup_steps > 0 and self.num_steps <= self.lr_warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * float(self.num_steps) / float(self.lr_warmup_steps)
        scale = max_lr / self.max_lr if self.max_lr > 0 else 1.0
        return self.points_lr(self.num_steps) * scale

    def state_dict(self) -> dict:
        """megatron's state and ``lr_points``."""
        state = super().state_dict()
        state["lr_points"] = _plain_points(self.lr_points)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        """megatron's load, and the points checked as megatron checks its values (a checkpoint of
        another style has none: this run's are kept)."""
        if state_dict.get("lr_points") is not None:
            self.lr_points = _plain_points(self._check_and_set(
                _plain_points(self.lr_points), _plain_points(state_dict["lr_points"]), "learning-rate points"))
        super().load_state_dict(state_dict)


def build_scheduler(optimizer, optimizer_config: OptimizerConfig, schedule: ScheduleConfig,
                    checkpoint: CheckpointConfig) -> OptimizerParamScheduler:
    """megatron-core's ``OptimizerParamScheduler`` for the run's schedule, stepped once per iteration.

    Linear warm-up from ``schedule.lr_warmup_init`` to ``optimizer_config.lr``, then cosine /
    linear / WSD / constant decay to ``optimizer_config.min_lr`` at ``lr_decay_iters`` (default
    ``train_iters``), or ``schedule.lr_points`` for ``lr_decay_style = "piecewise"``
    (:class:`PiecewiseParamScheduler`); the weight decay follows ``start/end_weight_decay``
    (default ``optimizer_config.weight_decay``) over ``train_iters``.

    Raises:
        ValueError: ``"piecewise"`` without ``schedule.lr_points``.
    """
    decay_iters = schedule.lr_decay_iters or schedule.train_iters
    wd = optimizer_config.weight_decay
    piecewise = schedule.lr_decay_style == "piecewise"
    cls = PiecewiseParamScheduler if piecewise else OptimizerParamScheduler
    extra = {"lr_points": schedule.lr_points} if piecewise else {}
    return cls(
        optimizer,
        init_lr=schedule.lr_warmup_init,
        max_lr=optimizer_config.lr,
        min_lr=optimizer_config.min_lr or 0.0,
        lr_warmup_steps=schedule.lr_warmup_iters,
        lr_decay_steps=decay_iters,
        lr_decay_style=schedule.lr_decay_style,
        start_wd=wd if schedule.start_weight_decay is None else schedule.start_weight_decay,
        end_wd=wd if schedule.end_weight_decay is None else schedule.end_weight_decay,
        wd_incr_steps=schedule.train_iters,
        wd_incr_style=schedule.weight_decay_incr_style,
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=checkpoint.override_scheduler_on_resume,
        wsd_decay_steps=schedule.lr_wsd_decay_iters,
        lr_wsd_decay_style=schedule.lr_wsd_decay_style,
        **extra,
    )


def install_schedule_hooks(model: List[torch.nn.Module], optimizer, ddp_config: DistributedDataParallelConfig) -> None:
    """Set the hooks Megatron-LM's ``setup_model_and_optimizer`` installs on the model config.

    megatron's schedules read them from the config: the loss scaling, the gradient
    finalisation (all-reduce and the per-token normalisation) and, with overlapped
    communication, the chunks' no-sync / grad-sync / param-sync functions.
    """
    config = get_model_config(model[0])
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if ddp_config.overlap_grad_reduce:
        no_sync = [m.no_sync for m in model]
        grad_sync = [m.start_grad_sync for m in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if ddp_config.overlap_param_gather and ddp_config.align_param_gather:
        param_sync = [m.start_param_sync for m in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync


def set_param_sync_hooks(model: List[torch.nn.Module], ddp_config: Optional[DistributedDataParallelConfig],
                         enable: bool) -> None:
    """Turn the chunks' parameter all-gather pre-forward hooks off (gathering now) or on again.

    With overlapped parameter all-gather the DistributedOptimizer's updated weights only reach
    the modules in their next forward pre-hook; the loop turns the hooks off (which forces the
    gather) before anything reads the weights outside a training forward: evaluation and saves.
    Nothing to do without ``overlap_param_gather`` or under Megatron-FSDP.
    """
    if ddp_config is None or not (ddp_config.use_distributed_optimizer and ddp_config.overlap_param_gather):
        return
    if uses_megatron_fsdp(ddp_config):
        return  # Megatron-FSDP gathers parameters in its own pre-forward hooks, also outside training
    for chunk in model:
        if enable:
            chunk.enable_forward_pre_hook()
        else:
            chunk.disable_forward_pre_hook(param_sync=True)


def optimizer_sharding_metadata(sharding: str) -> Dict[str, Any]:
    """The ``metadata`` of ``optimizer.sharded_state_dict`` for ``CheckpointConfig.optimizer_sharding``.

    Raises:
        ValueError: for a sharding other than ``"dp_reshardable"`` / ``"fully_reshardable"``.
    """
    if sharding not in ("dp_reshardable", "fully_reshardable"):
        raise ValueError(f"optimizer_sharding must be 'dp_reshardable' or 'fully_reshardable', got {sharding!r}")
    # As Megatron-LM passes it (checkpointing.py): no per-optimizer key prefix
    # for chained optimizers.
    return {"distrib_optim_sharding_type": sharding, "chained_optim_avoid_prefix": True}


def prime_optimizer_state(optimizer) -> None:
    """Give a fresh ``DistributedOptimizer`` the state tensors a load fills in.

    Without Apex/TE, ``DistributedOptimizer.state_dict()`` reads Adam's
    ``step`` from the inner torch optimizer's state, which is empty until the
    first step, so building the *loading* sharded state dict of a new optimizer
    fails.  megatron's ``_init_optimizer_states_with_dummy_values`` (one Adam
    step with zero gradients on the fp32 main weights) creates them; the load
    then overwrites main weights, moments and ``step`` from the checkpoint.
    """
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, DistributedOptimizer) and len(opt.optimizer.state) == 0:
            opt._init_optimizer_states_with_dummy_values()


#: Param-group values that come from the spec (``OptimizerConfig`` and megatron-core's
#: ``_get_param_groups``: ``max_lr``/``min_lr`` per group, which ``OptimizerParamScheduler.get_lr``
#: reads before its own); torch's ``load_state_dict`` would bring the checkpoint's back.
GROUP_HYPERPARAMETERS = ("max_lr", "min_lr", "betas", "eps", "start_wd", "end_wd", "wd_mult")


def group_hyperparameters(optimizer) -> Optional[List[Dict[str, Any]]]:
    """This run's :data:`GROUP_HYPERPARAMETERS` of each param group (``None`` without groups)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    return [{k: group[k] for k in GROUP_HYPERPARAMETERS if k in group} for group in groups]


def restore_group_hyperparameters(optimizer, before: Optional[List[Dict[str, Any]]]) -> None:
    """Put this run's param-group hyperparameters back after loading an optimizer state.

    Seen on the H200: a resume with ``train.lr`` 1e-3 -> 5e-4 logged lr 1.714e-4 at step 50 of
    the new cosine schedule, the value for ``max_lr`` 1e-3: megatron-core's param groups carry
    ``max_lr``, and the loaded optimizer state restored the checkpoint's. The learning rate and
    weight decay themselves are set by the scheduler each step.
    """
    groups = getattr(optimizer, "param_groups", None)
    if before is None or groups is None or len(before) != len(groups):
        return
    for group, values in zip(groups, before):
        group.update(values)


def unshare_optimizer_steps(optimizer) -> int:
    """Give every parameter its own Adam ``step`` tensor again; returns how many were replaced.

    megatron-core 0.16.1's ``DistributedOptimizer.load_state_dict`` (the path
    without Apex/TE) assigns *one* ``step`` tensor object to the state of every
    parameter, and torch's Adam increments each parameter's step in place, so
    after a resume the shared step grew by the number of parameters per
    optimizer step and Adam's bias corrections ``1 - beta**step`` jumped to 1
    (an effective learning-rate change of up to ``sqrt(1 - beta2**t) / (1 -
    beta1**t)``).  Seen on the GPU as a resumed run drifting from the
    uninterrupted one; cloning restores per-parameter counters.
    """
    replaced = 0
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None or not hasattr(inner, "state"):
            continue
        for state in inner.state.values():
            step = state.get("step") if isinstance(state, dict) else None
            if torch.is_tensor(step):
                state["step"] = step.clone()
                replaced += 1
    return replaced


def checkpoint_adam_steps(optimizer, state: Any) -> List[Optional[int]]:
    """The Adam step count a loaded optimizer state holds, per (chained) optimizer.

    megatron-core's ``DistributedOptimizer`` keeps torch Adam's ``step`` in the saved
    ``param_groups`` (``state["optimizer"]["param_groups"][i]["step"]``); a ``ChainedOptimizer``
    of several has one such state per optimizer (``state[i]``). ``None`` where a state has none
    (Apex / Transformer Engine Adam, other layouts).
    """
    optimizers = getattr(optimizer, "chained_optimizers", [optimizer])
    if len(optimizers) == 1:
        states = [state]
    else:
        states = [state.get(i, state.get(str(i))) if isinstance(state, dict) else
                  (state[i] if isinstance(state, (list, tuple)) and i < len(state) else None)
                  for i in range(len(optimizers))]
    steps: List[Optional[int]] = []
    for sub in states:
        groups = sub.get("optimizer", {}).get("param_groups", []) if isinstance(sub, dict) else []
        values = {int(g["step"]) for g in groups if isinstance(g, dict) and g.get("step") is not None}
        steps.append(values.pop() if len(values) == 1 else None)
    return steps


def restore_optimizer_steps(optimizer, steps: List[Optional[int]]) -> int:
    """Give every parameter's torch Adam state its own ``step`` tensor holding the checkpoint's count.

    megatron-core 0.16.1's ``DistributedOptimizer`` without Apex/TE, loading a
    ``dp_reshardable`` checkpoint: ``load_state_dict`` puts *one* tensor with the saved step
    (from ``param_groups``) in every parameter's state, then
    ``load_parameter_state_from_dp_reshardable`` copies into it each parameter's ``step`` of the
    loading sharded state dict, a ``LocalNonpersistentObject`` of the tensor
    :func:`prime_optimizer_state`'s dummy step made: 1. So a resumed run restarted Adam's bias
    corrections (``1 - beta**step``) at step 2: its first updates after the stop were up to
    ``sqrt(1 - beta2**2) / (1 - beta1**2)`` = 1.6 times the uninterrupted run's (seen on the H200 with
    bitwise-reproducible kernels: the resumed run left the uninterrupted one at the first update
    after the stop). Also undoes the sharing (:func:`unshare_optimizer_steps`).

    Args:
        optimizer: megatron's optimizer after ``load_state_dict``.
        steps: :func:`checkpoint_adam_steps` of the loaded state (``None``: leave that optimizer's
            counts as loaded, unshared).

    Returns:
        How many parameter states got a new ``step`` tensor.
    """
    replaced = 0
    optimizers = getattr(optimizer, "chained_optimizers", [optimizer])
    for opt, step in zip(optimizers, list(steps) + [None] * (len(optimizers) - len(steps))):
        inner = getattr(opt, "optimizer", None)
        if inner is None or not hasattr(inner, "state"):
            continue
        for state in inner.state.values():
            current = state.get("step") if isinstance(state, dict) else None
            if torch.is_tensor(current):
                state["step"] = current.clone() if step is None else torch.full_like(current, float(step))
                replaced += 1
    return replaced
