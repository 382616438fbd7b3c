"""Rules of the parallelism along the sequence: sequence parallelism (activations split over
the TP group) and context parallelism (the sequence split over GPUs, with the masks and layer
paths it allows)."""

from __future__ import annotations

from typing import Iterator

from dlmspec import objectives
from dlmspec.attention import backends_running, refused_kinds
from dlmspec.check.hints import local_because, multiple_above, or_te
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.resolve import LOCAL_CP_COMM_TYPES


def _seq_fix(ctx: Context, step: int) -> Fix:
    """A sequence length that is a multiple of ``step`` (the next one below the spec's when it
    fits the position table, else the next above), with the position table raised if needed."""
    s, m = ctx.spec.train.seq_length, ctx.spec.model
    length = s // step * step or multiple_above(s, step)
    fix = {"train.seq_length": length}
    if length > m.max_position_embeddings:
        fix["model.max_position_embeddings"] = length
    return Fix(fix)


@rule(
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
            fix=Fix({"parallel.sequence_parallel": False}),
        )


@rule(
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
            fix=Fix({"parallel.sequence_parallel": True}),
        )


@rule(
    "sequence-parallel-seq-length",
    "error",
    "megatron.core.tensor_parallel.mappings._split_along_first_dim",
    "with sequence_parallel, seq_length / CP is a multiple of TP",
)
def _sp_seq(ctx: Context) -> Iterator[Finding]:
    r, s = ctx.r, ctx.spec.train.seq_length
    if ctx.spec.parallel.sequence_parallel and r.tp > 1 and s % r.cp == 0 and (s // r.cp) % r.tp:
        step = r.tp * r.cp * (2 if r.cp > 1 else 1)
        fix = _seq_fix(ctx, step)
        yield Finding(
            "train.seq_length",
            f"sequence parallelism splits each CP rank's {s // r.cp} tokens over TP = {r.tp}, which does not divide it",
            f"use a seq_length that is a multiple of {step}, e.g. {fix.text()}",
            fix=fix,
        )


@rule(
    "cp-seq-length",
    "error",
    "megatron.core.utils.get_batch_on_this_cp_rank (sequence split into 2 * CP chunks)",
    "with CP > 1, seq_length is a multiple of 2 * CP",
)
def _cp_seq(ctx: Context) -> Iterator[Finding]:
    r, s = ctx.r, ctx.spec.train.seq_length
    if r.cp > 1 and s % (2 * r.cp):
        step = 2 * r.cp
        if ctx.spec.parallel.sequence_parallel and r.tp > 1:
            step *= r.tp
        fix = _seq_fix(ctx, step)
        yield Finding(
            "train.seq_length",
            f"context parallelism splits the sequence into 2 * CP = {2 * r.cp} chunks, which does not divide it",
            f"use a seq_length that is a multiple of {step}, e.g. {fix.text()}",
            fix=fix,
        )


@rule(
    "cp-local-allgather",
    "error",
    "dlmspec.backends.megatron.attention.SDPACoreAttention (CP_COMM_TYPES: keys and values all-gathered over "
    "the CP group; megatron-core TransformerConfig.cp_comm_type)",
    "context parallelism on the local layers uses cp_comm_type 'allgather'",
)
def _cp_local(ctx: Context) -> Iterator[Finding]:
    if ctx.r.cp == 1 or ctx.r.transformer_impl != "local":
        return
    comm = ctx.spec.parallel.cp_comm_type
    if comm not in LOCAL_CP_COMM_TYPES:
        yield Finding(
            "parallel.cp_comm_type",
            f"the local layers' SDPA attention implements context parallelism by all-gathering keys "
            f"and values only; '{comm}' exists in Transformer Engine's attention{local_because(ctx)}",
            "set parallel.cp_comm_type = 'allgather'" + or_te(ctx),
            fix=Fix({"parallel.cp_comm_type": "allgather"}),
        )


@rule(
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
            fix=Fix({"parallel.cp_comm_type": "p2p"}),
        )


@rule(
    "cp-attention-mask",
    "error",
    "transformer_engine.pytorch.attention.dot_product_attention.utils.get_attention_backend: with "
    "context parallelism only no_mask / causal self-attention run (FlashAttention, FusedAttention); "
    "arbitrary masks run only in UnfusedDotProductAttention, which has no context parallelism. "
    "dlmspec.backends.megatron.stage.ObjectiveForwardStep.prepare: no attention mask under context "
    "parallelism (the local layers build the block-causal pattern themselves)",
    "context parallelism comes with no document or variable-length masks, and with Transformer "
    "Engine with bidirectional or causal attention only",
)
def _cp_mask(ctx: Context) -> Iterator[Finding]:
    if ctx.r.cp == 1:
        return
    # dlmspec.attention's table: what each backend runs under context parallelism
    if ctx.r.transformer_impl != "local" and refused_kinds("te", [ctx.r.attention_mask], context_parallel=True):
        yield Finding(
            "objective.attention_mask",
            "block-causal attention is an arbitrary mask, which Transformer Engine's context "
            "parallelism cannot split over GPUs",
            "set model.transformer_impl = 'local' with parallel.cp_comm_type = 'allgather', or "
            "attention_mask = 'bidirectional', or parallel.context_parallel_size = 1",
            value=ctx.r.attention_mask,
            fix=Fix({"model.transformer_impl": "local", "parallel.cp_comm_type": "allgather"}),
        )
    o = ctx.spec.objective
    if (objectives.get(o.kind).masked_variable_length_prob(o) > 0
            and not backends_running(["key_padding"], context_parallel=True)):
        yield Finding(
            "objective.variable_length_prob",
            "sequences cut to a random length need a key-padding mask, which context parallelism "
            "cannot split over GPUs (the run would stop at the first cut sequence)",
            "set objective.variable_length_prob = 0, or objective.variable_length = 'micro_batch' (a dense cut), "
            "or parallel.context_parallel_size = 1",
            fix=Fix({"objective.variable_length_prob": 0}),
        )
    if ctx.spec.data.reset_attention_mask and not backends_running(["document"], context_parallel=True):
        yield Finding(
            "data.reset_attention_mask",
            "document masks are arbitrary masks, which context parallelism cannot split over GPUs",
            "set data.reset_attention_mask = false, or parallel.context_parallel_size = 1",
            fix=Fix({"data.reset_attention_mask": False}),
        )
