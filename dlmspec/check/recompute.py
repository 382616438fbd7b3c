"""Rules of activation recomputation: full recomputation's method and layer count against the
layers of a pipeline stage, and keys that have no effect with the chosen granularity."""

from __future__ import annotations

import math
from typing import Iterator

from dlmspec.check.hints import divisors, join, nearest
from dlmspec.check.moe import without_module
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.pipeline_split import chunk_layers, split_of, split_problems


@rule(
    "recompute-full-needs-method",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "full recomputation names recompute.method",
)
def _full_method(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity == "full" and rc.method is None:
        chunk = _layers_per_chunk(ctx)
        uniform = rc.num_layers is None or not chunk or chunk % rc.num_layers == 0
        first, second = ("uniform", "block") if uniform else ("block", "uniform")
        what = {"uniform": "every recompute.num_layers layers", "block": "the first num_layers per stage"}
        yield Finding(
            "recompute.method",
            "full recomputation needs a method",
            f"use method = '{first}' ({what[first]}) or '{second}' ({what[second]})",
            fix=Fix({"recompute.method": first}),
        )


@rule(
    "recompute-full-needs-num-layers",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "full recomputation sets recompute.num_layers",
)
def _full_layers(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity == "full" and rc.num_layers is None:
        per_stage = _layers_per_chunk(ctx) or max(1, ctx.spec.model.num_layers // ctx.r.pp)
        yield Finding(
            "recompute.num_layers",
            "full recomputation needs num_layers",
            f"use a value between 1 and the layers per pipeline stage ({per_stage}), e.g. num_layers = {per_stage}",
            fix=Fix({"recompute.num_layers": per_stage}),
        )


def _layers_per_chunk(ctx: Context) -> int | None:
    """Layers in one model chunk (one pipeline stage, or one virtual stage with interleaving):
    ``len(TransformerBlock.layers)``. None when PP (or VPP) does not divide the layers (other
    rules report that)."""
    split = split_of(ctx.spec.model.num_layers, ctx.spec.parallel, ctx.r.pp, ctx.r.vpp)
    if split_problems(split):
        return None
    # an uneven split (dlmspec.pipeline_split) has chunks of several sizes: what divides them all
    return math.gcd(*(n for row in chunk_layers(split) for n in row)) or None


def _largest_chunk(ctx: Context) -> int | None:
    """Layers in the largest model chunk (an uneven split's chunks differ); None as
    :func:`_layers_per_chunk`."""
    split = split_of(ctx.spec.model.num_layers, ctx.spec.parallel, ctx.r.pp, ctx.r.vpp)
    if split_problems(split):
        return None
    return max(n for row in chunk_layers(split) for n in row) or None


@rule(
    "recompute-uniform-divides-layers",
    "error",
    "megatron.core.transformer.transformer_block.TransformerBlock._checkpointed_forward (uniform: "
    "chunks of recompute_num_layers layers; the last chunk indexes past the block otherwise)",
    "uniform recomputation's num_layers divides the layers of a pipeline (virtual) stage",
)
def _recompute_uniform(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    chunk = _layers_per_chunk(ctx)
    if rc.granularity == "full" and rc.method == "uniform" and rc.num_layers is not None and chunk and chunk % rc.num_layers:
        fix = Fix({"recompute.num_layers": nearest(divisors(chunk), rc.num_layers)})
        also = [d for d in divisors(chunk) if d != fix.set["recompute.num_layers"]]
        yield Finding(
            "recompute.num_layers",
            f"does not divide the {chunk} layers of a pipeline stage, so the last uniform chunk would "
            "run past the stage's last layer",
            fix.text() + (f" (also {join(also)} divide it)" if also else ""),
            fix=fix,
        )


@rule(
    "recompute-num-layers-range",
    "warning",
    "megatron.core.transformer.transformer_config.TransformerConfig (recompute_num_layers between 1 "
    "and the layers per pipeline rank); TransformerBlock._checkpointed_forward (block method)",
    "block recomputation's num_layers is at most the layers of a pipeline (virtual) stage",
)
def _recompute_range(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    chunk = _largest_chunk(ctx)
    if rc.granularity == "full" and rc.method == "block" and rc.num_layers is not None and chunk and rc.num_layers > chunk:
        yield Finding(
            "recompute.num_layers",
            f"exceeds the {chunk} layers of a pipeline stage; every layer is recomputed already at {chunk}",
            f"use a value between 1 and {chunk}, e.g. num_layers = {chunk}",
            fix=Fix({"recompute.num_layers": chunk}),
        )


@rule(
    "recompute-keys-ignored",
    "warning",
    "megatron.core.transformer.transformer_config.TransformerConfig (method/num_layers are for "
    "'full', modules for 'selective'); dlmspec.render.compile passes each only with its granularity",
    "recompute keys match the granularity",
)
def _recompute_ignored(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity == "none":
        for key in ("method", "num_layers", "modules"):
            if getattr(rc, key) is not None:
                yield Finding(f"recompute.{key}", "has no effect: recompute.granularity = 'none'",
                              f"remove recompute.{key}, or set recompute.granularity",
                              fix=Fix(unset=(f"recompute.{key}",)))
    elif rc.granularity == "selective":
        # Megatron-LM's arguments refuse a layer count with selective recomputation; dlmspec
        # does not pass it to TransformerConfig then, so it is only a key with no effect.
        for key in ("method", "num_layers"):
            if getattr(rc, key) is not None:
                yield Finding(f"recompute.{key}", "has no effect: selective recomputation applies to every layer",
                              f"remove recompute.{key}, or use granularity = 'full'",
                              fix=Fix(unset=(f"recompute.{key}",)))
    elif rc.granularity == "full" and rc.modules is not None:
        yield Finding("recompute.modules", "has no effect with full recomputation (whole layers are recomputed)",
                      "remove recompute.modules, or use granularity = 'selective'",
                      fix=Fix(unset=("recompute.modules",)))


@rule(
    "recompute-moe-modules",
    "warning",
    "megatron.core.transformer.transformer_config.TransformerConfig.recompute_modules",
    "MoE recompute modules are only named for MoE models",
)
def _recompute_moe(ctx: Context) -> Iterator[Finding]:
    rc, m = ctx.spec.recompute, ctx.spec.model
    if rc.granularity != "selective" or not rc.modules:
        return
    idle = [module for module in rc.modules if (module in ("moe", "shared_experts") and not m.is_moe)
            or (module == "shared_experts" and m.is_moe and m.moe_shared_expert_intermediate_size is None)]
    fix = without_module(ctx, *idle)  # every idle module at once: each finding's fix then passes
    for module in idle:  # moe_act: moe-act-needs-grouped-gemm
        if not m.is_moe:
            yield Finding("recompute.modules", f"'{module}' has no effect on a dense model",
                          f"drop '{module}' from recompute.modules: {fix.text()}", fix=fix)
        else:
            yield Finding("recompute.modules", "'shared_experts' has no effect: the model has no shared expert",
                          f"drop 'shared_experts' from recompute.modules: {fix.text()}", fix=fix)
