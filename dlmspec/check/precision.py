"""Rules of numeric precision: fp8 (Transformer Engine layers, GPUs with fp8 tensor cores,
recipes) and float settings the GPU computes with in float32."""

from __future__ import annotations

from typing import Iterator

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
        yield Finding(
            "recompute.modules",
            f"recomputing {' and '.join(repr(m) for m in modules)} is not supported with delayed fp8 scaling",
            "use precision.fp8_recipe = 'tensorwise' (Transformer Engine >= 2.6), or drop "
            f"{' and '.join(repr(m) for m in modules)} from recompute.modules",
            fix=Fix({"precision.fp8_recipe": "tensorwise"}),
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
