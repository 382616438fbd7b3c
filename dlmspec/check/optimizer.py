"""Rules of the optimizer-state options of ``[train]`` (:mod:`dlmspec.spec.optimizer_options`):
what megatron-core 0.16.1 refuses when it builds the optimizer, and what Megatron-LM refuses
before it (the precision-aware optimizer, its state dtypes and CPU offload).

Sources, per rule: ``megatron/core/optimizer/optimizer_config.py`` ``OptimizerConfig.__post_init__``
(adam only, distributed optimizer only, Transformer Engine importable: ``is_te_min_version`` raises
a ``TypeError`` without it, CPU offload included; its ``FusedAdam`` unless CPU offload; fp32 dtypes
without the precision-aware optimizer); ``megatron/core/optimizer/__init__.py``
``_get_megatron_optimizer_based_on_param_groups`` (CPU offload builds ``HybridDeviceOptimizer``
with ``param_update_in_fp32=True`` and torch AdamW: fp32 master weights and moments, whatever the
dtype fields say); Megatron-LM ``megatron/training/arguments.py`` ``validate_args`` (CPU offload
only with the precision-aware optimizer; ``--main-grads-dtype bf16`` only without fp32 gradient
accumulation, the DDP buffer the decoupled gradient views:
``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads``).

:data:`MEGATRON_CORE_CONFIG_RULES` names the rules that mirror ``OptimizerConfig.__post_init__``
itself: ``tests/integration/render/test_optimizer_config_accepted.py`` builds the compiled
``OptimizerConfig`` for a grid of options and holds these rules to refuse exactly what it refuses.
"""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.spec.optimizer_options import optimizer_options

#: Rules that mirror ``OptimizerConfig.__post_init__`` (with Transformer Engine's FusedAdam
#: importable): they fire exactly when megatron-core 0.16.1 raises building the config.
MEGATRON_CORE_CONFIG_RULES = frozenset({
    "precision-aware-needs-adam", "precision-aware-needs-distributed-optimizer", "optimizer-dtypes-need-precision-aware",
})

#: The state dtypes CPU offload does not keep (the hybrid optimizer's fp32 master weights and moments).
OFFLOAD_STATE_KEYS = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")


def _dtype_keys_set(ctx: Context, keys: tuple[str, ...]) -> tuple[str, ...]:
    """``train.<key>`` of each of ``keys`` whose value is not fp32."""
    opts = optimizer_options(ctx.spec.train)
    return tuple(f"train.{k}" for k in keys if getattr(opts, k) != "fp32")


def _enable_precision_aware(ctx: Context) -> Fix:
    """The keys that turn the precision-aware optimizer on where nothing else refuses it: adam,
    the distributed optimizer, a bf16 DDP buffer for bf16 main gradients, no low-precision state
    dtypes with CPU offload."""
    spec, opts = ctx.spec, optimizer_options(ctx.spec.train)
    changes: dict = {"train.use_precision_aware_optimizer": True}
    if spec.train.optimizer != "adam":
        changes["train.optimizer"] = "adam"
    if not spec.parallel.use_distributed_optimizer:
        changes["parallel.use_distributed_optimizer"] = True
    if spec.parallel.fsdp != "none":
        changes["parallel.fsdp"] = "none"
        changes["parallel.data_parallel_sharding_strategy"] = "no_shard"
    if opts.main_grads_dtype == "bf16" and spec.parallel.grad_reduce_in_fp32:
        changes["parallel.grad_reduce_in_fp32"] = False
    unset = _dtype_keys_set(ctx, OFFLOAD_STATE_KEYS) if opts.optimizer_cpu_offload else ()
    return Fix(changes, unset)


@rule(
    "precision-aware-needs-adam",
    "error",
    "megatron.core.optimizer.optimizer_config.OptimizerConfig.__post_init__ "
    "(--use-precision-aware-optimizer only supported with adam)",
    "the precision-aware optimizer runs with train.optimizer = 'adam'",
)
def _needs_adam(ctx: Context) -> Iterator[Finding]:
    if optimizer_options(ctx.spec.train).use_precision_aware_optimizer and ctx.spec.train.optimizer != "adam":
        yield Finding("train.optimizer", "the precision-aware optimizer is megatron-core's Adam only",
                      fix=Fix({"train.optimizer": "adam"}),
                      hint="set train.optimizer = \"adam\", or remove train.use_precision_aware_optimizer")


@rule(
    "precision-aware-needs-distributed-optimizer",
    "error",
    "megatron.core.optimizer.optimizer_config.OptimizerConfig.__post_init__ "
    "(--use-precision-aware-optimizer only supported with distributed optimizer)",
    "the precision-aware optimizer runs with parallel.use_distributed_optimizer = true",
)
def _needs_distopt(ctx: Context) -> Iterator[Finding]:
    if optimizer_options(ctx.spec.train).use_precision_aware_optimizer and not ctx.spec.parallel.use_distributed_optimizer:
        yield Finding("parallel.use_distributed_optimizer",
                      "the precision-aware optimizer keeps its state in megatron-core's DistributedOptimizer",
                      fix=Fix({"parallel.use_distributed_optimizer": True}),
                      hint="set parallel.use_distributed_optimizer = true (one GPU shards over one rank: "
                           "nothing else changes), or remove train.use_precision_aware_optimizer")


@rule(
    "optimizer-dtypes-need-precision-aware",
    "error",
    "megatron.core.optimizer.optimizer_config.OptimizerConfig.__post_init__ "
    "(main_grads_dtype, main_params_dtype, exp_avg_dtype and exp_avg_sq_dtype can only be fp32 when not using "
    "precision-aware optimizer)",
    "optimizer state dtypes other than fp32 come with train.use_precision_aware_optimizer = true",
)
def _dtypes_need_pa(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    low = opts.low_precision_dtypes
    if low and not opts.use_precision_aware_optimizer:
        fix = _enable_precision_aware(ctx)
        yield Finding(f"train.{low[0]}",
                      f"{', '.join(f'train.{k}' for k in low)} other than fp32 need{'s' if len(low) == 1 else ''} "
                      "megatron-core's precision-aware optimizer",
                      fix=fix, hint=f"{fix.text()}, or remove {' and '.join(f'train.{k}' for k in low)}")


@rule(
    "precision-aware-needs-transformer-engine",
    "warning",
    "megatron.core.optimizer.optimizer_config.OptimizerConfig.__post_init__ (--use-precision-aware-optimizer "
    "requires FusedAdam from TransformerEngine, and calls is_te_min_version('2.1.0') first, which raises "
    "without Transformer Engine, with optimizer_cpu_offload too)",
    "the precision-aware optimizer on layers that may be local is planned with Transformer Engine installed",
)
def _needs_te(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    if not opts.use_precision_aware_optimizer or ctx.r.transformer_impl == "transformer_engine":
        return
    layers = ("the layers are local" if ctx.r.transformer_impl == "local"
              else "the layers are local where Transformer Engine does not import")
    need = ("Transformer Engine importable (megatron-core 0.16.1 reads its version even for the CPU-offloaded "
            "optimizer, whose torch AdamW needs no FusedAdam)" if opts.optimizer_cpu_offload
            else "Transformer Engine's FusedAdam (Transformer Engine >= 2.0)")
    keys = ("train.use_precision_aware_optimizer", "train.optimizer_cpu_offload", "train.store_param_remainders",
            "train.optimizer_offload_fraction", "train.overlap_cpu_optimizer_d2h_h2d",
            *(f"train.{k}" for k in opts.low_precision_dtypes))
    fix = Fix(unset=tuple(k for k in keys if ctx.value(k) is not None))
    yield Finding(
        "train.use_precision_aware_optimizer",
        f"needs {need} installed on the GPU machine for the optimizer alone ({layers}); without it train.py "
        "exits 2 before training",
        fix=fix,
        hint=f"install Transformer Engine where the job runs (the layers may stay local), or {fix.text()} "
             "(fp32 optimizer state)",
    )


@rule(
    "main-grads-dtype-grad-buffer",
    "error",
    "Megatron-LM megatron/training/arguments.py validate_args (--main-grads-dtype can only be fp32 with "
    "--accumulate-allreduce-grads-in-fp32); megatron.core.optimizer.distrib_optimizer "
    "_copy_model_grads_to_main_grads (the decoupled gradient is a view of the DDP gradient buffer)",
    "bf16 main gradients come with parallel.grad_reduce_in_fp32 = false",
)
def _grads_buffer(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    if opts.use_precision_aware_optimizer and opts.main_grads_dtype == "bf16" and ctx.spec.parallel.grad_reduce_in_fp32:
        yield Finding("train.main_grads_dtype",
                      "the main gradients are the DDP gradient buffer, which parallel.grad_reduce_in_fp32 = true "
                      "keeps in fp32",
                      fix=Fix({"parallel.grad_reduce_in_fp32": False}),
                      hint="set parallel.grad_reduce_in_fp32 = false (gradients accumulated and reduced in bf16), "
                           "or remove train.main_grads_dtype")


@rule(
    "cpu-offload-needs-precision-aware",
    "error",
    "Megatron-LM megatron/training/arguments.py validate_args (the optimizer cpu offload must be used in "
    "conjunction with --use-precision-aware-optimizer, as the hybrid device optimizer reuses its code path)",
    "optimizer CPU offload comes with train.use_precision_aware_optimizer = true",
)
def _offload_needs_pa(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    if opts.optimizer_cpu_offload and not opts.use_precision_aware_optimizer:
        fix = _enable_precision_aware(ctx)
        yield Finding("train.optimizer_cpu_offload",
                      "the hybrid device optimizer runs on the precision-aware optimizer's code path",
                      fix=fix, hint=f"{fix.text()}, or remove train.optimizer_cpu_offload")


@rule(
    "cpu-offload-state-dtypes",
    "error",
    "megatron.core.optimizer._get_megatron_optimizer_based_on_param_groups (HybridDeviceOptimizer with "
    "param_update_in_fp32=True and torch AdamW: fp32 master weights and moments) and "
    "megatron.core.optimizer.distrib_optimizer (a resume allocates the state in the config's dtypes)",
    "with optimizer CPU offload the master weights and moments stay fp32",
)
def _offload_dtypes(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    keys = _dtype_keys_set(ctx, OFFLOAD_STATE_KEYS)
    if opts.optimizer_cpu_offload and keys:
        yield Finding(keys[0],
                      "the offloaded optimizer keeps fp32 master weights and moments whatever "
                      f"{' and '.join(keys)} say{'s' if len(keys) == 1 else ''}, and a resume would load "
                      "state of the wrong dtype into it",
                      fix=Fix(unset=keys),
                      hint=f"remove {' and '.join(keys)}, or set train.optimizer_cpu_offload = false "
                           "(low-precision state on the GPU)")


@rule(
    "optimizer-state-fsdp",
    "error",
    "backends/megatron/fsdp.py (the precision-aware optimizer and CPU offload are built on megatron-core's "
    "DistributedOptimizer; Megatron-FSDP would need DistributedDataParallelConfig.preserve_fp32_weights = False, "
    "Megatron-LM training.py, which dlmspec does not set)",
    "the precision-aware optimizer and CPU offload run without FSDP",
    scope="runtime",
)
def _fsdp(ctx: Context) -> Iterator[Finding]:
    opts = optimizer_options(ctx.spec.train)
    if (opts.use_precision_aware_optimizer or opts.optimizer_cpu_offload) and ctx.spec.parallel.fsdp != "none":
        yield Finding("parallel.fsdp", "the optimizer-state options are built on the distributed optimizer, not FSDP",
                      fix=Fix({"parallel.fsdp": "none", "parallel.data_parallel_sharding_strategy": "no_shard"}),
                      hint="set parallel.fsdp = \"none\" and parallel.data_parallel_sharding_strategy = \"no_shard\" "
                           "(the distributed optimizer shards the state), or remove train.use_precision_aware_optimizer "
                           "and train.optimizer_cpu_offload")


@rule(
    "optimizer-keys-ignored",
    "warning",
    "megatron.core.optimizer (store_param_remainders is read by the precision-aware optimizer only; the offload "
    "fraction and overlap by HybridDeviceOptimizer only)",
    "optimizer-state keys are only given with the option they belong to",
)
def _ignored(ctx: Context) -> Iterator[Finding]:
    t = ctx.spec.train
    opts = optimizer_options(t)
    if t.store_param_remainders is not None and not opts.use_precision_aware_optimizer:
        yield Finding("train.store_param_remainders", "has no effect without train.use_precision_aware_optimizer",
                      fix=Fix(unset=("train.store_param_remainders",)))
    for key in ("optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d"):
        if getattr(t, key) is not None and not opts.optimizer_cpu_offload:
            yield Finding(f"train.{key}", "has no effect without train.optimizer_cpu_offload",
                          fix=Fix(unset=(f"train.{key}",)))
