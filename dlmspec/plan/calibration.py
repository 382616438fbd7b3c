"""The planner's calibration constants, in one place.

Everything else in :mod:`dlmspec.plan` is counted from the model's shapes and the parallel
layout (bytes of each tensor megatron-core keeps, FLOPs of each GEMM, bytes of each
collective). What cannot be counted - how fast kernels run compared with the datasheet peak,
what CUDA and NCCL take outside PyTorch's allocator, CPU launch overhead - is a constant of
:class:`Calibration`. ``bench/plan/calibrate.py`` refits the fitted ones from GPU measurements
(``bench/results/*.json``) and can write them back here (``--write`` rewrites the defaults
below, one ``name: type = value`` line each).

Memory model: ``peak_allocated_bytes`` (what ``torch.cuda.max_memory_allocated()`` reports) =
counted terms, with the activation terms scaled by :attr:`Calibration.activation_scale`, plus
:attr:`Calibration.allocated_overhead_bytes`. ``peak_bytes`` (what must fit on the GPU) adds
memory PyTorch's allocator does not report as allocated: the CUDA context, NCCL's buffers and
the caching allocator's reserve.

Time model (``dlmspec.plan.time``): per microbatch, max(GPU time, host launch time) plus host
syncs, where GPU time = GEMM FLOPs / (peak * gemm_efficiency) + attention FLOPs / (peak *
attention_efficiency) + element-wise bytes / (HBM bandwidth * memory_efficiency) + kernels *
gpu_seconds_per_kernel + collectives (bandwidth * nvlink_efficiency or network_efficiency, plus
collective_latency_seconds each), host time = kernels * seconds_per_kernel (plus the calls of
torch.compile'd functions * seconds_per_compiled_call, the fused linear cross entropy's chunk-loop
launches * seconds_per_fused_ce_kernel in place of seconds_per_kernel, and Megatron-FSDP's host
operations * fsdp_seconds_per_op), and each sync costs host_sync_seconds - every host
constant scaled by the host's launch speed, ``cluster.host_launch_us`` / host_launch_seconds; per step the optimizer, the step's syncs and step_overhead_seconds. Within
one regime (launch-bound or GPU-bound) every fitted constant enters linearly (as its inverse for
efficiencies), so ``calibrate.py`` fits them by non-negative least squares on relative errors,
re-deciding each run's regime between rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

MiB = 1024**2


@dataclass(frozen=True)
class Calibration:
    """Constants the planner cannot count. Units are in each name or below.

    Memory (bytes):
        activation_scale: multiplier on the counted activation terms (stored activations, the
            loss's logits buffers and backward transients); 1.0 = the counted tensors exactly.
            Fitted: absorbs temporaries the model does not list (e.g. kernel workspaces).
        allocated_overhead_bytes: allocated memory that does not scale with the model:
            cuBLAS/cuBLASLt workspaces (PyTorch allocates them through its caching allocator:
            32 MiB per handle on Hopper, ``CUBLAS_WORKSPACE_CONFIG``), RNG states, megatron's
            small buffers. Default 64 MiB (two handles: compute and communication streams). Fitted.
        cuda_context_bytes: CUDA context, loaded kernels (cuBLAS, cuDNN, NCCL, PyTorch): not in
            ``max_memory_allocated``. Default 600 MiB: the ``nvidia-smi`` footprint of a
            PyTorch 2.x process on Hopper that has run a bf16 GEMM and SDPA (typically
            500-700 MiB). Not fitted (measurements report allocated memory only).
        nccl_bytes_per_group: NCCL's own buffers per communicator the rank joins (with more than
            one rank): ``NCCL_BUFFSIZE`` (4 MiB) times channels and peers, plus proxy state;
            default 64 MiB per group, the order NCCL 2.2x reports on 8-GPU NVLink nodes.
        allocator_reserve_fraction: memory the caching allocator holds but has not handed
            out (fragmentation: reserved - allocated at the peak), as a fraction of the peak
            allocated bytes. Default 0.05 (5%), the usual gap between
            ``max_memory_reserved`` and ``max_memory_allocated`` in megatron training without
            ``expandable_segments``.

    Time (dimensionless efficiencies in (0, 1], seconds):
        gemm_efficiency: achieved / datasheet dense peak for the model's GEMMs. Default 0.70
            (large bf16 GEMMs reach 70-80% of peak on H100 with cuBLASLt). Fitted.
        fp8_gemm_efficiency: the same for the fp8 GEMMs of the Transformer Engine path (the decoder
            layers' linear layers with ``precision.fp8``), against the GPU's dense fp8 peak; the
            output layer's GEMMs stay bf16 (``gemm_efficiency``). Fitted on TE fp8 runs only (no
            local run has fp8); the default is ``gemm_efficiency``'s value (what fp8 plans used
            before the constant existed), which the fit is pulled towards.
        attention_efficiency: the same for the attention core (QK^T and PV inside the SDPA
            kernel) of the backend the calibration runs took - cuDNN's (torch 2.11 on an H200);
            other backends scale it by ``dlmspec.plan.time.ATTENTION_BACKEND_SPEED`` (flash 0.703,
            from a profile). Default 0.45 (FlashAttention-2 forward+backward on H100, Dao 2023
            reports 35-50% of peak). Fitted.
        memory_efficiency: achieved / datasheet HBM bandwidth for the element-wise kernels
            (norms, activations, RoPE, residuals, cross entropy, optimizer). Default 0.70. Fitted.
        nvlink_efficiency: achieved NCCL bus bandwidth / NVLink per-direction bandwidth. Default
            0.75 (NCCL all-gather/reduce-scatter on 8x H100 NVSwitch: ~340 of 450 GB/s). Fitted
            with two-GPU measurements.
        network_efficiency: the same for the inter-node network (``cluster.inter_node_gbps``).
            Default 0.80. Not fitted by single-node measurements.
        seconds_per_kernel: host (CPU) time per kernel launch: PyTorch's dispatcher, the CUDA
            launch and megatron-core's Python modules around it, averaged over forward (Python)
            and backward (autograd's C++ engine). A microbatch is launch-bound when its kernels
            times this exceed its GPU time - small models on fast GPUs. Fitted (tens of
            microseconds in megatron-core's eager local path), on the typical host
            (``host_launch_seconds``); its ratio to ``host_launch_seconds`` is what the fit
            determines: a megatron-core kernel costs that many micro-benchmark launches.
        gpu_seconds_per_kernel: the least GPU time of a kernel (launch latency on the device,
            ramp-up and tail of a tiny grid): 3e-6 s, the back-to-back rate of small kernels on
            Hopper. Not fitted.
        host_launch_seconds: the typical host (CPU) time per eager kernel launch as
            ``backends/megatron/hostbench.py`` measures it (median of 5 x 4,000 tiny ``torch.add``
            launches from Python; the runtime logs it in metrics.jsonl, event ``host_launch``):
            the host the host constants (``seconds_per_kernel``, ``host_sync_seconds``,
            ``fsdp_seconds_per_op``, ``seconds_per_compiled_call``, ``seconds_per_fused_ce_kernel``)
            are stated for. A spec's ``cluster.host_launch_us`` scales
            them by ``host_launch_us * 1e-6 / host_launch_seconds``; a spec without it is planned
            on this typical host. ``bench/plan/calibrate.py --write`` sets it to the median of the
            measured runs' values (before any run recorded one: 6e-6 s, an estimate - an eager
            PyTorch op costs ~3-10 us of host time on current x86 servers: dispatcher,
            allocator, ``cudaLaunchKernel``).
        fsdp_seconds_per_op: host time of one of Megatron-FSDP's per-step host operations
            (:func:`dlmspec.plan.launches.fsdp_host_ops`: gradient hooks per parameter tensor,
            all-gathers, releases and reduce-scatters per bucket, the DTensor gradient and weight
            copies of the optimizer step), on the typical host. Fitted (default: seconds_per_kernel,
            one launch per operation).
        seconds_per_compiled_call: host time of one call of a ``torch.compile``'d function of the
            local path (:func:`dlmspec.plan.launches.compiled_calls_per_microbatch`: the fused QKV
            function, the compiled norms, fused RoPE; forward and backward each a call) beyond
            the launches of its kernels, which count as kernels: Dynamo's guard check,
            AOTAutograd's runtime wrapper and autograd ``Function``, Inductor's Python wrapper and
            Triton launchers. On the typical host. Fitted; the runs that fix it are
            ``demo-mdm-b32-s512-defaults`` against ``-fusedce`` (launch-bound: every compiled
            function on, 0.1141 s, against none, 0.0963 s, ``calibration_h200x2_session4b.json``)
            and the fused-RoPE runs (``demo-cp2``, ``demo-cp2-ar``, ``demo-fsdp``).
        seconds_per_fused_ce_kernel: host time of one launch of the fused linear cross entropy's
            chunk loop (:func:`dlmspec.plan.launches.fused_ce_kernels`, ``[kernels] cross_entropy =
            "fused_linear"``), on the typical host, in place of ``seconds_per_kernel``: Liger runs
            the loop inside one ``autograd.Function`` (``LigerFusedLinearCrossEntropyFunction``),
            plain torch calls (``matmul``, ``addmm``, slicing) and Triton kernel launches from a
            tight Python loop, without megatron-core's modules or autograd's per-op nodes -
            close to the micro-benchmark's bare ``torch.add`` launch. Fitted; the default (the
            prior the fit is pulled towards) is one micro-benchmark launch, host_launch_seconds.
            The runs that fix it are ``demo-mdm-b32-s512-fusedce`` (launch-bound, ~530 such
            launches per microbatch, no slower than megatron's cross entropy: 0.0963 s against
            0.0936 s) and ``-defaults``.
        host_sync_seconds: cost of one host-device synchronisation (``.item()``, ``.tolist()``
            of a GPU tensor, ``torch.cuda.synchronize()``, an event wait): the device-to-host
            round trip plus the GPU idling while the host, which had to wait, enqueues work
            again (mostly host work, so it scales with the host's launch speed like
            seconds_per_kernel). Fitted.
        collective_latency_seconds: fixed cost of one NCCL collective or p2p exchange (launch
            and handshake), on top of bytes / bandwidth: 2e-5 s (NCCL's small-message latency
            inside an NVLink node is 10-30 us). Not fitted.
        step_overhead_seconds: fixed cost per optimizer step (data loader hand-off, loss
            reduction, grad-norm and logging syncs). Default 0.01 s. Fitted.
        dp_overlap_exposed_fraction: with ``overlap_grad_reduce`` / ``overlap_param_gather``,
            the fraction of the data-parallel collectives left exposed (the last bucket, plus
            whatever exceeds the compute it hides behind). Default 0.2.
    """

    activation_scale: float = 1.02
    allocated_overhead_bytes: float = 74574798
    cuda_context_bytes: float = 600 * MiB
    nccl_bytes_per_group: float = 64 * MiB
    allocator_reserve_fraction: float = 0.05
    gemm_efficiency: float = 0.8303
    fp8_gemm_efficiency: float = 0.8303
    attention_efficiency: float = 0.3865
    memory_efficiency: float = 0.9722
    nvlink_efficiency: float = 0.225
    network_efficiency: float = 0.80
    seconds_per_kernel: float = 5.534e-05
    gpu_seconds_per_kernel: float = 3e-6
    host_sync_seconds: float = 6.167e-05
    host_launch_seconds: float = 1.04e-05
    fsdp_seconds_per_op: float = 4.319e-05
    seconds_per_compiled_call: float = 0.0004185
    seconds_per_fused_ce_kernel: float = 1.396e-05
    collective_latency_seconds: float = 2e-5
    step_overhead_seconds: float = 0.0003552
    dp_overlap_exposed_fraction: float = 0.2

    def with_values(self, **changes: float) -> "Calibration":
        """A copy with some constants replaced (raises ``TypeError`` for an unknown name)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Name -> value, in declaration order (JSON-ready)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Where the fitted defaults above come from (``bench/plan/calibrate.py --write`` sets it).
FITTED_FROM = 'calibration_1gpu_h200.json, calibration_1gpu_h200_c.json, calibration_1gpu_h200_fusedce.json, calibration_2gpu_h200x2.json, calibration_2gpu_h200x2_tp2sp.json, calibration_h200x2_session3.json, calibration_h200x2_session4.json, calibration_h200x2_session4b.json, calibration_h200x2_session4c.json, calibration_h200x2_session5.json (70 runs)'

#: The constants every plan uses unless one passes another :class:`Calibration`.
DEFAULT_CALIBRATION = Calibration()

#: Names ``bench/plan/calibrate.py`` fits from measurements (the others are documented defaults).
FITTED = (
    "activation_scale",
    "allocated_overhead_bytes",
    "gemm_efficiency",
    "fp8_gemm_efficiency",
    "attention_efficiency",
    "memory_efficiency",
    "nvlink_efficiency",
    "seconds_per_kernel",
    "host_sync_seconds",
    "step_overhead_seconds",
    "fsdp_seconds_per_op",
    "seconds_per_compiled_call",
    "seconds_per_fused_ce_kernel",
    "host_launch_seconds",
)


@dataclass(frozen=True)
class MeasuredRange:
    """What the calibration runs of one layer path covered, each dimension on its own (a plan
    inside every range can still combine them in a way no run did).

    ``bench/plan/calibrate.py``'s :func:`measured_range` computes it from the committed runs
    (``bench/results/*.json``); ``tests/plan/test_plan_provenance.py`` checks the literals below
    against it, so a new calibration run that widens a range fails the test until they are
    updated. Attributes are ``(least, largest)`` pairs unless named otherwise:

    Attributes:
        gpus: catalog ids of the GPUs measured (``cluster.gpu``).
        world_size: GPUs per run.
        parameters: total parameter counts (``dlmspec.params``, tokenizer vocabulary).
        micro_batch: ``train.micro_batch_size``.
        seq_length: ``train.seq_length``.
        tokens_per_microbatch: ``micro_batch * seq_length``.
        fp8: the ``precision.fp8 != "none"`` values measured (``(False,)``: bf16 only).
        fp8_recipes: the ``precision.fp8_recipe`` values of the fp8 runs (``()``: no fp8 run).
        num_experts: MoE expert counts measured (``()``: no MoE run).
        rope_fusion: the ``kernels.apply_rope_fusion`` values of the runs with rotary embeddings
            (fused RoPE changes the element-wise kernels and their activations, which the fitted
            constants absorb).
        parallel_max: the largest TP, PP, CP and EP of a run.
        runs: how many runs, and the files (:data:`FITTED_FROM`).
    """

    gpus: tuple[str, ...]
    world_size: tuple[int, int]
    parameters: tuple[int, int]
    micro_batch: tuple[int, int]
    seq_length: tuple[int, int]
    tokens_per_microbatch: tuple[int, int]
    fp8: tuple[bool, ...]
    fp8_recipes: tuple[str, ...]
    num_experts: tuple[int, ...]
    rope_fusion: tuple[bool, ...]
    parallel_max: dict[str, int]
    runs: int


#: What the runs behind :data:`DEFAULT_CALIBRATION` covered (all on the local+sdpa layer path;
#: ``bench/plan/calibrate.py``'s ``measured_range``, checked by tests/plan/test_plan_provenance.py).
LOCAL_MEASURED = MeasuredRange(
    gpus=("h200",),
    world_size=(1, 2),
    parameters=(152712960, 1720574976),
    micro_batch=(4, 32),
    seq_length=(512, 4096),
    tokens_per_microbatch=(2048, 16384),
    fp8=(False,),
    fp8_recipes=(),
    num_experts=(8,),
    rope_fusion=(False, True),
    parallel_max={"tp": 2, "pp": 2, "cp": 2, "ep": 2},
    runs=70,
)

#: Names of the Transformer Engine path's own constants: :data:`FITTED` plus the allocator's reserve
#: (the TE runs record ``torch.cuda.max_memory_reserved()`` as well, ``bench/gpu/te_calibration.sh``).
TE_FITTED_NAMES = FITTED + ("allocator_reserve_fraction",)

# The Transformer Engine path's calibration: ``bench/plan/calibrate.py --write`` rewrites
# the lines between the two markers from the TE records of ``bench/results/*.json`` (``"impl":
# "transformer_engine"``; held-out records are left out of the fit). ``TE_FITTED`` maps each of
# :data:`TE_FITTED_NAMES` to its fitted value (the others are :data:`DEFAULT_CALIBRATION`'s),
# ``TE_FITTED_FROM`` names the files and ``TE_MEASURED`` is what those runs covered (one H200,
# Qwen3-1.7B-architecture DLM at seq 4096: bf16 / fp8 delayed and tensorwise, micro batch 4..16, recompute,
# an 8-expert MoE). calibration_te_h200.json holds 9 configurations measured once each: 6 fitted, 3 held out
# (planned before they were measured); calibration_te_h200_session9.json (2 runs) and
# calibration_te_h200_session12.json (6 runs, 2 of them held-out configurations) repeat some: the fit used
# 12 runs of the 6 fitted configurations, the "12 runs" below (docs/planner-methods.md). The runs are planned as they
# ran: cross entropy in PyTorch row chunks (calibrate.py's TE_RECORD_FUSED_LINEAR_IMPL), RoPE unfused. ``None`` would mean no TE calibration run: the TE path
# planned with the local path's constants and marked "uncalibrated".
# te-calibration:begin
TE_FITTED: dict[str, float] | None = {
    'activation_scale': 0.9395,
    'allocated_overhead_bytes': 1406576132,
    'gemm_efficiency': 0.9048,
    'fp8_gemm_efficiency': 0.7481,
    'attention_efficiency': 0.2744,
    'memory_efficiency': 0.9722,
    'nvlink_efficiency': 0.225,
    'seconds_per_kernel': 0.0001002,
    'host_sync_seconds': 6.633e-05,
    'step_overhead_seconds': 0.0003577,
    'fsdp_seconds_per_op': 4.319e-05,
    'seconds_per_compiled_call': 0.0004185,
    'seconds_per_fused_ce_kernel': 1.411e-05,
    'host_launch_seconds': 9.818e-06,
    'allocator_reserve_fraction': 0.029,
}
TE_FITTED_FROM: str | None = 'calibration_te_h200.json, calibration_te_h200_session12.json, calibration_te_h200_session9.json (12 runs)'
TE_MEASURED: MeasuredRange | None = MeasuredRange(
    gpus=('h200',),
    world_size=(1, 1),
    parameters=(2031739904, 3089163264),
    micro_batch=(4, 16),
    seq_length=(4096, 4096),
    tokens_per_microbatch=(16384, 65536),
    fp8=(False, True),
    fp8_recipes=('delayed', 'tensorwise'),
    num_experts=(8,),
    rope_fusion=(False,),
    parallel_max={'tp': 1, 'pp': 1, 'cp': 1, 'ep': 1},
    runs=12,
)
# te-calibration:end

#: Layer path -> (the constants fitted on it, what its runs covered). A path missing here has no
#: calibration run: the planner plans it with the local path's constants and marks every number
#: "uncalibrated" (:mod:`dlmspec.plan.provenance`). The Transformer Engine path is here once its
#: block above is fitted.
CALIBRATED_PATHS: dict[str, tuple[Calibration, MeasuredRange]] = {
    "local+sdpa": (DEFAULT_CALIBRATION, LOCAL_MEASURED),
}
if TE_FITTED is not None and TE_MEASURED is not None:
    CALIBRATED_PATHS["transformer_engine"] = (DEFAULT_CALIBRATION.with_values(**TE_FITTED), TE_MEASURED)

#: Layer path -> the files its constants were fitted from (``None``: not fitted).
FITTED_FROM_BY_PATH: dict[str, str | None] = {"local+sdpa": FITTED_FROM, "transformer_engine": TE_FITTED_FROM}
