"""Helpers the rules share to write their fixes: divisors, lists of values, the TP sizes a
model allows, and why the layers are local."""

from __future__ import annotations

from typing import Any

from dlmspec.check.registry import Context, layout_consistent
from dlmspec.errors import Fix
from dlmspec.layout import world_divides
from dlmspec.pipeline_split import split_of
from dlmspec.resolve import layer_path_needs

#: :func:`divisors` lists divisors up to this value (hints never need larger ones, and a
#: huge value must not make the validator loop for minutes).
DIVISOR_LIMIT = 1 << 16


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` up to :data:`DIVISOR_LIMIT`, ascending (every divisor for the sizes
    of real specs); at most ~65k trial divisions whatever ``n`` is."""
    if n <= 0:
        return []
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n and d <= DIVISOR_LIMIT:
        if n % d == 0:
            small.append(d)
            other = n // d
            if other != d and other <= DIVISOR_LIMIT:
                large.append(other)
        d += 1
    return small + large[::-1]


def join(values: list[Any], limit: int = 8) -> str:
    """``1, 2 or 4``; more than ``limit`` values end in ``, ...``."""
    shown = [str(v) for v in values[:limit]]
    if len(values) > limit:
        return ", ".join(shown) + ", ..."
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def tp_options(ctx: Context) -> list[int]:
    """TP sizes that satisfy every TP divisibility rule for this model (and divide the GPUs
    left after PP and CP, when that count is whole)."""
    m, r = ctx.spec.model, ctx.r
    rest = r.pp * r.cp
    candidates = divisors(r.world_size // rest) if r.world_size % rest == 0 else divisors(m.num_attention_heads)
    dense = 0 in r.moe_layers
    return [
        t
        for t in candidates
        if m.num_attention_heads % t == 0
        and (r.num_query_groups % t == 0 or t % r.num_query_groups == 0)
        and not (dense and m.ffn_hidden_size % t)
    ]


def nearest(options: list[int], value: int) -> int:
    """The option closest to ``value`` from below (the largest at most ``value``), else the
    smallest: what a fix changes a size to. ``options`` is not empty."""
    below = [o for o in options if o <= value]
    return max(below) if below else min(options)


def multiple_above(value: int, step: int) -> int:
    """The next multiple of ``step`` above ``value`` (``value`` itself never: it was refused)."""
    return (value // step + 1) * step


def pp_for_layers(ctx: Context) -> int | None:
    """The PP size rule ``pp-divides-layers`` proposes when ``num_layers`` is not a multiple of
    the spec's (the divisor of ``num_layers`` nearest it whose TP * PP * CP divides the GPUs),
    ``None`` when it is a multiple or the spec sets one of megatron-core's uneven splits."""
    layers, r = ctx.spec.model.num_layers, ctx.r
    if layers % r.pp == 0 or split_of(layers, ctx.spec.parallel, r.pp, r.vpp).uneven:
        return None  # an uneven split has its own rules (dlmspec.check.pipeline)
    options = [d for d in divisors(layers) if world_divides(r.world_size, r.tp, d, r.cp)] or divisors(layers)
    return nearest(options, r.pp)


def _batch_steps(ctx: Context, sizes: tuple[int, int, int] | None = None) -> list[int]:
    """``micro_batch_size * DP`` of each layout a printed fix may leave: the spec's (when it splits
    the GPUs), the one of ``sizes`` (TP, PP, CP), and the PP of :func:`pp_for_layers`. A global
    batch size that is a multiple of all of them is right whichever of the fixes is applied."""
    r, tr = ctx.r, ctx.spec.train
    layouts = [(r.tp, r.pp, r.cp)] if layout_consistent(r) else []
    if sizes is not None:
        layouts.append(sizes)
    pp = pp_for_layers(ctx)
    if pp is not None:
        layouts.append((r.tp, pp, r.cp))
    steps = []
    for tp, pp, cp in layouts:
        product = tp * pp * cp
        if product > 0 and r.world_size % product == 0:
            steps.append(tr.micro_batch_size * (r.world_size // product))
    return steps


def agreed_global_batch_size(ctx: Context, sizes: tuple[int, int, int] | None = None) -> int:
    """The global batch size every fix of the layout and the batch proposes: the next multiple
    above the spec's of the least common multiple of :func:`_batch_steps`, so a fix applied alone
    and all of them applied together validate (``batch-divisible`` with either data-parallel size)."""
    import math

    steps = _batch_steps(ctx, sizes) or [ctx.spec.train.micro_batch_size]
    return multiple_above(ctx.spec.train.global_batch_size, math.lcm(*steps))


def with_layout(ctx: Context, fix: Fix) -> Fix:
    """``fix`` (which changes TP, PP or CP) plus the global batch size the new data-parallel size
    needs, when the spec's is no longer a multiple of micro_batch_size * DP (batch-divisible):
    :func:`agreed_global_batch_size`, the value ``batch-divisible``'s fix gives too."""
    r, tr = ctx.r, ctx.spec.train
    sizes = (fix.set.get("parallel.tensor_model_parallel_size", r.tp),
             fix.set.get("parallel.pipeline_model_parallel_size", r.pp),
             fix.set.get("parallel.context_parallel_size", r.cp))
    product = sizes[0] * sizes[1] * sizes[2]
    if product <= 0 or r.world_size % product:
        return fix
    step = tr.micro_batch_size * (r.world_size // product)
    if tr.global_batch_size % step == 0 or "train.global_batch_size" in fix.set:
        return fix
    return Fix({**fix.set, "train.global_batch_size": agreed_global_batch_size(ctx, sizes)}, fix.unset)


def tp_hint(ctx: Context) -> tuple[str, Fix | None]:
    """``set parallel.tensor_model_parallel_size = N`` (the :func:`tp_options` size nearest
    the spec's, the others listed) and that fix, or why none fits (and no fix)."""
    options = tp_options(ctx)
    if options:
        best = nearest(options, ctx.r.tp)
        fix = with_layout(ctx, Fix({"parallel.tensor_model_parallel_size": best}))
        others = [o for o in options if o != best]
        return fix.text() + (f" (also {join(others)} fit)" if others else ""), fix
    return "no TP size fits these dimensions and GPU count; change the model dimensions or the GPU count", None


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` (>= 1) that is at most ``cap`` (>= 1)."""
    return max(d for d in divisors(n) if d <= cap)


def local_because(ctx: Context) -> str:
    """``" (<reason>)"`` when ``transformer_impl = "auto"`` took the local layers because a
    feature needs them (:func:`dlmspec.resolve.layer_path`), else ``""``."""
    return f" ({ctx.r.transformer_impl_reason})" if ctx.spec.model.transformer_impl == "auto" else ""


def or_te(ctx: Context) -> str:
    """The second fix of a Transformer Engine-only feature on the local layers: choose Transformer
    Engine, or (where auto took the local layers for a feature) turn that feature off."""
    if ctx.spec.model.transformer_impl == "local":
        return ", or model.transformer_impl = 'transformer_engine'"
    local, _ = layer_path_needs(ctx.spec, ctx.r.attention_mask, ctx.r.cp)
    return f", or turn off what needs the local layers ({', '.join(local)})"
