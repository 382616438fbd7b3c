"""Rules of the training objective and attention: autoregressive vs masked diffusion,
block-causal attention's block size, masking schedules, and position embeddings (learned, RoPE's
rotary dimensions). What an objective is (diffusion or not, the attention it trains with) is read
from its registration (:mod:`dlmspec.objectives`), never from its kind's name."""

from __future__ import annotations

import math

from typing import Iterator

from dlmspec import objectives
from dlmspec.check.hints import largest_divisor_at_most
from dlmspec.check.registry import Context, Finding, Fix, rule


@rule(
    "ar-attention",
    "error",
    "next-token prediction: position i may attend only to positions <= i (else it sees its target)",
    "the 'ar' objective uses causal attention",
)
def _ar_attention(ctx: Context) -> Iterator[Finding]:
    p = objectives.get(ctx.spec.objective.kind)
    if not p.diffusion and ctx.r.attention_mask not in p.attentions:
        yield Finding(
            "objective.attention_mask",
            f"next-token prediction with {ctx.r.attention_mask} attention lets each position see the "
            "token it predicts",
            f"use attention_mask = {p.attention!r} (the default for {p.kind}), or objective.kind = 'mdm'",
            value=ctx.r.attention_mask,
            fix=Fix({"objective.attention_mask": p.attention}),
        )


@rule(
    "mdm-causal-attention",
    "warning",
    "LLaDA (Nie et al. 2025, sec. 2.1) and MDLM (Sahoo et al. 2024): the mask predictor is a "
    "bidirectional Transformer",
    "masked diffusion uses bidirectional (or block-causal) attention",
)
def _mdm_causal(ctx: Context) -> Iterator[Finding]:
    if objectives.get(ctx.spec.objective.kind).diffusion and ctx.r.attention_mask == "causal":
        yield Finding(
            "objective.attention_mask",
            "a masked-diffusion model with causal attention cannot use the unmasked tokens to its right",
            "use attention_mask = 'bidirectional' (the default for mdm) or 'block_causal'",
            fix=Fix({"objective.attention_mask": "bidirectional"}),
        )


@rule(
    "block-causal-needs-size",
    "error",
    "block diffusion (Arriola et al. 2025, BD3-LM): the mask is causal over blocks of block_size",
    "block_causal attention sets objective.block_size",
)
def _block_needs_size(ctx: Context) -> Iterator[Finding]:
    if ctx.r.attention_mask == "block_causal" and ctx.spec.objective.block_size is None:
        size = largest_divisor_at_most(ctx.spec.train.seq_length, 32)
        yield Finding(
            "objective.block_size",
            "block_causal attention needs a block length",
            f"set block_size to a divisor of seq_length = {ctx.spec.train.seq_length}, e.g. block_size = {size}",
            fix=Fix({"objective.block_size": size}),
        )


@rule(
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
            f"use block_size = {largest_divisor_at_most(s, bs)} (a divisor of {s})",
            fix=Fix({"objective.block_size": largest_divisor_at_most(s, bs)}),
        )


@rule(
    "block-size-ignored",
    "warning",
    "dlmspec.spec.models.ObjectiveSpec.block_size (used only by block_causal attention and block diffusion)",
    "objective.block_size is only given with block_causal attention",
)
def _block_ignored(ctx: Context) -> Iterator[Finding]:
    if (ctx.spec.objective.block_size is not None and ctx.r.attention_mask != "block_causal"
            and not objectives.get(ctx.spec.objective.kind).block_diffusion):
        yield Finding("objective.block_size", f"has no effect with {ctx.r.attention_mask} attention",
                      "remove block_size, or set attention_mask = 'block_causal'",
                      fix=Fix(unset=("objective.block_size",)))


@rule(
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
            fix=Fix({"model.position_embedding_type": "rope"}),
        )


@rule(
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
            f"raise the table: model.max_position_embeddings = {s}, or use seq_length <= {m.max_position_embeddings}",
            fix=Fix({"model.max_position_embeddings": s}),
        )


@rule(
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
            f"use seq_length = {m.max_position_embeddings} (or less), or raise max_position_embeddings on purpose",
            fix=Fix({"train.seq_length": m.max_position_embeddings}),
        )


#: rotary_percent values a hint suggests, the closest to the spec's first.
_ROTARY_PERCENTS = (0.25, 0.5, 1.0)


def _rotary_dims_of(kv_channels: int, percent: float) -> int:
    """Rotary dimensions of a head: megatron-core RotaryEmbedding's ``int(kv_channels *
    rotary_percent)`` (all of them at 1.0)."""
    return int(kv_channels * percent) if percent < 1.0 else kv_channels


@rule(
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
        fix = Fix({"model.kv_channels": even, **({"model.rotary_percent": 1.0} if also else {})})
        yield Finding("model.kv_channels", f"head dimension {kv} with rotary_percent = {percent:g} gives {what}",
                      f"use an even head dimension: kv_channels = {even}{also}", value=kv, fix=fix)
        return
    fit = next(p for p in sorted(_ROTARY_PERCENTS, key=lambda p: (abs(p - percent), p))
               if _rotary_dims_of(kv, p) > 0 and _rotary_dims_of(kv, p) % 2 == 0)
    yield Finding("model.rotary_percent", f"{percent:g} of head dimension {kv} gives {what}",
                  f"use rotary_percent = {fit} ({_rotary_dims_of(kv, fit)} of {kv} dimensions rotate)",
                  fix=Fix({"model.rotary_percent": fit}))


@rule(
    "mdm-eps-zero",
    "error",
    "LLaDA (Nie et al. 2025, eq. 3): the weight 1/t of a masked token is bounded by 1/eps only; MegaDLMs "
    "(JinjieNi/MegaDLMs gpt_model.py:309-322, 528-529) draws t ~ U(0, 1) and weights by the realised ratio",
    "objective.eps = 0 comes with loss_weighting = 'realised'",
)
def _eps_zero(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if objectives.get(o.kind).diffusion and o.eps == 0 and o.loss_weighting == "llada":
        # t = u with u ~ U[0, 1) in float32: the weight 1/t of a masked position reaches 2**24 (and inf at u = 0
        # with a forced mask); E[(1/t)^2 * t] = E[1/t] diverges, so the estimator's variance is infinite whether or
        # not min_masked_tokens forces masks. The realised ratio r = masked / length is >= 1/length when anything
        # is masked: its weight is at most the length.
        yield Finding(
            "objective.eps",
            "t ~ U(0, 1) with the 1/t weight: a masked token at small t weighs up to 2**24 (infinite at t = 0), "
            "so the loss has infinite variance",
            "set objective.loss_weighting = 'realised' with objective.min_masked_tokens = 1 (MegaDLMs), or "
            "objective.eps = 0.001 (LLaDA)",
            fix=Fix({"objective.loss_weighting": "realised",
                     **({} if (o.min_masked_tokens or 0) >= 1 else {"objective.min_masked_tokens": 1})}),
        )


@rule(
    "mdm-min-masked-tokens",
    "error",
    "dlmspec.backends.megatron.objectives.mdm.MaskedDiffusionObjective (min_masked_tokens forced masks among a row's "
    "seq_length positions)",
    "objective.min_masked_tokens <= train.seq_length",
)
def _min_masked(ctx: Context) -> Iterator[Finding]:
    k, s = ctx.spec.objective.min_masked_tokens, ctx.spec.train.seq_length
    if objectives.get(ctx.spec.objective.kind).diffusion and k is not None and k > s:
        yield Finding(
            "objective.min_masked_tokens",
            f"a row has {s} positions: {k} of them cannot be masked",
            "use objective.min_masked_tokens = 1 (MegaDLMs: one forced mask in a row that drew none)",
            fix=Fix({"objective.min_masked_tokens": 1}),
        )


@rule(
    "mdm-cart-p-ignored",
    "warning",
    "Dream's CART weighting (DreamLM/Dream-Coder instruct/src/trainer/fsdp_sft_trainer.py:802-818): cart_p is read "
    "by loss_weighting = 'cart' only",
    "objective.cart_p is set only with loss_weighting = 'cart'",
)
def _cart_p_ignored(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.cart_p is not None and not (objectives.get(o.kind).diffusion and o.loss_weighting == "cart"):
        yield Finding(
            "objective.cart_p",
            f"cart_p = {o.cart_p} has no effect with objective.kind = {o.kind!r} and loss_weighting = "
            f"{o.loss_weighting!r}: only Dream's CART weighting reads it",
            "remove objective.cart_p, or set objective.loss_weighting = 'cart' (mdm)",
            value=o.cart_p,
            fix=Fix(unset=("objective.cart_p",)),
        )


def _true_has_no_effect(key: str, why: str, hint: str) -> Finding:
    """The warning that boolean ``key`` (e.g. ``"objective.shift"``) is true where nothing reads it:
    ``why`` says so, ``hint`` what to write; the fix sets it false."""
    return Finding(key, why, hint, value=True, fix=Fix({key: False}))


@rule(
    "mdm-shift-ar",
    "warning",
    "Dream (DreamLM/Dream eval/eval.py:352-354): shift moves a masked-diffusion model's predictions to the AR "
    "alignment; next-token prediction has it already",
    "objective.shift is set only for the mdm objective",
)
def _shift_ar(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.shift and not objectives.get(o.kind).diffusion:
        yield _true_has_no_effect(
            "objective.shift",
            "objective.shift = true has no effect with objective.kind = 'ar': next-token prediction already "
            "predicts position i + 1 from position i",
            "set objective.shift = false (a spec that extends an mdm spec with it writes it so), or use "
            "objective.kind = 'mdm' with shift = true (Dream's objective)",
        )


@rule(
    "mdm-unshift-ar",
    "warning",
    "MegaDLMs (JinjieNi/MegaDLMs gpt_model.py:427-431): the unshift undoes the AR label shift of megatron's GPTDataset "
    "for masked diffusion; next-token prediction keeps it",
    "objective.unshift is set only for the mdm objective",
)
def _unshift_ar(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.unshift and not objectives.get(o.kind).diffusion:
        yield _true_has_no_effect(
            "objective.unshift",
            "objective.unshift = true has no effect with objective.kind = 'ar': next-token prediction already reads "
            "seq_length + 1 ids and predicts ids 1 .. seq_length",
            "set objective.unshift = false (a spec that extends an mdm spec with it writes it so), or use "
            "objective.kind = 'mdm' (MegaDLMs' objective)",
        )


@rule(
    "mdm-unshift-sft",
    "warning",
    "backends/megatron/sft.py: an SFT sample is one conversation with its response mask, not a GPTDataset window",
    "objective.unshift is false in an SFT stage",
)
def _unshift_sft(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.unshift and objectives.get(o.kind).diffusion and ctx.spec.stage.kind == "sft":
        yield _true_has_no_effect(
            "objective.unshift",
            "objective.unshift = true has no effect in an SFT stage: its samples are conversations, not "
            "seq_length + 1 windows of a token stream",
            "set objective.unshift = false (a spec that extends a pre-training spec with it writes it so)",
        )


@rule(
    "mdm-unshift-layout",
    "error",
    "MegaDLMs (gpt_model.py:427-431): the unshift leaves seq_length - 1 positions; megatron-core's pipeline sends "
    "activations of seq_length positions, its context-parallel split needs a multiple of 2 x CP "
    "(get_batch_on_this_cp_rank), sequence parallelism a multiple of TP, Transformer Engine's fp8 GEMMs rows in "
    "multiples of 8",
    "objective.unshift runs with PP 1, and seq_length - 1 positions the layout can split",
)
def _unshift_layout(ctx: Context) -> Iterator[Finding]:
    o, r, par, t = ctx.spec.objective, ctx.r, ctx.spec.parallel, ctx.spec.train
    if not (o.unshift and objectives.get(o.kind).diffusion and ctx.spec.stage.kind != "sft"):
        return
    n = t.seq_length - 1
    problems, fixes = [], []
    if r.pp > 1:
        problems.append(f"pipeline parallelism (PP {r.pp}) sends activations of seq_length = {t.seq_length} positions")
        fixes.append("parallel.pipeline_model_parallel_size = 1")
    if r.cp > 1 and n % (2 * r.cp):
        problems.append(f"context parallelism (CP {r.cp}) splits a sequence into 2 x {r.cp} chunks")
        fixes.append(f"a parallel.context_parallel_size whose 2 x CP divides {n} (CP 1 always does)")
    if par.sequence_parallel and r.tp > 1 and n % r.tp:
        problems.append(f"sequence parallelism splits a sequence over TP {r.tp}")
        fixes.append(f"a parallel.tensor_model_parallel_size that divides {n}, or parallel.sequence_parallel = false")
    if ctx.spec.precision.fp8 != "none" and (t.micro_batch_size * n) % 8:
        problems.append(f"fp8 GEMMs need rows in multiples of 8 ({t.micro_batch_size} x {n})")
        step = 8 // math.gcd(n, 8)  # micro batches that make micro_batch x n a multiple of 8
        mb = -(-t.micro_batch_size // step) * step
        fixes.append(f"train.micro_batch_size = {mb} ({mb} x {n} rows is a multiple of 8; any multiple of {step} "
                     f"works) or precision.fp8 = \"none\"")
    if problems:
        yield Finding(
            "objective.unshift",
            f"the unshift leaves seq_length - 1 = {n} positions, and " + "; ".join(problems),
            "remove objective.unshift (the model then trains on all seq_length ids), or keep it and set "
            + "; and ".join(fixes),
            value=True,
            fix=Fix(unset=("objective.unshift",)),
        )


@rule(
    "mdm-schedule-exponent-ignored",
    "warning",
    "MD4 (Shi et al. 2024, arXiv:2406.04329): alpha(t) = 1 - t^a is the polynomial schedule; linear and cosine "
    "have no exponent (dlmspec/objectives/schedules.py)",
    "objective.noise_schedule_exponent is set only with noise_schedule = 'polynomial'",
)
def _schedule_exponent_ignored(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.noise_schedule_exponent is not None and o.noise_schedule != "polynomial":
        yield Finding(
            "objective.noise_schedule_exponent",
            f"noise_schedule_exponent = {o.noise_schedule_exponent:g} has no effect with noise_schedule = "
            f"{o.noise_schedule!r}: only the polynomial schedule alpha(t) = 1 - t^a reads it",
            "remove objective.noise_schedule_exponent, or set objective.noise_schedule = 'polynomial'",
            value=o.noise_schedule_exponent,
            fix=Fix(unset=("objective.noise_schedule_exponent",)),
        )


@rule(
    "mdm-schedule-ar",
    "warning",
    "MDLM (Sahoo et al. 2024, eq. 10): the masking schedule alpha(t) belongs to masked diffusion; next-token "
    "prediction masks nothing",
    "objective.noise_schedule is 'linear' (its default) unless the objective is masked diffusion",
)
def _schedule_ar(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if o.noise_schedule != "linear" and not objectives.get(o.kind).diffusion:
        yield Finding(
            "objective.noise_schedule",
            f"noise_schedule = {o.noise_schedule!r} has no effect with objective.kind = {o.kind!r}: it masks no "
            "tokens",
            "set objective.noise_schedule = 'linear' (a spec that extends an mdm spec with another schedule writes "
            "it so), or use objective.kind = 'mdm'",
            fix=Fix({"objective.noise_schedule": "linear"}),
        )
