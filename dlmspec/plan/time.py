"""Step time of a training run: GPU work, host (CPU) launch time, host-device synchronisation
and exposed communication, from the GPU catalog (:mod:`dlmspec.gpus`) and
:class:`~dlmspec.plan.calibration.Calibration`.

Per pipeline rank and microbatch (the slowest rank sets the pace) the GPU's work
(:func:`stage_work`: GEMMs and attention at their peaks, the element-wise bytes of
:mod:`dlmspec.plan.elementwise` at the HBM bandwidth, the collectives of :mod:`dlmspec.plan.comm`)
and the host's launches (:mod:`dlmspec.plan.launches`) run side by side, so a microbatch takes
``max(GPU time, host time)`` (:func:`microbatch_seconds`), plus the host-device syncs and what
they expose. Per step (:func:`time_plan`): ``(m + (pp-1)/vpp)`` microbatch times (the 1F1B
bubble, Narayanan et al. 2021, sec. 2.2), the pipeline's p2p exchanges, the exposed
data-parallel communication, the optimizer and the step's syncs and fixed overhead.

The model, term by term, with the measurements behind its constants: docs/planner-methods.md, *Time
model*.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from dlmspec.gpus import GPU
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, Calibration
from dlmspec.plan.comm import (combined_1f1b_layer_seconds, combined_1f1b_unpaired_share, ddp_buckets, dp_comm_seconds,
                               dp_overlap, link_efficiency, pipeline_p2p, stage_collectives)
from dlmspec.plan.compute import (FlopCounts, attended_keys, recompute_fraction, shape_model_flops_per_token,
                                   step_flops)
from dlmspec.plan.elementwise import FUSED_CE_GEMM_PASSES, OPTIMIZER_BYTES, elementwise_bytes
from dlmspec.plan.optimizer_state import offload_seconds, step_traffic_bytes
from dlmspec.plan.launches import (
    SYNCS_PER_BUCKET,
    SYNCS_PER_STEP,
    compiled_calls_per_microbatch,
    fsdp_host_ops,
    fused_ce_kernels,
    kernels_per_microbatch,
    layer_path,
    optimizer_step_kernels,
    param_tensors,
    syncs_per_microbatch,
)
from dlmspec.plan.memory import expert_tokens, fsdp_sharding, heaviest_stage, stage_layer_counts, stage_params
from dlmspec.plan.shape import Layout, ModelShape, attention_backend, input_length, output_rows

#: Time breakdown keys, in report order (``step_seconds`` is their sum). ``kernel_launch``: the
#: GPU's per-kernel floor plus, on launch-bound ranks, the time the GPU waits for the host;
#: ``host_sync``: host-device synchronisations (microbatch and step).
TIME_TERMS = (
    "gemm",
    "attention",
    "elementwise",
    "kernel_launch",
    "host_sync",
    "tp_communication",
    "ep_communication",
    "cp_communication",
    "pipeline_bubble",
    "dp_communication",
    "optimizer",
    "step_overhead",
)

@dataclass(frozen=True)
class StageTimeTerm:
    """Time a training stage adds to every step besides the policy's forward and backward (a
    frozen reference model's forward, rollouts), on the slowest pipeline rank.

    Attributes:
        name: its breakdown key (after :data:`TIME_TERMS`).
        label: what it is.
        seconds: ``(shape, layout, breakdown) -> seconds`` per step, ``breakdown`` being the
            step's :data:`TIME_TERMS` seconds (e.g. a forward pass: a third of ``gemm``,
            ``attention`` and ``elementwise``, whose backward is twice the forward); with
            ``calibrated`` it is also passed the plan's :class:`Calibration` as ``calib=`` and
            its :class:`~dlmspec.gpus.GPU` as ``gpu=``.
        calibrated: pass ``calib`` and ``gpu`` (a term that needs a calibration constant or the
            GPU's datasheet, e.g. the per-kernel floor or the HBM bandwidth).
    """

    name: str
    label: str
    seconds: Callable[..., float]
    calibrated: bool = False


#: ``[stage] kind`` -> its time terms (:func:`register_stage_time_term`); pre-training and SFT
#: have none.
STAGE_TIME_TERMS: dict[str, tuple[StageTimeTerm, ...]] = {}


def register_stage_time_term(kind: str, term: StageTimeTerm) -> None:
    """Count ``term`` in the step time of every plan of ``[stage] kind = kind`` (replacing a term
    of the same name).

    Raises:
        ValueError: ``term.name`` is one of :data:`TIME_TERMS`.
    """
    if term.name in TIME_TERMS:
        raise ValueError(f"stage time term {term.name!r} is one of the planner's own terms")
    kept = tuple(t for t in STAGE_TIME_TERMS.get(kind, ()) if t.name != term.name)
    STAGE_TIME_TERMS[kind] = kept + (term,)


#: Attention-core speed of each SDPA backend relative to cuDNN's, the backend every calibration
#: run took (whose speed ``Calibration.attention_efficiency`` is). Measured:
#: ``bench/results/profile_h200x2_2026-11-30.json`` (flash: Qwen3-1.7B's attention kernels side by
#: side with cuDNN's; memory-efficient: its SDPA microbenchmark); how, in docs/planner-methods.md.
#: Transformer Engine's fused attention is cuDNN's.
ATTENTION_BACKEND_SPEED = {"cudnn": 1.0, "transformer_engine": 1.0, "flash": 0.703, "efficient": 0.277}


@dataclass(frozen=True)
class StageWork:
    """One pipeline rank's work per microbatch, at 100% of every peak.

    Attributes:
        stage: pipeline rank.
        gemm_seconds: GEMM FLOPs / peak of the GEMMs at the bf16 (or fp32) peak: all of them
            without fp8; with fp8 only the output layer's (the logits GEMMs: megatron-core's own
            ``ColumnParallelLinear``, or the fused linear cross entropy, outside TE's fp8 autocast).
        gemm_fp8_seconds: with fp8, the decoder layers' GEMM FLOPs (QKV, projection, MLP, experts:
            TE's fp8 autocast wraps each ``TransformerLayer``) / the fp8 peak; 0 without fp8.
        attention_seconds: attention-core FLOPs / peak, over the SDPA backend's relative speed
            (:data:`ATTENTION_BACKEND_SPEED`).
        elementwise_seconds: element-wise bytes / HBM bandwidth.
        kernels: kernel launches (host and GPU).
        syncs: host-device synchronisations.
        tp_seconds: TP collective bytes / bandwidth (100%); tp_collectives: their number.
        ep_backward_seconds, ep_forward_seconds: EP all-to-all bytes / bandwidth (100%) in
            backward (overlappable) and forward (exposed by the dispatcher's syncs);
            ep_backward_collectives, ep_forward_collectives: their number (forward with the
            counts' all-gather).
        tp_network, ep_network, cp_network: whether those groups cross nodes.
        cp_comm_seconds: K/V exchange bytes / bandwidth (100%), forward + backward
            (:data:`~dlmspec.plan.comm.CP_KV_EXCHANGES`); cp_overlapped: whether it hides behind the attention;
            cp_collectives: collectives whose latency is exposed (all-gather path).
        fsdp_ops: Megatron-FSDP host operations per microbatch (:func:`~dlmspec.plan.launches.fsdp_host_ops`), host
            work beside the kernel launches.
        compiled_calls: calls of ``torch.compile``'d functions per microbatch
            (:func:`~dlmspec.plan.launches.compiled_calls_per_microbatch`), host work beside their kernels' launches.
        fused_ce_kernels: the fused linear cross entropy's chunk-loop launches among ``kernels``
            (:func:`~dlmspec.plan.launches.fused_ce_kernels`), each at ``Calibration.seconds_per_fused_ce_kernel`` of
            host time instead of ``seconds_per_kernel``.
        tp_overlapped_seconds: the TP collectives that run beside GEMMs (Transformer Engine's
            async backward collectives; all of them with userbuffers), bytes / bandwidth (100%):
            :data:`~dlmspec.plan.comm.TE_TP_UNITS`; tp_hiding_share: the share of the GEMM time
            they hide behind (:func:`~dlmspec.plan.comm.tp_hiding_share`).
        ep_overlapped: the EP all-to-alls run beside another microbatch's compute
            (``Layout.moe_a2a_overlap``).
        layers, moe_layers: the rank's transformer layers and its MoE layers among them.
        expert_gemm_seconds: the routed experts' GEMMs (forward and backward) among
            ``gemm_seconds`` / ``gemm_fp8_seconds`` (at the decoder's GEMM peak, 100%): the MLP
            part of a MoE layer the combined 1F1B schedule pairs with the all-to-alls.
        ep_unpaired_share: with ``ep_overlapped``, the share of the rank's model chunks the
            schedule runs unpaired (:func:`~dlmspec.plan.comm.combined_1f1b_unpaired_share`).
    """

    stage: int
    gemm_seconds: float
    gemm_fp8_seconds: float
    attention_seconds: float
    elementwise_seconds: float
    kernels: float
    syncs: float
    tp_seconds: float
    tp_collectives: float
    ep_backward_seconds: float
    ep_forward_seconds: float
    ep_backward_collectives: float
    ep_forward_collectives: float
    tp_network: bool
    ep_network: bool
    cp_comm_seconds: float
    cp_network: bool
    cp_overlapped: bool = True
    cp_collectives: float = 0.0
    fsdp_ops: float = 0.0
    compiled_calls: float = 0.0
    fused_ce_kernels: float = 0.0
    tp_overlapped_seconds: float = 0.0
    tp_hiding_share: float = 0.0
    ep_overlapped: bool = False
    layers: int = 0
    moe_layers: int = 0
    expert_gemm_seconds: float = 0.0
    ep_unpaired_share: float = 0.0


def peak_flops(gpu: GPU, lay: Layout) -> tuple[float, float]:
    """(GEMM peak, attention peak) in FLOP/s: bf16/fp16 tensor-core peak; fp8 GEMMs at the fp8
    peak (attention, and the output layer's GEMMs, stay bf16: :class:`StageWork`); fp32 at the
    plain fp32 peak (PyTorch leaves TF32 off for matmuls by default)."""
    if lay.dtype == "fp32":
        return gpu.fp32_tflops * 1e12, gpu.fp32_tflops * 1e12
    gemm = gpu.fp8_tflops if (lay.fp8 and gpu.fp8_tflops) else gpu.bf16_tflops
    return gemm * 1e12, gpu.bf16_tflops * 1e12


def attention_peak_flops(gpu: GPU, lay: Layout, attn_peak: float) -> float:
    """Attention's peak in FLOP/s: the fp8 peak with ``precision.fp8_dot_product_attention``
    (Transformer Engine's fp8 fused attention runs both batched GEMMs in fp8), else ``attn_peak``.
    The attention efficiency stays the bf16 one: no fp8-attention run is calibrated
    (:func:`dlmspec.plan.provenance.outside_measured` says so)."""
    if lay.fp8_attention and lay.dtype != "fp32" and gpu.fp8_tflops:
        return gpu.fp8_tflops * 1e12
    return attn_peak


def mfu_peak_flops(gpu: GPU, dtype: str) -> float:
    """Peak FLOP/s MFU divides by: the dense bf16 peak (also for fp8 runs, the usual
    convention), the fp32 peak for fp32 runs."""
    return (gpu.fp32_tflops if dtype == "fp32" else gpu.bf16_tflops) * 1e12


def stage_work(shape: ModelShape, lay: Layout, gpu: GPU, stage: int, calib: Calibration) -> StageWork:
    """:class:`StageWork` of rank ``stage`` (per microbatch)."""
    counts = stage_layer_counts(shape, lay, stage)
    dense_n, moe_n = counts
    layers = dense_n + moe_n
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    gemm_peak, attn_peak = peak_flops(gpu, lay)
    frac = recompute_fraction(shape, lay)
    gate = 3 if shape.gated else 2
    # Forward FLOPs per token of one layer, per rank.
    attn_linear = (2 * h * (a + 2 * g) * d + 2 * a * d * h) / t
    keys = shape.attended_keys or attended_keys(
        input_length(shape, lay), "bidirectional" if shape.attention == "block_causal" else shape.attention,
        shape.block_size or None)
    attn_core = 4 * a * d * keys / t
    mlp = gate * 2 * h * shape.ffn / t
    gemm_tok = layers * attn_linear * (3 + frac["attention_linear"]) + dense_n * mlp * (3 + frac["mlp"])
    gemm = gemm_tok * T
    expert_gemm = 0.0
    if moe_n:
        N = expert_tokens(shape, lay)
        expert_gemm = moe_n * N * gate * 2 * h * shape.expert_ffn / lay.etp * (3 + frac["moe"])
        moe_fwd = N * gate * 2 * h * shape.expert_ffn / lay.etp + T / r * 2 * h * shape.num_experts
        if shape.shared_ffn:
            moe_fwd += T * gate * 2 * h * shape.shared_ffn / t
        gemm += moe_n * moe_fwd * (3 + frac["moe"])
    decoder_gemm = gemm
    if stage == lay.pp - 1 and lay.fused_linear_ce:
        rows = shape.loss_row_fraction * T
        gemm += FUSED_CE_GEMM_PASSES[lay.fused_linear_backend] * 2 * h * shape.vocab * rows
    elif stage == lay.pp - 1:
        gemm += 3 * 2 * h * shape.vocab / t * output_rows(shape, lay)  # the rows reaching the output layer
    if gemm_peak != attn_peak:  # fp8: the decoder's GEMMs at the fp8 peak, the output layer's at bf16
        gemm_seconds, gemm_fp8_seconds = (gemm - decoder_gemm) / attn_peak, decoder_gemm / gemm_peak
    else:
        gemm_seconds, gemm_fp8_seconds = gemm / gemm_peak, 0.0
    attention = layers * attn_core * (3 + frac["attention_core"]) * T
    ew = elementwise_bytes(shape, lay, stage, counts)
    c = stage_collectives(shape, lay, gpu, stage, counts, calib)
    fused_ce = fused_ce_kernels(shape, lay) if (stage == lay.pp - 1 and lay.fused_linear_ce) else 0.0
    speed = calib.gpu_compute_scale.get(gpu.id, 1.0)  # the GPU's achieved compute vs the calibration's GPU
    return StageWork(
        stage=stage,
        gemm_seconds=gemm_seconds / speed,
        gemm_fp8_seconds=gemm_fp8_seconds / speed,
        attention_seconds=(attention / attention_peak_flops(gpu, lay, attn_peak)
                           / ATTENTION_BACKEND_SPEED[attention_backend(lay, gpu.compute_capability)] / speed),
        elementwise_seconds=ew / (gpu.hbm_gbps * 1e9),
        kernels=kernels_per_microbatch(shape, lay, counts, stage),
        syncs=syncs_per_microbatch(shape, lay, stage, counts),
        tp_seconds=c.tp_seconds,
        tp_collectives=c.tp_collectives,
        ep_backward_seconds=c.ep_backward_seconds,
        ep_forward_seconds=c.ep_forward_seconds,
        ep_backward_collectives=c.ep_backward_collectives,
        ep_forward_collectives=c.ep_forward_collectives,
        tp_network=c.tp_network,
        ep_network=c.ep_network,
        cp_comm_seconds=c.cp_comm_seconds,
        cp_network=c.cp_network,
        cp_overlapped=c.cp_overlapped,
        cp_collectives=c.cp_collectives,
        fsdp_ops=fsdp_host_ops(shape, lay, stage, counts)[0],
        compiled_calls=compiled_calls_per_microbatch(shape, lay, counts, stage),
        fused_ce_kernels=fused_ce,
        tp_overlapped_seconds=c.tp_overlapped_seconds,
        tp_hiding_share=c.tp_hiding_share,
        ep_overlapped=lay.moe_a2a_overlap and bool(moe_n) and lay.ep > 1,
        layers=layers,
        moe_layers=moe_n,
        expert_gemm_seconds=expert_gemm / gemm_peak / speed,
        ep_unpaired_share=combined_1f1b_unpaired_share(lay, stage) if moe_n else 0.0,
    )


def host_speed(lay: Layout, calib: Calibration) -> float:
    """How much slower the layout's host launches kernels than the calibration's typical host:
    ``cluster.host_launch_us * 1e-6 / Calibration.host_launch_seconds`` (1.0 when the spec does not
    state it). Every host-time constant (``seconds_per_kernel``, ``host_sync_seconds``,
    ``fsdp_seconds_per_op``) is multiplied by it: the host's part of a launch-bound step is the
    same eager dispatch the micro-benchmark (``backends/megatron/hostbench.py``) times."""
    if not lay.host_launch_seconds:
        return 1.0
    return lay.host_launch_seconds / calib.host_launch_seconds


def host_seconds(w: StageWork, calib: Calibration, host_scale: float = 1.0) -> float:
    """Host time of one microbatch on a rank: kernel launches (the fused linear cross entropy's
    chunk loop at ``seconds_per_fused_ce_kernel``, the others at ``seconds_per_kernel``),
    ``torch.compile``'d calls and Megatron-FSDP's host operations, scaled by the host's launch
    speed."""
    return ((w.kernels - w.fused_ce_kernels) * calib.seconds_per_kernel
            + w.fused_ce_kernels * calib.seconds_per_fused_ce_kernel
            + w.compiled_calls * calib.seconds_per_compiled_call
            + w.fsdp_ops * calib.fsdp_seconds_per_op) * host_scale


def tp_overlap_exposed(w: StageWork, calib: Calibration, gemm_seconds: float) -> float:
    """Seconds of the overlapped TP collectives (:attr:`StageWork.tp_overlapped_seconds`) left
    exposed: what exceeds the GEMM time they hide behind (``gemm_seconds * tp_hiding_share``), at
    least ``Calibration.tp_overlap_exposed_fraction`` of them (the first and last chunk of each
    overlapped GEMM, and the GEMMs' slow-down from sharing the SMs with NCCL)."""
    if not w.tp_overlapped_seconds:
        return 0.0
    over = w.tp_overlapped_seconds / link_efficiency(w.tp_network, calib)
    return max(over * calib.tp_overlap_exposed_fraction, over - gemm_seconds * w.tp_hiding_share)


def ep_overlap_exposed(w: StageWork, calib: Calibration, ep_all: float, compute: float) -> float:
    """Seconds of a microbatch's expert-parallel all-to-alls (``ep_all``: all of them, latency
    included) left exposed by megatron-core's combined 1F1B schedule (``Layout.moe_a2a_overlap``)
    beside ``compute`` seconds of GEMMs, attention and element-wise work on the rank.

    Per MoE layer the compute is split into the experts' GEMMs (``expert_gemm_seconds`` at the
    decoder's GEMM efficiency; a third forward, a third data gradient, a third weight gradient)
    and the pre-dispatch rest (attention, router, permute: a third forward, two thirds backward),
    and each layer pair is timed by :func:`~dlmspec.plan.comm.combined_1f1b_layer_seconds` with
    ``ep_all / (4 * moe_layers)`` per all-to-all: what the pair takes beyond its compute is
    exposed. The warm-up and cool-down chunks (``ep_unpaired_share``) run unpaired: their
    all-to-alls are exposed whole. At least ``Calibration.ep_overlap_exposed_fraction`` of
    ``ep_all`` stays exposed (the compute's slow-down from sharing the SMs with the all-to-all
    kernels, and the dispatcher's host syncs)."""
    if not ep_all or not w.moe_layers:
        return ep_all
    eff = calib.fp8_gemm_efficiency if w.gemm_fp8_seconds else calib.gemm_efficiency
    per_layer = compute / max(1, w.layers)
    mlp = min(per_layer, w.expert_gemm_seconds / eff / w.moe_layers)
    pre = per_layer - mlp
    a2a = ep_all / (4 * w.moe_layers)
    pair = combined_1f1b_layer_seconds(pre / 3, 2 * pre / 3, mlp / 3, mlp / 3, mlp / 3, a2a)
    paired = w.moe_layers * max(0.0, pair - per_layer)
    exposed = (1 - w.ep_unpaired_share) * paired + w.ep_unpaired_share * ep_all
    return max(ep_all * calib.ep_overlap_exposed_fraction, exposed)


def microbatch_seconds(w: StageWork, calib: Calibration, host_scale: float = 1.0) -> tuple[dict[str, float], bool]:
    """Seconds of one microbatch on a rank, by term, and whether the rank is launch-bound.

    GPU time (compute, the per-kernel floor, TP collectives, backward EP all-to-alls, the CP
    exchange: a ring beyond the attention it overlaps, an all-gather whole with its latency) and
    host launch time overlap - the host enqueues
    kernels asynchronously - so the microbatch takes the larger; a launch-bound rank's excess
    goes to ``kernel_launch``. The host syncs and what they expose (forward EP all-to-alls and
    their latency) come on top. Host time is ``kernels * seconds_per_kernel`` plus the calls of
    ``torch.compile``'d functions times ``seconds_per_compiled_call`` and Megatron-FSDP's host
    operations times ``fsdp_seconds_per_op`` (:func:`host_seconds`); it and the syncs are multiplied by
    ``host_scale`` (:func:`host_speed`).
    """
    lat = calib.collective_latency_seconds
    attention = w.attention_seconds / calib.attention_efficiency
    cp = w.cp_comm_seconds / link_efficiency(w.cp_network, calib)
    cp = max(0.0, cp - attention) if w.cp_overlapped else cp + w.cp_collectives * lat
    gemm = w.gemm_seconds / calib.gemm_efficiency + w.gemm_fp8_seconds / calib.fp8_gemm_efficiency
    terms = {
        "gemm": gemm,
        "attention": attention,
        "elementwise": w.elementwise_seconds / calib.memory_efficiency,
        "kernel_launch": w.kernels * calib.gpu_seconds_per_kernel,
        "host_sync": 0.0,
        "tp_communication": (w.tp_seconds / link_efficiency(w.tp_network, calib) + w.tp_collectives * lat
                             + tp_overlap_exposed(w, calib, gemm)),
        "ep_communication": w.ep_backward_seconds / link_efficiency(w.ep_network, calib) + w.ep_backward_collectives * lat,
        "cp_communication": cp,
    }
    ep_forward = w.ep_forward_seconds / link_efficiency(w.ep_network, calib) + w.ep_forward_collectives * lat
    if w.ep_overlapped:
        terms["ep_communication"] = ep_overlap_exposed(w, calib, terms["ep_communication"] + ep_forward,
                                                       terms["gemm"] + terms["attention"] + terms["elementwise"])
        ep_forward = 0.0
    gpu = sum(terms.values())
    host = host_seconds(w, calib, host_scale)
    launch_bound = host > gpu
    if launch_bound:
        terms["kernel_launch"] += host - gpu
    terms["ep_communication"] += ep_forward
    terms["host_sync"] = w.syncs * calib.host_sync_seconds * host_scale
    return terms, launch_bound


@dataclass
class TimePlan:
    """Step time and throughput.

    Attributes:
        step_seconds: one optimizer step.
        breakdown: seconds per :data:`TIME_TERMS`, then the training stage's own terms
            (:data:`STAGE_TIME_TERMS`); sums to ``step_seconds``.
        slowest_stage: the pipeline rank that sets the pace.
        flops: :class:`FlopCounts`.
        tokens_per_second: ``global_batch * seq / step_seconds``.
        model_tflops_per_gpu: model FLOPs / step / world / 1e12.
        hardware_tflops_per_gpu: the same with recomputation.
        mfu: model FLOP/s per GPU / :func:`mfu_peak_flops`.
        to_train_seconds: ``step_seconds * train_iters``.
        gpu_hours: ``to_train_seconds * world / 3600``.
        features: the linear features :mod:`bench.plan.calibrate` fits (seconds at 100%;
            launches, syncs and FSDP host operations counted on the typical host: times
            :func:`host_speed`).
        host_scale: :func:`host_speed` of the layout (1.0 on the calibration's typical host).
        input_positions_per_second: ``global_batch * input_length / step_seconds``: the positions the
            model runs (block diffusion's ``x_t (+) x_0``: twice the data tokens); ``mfu`` counts
            their model FLOPs at the objective's attention density.
        data_mfu: the MFU of the data tokens alone: the model FLOPs of ``seq`` positions with the
            layer pattern's attention (what an MDM step over the same tokens counts) per second per
            GPU over :func:`mfu_peak_flops`; equal to ``mfu`` for an objective without extra positions.
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
    host_scale: float = 1.0
    input_positions_per_second: float = 0.0
    data_mfu: float = 0.0

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
    """Step time of ``lay`` on ``gpu`` (see the module docstring and docs/planner-methods.md). ``all_stages=False`` times
    only the first and last pipeline ranks (the others hold the same layers without the
    embedding or the logits), and with an uneven split the rank with the most layers too (the
    slowest rank sets every microbatch's pace, and the bubble is ``(pp - 1) / vpp`` of its time); ``flops`` reuses :func:`~dlmspec.plan.compute.step_flops`;
    ``work_cache`` reuses :func:`stage_work` across layouts that differ only in data
    parallelism, the optimizer or the batch count (the search passes one dict per search)."""
    if flops is None:
        flops = step_flops(shape, lay)
    stages = range(lay.pp) if (all_stages or lay.pp <= 2) else (0, lay.pp - 1)
    if lay.pipeline_split is not None and not (all_stages or lay.pp <= 2):
        stages = sorted({0, lay.pp - 1, heaviest_stage(shape, lay)})  # an uneven split's fullest rank
    hs = host_speed(lay, calib)
    best = None
    for i in stages:
        if work_cache is None:
            w = stage_work(shape, lay, gpu, i, calib)
        else:
            key = (i, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp, lay.sp, lay.micro_batch, lay.recompute,
                   lay.recompute_method, lay.recompute_layers, lay.recompute_modules, lay.impl, shape.vocab,
                   lay.fused_linear_ce, lay.fused_linear_backend, lay.fsdp, lay.sharding, lay.rope_fusion,
                   lay.qkv_fusion, lay.compiled_norm, lay.sdpa_backend, lay.tp_comm_overlap, lay.moe_a2a_overlap,
                   lay.moe_flex_dispatcher,
                   lay.pipeline_split, lay.moe_grouped_gemm)
            w = work_cache.get(key)
            if w is None:
                w = work_cache[key] = stage_work(shape, lay, gpu, i, calib)
        mb, bound = microbatch_seconds(w, calib, hs)
        total = sum(mb.values())
        if best is None or total > best[0]:
            best = (total, w, mb, bound)
    mb_total, slow, per_mb, launch_bound = best
    m, p, v = lay.num_microbatches, lay.pp, max(1, lay.vpp)
    bubble_mb = (p - 1) / v
    b: dict[str, float] = dict.fromkeys(TIME_TERMS, 0.0)
    for key, value in per_mb.items():
        b[key] = m * value
    # Pipeline: the bubble of (p-1)/v microbatch times, plus the p2p exchanges on the critical
    # path (not hidden: a sync follows each).
    p2p_raw, p2p_lat, p2p_network = pipeline_p2p(shape, lay, gpu, calib)
    p2p = p2p_raw / link_efficiency(p2p_network, calib) + p2p_lat
    b["pipeline_bubble"] = bubble_mb * mb_total + p2p

    # Data parallel: gradient reduce-scatter / all-reduce and parameter all-gather per step,
    # hidden (with overlap) behind the wall time of backward / forward.
    counts = stage_layer_counts(shape, lay, slow.stage)
    p_dense, p_expert = stage_params(shape, lay, slow.stage, counts)
    param_b = 4 if lay.dtype == "fp32" else 2
    grad_b = 4 if (lay.grad_fp32 or lay.dtype == "fp32") else param_b
    dp_raw = 0.0
    dp_total = dp_comm_seconds(lay, gpu, calib, p_dense, p_expert, grad_b, param_b)
    if dp_total:
        backward = m * mb_total * 2 / 3
        forward = m * mb_total / 3
        grad_t, param_t = dp_total
        overlap_grad, overlap_param = dp_overlap(lay)
        if fsdp_sharding(lay)[0]:
            # Fully sharded: the backward's parameter all-gather runs beside the gradient
            # reduce-scatter, behind backward; the forward's behind forward.
            grad_t, param_t = grad_t + param_t / 2, param_t / 2
        exposed = grad_t if not overlap_grad else max(grad_t * calib.dp_overlap_exposed_fraction, grad_t - backward)
        if param_t:
            exposed += param_t if not overlap_param else max(param_t * calib.dp_overlap_exposed_fraction, param_t - forward)
        b["dp_communication"] = exposed
        dp_raw = exposed
    # Optimizer: memory-bound pass over the owned (sharded) parameters, plus zeroing grads; the
    # host's launches (per parameter tensor on the local path) and the step's syncs.
    path = layer_path(lay)
    sharded = fsdp_sharding(lay)[2]
    owned = p_dense / (lay.dp * lay.cp) + p_expert / lay.expert_dp if sharded else p_dense + p_expert
    opt_bytes = step_traffic_bytes(lay, OPTIMIZER_BYTES[path]) * owned  # [train] optimizer-state options
    opt_bytes += (grad_b + 4) * (p_dense + p_expert)  # zero the grad buffer, read it for the norm
    hbm = gpu.hbm_gbps * 1e9
    tensors = param_tensors(shape, lay, slow.stage, counts)
    step_kernels = optimizer_step_kernels(shape, lay, slow.stage, counts)
    fsdp_step_ops = fsdp_host_ops(shape, lay, slow.stage, counts)[1]
    b["optimizer"] = (opt_bytes / (hbm * calib.memory_efficiency)
                      + (step_kernels * calib.seconds_per_kernel + fsdp_step_ops * calib.fsdp_seconds_per_op) * hs
                      + offload_seconds(lay, owned, gpu.id))  # CPU offload: PCIe copies and the host's AdamW
    step_syncs = SYNCS_PER_STEP + SYNCS_PER_BUCKET * ddp_buckets(lay, p_dense, p_expert)
    if path == "local+sdpa":
        step_syncs += tensors
    b["host_sync"] += step_syncs * calib.host_sync_seconds * hs
    b["step_overhead"] = calib.step_overhead_seconds
    for term in STAGE_TIME_TERMS.get(shape.stage_kind, ()):  # the training stage's own work (after TIME_TERMS)
        extra = {"calib": calib, "gpu": gpu} if term.calibrated else {}
        b[term.name] = float(term.seconds(shape, lay, dict(b), **extra))
    step = sum(b.values())

    # Linear features of the fitted constants (bench/plan/calibrate.py): seconds at 100% of
    # every peak, launches, syncs; the GPU terms of a launch-bound rank and its host launches of
    # a GPU-bound one do not count (the max picks one side).
    scale = m + bubble_mb
    gpu_side = 0.0 if launch_bound else 1.0
    intra = (0 if slow.tp_network else slow.tp_seconds) + (0 if slow.ep_network else slow.ep_backward_seconds)
    features = {
        "gemm": scale * gpu_side * slow.gemm_seconds,
        "gemm_fp8": scale * gpu_side * slow.gemm_fp8_seconds,
        "attention": scale * gpu_side * slow.attention_seconds,
        "elementwise": scale * gpu_side * slow.elementwise_seconds + opt_bytes / hbm,
        "kernels": hs * (scale * (1 - gpu_side) * (slow.kernels - slow.fused_ce_kernels) + step_kernels),
        "fused_ce_kernels": hs * scale * (1 - gpu_side) * slow.fused_ce_kernels,
        "nvlink": scale * (gpu_side * intra + (0 if slow.ep_network else slow.ep_forward_seconds))
        + (0 if p2p_network else p2p_raw),
        "syncs": hs * (scale * slow.syncs + step_syncs),
        "fsdp_ops": hs * (scale * (1 - gpu_side) * slow.fsdp_ops + fsdp_step_ops),
        "compiled_calls": hs * scale * (1 - gpu_side) * slow.compiled_calls,
        "const": 1.0,
        "fixed": scale * (gpu_side * (per_mb["cp_communication"] + slow.kernels * calib.gpu_seconds_per_kernel
                                      + slow.tp_collectives * calib.collective_latency_seconds
                                      + slow.ep_backward_collectives * calib.collective_latency_seconds
                                      + (slow.tp_seconds / calib.network_efficiency if slow.tp_network else 0.0)
                                      + (slow.ep_backward_seconds / calib.network_efficiency if slow.ep_network else 0.0))
                          + slow.ep_forward_collectives * calib.collective_latency_seconds
                          + (slow.ep_forward_seconds / calib.network_efficiency if slow.ep_network else 0.0))
        + (p2p_raw / calib.network_efficiency if p2p_network else 0.0) + p2p_lat + dp_raw,
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
        host_scale=hs,
        input_positions_per_second=lay.global_batch * input_length(shape, lay) / step,
        data_mfu=(shape_model_flops_per_token(dataclasses.replace(shape, extra_seq_length=0, attended_keys=0.0), lay.seq)
                  * tokens / step / world / mfu_peak_flops(gpu, lay.dtype)),
    )
