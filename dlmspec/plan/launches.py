"""Host work of a training step, counted: kernel launches, calls of ``torch.compile``'d functions,
host-device synchronisations, parameter tensors and Megatron-FSDP's host operations, per
microbatch and per optimizer step on one pipeline rank.

:mod:`dlmspec.plan.time` turns the counts into host seconds (``Calibration.seconds_per_kernel``
and the other host constants). The counts come from ``bench/plan/count_kernels.py`` (the local
layers, on CPU), from megatron-core's source, and from the profiles in ``bench/results/``; the
story of each is in docs/planner-methods.md, *Time model*.
"""

from __future__ import annotations

from dlmspec.plan.memory import TORCH_FUSED_CE_CHUNK_ROWS, fsdp_sharding, stage_layer_counts
from dlmspec.plan.shape import Layout, ModelShape, input_length, norms_compiled, qkv_fused
from dlmspec.plan.moe_experts import expert_kernels

#: Kernels per transformer layer per microbatch, forward + backward. Local path: counted by
#: ``bench/plan/count_kernels.py`` on megatron-core's local layers (33 forward, 45 backward with
#: the 8 ``main_grad`` accumulations; fused RMSNorm, compiled SwiGLU, flash SDPA, unfused RoPE).
#: Transformer Engine fuses the norms into the GEMMs (~45, from profiler traces).
KERNELS_PER_LAYER = {"local+sdpa": 78, "transformer_engine": 45}
#: The forward share, launched again by full recomputation.
KERNELS_PER_LAYER_FORWARD = {"local+sdpa": 33, "transformer_engine": 18}
#: RoPE's share of the local layer's kernels (forward, backward) in :data:`KERNELS_PER_LAYER`:
#: megatron-core's unfused RoPE for q and k (counted by ``bench/plan/count_kernels.py``), and one
#: compiled Triton kernel per tensor and direction with ``[kernels] apply_rope_fusion`` (profiled:
#: ``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf_repeat.json``). None without rotary embeddings.
KERNELS_ROPE_UNFUSED = (20, 14)
KERNELS_ROPE_FUSED = (2, 2)
#: The local layer's copies between the QKV projection and attention that ``[kernels] qkv_fusion``
#: replaces (forward, backward): the query's reshape and the value's contiguous copy, the query
#: gradient's copy and the gradients' ``cat`` (profiled:
#: ``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf_repeat.json`` ``profile_mb10_one_microbatch``).
KERNELS_QKV_COPIES = (2, 2)
#: Kernels per norm (forward, backward): PyTorch's (``False``) and the ``torch.compile``'d norm
#: (``True``, ``kernels.compiled_norm``); the compiled backward's 4 (and the fused QKV function's
#: 12, :data:`KERNELS_QKV_FUSED`) are the one integer solution of the profiled total
#: (``bench/results/throughput_qwen3_1.7b_h200_reference_vs_hf_repeat.json``; derivation in docs/planner-methods.md).
KERNELS_NORM = {False: (1, 2), True: (1, 4)}
#: q/k norms per layer (Qwen3/OLMo2 ``qk_layernorm``): 2, one for queries and one for keys.
QK_NORMS = 2
#: The fused QKV function (forward, backward): one Triton kernel forward, 12 backward (see
#: :data:`KERNELS_NORM`).
KERNELS_QKV_FUSED = (1, 12)
#: ``torch.compile``'d functions the local path calls per layer and microbatch, each costing
#: ``Calibration.seconds_per_compiled_call`` of host time beside its kernels' launches: the fused
#: QKV function forward and backward (2), each compiled norm forward and backward (2 per norm),
#: fused RoPE for q and k forward and backward (4; not called when the QKV function applies RoPE).
COMPILED_CALLS_QKV = 2
COMPILED_CALLS_NORM = 2
COMPILED_CALLS_ROPE = 4
#: Extra kernels of a MoE layer over a dense one (router, aux loss, permute/unpermute, dispatcher
#: bookkeeping, minus the dense MLP: 108 - 78 counted) and per local expert (megatron-core
#: ``SequentialMLP`` runs each expert's fc1, activation and fc2 and their backward: 4 + 9 counted).
KERNELS_PER_MOE_LAYER = {"local+sdpa": 30, "transformer_engine": 40}
KERNELS_PER_LOCAL_EXPERT = {"local+sdpa": 13, "transformer_engine": 12}
#: Launches the ``alltoall`` dispatcher adds per MoE layer and microbatch at expert-parallel size
#: > 1 (megatron-core ``MoEAlltoAllTokenDispatcher``: the counts' all-gather, the all-to-alls,
#: the chunk sorts and their backward). Measured, not counted:
#: ``bench/results/profile_host_h200x2.json``; the TE path's value is the local one.
KERNELS_EP_DISPATCH = {"local+sdpa": 48, "transformer_engine": 48}
#: Kernels of selective recomputation per layer (``core_attn``: RNG state and the SDPA forward).
KERNELS_PER_SELECTIVE_LAYER = 4
#: Kernels per microbatch outside the layers: on every rank the objective's noising, the loss
#: and the batch's copies (the runtime prepares the batch on every pipeline rank: 25 counted);
#: on the first rank the embedding (5); on the last the final norm, output layer and cross
#: entropy (38; 43 counted outside the layers of a one-rank model).
KERNELS_PER_MICROBATCH = {"local+sdpa": 25, "transformer_engine": 15}
KERNELS_EMBEDDING = {"local+sdpa": 5, "transformer_engine": 5}
KERNELS_OUTPUT = {"local+sdpa": 38, "transformer_engine": 20}
#: Kernels per optimizer step: a fixed part (gradient zeroing, clipping, the DDP buffers) and,
#: on the local path, 5 per parameter tensor (megatron-core without Apex/TE loops over tensors:
#: ``local_multi_tensor_l2_norm``'s norm, ``local_multi_tensor_scale``'s mul and copy, the copy
#: of the updated parameter, foreach Adam's share); TE's fused multi-tensor kernels do not loop.
KERNELS_PER_STEP = {"local+sdpa": 50, "transformer_engine": 300}
KERNELS_PER_PARAM_TENSOR = {"local+sdpa": 5, "transformer_engine": 0}
#: Host-device syncs per MoE layer forward: the dispatcher's D2H copy of the token counts (both
#: paths) and, on the local path, the unfused permute's two ``masked_select`` (their output size).
SYNCS_PER_MOE_LAYER = {"local+sdpa": 3, "transformer_engine": 1}
#: Host-device syncs per step: the total grad norm, the logged grad norm and the exit-signal flag
#: (``backends/megatron/training.py``, ``train_step``, and ``signals.py``); DDP's ``check_for_nan_in_grad`` validates NaN and Inf of
#: each bucket's norm (two syncs per bucket, ``_ParamAndGradBucketGroup.check_grads``); on the
#: local path ``local_multi_tensor_l2_norm`` makes one per parameter tensor.
SYNCS_PER_STEP = 3
SYNCS_PER_BUCKET = 2

#: Megatron-FSDP's host operations, each costing ``Calibration.fsdp_seconds_per_op`` of host
#: time, counted from megatron-core 0.16.1's ``megatron_fsdp.py`` and ``param_and_grad_buffer.py``
#: (hook work, small kernels, allocations, stream waits, NCCL launches; which ones, in
#: docs/planner-methods.md): per microbatch and parameter tensor, per microbatch and bucket with sharded
#: weights (all-gathers) and with sharded gradients (reduce-scatters), per step and parameter
#: tensor, per step and bucket.
FSDP_OPS_PER_TENSOR = 5
FSDP_OPS_PER_BUCKET_GATHER = 12
FSDP_OPS_PER_BUCKET_REDUCE = 9
FSDP_STEP_OPS_PER_TENSOR = 4
FSDP_STEP_OPS_PER_BUCKET = 5


def layer_path(lay: Layout) -> str:
    """The layer path the launch counts are keyed by: ``"transformer_engine"`` or ``"local+sdpa"``."""
    return "transformer_engine" if lay.impl == "transformer_engine" else "local+sdpa"


def kernels_per_microbatch(shape: ModelShape, lay: Layout, counts: tuple[int, int], stage: int = 0) -> float:
    """Kernel launches of one microbatch on rank ``stage`` holding ``counts`` = (dense, MoE)
    layers: :data:`KERNELS_PER_LAYER` per layer, :data:`KERNELS_PER_MOE_LAYER`,
    :data:`KERNELS_PER_LOCAL_EXPERT` times the ``E/ep`` local experts and, at ``ep > 1``,
    :data:`KERNELS_EP_DISPATCH` per MoE layer, the
    recomputed forwards (full: the forward share of every recomputed layer; selective:
    :data:`KERNELS_PER_SELECTIVE_LAYER`), :data:`KERNELS_PER_MICROBATCH`, and the embedding
    (first rank) and output layer with the loss (last rank)."""
    dense_n, moe_n = counts
    path = layer_path(lay)
    layers = dense_n + moe_n
    per_layer, per_layer_fwd = layer_kernels(shape, lay)
    kernels = layers * per_layer
    experts = 0.0
    if moe_n:
        experts = expert_kernels(shape, lay, path, KERNELS_PER_LOCAL_EXPERT[path])  # grouped GEMM: plan/moe_experts.py
        dispatch = KERNELS_EP_DISPATCH[path] if lay.ep > 1 else 0
        kernels += moe_n * (KERNELS_PER_MOE_LAYER[path] + experts + dispatch)
    if lay.recompute == "full":
        # The recomputed forward launches the forward share of each recomputed layer's kernels.
        kernels += full_recompute_share(shape, lay) * per_layer_fwd / per_layer * kernels
    elif lay.recompute == "selective":
        kernels += layers * KERNELS_PER_SELECTIVE_LAYER
    kernels += KERNELS_PER_MICROBATCH[path]
    if stage == 0:
        kernels += KERNELS_EMBEDDING[path]
    if stage == lay.pp - 1:
        kernels += KERNELS_OUTPUT[path]
        if path == "local+sdpa":
            # The final norm, counted as PyTorch's in KERNELS_OUTPUT.
            kernels += sum(KERNELS_NORM[norms_compiled(lay)]) - sum(KERNELS_NORM[False])
        if lay.fused_linear_ce:
            kernels += fused_ce_kernels(shape, lay)
    return kernels


def optimizer_step_kernels(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> float:
    """Kernel launches of the optimizer step on rank ``stage``: :data:`KERNELS_PER_STEP` and
    :data:`KERNELS_PER_PARAM_TENSOR` per parameter tensor (:func:`param_tensors`)."""
    path = layer_path(lay)
    return KERNELS_PER_STEP[path] + KERNELS_PER_PARAM_TENSOR[path] * param_tensors(shape, lay, stage, counts)


def kernels_per_step(shape: ModelShape, lay: Layout, stage: int = 0) -> float:
    """Kernel launches of one training step on rank ``stage``: its microbatches
    (:func:`kernels_per_microbatch` x ``num_microbatches``) and the optimizer step
    (:func:`optimizer_step_kernels`). What a profile's launch count per step is compared with
    (``bench/plan/launch_counts.py``)."""
    counts = stage_layer_counts(shape, lay, stage)
    return (lay.num_microbatches * kernels_per_microbatch(shape, lay, counts, stage)
            + optimizer_step_kernels(shape, lay, stage, counts))


def full_recompute_share(shape: ModelShape, lay: Layout) -> float:
    """Share of a rank's layers whose forward full recomputation runs again: all with the
    ``uniform`` method, else ``recompute_num_layers`` per model chunk (megatron-core
    ``TransformerBlock._checkpointed_forward``, ``block``)."""
    if lay.recompute_method == "uniform":
        return 1.0
    chunks = lay.pp * max(1, lay.vpp)
    return min(1.0, lay.recompute_layers * chunks / shape.num_layers)


def layer_kernels(shape: ModelShape, lay: Layout) -> tuple[int, int]:
    """(forward + backward, forward) kernels of one dense layer per microbatch: the counted
    :data:`KERNELS_PER_LAYER` (megatron-core's split and copies, q/k RMSNorm, unfused RoPE,
    PyTorch's norms) with the layout's paths on the local path: RoPE unfused
    (:data:`KERNELS_ROPE_UNFUSED`), fused (:data:`KERNELS_ROPE_FUSED`) or none; q/k norms only
    with ``qk_norm``; the norms PyTorch's or compiled (:data:`KERNELS_NORM`); with the fused QKV
    function (:func:`~dlmspec.plan.shape.qkv_fused`) :data:`KERNELS_QKV_FUSED` in place of the
    copies (:data:`KERNELS_QKV_COPIES`), the q/k norms and RoPE."""
    path = layer_path(lay)
    total, forward = KERNELS_PER_LAYER[path], KERNELS_PER_LAYER_FORWARD[path]
    if path != "local+sdpa":
        return total, forward
    eager = KERNELS_NORM[False]
    # What every local layer launches besides the parts below.
    total -= sum(KERNELS_ROPE_UNFUSED) + sum(KERNELS_QKV_COPIES) + (2 + QK_NORMS) * sum(eager)
    forward -= KERNELS_ROPE_UNFUSED[0] + KERNELS_QKV_COPIES[0] + (2 + QK_NORMS) * eager[0]
    norm = KERNELS_NORM[norms_compiled(lay)]
    total += 2 * sum(norm)
    forward += 2 * norm[0]
    if qkv_fused(shape, lay):
        return total + sum(KERNELS_QKV_FUSED), forward + KERNELS_QKV_FUSED[0]
    total += sum(KERNELS_QKV_COPIES)
    forward += KERNELS_QKV_COPIES[0]
    if shape.qk_norm:
        total += QK_NORMS * sum(norm)
        forward += QK_NORMS * norm[0]
    if shape.rope:
        rope = KERNELS_ROPE_FUSED if lay.rope_fusion else KERNELS_ROPE_UNFUSED
        total += sum(rope)
        forward += rope[0]
    return total, forward


def layer_compiled_calls(shape: ModelShape, lay: Layout) -> tuple[int, int]:
    """(forward + backward, forward) calls of dlmspec's ``torch.compile``'d functions per layer
    and microbatch (:data:`COMPILED_CALLS_QKV`, ``_NORM``, ``_ROPE``): 0 on the TE path."""
    if lay.impl == "transformer_engine":
        return 0, 0
    calls = 0
    fused = qkv_fused(shape, lay)
    if fused:
        calls += COMPILED_CALLS_QKV
    elif shape.rope and lay.rope_fusion:
        calls += COMPILED_CALLS_ROPE
    if norms_compiled(lay):
        calls += COMPILED_CALLS_NORM * (2 + (QK_NORMS if shape.qk_norm and not fused else 0))
    return calls, calls // 2


def compiled_calls_per_microbatch(shape: ModelShape, lay: Layout, counts: tuple[int, int], stage: int = 0) -> float:
    """Calls of ``torch.compile``'d functions of one microbatch on rank ``stage``: per layer
    :func:`layer_compiled_calls` (the recomputed forwards again, as for kernels), the final
    norm's on the last rank."""
    per_layer, forward = layer_compiled_calls(shape, lay)
    layers = counts[0] + counts[1]
    calls = float(layers * per_layer)
    if lay.recompute == "full" and per_layer:
        calls += full_recompute_share(shape, lay) * layers * forward
    if stage == lay.pp - 1 and norms_compiled(lay):
        calls += COMPILED_CALLS_NORM
    return calls


def fused_ce_kernels(shape: ModelShape, lay: Layout) -> float:
    """Kernel launches of the fused linear cross entropy's chunk loop, per microbatch.

    Liger sizes its chunks so that there are about ``ceil(V / h)`` of them whatever the rows
    (``liger_kernel.ops.fused_linear_cross_entropy``: ``chunk = next_pow2(ceil(BT / ceil(V /
    h)))``), each launching about 8 kernels over forward and the recomputing backward; the
    PyTorch implementation runs ``ceil(rows / 4096)`` chunks of about 15 kernels. Their host cost
    is ``Calibration.seconds_per_fused_ce_kernel`` each (:func:`dlmspec.plan.time.host_seconds`): the loop's plain
    torch calls and Triton launches run inside one ``autograd.Function``, without megatron-core's
    modules around them.

    The rows are those the projection takes, the loss-carrying ones (:func:`fused_ce_rows`)."""
    if lay.fused_linear_backend == "torch":
        return 15 * -(-fused_ce_rows(shape, lay) // TORCH_FUSED_CE_CHUNK_ROWS)
    return 8 * -(-shape.vocab // shape.hidden)


def fused_ce_rows(shape: ModelShape, lay: Layout) -> float:
    """Rows of one micro-batch the fused linear cross entropy projects on one rank: those with a
    non-zero loss weight (``backends/megatron/output_loss.py`` ``linear_cross_entropy`` selects them),
    ``loss_row_fraction * micro_batch * input_length / cp``. ``loss_row_fraction`` is the objective's
    share of the input positions that carry loss (:attr:`~dlmspec.plan.shape.ModelShape.loss_row_fraction`,
    the share :mod:`dlmspec.plan.time` and :mod:`dlmspec.plan.elementwise` take of the same
    positions): block diffusion's masked ``x_t`` tokens are about ``(low + high) / 2`` of ``L``, a
    quarter of its ``2 L`` input (``+ L - 1`` AR rows of ``x_0`` with an AR loss), so the rows are
    counted over the input length, not over ``train.seq_length``.

    Example: the demo BD3-LM spec (micro batch 32, ``L = 512``, ``t ~ U(0.001, 1)``):
    ``0.25025 * 32 * 1024 = 8200`` rows, three PyTorch chunks of 4096."""
    return shape.loss_row_fraction * lay.micro_batch * input_length(shape, lay) / lay.cp


def syncs_per_microbatch(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> float:
    """Host-device synchronisations of one microbatch on rank ``stage``: :data:`SYNCS_PER_MOE_LAYER`
    per MoE layer, the pipeline's ``torch.cuda.synchronize()`` after each batched p2p exchange
    (megatron-core ``batch_p2p_sync``: the first and last rank exchange once per microbatch, the
    others twice; interleaving exchanges once per chunk and direction) and MDM's
    variable-length draw (``bool(truncate.any())`` in ``backends/megatron/objective.py``) and, on
    the last rank, the fused linear cross entropy's row selection."""
    syncs = counts[1] * SYNCS_PER_MOE_LAYER[layer_path(lay)]
    if lay.pp > 1:
        if lay.vpp > 1:
            syncs += 2 * lay.vpp
        else:
            syncs += 1 if stage in (0, lay.pp - 1) else 2
    if shape.variable_length_prob > 0:  # the objective's cut: one host sync
        syncs += 1
    if stage == lay.pp - 1 and lay.fused_linear_ce:
        syncs += 1  # the fused linear cross entropy's row selection (``nonzero``)
    return syncs


def param_tensors(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> int:
    """Parameter tensors (not elements) rank ``stage`` holds: per layer the QKV, projection, fc1
    and fc2 weights (and their biases), two norms (LayerNorm: weight and bias), q/k norms; per
    MoE layer the router and two weights per local expert (and the shared expert); the word
    (and position) embedding on the first rank, the final norm and output layer on the last."""
    dense_n, moe_n = counts
    norm = 2 if shape.layernorm else 1
    bias = 1 if shape.mlp_repl else 0
    attn = 2 + 2 * bias + 2 * norm + (2 * norm if shape.qk_norm else 0)
    mlp = 2 + 2 * bias
    n = dense_n * (attn + mlp)
    if moe_n:
        n += moe_n * (attn + 1 + (shape.num_experts / lay.ep) * mlp + (mlp if shape.shared_ffn else 0))
    if stage == 0:
        n += 1 + (1 if shape.learned_positions else 0)
    if stage == lay.pp - 1:
        n += norm + (0 if (shape.tied and lay.pp == 1) else 1)
    return int(round(n))


def fsdp_buckets(counts: tuple[int, int]) -> int:
    """Megatron-FSDP parameter groups (buckets) on a rank holding ``counts`` layers: one per
    ``TransformerLayer`` FSDP unit (two for a MoE layer: expert parameters form groups of their
    own), plus one for the parameters outside the units (embedding, final norm, output layer;
    megatron-core 0.16.1 ``_get_parameter_groups`` groups them by dtype, expert flag and unit)."""
    dense_n, moe_n = counts
    return dense_n + 2 * moe_n + 1


def fsdp_host_ops(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> tuple[float, float]:
    """(per microbatch, per step) host operations Megatron-FSDP adds on rank ``stage``
    (:data:`FSDP_OPS_PER_TENSOR` and the other ``FSDP_*`` counts, from megatron-core 0.16.1's
    source): per microbatch ``5 * tensors + (12 if weights sharded) * buckets + (9 if gradients
    sharded) * buckets``, per step ``4 * tensors + 5 * buckets`` (+ the reduce-scatters once, on
    the last microbatch, when gradients are not sharded). 0 without Megatron-FSDP; torch FSDP2's
    host work is not modelled."""
    if lay.fsdp != "megatron":
        return 0.0, 0.0
    weights, grads, _ = fsdp_sharding(lay)
    tensors = param_tensors(shape, lay, stage, counts)
    buckets = fsdp_buckets(counts)
    per_mb = FSDP_OPS_PER_TENSOR * tensors + buckets * ((FSDP_OPS_PER_BUCKET_GATHER if weights else 0)
                                                        + (FSDP_OPS_PER_BUCKET_REDUCE if grads else 0))
    per_step = FSDP_STEP_OPS_PER_TENSOR * tensors + FSDP_STEP_OPS_PER_BUCKET * buckets
    if not grads:
        per_step += FSDP_OPS_PER_BUCKET_REDUCE * buckets
    return float(per_mb), float(per_step)
