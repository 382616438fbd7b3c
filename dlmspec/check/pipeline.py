"""Rules of the pipeline schedule: layers per stage, the interleaved (virtual) pipeline,
microbatches per step and the pipeline bubble."""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.hints import (agreed_global_batch_size, divisors, join, nearest, pp_for_layers,
                                with_layout)
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.layout import batch_divides


@rule(
    "pp-divides-layers",
    "error",
    "megatron.core.transformer.transformer_block.get_num_layers_to_build",
    "num_layers is a multiple of PP",
)
def _pp_layers(ctx: Context) -> Iterator[Finding]:
    layers, pp = ctx.spec.model.num_layers, pp_for_layers(ctx)
    if pp is not None:
        fix = with_layout(ctx, Fix({"parallel.pipeline_model_parallel_size": pp}))
        yield Finding(
            "parallel.pipeline_model_parallel_size",
            f"num_layers = {layers} is not a multiple of the PP size",
            f"{fix.text()} (the divisors of {layers}: {join(divisors(layers))})",
            fix=fix,
        )


@rule(
    "vpp-needs-pp",
    "error",
    "megatron.core.parallel_state.initialize_model_parallel (interleaved schedule needs PP > 1)",
    "virtual_pipeline_model_parallel_size needs pipeline_model_parallel_size > 1",
)
def _vpp_pp(ctx: Context) -> Iterator[Finding]:
    if ctx.r.vpp is not None and ctx.r.pp == 1:
        yield Finding(
            "parallel.virtual_pipeline_model_parallel_size",
            "the interleaved pipeline schedule needs pipeline_model_parallel_size > 1",
            "remove virtual_pipeline_model_parallel_size, or set pipeline_model_parallel_size >= 2",
            fix=Fix(unset=("parallel.virtual_pipeline_model_parallel_size",)),
        )


@rule(
    "vpp-divides-stage-layers",
    "error",
    "megatron.core.transformer.transformer_block.get_num_layers_to_build",
    "layers per pipeline stage are a multiple of the virtual pipeline size",
)
def _vpp_layers(ctx: Context) -> Iterator[Finding]:
    r, layers = ctx.r, ctx.spec.model.num_layers
    if r.vpp is None or r.pp == 1 or layers % r.pp:
        return
    per_stage = layers // r.pp
    if per_stage % r.vpp:
        options = [d for d in divisors(per_stage) if d > 1]
        fix = (Fix({"parallel.virtual_pipeline_model_parallel_size": nearest(options, r.vpp)}) if options
               else Fix(unset=("parallel.virtual_pipeline_model_parallel_size",)))
        also = [o for o in options if o != fix.set.get("parallel.virtual_pipeline_model_parallel_size")]
        yield Finding(
            "parallel.virtual_pipeline_model_parallel_size",
            f"each of the {r.pp} pipeline stages has {per_stage} layers, not a multiple of the virtual size",
            fix.text() + (f" (also {join(also)} fit)" if also else ""),
            fix=fix,
        )


@rule(
    "vpp-microbatches",
    "error",
    "megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving",
    "with interleaving, microbatches per step are a multiple of PP (and at least PP)",
    needs_layout=True,
)
def _vpp_microbatches(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    if r.vpp is None or r.pp == 1 or not batch_divides(tr.global_batch_size, tr.micro_batch_size, r.dp):
        return
    m = r.num_microbatches
    if m < r.pp or m % r.pp:
        step = tr.micro_batch_size * r.dp * r.pp
        fix = Fix({"train.global_batch_size": max(step, tr.global_batch_size // step * step)})
        yield Finding(
            "train.global_batch_size",
            f"{m} microbatches per step (gbs / (mbs * dp)) is not a positive multiple of PP = {r.pp}, "
            "which the interleaved schedule requires",
            f"use a multiple of mbs * dp * pp = {step}, e.g. {fix.text()}",
            fix=fix,
        )


@rule(
    "pipeline-bubble",
    "warning",
    "Narayanan et al. 2021 (Megatron-LM PTD-P), sec. 2.2.1-2.2.2: bubble time fraction (p - 1) / m, "
    "(p - 1) / (v m) with v interleaved (virtual) stages per GPU",
    "the pipeline bubble (PP - 1) / (VPP x microbatches) is at most 50%",
    needs_layout=True,
)
def _bubble(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    if r.pp == 1 or not batch_divides(tr.global_batch_size, tr.micro_batch_size, r.dp):
        return
    virtual = r.vpp or 1
    bubble = (r.pp - 1) / (virtual * r.num_microbatches)
    if bubble > 0.5:
        want = 4 * r.pp * tr.micro_batch_size * r.dp
        yield Finding(
            "train.global_batch_size",
            f"{r.num_microbatches} microbatches over {r.pp} pipeline stages"
            f"{f' ({virtual} virtual stages each)' if virtual > 1 else ''}: the bubble costs "
            f"{bubble:.0%} of the compute time",
            f"use at least 4 * PP microbatches (global_batch_size = {want}), or a smaller PP size",
            fix=Fix({"train.global_batch_size": want}),
        )


@rule(
    "batch-divisible",
    "error",
    "megatron.core.num_microbatches_calculator.ConstantNumMicroBatchesCalculator",
    "global_batch_size is a multiple of micro_batch_size * DP",
    needs_layout=True,
)
def _batch(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    step = tr.micro_batch_size * r.dp
    if batch_divides(tr.global_batch_size, tr.micro_batch_size, r.dp):
        return
    below, above = tr.global_batch_size // step * step, (tr.global_batch_size // step + 1) * step
    options = [v for v in (below, above) if v > 0]
    if pp_for_layers(ctx) is not None:  # pp-divides-layers' fix changes DP: the value right for both
        options = [agreed_global_batch_size(ctx)]
    yield Finding(
        "train.global_batch_size",
        f"not a multiple of micro_batch_size * data-parallel size = {tr.micro_batch_size} * {r.dp} = {step}",
        f"use global_batch_size = {join(options)}",
        fix=Fix({"train.global_batch_size": options[0]}),
    )
