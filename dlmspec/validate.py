"""Cross-field rules: the combinations of spec values that megatron-core (or the objective) rejects.

Per-field checks (types, ranges, enumerations, unknown keys) are done by the schema in
:mod:`dlmspec.spec.models` when the spec is loaded. This module checks the rules that relate several
fields (heads divisible by TP, the global batch divisible by micro batch times DP, ...), on a
schema-valid spec and its :class:`~dlmspec.resolve.Resolved` values, and reports every problem
at once as :class:`~dlmspec.errors.SpecIssue` records.

Each rule is a :class:`Rule` in :data:`RULES` with a stable id (used by tests, ``--json`` and
``dlmspec show --rules``), one severity and the source it mirrors: the megatron-core 0.16
module and function that raises (or silently misbehaves) on the same input, Megatron-LM's
argument checks where megatron-core has none, or the paper the objective comes from.
``error`` rules are inputs that crash or train the wrong thing; ``warning`` rules are legal
inputs that are almost certainly unintended (a key that has no effect, a huge pipeline bubble).

Rules that look at this machine's files (``path-not-found``: data, tokenizer and checkpoint
inputs) are warnings and run only when asked (``paths=True``): those files usually live on the
cluster. An unknown ``model.preset`` is reported by the loader (issue rule ``unknown-preset``),
since the preset supplies the keys the schema needs.

Public API: :func:`find_issues` (every issue, never raises), :func:`validate_spec` (what
``dlmspec validate`` reports and ``dlmspec compile`` refuses: the rules with path checks, the
SLURM settings, what the runtime cannot run and the planned memory), :func:`load_validated`
(load a file and run :func:`validate_spec`: both commands start with it), :func:`check` (the
rules only; raises :class:`~dlmspec.errors.SpecError` when any error is found), and
:func:`load_checked` (load, resolve and :func:`check` a spec file in one call). Slurm settings
are checked by :func:`dlmspec.render.sbatch.sbatch_issues`, memory by :func:`dlmspec.plan.check_memory`
and what the bundled runtime cannot run yet by :func:`dlmspec.unsupported.unsupported_issues`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from dlmspec.credentials import (
    ENV_TABLES,
    ENVIRONMENT_FIX,
    HIDDEN,
    NEVER_WRITTEN,
    is_secret_name,
    spec_secrets,
    walk_strings,
)
from dlmspec.errors import Severity, SpecError, SpecIssue
from dlmspec.gpus import GPUS, gpu_ids
from dlmspec.spec.load import LoadedSpec, load
from dlmspec.resolve import Resolved, padded_vocab_size, resolve

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec

#: Ids of Megatron's GPT2BPETokenizer (GPT-2's byte-level BPE: 50,256 merges + <|endoftext|>).
GPT2_VOCAB_SIZE = 50257

_UNSET: Any = object()


@dataclass(frozen=True)
class Finding:
    """What a rule function yields: the key to point at, why, and a value that works.

    ``value`` defaults to the spec's value at ``key``.
    """

    key: str
    message: str
    hint: str | None = None
    value: Any = _UNSET


@dataclass(frozen=True)
class Rule:
    """One cross-field rule.

    Attributes:
        id: stable short id, e.g. ``"tp-divides-heads"``.
        severity: ``"error"`` or ``"warning"`` for every finding of the rule.
        source: what the rule mirrors (megatron-core module and function, Megatron-LM
            argument check, or paper).
        summary: the rule in one line, for ``dlmspec show --rules``.
        func: yields a :class:`Finding` per violation; reads a :class:`Context`.
        filesystem: the rule looks at files on this machine (its verdict depends on where it
            runs), so :func:`find_issues` runs it only when asked (``paths=True``).
    """

    id: str
    severity: Severity
    source: str
    summary: str
    func: Callable[["Context"], Iterator[Finding]]
    filesystem: bool = False


#: Every rule, in the order they run (the order of this file).
RULES: dict[str, Rule] = {}


def _rule(rule_id: str, severity: Severity, source: str, summary: str, *, filesystem: bool = False) -> Callable:
    def register(func: Callable[["Context"], Iterator[Finding]]) -> Callable[["Context"], Iterator[Finding]]:
        if rule_id in RULES:
            raise ValueError(f"duplicate rule id {rule_id}")
        RULES[rule_id] = Rule(rule_id, severity, source, summary, func, filesystem)
        return func

    return register


@dataclass
class Context:
    """What a rule reads: the spec, its resolved values and (when loaded from a file) where
    each key was written."""

    spec: Spec
    r: Resolved
    loaded: LoadedSpec | None = None

    def value(self, key: str) -> Any:
        """The spec's value at dotted ``key`` (``None`` past a missing table)."""
        node: Any = self.spec
        for part in key.split("."):
            if node is None:
                return None
            node = getattr(node, part)
        return node

    def is_set(self, key: str) -> bool:
        """Whether ``key`` was given (by the user, a preset or ``--set``) rather than defaulted."""
        parts = key.split(".")
        node: Any = self.spec
        for part in parts[:-1]:
            node = getattr(node, part, None)
            if node is None:
                return False
        return parts[-1] in node.model_fields_set

    def origin(self, key: str) -> tuple[str | None, int | None]:
        """(file, line) to report for ``key``: where it was written, else where the preset that
        supplied it was named, else its nearest written table."""
        if self.loaded is None:
            return (None, None)
        origins = self.loaded.origins
        if key in origins:
            return origins[key]
        if key.startswith("model.") and self.spec.model.preset and "model.preset" in origins:
            return origins["model.preset"]
        return self.loaded.locate(key)


#: :func:`_divisors` lists divisors up to this value (hints never need larger ones, and a
#: huge value must not make the validator loop for minutes).
_DIVISOR_LIMIT = 1 << 16


def _divisors(n: int) -> list[int]:
    """Divisors of ``n`` up to :data:`_DIVISOR_LIMIT`, ascending (every divisor for the sizes
    of real specs); at most ~65k trial divisions whatever ``n`` is."""
    if n <= 0:
        return []
    small: list[int] = []
    large: list[int] = []
    d = 1
    while d * d <= n and d <= _DIVISOR_LIMIT:
        if n % d == 0:
            small.append(d)
            other = n // d
            if other != d and other <= _DIVISOR_LIMIT:
                large.append(other)
        d += 1
    return small + large[::-1]


def _join(values: list[Any], limit: int = 8) -> str:
    """``1, 2 or 4``; more than ``limit`` values end in ``, ...``."""
    shown = [str(v) for v in values[:limit]]
    if len(values) > limit:
        return ", ".join(shown) + ", ..."
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " or " + shown[-1]


def _tp_options(ctx: Context) -> list[int]:
    """TP sizes that satisfy every TP divisibility rule for this model (and divide the GPUs
    left after PP and CP, when that count is whole)."""
    m, r = ctx.spec.model, ctx.r
    rest = r.pp * r.cp
    candidates = _divisors(r.world_size // rest) if r.world_size % rest == 0 else _divisors(m.num_attention_heads)
    dense = 0 in r.moe_layers
    return [
        t
        for t in candidates
        if m.num_attention_heads % t == 0
        and (r.num_query_groups % t == 0 or t % r.num_query_groups == 0)
        and not (dense and m.ffn_hidden_size % t)
    ]


def _tp_hint(ctx: Context) -> str:
    options = _tp_options(ctx)
    if options:
        return f"use parallel.tensor_model_parallel_size = {_join(options)}"
    return "no TP size fits these dimensions and GPU count; change the model dimensions or the GPU count"


# --------------------------------------------------------------------------------------------
# Catalog lookups
# --------------------------------------------------------------------------------------------


@_rule("unknown-gpu", "error", "dlmspec.gpus.GPUS", "cluster.gpu names a GPU in the catalog")
def _unknown_gpu(ctx: Context) -> Iterator[Finding]:
    gpu = ctx.spec.cluster.gpu
    if gpu not in GPUS:
        family = [g for g in gpu_ids() if g.startswith(gpu.lower())]
        from difflib import get_close_matches  # error hints only

        close = family or get_close_matches(gpu.lower(), gpu_ids(), n=1)
        hint = (f"did you mean {' or '.join(repr(g) for g in close)}?" if close
                else f"use one of {', '.join(gpu_ids())}")
        yield Finding("cluster.gpu", "unknown GPU (see `dlmspec show --gpus`)", hint)


# --------------------------------------------------------------------------------------------
# Parallel layout
# --------------------------------------------------------------------------------------------


@_rule(
    "world-divisible-by-model-parallel",
    "error",
    "megatron.core.parallel_state.initialize_model_parallel: world_size % (TP*PP*CP) == 0",
    "the GPU count is a multiple of TP * PP * CP",
)
def _world_model_parallel(ctx: Context) -> Iterator[Finding]:
    r, c = ctx.r, ctx.spec.cluster
    product = r.tp * r.pp * r.cp
    if r.world_size % product == 0:
        return
    sizes = [
        ("parallel.tensor_model_parallel_size", r.tp),
        ("parallel.pipeline_model_parallel_size", r.pp),
        ("parallel.context_parallel_size", r.cp),
    ]
    offenders = [kv for kv in sizes if r.world_size % kv[1]] or [max(sizes, key=lambda kv: kv[1])]
    key, size = offenders[0]
    others = product // size
    options = _divisors(r.world_size // others) if r.world_size % others == 0 else []
    if key == "parallel.tensor_model_parallel_size":
        options = [t for t in options if t in _tp_options(ctx)]
    hint = (
        f"use {key} = {_join(options)}, or nodes * gpus_per_node a multiple of {product}"
        if options
        else f"use nodes * gpus_per_node a multiple of {product}"
    )
    yield Finding(
        key,
        f"{r.world_size} GPUs ({c.nodes} node(s) x {c.gpus_per_node}) are not divisible by "
        f"TP*PP*CP = {r.tp}*{r.pp}*{r.cp} = {product}",
        hint,
    )


@_rule(
    "world-divisible-by-expert-parallel",
    "error",
    "megatron.core.parallel_state.initialize_model_parallel: world_size % (ETP*EP*PP) == 0",
    "the GPU count is a multiple of expert TP * EP * PP",
)
def _world_expert_parallel(ctx: Context) -> Iterator[Finding]:
    r = ctx.r
    product = r.etp * r.ep * r.pp
    # With EP = 1 and ETP defaulted to TP this is implied by world-divisible-by-model-parallel.
    if r.world_size % product == 0 or (r.ep == 1 and ctx.spec.parallel.expert_tensor_parallel_size is None):
        return
    key = "parallel.expert_model_parallel_size" if r.ep > 1 else "parallel.expert_tensor_parallel_size"
    yield Finding(
        key,
        f"{r.world_size} GPUs are not divisible by ETP*EP*PP = {r.etp}*{r.ep}*{r.pp} = {product}",
        f"use expert_model_parallel_size = {_join(_divisors(r.world_size // (r.etp * r.pp)))}"
        if r.world_size % (r.etp * r.pp) == 0
        else "use expert_tensor_parallel_size = 1",
    )


@_rule(
    "tp-divides-heads",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "num_attention_heads is a multiple of TP",
)
def _tp_heads(ctx: Context) -> Iterator[Finding]:
    heads = ctx.spec.model.num_attention_heads
    if heads % ctx.r.tp:
        yield Finding(
            "parallel.tensor_model_parallel_size",
            f"num_attention_heads = {heads} is not a multiple of the TP size",
            _tp_hint(ctx),
        )


@_rule(
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
        )


@_rule(
    "tp-query-groups",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "num_query_groups is a multiple or a divisor of TP",
)
def _tp_groups(ctx: Context) -> Iterator[Finding]:
    groups, tp = ctx.r.num_query_groups, ctx.r.tp
    if groups % tp and tp % groups:
        yield Finding(
            "parallel.tensor_model_parallel_size",
            f"num_query_groups = {groups} is neither a multiple nor a divisor of the TP size",
            _tp_hint(ctx),
        )


@_rule(
    "heads-divisible-by-groups",
    "error",
    "megatron.core.transformer.attention.SelfAttention (heads per group = heads // groups)",
    "num_attention_heads is a multiple of num_query_groups",
)
def _heads_groups(ctx: Context) -> Iterator[Finding]:
    heads, groups = ctx.spec.model.num_attention_heads, ctx.r.num_query_groups
    if heads % groups:
        yield Finding(
            "model.num_query_groups",
            f"num_attention_heads = {heads} is not a multiple of num_query_groups",
            f"use num_query_groups = {_join(_divisors(heads))}",
            value=groups,
        )


@_rule(
    "hidden-divisible-by-heads",
    "error",
    "Megatron-LM validate_args: hidden_size % num_attention_heads == 0 when kv_channels is unset",
    "without kv_channels, hidden_size is a multiple of num_attention_heads",
)
def _hidden_heads(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        yield Finding(
            "model.hidden_size",
            f"hidden_size is not a multiple of num_attention_heads = {m.num_attention_heads}, "
            f"so the head dimension would be rounded down to {m.hidden_size // m.num_attention_heads}",
            f"set model.kv_channels explicitly, or hidden_size = "
            f"{m.hidden_size // m.num_attention_heads * m.num_attention_heads}",
        )


@_rule(
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
            f"use a multiple of {tp}, e.g. {(m.ffn_hidden_size // tp + 1) * tp}",
        )
    shared = m.moe_shared_expert_intermediate_size
    if m.is_moe and shared is not None and shared % tp:
        yield Finding(
            "model.moe_shared_expert_intermediate_size",
            f"the shared expert is split over TP and {shared} is not a multiple of the TP size {tp}",
            f"use a multiple of {tp}, e.g. {(shared // tp + 1) * tp}",
        )


@_rule(
    "etp-divides-moe-ffn",
    "error",
    "megatron.core.transformer.moe.experts (expert FFN split over expert_tensor_parallel_size)",
    "moe_ffn_hidden_size is a multiple of the expert TP size",
)
def _etp_moe_ffn(ctx: Context) -> Iterator[Finding]:
    ffn, etp = ctx.r.moe_ffn_hidden_size, ctx.r.etp
    if ffn is not None and ffn % etp:
        yield Finding(
            "model.moe_ffn_hidden_size",
            f"moe_ffn_hidden_size is not a multiple of the expert TP size {etp}",
            f"use parallel.expert_tensor_parallel_size = {_join(_divisors(ffn)[:6])}",
            value=ffn,
        )


@_rule(
    "pp-divides-layers",
    "error",
    "megatron.core.transformer.transformer_block.get_num_layers_to_build",
    "num_layers is a multiple of PP",
)
def _pp_layers(ctx: Context) -> Iterator[Finding]:
    layers, pp = ctx.spec.model.num_layers, ctx.r.pp
    if layers % pp:
        yield Finding(
            "parallel.pipeline_model_parallel_size",
            f"num_layers = {layers} is not a multiple of the PP size",
            f"use pipeline_model_parallel_size = {_join(_divisors(layers))}",
        )


@_rule(
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
        )


@_rule(
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
        yield Finding(
            "parallel.virtual_pipeline_model_parallel_size",
            f"each of the {r.pp} pipeline stages has {per_stage} layers, not a multiple of the virtual size",
            f"use virtual_pipeline_model_parallel_size = {_join([d for d in _divisors(per_stage) if d > 1] or [1])}",
        )


@_rule(
    "vpp-microbatches",
    "error",
    "megatron.core.pipeline_parallel.schedules.forward_backward_pipelining_with_interleaving",
    "with interleaving, microbatches per step are a multiple of PP (and at least PP)",
)
def _vpp_microbatches(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    if r.vpp is None or r.pp == 1 or tr.global_batch_size % (tr.micro_batch_size * r.dp):
        return
    m = r.num_microbatches
    if m < r.pp or m % r.pp:
        step = tr.micro_batch_size * r.dp * r.pp
        yield Finding(
            "train.global_batch_size",
            f"{m} microbatches per step (gbs / (mbs * dp)) is not a positive multiple of PP = {r.pp}, "
            "which the interleaved schedule requires",
            f"use global_batch_size = a multiple of mbs * dp * pp = {step}, e.g. "
            f"{max(step, tr.global_batch_size // step * step)}",
        )


@_rule(
    "pipeline-bubble",
    "warning",
    "Narayanan et al. 2021 (Megatron-LM PTD-P), sec. 2.2.1: bubble time fraction (p - 1) / m",
    "the pipeline bubble (PP - 1) / microbatches is at most 50%",
)
def _bubble(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    if r.pp == 1 or tr.global_batch_size % (tr.micro_batch_size * r.dp):
        return
    bubble = (r.pp - 1) / r.num_microbatches
    if bubble > 0.5:
        want = 4 * r.pp * tr.micro_batch_size * r.dp
        yield Finding(
            "train.global_batch_size",
            f"{r.num_microbatches} microbatches over {r.pp} pipeline stages: the bubble costs "
            f"{bubble:.0%} of the compute time",
            f"use at least 4 * PP microbatches (global_batch_size = {want}), or a smaller PP size",
        )


@_rule(
    "batch-divisible",
    "error",
    "megatron.core.num_microbatches_calculator.ConstantNumMicroBatchesCalculator",
    "global_batch_size is a multiple of micro_batch_size * DP",
)
def _batch(ctx: Context) -> Iterator[Finding]:
    r, tr = ctx.r, ctx.spec.train
    step = tr.micro_batch_size * r.dp
    if tr.global_batch_size % step == 0:
        return
    below, above = tr.global_batch_size // step * step, (tr.global_batch_size // step + 1) * step
    options = [v for v in (below, above) if v > 0]
    yield Finding(
        "train.global_batch_size",
        f"not a multiple of micro_batch_size * data-parallel size = {tr.micro_batch_size} * {r.dp} = {step}",
        f"use global_batch_size = {_join(options)}",
    )


@_rule(
    "sequence-parallel-needs-tp",
    "error",
    "megatron.core.model_parallel_config.ModelParallelConfig.__post_init__",
    "sequence_parallel needs TP > 1",
)
def _sp_tp(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.sequence_parallel and ctx.r.tp == 1:
        yield Finding(
            "parallel.sequence_parallel",
            "sequence parallelism splits activations over the TP group, and TP is 1",
            "set sequence_parallel = false, or tensor_model_parallel_size >= 2",
        )


@_rule(
    "sequence-parallel-with-ep",
    "error",
    "megatron.core.model_parallel_config.ModelParallelConfig.__post_init__ "
    "(and Megatron-LM validate_args): EP > 1 with TP > 1 needs sequence_parallel",
    "expert parallelism with TP > 1 needs sequence_parallel",
)
def _sp_ep(ctx: Context) -> Iterator[Finding]:
    if ctx.r.ep > 1 and ctx.r.tp > 1 and not ctx.spec.parallel.sequence_parallel:
        yield Finding(
            "parallel.sequence_parallel",
            "expert parallelism with tensor parallelism needs sequence parallelism",
            "set parallel.sequence_parallel = true",
        )


@_rule(
    "sequence-parallel-seq-length",
    "error",
    "megatron.core.tensor_parallel.mappings._split_along_first_dim",
    "with sequence_parallel, seq_length / CP is a multiple of TP",
)
def _sp_seq(ctx: Context) -> Iterator[Finding]:
    r, s = ctx.r, ctx.spec.train.seq_length
    if ctx.spec.parallel.sequence_parallel and r.tp > 1 and s % r.cp == 0 and (s // r.cp) % r.tp:
        step = r.tp * r.cp * (2 if r.cp > 1 else 1)
        yield Finding(
            "train.seq_length",
            f"sequence parallelism splits each CP rank's {s // r.cp} tokens over TP = {r.tp}, which does not divide it",
            f"use a seq_length that is a multiple of {step}, e.g. {(s // step + 1) * step}",
        )


@_rule(
    "cp-seq-length",
    "error",
    "megatron.core.utils.get_batch_on_this_cp_rank (sequence split into 2 * CP chunks)",
    "with CP > 1, seq_length is a multiple of 2 * CP",
)
def _cp_seq(ctx: Context) -> Iterator[Finding]:
    r, s = ctx.r, ctx.spec.train.seq_length
    if r.cp > 1 and s % (2 * r.cp):
        step = 2 * r.cp
        yield Finding(
            "train.seq_length",
            f"context parallelism splits the sequence into 2 * CP = {step} chunks, which does not divide it",
            f"use a seq_length that is a multiple of {step}, e.g. {(s // step + 1) * step}",
        )


def _local_because(ctx: Context) -> str:
    """``" (<reason>)"`` when ``transformer_impl = "auto"`` took the local layers because a
    feature needs them (:func:`dlmspec.resolve.layer_path`), else ``""``."""
    return f" ({ctx.r.transformer_impl_reason})" if ctx.spec.model.transformer_impl == "auto" else ""


def _or_te(ctx: Context) -> str:
    """The second fix of a Transformer Engine-only feature on the local layers: choose Transformer
    Engine, or (where auto took the local layers for a feature) turn that feature off."""
    if ctx.spec.model.transformer_impl == "local":
        return ", or model.transformer_impl = 'transformer_engine'"
    from dlmspec.resolve import layer_path_needs

    local, _ = layer_path_needs(ctx.spec, ctx.r.attention_mask, ctx.r.cp)
    return f", or turn off what needs the local layers ({', '.join(local)})"


@_rule(
    "cp-local-allgather",
    "error",
    "dlmspec.backends.megatron.attention.SDPACoreAttention (CP_COMM_TYPES: keys and values all-gathered over "
    "the CP group; megatron-core TransformerConfig.cp_comm_type)",
    "context parallelism on the local layers uses cp_comm_type 'allgather'",
)
def _cp_local(ctx: Context) -> Iterator[Finding]:
    if ctx.r.cp == 1 or ctx.r.transformer_impl != "local":
        return
    from dlmspec.resolve import LOCAL_CP_COMM_TYPES

    comm = ctx.spec.parallel.cp_comm_type
    if comm not in LOCAL_CP_COMM_TYPES:
        yield Finding(
            "parallel.cp_comm_type",
            f"the local layers' SDPA attention implements context parallelism by all-gathering keys "
            f"and values only; '{comm}' exists in Transformer Engine's attention{_local_because(ctx)}",
            "set parallel.cp_comm_type = 'allgather'" + _or_te(ctx),
        )


@_rule(
    "cp-a2a-heads",
    "error",
    "megatron.core TransformerConfig.cp_comm_type 'a2a' (Ulysses: heads scattered over the CP group)",
    "with cp_comm_type 'a2a', the heads per TP rank are a multiple of CP",
)
def _cp_a2a(ctx: Context) -> Iterator[Finding]:
    r, heads = ctx.r, ctx.spec.model.num_attention_heads
    if r.cp > 1 and ctx.spec.parallel.cp_comm_type == "a2a" and heads % r.tp == 0 and (heads // r.tp) % r.cp:
        yield Finding(
            "parallel.cp_comm_type",
            f"all-to-all context parallelism scatters the {heads // r.tp} heads of each TP rank over "
            f"CP = {r.cp}, which does not divide them",
            "use cp_comm_type = 'p2p', or a CP size that divides the heads per TP rank",
        )


@_rule(
    "cp-attention-mask",
    "error",
    "transformer_engine.pytorch.attention.dot_product_attention.utils.get_attention_backend: with "
    "context parallelism only no_mask / causal self-attention run (FlashAttention, FusedAttention); "
    "arbitrary masks run only in UnfusedDotProductAttention, which has no context parallelism. "
    "dlmspec.backends.megatron.training.ObjectiveForwardStep.prepare: no attention mask under context "
    "parallelism (the local layers build the block-causal pattern themselves)",
    "context parallelism comes with no document or variable-length masks, and with Transformer "
    "Engine with bidirectional or causal attention only",
)
def _cp_mask(ctx: Context) -> Iterator[Finding]:
    if ctx.r.cp == 1:
        return
    if ctx.r.attention_mask == "block_causal" and ctx.r.transformer_impl != "local":
        yield Finding(
            "objective.attention_mask",
            "block-causal attention is an arbitrary mask, which Transformer Engine's context "
            "parallelism cannot split over GPUs",
            "set model.transformer_impl = 'local' with parallel.cp_comm_type = 'allgather', or "
            "attention_mask = 'bidirectional', or parallel.context_parallel_size = 1",
            value=ctx.r.attention_mask,
        )
    if ctx.spec.objective.kind == "mdm" and ctx.spec.objective.variable_length_prob > 0:
        yield Finding(
            "objective.variable_length_prob",
            "sequences cut to a random length need a key-padding mask, which context parallelism "
            "cannot split over GPUs (the run would stop at the first cut sequence)",
            "set objective.variable_length_prob = 0, or parallel.context_parallel_size = 1",
        )
    if ctx.spec.data.reset_attention_mask:
        yield Finding(
            "data.reset_attention_mask",
            "document masks are arbitrary masks, which context parallelism cannot split over GPUs",
            "set data.reset_attention_mask = false, or parallel.context_parallel_size = 1",
        )


# --------------------------------------------------------------------------------------------
# Mixture of experts
# --------------------------------------------------------------------------------------------


@_rule(
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
        )


@_rule(
    "ep-divides-experts",
    "error",
    "megatron.core.transformer.moe.moe_layer.BaseMoELayer.__init__",
    "num_experts is a multiple of EP",
)
def _ep_experts(ctx: Context) -> Iterator[Finding]:
    experts = ctx.spec.model.num_experts
    if experts is not None and experts % ctx.r.ep:
        yield Finding(
            "parallel.expert_model_parallel_size",
            f"num_experts = {experts} is not a multiple of the EP size",
            f"use expert_model_parallel_size = {_join(_divisors(experts))}",
        )


@_rule(
    "topk-le-experts",
    "error",
    "megatron.core.transformer.moe.router.TopKRouter (top-k over num_experts)",
    "moe_router_topk is at most num_experts",
)
def _topk(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.num_experts is not None and m.moe_router_topk > m.num_experts:
        yield Finding(
            "model.moe_router_topk",
            f"a token cannot be routed to more than num_experts = {m.num_experts} experts",
            f"use moe_router_topk <= {m.num_experts}",
        )


@_rule(
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
            "use moe_router_topk >= 2, or moe_router_load_balancing_type = 'sinkhorn'",
        )


@_rule(
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
    if len(freq) != m.num_layers:
        yield Finding(
            "model.moe_layer_freq",
            f"has {len(freq)} entries for {m.num_layers} layers",
            f"give one 0/1 entry per layer ({m.num_layers}), or an int N for every Nth layer",
        )
    elif any(v not in (0, 1) for v in freq):
        yield Finding("model.moe_layer_freq", "entries must be 0 (dense) or 1 (MoE)", "use only 0 and 1")
    elif not any(freq):
        yield Finding(
            "model.moe_layer_freq",
            "no layer is MoE, yet num_experts is set",
            "put a 1 where a layer is MoE, or remove num_experts",
        )


@_rule(
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
        )


@_rule(
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
                          f"remove {key}, or set model.num_experts")


@_rule(
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
        yield Finding("recompute.modules", "recomputing 'moe_act' needs grouped-GEMM experts, and the model is dense "
                      "(model.num_experts is unset)", "drop 'moe_act' from recompute.modules")
    elif not m.moe_grouped_gemm:
        yield Finding(
            "recompute.modules",
            "recomputing 'moe_act' is only implemented for grouped-GEMM experts",
            "set model.moe_grouped_gemm = true, or drop 'moe_act' from recompute.modules",
        )


# --------------------------------------------------------------------------------------------
# Activation recomputation
# --------------------------------------------------------------------------------------------


@_rule(
    "recompute-full-needs-method",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "full recomputation names recompute.method",
)
def _full_method(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity == "full" and rc.method is None:
        yield Finding(
            "recompute.method",
            "full recomputation needs a method",
            "use method = 'uniform' (every recompute.num_layers layers) or 'block' (the first num_layers per stage)",
        )


@_rule(
    "recompute-full-needs-num-layers",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__",
    "full recomputation sets recompute.num_layers",
)
def _full_layers(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity == "full" and rc.num_layers is None:
        per_stage = max(1, ctx.spec.model.num_layers // ctx.r.pp)
        yield Finding(
            "recompute.num_layers",
            "full recomputation needs num_layers",
            f"use a value between 1 and the layers per pipeline stage ({per_stage})",
        )


def _layers_per_chunk(ctx: Context) -> int | None:
    """Layers in one model chunk (one pipeline stage, or one virtual stage with interleaving):
    ``len(TransformerBlock.layers)``. None when PP (or VPP) does not divide the layers (other
    rules report that)."""
    layers, pp, vpp = ctx.spec.model.num_layers, ctx.r.pp, ctx.r.vpp or 1
    if layers % pp or (layers // pp) % vpp:
        return None
    return layers // pp // vpp


@_rule(
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
        yield Finding(
            "recompute.num_layers",
            f"does not divide the {chunk} layers of a pipeline stage, so the last uniform chunk would "
            "run past the stage's last layer",
            f"use recompute.num_layers = {_join(_divisors(chunk))}",
        )


@_rule(
    "recompute-num-layers-range",
    "warning",
    "megatron.core.transformer.transformer_config.TransformerConfig (recompute_num_layers between 1 "
    "and the layers per pipeline rank); TransformerBlock._checkpointed_forward (block method)",
    "block recomputation's num_layers is at most the layers of a pipeline (virtual) stage",
)
def _recompute_range(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    chunk = _layers_per_chunk(ctx)
    if rc.granularity == "full" and rc.method == "block" and rc.num_layers is not None and chunk and rc.num_layers > chunk:
        yield Finding(
            "recompute.num_layers",
            f"exceeds the {chunk} layers of a pipeline stage; every layer is recomputed already at {chunk}",
            f"use a value between 1 and {chunk}",
        )


@_rule(
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
                              f"remove recompute.{key}, or set recompute.granularity")
    elif rc.granularity == "selective":
        # Megatron-LM's arguments refuse a layer count with selective recomputation; dlmspec
        # does not pass it to TransformerConfig then, so it is only a key with no effect.
        for key in ("method", "num_layers"):
            if getattr(rc, key) is not None:
                yield Finding(f"recompute.{key}", "has no effect: selective recomputation applies to every layer",
                              f"remove recompute.{key}, or use granularity = 'full'")
    elif rc.granularity == "full" and rc.modules is not None:
        yield Finding("recompute.modules", "has no effect with full recomputation (whole layers are recomputed)",
                      "remove recompute.modules, or use granularity = 'selective'")


@_rule(
    "recompute-moe-modules",
    "warning",
    "megatron.core.transformer.transformer_config.TransformerConfig.recompute_modules",
    "MoE recompute modules are only named for MoE models",
)
def _recompute_moe(ctx: Context) -> Iterator[Finding]:
    rc, m = ctx.spec.recompute, ctx.spec.model
    if rc.granularity != "selective" or not rc.modules:
        return
    for module in rc.modules:
        if module in ("moe", "shared_experts") and not m.is_moe:  # moe_act: moe-act-needs-grouped-gemm
            yield Finding("recompute.modules", f"'{module}' has no effect on a dense model",
                          f"drop '{module}' from recompute.modules")
        elif module == "shared_experts" and m.is_moe and m.moe_shared_expert_intermediate_size is None:
            yield Finding("recompute.modules", "'shared_experts' has no effect: the model has no shared expert",
                          "drop 'shared_experts' from recompute.modules")


# --------------------------------------------------------------------------------------------
# Precision
# --------------------------------------------------------------------------------------------


@_rule(
    "fp8-needs-te",
    "error",
    "megatron.core.fp8_utils (fp8 runs through Transformer Engine layers only)",
    "fp8 needs Transformer Engine layers",
)
def _fp8_te(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.precision.fp8 != "none" and ctx.r.transformer_impl == "local":
        yield Finding(
            "precision.fp8",
            "fp8 needs Transformer Engine layers, and "
            + (f"the layers are local{_local_because(ctx)}" if _local_because(ctx) else "model.transformer_impl = 'local'"),
            "set precision.fp8 = 'none'" + _or_te(ctx),
        )


@_rule(
    "fp8-gpu",
    "error",
    "dlmspec.gpus.GPU.supports_fp8 (fp8 tensor cores from compute capability 8.9)",
    "fp8 runs on a GPU with fp8 tensor cores",
)
def _fp8_gpu(ctx: Context) -> Iterator[Finding]:
    gpu = ctx.r.gpu
    if ctx.spec.precision.fp8 != "none" and gpu is not None and not gpu.supports_fp8:
        yield Finding(
            "precision.fp8",
            f"{gpu.name} (compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]}) "
            "has no fp8 tensor cores",
            "set precision.fp8 = 'none', or a GPU such as h100, h200 or b200",
        )


@_rule(
    "fp8-recipe-gpu",
    "error",
    "Transformer Engine MXFP8BlockScaling (microscaling fp8 needs compute capability 10.0, Blackwell)",
    "the mxfp8 recipe runs on Blackwell GPUs",
)
def _mxfp8(ctx: Context) -> Iterator[Finding]:
    p, gpu = ctx.spec.precision, ctx.r.gpu
    if p.fp8 != "none" and p.fp8_recipe == "mxfp8" and gpu is not None and gpu.compute_capability < (10, 0):
        yield Finding(
            "precision.fp8_recipe",
            f"MXFP8 needs Blackwell tensor cores (compute capability 10.0); {gpu.name} has "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            "use fp8_recipe = 'delayed' or 'tensorwise', or a b200/gb200 GPU",
        )


@_rule(
    "fp8-keys-ignored",
    "warning",
    "megatron.core TransformerConfig.fp8_recipe (used only when fp8 is enabled)",
    "precision.fp8_recipe is only given with fp8",
)
def _fp8_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.precision.fp8 == "none" and ctx.is_set("precision.fp8_recipe"):
        yield Finding("precision.fp8_recipe", "has no effect: precision.fp8 = 'none'",
                      "remove fp8_recipe, or set precision.fp8 = 'hybrid' or 'e4m3'")


@_rule(
    "fp8-recompute-modules",
    "error",
    "megatron.core.transformer.transformer_config.TransformerConfig.__post_init__ (delayed fp8 scaling "
    "cannot recompute moe_act or layernorm; other recipes need Transformer Engine >= 2.6)",
    "with fp8 delayed scaling, selective recomputation leaves out moe_act and layernorm",
)
def _fp8_recompute(ctx: Context) -> Iterator[Finding]:
    p, rc = ctx.spec.precision, ctx.spec.recompute
    modules = [m for m in (rc.modules or []) if m in ("moe_act", "layernorm")]
    if p.fp8 != "none" and p.fp8_recipe == "delayed" and rc.granularity == "selective" and modules:
        yield Finding(
            "recompute.modules",
            f"recomputing {' and '.join(repr(m) for m in modules)} is not supported with delayed fp8 scaling",
            "use precision.fp8_recipe = 'tensorwise' (Transformer Engine >= 2.6), or drop "
            f"{' and '.join(repr(m) for m in modules)} from recompute.modules",
        )


# --------------------------------------------------------------------------------------------
# Objective
# --------------------------------------------------------------------------------------------


@_rule(
    "ar-attention",
    "error",
    "next-token prediction: position i may attend only to positions <= i (else it sees its target)",
    "the 'ar' objective uses causal attention",
)
def _ar_attention(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.objective.kind == "ar" and ctx.r.attention_mask != "causal":
        yield Finding(
            "objective.attention_mask",
            f"next-token prediction with {ctx.r.attention_mask} attention lets each position see the "
            "token it predicts",
            "use attention_mask = 'causal' (the default for ar), or objective.kind = 'mdm'",
            value=ctx.r.attention_mask,
        )


@_rule(
    "mdm-causal-attention",
    "warning",
    "LLaDA (Nie et al. 2025, sec. 2.1) and MDLM (Sahoo et al. 2024): the mask predictor is a "
    "bidirectional Transformer",
    "masked diffusion uses bidirectional (or block-causal) attention",
)
def _mdm_causal(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.objective.kind == "mdm" and ctx.r.attention_mask == "causal":
        yield Finding(
            "objective.attention_mask",
            "a masked-diffusion model with causal attention cannot use the unmasked tokens to its right",
            "use attention_mask = 'bidirectional' (the default for mdm) or 'block_causal'",
        )


@_rule(
    "block-causal-needs-size",
    "error",
    "block diffusion (Arriola et al. 2025, BD3-LM): the mask is causal over blocks of block_size",
    "block_causal attention sets objective.block_size",
)
def _block_needs_size(ctx: Context) -> Iterator[Finding]:
    if ctx.r.attention_mask == "block_causal" and ctx.spec.objective.block_size is None:
        yield Finding(
            "objective.block_size",
            "block_causal attention needs a block length",
            f"set block_size to a divisor of seq_length = {ctx.spec.train.seq_length}, e.g. "
            f"{_largest_divisor_at_most(ctx.spec.train.seq_length, 32)}",
        )


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in _divisors(n) if d <= cap)


@_rule(
    "block-size-divides-seq",
    "error",
    "block diffusion (Arriola et al. 2025, BD3-LM): a sequence is a whole number of blocks",
    "block_size divides seq_length",
)
def _block_divides(ctx: Context) -> Iterator[Finding]:
    bs, s = ctx.spec.objective.block_size, ctx.spec.train.seq_length
    if ctx.r.attention_mask == "block_causal" and bs is not None and s % bs:
        yield Finding(
            "objective.block_size",
            f"seq_length = {s} is not a whole number of blocks",
            f"use block_size = {_largest_divisor_at_most(s, bs)} (a divisor of {s})",
        )


@_rule(
    "block-size-ignored",
    "warning",
    "dlmspec.spec.models.ObjectiveSpec.block_size (used only by block_causal attention)",
    "objective.block_size is only given with block_causal attention",
)
def _block_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.objective.block_size is not None and ctx.r.attention_mask != "block_causal":
        yield Finding("objective.block_size", f"has no effect with {ctx.r.attention_mask} attention",
                      "remove block_size, or set attention_mask = 'block_causal'")


@_rule(
    "mask-token-range",
    "error",
    "LLaDA (Nie et al. 2025, eq. 3): [MASK] is a token the model embeds; the embedding has "
    "padded_vocab_size rows (Megatron-LM _vocab_size_with_padding)",
    "the [MASK] id is a row of the padded embedding",
)
def _mask_range(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    if r.mask_token_id is None or r.mask_token_id < r.padded_vocab_size:
        return
    if ctx.spec.objective.mask_token_id is not None:
        first_free = f" ({m.vocab_size} is the first padded slot)" if m.vocab_size < r.padded_vocab_size else ""
        hint = f"use an id below {r.padded_vocab_size}{first_free}, or the tokenizer's reserved mask id"
    else:
        grown = padded_vocab_size(m.vocab_size + 1, m.make_vocab_size_divisible_by, r.tp)
        hint = (
            f"vocab_size {m.vocab_size} is already a multiple of the padding, so no free slot is left "
            f"for [MASK]: set model.vocab_size = {m.vocab_size + 1} (pads to {grown}), or "
            "objective.mask_token_id = the tokenizer's reserved mask id"
        )
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {r.mask_token_id} is outside the embedding (padded vocabulary: {r.padded_vocab_size} rows)",
        hint,
        value=r.mask_token_id,
    )


def _tokenizer_eod(ctx: Context) -> int | None:
    """The end-of-document id the data holds, when the spec says it: ``data.tokenizer.eod_id``,
    NullTokenizer's ``vocab_size`` (megatron-core NullTokenizer), GPT-2 BPE's ``<|endoftext|>``
    (50256). Other tokenizers keep it in their files, which the validator does not read."""
    tok = ctx.spec.data.tokenizer
    if tok.eod_id is not None:
        return tok.eod_id
    if tok.type == "NullTokenizer":
        return tok.vocab_size
    if tok.type == "GPT2BPETokenizer":
        return GPT2_VOCAB_SIZE - 1
    return None


@_rule(
    "mask-token-distinct",
    "error",
    "LLaDA (Nie et al. 2025, sec. 2.1): [MASK] is a reserved token that never occurs in the data; "
    "megatron-core NullTokenizer emits ids 0..vocab_size (EOD = vocab_size)",
    "the [MASK] id is neither the end-of-document id nor an id the NullTokenizer emits",
)
def _mask_distinct(ctx: Context) -> Iterator[Finding]:
    r, m, tok = ctx.r, ctx.spec.model, ctx.spec.data.tokenizer
    mask = r.mask_token_id
    if mask is None or mask >= r.padded_vocab_size:
        return  # mask-token-range
    free = f"e.g. {m.vocab_size} (the first padded slot)" if m.vocab_size < r.padded_vocab_size else \
        "a reserved token the tokenizer never emits"
    eod = _tokenizer_eod(ctx)
    if mask == eod:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is also the end-of-document id, so every EOD in the data would read as a masked position",
            f"use another objective.mask_token_id, {free}",
            value=mask,
        )
    elif tok.type == "NullTokenizer" and tok.vocab_size is not None and mask < tok.vocab_size:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is an ordinary token of NullTokenizer(vocab_size = {tok.vocab_size}), which emits "
            f"ids 0..{tok.vocab_size}: the data would contain it",
            f"use objective.mask_token_id > {tok.vocab_size}, or data.tokenizer.vocab_size < {mask}",
            value=mask,
        )


def _tokenizer_pad(ctx: Context) -> tuple[str, int, str] | None:
    """``(token, id, file)`` of the tokenizer's pad token, when this machine can tell: a local
    Hugging Face tokenizer folder (``data.tokenizer.model``) whose ``tokenizer_config.json``
    (else ``special_tokens_map.json``) names a ``pad_token``, with its id from
    ``tokenizer_config.json``'s ``added_tokens_decoder`` (where Hugging Face lists special tokens)
    or else ``tokenizer.json`` (``added_tokens``, then ``model.vocab``). None otherwise: the spec
    has no pad key, GPT-2 BPE and megatron-core's NullTokenizer have no pad token, and
    SentencePiece/TikToken keep theirs in model files the validator does not read."""
    from dlmspec.tokenizers import read_json  # only here: validate stays light

    tok = ctx.spec.data.tokenizer
    if tok.type != "HuggingFaceTokenizer" or not tok.model:
        return None
    try:
        if not os.path.isdir(tok.model):
            return None
    except (OSError, ValueError):
        return None
    config = read_json(os.path.join(tok.model, "tokenizer_config.json"))
    config = config if isinstance(config, dict) else {}
    pad = config.get("pad_token")
    source = "tokenizer_config.json"
    if pad is None:
        special = read_json(os.path.join(tok.model, "special_tokens_map.json"))
        pad = special.get("pad_token") if isinstance(special, dict) else None
        source = "special_tokens_map.json"
    if isinstance(pad, dict):
        pad = pad.get("content")
    if not isinstance(pad, str):
        return None
    decoder = config.get("added_tokens_decoder")
    for key, entry in (decoder.items() if isinstance(decoder, dict) else ()):
        if isinstance(entry, dict) and entry.get("content") == pad and str(key).isdigit():
            return pad, int(key), os.path.join(tok.model, source)
    data = read_json(os.path.join(tok.model, "tokenizer.json"))  # megabytes: only when needed
    if not isinstance(data, dict):
        return None
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == pad and isinstance(entry.get("id"), int):
            return pad, entry["id"], os.path.join(tok.model, source)
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    if isinstance(vocab, dict) and isinstance(vocab.get(pad), int):
        return pad, vocab[pad], os.path.join(tok.model, source)
    return None


@_rule(
    "mask-token-not-pad",
    "error",
    "LLaDA (Nie et al. 2025, sec. 2.1): [MASK] is a reserved token; padding written with the "
    "tokenizer's pad id (SFT batches, megatron-core GPTDataset's pad_token_id) would read as [MASK]",
    "the [MASK] id is not the pad id of the tokenizer (a local Hugging Face tokenizer's pad_token)",
    filesystem=True,
)
def _mask_not_pad(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    mask = r.mask_token_id
    eod = _tokenizer_eod(ctx)
    if mask is None or mask >= r.padded_vocab_size or mask == eod:
        return  # mask-token-range, mask-token-distinct
    pad = _tokenizer_pad(ctx)
    if pad is None or pad[1] != mask:
        return
    token, _, source = pad
    free = [i for i in range(m.vocab_size, min(r.padded_vocab_size, m.vocab_size + 3)) if i not in (mask, eod)]
    hint = (f"e.g. {free[0]} (a padded slot of the embedding)" if free else
            "a reserved token the tokenizer never emits")
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is also the tokenizer's pad id ({token!r}, {source}), so a padded position "
        "would be indistinguishable from a masked one",
        f"use another objective.mask_token_id, {hint}",
        value=mask,
    )


@_rule(
    "mask-token-ignored",
    "warning",
    "dlmspec.resolve (mask_token_id is used only by the mdm objective)",
    "objective.mask_token_id is only given for mdm",
)
def _mask_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.objective.kind == "ar" and ctx.spec.objective.mask_token_id is not None:
        yield Finding("objective.mask_token_id", "has no effect with the 'ar' objective",
                      "remove mask_token_id, or set objective.kind = 'mdm'")


@_rule(
    "bidirectional-without-positions",
    "warning",
    "self-attention without position information is permutation-equivariant (Vaswani et al. 2017, sec. 3.5)",
    "non-causal attention comes with a position embedding",
)
def _no_positions(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.model.position_embedding_type == "none" and ctx.r.attention_mask != "causal":
        yield Finding(
            "model.position_embedding_type",
            f"with {ctx.r.attention_mask} attention and no position embedding the model cannot tell "
            "token order",
            "use position_embedding_type = 'rope'",
        )


@_rule(
    "seq-exceeds-learned-positions",
    "error",
    "megatron.core.models.common.embeddings.language_model_embedding.LanguageModelEmbedding "
    "(position table of max_sequence_length rows)",
    "with learned positions, seq_length <= max_position_embeddings",
)
def _learned_positions(ctx: Context) -> Iterator[Finding]:
    m, s = ctx.spec.model, ctx.spec.train.seq_length
    if m.position_embedding_type == "learned_absolute" and s > m.max_position_embeddings:
        yield Finding(
            "train.seq_length",
            f"learned position embeddings have {m.max_position_embeddings} rows; positions beyond them do not exist",
            f"use seq_length <= {m.max_position_embeddings}, or raise model.max_position_embeddings",
        )


@_rule(
    "seq-exceeds-rope-positions",
    "warning",
    "model.max_position_embeddings is the context length the architecture was built (or trained) for",
    "with rope, seq_length <= max_position_embeddings",
)
def _rope_positions(ctx: Context) -> Iterator[Finding]:
    m, s = ctx.spec.model, ctx.spec.train.seq_length
    if m.position_embedding_type == "rope" and s > m.max_position_embeddings:
        yield Finding(
            "train.seq_length",
            f"longer than model.max_position_embeddings = {m.max_position_embeddings}",
            f"use seq_length <= {m.max_position_embeddings}, or raise max_position_embeddings on purpose",
        )


# --------------------------------------------------------------------------------------------
# Training budget and schedule
# --------------------------------------------------------------------------------------------


@_rule(
    "train-budget",
    "error",
    "Megatron-LM validate_args: exactly one of --train-iters / --train-samples",
    "exactly one of train.train_iters and train.train_tokens is set",
)
def _budget(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.train_iters is None and tr.train_tokens is None:
        yield Finding(
            "train.train_iters",
            "the training length is not set",
            f"set train.train_iters (steps) or train.train_tokens (one step is {ctx.r.tokens_per_step} tokens)",
        )
    elif tr.train_iters is not None and tr.train_tokens is not None:
        yield Finding(
            "train.train_tokens",
            "train_iters and train_tokens both set the training length",
            "keep only one of train_iters and train_tokens",
        )


@_rule(
    "min-lr-le-lr",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (max_lr >= min_lr)",
    "train.min_lr <= train.lr",
)
def _min_lr(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.min_lr > tr.lr:
        yield Finding("train.min_lr", f"is above the peak lr = {tr.lr}",
                      f"use min_lr <= {tr.lr}, e.g. {tr.lr / 10:g}")


@_rule(
    "warmup-exclusive",
    "error",
    "Megatron-LM validate_args: only one of --lr-warmup-fraction and --lr-warmup-iters",
    "only one of lr_warmup_iters and lr_warmup_fraction is set",
)
def _warmup_exclusive(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_warmup_fraction is not None and tr.lr_warmup_iters > 0:
        yield Finding("train.lr_warmup_fraction", "lr_warmup_iters and lr_warmup_fraction both set the warmup",
                      "keep only one of them")


def _schedule(ctx: Context) -> tuple[int, int]:
    """(warmup, decay) steps as Megatron-LM derives them (training.get_optimizer_param_scheduler)."""
    tr = ctx.spec.train
    decay = tr.lr_decay_iters or ctx.r.train_iters
    warmup = int(tr.lr_warmup_fraction * decay) if tr.lr_warmup_fraction is not None else tr.lr_warmup_iters
    return warmup, decay


@_rule(
    "warmup-lt-decay",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (warmup < decay steps)",
    "the warmup is shorter than the decay",
)
def _warmup_decay(ctx: Context) -> Iterator[Finding]:
    warmup, decay = _schedule(ctx)
    if decay > 0 and warmup >= decay:
        key = "train.lr_warmup_fraction" if ctx.spec.train.lr_warmup_fraction is not None else "train.lr_warmup_iters"
        yield Finding(key, f"{warmup} warmup steps do not fit in the {decay} decay steps",
                      f"use fewer than {decay} warmup steps")


@_rule(
    "decay-beyond-train",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.get_lr",
    "the LR decay ends by the last training step",
)
def _decay_beyond(ctx: Context) -> Iterator[Finding]:
    tr, iters = ctx.spec.train, ctx.r.train_iters
    if tr.lr_decay_iters is not None and iters and tr.lr_decay_iters > iters and tr.lr_decay_style != "constant":
        yield Finding(
            "train.lr_decay_iters",
            f"training stops at step {iters}, before the LR decay ends, so the LR never reaches min_lr",
            f"use lr_decay_iters <= {iters}, or leave it unset (defaults to train_iters)",
        )


@_rule(
    "wsd-needs-decay-iters",
    "error",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.__init__ (WSD needs wsd_decay_steps)",
    "the WSD schedule sets train.lr_wsd_decay_iters",
)
def _wsd(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_decay_style == "WSD" and tr.lr_wsd_decay_iters is None:
        _, decay = _schedule(ctx)
        yield Finding("train.lr_wsd_decay_iters", "the WSD schedule needs the length of its final decay",
                      f"set lr_wsd_decay_iters, e.g. {max(1, decay // 10)} (10% of the {decay} decay steps)")


@_rule(
    "wsd-overlaps-warmup",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler.get_lr (WSD anneal starts at "
    "decay - wsd_decay steps)",
    "the WSD decay starts after the warmup",
)
def _wsd_overlap(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    warmup, decay = _schedule(ctx)
    if tr.lr_decay_style == "WSD" and tr.lr_wsd_decay_iters is not None and decay and tr.lr_wsd_decay_iters > decay - warmup:
        yield Finding(
            "train.lr_wsd_decay_iters",
            f"the final decay would start at step {decay - tr.lr_wsd_decay_iters}, before the warmup ends "
            f"at step {warmup}; the LR jumps when warmup ends",
            f"use lr_wsd_decay_iters <= {max(1, decay - warmup)}",
        )


@_rule(
    "no-checkpoint-save",
    "warning",
    "dlmspec.backends.megatron.training.train (saves and resumes only with CheckpointConfig.save_dir); "
    "launch.sbatch requeues a stopped job",
    "a run longer than one save interval, or one started from init_from, saves checkpoints",
)
def _no_save(ctx: Context) -> Iterator[Finding]:
    ck = ctx.spec.checkpoint
    if ck.save is not None:
        return
    long_run = ctx.r.train_iters > ck.save_interval
    if long_run or ck.init_from:
        why = (f"{ctx.r.train_iters} steps" if long_run else "a run started from init_from")
        yield Finding(
            "checkpoint.save",
            f"not set: {why} would never save a checkpoint, so a stop, a crash or a SLURM requeue "
            "starts it again from the beginning",
            f'set checkpoint.save = "runs/{ctx.spec.name}/checkpoints" (a directory every node sees)',
        )


@_rule(
    "wsd-keys-ignored",
    "warning",
    "megatron.core.optimizer_param_scheduler.OptimizerParamScheduler (wsd_* used only by WSD)",
    "WSD keys are only given with lr_decay_style = 'WSD'",
)
def _wsd_ignored(ctx: Context) -> Iterator[Finding]:
    tr = ctx.spec.train
    if tr.lr_decay_style != "WSD":
        for key in ("train.lr_wsd_decay_iters", "train.lr_wsd_decay_style"):
            if ctx.is_set(key):
                yield Finding(key, f"has no effect with lr_decay_style = '{tr.lr_decay_style}'",
                              f"remove {key.split('.')[1]}, or set lr_decay_style = 'WSD'")


@_rule(
    "eval-interval",
    "warning",
    "Megatron-LM training.train (evaluates every eval_interval steps)",
    "evaluation runs at least once during training",
)
def _eval(ctx: Context) -> Iterator[Finding]:
    tr, iters = ctx.spec.train, ctx.r.train_iters
    if iters and tr.eval_interval > iters:
        yield Finding("train.eval_interval", f"exceeds the {iters} training steps: no evaluation during training",
                      f"use eval_interval <= {iters}")


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@_rule(
    "data-required",
    "error",
    "megatron.core.datasets.blended_megatron_dataset_builder (a blend or mock data is needed)",
    "data.train names datasets, or data.mock = true",
)
def _data_required(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if not d.mock and not d.train:
        yield Finding("data.train", "no training data", "add data.train = [\"PREFIX\"] (PREFIX.bin/.idx), "
                      "or data.mock = true for random tokens", value=[])


@_rule(
    "mock-ignores-data",
    "warning",
    "megatron.core.datasets.gpt_dataset.MockGPTDataset (random tokens; blends are not read)",
    "data.train / data.valid are not given with data.mock",
)
def _mock(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock:
        for key in ("train", "valid"):
            if getattr(d, key):
                yield Finding(f"data.{key}", "has no effect: data.mock = true reads no files",
                              f"remove data.{key}, or set data.mock = false",
                              value=[e.prefix for e in getattr(d, key)])


_SPLIT = re.compile(r"\s*\d+(\.\d*)?\s*(,\s*\d+(\.\d*)?\s*){0,2}")


@_rule(
    "split-format",
    "error",
    "megatron.core.datasets.blended_megatron_dataset_config.parse_and_normalize_split (at most 3 "
    "non-negative weights; dlmspec also requires them comma-separated)",
    "data.split is up to three non-negative weights with a positive train share",
)
def _split(ctx: Context) -> Iterator[Finding]:
    d = ctx.spec.data
    if d.mock or d.valid or not d.train:
        return
    if not _SPLIT.fullmatch(d.split):
        yield Finding("data.split", "not a train,valid,test list of weights", 'use e.g. "99,1,0"')
    elif float(d.split.split(",")[0]) <= 0:
        yield Finding("data.split", "gives no share of data.train to training", 'use e.g. "99,1,0"')


_TOKENIZER_NEEDS: dict[str, tuple[str, ...]] = {
    "HuggingFaceTokenizer": ("model",),
    "SentencePieceTokenizer": ("model",),
    "TikTokenizer": ("model",),
    "GPT2BPETokenizer": ("vocab_file", "merge_file"),
    "NullTokenizer": ("vocab_size",),
}


@_rule(
    "tokenizer-files",
    "error",
    "Megatron-LM build_tokenizer (each tokenizer type reads its own files)",
    "the tokenizer type's files (or vocab_size) are set",
)
def _tokenizer_files(ctx: Context) -> Iterator[Finding]:
    tok = ctx.spec.data.tokenizer
    for key in _TOKENIZER_NEEDS[tok.type]:
        if getattr(tok, key) is None:
            hint = {
                "model": "set data.tokenizer.model to a tokenizer.json, a folder or a .model file",
                "vocab_file": "set data.tokenizer.vocab_file (GPT-2 vocab.json)",
                "merge_file": "set data.tokenizer.merge_file (GPT-2 merges.txt)",
                "vocab_size": f"set data.tokenizer.vocab_size, e.g. {ctx.spec.model.vocab_size - 1}",
            }[key]
            yield Finding(f"data.tokenizer.{key}", f"{tok.type} needs {key}", hint)


@_rule(
    "tokenizer-vocab",
    "error",
    "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer (vocab_size + 1 ids, eod last); "
    "GPT-2 BPE has 50257 ids",
    "every tokenizer id is a row of model.vocab_size",
)
def _tokenizer_vocab(ctx: Context) -> Iterator[Finding]:
    tok, vocab = ctx.spec.data.tokenizer, ctx.spec.model.vocab_size
    if tok.type == "NullTokenizer" and tok.vocab_size is not None and tok.vocab_size + 1 > vocab:
        yield Finding(
            "model.vocab_size",
            f"NullTokenizer(vocab_size = {tok.vocab_size}) emits ids up to {tok.vocab_size} (its eod), "
            "beyond the embedding",
            f"use model.vocab_size >= {tok.vocab_size + 1}, or data.tokenizer.vocab_size <= {vocab - 1}",
        )
    elif tok.type == "GPT2BPETokenizer" and vocab < GPT2_VOCAB_SIZE:
        yield Finding("model.vocab_size", f"GPT-2's BPE emits {GPT2_VOCAB_SIZE} ids, more than the embedding has",
                      f"use model.vocab_size = {GPT2_VOCAB_SIZE}")


#: A Hugging Face hub id (``org/name``): a tokenizer that loads from the hub, not a local path.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*")


def _exists(path: str) -> bool:
    try:
        return os.path.exists(path)
    except (OSError, ValueError):  # NUL bytes, names too long
        return False


_ELSEWHERE = ("fine if it exists where the job runs (relative paths are read from the directory the job "
              "is launched in); else fix the path")


@_rule(
    "path-not-found",
    "warning",
    "the launched job opens these: megatron-core IndexedDataset (PREFIX.bin, PREFIX.idx), Megatron-LM "
    "build_tokenizer (tokenizer files), checkpoint loading (checkpoint.load, checkpoint.init_from)",
    "data prefixes, tokenizer files and checkpoints to load exist on this machine",
    filesystem=True,
)
def _paths(ctx: Context) -> Iterator[Finding]:
    d, tok, ck = ctx.spec.data, ctx.spec.data.tokenizer, ctx.spec.checkpoint
    if not d.mock:
        for key in ("train", "valid"):
            missing = [e.prefix for e in getattr(d, key) if not (_exists(e.prefix + ".bin") and _exists(e.prefix + ".idx"))]
            if missing:
                yield Finding(
                    f"data.{key}",
                    f"not on this machine: {_join([repr(m) for m in missing], 3)} (PREFIX.bin / PREFIX.idx)",
                    f"{_ELSEWHERE}; `dlmspec data prepare` writes them",
                    value=missing,
                )
    for key in ("vocab_file", "merge_file"):
        value = getattr(tok, key)
        if value is not None and not _exists(value):
            yield Finding(f"data.tokenizer.{key}", "not on this machine", _ELSEWHERE)
    hub = tok.type == "HuggingFaceTokenizer" and tok.model is not None and _HUB_ID.fullmatch(tok.model)
    if tok.model is not None and tok.type != "NullTokenizer" and not hub and not _exists(tok.model):
        yield Finding("data.tokenizer.model", "not on this machine", _ELSEWHERE)
    if ck.init_from is not None:
        kind, _, target = ck.init_from.partition(":")
        if kind in ("hf", "mcore") and target and not _exists(target):
            what = "a local Hugging Face model folder" if kind == "hf" else "a megatron-core checkpoint directory"
            yield Finding("checkpoint.init_from", f"not on this machine ({what} is read)", _ELSEWHERE)
    if ck.load is not None and ck.load != ck.save and not _exists(ck.load):
        yield Finding("checkpoint.load", "not on this machine", _ELSEWHERE)


# --------------------------------------------------------------------------------------------
# Stage, checkpoint, logging, data parallelism
# --------------------------------------------------------------------------------------------


@_rule(
    "stage-table-ignored",
    "warning",
    "dlmspec.spec.models.StageSpec (stage.sft / stage.rl are read only by their stage kind)",
    "stage.sft / stage.rl match stage.kind",
)
def _stage_table(ctx: Context) -> Iterator[Finding]:
    st = ctx.spec.stage
    for kind in ("sft", "rl"):
        if getattr(st, kind) is not None and st.kind != kind:
            yield Finding(f"stage.{kind}", f"has no effect: stage.kind = '{st.kind}'",
                          f"set stage.kind = '{kind}', or remove [stage.{kind}]", value=None)


@_rule(
    "rl-objective",
    "error",
    "d1 (Zhao et al. 2025): diffu-GRPO is GRPO for masked diffusion models; GRPO (Shao et al. "
    "2024) needs autoregressive token log-probabilities",
    "the RL algorithm matches the objective",
)
def _rl_objective(ctx: Context) -> Iterator[Finding]:
    st, kind = ctx.spec.stage, ctx.spec.objective.kind
    if st.kind != "rl":
        return
    algorithm = st.rl.algorithm if st.rl is not None else "diffu-grpo"
    want = "mdm" if algorithm == "diffu-grpo" else "ar"
    if kind != want:
        yield Finding(
            "stage.rl.algorithm",
            f"{algorithm} is for {want} models, and objective.kind = '{kind}'",
            f"use algorithm = '{'grpo' if kind == 'ar' else 'diffu-grpo'}'",
            value=algorithm,
        )


@_rule(
    "finetune-from-scratch",
    "warning",
    "SFT and RL start from trained weights (LLaDA, Nie et al. 2025, sec. 2.3)",
    "sft/rl stages load weights (checkpoint.init_from or checkpoint.load)",
)
def _from_scratch(ctx: Context) -> Iterator[Finding]:
    ck = ctx.spec.checkpoint
    if ctx.spec.stage.kind in ("sft", "rl") and ck.init_from is None and ck.load is None:
        yield Finding("checkpoint.init_from", f"a {ctx.spec.stage.kind} stage would start from random weights",
                      "set checkpoint.init_from = 'hf:PATH' or 'mcore:PATH'")


@_rule(
    "init-from-format",
    "error",
    "dlmspec.spec.models.CheckpointSpec.init_from ('hf:PATH' or 'mcore:PATH')",
    "checkpoint.init_from is 'hf:PATH' or 'mcore:PATH'",
)
def _init_from(ctx: Context) -> Iterator[Finding]:
    init = ctx.spec.checkpoint.init_from
    if init is not None and not re.fullmatch(r"(hf|mcore):\S.*", init):
        yield Finding("checkpoint.init_from", "does not say which format to read",
                      f"use 'hf:{init.split(':', 1)[-1] or 'PATH'}' (Hugging Face) or 'mcore:PATH' (megatron-core checkpoint)")


@_rule(
    "wandb-name-without-project",
    "warning",
    "Megatron-LM training (wandb is enabled by --wandb-project)",
    "logging.wandb_exp_name comes with logging.wandb_project",
)
def _wandb(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    if lg.wandb_exp_name is not None and lg.wandb_project is None:
        yield Finding("logging.wandb_exp_name", "has no effect: wandb logs only when wandb_project is set",
                      "set logging.wandb_project")


@_rule(
    "profile-window",
    "error",
    "megatron-lm training.py (--profile-step-start .. --profile-step-end, --profile-ranks)",
    "the profiled steps lie inside the run, end after start, on ranks that exist",
)
def _profile(ctx: Context) -> Iterator[Finding]:
    lg = ctx.spec.logging
    if not lg.profile:
        return
    if lg.profile_step_end <= lg.profile_step_start:
        yield Finding("logging.profile_step_end", f"must exceed profile_step_start = {lg.profile_step_start}",
                      f"use profile_step_end = {lg.profile_step_start + 2}", value=lg.profile_step_end)
    elif lg.profile_step_end > ctx.r.train_iters:
        yield Finding("logging.profile_step_end", f"lies after the last step ({ctx.r.train_iters})",
                      f"use profile_step_end <= {ctx.r.train_iters}", value=lg.profile_step_end)
    bad = [rank for rank in lg.profile_ranks if rank >= ctx.r.world_size]
    if bad:
        yield Finding("logging.profile_ranks", f"ranks {bad} do not exist (world size {ctx.r.world_size})",
                      "use ranks below the world size, e.g. [0]", value=lg.profile_ranks)


@_rule(
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
                      "set use_distributed_optimizer = true, or overlap_param_gather = false")


@_rule(
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
                      "set parallel.fsdp = 'megatron', or remove data_parallel_sharding_strategy")


@_rule(
    "checkpoint-inherited",
    "warning",
    "dlmspec.spec.load (extends deep-merges the parent; a relaunch resumes from checkpoint.save's latest)",
    "a spec that renames its run does not reuse the checkpoint folder of the spec it extends",
)
def _checkpoint_inherited(ctx: Context) -> Iterator[Finding]:
    loaded = ctx.loaded
    if loaded is None or ctx.spec.checkpoint.save is None:
        return
    top = str(loaded.path)
    save_file = loaded.origins.get("checkpoint.save", (top, None))[0]
    name_file = loaded.origins.get("name", (None, None))[0]
    if save_file not in (top, "--set") and name_file in (top, "--set"):
        yield Finding("checkpoint.save",
                      f"is inherited from {Path(save_file).name}, whose run writes and resumes the same "
                      f"folder: this run ('{ctx.spec.name}') would resume the other's checkpoints",
                      f"set checkpoint.save = \"runs/{ctx.spec.name}/checkpoints\" in this spec")


@_rule(
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
                      "or 'optim_grads' / 'optim'")


@_rule(
    "secret-in-spec",
    "error",
    "dlmspec.credentials (every spec string reaches a generated file: train.py, launch.sh, launch.sbatch, "
    "spec.lock.toml, plan.json)",
    "no string of the spec holds a token, a key or a credential inside a URL",
)
def _secret_in_spec(ctx: Context) -> Iterator[Finding]:
    for key, what in spec_secrets(ctx.spec):
        table, _, name = key.rpartition(".")
        if table in ENV_TABLES and is_secret_name(name):
            continue  # a secret name: the slurm-secret rule (dlmspec.render.sbatch.sbatch_issues) reports it
        yield Finding(key, f"holds {what}; {NEVER_WRITTEN}", ENVIRONMENT_FIX, value=HIDDEN)


#: Tables whose strings :func:`_string_characters` leaves to others: ``[cluster.slurm]`` strings
#: are checked by :func:`dlmspec.render.sbatch.sbatch_issues` (stricter: no control character reaches an
#: ``#SBATCH`` line), and a spec's ``[lock]`` table is dropped by compile (it writes its own).
_STRINGS_CHECKED_ELSEWHERE = ("cluster.slurm", "lock")


@_rule(
    "string-characters",
    "error",
    "POSIX (paths, names and environment variables end at NUL); generated files are UTF-8 "
    "(dlmspec.render.escape writes every other character)",
    "no spec string holds NUL or a lone surrogate",
)
def _string_characters(ctx: Context) -> Iterator[Finding]:
    for key, text in walk_strings(ctx.spec):
        if any(key == t or key.startswith(t + ".") for t in _STRINGS_CHECKED_ELSEWHERE):
            continue
        if "\x00" in text:
            yield Finding(key, "holds a NUL character, which no path, name or environment variable can carry",
                          "remove the NUL character (written \\u0000 in TOML)", value=text)
        elif any("\ud800" <= ch <= "\udfff" for ch in text):
            yield Finding(key, "holds a lone surrogate (half of a UTF-16 pair), which is not a character and "
                          "cannot be written into the UTF-8 files compile generates",
                          "write the character itself", value=text)


# --------------------------------------------------------------------------------------------
# Magnitudes, ids and empty values (issue 15: specs that validated, then failed at run time)
# --------------------------------------------------------------------------------------------

#: numpy.random.seed and numpy.random.RandomState take seeds in [0, 2**32).
_SEED_LIMIT = 2**32

#: What dlmspec.backends.megatron.training (as Megatron-LM's _set_random_seed) adds to the seed per
#: pipeline stage.
_SEED_PER_STAGE = 100


@_rule(
    "seed-range",
    "error",
    "dlmspec.backends.megatron.training (numpy.random.seed(seed + 100 * pipeline rank), as Megatron-LM "
    "_set_random_seed) and megatron-core GPTDataset (numpy.random.RandomState(random_seed)): seeds in [0, 2**32)",
    "train.seed + 100 * (pipeline stages - 1) lies in [0, 2**32)",
)
def _seed_range(ctx: Context) -> Iterator[Finding]:
    seed, pp = ctx.spec.train.seed, ctx.r.pp
    top = _SEED_LIMIT - _SEED_PER_STAGE * (pp - 1)
    if 0 <= seed < top:
        return
    stages = (f"; pipeline stage {pp - 1} seeds numpy with seed + {_SEED_PER_STAGE * (pp - 1)}" if pp > 1 else "")
    yield Finding("train.seed", f"numpy and megatron-core's data shuffling take seeds in [0, 2**32){stages}, "
                  "so the run stops at start-up", f"use a seed in [0, {top:,}), e.g. seed = 1234")


@_rule(
    "eod-id-range",
    "error",
    "dlmspec.backends.megatron.data.DatasetTokenizer (eod_id in [0, model.vocab_size), checked when train.py starts): "
    "the data holds the end-of-document id as a token of the vocabulary",
    "data.tokenizer.eod_id is a token of the vocabulary (below model.vocab_size)",
)
def _eod_range(ctx: Context) -> Iterator[Finding]:
    tok, vocab = ctx.spec.data.tokenizer, ctx.spec.model.vocab_size
    if tok.eod_id is None or tok.eod_id < vocab:
        return
    if tok.type == "NullTokenizer" and tok.vocab_size is not None and tok.vocab_size < vocab:
        example = tok.vocab_size
    elif tok.type == "GPT2BPETokenizer" and vocab >= GPT2_VOCAB_SIZE:
        example = GPT2_VOCAB_SIZE - 1
    else:
        example = vocab - 1
    if example == ctx.r.mask_token_id:
        example -= 1
    yield Finding(
        "data.tokenizer.eod_id",
        f"outside the vocabulary: model.vocab_size = {vocab} has ids 0..{vocab - 1}, so no document of this "
        "vocabulary can end with it, and train.py stops at start-up",
        f"use the id `dlmspec data prepare --append-eod` wrote (the tokenizer's end-of-document token), "
        f"e.g. eod_id = {example}, or raise model.vocab_size",
    )


#: rotary_percent values a hint suggests, the closest to the spec's first.
_ROTARY_PERCENTS = (0.25, 0.5, 1.0)


def _rotary_dims_of(kv_channels: int, percent: float) -> int:
    """Rotary dimensions of a head: megatron-core RotaryEmbedding's ``int(kv_channels *
    rotary_percent)`` (all of them at 1.0)."""
    return int(kv_channels * percent) if percent < 1.0 else kv_channels


@_rule(
    "rotary-dims",
    "error",
    "megatron.core.models.common.embeddings.rotary_pos_embedding.RotaryEmbedding (dim = "
    "int(kv_channels * rotary_percent), one frequency per pair of dimensions)",
    "with rope, int(kv_channels * rotary_percent) is even and positive",
)
def _rotary_dims(ctx: Context) -> Iterator[Finding]:
    m = ctx.spec.model
    if m.position_embedding_type != "rope":
        return
    kv, percent = ctx.r.kv_channels, m.rotary_percent
    dims = _rotary_dims_of(kv, percent)
    if dims > 0 and dims % 2 == 0:
        return
    if dims == 0:
        what = "0 rotary dimensions: RoPE would rotate nothing, so the model gets no position information"
    else:
        what = (f"{dims} rotary dimensions, an odd number: RoPE rotates pairs of dimensions, so megatron-core "
                f"builds {dims + 1} angles for {dims} dimensions and the first forward step fails on the shapes")
    if kv % 2:
        even = kv + 1
        also = "" if _rotary_dims_of(even, percent) % 2 == 0 and _rotary_dims_of(even, percent) > 0 \
            else " and rotary_percent = 1.0"
        yield Finding("model.kv_channels", f"head dimension {kv} with rotary_percent = {percent:g} gives {what}",
                      f"use an even head dimension: kv_channels = {even}{also}", value=kv)
        return
    fit = next(p for p in sorted(_ROTARY_PERCENTS, key=lambda p: (abs(p - percent), p))
               if _rotary_dims_of(kv, p) > 0 and _rotary_dims_of(kv, p) % 2 == 0)
    yield Finding("model.rotary_percent", f"{percent:g} of head dimension {kv} gives {what}",
                  f"use rotary_percent = {fit} ({_rotary_dims_of(kv, fit)} of {kv} dimensions rotate)")


@dataclass(frozen=True)
class _TokenizerIds:
    """What a tokenizer's files say about its ids: ``size`` (one more than its largest id),
    ``special`` ids -> token, ``added`` non-special added ids -> token, ``token(id)`` the text of
    an ordinary id (None when unknown) and the file read."""

    file: str
    size: int
    special: dict[int, str]
    added: dict[int, str]
    token: Callable[[int], str | None]


def _tokenizer_ids(ctx: Context) -> _TokenizerIds | None:
    """The ids of the spec's tokenizer, when this machine can tell: a local Hugging Face
    ``tokenizer.json`` (``data.tokenizer.model``, a folder or the file: ``added_tokens`` with
    their ``special`` flag, ``model.vocab`` a dict or Unigram's list), or GPT-2 BPE's
    ``vocab.json`` (``<|endoftext|>`` its one special token; GPT-2's own layout when the file
    cannot be read). None otherwise (hub ids, SentencePiece, TikToken, NullTokenizer)."""
    from dlmspec.tokenizers import GPT2_EOD_TOKEN, read_json  # only here: validate stays light

    tok = ctx.spec.data.tokenizer
    if tok.type == "GPT2BPETokenizer":
        vocab = read_json(tok.vocab_file) if tok.vocab_file else None
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()) or not vocab:
            names = {GPT2_VOCAB_SIZE - 1: GPT2_EOD_TOKEN}
            return _TokenizerIds("GPT-2 BPE", GPT2_VOCAB_SIZE, names, {}, lambda i: None)
        by_id = {v: k for k, v in vocab.items()}
        special = {v: k for k, v in vocab.items() if k == GPT2_EOD_TOKEN}
        return _TokenizerIds(str(tok.vocab_file), max(by_id) + 1, special, {}, by_id.get)
    if tok.type != "HuggingFaceTokenizer" or not tok.model:
        return None
    try:
        path = os.path.join(tok.model, "tokenizer.json") if os.path.isdir(tok.model) else tok.model
    except (OSError, ValueError):
        return None
    if not path.endswith(".json"):
        return None
    data = read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    special: dict[int, str] = {}
    added: dict[int, str] = {}
    for entry in data.get("added_tokens") or [] if isinstance(data, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            (special if entry.get("special") else added)[entry["id"]] = entry["content"]
    if isinstance(vocab, dict):
        ids = [v for v in vocab.values() if isinstance(v, int)]

        def token(i: int) -> str | None:
            return next((k for k, v in vocab.items() if v == i), None)
    elif isinstance(vocab, list):  # Unigram: [token, score] per id
        ids = [len(vocab) - 1] if vocab else []

        def token(i: int) -> str | None:
            entry = vocab[i] if 0 <= i < len(vocab) else None
            return entry[0] if isinstance(entry, list) and entry and isinstance(entry[0], str) else None
    else:
        return None
    size = max([*ids, *special, *added], default=-1) + 1
    return _TokenizerIds(path, size, special, added, token)


@_rule(
    "mask-token-ordinary",
    "warning",
    "LLaDA (Nie et al. 2025, sec. 2.1) and MDLM: [MASK] is a reserved token (LLaDA's <|mdm_mask|> is a special "
    "token of its tokenizer); an id that text tokenizes to makes that text read as masked positions",
    "the [MASK] id is a special or reserved id of the tokenizer (its files read: tokenizer.json, GPT-2 vocab.json)",
    filesystem=True,
)
def _mask_ordinary(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    mask = r.mask_token_id
    eod = _tokenizer_eod(ctx)
    if mask is None or mask >= r.padded_vocab_size or mask == eod:
        return  # mask-token-range, mask-token-distinct
    if mask >= m.vocab_size:
        return  # a padded row: no tokenizer that fits the model emits it (tokenizer-vocab)
    ids = _tokenizer_ids(ctx)
    if ids is None or mask >= ids.size or mask in ids.special:
        return
    if mask in ids.added:
        what = f"{ids.added[mask]!r}, an added token that is not special"
    else:
        text = ids.token(mask)
        what = (f"{text!r}, an ordinary token" if text is not None else "an ordinary token")
    pad = _tokenizer_pad(ctx)
    taken = {eod, pad[1] if pad else None}
    named = [i for i, t in sorted(ids.special.items()) if "mask" in t.lower() and i < r.padded_vocab_size
             and i not in taken]
    free = [i for i in range(ids.size, min(r.padded_vocab_size, ids.size + 3)) if i not in taken]
    if named:
        fix = f"objective.mask_token_id = {named[0]} (the tokenizer's {ids.special[named[0]]!r})"
    elif free:
        fix = f"objective.mask_token_id = {free[0]} (a row of the embedding beyond the tokenizer's ids)"
    else:
        grown = max(m.vocab_size, ids.size)
        fix = f"model.vocab_size = {grown + 1} and objective.mask_token_id = {grown} (a new row for [MASK])"
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is {what} of the tokenizer ({ids.file}): text containing it would read as masked "
        "positions (published diffusion LMs use a special or reserved id)",
        f"use a special or reserved id: {fix}",
        value=mask,
    )


#: megatron-core's data pipeline counts the run's samples and tokens in numpy int64.
_INT64_MAX = 2**63 - 1

#: Tokens of the largest published pretraining runs (Qwen3: 36T), order of magnitude.
_LARGEST_RUN_TOKENS = 4e13

#: More tokens than this draws a warning: 25 times the largest published runs.
_IMPLAUSIBLE_TOKENS = 1e15

#: A large pretraining run, for the hint of the warning (1e12 tokens).
_LARGE_RUN_TOKENS = 10**12


def _length_key(ctx: Context) -> str:
    tr = ctx.spec.train
    return "train.train_tokens" if tr.train_tokens is not None and tr.train_iters is None else "train.train_iters"


@_rule(
    "train-length-overflow",
    "error",
    "megatron-core BlendedMegatronDatasetBuilder / GPTDataset (the run's samples, train_iters * global_batch_size, "
    "and their tokens as numpy int64 sample indexes)",
    "the run's tokens, train_iters * global_batch_size * seq_length, fit in int64",
)
def _length_overflow(ctx: Context) -> Iterator[Finding]:
    steps, per_step = ctx.r.train_iters, ctx.r.tokens_per_step
    total = steps * per_step
    if total <= _INT64_MAX:
        return
    why = (f"{steps:,} steps of {per_step:,} tokens are {total:.3g} tokens, beyond int64 ({_INT64_MAX:.3g}), in which "
           "megatron-core's datasets count and index the run's samples: the index would overflow")
    most = _INT64_MAX // per_step
    if most == 0:
        yield Finding("train.global_batch_size", why, "use a global_batch_size * seq_length below 2**63")
    elif _length_key(ctx) == "train.train_tokens":
        yield Finding("train.train_tokens", why, f"use train_tokens <= {most * per_step:,}")
    else:
        yield Finding("train.train_iters", why, f"use train_iters <= {most:,}")


@_rule(
    "train-length-implausible",
    "warning",
    f"published pretraining runs reach about {_LARGEST_RUN_TOKENS:.0e} tokens (Qwen3: 36T)",
    f"the run trains on at most {_IMPLAUSIBLE_TOKENS:.0e} tokens",
)
def _length_implausible(ctx: Context) -> Iterator[Finding]:
    steps, per_step = ctx.r.train_iters, ctx.r.tokens_per_step
    total = steps * per_step
    if not _IMPLAUSIBLE_TOKENS < total <= _INT64_MAX:
        return
    key = _length_key(ctx)
    fix = (f"train_tokens = {_LARGE_RUN_TOKENS}" if key == "train.train_tokens"
           else f"train_iters = {-(-_LARGE_RUN_TOKENS // per_step):,}")
    yield Finding(key, f"{total:.3g} tokens ({steps:,} steps of {per_step:,}) is {total / _LARGEST_RUN_TOKENS:,.0f} "
                  f"times the largest published pretraining runs ({_LARGEST_RUN_TOKENS:.0e} tokens)",
                  f"check the length; a large run of 1e12 tokens is {fix}")


#: Float keys the GPU computes with in float32 (the optimizer's lr, decay and eps, the init std,
#: norms and RoPE): table of :data:`dlmspec.spec.fast.SCHEMA` for each.
_FP32_KEYS: dict[str, str] = {
    "train.lr": "TrainSpec", "train.min_lr": "TrainSpec", "train.weight_decay": "TrainSpec",
    "train.adam_eps": "TrainSpec", "train.clip_grad": "TrainSpec", "model.init_method_std": "ModelSpec",
    "model.layernorm_epsilon": "ModelSpec", "model.rotary_base": "ModelSpec",
    "model.moe_aux_loss_coeff": "ModelSpec",
}

#: Largest finite float32.
_FLOAT32_MAX = 3.4028234663852886e38


@_rule(
    "float32-range",
    "error",
    "megatron-core's optimizers (TE/apex FusedAdam take lr, weight decay and eps as float32) and fp32 model "
    "math (init std, norm epsilon, RoPE's base): beyond 3.4e38 a float32 is inf",
    "float settings the GPU computes with fit in float32",
)
def _float32_range(ctx: Context) -> Iterator[Finding]:
    from dlmspec.spec.fast import SCHEMA  # the defaults, without pydantic

    for key, table in _FP32_KEYS.items():
        value = ctx.value(key)
        if isinstance(value, float) and abs(value) > _FLOAT32_MAX:
            leaf = key.split(".")[1]
            default = SCHEMA[table]["fields"][leaf][2]
            yield Finding(key, f"{value:g} is beyond float32 (at most {_FLOAT32_MAX:.3g}), in which the GPU computes "
                          "it: it becomes inf and training produces NaN", f"use {leaf} = {default!r} (the default)")


@_rule(
    "lr-implausible",
    "warning",
    "published LLM training uses learning rates of 1e-5 to 1e-2 (Adam moves each weight by about lr per step)",
    "train.lr is at most 1",
)
def _lr_implausible(ctx: Context) -> Iterator[Finding]:
    from dlmspec.spec.fast import SCHEMA  # the defaults, without pydantic

    tr, defaults = ctx.spec.train, SCHEMA["TrainSpec"]["fields"]
    if not 1.0 < tr.lr <= _FLOAT32_MAX:
        return
    lr, min_lr = defaults["lr"][2], defaults["min_lr"][2]
    also = f" and min_lr = {min_lr!r}" if tr.min_lr > lr else ""
    yield Finding("train.lr", f"a learning rate of {tr.lr:g}: with Adam every step moves each weight by about lr, so "
                  "the loss diverges within the first steps (LLM training uses 1e-5 to 1e-2)",
                  f"use lr = {lr!r}{also} (the defaults)" if also else f"use lr = {lr!r} (the default)")


#: DataLoader workers per GPU rank above which a node cannot start them (processes and memory).
_MAX_WORKERS = 1024

#: More workers per GPU rank than a node has CPU cores per GPU (a DGX H100 has 14).
_MANY_WORKERS = 64


@_rule(
    "num-workers-range",
    "error",
    "torch.utils.data.DataLoader (num_workers processes per GPU rank, each with torch and the dataset index: "
    "about 0.1-0.5 GiB of host memory)",
    f"data.num_workers is at most {_MAX_WORKERS}",
)
def _workers_range(ctx: Context) -> Iterator[Finding]:
    n, per_node = ctx.spec.data.num_workers, ctx.spec.cluster.gpus_per_node
    if n > _MAX_WORKERS:
        yield Finding("data.num_workers", f"{n:,} DataLoader processes per GPU rank ({n * per_node:,} per node) "
                      "cannot start: each holds torch and the dataset index, far beyond a node's memory and "
                      "process limits", "use num_workers = 2 (the default; a few per rank keep up with training)")


@_rule(
    "num-workers-implausible",
    "warning",
    "torch.utils.data.DataLoader (num_workers processes per GPU rank); GPU nodes have 8-16 CPU cores per GPU "
    "(a DGX H100: 14)",
    f"data.num_workers is at most {_MANY_WORKERS}",
)
def _workers_implausible(ctx: Context) -> Iterator[Finding]:
    n, per_node = ctx.spec.data.num_workers, ctx.spec.cluster.gpus_per_node
    if _MANY_WORKERS < n <= _MAX_WORKERS:
        yield Finding("data.num_workers", f"{n} DataLoader processes per GPU rank ({n * per_node:,} per node) are "
                      "more than a node has CPU cores per GPU: the extra workers only take memory",
                      "use num_workers = 2 (the default; a few per rank keep up with training)")


#: torch.distributed holds ranks and the world size as C int (int32).
_MAX_WORLD = 2**31 - 1


@_rule(
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
                      "use the nodes the job runs on, e.g. nodes = 1")


#: Spec strings that name a run, a file, a directory or a key: None (unset) is fine, blank never
#: is. -> (what a blank one breaks, the fix).
_NAMED_STRINGS: dict[str, tuple[str, str]] = {
    "name": ("the run's folders (runs/<name>) and job name", 'give the run a name, e.g. name = "my-run"'),
    "checkpoint.save": ("the checkpoint directory", "remove checkpoint.save (unset: no checkpoints), or give a directory"),
    "checkpoint.load": ("the directory to load from", "remove checkpoint.load (unset: it loads from checkpoint.save)"),
    "logging.run_dir": ("the run directory", "remove logging.run_dir (unset: runs/<name>)"),
    "logging.tensorboard_dir": ("the TensorBoard directory", "remove logging.tensorboard_dir (unset: no TensorBoard)"),
    "logging.wandb_project": ("the wandb project", "remove logging.wandb_project (unset: no wandb)"),
    "logging.wandb_exp_name": ("the wandb run name", "remove logging.wandb_exp_name (unset: the run's name)"),
    "stage.sft.prompt_key": ("the JSON key of prompts", 'use prompt_key = "prompt"'),
    "stage.sft.response_key": ("the JSON key of responses", 'use response_key = "response"'),
    "stage.rl.reward": ("the reward function", 'use reward = "exact_match"'),
}

#: What each tokenizer file key is, for the blank-value hint.
_TOKENIZER_FILE_HINTS = {
    "model": "set data.tokenizer.model to a tokenizer.json, a folder or a .model file",
    "vocab_file": "set data.tokenizer.vocab_file (GPT-2 vocab.json)",
    "merge_file": "set data.tokenizer.merge_file (GPT-2 merges.txt)",
}


def _blank(value: Any) -> bool:
    return isinstance(value, str) and not value.strip()


@_rule(
    "blank-value",
    "error",
    "the runtime opens these paths and names these folders (megatron-core IndexedDataset, Megatron-LM "
    "build_tokenizer, checkpointing, logging): an empty or blank string names nothing (or the current directory)",
    "names and paths are not empty or blank",
)
def _blank_value(ctx: Context) -> Iterator[Finding]:
    for key, (what, fix) in _NAMED_STRINGS.items():
        if _blank(ctx.value(key)):
            yield Finding(key, f"is empty or blank, but names {what}", fix)
    d = ctx.spec.data
    for key in ("train", "valid"):
        blank = [e.prefix for e in getattr(d, key) if _blank(e.prefix)]
        if blank:
            yield Finding(f"data.{key}", f"{len(blank)} entr{'y' if len(blank) == 1 else 'ies'} with an empty or blank "
                          "prefix, which names no dataset", "give each entry an indexed-dataset PREFIX (PREFIX.bin and "
                          "PREFIX.idx, written by `dlmspec data prepare`), or remove it", value=blank)
    tok = d.tokenizer
    for key, hint in _TOKENIZER_FILE_HINTS.items():
        if _blank(getattr(tok, key)):
            needed = key in _TOKENIZER_NEEDS[tok.type]
            yield Finding(f"data.tokenizer.{key}", "is empty or blank, which names no file",
                          hint if needed else f"remove data.tokenizer.{key} ({tok.type} does not read it)")


# --------------------------------------------------------------------------------------------
# Running the rules
# --------------------------------------------------------------------------------------------


def _sort_key(issue: SpecIssue) -> tuple:
    return (
        0 if issue.severity == "error" else 1,
        issue.file or "",
        issue.line if issue.line is not None else 1 << 30,
        issue.key,
        issue.rule,
        issue.message,
    )


def find_issues(
    target: LoadedSpec | Spec, resolved: Resolved | None = None, *, paths: bool = False
) -> list[SpecIssue]:
    """Run every rule of :data:`RULES` and return what they find; never raises for a bad spec.

    Args:
        target: a :class:`~dlmspec.spec.load.LoadedSpec` (issues then carry file and line) or a
            bare :class:`~dlmspec.spec.models.Spec` (file and line are ``None``).
        resolved: ``resolve(spec)``, if the caller already has it.
        paths: also run the rules that look at this machine's files (``path-not-found``);
            off by default so the verdict depends on the spec alone.

    Returns:
        Issues sorted errors first, then by file, line and key (deterministic).
    """
    loaded = target if isinstance(target, LoadedSpec) else None
    spec = target.spec if isinstance(target, LoadedSpec) else target
    ctx = Context(spec=spec, r=resolved if resolved is not None else resolve(spec), loaded=loaded)
    found: list[SpecIssue] = []
    for rule in RULES.values():
        if rule.filesystem and not paths:
            continue
        for f in rule.func(ctx):
            file, line = ctx.origin(f.key)
            found.append(
                SpecIssue(
                    key=f.key,
                    message=f.message,
                    value=ctx.value(f.key) if f.value is _UNSET else f.value,
                    hint=f.hint,
                    severity=rule.severity,
                    rule=rule.id,
                    source=rule.source,
                    file=file,
                    line=line,
                )
            )
    return sorted(found, key=_sort_key)


def validate_spec(loaded: LoadedSpec | Spec, resolved: Resolved | None = None, *, paths: bool = True) -> list[SpecIssue]:
    """Every issue between a spec and a running job; never raises for a bad spec. ``dlmspec
    validate`` reports these and ``dlmspec compile``, ``submit`` and ``new`` refuse on the same
    errors: every command calls this one function, so they cannot disagree.

    That is :func:`find_issues` (with the ``path-not-found`` warnings when ``paths``), the
    SLURM settings the batch script needs (:func:`dlmspec.render.sbatch.sbatch_issues`), what the
    bundled runtime (``backends/megatron``) cannot run and an end-of-document id it cannot tell
    (:func:`dlmspec.unsupported.unsupported_issues`) and, when none of the first two found an
    error and the GPU is in the catalog, the planned memory per GPU
    (:func:`dlmspec.plan.check_memory`: a ``memory-fits`` error when the peak exceeds the GPU,
    a warning with ``cluster.allow_memory_overflow = true``; a ``memory-headroom`` warning close
    to it; a ``plan`` error for a spec the planner cannot model). A spec with rule errors is
    not planned: its layout may not exist.

    Returns:
        Issues sorted as by :func:`find_issues` (errors first, then file, line and key).
    """
    from dlmspec.plan import PlanError, check_memory
    from dlmspec.render.sbatch import sbatch_issues
    from dlmspec.unsupported import unsupported_issues

    spec = loaded.spec if isinstance(loaded, LoadedSpec) else loaded
    resolved = resolved if resolved is not None else resolve(spec)
    located = loaded if isinstance(loaded, LoadedSpec) else None
    issues = find_issues(loaded, resolved, paths=paths) + sbatch_issues(resolved, located)
    if resolved.gpu is not None and not any(i.severity == "error" for i in issues):
        try:
            issues += check_memory(resolved, located)
        except PlanError as exc:  # a spec the planner cannot model: what compile's plan.json would hit
            issues.append(SpecIssue("<plan>", f"cannot plan this spec: {exc}", rule="plan",
                                    source="dlmspec.plan.make_plan"))
    issues += unsupported_issues(resolved, located)
    return sorted(issues, key=_sort_key)


def with_rule_issues(error: SpecError, *, paths: bool = True) -> SpecError:
    """A loader's schema error plus what the cross-field rules find in the rest of the spec,
    so one run reports every problem.

    The rules run on ``error.partial`` (the spec without the rejected keys, which take their
    defaults); their findings about a rejected key, or a key under it, are left out, since
    they would describe the default, not what the user wrote. Returns ``error`` itself when
    there is no partial spec or it cannot be resolved.
    """
    if error.partial is None:
        return error
    try:
        extra = validate_spec(error.partial, paths=paths)
    except Exception:  # noqa: BLE001 - a partial spec that cannot be resolved adds nothing
        return error
    rejected = tuple(error.dropped)
    keep = [i for i in extra
            if not any(i.key == k or i.key.startswith(k + ".") or k.startswith(i.key + ".") for k in rejected)]
    return SpecError(sorted(error.issues + keep, key=_sort_key))


def check(target: LoadedSpec | Spec, resolved: Resolved | None = None, *, strict: bool = False) -> list[SpecIssue]:
    """Check the cross-field rules of a schema-valid spec.

    Args:
        target: see :func:`find_issues`.
        resolved: ``resolve(spec)``, if the caller already has it.
        strict: treat warnings as errors.

    Returns:
        The warnings (an empty list for a clean spec).

    Raises:
        SpecError: at least one error (or, with ``strict``, at least one warning) was found;
            ``issues`` holds every error and warning, sorted as by :func:`find_issues`.
    """
    issues = find_issues(target, resolved)
    if any(i.severity == "error" for i in issues) or (strict and issues):
        raise SpecError(issues)
    return issues


@dataclass
class Checked:
    """A spec that loaded, resolved and passed :func:`check`.

    Attributes:
        loaded: the loaded spec (with key origins).
        resolved: its derived values.
        warnings: what :func:`check` returned.
    """

    loaded: LoadedSpec
    resolved: Resolved
    warnings: list[SpecIssue]

    @property
    def spec(self) -> Spec:
        return self.loaded.spec


def load_checked(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *, strict: bool = False) -> Checked:
    """Load, resolve and check a spec file: what every command that reads a spec starts with.

    Raises:
        SpecError: the file cannot be loaded (see :func:`dlmspec.spec.load.load`) or breaks a rule
            (see :func:`check`).
    """
    try:
        loaded = load(path, overrides)
    except SpecError as exc:
        raise with_rule_issues(exc, paths=False) from None
    resolved = resolve(loaded.spec)
    warnings = check(loaded, resolved, strict=strict)
    return Checked(loaded=loaded, resolved=resolved, warnings=warnings)


def load_validated(path: str | Path, overrides: list[str] | tuple[str, ...] = (), *,
                   fast: bool = False) -> tuple[LoadedSpec, Resolved, list[SpecIssue]]:
    """Load a spec file with ``--set`` ``overrides``, resolve it and find every issue
    (:func:`validate_spec`, with path checks): how ``dlmspec validate`` and ``dlmspec compile``
    both start. ``fast``: load a plainly valid spec without pydantic
    (:func:`dlmspec.spec.load.load`'s ``fast``; the result is the same).

    Returns:
        (loaded, resolved, issues); the caller decides what stops it.

    Raises:
        SpecError: the file does not load (a schema error), with what the cross-field rules
            find in the rest of the spec (:func:`with_rule_issues`).
    """
    try:
        loaded = load(path, list(overrides), fast=fast)
    except SpecError as exc:
        raise with_rule_issues(exc) from None
    resolved = resolve(loaded.spec)
    return loaded, resolved, validate_spec(loaded, resolved, paths=True)
