"""Helpers the rules share to write their fixes: divisors, lists of values, the TP sizes a
model allows, and why the layers are local."""

from __future__ import annotations

from typing import Any

from dlmspec.check.registry import Context
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


def tp_hint(ctx: Context) -> str:
    """``use parallel.tensor_model_parallel_size = ...`` with :func:`tp_options`, or why none fits."""
    options = tp_options(ctx)
    if options:
        return f"use parallel.tensor_model_parallel_size = {join(options)}"
    return "no TP size fits these dimensions and GPU count; change the model dimensions or the GPU count"


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
