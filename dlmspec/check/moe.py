"""Rules of mixture-of-experts models: expert parallelism, routing, the MoE layer pattern, and
MoE keys given to a dense model."""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.hints import divisors, join, nearest
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.layout import expert_world_divides


def without_module(ctx: Context, *names: str) -> Fix:
    """The fix that drops ``names`` from ``recompute.modules`` (the key removed when none is left)."""
    rest = [m for m in ctx.spec.recompute.modules or [] if m not in names]
    return Fix({"recompute.modules": rest}) if rest else Fix(unset=("recompute.modules",))


@rule(
    "etp-divides-moe-ffn",
    "error",
    "megatron.core.transformer.moe.experts (expert FFN split over expert_tensor_parallel_size)",
    "moe_ffn_hidden_size is a multiple of the expert TP size",
)
def _etp_moe_ffn(ctx: Context) -> Iterator[Finding]:
    ffn, etp, r = ctx.r.moe_ffn_hidden_size, ctx.r.etp, ctx.r
    if ffn is not None and ffn % etp:
        options = [d for d in divisors(ffn) if expert_world_divides(r.world_size, d, r.ep, r.pp)] or [1]
        fix = Fix({"parallel.expert_tensor_parallel_size": nearest(options, etp)})
        also = [o for o in options if o != fix.set["parallel.expert_tensor_parallel_size"]][:5]
        yield Finding(
            "model.moe_ffn_hidden_size",
            f"moe_ffn_hidden_size is not a multiple of the expert TP size {etp}",
            fix.text() + (f" (also {join(also)} fit)" if also else ""),
            value=ffn,
            fix=fix,
        )


@rule(
    "ep-needs-moe",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "expert_model_parallel_size > 1 needs num_experts",
)
def _ep_moe(ctx: Context) -> Iterator[Finding]:
    if ctx.r.ep > 1 and not ctx.spec.model.is_moe:
        yield Finding(
            "parallel.expert_model_parallel_size",
            "expert parallelism needs a mixture-of-experts model, and model.num_experts is unset",
            "set expert_model_parallel_size = 1, or model.num_experts",
            fix=Fix({"parallel.expert_model_parallel_size": 1}),
        )


@rule(
    "ep-divides-experts",
    "error",
    "megatron.core.transformer.moe.moe_layer.BaseMoELayer.__init__",
    "num_experts is a multiple of EP",
)
def _ep_experts(ctx: Context) -> Iterator[Finding]:
    experts = ctx.spec.model.num_experts
    if experts is not None and experts % ctx.r.ep:
        r = ctx.r
        options = [d for d in divisors(experts) if expert_world_divides(r.world_size, r.etp, d, r.pp)] or [1]
        fix = Fix({"parallel.expert_model_parallel_size": nearest(options, r.ep)})
        also = [o for o in options if o != fix.set["parallel.expert_model_parallel_size"]]
        yield Finding(
            "parallel.expert_model_parallel_size",
            f"num_experts = {experts} is not a multiple of the EP size",
            fix.text() + (f" (also {join(also)} fit)" if also else ""),
            fix=fix,
        )


@rule(
    "topk-le-experts",
    "error",
    "megatron.core.transformer.moe.router.TopKRouter (top-k over num_experts)",
    "moe_router_topk is at most num_experts",
)
def _topk(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.num_experts is not None and m.moe_router_topk > m.num_experts:
        fix = Fix({"model.moe_router_topk": m.num_experts})
        if m.num_experts == 1 and m.moe_router_load_balancing_type != "sinkhorn":  # moe-top1-routing
            fix = Fix({"model.moe_router_topk": 1, "model.moe_router_load_balancing_type": "sinkhorn"})
        yield Finding(
            "model.moe_router_topk",
            f"a token cannot be routed to more than num_experts = {m.num_experts} experts",
            f"use moe_router_topk <= {m.num_experts}: {fix.text()}",
            fix=fix,
        )


@rule(
    "moe-top1-routing",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (top-1 routing with "
    "softmax scores needs moe_router_pre_softmax, which dlmspec does not expose)",
    "top-1 routing uses sinkhorn load balancing (or route to 2+ experts)",
)
def _top1(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.is_moe and m.moe_router_topk == 1 and m.moe_router_load_balancing_type != "sinkhorn":
        yield Finding(
            "model.moe_router_topk",
            "top-1 routing needs the softmax before the top-k (a softmax over the one chosen expert has "
            "zero gradient); megatron-core refuses it otherwise",
            "use moe_router_topk = 2 (or more), or moe_router_load_balancing_type = 'sinkhorn'",
            fix=(Fix({"model.moe_router_topk": 2}) if m.num_experts >= 2
                 else Fix({"model.moe_router_load_balancing_type": "sinkhorn"})),
        )


@rule(
    "moe-layer-freq",
    "error",
    "megatron.core.models.gpt.gpt_layer_specs.get_gpt_decoder_block_spec",
    "a moe_layer_freq list has one 0/1 entry per layer",
)
def _moe_freq(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    freq = m.moe_layer_freq
    if not m.is_moe or not isinstance(freq, list):
        return
    every = Fix({"model.moe_layer_freq": 1})
    if len(freq) != m.num_layers:
        yield Finding(
            "model.moe_layer_freq",
            f"has {len(freq)} entries for {m.num_layers} layers",
            f"give one 0/1 entry per layer ({m.num_layers}), or an int N for every Nth layer: "
            "moe_layer_freq = 1 makes every layer MoE",
            fix=every,
        )
    elif any(v not in (0, 1) for v in freq):
        yield Finding("model.moe_layer_freq", "entries must be 0 (dense) or 1 (MoE)",
                      "use only 0 and 1, or moe_layer_freq = 1 (every layer MoE)", fix=every)
    elif not any(freq):
        yield Finding(
            "model.moe_layer_freq",
            "no layer is MoE, yet num_experts is set",
            "put a 1 where a layer is MoE (moe_layer_freq = 1: every layer), or remove num_experts",
            fix=every,
        )


@rule(
    "moe-bias-needs-etp1",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (bias in MoE only with ETP 1)",
    "MoE with add_bias_linear uses expert_tensor_parallel_size = 1",
)
def _moe_bias(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.is_moe and m.add_bias_linear and ctx.r.etp != 1:
        yield Finding(
            "parallel.expert_tensor_parallel_size",
            "megatron-core supports biases in MoE experts only without expert tensor parallelism",
            "set parallel.expert_tensor_parallel_size = 1 (the default is the TP size), or model.add_bias_linear = false",
            value=ctx.r.etp,
            fix=Fix({"parallel.expert_tensor_parallel_size": 1}),
        )


@rule(
    "moe-keys-ignored",
    "warning",
    "dlmspec.resolve (MoE keys are used only when model.num_experts is set)",
    "MoE keys are only given for MoE models",
)
def _moe_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.model.is_moe:
        return
    for key in (
        "model.moe_ffn_hidden_size",
        "model.moe_shared_expert_intermediate_size",
        "model.moe_router_topk",
        "model.moe_layer_freq",
        "parallel.expert_tensor_parallel_size",
    ):
        if ctx.is_set(key):
            yield Finding(key, "has no effect: model.num_experts is unset (dense model)",
                          f"remove {key}, or set model.num_experts", fix=Fix(unset=(key,)))


@rule(
    "moe-act-needs-grouped-gemm",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "recomputing 'moe_act' needs moe_grouped_gemm",
)
def _moe_act(ctx: Context) -> Iterator[Finding]:
    rc, m = ctx.spec.recompute, ctx.spec.model
    if rc.granularity != "selective" or "moe_act" not in (rc.modules or []):
        return
    if not m.is_moe:  # moe_grouped_gemm reaches TransformerConfig only with experts (dlmspec.render.compile)
        fix = without_module(ctx, "moe_act")
        yield Finding("recompute.modules", "recomputing 'moe_act' needs grouped-GEMM experts, and the model is dense "
                      "(model.num_experts is unset)", f"drop 'moe_act' from recompute.modules: {fix.text()}", fix=fix)
    elif not m.moe_grouped_gemm:
        yield Finding(
            "recompute.modules",
            "recomputing 'moe_act' is only implemented for grouped-GEMM experts",
            "set model.moe_grouped_gemm = true, or drop 'moe_act' from recompute.modules",
            fix=Fix({"model.moe_grouped_gemm": True}),
        )


#: Local experts (``num_experts / expert_model_parallel_size``) from which the validator notes that
#: ``SequentialMLP`` runs them one after the other: a fine-grained MoE (Qwen3-30B-A3B, OLMoE: 128 and
#: 64 experts) launches hundreds of small GEMMs per layer (dlmspec.plan.moe_experts).
SEQUENTIAL_EXPERTS_NOTE = 16


@rule(
    "moe-sequential-experts",
    "warning",
    "megatron.core.transformer.moe.experts.SequentialMLP (one MLP per local expert, one after the other) "
    "and TEGroupedMLP / GroupedMLP (grouped GEMM); launch counts: dlmspec.plan.moe_experts",
    "a MoE with many experts per rank runs grouped GEMM",
)
def _sequential_experts(ctx: Context) -> Iterator[Finding]:
    from dlmspec.plan.launches import KERNELS_PER_LOCAL_EXPERT
    from dlmspec.plan.moe_experts import GROUPED_PER_LOCAL_EXPERT, GROUPED_PER_MOE_LAYER
    from dlmspec.resolve import layer_path_needs

    m, r = ctx.spec.model, ctx.r
    if not m.is_moe or m.moe_grouped_gemm or r.ep < 1 or m.num_experts // r.ep < SEQUENTIAL_EXPERTS_NOTE:
        return
    local = m.num_experts // r.ep
    moe_layers = sum(r.moe_layers)
    path = "local+sdpa" if r.transformer_impl == "local" else "transformer_engine"
    sequential = moe_layers * local * KERNELS_PER_LOCAL_EXPERT[path]
    grouped = moe_layers * (GROUPED_PER_MOE_LAYER["transformer_engine"]
                            + GROUPED_PER_LOCAL_EXPERT["transformer_engine"] * local)
    needs_local, _ = layer_path_needs(ctx.spec, r.attention_mask, r.cp)
    message = (f"the {local} local experts of each of the {moe_layers} MoE layers run one after the other "
               f"(megatron-core's SequentialMLP): about {sequential:,} expert kernel launches per microbatch, "
               f"against about {grouped:,} with Transformer Engine's grouped GEMM (planned, uncalibrated)")
    local_note = ("; megatron-core's GroupedMLP would group them on the local layers where the grouped_gemm "
                  "kernel installs, which dlmspec's local layers do not build (runtime-grouped-gemm-local)")
    if needs_local:
        yield Finding("model.moe_grouped_gemm", message + local_note,
                      hint=f"grouped GEMM runs on the Transformer Engine layers, which {', '.join(needs_local)} "
                           "keeps from this spec; without it set model.moe_grouped_gemm = true",
                      fix=None)
        return
    changes: dict = {"model.moe_grouped_gemm": True}
    if m.transformer_impl == "local":
        changes["model.transformer_impl"] = "transformer_engine"
        message += local_note
    fix = Fix(changes)
    yield Finding("model.moe_grouped_gemm", message, fix=fix,
                  hint=f"{fix.text()} (Transformer Engine's TEGroupedMLP; dlmspec plan shows the step time of both)")
