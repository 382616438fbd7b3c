"""Step time of a training run: GPU work, host (CPU) launch time, host-device synchronisation
and exposed communication, from the GPU catalog (:mod:`dlmspec.gpus`) and :class:`Calibration`.

Per pipeline rank and microbatch (the slowest rank sets the pace):

* GPU work: GEMMs, ``3 *`` forward FLOPs (plus recomputed forwards) on the rank at
  ``peak * gemm_efficiency`` (fp8 GEMMs at the fp8 peak); the attention core at
  ``peak * attention_efficiency``; element-wise kernels (norms, residual adds, RoPE, activation,
  MoE permutes, cross entropy, the embedding gradient, weight-gradient accumulation) as bytes
  read + written (:func:`elementwise_bytes`) at ``hbm * memory_efficiency``; every kernel at least
  ``gpu_seconds_per_kernel``; TP collectives (sequence parallel: all-gather + reduce-scatter of
  ``y*T*h`` bytes, twice per layer forward and twice backward; without SP all-reduces of the same
  volume), the backward EP all-to-alls and the CP key/value exchange (:data:`CP_KV_EXCHANGES`:
  the ring beyond the attention it overlaps, the all-gather whole).
  Per-rank FLOPs: attention and MLP GEMMs split over TP, the sequence over CP, experts'
  token-GEMMs over EP x expert TP (:func:`dlmspec.plan.memory.expert_tokens`).
* host work: every kernel is launched by the CPU (PyTorch eager mode, megatron-core's Python
  modules): :func:`kernels_per_microbatch` times ``seconds_per_kernel``. Kernel launches are
  asynchronous, so the host runs ahead of the GPU and a microbatch takes
  ``max(GPU time, host time)``: small models are launch-bound (the GPU waits for the host; the
  excess is reported as ``kernel_launch``), large ones GPU-bound. The launch count scales with
  the layers of the rank and, for megatron-core's ``SequentialMLP`` (the local experts run one
  after the other), with the local experts. The fused linear cross entropy's chunk loop
  (:func:`fused_ce_kernels`) launches from one ``autograd.Function``'s tight Python loop, each
  launch at ``seconds_per_fused_ce_kernel`` instead.
* host-device synchronisations, where the host waits for the GPU to drain and cannot run ahead
  (``host_sync_seconds`` each, outside the max): MoE dispatch (the token counts the all-to-all
  needs on the host, megatron-core ``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``;
  the unfused permute's ``masked_select``), pipeline p2p (``batch_p2p_sync``: megatron-core
  ``P2PCommunicator._communicate`` calls ``torch.cuda.synchronize()`` after every batched
  send/recv), MDM's variable-length draw.
* what such a sync exposes: the forward EP all-to-alls (dispatch and combine sit between two
  dispatcher syncs, so they are not hidden behind host work) and the counts' all-gather, each
  with ``collective_latency_seconds``.

Per step: ``(m + (pp-1)/vpp)`` microbatch times (the 1F1B/interleaved schedule's bubble of
``(pp-1)/(m*vpp)``, Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM", sec. 2.2), the pipeline's p2p exchanges (one per microbatch and
chunk on the critical path, each a latency plus the activation's transfer, not overlapped since
each is followed by a sync), the data-parallel gradient reduce-scatter (all-reduce without the
distributed optimizer) and parameter all-gather - hidden behind backward/forward with
``overlap_grad_reduce``/``overlap_param_gather`` except ``dp_overlap_exposed_fraction`` of it -,
the optimizer (its HBM traffic; on the local path megatron-core's fallbacks for Apex's
multi-tensor kernels loop over the parameter tensors: ``local_multi_tensor_l2_norm`` takes one
host sync per tensor, ``local_multi_tensor_scale`` and the main-to-model parameter copy launch
kernels per tensor), the per-step syncs (grad norm, DDP's NaN check per bucket, the training
loop's flags) and a fixed overhead.

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
from dlmspec.plan.memory import expert_tokens, fsdp_sharding, linear_params, stage_layer_counts, stage_params
from dlmspec.plan.shape import DTYPE_BYTES, Layout, ModelShape, attention_backend, norms_compiled, qkv_fused

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

#: Kernels per transformer layer per microbatch, forward + backward. Local path: counted by
#: ``bench/plan/count_kernels.py`` on megatron-core's local layers (33 forward, 45 backward with
#: the 8 ``main_grad`` accumulations; fused RMSNorm, compiled SwiGLU, flash SDPA, unfused RoPE).
#: Transformer Engine fuses the norms into the GEMMs (~45, from profiler traces).
KERNELS_PER_LAYER = {"local+sdpa": 78, "transformer_engine": 45}
#: The forward share, launched again by full recomputation.
KERNELS_PER_LAYER_FORWARD = {"local+sdpa": 33, "transformer_engine": 18}
#: RoPE's share of the local layer's kernels (forward, backward), in the counts above: megatron-core's
#: unfused ``_apply_rotary_pos_emb_bshd`` for q and for k (cos, sin, their casts, the rotate-half's
#: negation and ``cat``, two multiplications, an addition, the ``cat`` with the pass-through part:
#: 20 forward, 14 backward, counted by ``bench/plan/count_kernels.py`` as a rotary layer minus a
#: learned-position one). With ``[kernels] apply_rope_fusion`` (``backends/megatron/rope.py``) one
#: compiled Triton kernel per tensor forward and one backward: 2 + 2 (the profile of Qwen3-1.7B
#: with fused RoPE: ``triton_poi_fused__to_copy_add_cat_cos_mul_neg_sin_slice_0`` and
#: ``..._clone_cos_mul_neg_permute_sin_split_0``, 56 calls each per step of 28 layers). Without
#: rotary embeddings neither is launched. The TE path's counts are profiler totals with TE's
#: fused RoPE.
KERNELS_ROPE_UNFUSED = (20, 14)
KERNELS_ROPE_FUSED = (2, 2)
#: The local layer's kernels between the QKV projection and attention that ``[kernels]
#: qkv_fusion`` (``backends/megatron/qkv.py``) replaces, besides RoPE's and the q/k norms' (all in
#: :data:`KERNELS_PER_LAYER`, which was counted with q/k RMSNorm): forward the query's reshape copy
#: and the value's contiguous copy for cuDNN, backward the copy of the query's gradient and the
#: ``cat`` of the three gradients into the projection's gradient (the profile of Qwen3-1.7B, micro
#: batch 10 x 4096 on one H200, ``bench/results/throughput_qwen3_1.7b_h200_session4.json``
#: ``profile_mb10_one_microbatch``: direct copies 228 -> 144 calls per step of 28 layers, 3 per
#: layer; ``CatArrayBatchedCopy`` 28 -> 0).
KERNELS_QKV_COPIES = (2, 2)
#: Kernels per norm (forward, backward): PyTorch's (``vectorized_layer_norm_kernel``, then
#: ``layer_norm_grad_input_kernel`` and the weight gradient: 113, 113 and 57 + the q/k norms'
#: calls per step in the session-3 profile, ``before_session3``) and the ``torch.compile``'d
#: norm (``kernels.compiled_norm``, ``backends/megatron/norms.py``): one Triton kernel forward
#: (``triton_per_fused__to_copy_add_div_expand_mul_pow_sum_0``, 57 calls per step = 2 per layer +
#: the final norm) and 4 backward. The compiled backward kernels are not listed one by one in the
#: profile (each below its top-25 cut); 4 per norm and 12 for the fused QKV backward
#: (:data:`KERNELS_QKV_FUSED`) are the one integer solution of the measured total, 4547.5 -> 4633.5
#: kernels per step (+86): per layer 20 kernels replaced (copies 2 + 2, q/k norms 2 x (1 + 2),
#: fused RoPE 2 + 2, the two norms 2 x (1 + 2)) by ``1 + b_qkv + 2 x (1 + b_norm)``, and the final
#: norm's 3 by ``1 + b_norm``: ``28 b_qkv + 57 b_norm = 564``. They are plausible counts for
#: Inductor's backward: the input gradient, the weight gradient as a split reduction (partial and
#: final sums) and its cast per norm; for the QKV function the pointwise kernel that writes the
#: projection's gradient (``triton_poi_fused__to_copy_add_cat_cos_mul_neg_sin_slice_4``, 28 calls),
#: the per-head norm reductions and the q/k weights' split reductions.
KERNELS_NORM = {False: (1, 2), True: (1, 4)}
#: q/k norms per layer (Qwen3/OLMo2 ``qk_layernorm``): 2, one for queries and one for keys.
QK_NORMS = 2
#: The fused QKV function (forward, backward): one Triton kernel forward
#: (``triton_poi_fused__to_copy_add_cat_clone_cos_mul_neg_permute_sin_split_3``, 28 calls per step
#: of 28 layers), 12 backward (see :data:`KERNELS_NORM`).
KERNELS_QKV_FUSED = (1, 12)
#: ``torch.compile``'d functions the local path calls per layer and microbatch, each a Python-side
#: cost on the host (Dynamo's guards, AOTAutograd's runtime wrapper, Inductor's Triton launchers)
#: of ``Calibration.seconds_per_compiled_call`` beside its kernels' launches: the fused QKV
#: function forward and backward (2), each compiled norm forward and backward (2 per norm), fused
#: RoPE on the local path for q and k forward and backward (4, ``backends/megatron/rope.py``; not
#: called when the QKV function applies RoPE). megatron-core's own ``jit_fuser`` functions (SwiGLU,
#: bias-dropout-add), which every measured run called, stay inside ``seconds_per_kernel``.
COMPILED_CALLS_QKV = 2
COMPILED_CALLS_NORM = 2
COMPILED_CALLS_ROPE = 4
#: Effective-bytes factors of the small element-wise kernels around attention on the local path:
#: how many times their counted bytes (reads + writes) they take at the HBM bandwidth, from the
#: Qwen3-1.7B profiles (micro batch 10 x 4096, 28 layers, one H200 at 4.8 TB/s, 40,960 tokens;
#: ``bench/results/throughput_qwen3_1.7b_h200_session4.json`` ``profile_mb10_one_microbatch``):
#: ``norm``: PyTorch's norm kernels 64.0 ms (24.8 + 30.0 + 9.2) against 17.3 ms of counted bytes
#: (57 hidden norms x 5 x 2 B x 2048 + 28 x 5 x 2 B x 3072 q/k channels, per token) = 3.7;
#: ``copies``: the copies and ``cat`` qkv_fusion removes, 32.2 ms (21.3 + 10.9) against 8.8 ms
#: (:data:`QKV_COPY_ELEMENTS`) = 3.7; ``rope_fused``: the two fused RoPE kernels 24.3 ms
#: (15.0 + 9.3) against 5.9 ms (4 bytes per q/k element) = 4.1; ``rope_unfused``: megatron-core's
#: RoPE with the q/k layout copies before cuDNN it needs, about 106 ms (the element-wise and copy
#: kernels fell 243 -> 161 ms with fused RoPE, ``profile_h200x2_2026-11-30.json``, plus fused RoPE's
#: 24.3) against 17.6 ms (12 bytes per q/k element) = 6.0; ``compiled``: the compiled norms and
#: the fused QKV function together, about 63 ms (the QKV kernels 10.3 + 9.0, the norm forward 7.7,
#: and about 36 ms of compiled backward kernels the top list leaves out: the categories' change,
#: copy +3.1, element-wise +3.0, reduction +0.6 ms, plus what the removed copy-category kernels
#: took, 56.5 ms, less the listed new ones, 27.0) against 19.8 ms (57 x 5 x 2 B x 2048 +
#: 28 x 5 x 2 B x 4096 q/k/v channels) = 3.2. Those kernels handle rows of 128 channels
#: (per head) or run as several passes; the rest of the element-wise bytes stays at factor 1
#: (``Calibration.memory_efficiency`` is fitted on top of all of them). Transformer Engine fuses
#: its norms into the GEMMs: no factor there.
ELEMENTWISE_BYTES_FACTOR = {"norm": 3.7, "copies": 3.7, "rope_fused": 4.1, "rope_unfused": 6.0, "compiled": 3.2}
#: Elements per q/k/v channel pass of the copies and ``cat`` that qkv_fusion removes, per token:
#: the query's reshape copy (read + write ``a d``) and its gradient's copy (``a d`` again), the
#: value's contiguous copy (``g d``), the ``cat`` of the gradients (``(a + 2g) d`` read and written):
#: ``(6a + 6g) d``, as a multiple of ``(a + g) d``.
QKV_COPY_ELEMENTS = 6
#: Element passes of the fused QKV function per q/k/v channel and token: forward reads the
#: projection and writes q, k, v; backward reads their gradients and the saved projection and
#: writes the projection's gradient: 5 x ``(a + 2g) d``.
QKV_FUSED_PASSES = 5
#: Element-wise bytes per q/k element of RoPE, forward + backward (y = 2): unfused, its eight-odd
#: kernels read and write the tensor several times (12 bytes per element counted); fused, one
#: read and one write forward and backward (4).
ROPE_BYTES_PER_ELEMENT = {False: 12, True: 4}
#: Attention-core speed of each SDPA backend relative to the backend the calibration runs took,
#: whose speed ``Calibration.attention_efficiency`` is: cuDNN's. On torch 2.11 with cuDNN 9.19 on
#: an H200 PyTorch's own order puts cuDNN first (``check_prefer_cudnn_attention``), and every
#: profiled calibration run (``bench/results/profile_h200x2_2026-11-30.json``) shows only
#: ``cudnn_generated_fort_native_sdpa_sm90_*`` attention kernels. Flash: Qwen3-1.7B at micro batch
#: 10 x 4096 on an H200, flash's forward + backward kernels 15.52 ms per layer (the 14 flash
#: calls of the ``flash_unfused_rope`` step) against cuDNN's 10.91 ms (``cudnn_unfused_rope``:
#: 305.5 ms / 28 layers; the two ran side by side on the two GPUs, their GEMMs within 1%):
#: 10.91 / 15.52 = 0.703. Memory-efficient: 142 against cuDNN's 513 TFLOP/s in the same
#: profile file's SDPA microbenchmark (8 x 4096, 16/8 heads, d 128). Transformer Engine's fused
#: attention is cuDNN's.
ATTENTION_BACKEND_SPEED = {"cudnn": 1.0, "transformer_engine": 1.0, "flash": 0.703, "efficient": 0.277}
#: Extra kernels of a MoE layer over a dense one (router, aux loss, permute/unpermute, dispatcher
#: bookkeeping, minus the dense MLP: 108 - 78 counted) and per local expert (megatron-core
#: ``SequentialMLP`` runs each expert's fc1, activation and fc2 and their backward: 4 + 9 counted).
KERNELS_PER_MOE_LAYER = {"local+sdpa": 30, "transformer_engine": 40}
KERNELS_PER_LOCAL_EXPERT = {"local+sdpa": 13, "transformer_engine": 12}
#: Launches the ``alltoall`` dispatcher adds per MoE layer and microbatch at expert-parallel size
#: > 1 (megatron-core ``MoEAlltoAllTokenDispatcher``: the token counts' all-gather and the
#: ``input_splits``/``output_splits`` arithmetic, the four all-to-alls of tokens and
#: probabilities with their output allocations, ``sort_chunks_by_idxs`` on both sides and the
#: backward of all of it). Measured, not counted: the session-5 profiles
#: (``bench/results/profile_host_h200x2_session5.json``, one run at a time) launch 3,638 kernels
#: per step for ``demo-moe-e8-top2`` (8 local experts, one GPU) and 3,108 per rank for
#: ``demo-moe-ep2`` (4 local experts per rank): 530 fewer, where the counts above drop by 1,104
#: (13 x 4 experts x 12 layers + 5 x 96 parameter tensors), so EP 2 adds 574 launches per
#: microbatch over its 12 MoE layers, 48 each (the 92 NCCL kernels among them). The dispatcher is
#: megatron-core code on both layer paths; the TE path's value is the local one, not measured.
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
#: (``backends/megatron/training.py``); DDP's ``check_for_nan_in_grad`` validates NaN and Inf of
#: each bucket's norm (two syncs per bucket, ``_ParamAndGradBucketGroup.check_grads``); on the
#: local path ``local_multi_tensor_l2_norm`` makes one per parameter tensor.
SYNCS_PER_STEP = 3
SYNCS_PER_BUCKET = 2
#: megatron-core DDP bucket size with ``overlap_grad_reduce``: ``max(40M, 1M * dp)`` parameters.
DDP_BUCKET_PARAMS = 40_000_000

#: Megatron-FSDP's host operations (megatron-core 0.16.1 ``megatron_fsdp.py``,
#: ``param_and_grad_buffer.py``), each costing ``Calibration.fsdp_seconds_per_op`` of host time,
#: counted from the code as Python hook work plus the small kernels, allocations, stream/event
#: waits and NCCL launches it issues. Per microbatch and parameter tensor
#: (:data:`FSDP_OPS_PER_TENSOR`): the post-accumulate-grad hook (``_grad_acc``: ``get_main_grad``,
#: the copy of the gradient into the bucket, ``del grad``; ``GradReducePipeline.reduce_gradients``'
#: readiness bookkeeping: 3) and the per-parameter loops of ``all_gather_and_wait_parameters_ready``
#: in forward and backward (2). Per microbatch and bucket (a ``TransformerLayer`` FSDP unit, plus
#: the group of the parameters outside the units): with sharded weights (``optim_grads_params``,
#: :data:`FSDP_OPS_PER_BUCKET_GATHER`) forward and backward each a pre-hook, the all-gather
#: (allocation, NCCL launch, event), the stream wait, the release after the module and the
#: post-backward autograd function / multi-grad hook registration (12); with sharded gradients
#: (``optim_grads``, ``optim_grads_params``, :data:`FSDP_OPS_PER_BUCKET_REDUCE`) the reduce-scatter
#: (``wait_stream``, ``fetch_bucket``'s allocation, the scaling, ``empty_like``, the NCCL launch,
#: the accumulation ``+=``, ``record_event``, the queue's event wait and the bucket's release: 9).
#: Per step and parameter tensor (:data:`FSDP_STEP_OPS_PER_TENSOR`): ``update_main_grads`` (the
#: shard view, the ``.to(dtype)`` of the gradient and the DTensor gradient the optimizer reads)
#: and the DTensor dispatch of the optimizer's per-tensor work (4); per step and bucket
#: (:data:`FSDP_STEP_OPS_PER_BUCKET`): zeroing the gradient buffer, the main-to-model weight copy
#: and ``start_param_sync``'s all-gather (5).
FSDP_OPS_PER_TENSOR = 5
FSDP_OPS_PER_BUCKET_GATHER = 12
FSDP_OPS_PER_BUCKET_REDUCE = 9
FSDP_STEP_OPS_PER_TENSOR = 4
FSDP_STEP_OPS_PER_BUCKET = 5

#: Bytes the cross entropy reads and writes per logit element (megatron-core
#: ``vocab_parallel_cross_entropy``): forward ``.float()`` 2+4, max 4, subtract 4+4, exp 4+4,
#: sum 4, normalise 4+4; backward scale 4+4, cast to bf16 4+2.
CE_BYTES_PER_LOGIT = 52
#: The fused linear cross entropy (``[kernels] cross_entropy = "fused_linear"``,
#: ``backends/megatron/output_loss.py``) projects only the rows that carry loss: MDM masks each
#: token with probability ``t ~ U(eps, 1)``, so half of them on average; AR all of them.
FUSED_CE_ROW_FRACTION = {"mdm": 0.5, "ar": 1.0}
#: Its output-layer GEMM passes per projected row (``2 h V`` FLOPs each): Liger with per-token
#: weights computes the logits again in backward (forward, recomputed forward, two gradients:
#: 4), the PyTorch chunks compute the gradients in the forward pass (3).
FUSED_CE_GEMM_PASSES = {"liger": 4, "torch": 3}
#: Bytes per logit element: Liger's one Triton kernel reads the bf16 chunk and writes the
#: gradient in place, twice (forward and recompute): 8; the PyTorch chunks' fp32 passes
#: (``.float()``, ``logsumexp`` and its temporary, ``exp_``, ``scatter_add_``, ``mul_``, the bf16
#: cast): about 34.
FUSED_CE_BYTES_PER_LOGIT = {"liger": 8, "torch": 34}

#: Optimizer bytes per owned parameter and step: fused Adam reads master, grad, m, v and
#: writes master, m, v (4 bytes each) and the bf16 parameter (2): 30. torch's foreach AdamW makes
#: ~9 passes (lerp, mul, addcmul, sqrt, div, add, addcdiv, weight decay, copy): ~86.
OPTIMIZER_BYTES = {"transformer_engine": 30, "local+sdpa": 86}


#: Context parallelism's key/value traffic per layer and microbatch, by ``cp_comm_type``: how many
#: times each rank sends ``(cp - 1)`` K/V shards of ``y * T * 2 * g * d / t`` bytes, and whether
#: the transfers overlap the attention. ``p2p`` (Transformer Engine ``AttnFuncWithCPAndKVP2P``,
#: ``a2a`` and ``a2a+p2p`` planned alike): the K/V ring forward, the ring again and dK/dV
#: backward, behind the attention of the chunk in hand. ``allgather`` (megatron-core
#: ``cp_comm_type = "all_gather"``: the local layers' ``dlmspec.backends.megatron.attention``
#: ``SDPACoreAttention``, Transformer Engine ``AttnFuncWithCPAndKVAllGather``): one all-gather
#: of K and V forward and one reduce-scatter of dK/dV backward, ring volume ``(cp - 1)`` shards
#: each, not overlapped ("The all-gather is not async, and cannot be overlapped",
#: ``TransformerConfig.cp_comm_type``), each a collective.
CP_KV_EXCHANGES = {"p2p": (3, True), "allgather": (2, False)}


@dataclass(frozen=True)
class StageWork:
    """One pipeline rank's work per microbatch, at 100% of every peak.

    Attributes:
        stage: pipeline rank.
        gemm_seconds: GEMM FLOPs / peak.
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
            (:data:`CP_KV_EXCHANGES`); cp_overlapped: whether it hides behind the attention;
            cp_collectives: collectives whose latency is exposed (all-gather path).
        fsdp_ops: Megatron-FSDP host operations per microbatch (:func:`fsdp_host_ops`), host
            work beside the kernel launches.
        compiled_calls: calls of ``torch.compile``'d functions per microbatch
            (:func:`compiled_calls_per_microbatch`), host work beside their kernels' launches.
        fused_ce_kernels: the fused linear cross entropy's chunk-loop launches among ``kernels``
            (:func:`fused_ce_kernels`), each at ``Calibration.seconds_per_fused_ce_kernel`` of
            host time instead of ``seconds_per_kernel``.
    """

    stage: int
    gemm_seconds: float
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
    per layer; residual adds 6 (two per layer); RoPE 12 (fused: 4, :data:`ROPE_BYTES_PER_ELEMENT`) and
    q/k norm 5 per q/k element; the
    fused SwiGLU 8 (GELU 5) per ``f`` element; dropout 10 per element
    with dropout; MoE permute/unpermute 8 per routed token copy; the local path's weight-
    gradient accumulation into ``main_grad`` (bf16 gradient written and read, fp32 read and
    written: ``2y + 8`` per weight); the embedding's dense gradient (``2y + 8`` per entry); the
    cross entropy :data:`CE_BYTES_PER_LOGIT` per logit. The norms, q/k norms, RoPE and the QKV
    copies are :func:`attention_block_bytes` (effective bytes on the local path).
    """
    dense_n, moe_n = counts
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * lay.seq / lay.cp
    local = lay.impl != "transformer_engine"
    per_tok = 12 * h * y / r + attention_block_bytes(shape, lay)
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
    if stage == lay.pp - 1 and lay.fused_linear_ce:
        rows = FUSED_CE_ROW_FRACTION.get(shape.objective, 1.0) * T
        total += FUSED_CE_BYTES_PER_LOGIT[lay.fused_linear_backend] * rows * V + (4 + 3 * y) * h * T
        if local:
            total += (2 * y + 8) * V * h
    elif stage == lay.pp - 1:
        total += CE_BYTES_PER_LOGIT * T * V + 5 * h * y * T / r * _norm_factor(lay)
        if local:
            total += (2 * y + 8) * V * h
    return total


def _norm_factor(lay: Layout) -> float:
    """Effective-bytes factor of a norm (:data:`ELEMENTWISE_BYTES_FACTOR`): 1 on the TE path."""
    if lay.impl == "transformer_engine":
        return 1.0
    return ELEMENTWISE_BYTES_FACTOR["compiled" if norms_compiled(lay) else "norm"]


def attention_block_bytes(shape: ModelShape, lay: Layout) -> float:
    """Effective element-wise bytes per token of one layer's two norms and its q/k/v handling
    (forward + backward) on this rank: the norms 5 passes of ``h`` each; with the fused QKV
    function (:func:`~dlmspec.plan.shape.qkv_fused`) :data:`QKV_FUSED_PASSES` of ``(a + 2g) d``;
    else the q/k norms (5 passes of ``(a + g) d``), RoPE (:data:`ROPE_BYTES_PER_ELEMENT`) and the
    copies and ``cat`` (:data:`QKV_COPY_ELEMENTS`) - each times its
    :data:`ELEMENTWISE_BYTES_FACTOR` on the local path (1 and no copies on the TE path)."""
    h, a, g, d = shape.hidden, shape.heads, shape.groups, shape.head_dim
    t, r = lay.tp, lay.sequence_divisor
    y = DTYPE_BYTES[lay.dtype]
    qk = (a + g) * d * y / t
    if lay.impl == "transformer_engine":
        out = 10 * h * y / r
        if shape.rope:
            out += ROPE_BYTES_PER_ELEMENT[lay.rope_fusion] * qk
        if shape.qk_norm:
            out += 5 * qk
        return out
    f = ELEMENTWISE_BYTES_FACTOR
    norm = _norm_factor(lay)
    out = 10 * h * y / r * norm
    if qkv_fused(shape, lay):
        return out + QKV_FUSED_PASSES * (a + 2 * g) * d * y / t * f["compiled"]
    if shape.rope:
        out += ROPE_BYTES_PER_ELEMENT[lay.rope_fusion] * qk * f["rope_fused" if lay.rope_fusion else "rope_unfused"]
    if shape.qk_norm:
        out += 5 * qk * norm
    return out + QKV_COPY_ELEMENTS * qk * f["copies"]


def _path(lay: Layout) -> str:
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
    path = _path(lay)
    layers = dense_n + moe_n
    per_layer, per_layer_fwd = layer_kernels(shape, lay)
    kernels = layers * per_layer
    experts = 0.0
    if moe_n:
        experts = KERNELS_PER_LOCAL_EXPERT[path] * shape.num_experts / lay.ep
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
    path = _path(lay)
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
    path = _path(lay)
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
    is ``Calibration.seconds_per_fused_ce_kernel`` each (:func:`host_seconds`): the loop's plain
    torch calls and Triton launches run inside one ``autograd.Function``, without megatron-core's
    modules around them."""
    if lay.fused_linear_backend == "torch":
        rows = FUSED_CE_ROW_FRACTION.get(shape.objective, 1.0) * lay.micro_batch * lay.seq / lay.cp
        return 15 * -(-rows // 4096)
    return 8 * -(-shape.vocab // shape.hidden)


def syncs_per_microbatch(shape: ModelShape, lay: Layout, stage: int, counts: tuple[int, int]) -> float:
    """Host-device synchronisations of one microbatch on rank ``stage``: :data:`SYNCS_PER_MOE_LAYER`
    per MoE layer, the pipeline's ``torch.cuda.synchronize()`` after each batched p2p exchange
    (megatron-core ``batch_p2p_sync``: the first and last rank exchange once per microbatch, the
    others twice; interleaving exchanges once per chunk and direction) and MDM's
    variable-length draw (``bool(truncate.any())`` in ``backends/megatron/objective.py``) and, on
    the last rank, the fused linear cross entropy's row selection."""
    syncs = counts[1] * SYNCS_PER_MOE_LAYER[_path(lay)]
    if lay.pp > 1:
        if lay.vpp > 1:
            syncs += 2 * lay.vpp
        else:
            syncs += 1 if stage in (0, lay.pp - 1) else 2
    if shape.objective == "mdm" and shape.variable_length_prob > 0:
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
    if stage == lay.pp - 1 and lay.fused_linear_ce:
        rows = FUSED_CE_ROW_FRACTION.get(shape.objective, 1.0) * T
        gemm += FUSED_CE_GEMM_PASSES[lay.fused_linear_backend] * 2 * h * shape.vocab * rows
    elif stage == lay.pp - 1:
        gemm += 3 * 2 * h * shape.vocab / t * T
    attention = layers * attn_core * (3 + frac["attention_core"]) * T
    ew = elementwise_bytes(shape, lay, stage, counts)
    # TP collectives: 4 per layer forward + 4 backward of the gathered [T, h] (same volume as
    # 2 + 2 all-reduces without SP); the output layer and embedding add one pair each.
    tp_s = ep_b = ep_f = cp_s = 0.0
    tp_n = ep_bn = ep_fn = cp_n = 0.0
    tp_net = ep_net = cp_net = False
    cp_overlapped = True
    if t > 1:
        bw, tp_net = _bandwidth(gpu, lay, t, calib, raw=True)
        unit = y * T * h * (t - 1) / t / bw
        tp_n = 8 * layers + (2 if stage == lay.pp - 1 else 0) + (2 if stage == 0 else 0)
        if moe_n and lay.etp > 1:
            tp_n += moe_n * 4 * shape.topk
        tp_s = tp_n * unit
    if moe_n and lay.ep > 1:
        # Expert ranks are ordered etp-ep-edp-pp: an EP group spans etp * ep consecutive ranks.
        # Dispatch and combine, forward and backward; the forward pair sits between the
        # dispatcher's host syncs (exposed), the backward pair overlaps host-bound work.
        span = lay.ep * lay.etp
        bw, ep_net = _bandwidth(gpu, lay, span, calib, raw=True)
        a2a = y * (T / r) * shape.topk * h * (lay.ep - 1) / lay.ep / bw
        ep_f = ep_b = moe_n * 2 * a2a
        ep_fn = moe_n * 3  # dispatch, combine and the all-gather of the token counts
        ep_bn = moe_n * 2
    if lay.cp > 1:
        bw, cp_net = _bandwidth(gpu, lay, lay.tp * lay.cp, calib, raw=True)
        kv = y * T * 2 * g * d / t / bw
        passes, cp_overlapped = CP_KV_EXCHANGES.get(lay.cp_comm_type, CP_KV_EXCHANGES["p2p"])
        cp_s = layers * passes * (lay.cp - 1) * kv
        cp_n = 0.0 if cp_overlapped else layers * passes
    fused_ce = fused_ce_kernels(shape, lay) if (stage == lay.pp - 1 and lay.fused_linear_ce) else 0.0
    return StageWork(
        stage=stage,
        gemm_seconds=gemm / gemm_peak,
        attention_seconds=attention / attn_peak / ATTENTION_BACKEND_SPEED[attention_backend(lay, gpu.compute_capability)],
        elementwise_seconds=ew / (gpu.hbm_gbps * 1e9),
        kernels=kernels_per_microbatch(shape, lay, counts, stage),
        syncs=syncs_per_microbatch(shape, lay, stage, counts),
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
        fsdp_ops=fsdp_host_ops(shape, lay, stage, counts)[0],
        compiled_calls=compiled_calls_per_microbatch(shape, lay, counts, stage),
        fused_ce_kernels=fused_ce,
    )


def _eff(network: bool, calib: Calibration) -> float:
    return calib.network_efficiency if network else calib.nvlink_efficiency


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
    cp = w.cp_comm_seconds / _eff(w.cp_network, calib)
    cp = max(0.0, cp - attention) if w.cp_overlapped else cp + w.cp_collectives * lat
    terms = {
        "gemm": w.gemm_seconds / calib.gemm_efficiency,
        "attention": attention,
        "elementwise": w.elementwise_seconds / calib.memory_efficiency,
        "kernel_launch": w.kernels * calib.gpu_seconds_per_kernel,
        "host_sync": 0.0,
        "tp_communication": w.tp_seconds / _eff(w.tp_network, calib) + w.tp_collectives * lat,
        "ep_communication": w.ep_backward_seconds / _eff(w.ep_network, calib) + w.ep_backward_collectives * lat,
        "cp_communication": cp,
    }
    gpu = sum(terms.values())
    host = host_seconds(w, calib, host_scale)
    launch_bound = host > gpu
    if launch_bound:
        terms["kernel_launch"] += host - gpu
    terms["ep_communication"] += w.ep_forward_seconds / _eff(w.ep_network, calib) + w.ep_forward_collectives * lat
    terms["host_sync"] = w.syncs * calib.host_sync_seconds * host_scale
    return terms, launch_bound


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
        features: the linear features :mod:`bench.plan.calibrate` fits (seconds at 100%;
            launches, syncs and FSDP host operations counted on the typical host: times
            :func:`host_speed`).
        host_scale: :func:`host_speed` of the layout (1.0 on the calibration's typical host).
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
    hs = host_speed(lay, calib)
    best = None
    for i in stages:
        if work_cache is None:
            w = stage_work(shape, lay, gpu, i, calib)
        else:
            key = (i, lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.etp, lay.sp, lay.micro_batch, lay.recompute,
                   lay.recompute_method, lay.recompute_layers, lay.recompute_modules, lay.impl, shape.vocab,
                   lay.fused_linear_ce, lay.fused_linear_backend, lay.fsdp, lay.sharding, lay.rope_fusion,
                   lay.qkv_fusion, lay.compiled_norm, lay.sdpa_backend)
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
    # path: one per microbatch and chunk and one per extra stage, each a latency plus the
    # activation's transfer (both directions at once), not hidden (a sync follows each).
    y = DTYPE_BYTES[lay.dtype]
    T = lay.micro_batch * lay.seq / lay.cp
    p2p_raw = p2p_lat = 0.0
    p2p_network = False
    if p > 1:
        # Neighbouring stages are tp*cp*dp ranks apart (rank order tp-cp-ep-dp-pp).
        exchanges = m * v + p - 1
        bw, p2p_network = _bandwidth(gpu, lay, lay.tp * lay.cp * lay.dp * 2, calib, raw=True)
        p2p_raw = exchanges * y * T * shape.hidden / lay.sequence_divisor / bw
        p2p_lat = exchanges * calib.collective_latency_seconds
    p2p = p2p_raw / _eff(p2p_network, calib) + p2p_lat
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
    path = _path(lay)
    sharded = fsdp_sharding(lay)[2]
    owned = p_dense / (lay.dp * lay.cp) + p_expert / lay.expert_dp if sharded else p_dense + p_expert
    opt_bytes = OPTIMIZER_BYTES[path] * owned
    opt_bytes += (grad_b + 4) * (p_dense + p_expert)  # zero the grad buffer, read it for the norm
    hbm = gpu.hbm_gbps * 1e9
    tensors = param_tensors(shape, lay, slow.stage, counts)
    step_kernels = optimizer_step_kernels(shape, lay, slow.stage, counts)
    fsdp_step_ops = fsdp_host_ops(shape, lay, slow.stage, counts)[1]
    b["optimizer"] = (opt_bytes / (hbm * calib.memory_efficiency)
                      + (step_kernels * calib.seconds_per_kernel + fsdp_step_ops * calib.fsdp_seconds_per_op) * hs)
    step_syncs = SYNCS_PER_STEP + SYNCS_PER_BUCKET * ddp_buckets(lay, p_dense, p_expert)
    if path == "local+sdpa":
        step_syncs += tensors
    b["host_sync"] += step_syncs * calib.host_sync_seconds * hs
    b["step_overhead"] = calib.step_overhead_seconds
    step = sum(b.values())

    # Linear features of the fitted constants (bench/plan/calibrate.py): seconds at 100% of
    # every peak, launches, syncs; the GPU terms of a launch-bound rank and its host launches of
    # a GPU-bound one do not count (the max picks one side).
    scale = m + bubble_mb
    gpu_side = 0.0 if launch_bound else 1.0
    intra = (0 if slow.tp_network else slow.tp_seconds) + (0 if slow.ep_network else slow.ep_backward_seconds)
    features = {
        "gemm": scale * gpu_side * slow.gemm_seconds,
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
    )


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
    bw, _ = _bandwidth(gpu, lay, span, calib)
    grad_t = param_t = 0.0
    weights_sharded, _, sharded = fsdp_sharding(lay)
    factor = 1.0 if sharded else 2.0
    if n > 1:
        grad_t += factor * grad_b * p_dense * (n - 1) / n / bw
        if sharded:
            param_t += param_b * p_dense * (n - 1) / n / bw * (2 if weights_sharded else 1)
    if ne > 1 and p_expert:
        ebw, _ = _bandwidth(gpu, lay, lay.world // max(1, lay.pp), calib)
        grad_t += factor * grad_b * p_expert * (ne - 1) / ne / ebw
        if sharded:
            param_t += param_b * p_expert * (ne - 1) / ne / ebw
    return grad_t, param_t
