"""Rules of numeric precision: fp8 (Transformer Engine layers, GPUs with fp8 tensor cores,
recipes) and float settings the GPU computes with in float32."""

from __future__ import annotations

import math
from typing import Iterator

from dlmspec import objectives
from dlmspec.check.hints import local_because, or_te
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.spec.fast import SCHEMA


@rule(
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
            + (f"the layers are local{local_because(ctx)}" if local_because(ctx) else "model.transformer_impl = 'local'"),
            "set precision.fp8 = 'none'" + or_te(ctx),
            fix=Fix({"precision.fp8": "none"}),
        )


@rule(
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
            fix=Fix({"precision.fp8": "none"}),
        )


@rule(
    "fp8-recipe-gpu",
    "error",
    "Transformer Engine MXFP8BlockScaling (microscaling fp8 needs compute capability 10.0, Blackwell)",
    "the mxfp8 recipe runs on Blackwell GPUs",
)
def _mxfp8(ctx: Context) -> Iterator[Finding]:
    p, gpu = ctx.spec.precision, ctx.r.gpu
    if p.fp8 != "none" and p.fp8_recipe == "mxfp8" and gpu is not None and gpu.compute_capability < (10, 0):
        rc = ctx.spec.recompute
        delayed_refused = rc.granularity == "selective" and {"moe_act", "layernorm"} & set(rc.modules or [])
        first, second = ("tensorwise", "delayed") if delayed_refused else ("delayed", "tensorwise")
        yield Finding(
            "precision.fp8_recipe",
            f"MXFP8 needs Blackwell tensor cores (compute capability 10.0); {gpu.name} has "
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            f"use fp8_recipe = '{first}' or '{second}', or a b200/gb200 GPU",
            fix=Fix({"precision.fp8_recipe": first}),
        )


@rule(
    "fp8-keys-ignored",
    "warning",
    "megatron.core TransformerConfig.fp8_recipe (used only when fp8 is enabled)",
    "precision.fp8_recipe is only given with fp8",
)
def _fp8_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.precision.fp8 == "none" and ctx.is_set("precision.fp8_recipe"):
        yield Finding("precision.fp8_recipe", "has no effect: precision.fp8 = 'none'",
                      "remove fp8_recipe, or set precision.fp8 = 'hybrid' or 'e4m3'",
                      fix=Fix(unset=("precision.fp8_recipe",)))


def _te_dense_layers(ctx: Context) -> bool:
    """Whether the layers may be Transformer Engine's dense ones (``transformer_impl`` TE or
    ``auto``, no experts): there each norm is fused into the linear after it, so 'layernorm'
    recomputes nothing (MoE layers keep a separate pre-MLP norm), and attention is TE's fused kernel."""
    return ctx.r.transformer_impl != "local" and not ctx.spec.model.num_experts


def _without_module(modules: list[str], name: str) -> Fix:
    """The fix that drops ``name`` from ``recompute.modules`` (no recompute when nothing is left)."""
    rest = [m for m in modules if m != name]
    return Fix({"recompute.modules": rest}) if rest else Fix({"recompute.granularity": "none"},
                                                             unset=("recompute.modules",))


@rule(
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
        if modules == ["layernorm"] and _te_dense_layers(ctx):
            # on TE's dense layers 'layernorm' recomputes nothing (recompute-layernorm-te): dropping it loses nothing
            fix = _without_module(list(rc.modules), "layernorm")
            hint = (f"{fix.text()} (on the Transformer Engine layers 'layernorm' recomputes nothing), or use "
                    "precision.fp8_recipe = 'tensorwise' (Transformer Engine >= 2.6)")
        else:
            fix = Fix({"precision.fp8_recipe": "tensorwise"})
            hint = ("use precision.fp8_recipe = 'tensorwise' (Transformer Engine >= 2.6), or drop "
                    f"{' and '.join(repr(m) for m in modules)} from recompute.modules")
        yield Finding(
            "recompute.modules",
            f"recomputing {' and '.join(repr(m) for m in modules)} is not supported with delayed fp8 scaling",
            hint,
            fix=fix,
        )


#: Float keys the GPU computes with in float32 (the optimizer's lr, decay and eps, the init std,
#: norms and RoPE): table of :data:`dlmspec.spec.fast.SCHEMA` for each.
_FP32_KEYS: dict[str, str] = {
    "train.lr": "TrainSpec", "train.min_lr": "TrainSpec", "train.weight_decay": "TrainSpec",
    "train.adam_eps": "TrainSpec", "train.clip_grad": "TrainSpec", "model.init_method_std": "ModelSpec",
    "model.layernorm_epsilon": "ModelSpec", "model.rotary_base": "ModelSpec",
    "model.moe_aux_loss_coeff": "ModelSpec",
}


#: Largest finite float32.
FLOAT32_MAX = 3.4028234663852886e38


@rule(
    "float32-range",
    "error",
    "megatron-core's optimizers (TE/apex FusedAdam take lr, weight decay and eps as float32) and fp32 model "
    "math (init std, norm epsilon, RoPE's base): beyond 3.4e38 a float32 is inf",
    "float settings the GPU computes with fit in float32",
)
def _float32_range(ctx: Context) -> Iterator[Finding]:
    for key, table in _FP32_KEYS.items():
        value = ctx.value(key)
        if isinstance(value, float) and abs(value) > FLOAT32_MAX:
            leaf = key.split(".")[1]
            default = SCHEMA[table]["fields"][leaf][2]
            yield Finding(key, f"{value:g} is beyond float32 (at most {FLOAT32_MAX:.3g}), in which the GPU computes "
                          "it: it becomes inf and training produces NaN", f"use {leaf} = {default!r} (the default)",
                          fix=Fix({key: default}))


# --------------------------------------------------------------------------------------------
# Transformer Engine's fp8 recipes and GEMM shapes, and recomputation on its layers.


@rule(
    "fp8-blockwise-gpu",
    "error",
    "transformer_engine.pytorch.quantization.check_fp8_block_scaling_support (Float8BlockScaling, "
    "megatron-core fp8_recipe = 'blockwise': compute capability 9.0 or higher and CUDA >= 12.9)",
    "the blockwise fp8 recipe runs on Hopper or newer GPUs",
)
def _blockwise_gpu(ctx: Context) -> Iterator[Finding]:
    p, gpu = ctx.spec.precision, ctx.r.gpu
    if p.fp8 != "none" and p.fp8_recipe == "blockwise" and gpu is not None and gpu.supports_fp8 \
            and gpu.compute_capability < (9, 0):
        yield Finding(
            "precision.fp8_recipe",
            f"blockwise fp8 scaling (Transformer Engine's Float8BlockScaling) needs compute capability 9.0 "
            f"(Hopper); {gpu.name} has {gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            "set precision.fp8_recipe = 'tensorwise' (per-tensor current scaling, which it runs), or a GPU "
            "such as h100 or h200",
            fix=Fix({"precision.fp8_recipe": "tensorwise"}),
        )


#: Transformer Engine's fp8 GEMMs take an input ``[rows, columns]`` and a weight ``[out, in]`` with
#: rows and out a multiple of :data:`FP8_ROWS` and columns and in a multiple of :data:`FP8_COLUMNS`
#: (``transformer_engine.pytorch.utils.assert_dim_for_fp8_exec``, in every TE linear's forward).
FP8_ROWS = 8
FP8_COLUMNS = 16


def fp8_gemm_widths(ctx: Context) -> list[tuple[str, str, int, int]]:
    """The weight dimensions of one GPU's fp8 GEMMs that TE refuses: ``(key, what, size, multiple)``.

    Per tensor-parallel rank, megatron-core's TE layers hold ``linear_qkv`` ``[(heads + 2 groups) x
    kv_channels / tp, hidden]``, ``linear_proj`` ``[hidden, heads x kv_channels / tp]``, ``linear_fc1``
    ``[ffn x (2 gated) / tp, hidden]`` and ``linear_fc2`` ``[hidden, ffn / tp]`` (experts: their
    ffn size over the expert tensor-parallel size); the output layer is not an fp8 GEMM.
    """
    m, r = ctx.spec.model, ctx.r
    gated = 2 if m.activation in ("swiglu", "geglu") else 1
    out: list[tuple[str, str, int, int]] = []

    def need(key: str, what: str, size: float, multiple: int) -> None:
        if size == int(size) and int(size) % multiple:  # a size TP does not divide: the TP rules' error
            out.append((key, what, int(size), multiple))

    need("model.hidden_size", "hidden_size (every GEMM's input width)", m.hidden_size, FP8_COLUMNS)
    heads = m.num_attention_heads * r.kv_channels / r.tp
    need("model.kv_channels", "heads x kv_channels per GPU (linear_proj's input width)", heads, FP8_COLUMNS)
    need("model.kv_channels", "(heads + 2 x query groups) x kv_channels per GPU (linear_qkv's output)",
         (m.num_attention_heads + 2 * r.num_query_groups) * r.kv_channels / r.tp, FP8_ROWS)
    if 0 in r.moe_layers or not m.num_experts:
        need("model.ffn_hidden_size", "ffn_hidden_size per GPU (linear_fc2's input width)", m.ffn_hidden_size / r.tp,
             FP8_COLUMNS)
        need("model.ffn_hidden_size", "linear_fc1's output per GPU", gated * m.ffn_hidden_size / r.tp, FP8_ROWS)
    if m.num_experts and r.moe_ffn_hidden_size:
        need("model.moe_ffn_hidden_size", "an expert's ffn size per GPU (its linear_fc2's input width)",
             r.moe_ffn_hidden_size / r.etp, FP8_COLUMNS)
    seen: set[str] = set()
    return [w for w in out if not (w[0] in seen or seen.add(w[0]))]  # the first per key


@rule(
    "fp8-gemm-shapes",
    "error",
    "transformer_engine.pytorch.utils.assert_dim_for_fp8_exec (fp8 GEMM inputs: rows a multiple of 8, "
    "columns of 16; every TE linear checks its input and weight)",
    "fp8 GEMMs get rows in multiples of 8 and columns in multiples of 16",
)
def _fp8_gemm_shapes(ctx: Context) -> Iterator[Finding]:
    p, r, t, o = ctx.spec.precision, ctx.r, ctx.spec.train, ctx.spec.objective
    if p.fp8 == "none" or r.transformer_impl == "local":  # local: fp8-needs-te
        return
    for key, what, size, multiple in fp8_gemm_widths(ctx):
        yield Finding(key, f"{what} is {size}, not a multiple of {multiple}: Transformer Engine's fp8 GEMMs "
                      f"refuse it", f"set precision.fp8 = 'none', or a {key.split('.')[1]} that makes it a "
                      f"multiple of {multiple}", fix=Fix({"precision.fp8": "none"}))
    # rows: the tokens of one micro-batch on one GPU (sequence parallelism splits them over TP)
    split = r.cp * (r.tp if ctx.spec.parallel.sequence_parallel else 1)
    rows = t.micro_batch_size * t.seq_length / split
    if rows == int(rows) and int(rows) % FP8_ROWS:
        step = FP8_ROWS * split
        fixed = max(step, t.seq_length // step * step)
        yield Finding("train.seq_length", f"a micro-batch gives fp8 GEMMs {int(rows)} rows per GPU (micro_batch_size "
                      f"{t.micro_batch_size} x seq_length {t.seq_length}" + (f" / {split}" if split > 1 else "")
                      + f"), not a multiple of {FP8_ROWS}", f"set train.seq_length = {fixed}, or precision.fp8 = 'none'",
                      fix=Fix({"train.seq_length": fixed}))
    if objectives.get(o.kind).micro_batch_variable_length_prob(o) > 0:
        rt_multiple = math.lcm(2 * r.cp if r.cp > 1 else 1, r.tp if ctx.spec.parallel.sequence_parallel and r.tp > 1
                               else 1)  # dlmspec.resolve.runtime_values' variable_length_multiple
        if (t.micro_batch_size * rt_multiple) % (FP8_ROWS * split):
            fix = (Fix({"objective.variable_length": "sequence"}) if r.cp == 1
                   else Fix({"objective.variable_length_prob": 0}))
            yield Finding("objective.variable_length", f"a micro-batch cut to a random length (a multiple of "
                          f"{rt_multiple}) gives fp8 GEMMs a number of rows that is not always a multiple of "
                          f"{FP8_ROWS}", fix.text() + (" (each sequence cut alone behind a key-padding mask: the "
                          "shape stays)" if r.cp == 1 else "") + ", or precision.fp8 = 'none'", fix=fix)


@rule(
    "recompute-layernorm-te",
    "warning",
    "megatron.core.transformer.transformer_layer.TransformerLayer.__init__ ('layernorm' recomputes "
    "input_layernorm / pre_mlp_layernorm only where they are not IdentityOp; the Transformer Engine "
    "layer spec fuses them into linear_qkv and a dense linear_fc1, TELayerNormColumnParallelLinear)",
    "recompute.modules names 'layernorm' only where a norm is there to recompute",
)
def _layernorm_recompute_te(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    modules = list(rc.modules or [])
    if rc.granularity == "selective" and "layernorm" in modules and _te_dense_layers(ctx):
        fix = _without_module(modules, "layernorm")
        yield Finding("recompute.modules", "'layernorm' recomputes nothing on the Transformer Engine layers: they fuse "
                      "each norm into the linear after it (no norm output is kept to drop)",
                      fix.text() + ", or model.transformer_impl = 'local' (separate norms)", fix=fix)


@rule(
    "recompute-core-attn-te",
    "warning",
    "megatron-core TransformerConfig.recompute_modules ('core_attn' checkpoints the attention core; TE's "
    "fused DotProductAttention keeps only its output and log-sum-exp, no s x s scores: "
    "megatron-core warns); dlmspec.plan.memory (what it frees)",
    "on dense Transformer Engine layers selective recompute does not rely on 'core_attn' for memory",
)
def _core_attn_recompute_te(ctx: Context) -> Iterator[Finding]:
    rc = ctx.spec.recompute
    if rc.granularity != "selective" or not _te_dense_layers(ctx):
        return
    modules = list(rc.modules) if rc.modules is not None else ["core_attn"]  # megatron-core's default
    if "core_attn" not in modules:
        return
    rest = [m for m in modules if m != "core_attn"]
    fix = Fix({"recompute.modules": rest or ["mlp"]})
    yield Finding(
        "recompute.modules",
        ("'core_attn'" + (" (the default of recompute.modules)" if rc.modules is None else "")
         + " frees almost nothing on the Transformer Engine layers: their fused attention keeps no s x s "
         "scores, and its output is kept by linear_proj anyway; the backward runs attention's forward again"),
        fix.text() + (" (the MLP's activations are what selective recompute saves there)" if not rest else "")
        + ", or recompute.granularity = 'none' when memory allows",
        value=modules,
        fix=fix,
    )


@rule(
    "fp8-attention",
    "error",
    "megatron.core.fp8_utils.get_fp8_recipe (fp8_dpa reaches TE's DelayedScaling and Float8CurrentScaling "
    "recipes only)",
    "precision.fp8_dot_product_attention runs with fp8 and the delayed or tensorwise recipe",
)
def _fp8_attention(ctx: Context) -> Iterator[Finding]:
    p = ctx.spec.precision
    if not p.fp8_dot_product_attention:
        return
    if p.fp8 == "none":
        yield Finding("precision.fp8_dot_product_attention",
                      "fp8 attention needs fp8: precision.fp8 = 'none'",
                      "set precision.fp8 = 'hybrid', or fp8_dot_product_attention = false",
                      fix=Fix({"precision.fp8_dot_product_attention": False}))
    elif ctx.r.attention_mask != "causal":
        yield Finding("precision.fp8_dot_product_attention",
                      f"Transformer Engine 2.20.2 found no fp8 attention backend for {ctx.r.attention_mask} "
                      "attention on an H200 (both recipes stopped at the first step: 'No dot product attention "
                      "backend is available', bench/results/gpu_runs_h200_peers_te_matrix_sft_answers/te_matrix_te/te-fp8-dpa.log)",
                      "set precision.fp8_dot_product_attention = false (fp8 GEMMs stay on)",
                      fix=Fix({"precision.fp8_dot_product_attention": False}))
    elif p.fp8_recipe not in ("delayed", "tensorwise"):
        yield Finding("precision.fp8_dot_product_attention",
                      f"megatron-core passes fp8 attention to the delayed and tensorwise recipes only, and "
                      f"precision.fp8_recipe = {p.fp8_recipe!r}",
                      "set precision.fp8_recipe = 'tensorwise', or fp8_dot_product_attention = false",
                      fix=Fix({"precision.fp8_recipe": "tensorwise"}))
