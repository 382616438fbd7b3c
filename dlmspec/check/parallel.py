"""Rules of the cluster and the model-parallel layout: the GPU catalog, the world size against
TP * PP * CP and expert parallelism, tensor parallelism against the model's dimensions, and the
data-parallel settings (distributed optimizer, Megatron-FSDP)."""

from __future__ import annotations

import math
from typing import Iterator

from dlmspec.check.hints import divisors, join, multiple_above, nearest, tp_hint, tp_options, with_layout
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.gpus import GPUS, gpu_ids
from dlmspec.layout import expert_world_divides, world_divides
from dlmspec.wording import count, plural


@rule("unknown-gpu", "error", "dlmspec.gpus.GPUS", "cluster.gpu names a GPU in the catalog")
def _unknown_gpu(ctx: Context) -> Iterator[Finding]:
    gpu = ctx.spec.cluster.gpu
    if gpu not in GPUS:
        family = [g for g in gpu_ids() if g.startswith(gpu.lower())]
        from difflib import get_close_matches  # error hints only

        close = family or get_close_matches(gpu.lower(), gpu_ids(), n=1)
        fix = Fix({"cluster.gpu": close[0] if close else "h100"})
        hint = (f"did you mean {' or '.join(repr(g) for g in close)}? {fix.text()}" if close
                else f"{fix.text()}, or one of {', '.join(gpu_ids())}")
        yield Finding("cluster.gpu", "unknown GPU (see `dlmspec show --gpus`)", hint, fix=fix)


@rule(
    "world-divisible-by-model-parallel",
    "error",
    "megatron.core.parallel_state.initialize_model_parallel: world_size % (TP*PP*CP) == 0",
    "the GPU count is a multiple of TP * PP * CP",
)
def _world_model_parallel(ctx: Context) -> Iterator[Finding]:
    r, c = ctx.r, ctx.spec.cluster
    product = r.tp * r.pp * r.cp
    if world_divides(r.world_size, r.tp, r.pp, r.cp):
        return
    sizes = [
        ("parallel.tensor_model_parallel_size", r.tp),
        ("parallel.pipeline_model_parallel_size", r.pp),
        ("parallel.context_parallel_size", r.cp),
    ]
    offenders = [kv for kv in sizes if r.world_size % kv[1]] or [max(sizes, key=lambda kv: kv[1])]
    key, size = offenders[0]
    others = product // size
    options = divisors(r.world_size // others) if r.world_size % others == 0 else []
    if key == "parallel.tensor_model_parallel_size":
        options = [t for t in options if t in tp_options(ctx)]
    if options:
        fix = with_layout(ctx, Fix({key: nearest(options, size)}))
        others = [o for o in options if o != fix.set[key]]
        hint = (fix.text() + _also(others, fix, r.world_size)
                + f", or nodes * gpus_per_node a multiple of {product}")
    else:  # no size of the offending key fits: the fewest nodes whose GPUs TP*PP*CP divides
        nodes = product // math.gcd(product, c.gpus_per_node)
        change: dict = {"cluster.nodes": nodes}
        step = ctx.spec.train.micro_batch_size * (nodes * c.gpus_per_node // product)
        if ctx.spec.train.global_batch_size % step:
            change["train.global_batch_size"] = multiple_above(ctx.spec.train.global_batch_size, step)
        fix = Fix(change)
        hint = f"use nodes * gpus_per_node a multiple of {product}: {fix.text()}"
    yield Finding(
        key,
        f"{count(r.world_size, 'GPU')} ({count(c.nodes, 'node')} x {c.gpus_per_node}) {plural('is', r.world_size)} not divisible by "
        f"TP*PP*CP = {r.tp}*{r.pp}*{r.cp} = {product}",
        hint,
        fix=fix,
    )


@rule(
    "world-divisible-by-expert-parallel",
    "error",
    "megatron.core.parallel_state.initialize_model_parallel: world_size % (ETP*EP*PP) == 0",
    "the GPU count is a multiple of expert TP * EP * PP",
)
def _world_expert_parallel(ctx: Context) -> Iterator[Finding]:
    r = ctx.r
    product = r.etp * r.ep * r.pp
    # With EP = 1 and ETP defaulted to TP this is implied by world-divisible-by-model-parallel.
    if expert_world_divides(r.world_size, r.etp, r.ep, r.pp) or (r.ep == 1 and ctx.spec.parallel.expert_tensor_parallel_size is None):
        return
    key = "parallel.expert_model_parallel_size" if r.ep > 1 else "parallel.expert_tensor_parallel_size"
    experts = ctx.spec.model.num_experts or 1
    options = ([e for e in divisors(r.world_size // (r.etp * r.pp)) if experts % e == 0]
               if r.world_size % (r.etp * r.pp) == 0 else [])
    if options:
        fix = Fix({"parallel.expert_model_parallel_size": nearest(options, r.ep)})
        others = [o for o in options if o != fix.set["parallel.expert_model_parallel_size"]]
        hint = fix.text() + _also(others, fix, r.world_size)
    else:
        fix = Fix({"parallel.expert_tensor_parallel_size": 1, "parallel.expert_model_parallel_size": 1})
        hint = fix.text()
    yield Finding(
        key,
        f"{count(r.world_size, 'GPU')} {plural('is', r.world_size)} not divisible by ETP*EP*PP = {r.etp}*{r.ep}*{r.pp} = {product}",
        hint,
        fix=fix,
    )


#: torch.distributed holds ranks and the world size as C int (int32).
_MAX_WORLD = 2**31 - 1


@rule(
    "world-size-range",
    "error",
    "torch.distributed (init_process_group: rank and world_size are C int, int32)",
    "nodes * gpus_per_node fits in int32",
)
def _world_range(ctx: Context) -> Iterator[Finding]:
    c = ctx.spec.cluster
    if c.nodes * c.gpus_per_node > _MAX_WORLD:
        yield Finding("cluster.nodes", f"{c.nodes:,} nodes of {c.gpus_per_node} GPUs are {c.nodes * c.gpus_per_node:,} "
                      f"ranks, beyond int32 ({_MAX_WORLD:,}), in which torch.distributed numbers them",
                      "use the nodes the job runs on, e.g. nodes = 1", fix=Fix({"cluster.nodes": 1}))


@rule(
    "tp-divides-heads",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "num_attention_heads is a multiple of TP",
)
def _tp_heads(ctx: Context) -> Iterator[Finding]:
    heads = ctx.spec.model.num_attention_heads
    if heads % ctx.r.tp:
        hint, fix = tp_hint(ctx)
        yield Finding(
            "parallel.tensor_model_parallel_size",
            f"num_attention_heads = {heads} is not a multiple of the TP size",
            hint,
            fix=fix,
        )


@rule(
    "fused-linear-ce-tp",
    "error",
    "dlmspec.backends.megatron.output_loss.defer_output_projection (the vocabulary must not be split over TP ranks)",
    "kernels.cross_entropy = 'fused_linear' needs tensor_model_parallel_size = 1",
)
def _fused_ce_tp(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.kernels.cross_entropy == "fused_linear" and ctx.r.tp > 1:
        yield Finding(
            "kernels.cross_entropy",
            f"the fused linear cross entropy projects onto the whole vocabulary, but TP = {ctx.r.tp} "
            "splits the output layer over ranks",
            'set kernels.cross_entropy = "auto" (fused at TP = 1, megatron\'s otherwise) or "megatron", '
            "or parallel.tensor_model_parallel_size = 1",
            fix=Fix({"kernels.cross_entropy": "auto"}),
        )


@rule(
    "tp-query-groups",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "num_query_groups is a multiple or a divisor of TP",
)
def _tp_groups(ctx: Context) -> Iterator[Finding]:
    groups, tp = ctx.r.num_query_groups, ctx.r.tp
    if groups % tp and tp % groups:
        hint, fix = tp_hint(ctx)
        yield Finding(
            "parallel.tensor_model_parallel_size",
            f"num_query_groups = {groups} is neither a multiple nor a divisor of the TP size",
            hint,
            fix=fix,
        )


@rule(
    "heads-divisible-by-groups",
    "error",
    "megatron.core.transformer.attention.SelfAttention (heads per group = heads // groups)",
    "num_attention_heads is a multiple of num_query_groups",
)
def _heads_groups(ctx: Context) -> Iterator[Finding]:
    heads, groups = ctx.spec.model.num_attention_heads, ctx.r.num_query_groups
    if heads % groups:
        tp = ctx.r.tp
        options = [d for d in divisors(heads) if d % tp == 0 or tp % d == 0] or divisors(heads)
        fix = Fix({"model.num_query_groups": nearest(options, groups)})
        yield Finding(
            "model.num_query_groups",
            f"num_attention_heads = {heads} is not a multiple of num_query_groups",
            f"{fix.text()} (the divisors of {heads}: {join(divisors(heads))})",
            value=groups,
            fix=fix,
        )


@rule(
    "hidden-divisible-by-heads",
    "error",
    "Megatron-LM validate_args: hidden_size % num_attention_heads == 0 when kv_channels is unset",
    "without kv_channels, hidden_size is a multiple of num_attention_heads",
)
def _hidden_heads(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        rounded = max(1, m.hidden_size // m.num_attention_heads) * m.num_attention_heads
        yield Finding(
            "model.hidden_size",
            f"hidden_size is not a multiple of num_attention_heads = {m.num_attention_heads}, "
            f"so the head dimension would be rounded down to {m.hidden_size // m.num_attention_heads}",
            f"set model.kv_channels explicitly, or hidden_size = {rounded}",
            fix=Fix({"model.hidden_size": rounded}),
        )


@rule(
    "tp-divides-ffn",
    "error",
    "megatron.core.tensor_parallel.layers.ColumnParallelLinear / RowParallelLinear (divide by TP)",
    "ffn_hidden_size (dense layers) and the shared-expert size are multiples of TP",
)
def _tp_ffn(ctx: Context) -> Iterator[Finding]:
    m, tp = ctx.spec.model, ctx.r.tp
    if 0 in ctx.r.moe_layers and m.ffn_hidden_size % tp:
        yield Finding(
            "model.ffn_hidden_size",
            f"ffn_hidden_size is not a multiple of the TP size {tp}",
            f"use a multiple of {tp}, e.g. ffn_hidden_size = {multiple_above(m.ffn_hidden_size, tp)}",
            fix=Fix({"model.ffn_hidden_size": multiple_above(m.ffn_hidden_size, tp)}),
        )
    shared = m.moe_shared_expert_intermediate_size
    if m.is_moe and shared is not None and shared % tp:
        yield Finding(
            "model.moe_shared_expert_intermediate_size",
            f"the shared expert is split over TP and {shared} is not a multiple of the TP size {tp}",
            f"use a multiple of {tp}, e.g. moe_shared_expert_intermediate_size = {multiple_above(shared, tp)}",
            fix=Fix({"model.moe_shared_expert_intermediate_size": multiple_above(shared, tp)}),
        )


@rule(
    "overlap-param-gather-needs-distopt",
    "warning",
    "megatron.core.distributed.DistributedDataParallel (param all-gather overlap exists only with "
    "use_distributed_optimizer)",
    "overlap_param_gather comes with use_distributed_optimizer",
)
def _overlap_param(ctx: Context) -> Iterator[Finding]:
    p = ctx.spec.parallel
    if p.overlap_param_gather and not p.use_distributed_optimizer:
        yield Finding("parallel.overlap_param_gather",
                      "has no effect: parameters are all-gathered only by the distributed optimizer",
                      "set overlap_param_gather = false, or use_distributed_optimizer = true",
                      fix=Fix({"parallel.overlap_param_gather": False}))


@rule(
    "sharding-needs-megatron-fsdp",
    "warning",
    "megatron.core.distributed.DistributedDataParallelConfig.data_parallel_sharding_strategy "
    "(a Megatron FSDP setting)",
    "data_parallel_sharding_strategy is only given with fsdp = 'megatron'",
)
def _sharding(ctx: Context) -> Iterator[Finding]:
    p = ctx.spec.parallel
    if p.data_parallel_sharding_strategy != "no_shard" and p.fsdp != "megatron":
        yield Finding("parallel.data_parallel_sharding_strategy", f"has no effect with fsdp = '{p.fsdp}'",
                      "remove data_parallel_sharding_strategy, or set parallel.fsdp = 'megatron'",
                      fix=Fix(unset=("parallel.data_parallel_sharding_strategy",)))


@rule(
    "megatron-fsdp-no-shard",
    "warning",
    "megatron.core.distributed.DistributedDataParallelConfig.data_parallel_sharding_strategy "
    "(default 'no_shard': Megatron-FSDP then shards nothing)",
    "fsdp = 'megatron' comes with a sharding strategy",
)
def _fsdp_no_shard(ctx: Context) -> Iterator[Finding]:
    p = ctx.spec.parallel
    if p.fsdp == "megatron" and p.data_parallel_sharding_strategy == "no_shard":
        yield Finding("parallel.data_parallel_sharding_strategy",
                      "Megatron-FSDP with 'no_shard' keeps full weights, gradients and optimizer state on "
                      "every GPU (more memory than the distributed optimizer)",
                      "set parallel.data_parallel_sharding_strategy = 'optim_grads_params' (ZeRO-3), "
                      "or 'optim_grads' / 'optim'",
                      fix=Fix({"parallel.data_parallel_sharding_strategy": "optim_grads_params"}))


def _also(others: list, fix: Fix, world_size: int) -> str:
    """The other sizes that divide the GPU count, after a fix's text: " (also 1 or 4 fit)" when the
    fix sets that size alone; when it also changes other keys (the global batch of
    :func:`with_layout`), the others may need their own such change, so only what they divide is said."""
    if not others:
        return ""
    if len(fix.set) > 1:
        return f" (also {join(others)} divide the {world_size} GPUs)"
    return f" (also {join(others)} fit)"
