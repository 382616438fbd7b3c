"""Rules of the pipeline schedule: layers per stage (the even split and megatron-core's uneven
ones: embedding/loss accounting, first/last stage counts, an explicit layout), the interleaved
(virtual) pipeline, microbatches per step and the pipeline bubble.

What megatron-core refuses about a split is :func:`dlmspec.pipeline_split.split_problems`'s (the
one place); each rule here reports its problems and adds a fix that
:func:`~dlmspec.pipeline_split.split_problems` accepts."""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.hints import (agreed_global_batch_size, divisors, join, nearest, pp_for_layers,
                                with_layout)
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.layout import batch_divides
from dlmspec.pipeline_split import (LayoutError, Split, chunk_layers, expand_layout, layout_string, split_of,
                                    split_problems)

#: :class:`~dlmspec.pipeline_split.Split` field -> its spec key.
_KEYS = {
    "first": "parallel.num_layers_in_first_pipeline_stage",
    "last": "parallel.num_layers_in_last_pipeline_stage",
    "embedding": "parallel.account_for_embedding_in_pipeline_split",
    "loss": "parallel.account_for_loss_in_pipeline_split",
    "layout": "parallel.pipeline_model_parallel_layout",
    "vpp": "parallel.virtual_pipeline_model_parallel_size",
}


def _split(ctx: Context) -> Split:
    """The spec's pipeline split at its resolved PP and VPP sizes."""
    return split_of(ctx.spec.model.num_layers, ctx.spec.parallel, ctx.r.pp, ctx.r.vpp)


@rule(
    "pp-divides-layers",
    "error",
    "megatron.core.transformer.transformer_block.get_num_layers_to_build",
    "num_layers is a multiple of PP",
)
def _pp_layers(ctx: Context) -> Iterator[Finding]:
    layers, pp = ctx.spec.model.num_layers, pp_for_layers(ctx)
    if pp is not None and not _split(ctx).uneven:
        fix = with_layout(ctx, Fix({"parallel.pipeline_model_parallel_size": pp}))
        keep = _accounting_fix(_split(ctx))
        also = f"; or keep PP {ctx.r.pp} and {keep.text()} (megatron-core's uneven split)" if keep else ""
        yield Finding(
            "parallel.pipeline_model_parallel_size",
            f"num_layers = {layers} is not a multiple of the PP size",
            f"{fix.text()} (the divisors of {layers}: {join(divisors(layers))}){also}",
            fix=fix,
        )


def _accounting_fix(split: Split) -> Fix | None:
    """The embedding/loss accounting flags that make ``split`` (the even one) build at its PP and
    VPP sizes, or None."""
    for embedding, loss in ((True, True), (True, False), (False, True)):
        fix = _fix_of(split, embedding=embedding, loss=loss)
        if fix is not None:
            return fix
    return None


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
    if r.vpp is None or r.pp == 1 or layers % r.pp or _split(ctx).uneven:
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


def _fix_of(split: Split, **changes: object) -> Fix | None:
    """The :class:`Fix` writing ``changes`` (fields of :class:`Split`; None or False: the key
    removed, its default applies) when megatron-core builds the changed split, else None."""
    if split_problems(split._replace(**changes)):
        return None
    changes = {k: v for k, v in changes.items() if getattr(split, k) != v}  # what it writes: the keys it changes
    sets = {_KEYS[k]: v for k, v in changes.items() if v is not None and v is not False}
    return Fix(sets, tuple(_KEYS[k] for k, v in changes.items() if v is None or v is False))


def _first(split: Split, *candidates: dict[str, object]) -> Fix | None:
    """The fix of the first of ``candidates`` (field changes) under which the split builds."""
    for changes in candidates:
        fix = _fix_of(split, **changes)
        if fix is not None:
            return fix
    return None


def _written_layout(split: Split) -> str | None:
    """A layout string megatron-core accepts for this model at the spec's PP and VPP: the split with
    the embedding and the loss accounted (the published recipes' balance), else the even one."""
    bare = split._replace(first=None, last=None, layout=None)
    for candidate in (bare._replace(embedding=True, loss=True), bare._replace(embedding=False, loss=False)):
        if not split_problems(candidate):
            text = layout_string(chunk_layers(candidate))
            if not split_problems(split._replace(first=None, last=None, embedding=False, loss=False, layout=text)):
                return text
    return None


def _stage_counts_fix(split: Split) -> Fix | None:
    """The first/last stage counts nearest the spec's (only those it writes) that megatron-core
    accepts, else the even split or the accounted one."""
    step = split.vpp or 1

    def values(start: int | None) -> list[int | None]:
        if start is None:
            return [None]
        return sorted(range(step, split.num_layers + 1, step), key=lambda x: (abs(x - start), x))[:64]

    best: tuple[int, Fix] | None = None
    for first in values(split.first):
        for last in values(split.last):
            fix = _fix_of(split, first=first, last=last)
            if fix is not None:
                distance = abs((first or 0) - (split.first or 0)) + abs((last or 0) - (split.last or 0))
                if best is None or distance < best[0]:
                    best = (distance, fix)
    if best is not None:
        return best[1]
    return _first(split, {"first": None, "last": None}, {"first": None, "last": None, "embedding": True, "loss": True})


def _split_findings(ctx: Context, rule_id: str) -> Iterator[Finding]:
    """Findings of ``rule_id``'s problems (:func:`~dlmspec.pipeline_split.split_problems`), each with
    a fix megatron-core accepts."""
    split = _split(ctx)
    for problem in split_problems(split):
        if problem.rule != rule_id:
            continue
        fix = _repair(split, rule_id)
        hint = fix.text() if fix is not None else ("no split of these layers fits this PP size: change "
                                                    "parallel.pipeline_model_parallel_size")
        yield Finding(problem.key, problem.why, hint, fix=fix)


def _repair(split: Split, rule_id: str) -> Fix | None:
    """A fix for ``rule_id``'s problem with ``split`` (see each rule's text for the order tried)."""
    if rule_id == "pipeline-stage-layers-with-accounting":
        return _first(split, {"embedding": False, "loss": False}, {"first": None, "last": None})
    if rule_id == "pipeline-layout-alone":
        return _first(split, {"first": None, "last": None, "embedding": False, "loss": False}, {"layout": None})
    if rule_id in ("pipeline-layout-grammar", "pipeline-layout-stages", "pipeline-layout-layers"):
        text = _written_layout(split)
        return _first(split, *([{"layout": text}] if text else []), {"layout": None})
    if rule_id == "pipeline-layout-virtual-size":
        try:
            detected = len(expand_layout(split.layout or "")) // split.pp
        except LayoutError:
            return None
        return _first(split, {"vpp": detected if detected > 1 else None}, {"layout": None})
    if rule_id == "pipeline-stage-layers":
        return _stage_counts_fix(split)
    if rule_id == "pipeline-accounted-layers-divide":
        n = split.num_layers + int(split.embedding) + int(split.loss)
        vpps: list[dict[str, object]] = []
        if split.vpp is not None and n % split.pp == 0:
            options = [d for d in divisors(n // split.pp) if d > 1]
            vpps = [{"vpp": nearest(options, split.vpp)}] if options else []
            vpps.append({"vpp": None})
        flags = [{"embedding": e, "loss": l} for e, l in ((True, True), (True, False), (False, True), (False, False))
                 if (e, l) != (split.embedding, split.loss)]
        return _first(split, *vpps, *flags)
    return None


@rule(
    "pipeline-stage-layers-with-accounting",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (uneven PP)",
    "num_layers_in_first/last_pipeline_stage and account_for_embedding/loss_in_pipeline_split are not set together",
)
def _counts_with_accounting(ctx: Context) -> Iterator[Finding]:
    """Fix: remove the accounting flags, else the stage counts (whichever leaves a split that builds)."""
    yield from _split_findings(ctx, "pipeline-stage-layers-with-accounting")


@rule(
    "pipeline-layout-alone",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (PP layout)",
    "pipeline_model_parallel_layout is set without the other pipeline split options",
)
def _layout_alone(ctx: Context) -> Iterator[Finding]:
    """Fix: remove the other options (the layout places every layer), else the layout."""
    yield from _split_findings(ctx, "pipeline-layout-alone")


@rule(
    "pipeline-layout-grammar",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (PP layout) -> "
    "pipeline_parallel_layer_layout.PipelineParallelLayerLayout.parse_str_to_list",
    "pipeline_model_parallel_layout is made of 'E', 'L', 't', 'm', '|', ',' and '(...)*n' / 'x*n' repeats",
)
def _layout_grammar(ctx: Context) -> Iterator[Finding]:
    """Fix: the layout of the accounted (else the even) split, written out; else remove it."""
    yield from _split_findings(ctx, "pipeline-layout-grammar")


@rule(
    "pipeline-layout-stages",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (PP layout) -> "
    "pipeline_parallel_layer_layout.PipelineParallelLayerLayout.__init__",
    "pipeline_model_parallel_layout has a multiple of PP stages",
)
def _layout_stages(ctx: Context) -> Iterator[Finding]:
    yield from _split_findings(ctx, "pipeline-layout-stages")


@rule(
    "pipeline-layout-virtual-size",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (the VPP size conflicts with "
    "the layout) and backends/megatron/checks.check_parallel_config (the runtime's VPP size is the spec's)",
    "virtual_pipeline_model_parallel_size equals the layout's stages / PP (written when above 1)",
)
def _layout_virtual(ctx: Context) -> Iterator[Finding]:
    yield from _split_findings(ctx, "pipeline-layout-virtual-size")


@rule(
    "pipeline-layout-layers",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (PP layout) -> "
    "pipeline_parallel_layer_layout.PipelineParallelLayerLayout.validate_layer_layout",
    "pipeline_model_parallel_layout starts with 'E', ends with 'L', has each once and num_layers 't'",
)
def _layout_layers(ctx: Context) -> Iterator[Finding]:
    yield from _split_findings(ctx, "pipeline-layout-layers")


@rule(
    "pipeline-stage-layers",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (uneven PP)",
    "first/last stage layers are multiples of VPP and the rest split evenly (by VPP) over the middle stages",
)
def _stage_layers(ctx: Context) -> Iterator[Finding]:
    """Fix: the nearest first/last counts that work (only the keys the spec writes)."""
    yield from _split_findings(ctx, "pipeline-stage-layers")


@rule(
    "pipeline-accounted-layers-divide",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (account_for_*_in_pipeline_split)",
    "num_layers plus the accounted embedding and loss is a multiple of PP, and the layers per rank of VPP",
)
def _accounted(ctx: Context) -> Iterator[Finding]:
    """Fix: the nearest VPP size that divides the layers per rank, else other accounting flags."""
    yield from _split_findings(ctx, "pipeline-accounted-layers-divide")
