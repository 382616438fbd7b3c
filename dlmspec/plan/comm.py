"""Communication of a training step: bandwidths of the process groups and the bytes, counts and
overlap of each collective - tensor-parallel all-gathers and reduce-scatters, expert-parallel
all-to-alls, context parallelism's key/value exchange, the pipeline's p2p transfers and data
parallelism's gradient reduction and parameter all-gather. :mod:`dlmspec.plan.time` adds what
is exposed to the step time.

Bandwidths: NVLink (``GPU.nvlink_gbps``, GB/s per direction) inside a node, the network
(``cluster.inter_node_gbps``, Gbit/s per GPU) for groups that span nodes; megatron's rank order
``tp-cp-ep-dp-pp`` decides which groups do. Ring cost: ``bytes * (n-1)/n / bandwidth``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlmspec.gpus import GPU
from dlmspec.plan.calibration import Calibration
from dlmspec.plan.memory import fsdp_sharding
from dlmspec.plan.shape import DTYPE_BYTES, Layout, ModelShape, input_length

#: Context parallelism's key/value traffic per layer and microbatch, by ``cp_comm_type``: how many
#: times each rank sends ``(cp - 1)`` K/V shards of ``y * T * 2 * g * d / t`` bytes, and whether
#: the transfers overlap the attention. ``p2p`` (Transformer Engine ``AttnFuncWithCPAndKVP2P``,
#: ``a2a`` and ``a2a+p2p`` planned alike): the ring forward, again with dK/dV backward, behind the
#: attention. ``allgather`` (megatron-core ``cp_comm_type = "all_gather"``): one all-gather forward
#: and one reduce-scatter backward, not overlapped (``TransformerConfig.cp_comm_type``: "The
#: all-gather is not async, and cannot be overlapped"), each a collective. More in docs/planner-methods.md.
CP_KV_EXCHANGES = {"p2p": (3, True), "allgather": (2, False)}
#: Tensor-parallel collectives per layer and microbatch on the Transformer Engine path, in units of
#: one all-gather (or reduce-scatter) of the gathered ``[T, h]`` activation (an all-reduce is two):
#: ``(exposed, overlapped)``. Sequence parallel: forward the all-gathers before QKV and FC1 and the
#: reduce-scatters after the projection and FC2 (4, exposed: megatron-core waits on them), backward
#: the all-gathers of the output gradients of the projection and FC2 (2, exposed:
#: ``_ReduceScatterToSequenceParallelRegion.backward``), and 4 that Transformer Engine overlaps
#: with GEMMs in ``_Linear.backward`` / ``_LayerNormLinear.backward`` (``async_op=True``): the
#: re-gather of QKV's and FC1's input for their weight gradient beside the data-gradient GEMM, and
#: the reduce-scatter of their data gradient beside the weight-gradient GEMM. Without sequence
#: parallelism: the forward all-reduces after the projection and FC2 (4 units, exposed) and the
#: backward all-reduces of QKV's and FC1's data gradient (4 units, overlapped the same way).
#: The local path keeps its calibrated count (8 units, exposed; fitted on two-GPU runs).
TE_TP_UNITS = {True: (6, 4), False: (4, 4)}
#: megatron-core DDP bucket size with ``overlap_grad_reduce``: ``max(40M, 1M * dp)`` parameters.
DDP_BUCKET_PARAMS = 40_000_000


def bandwidth(gpu: GPU, lay: Layout, span: int, calib: Calibration, *, raw: bool = False) -> tuple[float, bool]:
    """(bytes/s, crosses nodes) for a group whose ranks spread over ``span`` consecutive ranks;
    ``raw``: at 100% of the link (the calibrated efficiency is applied later)."""
    if span <= lay.gpus_per_node:
        return gpu.nvlink_gbps * 1e9 * (1.0 if raw else calib.nvlink_efficiency), False
    return lay.inter_node_gbps / 8 * 1e9 * (1.0 if raw else calib.network_efficiency), True


def link_efficiency(network: bool, calib: Calibration) -> float:
    """The calibrated efficiency of the network (``network``) or of NVLink."""
    return calib.network_efficiency if network else calib.nvlink_efficiency


@dataclass(frozen=True)
class Collectives:
    """One pipeline rank's collectives per microbatch, at 100% of the link (fields as in
    :class:`dlmspec.plan.time.StageWork`): seconds, counts (whose latency is exposed) and
    whether each group crosses nodes."""

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
    cp_overlapped: bool
    cp_collectives: float
    tp_overlapped_seconds: float = 0.0
    tp_hiding_share: float = 0.0


def stage_collectives(shape: ModelShape, lay: Layout, gpu: GPU, stage: int, counts: tuple[int, int],
                      calib: Calibration) -> Collectives:
    """:class:`Collectives` of one microbatch on rank ``stage`` holding ``counts`` = (dense, MoE)
    layers. TP: 4 collectives per layer forward + 4 backward of the gathered ``[T, h]`` (sequence
    parallel: all-gather + reduce-scatter; without it all-reduces of the same volume), one pair
    more each for the output layer and the embedding, and ``4 * topk`` per MoE layer with expert
    TP. EP: dispatch and combine forward and backward; the forward pair sits between the
    dispatcher's host syncs (exposed, with the counts' all-gather), the backward pair overlaps
    host-bound work. CP: :data:`CP_KV_EXCHANGES`."""
    dense_n, moe_n = counts
    layers = dense_n + moe_n
    h, g, d = shape.hidden, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    tp_s = ep_b = ep_f = cp_s = 0.0
    tp_n = ep_bn = ep_fn = cp_n = 0.0
    tp_over = hiding = 0.0
    tp_net = ep_net = cp_net = False
    cp_overlapped = True
    if t > 1:
        bw, tp_net = bandwidth(gpu, lay, t, calib, raw=True)
        unit = y * T * h * (t - 1) / t / bw
        ends = (2 if stage == lay.pp - 1 else 0) + (2 if stage == 0 else 0)
        if lay.impl == "transformer_engine":
            exposed, overlapped = TE_TP_UNITS[lay.sequence_divisor > 1]
            if lay.tp_comm_overlap:
                exposed, overlapped = 0, exposed + overlapped
            tp_n = exposed * layers + ends
            tp_over = overlapped * layers * unit
            hiding = tp_hiding_share(shape, lay, counts)
        else:
            tp_n = 8 * layers + ends
        if moe_n and lay.etp > 1:
            tp_n += moe_n * 4 * shape.topk
        tp_s = tp_n * unit
    if moe_n and lay.ep > 1:
        # Expert ranks are ordered etp-ep-edp-pp: an EP group spans etp * ep consecutive ranks.
        span = lay.ep * lay.etp
        bw, ep_net = bandwidth(gpu, lay, span, calib, raw=True)
        a2a = y * (T / r) * shape.topk * h * a2a_share(lay, shape) / bw
        ep_f = ep_b = moe_n * 2 * a2a
        ep_fn = moe_n * 3  # dispatch, combine and the all-gather of the token counts
        ep_bn = moe_n * 2
    if lay.cp > 1:
        bw, cp_net = bandwidth(gpu, lay, lay.tp * lay.cp, calib, raw=True)
        kv = y * T * 2 * g * d / t / bw
        passes, cp_overlapped = CP_KV_EXCHANGES.get(lay.cp_comm_type, CP_KV_EXCHANGES["p2p"])
        cp_s = layers * passes * (lay.cp - 1) * kv
        cp_n = 0.0 if cp_overlapped else layers * passes
    return Collectives(
        tp_seconds=tp_s,
        tp_collectives=tp_n,
        ep_backward_seconds=ep_b,
        ep_forward_seconds=ep_f,
        ep_backward_collectives=ep_bn,
        ep_forward_collectives=ep_fn,
        tp_network=tp_net,
        ep_network=ep_net,
        cp_comm_seconds=cp_s,
        cp_network=cp_net,
        cp_overlapped=cp_overlapped,
        cp_collectives=cp_n,
        tp_overlapped_seconds=tp_over,
        tp_hiding_share=hiding,
    )


def a2a_share(lay: Layout, shape: ModelShape | None = None) -> float:
    """Bytes of a rank's expert-parallel all-to-all that cross its slowest link, as a share of the
    ``topk`` copies of its dispatched tokens (``y * T/r * topk * h``).

    ``alltoall`` dispatcher (megatron-core ``MoEAlltoAllTokenDispatcher``: the tokens are permuted
    per expert, so a token bound for two experts of one rank is sent twice): ``(ep - 1) / ep``
    inside a node; across nodes only the copies bound for the ``ep - L`` off-node ranks (``L =
    gpus_per_node / etp`` EP ranks share a node: expert ranks are ordered etp-ep-edp-pp),
    ``(ep - L) / ep``, which the network carries while NVLink carries the rest at the same time
    (NCCL's all-to-all posts every peer's send at once).

    ``flex`` dispatcher (``Layout.moe_flex_dispatcher``; needs ``shape``): the routing map is
    taken per destination rank (megatron-core ``MoEFlexTokenDispatcher``, DeepEP and HybridEP
    permute for communication by rank), so a token is sent once to each rank that holds any of
    its experts; with DeepEP, across nodes once per destination node, then forwarded over NVLink
    (megatron-core ``transformer/moe/README.md``: DeepEP "removes redundant tokens during
    cross-node communication"; the design of the DeepSeek-V3 technical report, arXiv 2412.19437,
    sec. 3.2.2). HybridEP documents no such merge across nodes (its README names NVLink domains,
    GB200 NVL72): per destination rank there too. With balanced routing over ``E`` experts, a
    destination holding ``n`` of them receives a token with probability ``1 - C(E - n, k) /
    C(E, k)`` (``k = topk`` distinct experts), so the share is ``(D - 1) * (1 - C(E - E/D, k) /
    C(E, k)) / k`` over ``D`` destinations (EP ranks; DeepEP across nodes: nodes), across nodes
    the off-node ones only: ``(ep - L) * (1 - C(E - E/ep, k) / C(E, k)) / k``."""
    span = lay.ep * lay.etp
    flex = lay.moe_flex_dispatcher if (shape is not None and shape.num_experts > 0 and shape.topk > 0) else ""
    if span <= lay.gpus_per_node:
        if flex:
            return _distinct_destinations(shape.num_experts, shape.topk, lay.ep) / shape.topk
        return (lay.ep - 1) / lay.ep
    local = max(1, lay.gpus_per_node // max(1, lay.etp))
    if flex == "deepep":
        nodes = max(1, lay.ep // local)
        return _distinct_destinations(shape.num_experts, shape.topk, nodes) / shape.topk
    if flex:
        per_rank = _distinct_destinations(shape.num_experts, shape.topk, lay.ep) / (lay.ep - 1)
        return (lay.ep - local) * per_rank / shape.topk
    return (lay.ep - local) / lay.ep


def _distinct_destinations(experts: int, topk: int, destinations: int) -> float:
    """Expected number of the ``destinations - 1`` other destinations (of ``destinations``, each
    holding ``experts / destinations`` experts) that hold at least one of a token's ``topk``
    distinct experts, chosen uniformly: ``(D - 1) * (1 - C(E - E/D, k) / C(E, k))``."""
    from math import comb

    if destinations <= 1:
        return 0.0
    per = experts // destinations
    k = min(topk, experts)
    none = comb(experts - per, k) / comb(experts, k) if experts - per >= k else 0.0
    return (destinations - 1) * (1.0 - none)


def combined_1f1b_layer_seconds(attn_fwd: float, attn_bwd: float, mlp_fwd: float, mlp_dgrad: float,
                                mlp_wgrad: float, a2a: float) -> float:
    """Seconds of one MoE layer's forward (microbatch A) merged with another layer's backward
    (microbatch B) by megatron-core's combined 1F1B schedule (``overlap_moe_expert_parallel_comm``:
    ``TransformerLayerSchedulePlan.run`` in ``megatron/core/models/common/model_chunk_schedule_plan.py``):
    the all-to-alls on a communication stream, the compute on the compute stream, in the order
    that function issues them and with the data dependencies between them::

        comm: combine_bwd(B)      | dispatch_fwd(A) -> dispatch_bwd(B)            | combine_fwd(A)
        comp: pre_dispatch_fwd(A) | mlp_bwd(B) -> mlp_bwd_dw(B) -> mlp_fwd(A)     | pre_dispatch_bwd(B)

    ``attn_fwd`` / ``attn_bwd``: the pre-dispatch part (attention, router, permute) forward and
    backward; ``mlp_fwd``, ``mlp_dgrad``, ``mlp_wgrad``: the experts' forward, data-gradient and
    (delayed, ``delay_wgrad_compute``) weight-gradient GEMMs; ``a2a``: one all-to-all (dispatch
    and combine move the same bytes). An all-to-all hides only behind the compute it is paired
    with: a layer whose all-to-alls outlast their partners is communication-bound however much
    compute the microbatch has in total. Returns the time both streams are done."""
    combine_bwd = a2a                                   # comm, needs nothing of this layer
    pre_fwd = attn_fwd                                  # comp
    mlp_bwd = max(pre_fwd, combine_bwd) + mlp_dgrad     # comp: after its gradient arrives
    dispatch_fwd = max(combine_bwd, pre_fwd) + a2a      # comm: after the router and permute
    mlp_dw = mlp_bwd + mlp_wgrad                        # comp
    dispatch_bwd = max(dispatch_fwd, mlp_bwd) + a2a     # comm: after the experts' data gradient
    mlp_f = max(mlp_dw, dispatch_fwd) + mlp_fwd         # comp: after the tokens arrive
    combine_fwd = max(dispatch_bwd, mlp_f) + a2a        # comm: after the experts' forward
    pre_bwd = max(mlp_f, dispatch_bwd) + attn_bwd       # comp: after the gradient's dispatch back
    return max(combine_fwd, pre_bwd)


def combined_1f1b_unpaired_share(lay: Layout, stage: int) -> float:
    """Share of a rank's forward (and backward) model chunks the combined 1F1B schedule runs
    unpaired, their all-to-alls exposed: the warm-up forwards and cool-down backwards of
    megatron-core's pipeline schedule (``get_pp_rank_microbatches`` in
    ``megatron/core/pipeline_parallel/schedules.py``: ``(pp - rank - 1) * 2 + (vpp - 1) * pp``
    with virtual stages, ``pp - rank - 1`` without, plus the one extra forward the overlap
    schedules first) of the ``m * vpp`` chunks; without pipelining the first forward and the last
    backward (``combined_1f1b_schedule_for_no_pipelining``)."""
    m, p, v = lay.num_microbatches, lay.pp, max(1, lay.vpp)
    if p == 1:
        warm = 1
    elif v > 1:
        warm = (p - stage - 1) * 2 + (v - 1) * p + 1
    else:
        warm = p - stage - 1 + 1
    return min(1.0, warm / max(1, m * v))


def tp_hiding_share(shape: ModelShape, lay: Layout, counts: tuple[int, int]) -> float:
    """Share of a rank's GEMM time the overlapped TP collectives hide behind.

    Without userbuffers: the backward GEMMs of the column-parallel layers (QKV and FC1: the
    data- and weight-gradient GEMMs Transformer Engine runs beside the async re-gather and
    reduce-scatter), 2/3 of their share of the decoder's GEMM FLOPs. With
    ``Layout.tp_comm_overlap`` (userbuffers, megatron-core ``tp_comm_overlap``): every GEMM of
    the layer, each split into chunks that run beside the ring exchange of the next
    (Transformer Engine ``CommOverlap`` / ``CommOverlapP2P``)."""
    if lay.tp_comm_overlap:
        return 1.0
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    gate = 3 if shape.gated else 2
    dense_n, moe_n = counts
    qkv, proj = h * (a + 2 * g) * d, a * d * h
    mlp = gate * h * shape.ffn if dense_n else 0.0
    col = qkv + (h * shape.ffn * (gate - 1) if dense_n else 0.0)
    total = qkv + proj + mlp
    return 2 / 3 * col / total if total else 0.0


def pipeline_p2p(shape: ModelShape, lay: Layout, gpu: GPU, calib: Calibration) -> tuple[float, float, bool]:
    """(transfer seconds at 100% of the link, latency seconds, crosses nodes) of the pipeline's
    p2p exchanges on a step's critical path: one per microbatch and chunk and one per extra stage
    (``m * vpp + pp - 1``), each a latency plus the activation's transfer (both directions at
    once), not hidden (a sync follows each). Zeros without pipeline parallelism."""
    m, p, v = lay.num_microbatches, lay.pp, max(1, lay.vpp)
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * input_length(shape, lay) / lay.cp
    p2p_raw = p2p_lat = 0.0
    p2p_network = False
    if p > 1:
        # Neighbouring stages are tp*cp*dp ranks apart (rank order tp-cp-ep-dp-pp).
        exchanges = m * v + p - 1
        bw, p2p_network = bandwidth(gpu, lay, lay.tp * lay.cp * lay.dp * 2, calib, raw=True)
        p2p_raw = exchanges * y * T * shape.hidden / lay.sequence_divisor / bw
        p2p_lat = exchanges * calib.collective_latency_seconds
    return p2p_raw, p2p_lat, p2p_network


def dp_overlap(lay: Layout) -> tuple[bool, bool]:
    """(gradient reduction, parameter all-gather) overlapped with compute. Megatron-FSDP turns
    both on whatever the config says where it shards them (``MegatronFSDP.__init__``: the
    reduce-scatter with ``optim_grads`` / ``optim_grads_params``, the all-gather with
    ``optim_grads_params``); torch FSDP2 always overlaps."""
    weights, grads, _ = fsdp_sharding(lay)
    if lay.fsdp == "none":
        return lay.overlap_grad_reduce, lay.overlap_param_gather
    return lay.overlap_grad_reduce or grads, lay.overlap_param_gather or weights


def ddp_buckets(lay: Layout, p_dense: float, p_expert: float) -> int:
    """Gradient buckets of megatron-core's DDP on a rank whose NaN check syncs the host: with
    ``overlap_grad_reduce`` and data parallelism, buckets of ``max(40M, 1M * dp)`` parameters per
    buffer (dense, expert); else one bucket per buffer. FSDP: 0 (Megatron-FSDP does not check
    gradients per bucket; megatron-core 0.16.1 reads ``check_for_nan_in_grad`` only in DDP)."""
    if lay.fsdp != "none":
        return 0
    n = max(1, lay.dp * lay.cp)
    if lay.overlap_grad_reduce and n > 1:
        size = max(DDP_BUCKET_PARAMS, 1_000_000 * n)
        return max(1, -(-int(p_dense) // size)) + (max(1, -(-int(p_expert) // size)) if p_expert else 0)
    return 1 + (1 if p_expert else 0)


def dp_comm_seconds(lay: Layout, gpu: GPU, calib: Calibration, p_dense: float, p_expert: float,
                    grad_b: int, param_b: int) -> tuple[float, float] | None:
    """(gradient reduction, parameter all-gather) seconds per step at the calibrated bandwidth,
    or None without data parallelism.

    Distributed optimizer: reduce-scatter of the gradient buffer over ``dp * cp`` ranks
    (expert gradients over the expert-DP group) then all-gather of the updated bf16 parameters;
    otherwise an all-reduce (twice the reduce-scatter's volume) and no all-gather. Ring cost:
    ``bytes * (n-1)/n / bandwidth`` per reduce-scatter or all-gather. Megatron-FSDP
    (:func:`~dlmspec.plan.memory.fsdp_sharding`): ``optim`` / ``optim_grads`` reduce-scatter and
    gather the updated parameters once, like the distributed optimizer; ``optim_grads_params``
    (and torch FSDP2) gathers the parameters in forward and again in backward; ``no_shard``
    all-reduces.
    """
    n = lay.dp * lay.cp
    ne = lay.expert_dp
    if n <= 1 and (ne <= 1 or not p_expert):
        return None
    span = lay.tp * lay.cp * lay.dp
    bw, _ = bandwidth(gpu, lay, span, calib)
    grad_t = param_t = 0.0
    weights_sharded, _, sharded = fsdp_sharding(lay)
    factor = 1.0 if sharded else 2.0
    if n > 1:
        grad_t += factor * grad_b * p_dense * (n - 1) / n / bw
        if sharded:
            param_t += param_b * p_dense * (n - 1) / n / bw * (2 if weights_sharded else 1)
    if ne > 1 and p_expert:
        ebw, _ = bandwidth(gpu, lay, lay.world // max(1, lay.pp), calib)
        grad_t += factor * grad_b * p_expert * (ne - 1) / ne / ebw
        if sharded:
            param_t += param_b * p_expert * (ne - 1) / ne / ebw
    return grad_t, param_t
