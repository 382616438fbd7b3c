"""Rules of block diffusion (``objective.kind = "bd3lm"``, BD3-LM, Arriola et al. 2025): the block
size, the clipped noise range, and what the ``x_t (+) x_0`` input and its mask function can run on
(the local layers, one context-parallel rank, one pipeline stage, no other attention mask), and of
attention annealing, the other AR-to-diffusion adaptation schedule (``objective.attention_anneal_iters``,
DiffuLLaMA: :mod:`dlmspec.objectives.attention_anneal`). Which
objective trains this way is read from its registration (``Objective.block_diffusion``), never
from its kind's name. Design and sources: docs/block-diffusion.md."""

from __future__ import annotations

from typing import Iterator

from dlmspec import objectives
from dlmspec.check.hints import largest_divisor_at_most
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.objectives.bd3lm import noise_range

#: The block size suggested when none is set: the paper's largest (Arriola et al. 2025 tab. 1-3: 4, 8, 16).
SUGGESTED_BLOCK = 16


def _bd3(ctx: Context) -> bool:
    return objectives.get(ctx.spec.objective.kind).block_diffusion


@rule(
    "bd3lm-needs-block-size",
    "error",
    "Arriola et al. 2025 (BD3-LM) sec. 3: a sequence is a series of blocks of block_size tokens, each with its "
    "own noise level",
    "block diffusion sets objective.block_size",
)
def _needs_block(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.spec.objective.block_size is None:
        size = largest_divisor_at_most(ctx.spec.train.seq_length, SUGGESTED_BLOCK)
        yield Finding("objective.block_size", "block diffusion needs a block length",
                      f"set objective.block_size = {size} (a divisor of seq_length = {ctx.spec.train.seq_length}; "
                      "the paper trains 4, 8 and 16)", fix=Fix({"objective.block_size": size}))


@rule(
    "bd3lm-block-divides-seq",
    "error",
    "kuleshov-group/bd3lms diffusion.py _sample_t (num_blocks = n // block_size) and the block_diffusion mask "
    "(backends/megatron/masks.py): a sequence is a whole number of blocks",
    "block diffusion's block_size divides seq_length",
)
def _divides(ctx: Context) -> Iterator[Finding]:
    bs, s = ctx.spec.objective.block_size, ctx.spec.train.seq_length
    if _bd3(ctx) and bs is not None and s % bs:
        size = largest_divisor_at_most(s, bs)
        yield Finding("objective.block_size", f"seq_length = {s} is not a whole number of blocks of {bs}",
                      f"set objective.block_size = {size} (a divisor of {s})", fix=Fix({"objective.block_size": size}))


@rule(
    "bd3lm-noise-clip-order",
    "error",
    "Arriola et al. 2025 sec. 5.2 (clipped schedule: 1 - alpha_t ~ U[beta, omega], beta < omega)",
    "the clipped noise range is non-empty",
)
def _clip_order(ctx: Context) -> Iterator[Finding]:
    if not _bd3(ctx):
        return
    low, high = noise_range(ctx.spec.objective)
    if low >= high:
        key = "objective.noise_clip_min" if ctx.spec.objective.noise_clip_min is not None else "objective.noise_clip_max"
        yield Finding(key, f"the noise range [{low:g}, {high:g}] is empty: each block's t is drawn from U(min, max)",
                      "remove objective.noise_clip_min and objective.noise_clip_max (the range (eps, 1)), or set "
                      "noise_clip_min below noise_clip_max",
                      fix=Fix(unset=("objective.noise_clip_min", "objective.noise_clip_max")))


@rule(
    "bd3lm-keys-ignored",
    "warning",
    "dlmspec.spec.models.ObjectiveSpec (noise_clip_min, noise_clip_max, ar_loss_weight, block_size_schedule: block "
    "diffusion only)",
    "block diffusion's keys are given only with a block-diffusion objective",
)
def _ignored(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx):
        return
    o = ctx.spec.objective
    for key in ("noise_clip_min", "noise_clip_max", "ar_loss_weight", "block_size_schedule"):
        if getattr(o, key) is not None:
            yield Finding(f"objective.{key}", f"has no effect with objective.kind = {o.kind!r}",
                          f"remove objective.{key}, or set objective.kind = 'bd3lm'", fix=Fix(unset=(f"objective.{key}",)))


@rule(
    "bd3lm-mdm-keys-ignored",
    "warning",
    "backends/megatron/objectives/bd3lm.py (no shift, unshift window, CART weighting, forced masks or cut "
    "sequences: the x_t (+) x_0 input is 2 x seq_length, weighted -alpha'(t)/(1-alpha(t)))",
    "masked diffusion's own keys are not given with block diffusion",
)
def _mdm_keys(ctx: Context) -> Iterator[Finding]:
    if not _bd3(ctx):
        return
    o = ctx.spec.objective
    for key, on in (("shift", bool(o.shift)), ("unshift", bool(o.unshift)),
                    ("loss_weighting", o.loss_weighting != "llada"), ("min_masked_tokens", bool(o.min_masked_tokens)),
                    ("variable_length", o.variable_length is not None)):
        if on:
            yield Finding(f"objective.{key}", "block diffusion does not read it",
                          f"remove objective.{key}", fix=Fix(unset=(f"objective.{key}",)))


@rule(
    "bd3lm-variable-length",
    "error",
    "backends/megatron/objectives/bd3lm.py: every row is x_t (+) x_0 of 2 x seq_length under one mask function; "
    "a cut row would need a key-padding mask inside each half",
    "block diffusion trains on uncut sequences",
)
def _variable_length(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.spec.objective.variable_length_prob > 0:
        yield Finding("objective.variable_length_prob", "block diffusion does not cut sequences",
                      "set objective.variable_length_prob = 0.0", fix=Fix({"objective.variable_length_prob": 0.0}))


@rule(
    "bd3lm-attention-mask",
    "error",
    "backends/megatron/attention.py mask_for (the layer's pattern AND the call's mask): the block-diffusion mask "
    "arrives with each call, over bidirectional layers",
    "block diffusion's layers are bidirectional",
)
def _attention(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.r.attention_mask != "bidirectional":
        yield Finding("objective.attention_mask",
                      f"{ctx.r.attention_mask} layers would cut the x_t (+) x_0 mask again (a noised block must see "
                      "the clean blocks of the other half)",
                      "remove objective.attention_mask (block diffusion's mask is built by the objective)",
                      fix=Fix(unset=("objective.attention_mask",)))


@rule(
    "bd3lm-transformer-engine",
    "error",
    "transformer_engine.pytorch DotProductAttention: its fused kernels take no_mask, causal and padding masks, not "
    "a mask function (dlmspec/attention.py BACKENDS['te']); the x_t (+) x_0 mask runs on the local layers",
    "block diffusion runs on the local layers",
)
def _te(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.r.transformer_impl == "transformer_engine":
        yield Finding("model.transformer_impl",
                      "Transformer Engine's fused attention cannot apply block diffusion's three-part mask "
                      "(block-diagonal, offset block-causal, block-causal)",
                      "set model.transformer_impl = 'local' (and model.attention_backend = 'flex': no 2L x 2L tensor)",
                      fix=Fix({"model.transformer_impl": "local"}))


@rule(
    "bd3lm-context-parallel",
    "error",
    "megatron-core get_batch_on_this_cp_rank splits the 2L input into 2 x cp chunks (rank r: chunks r and "
    "2cp-1-r), so a rank's x_t blocks lose the x_0 blocks they attend; FlexAttention runs no context "
    "parallelism (dlmspec/attention.py BACKENDS['flex']); Megatron-Bridge asserts CP off for [xt | x0] too",
    "block diffusion runs without context parallelism",
)
def _cp(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.r.cp > 1:
        yield Finding("parallel.context_parallel_size",
                      "the context-parallel split would separate each noised block from its clean context "
                      "(and the local layers' all-gather CP runs structural masks only)",
                      "set parallel.context_parallel_size = 1 (shard with tensor or data parallelism)",
                      fix=Fix({"parallel.context_parallel_size": 1}))


@rule(
    "bd3lm-pipeline",
    "error",
    "megatron-core pipeline schedules send activations of [seq_length, micro_batch, hidden] between stages "
    "(get_tensor_shapes); the x_t (+) x_0 activations are 2 x seq_length",
    "block diffusion runs on one pipeline stage",
)
def _pp(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.r.pp > 1:
        yield Finding("parallel.pipeline_model_parallel_size",
                      "the pipeline would send seq_length activations, and block diffusion's are twice that",
                      "set parallel.pipeline_model_parallel_size = 1",
                      fix=Fix({"parallel.pipeline_model_parallel_size": 1}))


@rule(
    "bd3lm-document-mask",
    "error",
    "backends/megatron/objectives/bd3lm.py: the block-diffusion mask is one function of positions; a document "
    "mask over x_t (+) x_0 would need segment ids of both halves",
    "block diffusion runs without document masks",
)
def _document(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.spec.data.reset_attention_mask:
        yield Finding("data.reset_attention_mask", "block diffusion does not take document masks",
                      "set data.reset_attention_mask = false", fix=Fix({"data.reset_attention_mask": False}))


@rule(
    "bd3lm-dense-sdpa",
    "warning",
    "dlmspec/attention.py BACKENDS['sdpa'] (a mask function as a dense [1, 1, 2L, 2L] bool tensor, SDPA off its "
    "flash kernels); bench/results/attention/2026-12-06-h100-flex-vs-sdpa.json: 49.5 ms SDPA against 10.9 ms "
    "FlexAttention for this mask at 2 x 4096",
    "block diffusion's mask runs on FlexAttention",
)
def _sdpa(ctx: Context) -> Iterator[Finding]:
    if _bd3(ctx) and ctx.r.transformer_impl != "transformer_engine" and ctx.spec.model.attention_backend in (None, "sdpa"):
        n = 2 * ctx.spec.train.seq_length
        yield Finding("model.attention_backend",
                      f"SDPA applies the x_t (+) x_0 mask as a dense {n} x {n} tensor on its memory-efficient kernel",
                      "set model.attention_backend = 'flex' (a BlockMask that skips the masked tiles)",
                      value=ctx.spec.model.attention_backend, fix=Fix({"model.attention_backend": "flex"}))


@rule(
    "bd3lm-sft-packed",
    "error",
    "backends/megatron/sft.py SftForwardStep (packed conversations are segments apart by a per-query mask; "
    "block diffusion's mask is one function of positions over x_t (+) x_0)",
    "block-diffusion SFT runs one conversation a sequence",
)
def _sft_packed(ctx: Context) -> Iterator[Finding]:
    sft = ctx.spec.stage.sft
    if _bd3(ctx) and ctx.spec.stage.kind == "sft" and sft is not None and sft.packed_sequence:
        yield Finding("stage.sft.packed_sequence", "block diffusion does not take the segment masks of packed "
                      "conversations", "set stage.sft.packed_sequence = false (one conversation a sequence, "
                      "padded with EOS)", fix=Fix({"stage.sft.packed_sequence": False}))


@rule(
    "bd3lm-block-schedule",
    "error",
    "dlmspec/objectives/bd3lm.py block_at (piecewise constant from step 0) and kuleshov-group/bd3lms _sample_t "
    "(num_blocks = n // block_size): each phase's block divides seq_length",
    "a block-size schedule starts at step 0, its steps increase, and each block divides seq_length",
)
def _block_schedule(ctx: Context) -> Iterator[Finding]:
    schedule = ctx.spec.objective.block_size_schedule
    if not _bd3(ctx) or not schedule:
        return
    s = ctx.spec.train.seq_length
    steps = [int(step) for step, _ in schedule]
    bad = [int(b) for _, b in schedule if s % int(b)]
    if steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])) or bad:
        fixed, last = [], -1
        for step, block in schedule:
            step = 0 if not fixed else max(int(step), last + 1)
            fixed.append([step, largest_divisor_at_most(s, int(block))])
            last = step
        why = (f"block {bad[0]} does not divide seq_length = {s}" if bad else
               "the steps must start at 0 and increase")
        yield Finding("objective.block_size_schedule", why,
                      f"set objective.block_size_schedule = {fixed}", fix=Fix({"objective.block_size_schedule": fixed}))


# ---- attention annealing (DiffuLLaMA): adapting an AR model, causal -> bidirectional -------------
# The schedule and its source: dlmspec/objectives/attention_anneal.py. The runtime draws the mask in
# the mdm objective (backends/megatron/objectives/mdm.py) as a mask object of the local layers.

_ANNEAL = "objective.attention_anneal_iters"
_UNSET_ANNEAL = Fix(unset=(_ANNEAL,))


def _anneals(ctx: Context) -> bool:
    return ctx.spec.objective.attention_anneal_iters is not None


@rule(
    "attention-anneal-objective",
    "error",
    "Gong et al. 2024 (DiffuLLaMA, arXiv:2410.17891) sec. 3.2: annealing relaxes a causal mask to the full "
    "attention of a masked-diffusion model; backends/megatron/objectives/mdm.py draws it (set_iteration)",
    "attention annealing trains a masked-diffusion objective over bidirectional layers",
)
def _anneal_objective(ctx: Context) -> Iterator[Finding]:
    if not _anneals(ctx):
        return
    o = objectives.get(ctx.spec.objective.kind)
    if not o.diffusion or o.block_diffusion:
        why = ("block diffusion adapts an AR model with objective.block_size_schedule instead (blocks growing from 1)"
               if o.block_diffusion else f"objective.kind = {o.kind!r} does not train full attention")
        yield Finding(_ANNEAL, why, f"remove {_ANNEAL}", fix=_UNSET_ANNEAL)
    elif ctx.r.attention_mask != "bidirectional":
        yield Finding(_ANNEAL, f"the layers are {ctx.r.attention_mask}: annealing ends at full attention",
                      f"remove {_ANNEAL}, or remove objective.attention_mask (bidirectional)", fix=_UNSET_ANNEAL)


@rule(
    "attention-anneal-iters",
    "error",
    "HKUNLP/DiffuLLaMA trainer.py: attn_mask_ratio = min(1, (global_step + 1) / anneal_steps), full attention "
    "only from step anneal_steps - 1",
    "attention annealing ends within training",
)
def _anneal_iters(ctx: Context) -> Iterator[Finding]:
    k, n = ctx.spec.objective.attention_anneal_iters, ctx.r.train_iters
    if k is not None and n and k > n:
        yield Finding(_ANNEAL, f"{k} annealing steps for a run of {n}: the model would never train with full "
                      "attention, which is what it samples with", f"set {_ANNEAL} = {n} (at most train_iters)",
                      fix=Fix({_ANNEAL: int(n)}))


@rule(
    "attention-anneal-init-from",
    "warning",
    "Gong et al. 2024 sec. 3.2: annealing keeps an AR model's causal attention working while it adapts; a model "
    "trained from random weights has no causal attention to keep",
    "attention annealing starts from an AR checkpoint",
)
def _anneal_init(ctx: Context) -> Iterator[Finding]:
    if _anneals(ctx) and not ctx.spec.checkpoint.init_from:
        yield Finding(_ANNEAL, "no checkpoint.init_from: annealing adapts a trained AR model, from random weights it "
                      "only delays full attention", f"remove {_ANNEAL} (or set checkpoint.init_from to the AR model)",
                      fix=_UNSET_ANNEAL)


@rule(
    "attention-anneal-transformer-engine",
    "error",
    "transformer_engine.pytorch DotProductAttention's fused kernels take no_mask, causal and padding masks "
    "(dlmspec/attention.py BACKENDS['te']), not the annealed mask (causal OR a random [s, s] draw)",
    "attention annealing runs on the local layers",
)
def _anneal_te(ctx: Context) -> Iterator[Finding]:
    if _anneals(ctx) and ctx.r.transformer_impl == "transformer_engine":
        yield Finding("model.transformer_impl", "Transformer Engine's fused attention cannot apply the annealed "
                      "mask (causal OR keys opened at random)", "set model.transformer_impl = 'local'",
                      fix=Fix({"model.transformer_impl": "local"}))


@rule(
    "attention-anneal-context-parallel",
    "error",
    "backends/megatron/attention.py SDPACoreAttention._forward_context_parallel runs the layer's structural "
    "pattern only; FlexAttention runs no context parallelism (dlmspec/attention.py BACKENDS)",
    "attention annealing runs without context parallelism",
)
def _anneal_cp(ctx: Context) -> Iterator[Finding]:
    if _anneals(ctx) and ctx.r.cp > 1:
        yield Finding("parallel.context_parallel_size", "the annealed mask covers the whole sequence; a "
                      "context-parallel rank holds two chunks of it", "set parallel.context_parallel_size = 1",
                      fix=Fix({"parallel.context_parallel_size": 1}))


@rule(
    "attention-anneal-document-mask",
    "error",
    "backends/megatron/stage.py ObjectiveForwardStep.prepare ORs a document mask tensor with the objective's "
    "mask; the annealed mask is a mask object",
    "attention annealing runs without document masks",
)
def _anneal_document(ctx: Context) -> Iterator[Finding]:
    if _anneals(ctx) and ctx.spec.data.reset_attention_mask:
        yield Finding("data.reset_attention_mask", "attention annealing does not combine with document masks",
                      "set data.reset_attention_mask = false", fix=Fix({"data.reset_attention_mask": False}))


@rule(
    "attention-anneal-stage",
    "error",
    "HKUNLP/DiffuLLaMA README (fine-tuning: anneal_steps 1, the base model is already bidirectional); "
    "backends/megatron/sft.py SftForwardStep passes segment masks, not the objective's",
    "attention annealing runs in a pretrain stage",
)
def _anneal_stage(ctx: Context) -> Iterator[Finding]:
    if _anneals(ctx) and ctx.spec.stage.kind != "pretrain":
        yield Finding(_ANNEAL, f"stage.kind = {ctx.spec.stage.kind!r} fine-tunes a model that is already "
                      "bidirectional (and would not apply the mask)", f"remove {_ANNEAL}", fix=_UNSET_ANNEAL)
