"""What the bundled runtime (``backends/megatron``) cannot run yet, and an end-of-document id it
cannot tell: scope ``runtime``. ``validate`` reports these and ``compile`` refuses them, so no
spec compiles into a train.py that stops at start-up (or silently trains something else)."""

from __future__ import annotations

import posixpath
from typing import Iterator

from dlmspec import objectives
from dlmspec.attention import refused_kinds
from dlmspec.check.hints import with_layout
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.resolve import eod_used_by, run_dir


@rule(
    "eod-id-unknown",
    "error",
    "dlmspec.backends.megatron.data.DataConfig.eod_id",
    "the end-of-document id is known when the run reads it (data.tokenizer.eod_id, or a tokenizer whose "
    "files give it)",
    scope="runtime",
)
def _eod_unknown(ctx: Context) -> Iterator[Finding]:
    eod = ctx.r.eod
    if eod.known:
        return
    used = eod_used_by(ctx.spec)
    tok = ctx.spec.data.tokenizer
    what = f"{tok.type}" + (f" {tok.model!r}" if tok.model else "")
    yield Finding(
        "data.tokenizer.eod_id",
        f"the end-of-document id of {what} cannot be read at compile time"
        + (f", and {', '.join(used)} reads it" if used else
           f"; nothing in this run reads it, so train.py carries {eod.value} (vocab_size - 1) in its place"),
        "set data.tokenizer.eod_id to the id `dlmspec data prepare --append-eod` appended "
        "(the tokenizer's EOS/EOD token)",
        value=None,
        severity="error" if used else "warning",
    )


# --------------------------------------------------------------------------------------------
# Stages and features the runtime does not implement: refused, never silently compiled.


@rule(
    "runtime-async-save",
    "error",
    "backends/megatron/checkpointing.py (synchronous megatron-core dist_checkpointing saves only)",
    "checkpoint.async_save is false",
    scope="runtime",
    fix="set checkpoint.async_save = false",
    fix_keys=Fix({"checkpoint.async_save": False}),
)
def _async_save(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.checkpoint.async_save:
        yield Finding("checkpoint.async_save", "asynchronous checkpoint saving is not implemented by the runtime")


#: The fix of runtime-torch-fsdp: Megatron-FSDP with full sharding.
_TORCH_FSDP_FIX = ("set parallel.fsdp = \"megatron\" (megatron-core's Megatron-FSDP; data_parallel_sharding_strategy = "
                   "\"optim_grads_params\" shards weights, gradients and optimizer state like FSDP2)")


@rule(
    "runtime-torch-fsdp",
    "error",
    "backends/megatron (megatron-core TorchFullyShardedDataParallel is not wired in: it averages gradients, the "
    "runtime's per-token loss needs them summed, and megatron-core 0.16.1 cannot checkpoint it for a resume)",
    "parallel.fsdp is not 'torch'",
    scope="runtime",
    fix=_TORCH_FSDP_FIX,
)
def _torch_fsdp(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.fsdp == "torch":
        p = ctx.spec.parallel
        change: dict = {"parallel.fsdp": "megatron", "parallel.data_parallel_sharding_strategy": "optim_grads_params"}
        also = {}  # what Megatron-FSDP needs besides (runtime-fsdp-distributed-optimizer, runtime-fsdp-fused-ce)
        if not p.use_distributed_optimizer:
            also["parallel.use_distributed_optimizer"] = True
        if ctx.spec.kernels.cross_entropy == "fused_linear":  # "auto" takes megatron's under Megatron-FSDP
            also["kernels.cross_entropy"] = "megatron"
        yield Finding(
            "parallel.fsdp",
            "torch FSDP2 (megatron-core's TorchFullyShardedDataParallel) is not wired into the runtime: it averages "
            "gradients over data parallelism where the runtime's per-token loss (calculate_per_token_loss) needs "
            "them summed, and megatron-core 0.16.1 has no checkpoint path for it that the runtime could resume from",
            f"{_TORCH_FSDP_FIX}, and {Fix(also).text()}" if also else None,
            fix=Fix({**change, **also}),
        )


# Megatron-FSDP (backends/megatron/fsdp.py, fsdp_problems): what megatron-core 0.16.1's
# FullyShardedDataParallel and the runtime need besides CUDA and einops.


@rule(
    "runtime-fsdp-distributed-optimizer",
    "error",
    "backends/megatron/fsdp.py (megatron-core FullyShardedDataParallel keeps the fp32 main weights in its "
    "sharded buffers, which only DistributedOptimizer steps)",
    "Megatron-FSDP comes with the distributed optimizer",
    scope="runtime",
    fix="set parallel.use_distributed_optimizer = true",
    fix_keys=Fix({"parallel.use_distributed_optimizer": True}),
)
def _fsdp_distopt(ctx: Context) -> Iterator[Finding]:
    p = ctx.spec.parallel
    if p.fsdp == "megatron" and not p.use_distributed_optimizer:
        yield Finding("parallel.use_distributed_optimizer", "Megatron-FSDP keeps the fp32 main weights in its own "
                      "sharded buffers, which only megatron-core's DistributedOptimizer steps")


@rule(
    "runtime-fsdp-pipeline",
    "error",
    "backends/megatron/fsdp.py (Megatron-FSDP wraps one model chunk per rank)",
    "Megatron-FSDP runs without pipeline parallelism",
    scope="runtime",
    fix="set parallel.pipeline_model_parallel_size = 1, or parallel.fsdp = \"none\"",
)
def _fsdp_pipeline(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.fsdp == "megatron" and ctx.r.pp > 1:
        change = {"parallel.pipeline_model_parallel_size": 1}
        if ctx.r.vpp is not None:  # vpp-needs-pp
            change["parallel.virtual_pipeline_model_parallel_size"] = None
        fix = with_layout(ctx, Fix({k: v for k, v in change.items() if v is not None},
                                   tuple(k for k, v in change.items() if v is None)))
        yield Finding("parallel.pipeline_model_parallel_size", "Megatron-FSDP is wired for one model chunk per rank; "
                      "the runtime does not combine it with pipeline parallelism",
                      None if fix.set == {"parallel.pipeline_model_parallel_size": 1} and not fix.unset
                      else fix.text() + ', or set parallel.fsdp = "none"', fix=fix)


@rule(
    "runtime-fsdp-fused-ce",
    "error",
    "backends/megatron/output_loss.py (the fused linear cross entropy reads the output weight outside the "
    "forward; Megatron-FSDP gathers sharded weights only inside it)",
    "Megatron-FSDP runs with megatron's cross entropy",
    scope="runtime",
    fix="set kernels.cross_entropy = \"megatron\"",
    fix_keys=Fix({"kernels.cross_entropy": "megatron"}),
)
def _fsdp_fused_ce(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.fsdp == "megatron" and ctx.r.cross_entropy == "fused_linear":
        yield Finding("kernels.cross_entropy", "the fused linear cross entropy uses the output weight outside the "
                      "model's forward, and Megatron-FSDP gathers its sharded weights only inside it")


@rule(
    "runtime-fsdp-init-from",
    "error",
    "backends/megatron/init_from.py (loads weights into unsharded parameters)",
    "Megatron-FSDP runs start without checkpoint.init_from",
    scope="runtime",
    fix="remove checkpoint.init_from, or set parallel.fsdp = \"none\"",
    fix_keys=Fix(unset=("checkpoint.init_from",)),
)
def _fsdp_init_from(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.fsdp == "megatron" and ctx.spec.checkpoint.init_from is not None:
        yield Finding("checkpoint.init_from", "checkpoint.init_from loads weights into unsharded parameters; "
                      "Megatron-FSDP's are sharded DTensors")


@rule(
    "runtime-fsdp-fp8",
    "error",
    "backends/megatron/fsdp.py (no fp8 parameter gathers with Megatron-FSDP)",
    "Megatron-FSDP runs without fp8",
    scope="runtime",
    fix="set precision.fp8 = \"none\", or parallel.fsdp = \"none\"",
    fix_keys=Fix({"precision.fp8": "none"}),
)
def _fsdp_fp8(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.parallel.fsdp == "megatron" and ctx.spec.precision.fp8 != "none":
        yield Finding("precision.fp8", "fp8 with Megatron-FSDP (fp8 parameter gathers, Transformer Engine) is not "
                      "wired into the runtime")


@rule(
    "runtime-tensorboard-dir",
    "error",
    "backends/megatron/metrics.py (TensorBoard events go to <LoggingConfig.run_dir>/tensorboard)",
    "logging.tensorboard_dir is unset or <logging.run_dir>/tensorboard",
    scope="runtime",
    fix="set logging.tensorboard_dir to logging.run_dir + \"/tensorboard\" (run_dir defaults to runs/<name>)",
)
def _tensorboard_dir(ctx: Context) -> Iterator[Finding]:
    tb = ctx.spec.logging.tensorboard_dir
    want = posixpath.join(posixpath.normpath(run_dir(ctx.r)), "tensorboard")
    if tb is not None and posixpath.normpath(tb) != want:
        fix = Fix({"logging.tensorboard_dir": want})
        yield Finding("logging.tensorboard_dir", "the runtime writes TensorBoard events to <logging.run_dir>/tensorboard, "
                      "not to another directory", f"{fix.text()} (logging.run_dir + \"/tensorboard\"; run_dir "
                      "defaults to runs/<name>)", fix=fix)


# The layer path (resolve.layer_path: auto takes the one the features need; these are the
# features an explicit model.transformer_impl cannot run).


@rule(
    "runtime-grouped-gemm-local",
    "error",
    "backends/megatron/layers.py build_layer_spec (grouped-GEMM experts are Transformer Engine modules)",
    "grouped-GEMM experts run on Transformer Engine layers",
    scope="runtime",
    fix="set model.moe_grouped_gemm = false, or model.transformer_impl = \"transformer_engine\" (without the "
    "features that need the local layers: document masks, block-causal attention)",
    fix_keys=Fix({"model.moe_grouped_gemm": False}),
)
def _grouped_gemm_local(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.model.moe_grouped_gemm and ctx.r.transformer_impl == "local":
        yield Finding("model.moe_grouped_gemm", "grouped-GEMM experts need Transformer Engine, and the layers are local")


@rule(
    "runtime-block-causal-te",
    "error",
    "backends/megatron/layers.py (block-causal attention is built on the local + SDPA path only)",
    "block-causal attention runs on the local layers",
    scope="runtime",
    fix="set model.transformer_impl = \"auto\" or \"local\"",
    fix_keys=Fix({"model.transformer_impl": "auto"}),
)
def _block_causal_te(ctx: Context) -> Iterator[Finding]:
    if ctx.r.transformer_impl == "transformer_engine" and "block_causal" in refused_kinds("te", [ctx.r.attention_mask]):
        yield Finding("objective.attention_mask", "block-causal attention is implemented on the local + SDPA path "
                      "only (backends/megatron/layers.py), not with Transformer Engine layers")


@rule(
    "runtime-variable-length-pipeline",
    "error",
    "backends/megatron/checks.py check_loss_normalization (megatron-core's pipeline schedule sends activations "
    "of seq_length positions between stages; a cut micro-batch is shorter)",
    "a micro-batch cut runs without pipeline parallelism",
    scope="runtime",
    fix="set objective.variable_length = \"sequence\" (each sequence cut alone, behind a key-padding mask), or "
    "parallel.pipeline_model_parallel_size = 1",
    fix_keys=Fix({"objective.variable_length": "sequence"}),
)
def _variable_length_pipeline(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if objectives.get(o.kind).micro_batch_variable_length_prob(o) > 0 and ctx.r.pp > 1:
        yield Finding("objective.variable_length", f"a micro-batch cut to a random length with pipeline parallelism "
                      f"(pipeline_model_parallel_size = {ctx.r.pp}): the stages exchange activations of seq_length "
                      "positions, so the runtime refuses it at start-up")


@rule(
    "runtime-document-mask-te",
    "error",
    "backends/megatron/checks.py check_masks_supported (the Transformer Engine layers take a key-padding mask "
    "only, as TE's padding mask type; a document mask is per query)",
    "document masks run on the local layers",
    scope="runtime",
    fix="set model.transformer_impl = \"auto\" or \"local\", or data.reset_attention_mask = false",
    fix_keys=Fix({"model.transformer_impl": "auto"}),
)
def _document_mask_te(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.data.reset_attention_mask and ctx.r.transformer_impl == "transformer_engine" and refused_kinds(
            "te", ["document"]):
        yield Finding("data.reset_attention_mask", "a document mask is per query ([b, 1, s, s]), no key-padding mask "
                      "[b, 1, 1, s], and the Transformer Engine layers take no other: the runtime refuses it at "
                      "start-up (backends/megatron/checks.py check_masks_supported)")


@rule(
    "runtime-gradient-accumulation-fusion",
    "error",
    "megatron-core tensor_parallel/layers.py ColumnParallelLinear.__init__ (raises when "
    "gradient_accumulation_fusion is on and APEX's fused_weight_gradient_mlp_cuda does not import; "
    "extensions/transformer_engine.py passes it to TE's linears as fuse_wgrad_accumulation)",
    "kernels.gradient_accumulation_fusion = true runs on the Transformer Engine path",
    scope="runtime",
    fix='set kernels.gradient_accumulation_fusion = "auto" (on with Transformer Engine linears when APEX '
    'imports, else off), or model.transformer_impl = "transformer_engine"',
    fix_keys=Fix({"kernels.gradient_accumulation_fusion": "auto"}),
)
def _gradient_accumulation_fusion_local(ctx: Context) -> Iterator[Finding]:
    """train.py turns the fusion on in Transformer Engine linears (each fuses the weight gradient's
    accumulation into its GEMM), and in GPTModel's output layer, a ColumnParallelLinear, only when
    APEX imports. On the local layers every linear would be megatron-core's own, each needing
    APEX's kernel, a path the runtime neither installs nor tests; with true, train.py exits 2
    there."""
    if ctx.spec.kernels.gradient_accumulation_fusion is True and ctx.r.transformer_impl == "local":
        yield Finding("kernels.gradient_accumulation_fusion",
                      "gradient-accumulation fusion is enabled with Transformer Engine linears only, and "
                      f"the layers are local ({ctx.r.transformer_impl_reason})")
