"""Step time of a training run: compute, element-wise memory traffic, launches and exposed
communication, from the GPU catalog (:mod:`dlmspec.gpus`) and :class:`Calibration`.

Per pipeline rank and microbatch (the slowest rank sets the pace):

* GEMMs: ``3 *`` forward FLOPs (plus recomputed forwards) on the rank, at
  ``peak * gemm_efficiency`` (fp8 GEMMs at the fp8 peak); the attention core at
  ``peak * attention_efficiency``. Per-rank FLOPs: attention and MLP GEMMs split over TP, the
  sequence over CP, experts' token-GEMMs over EP x expert TP (:func:`dlmspec.plan.memory.expert_tokens`).
* element-wise kernels (norms, residual adds, RoPE, activation, cross entropy, the embedding
  gradient, weight-gradient accumulation): bytes read + written (:func:`elementwise_bytes`) at
  ``hbm * memory_efficiency``;
* kernel launches: :func:`kernels_per_microbatch` times ``seconds_per_kernel``;
* TP collectives (sequence parallel: all-gather + reduce-scatter of ``y*T*h`` bytes, twice per
  layer forward and twice backward; without SP, all-reduces of the same total volume): ring
  cost ``bytes*(t-1)/t / bandwidth``, exposed (megatron-core does not overlap them by default);
  EP all-to-all (dispatch and combine, forward and backward); CP ring exchange of K/V
  (overlapped with the attention of the previous chunk; only the excess is exposed).

Per step: ``(m + (pp-1)/vpp)`` microbatch times (the 1F1B/interleaved schedule's bubble of
``(pp-1)/(m*vpp)``, Narayanan et al. 2021 eq. (1)/sec. 2.2.2), the data-parallel gradient
reduce-scatter (all-reduce without the distributed optimizer) and parameter all-gather - hidden
behind backward/forward with ``overlap_grad_reduce``/``overlap_param_gather`` except
``dp_overlap_exposed_fraction`` of it - the optimizer's memory traffic and a fixed overhead.

Bandwidths: NVLink (``GPU.nvlink_gbps``, GB/s per direction) inside a node, the network
(``cluster.inter_node_gbps``, Gbit/s per GPU) for groups that span nodes; megatron's rank order
``tp-cp-ep-dp-pp`` decides which groups do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlmspec.gpus import GPU
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, Calibration
from dlmspec.plan.compute import FlopCounts, attended_keys, recompute_fraction, step_flops
from dlmspec.plan.memory import expert_tokens, linear_params, stage_layer_counts, stage_params
from dlmspec.plan.shape import DTYPE_BYTES, Layout, ModelShape

#: Time breakdown keys, in report order (``step_seconds`` is their sum).
TIME_TERMS = (
    "gemm",
    "attention",
    "elementwise",
    "kernel_launch",
    "tp_communication",
    "ep_communication",
    "cp_communication",
    "pipeline_bubble",
    "dp_communication",
    "optimizer",
    "step_overhead",
)

#: Kernels per transformer layer per microbatch, forward + backward (counted from the
#: profiler traces of megatron-core layers: ~25 forward and ~45 backward on the local path with
#: unfused RoPE and norms; Transformer Engine fuses norms into GEMMs).
KERNELS_PER_LAYER = {"local+sdpa": 70, "transformer_engine": 45}
#: Extra kernels per MoE layer (router, permute, all-to-all, unpermute) and per local expert
#: (megatron-core ``SequentialMLP`` runs each expert's two GEMMs and activation).
KERNELS_PER_MOE_LAYER = 40
KERNELS_PER_LOCAL_EXPERT = 12
#: Kernels per microbatch outside the layers (embedding, final norm, logits, loss) and per step
#: (gradient zeroing, norm, clipping, optimizer - multi-tensor kernels over chunks of tensors).
KERNELS_PER_MICROBATCH = 40
KERNELS_PER_STEP = 300

#: Bytes the cross entropy reads and writes per logit element (megatron-core
#: ``vocab_parallel_cross_entropy``): forward ``.float()`` 2+4, max 4, subtract 4+4, exp 4+4,
#: sum 4, normalise 4+4; backward scale 4+4, cast to bf16 4+2.
CE_BYTES_PER_LOGIT = 52
#: Optimizer bytes per owned parameter and step: fused Adam reads master, grad, m, v and
#: writes master, m, v (4 bytes each) and the bf16 parameter (2): 30. torch's foreach AdamW makes
#: ~9 passes (lerp, mul, addcmul, sqrt, div, add, addcdiv, weight decay, copy): ~86.
OPTIMIZER_BYTES = {"transformer_engine": 30, "local+sdpa": 86}


@dataclass(frozen=True)
class StageWork:
    """One pipeline rank's work per microbatch, at 100% of every peak.

    Attributes:
        stage: pipeline rank.
        gemm_seconds: GEMM FLOPs / peak.
        attention_seconds: attention-core FLOPs / peak.
        elementwise_seconds: element-wise bytes / HBM bandwidth.
        kernels: kernel launches.
        tp_seconds, ep_seconds: collective bytes / NVLink-or-network bandwidth (100%).
        tp_network, ep_network: whether those groups cross nodes.
        cp_comm_seconds: K/V ring exchange bytes / bandwidth (100%), forward + backward.
    """

    stage: int
    gemm_seconds: float
    attention_seconds: float
    elementwise_seconds: float
    kernels: float
    tp_seconds: float
    ep_seconds: float
    tp_network: bool
    ep_network: bool
    cp_comm_seconds: float
    cp_network: bool


def _peaks(gpu: GPU, lay: Layout) -> tuple[float, float]:
    """(GEMM peak, attention peak) in FLOP/s: bf16/fp16 tensor-core peak; fp8 GEMMs at the fp8
    peak (attention stays bf16); fp32 at the plain fp32 peak (PyTorch leaves TF32 off for
    matmuls by default)."""
    if lay.dtype == "fp32":
        return gpu.fp32_tflops * 1e12, gpu.fp32_tflops * 1e12
    gemm = gpu.fp8_tflops if (lay.fp8 and gpu.fp8_tflops) else gpu.bf16_tflops
    return gemm * 1e12, gpu.bf16_tflops * 1e12


def mfu_peak_flops(gpu: GPU, dtype: str) -> float:
    """Peak FLOP/s MFU divides by: the dense bf16 peak (also for fp8 runs, the usual
    convention), the fp32 peak for fp32 runs."""
    return (gpu.fp32_tflops if dtype == "fp32" else gpu.bf16_tflops) * 1e12


def _bandwidth(gpu: GPU, lay: Layout, span: int, calib: Calibration, *, raw: bool = False) -> tuple[float, bool]:
    """(bytes/s, crosses nodes) for a group whose ranks spread over ``span`` consecutive ranks."""
    if span <= lay.gpus_per_node:
        return gpu.nvlink_gbps * 1e9 * (1.0 if raw else calib.nvlink_efficiency), False
    return lay.inter_node_gbps / 8 * 1e9 * (1.0 if raw else calib.network_efficiency), True


def elementwise_bytes(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> float:
    """Bytes the element-wise kernels of one microbatch read and write on rank ``stage``
    (forward + backward), counted per kernel as reads + writes of its operands:
    RMSNorm/LayerNorm 5 (forward read/write, backward read x, dy, write dx) per element, two
    per layer; residual adds 6 (two per layer); RoPE 12 and q/k norm 5 per q/k element; the
    fused SwiGLU 8 (GELU 5) per ``f`` element; dropout 10 per element
    with dropout; MoE permute/unpermute 8 per routed token copy; the local path's weight-
    gradient accumulation into ``main_grad`` (bf16 gradient written and read, fp32 read and
    written: ``2y + 8`` per weight); the embedding's dense gradient (``2y + 8`` per entry); the
    cross entropy :data:`CE_BYTES_PER_LOGIT` per logit.
    """
    dense_n, moe_n = counts
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * lay.seq / lay.cp
    local = lay.impl != "transformer_engine"
    per_tok = (10 * h + 12 * h) * y / r
    if shape.rope:
        per_tok += 12 * (a + g) * d * y / t
    if shape.qk_norm:
        per_tok += 5 * (a + g) * d * y / t
    if shape.hidden_dropout > 0:
        per_tok += 20 * h * y / r
    act = 8 if shape.gated else 5
    dense_tok = per_tok + act * shape.ffn * y / t
    layers = dense_n * dense_tok * T
    if moe_n:
        N = expert_tokens(shape, lay)
        moe_bytes = per_tok * T + act * shape.expert_ffn * y / lay.etp * N + 8 * N * h * y
        if shape.shared_ffn:
            moe_bytes += act * shape.shared_ffn * y / t * T
        layers += moe_n * moe_bytes
    total = layers
    if local:
        total += (2 * y + 8) * linear_params(shape, lay, counts)
    V = shape.vocab / t
    if stage == 0:
        total += 2 * h * y * T + (2 * y + 8) * V * h
    if stage == lay.pp - 1:
        total += CE_BYTES_PER_LOGIT * T * V + 5 * h * y * T / r
        if local:
            total += (2 * y + 8) * V * h
    return total


def kernels_per_microbatch(shape: ModelShape, lay: Layout, counts: tuple[int, int]) -> float:
    """Kernel launches of one microbatch on a rank (:data:`KERNELS_PER_LAYER` and friends)."""
    dense_n, moe_n = counts
    per_layer = KERNELS_PER_LAYER["transformer_engine" if lay.impl == "transformer_engine" else "local+sdpa"]
    extra = 0.0
    if moe_n:
        local_experts = shape.num_experts / lay.ep
        extra = moe_n * (KERNELS_PER_MOE_LAYER + KERNELS_PER_LOCAL_EXPERT * local_experts)
    recompute = 0.5 if lay.recompute == "full" else 0.0
    return (dense_n + moe_n) * per_layer * (1 + recompute) + extra + KERNELS_PER_MICROBATCH


def stage_work(shape: ModelShape, lay: Layout, gpu: GPU, stage: int, calib: Calibration) -> StageWork:
    """:class:`StageWork` of rank ``stage`` (per microbatch)."""
    counts = stage_layer_counts(shape, lay, stage)
    dense_n, moe_n = counts
    layers = dense_n + moe_n
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * lay.seq / lay.cp
    gemm_peak, attn_peak = _peaks(gpu, lay)
    frac = recompute_fraction(shape, lay)
    gate = 3 if shape.gated else 2
    # Forward FLOPs per token of one layer, per rank.
    attn_linear = (2 * h * (a + 2 * g) * d + 2 * a * d * h) / t
    keys = attended_keys(lay.seq, "bidirectional" if shape.attention == "block_causal" else shape.attention,
                         shape.block_size or None)
    attn_core = 4 * a * d * keys / t
    mlp = gate * 2 * h * shape.ffn / t
    gemm_tok = layers * attn_linear * (3 + frac["attention_linear"]) + dense_n * mlp * (3 + frac["mlp"])
    gemm = gemm_tok * T
    if moe_n:
        N = expert_tokens(shape, lay)
        moe_fwd = N * gate * 2 * h * shape.expert_ffn / lay.etp + T / r * 2 * h * shape.num_experts
        if shape.shared_ffn:
            moe_fwd += T * gate * 2 * h * shape.shared_ffn / t
        gemm += moe_n * moe_fwd * (3 + frac["moe"])
    if stage == lay.pp - 1:
        gemm += 3 * 2 * h * shape.vocab / t * T
    attention = layers * attn_core * (3 + frac["attention_core"]) * T
    ew = elementwise_bytes(shape, lay, stage, counts)
    # TP collectives: 4 per layer forward + 4 backward of the gathered [T, h] (same volume as
    # 2 + 2 all-reduces without SP); the output layer and embedding add one pair each.
    tp_s = ep_s = cp_s = 0.0
    tp_net = ep_net = cp_net = False
    if t > 1:
        bw, tp_net = _bandwidth(gpu, lay, t, calib, raw=True)
        unit = y * T * h * (t - 1) / t / bw
        count = 8 * layers + (2 if stage == lay.pp - 1 else 0) + (2 if stage == 0 else 0)
        tp_s = count * unit
        if moe_n and lay.etp > 1:
            tp_s += moe_n * 4 * shape.topk * unit
    if moe_n and lay.ep > 1:
        # Expert ranks are ordered etp-ep-edp-pp: an EP group spans etp * ep consecutive ranks.
        span = lay.ep * lay.etp
        bw, ep_net = _bandwidth(gpu, lay, span, calib, raw=True)
        a2a = y * (T / r) * shape.topk * h * (lay.ep - 1) / lay.ep / bw
        ep_s = moe_n * 4 * a2a
    if lay.cp > 1:
        bw, cp_net = _bandwidth(gpu, lay, lay.tp * lay.cp, calib, raw=True)
        kv = y * T * 2 * g * d / t / bw
        cp_s = layers * 3 * (lay.cp - 1) * kv
    kernels = kernels_per_microbatch(shape, lay, counts)
    return StageWork(
        stage=stage,
        gemm_seconds=gemm / gemm_peak,
        attention_seconds=attention / attn_peak,
        elementwise_seconds=ew / (gpu.hbm_gbps * 1e9),
        kernels=kernels,
        tp_seconds=tp_s,
        ep_seconds=ep_s,
        tp_network=tp_net,
        ep_network=ep_net,
        cp_comm_seconds=cp_s,
        cp_network=cp_net,
    )


def _eff(network: bool, calib: Calibration) -> float:
    return calib.network_efficiency if network else calib.nvlink_efficiency


def microbatch_seconds(w: StageWork, calib: Calibration) -> dict[str, float]:
    """Seconds of one microbatch on a rank, by term (CP exchange overlapped with attention:
    only what exceeds the attention time is exposed)."""
    attention = w.attention_seconds / calib.attention_efficiency
    cp = max(0.0, w.cp_comm_seconds / _eff(w.cp_network, calib) - attention)
    return {
        "gemm": w.gemm_seconds / calib.gemm_efficiency,
        "attention": attention,
        "elementwise": w.elementwise_seconds / calib.memory_efficiency,
        "kernel_launch": w.kernels * calib.seconds_per_kernel,
        "tp_communication": w.tp_seconds / _eff(w.tp_network, calib),
        "ep_communication": w.ep_seconds / _eff(w.ep_network, calib),
        "cp_communication": cp,
    }


@dataclass
class TimePlan:
    """Step time and throughput.

    Attributes:
        step_seconds: one optimizer step.
        breakdown: seconds per :data:`TIME_TERMS` (sums to ``step_seconds``).
        slowest_stage: the pipeline rank that sets the pace.
        flops: :class:`FlopCounts`.
        tokens_per_second: ``global_batch * seq / step_seconds``.
        model_tflops_per_gpu: model FLOPs / step / world / 1e12.
        hardware_tflops_per_gpu: the same with recomputation.
        mfu: model FLOP/s per GPU / :func:`mfu_peak_flops`.
        to_train_seconds: ``step_seconds * train_iters``.
        gpu_hours: ``to_train_seconds * world / 3600``.
        features: the linear features :mod:`bench.plan.calibrate` fits (seconds at 100%).
    """

    step_seconds: float
    breakdown: dict[str, float]
    slowest_stage: int
    flops: FlopCounts
    tokens_per_second: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    to_train_seconds: float
    gpu_hours: float
    features: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``time`` section."""
        return {
            "step_seconds": self.step_seconds,
            "breakdown_seconds": dict(self.breakdown),
            "slowest_stage": self.slowest_stage,
            "to_train_seconds": self.to_train_seconds,
        }


def time_plan(shape: ModelShape, lay: Layout, gpu: GPU, calib: Calibration = DEFAULT_CALIBRATION,
              *, all_stages: bool = True, flops: FlopCounts | None = None,
              work_cache: dict[tuple, StageWork] | None = None) -> TimePlan:
    """Step time of ``lay`` on ``gpu`` (see the module docstring). ``all_stages=False`` times
    only the first and last pipeline ranks (the others hold the same layers without the
    embedding or the logits); ``flops`` reuses :func:`~dlmspec.plan.compute.step_flops`;
    ``work_cache`` reuses :func:`stage_work` across layouts that differ only in data
    parallelism, the optimizer or the batch count (the search passes one dict per search)."""
    if flops is None:
        flops = step_flops(shape, lay)
    stages = range(lay.pp) if (all_stages or lay.pp <= 2) else (0, lay.pp - 1)
    best = None
    for i in stages:
        if work_cache is None:
            w = stage_work(shape, lay, gpu, i, calib)
        else:
            key = (i, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp, lay.sp, lay.micro_batch, lay.recompute,
                   lay.recompute_method, lay.recompute_layers, lay.recompute_modules, lay.impl, shape.vocab)
            w = work_cache.get(key)
            if w is None:
                w = work_cache[key] = stage_work(shape, lay, gpu, i, calib)
        mb = microbatch_seconds(w, calib)
        total = sum(mb.values())
        if best is None or total > best[0]:
            best = (total, w, mb)
    mb_total, slow, per_mb = best
    m, p, v = lay.num_microbatches, lay.pp, max(1, lay.vpp)
    bubble_mb = (p - 1) / v
    b: dict[str, float] = dict.fromkeys(TIME_TERMS, 0.0)
    for key, value in per_mb.items():
        b[key] = m * value
    # Pipeline: the bubble of (p-1)/v microbatch times, plus the p2p hand-offs that fill it.
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * lay.seq / lay.cp
    p2p = 0.0
    if p > 1:
        # Neighbouring stages are tp*cp*dp ranks apart (rank order tp-cp-ep-dp-pp).
        bw, _ = _bandwidth(gpu, lay, lay.tp * lay.cp * lay.dp * 2, calib)
        p2p = 2 * (p - 1) * y * T * shape.hidden / lay.sequence_divisor / bw
    b["pipeline_bubble"] = bubble_mb * mb_total + p2p

    # Data parallel: gradient reduce-scatter / all-reduce and parameter all-gather per step.
    counts = stage_layer_counts(shape, lay, slow.stage)
    p_dense, p_expert = stage_params(shape, lay, slow.stage, counts)
    param_b = 4 if lay.dtype == "fp32" else 2
    grad_b = 4 if (lay.grad_fp32 or lay.dtype == "fp32") else param_b
    dp_raw = 0.0
    dp_total = dp_comm_seconds(lay, gpu, calib, p_dense, p_expert, grad_b, param_b)
    if dp_total:
        backward = m * (per_mb["gemm"] + per_mb["attention"]) * 2 / 3
        forward = m * (per_mb["gemm"] + per_mb["attention"]) / 3
        grad_t, param_t = dp_total
        exposed = grad_t if not lay.overlap_grad_reduce else max(grad_t * calib.dp_overlap_exposed_fraction, grad_t - backward)
        if param_t:
            exposed += param_t if not lay.overlap_param_gather else max(param_t * calib.dp_overlap_exposed_fraction, param_t - forward)
        b["dp_communication"] = exposed
        dp_raw = exposed
    # Optimizer: memory-bound pass over the owned (sharded) parameters, plus zeroing grads.
    sharded = lay.distributed_optimizer or lay.fsdp != "none"
    owned = p_dense / (lay.dp * lay.cp) + p_expert / lay.expert_dp if sharded else p_dense + p_expert
    opt_bytes = OPTIMIZER_BYTES["transformer_engine" if lay.impl == "transformer_engine" else "local+sdpa"] * owned
    opt_bytes += (grad_b + 4) * (p_dense + p_expert)  # zero the grad buffer, read it for the norm
    hbm = gpu.hbm_gbps * 1e9
    b["optimizer"] = opt_bytes / (hbm * calib.memory_efficiency) + KERNELS_PER_STEP * calib.seconds_per_kernel
    b["step_overhead"] = calib.step_overhead_seconds
    step = sum(b.values())

    scale = m + bubble_mb
    features = {
        "gemm": scale * slow.gemm_seconds,
        "attention": scale * slow.attention_seconds,
        "elementwise": scale * slow.elementwise_seconds + opt_bytes / hbm,
        "kernels": scale * slow.kernels + KERNELS_PER_STEP,
        "nvlink": scale * ((0 if slow.tp_network else slow.tp_seconds) + (0 if slow.ep_network else slow.ep_seconds)),
        "const": 1.0,
        "fixed": scale * (per_mb["cp_communication"]
                          + (per_mb["tp_communication"] if slow.tp_network else 0.0)
                          + (per_mb["ep_communication"] if slow.ep_network else 0.0)) + p2p + dp_raw,
    }
    tokens = lay.global_batch * lay.seq
    world = lay.world
    model_tflops = flops.model_per_step / step / world / 1e12
    hw_tflops = flops.hardware_per_step / step / world / 1e12
    to_train = step * lay.train_iters
    return TimePlan(
        step_seconds=step,
        breakdown=b,
        slowest_stage=slow.stage,
        flops=flops,
        tokens_per_second=tokens / step,
        model_tflops_per_gpu=model_tflops,
        hardware_tflops_per_gpu=hw_tflops,
        mfu=model_tflops * 1e12 / mfu_peak_flops(gpu, lay.dtype),
        to_train_seconds=to_train,
        gpu_hours=to_train * world / 3600,
        features=features,
    )


def dp_comm_seconds(lay: Layout, gpu: GPU, calib: Calibration, p_dense: float, p_expert: float,
                    grad_b: int, param_b: int) -> tuple[float, float] | None:
    """(gradient reduction, parameter all-gather) seconds per step at the calibrated bandwidth,
    or None without data parallelism.

    Distributed optimizer: reduce-scatter of the gradient buffer over ``dp * cp`` ranks
    (expert gradients over the expert-DP group) then all-gather of the updated bf16 parameters;
    otherwise an all-reduce (twice the reduce-scatter's volume) and no all-gather. Ring cost:
    ``bytes * (n-1)/n / bandwidth`` per reduce-scatter or all-gather. FSDP gathers parameters
    in forward and again in backward.
    """
    n = lay.dp * lay.cp
    ne = lay.expert_dp
    if n <= 1 and (ne <= 1 or not p_expert):
        return None
    span = lay.tp * lay.cp * lay.dp
    bw, _ = _bandwidth(gpu, lay, span, calib)
    grad_t = param_t = 0.0
    sharded = lay.distributed_optimizer or lay.fsdp != "none"
    factor = 1.0 if sharded else 2.0
    if n > 1:
        grad_t += factor * grad_b * p_dense * (n - 1) / n / bw
        if sharded:
            param_t += param_b * p_dense * (n - 1) / n / bw * (2 if lay.fsdp != "none" else 1)
    if ne > 1 and p_expert:
        ebw, _ = _bandwidth(gpu, lay, lay.world // max(1, lay.pp), calib)
        grad_t += factor * grad_b * p_expert * (ne - 1) / ne / ebw
        if sharded:
            param_t += param_b * p_expert * (ne - 1) / ne / ebw
    return grad_t, param_t
