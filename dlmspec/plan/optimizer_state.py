"""Bytes and seconds of the optimizer's state, per option of ``[train]``'s optimizer-state keys
(:mod:`dlmspec.spec.optimizer_options`), as megatron-core 0.16.1 and Transformer Engine build it.

All byte counts are per parameter the rank owns (after the distributed optimizer's sharding,
which :func:`dlmspec.plan.memory.stage_memory` applies), for a model whose weights are bf16 or fp16
unless ``dtype = "fp32"``. The weights (2) and the DDP gradient buffer (4 with
``grad_reduce_in_fp32``, else 2) are counted by :mod:`dlmspec.plan.memory`; this module counts the
rest:

* plain (megatron-core's ``DistributedOptimizer`` / ``Float16OptimizerWithFloat16Params``): fp32
  master weights ``shard_model_param.clone().float()`` (4, ``distrib_optimizer.py``
  ``_build_model_and_main_param_groups``) and fp32 ``exp_avg`` / ``exp_avg_sq`` (8): 12, Megatron-LM's
  18 = 2 + 4 + 12 (``theoretical_memory_usage.py``). SGD: one fp32 momentum (4) plus the master.
* precision-aware (``use_precision_aware_optimizer``, Transformer Engine's ``FusedAdam`` with
  ``master_weights=True, master_weight_dtype=main_params_dtype``, ``optimizer/__init__.py``
  ``_get_megatron_optimizer_based_on_param_groups``): the master weight in ``main_params_dtype``,
  or with fp32 master, bf16 weights and ``store_param_remainders`` only its 16 low bits as int16
  (2: ``distrib_optimizer.py`` allocates ``init_shard(torch.int16)``; TE ``FusedAdam``
  ``multi_tensor_adam_param_remainder``); each moment in its dtype (fp32 4, bf16/fp16 2, fp8 1).
  The main gradient is a view of the DDP buffer (``decoupled_grad``, ``_copy_model_grads_to_main_grads``):
  no copy. The step makes an fp32 copy of every state that is not fp32 (TE ``FusedAdam.step``:
  ``get_unscaled_state`` for every parameter of the group, then ``_apply_scale`` back): 4 bytes per
  such state and parameter, alive during the step only (:func:`step_transient_bytes`).
* CPU offload (``optimizer_cpu_offload``, ``HybridDeviceOptimizer`` with ``param_update_in_fp32=True``,
  ``cpu_offloading/hybrid_optimizer.py`` ``_get_sub_optimizer_param_groups``): the offloaded share
  ``f`` of the parameters lives in pinned host memory as an fp32 copy (4), torch AdamW's fp32 moments
  (8) and a pinned fp32 gradient buffer (4): 16 host bytes; the rest stays on the GPU as an fp32 copy
  (4, none for fp32 weights) with fp32 moments (8) stepped by the GPU Adam. The state dtype keys do
  not apply (the hybrid optimizer gets none of them; rule ``cpu-offload-state-dtypes``).

The offload's time (:func:`offload_seconds`) is the gradient copy to the host and the master copy
back over PCIe (:data:`PCIE_GBPS` per GPU model, at :data:`PCIE_EFFICIENCY`) plus torch's fused
AdamW on the host (:data:`HOST_ADAM_BYTES` per parameter at :data:`HOST_ADAM_GBPS`), summed, or
the larger of the two with ``overlap_cpu_optimizer_d2h_h2d``. These constants are stated, not
measured on this project's runs: uncalibrated until ``bench/throughput/optimizer_state_agreement.py``
(its ``te-bf16-cpu-offload`` and ``local-bf16-cpu-offload`` step times) has run on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmspec.spec.optimizer_options import DTYPE_BYTES

if TYPE_CHECKING:
    from dlmspec.plan.shape import Layout

#: Host link bandwidth per GPU and direction, GB/s, by catalog id: the PCIe generation of the
#: vendor datasheets (A100 "PCIe Gen4: 64 GB/s", H100/H200 "PCIe Gen5: 128 GB/s", both directions
#: together; L40S Gen4 x16; HGX B200's hosts attach over Gen5 x16) and GB200's NVLink-C2C (900 GB/s
#: both directions between one Grace and its two B200s: 225 per GPU and direction).
PCIE_GBPS: dict[str, float] = {
    "a100-40gb": 32.0, "a100-80gb": 32.0, "h100": 64.0, "h100-pcie": 64.0, "h200": 64.0,
    "b200": 64.0, "gb200": 225.0, "l40s": 32.0,
}
#: PCIe bandwidth for a GPU not in :data:`PCIE_GBPS` (Gen4 x16), GB/s.
PCIE_GBPS_DEFAULT = 32.0
#: Share of the link rate pinned-memory copies reach (uncalibrated assumption).
PCIE_EFFICIENCY = 0.8
#: Host bytes torch's fused CPU AdamW moves per fp32 parameter: reads weight, gradient and both
#: moments (16) and writes weight and moments (12).
HOST_ADAM_BYTES = 28
#: Host memory bandwidth torch's CPU AdamW gets per GPU of the node, GB/s (uncalibrated
#: assumption: a two-socket node's ~300 GB/s of DRAM bandwidth shared by 8 GPUs' optimizers at
#: about half of its peak).
HOST_ADAM_GBPS = 20.0
#: Bytes of the GPU's Adam traffic per owned parameter and step, plain fp32 state on TE's fused
#: kernel: reads master, gradient, both moments, writes master, both moments and the 16-bit
#: weight (:data:`dlmspec.plan.elementwise.OPTIMIZER_BYTES`).
PLAIN_ADAM_TRAFFIC = 30


@dataclass(frozen=True)
class StateBytes:
    """Optimizer state per owned parameter.

    Attributes:
        master: GPU bytes of the master weight (0 where the weights are the master).
        moments: GPU bytes of the optimizer's moments (Adam's two, SGD's momentum).
        host: host (pinned CPU) bytes of the offloaded share.
        step_transient: GPU bytes alive during the optimizer step only (the fp32 copies of
            low-precision states).
        offloaded: share of the parameters the host steps (0 without CPU offload).
        source: which megatron-core optimizer the count follows, in words.
    """

    master: float
    moments: float
    host: float
    step_transient: float
    offloaded: float
    source: str

    @property
    def gpu(self) -> float:
        """GPU bytes kept between steps: master + moments."""
        return self.master + self.moments


def state_bytes(lay: "Layout") -> StateBytes:
    """The :class:`StateBytes` of ``lay``'s optimizer options (see the module docstring for the
    source of each count).

    Args:
        lay: the layout (``optimizer``, ``dtype`` and the ``precision_aware``, ``main_params_dtype``,
            ``exp_avg_dtype``, ``exp_avg_sq_dtype``, ``store_param_remainders``, ``cpu_offload``,
            ``offload_fraction`` fields).
    """
    half = lay.dtype != "fp32"
    if lay.cpu_offload and lay.precision_aware:
        f = lay.offload_fraction
        gpu_master = (4.0 if half else 0.0) * (1 - f)
        moments = (8.0 if lay.optimizer == "adam" else 4.0) * (1 - f)
        host = (16.0 if lay.optimizer == "adam" else 12.0) * f
        return StateBytes(gpu_master, moments, host, 0.0, f,
                          f"HybridDeviceOptimizer: {f:.0%} of the fp32 master weights and moments in host memory")
    if lay.precision_aware and lay.optimizer == "adam":
        if lay.main_params_dtype == "fp32" and lay.store_param_remainders and lay.dtype == "bf16":
            master, master_note = 2.0, "int16 remainders of the fp32 master"
        else:
            master, master_note = float(DTYPE_BYTES[lay.main_params_dtype]), f"{lay.main_params_dtype} master"
        m, v = DTYPE_BYTES[lay.exp_avg_dtype], DTYPE_BYTES[lay.exp_avg_sq_dtype]
        low = [b for b in (m, v) if b != 4] + ([master] if lay.main_params_dtype != "fp32" else [])
        return StateBytes(master, float(m + v), 0.0, 4.0 * len(low), 0.0,
                          f"Transformer Engine FusedAdam: {master_note}, {lay.exp_avg_dtype}/{lay.exp_avg_sq_dtype} moments")
    states = 8.0 if lay.optimizer == "adam" else 4.0
    return StateBytes(4.0 if half else 0.0, states, 0.0, 0.0, 0.0,
                      "fp32 master weights and moments" if half else "fp32 moments")


def gpu_bytes_per_param(lay: "Layout") -> float:
    """GPU bytes of optimizer state per owned parameter: :attr:`StateBytes.gpu`."""
    return state_bytes(lay).gpu


def step_transient_bytes(lay: "Layout") -> float:
    """GPU bytes per owned parameter alive only during the optimizer step because of the
    state options: :attr:`StateBytes.step_transient`."""
    return state_bytes(lay).step_transient


def step_traffic_bytes(lay: "Layout", plain: float) -> float:
    """GPU memory traffic of the optimizer step per owned parameter, bytes: ``plain`` (the
    path's :data:`~dlmspec.plan.elementwise.OPTIMIZER_BYTES`) for the plain state, and for the
    precision-aware state the fused kernel's reads and writes of master, gradient and moments in
    their dtypes plus the fp32 copies of the low-precision ones (read and write each); offloaded
    parameters leave the GPU's share ``1 - f``."""
    s = state_bytes(lay)
    if not lay.precision_aware:
        return plain
    if lay.cpu_offload:
        return (1 - s.offloaded) * PLAIN_ADAM_TRAFFIC
    grad = 4 if lay.grad_fp32 else 2
    remainder_read = 2 if s.master == 2 and lay.main_params_dtype == "fp32" else 0
    return 2 * (s.master + s.moments) + grad + 2 + remainder_read + 3 * s.step_transient


def pcie_gbps(gpu_id: str) -> float:
    """Host link bandwidth per direction of the GPU ``gpu_id``, GB/s (:data:`PCIE_GBPS`)."""
    return PCIE_GBPS.get(gpu_id, PCIE_GBPS_DEFAULT)


def offload_seconds(lay: "Layout", owned: float, gpu_id: str) -> float:
    """Seconds CPU offload adds to each optimizer step of a rank owning ``owned`` parameters.

    ``f * owned`` parameters: their gradients to the host (2 or 4 bytes: the DDP buffer's dtype)
    and their fp32 master back (4 bytes) at ``PCIE_GBPS * PCIE_EFFICIENCY`` per direction, and
    torch's AdamW on them (:data:`HOST_ADAM_BYTES` at :data:`HOST_ADAM_GBPS`); summed, or the
    larger of copies and host step with ``overlap_cpu_optimizer_d2h_h2d`` (one CPU optimizer per
    parameter, its copies on side streams: ``hybrid_optimizer.py``). 0 without offload.
    """
    if not (lay.cpu_offload and lay.precision_aware):
        return 0.0
    n = lay.offload_fraction * owned
    link = pcie_gbps(gpu_id) * 1e9 * PCIE_EFFICIENCY
    grad = 4 if lay.grad_fp32 else 2
    copies = n * grad / link + n * 4 / link
    host = n * HOST_ADAM_BYTES / (HOST_ADAM_GBPS * 1e9)
    return max(copies, host) if lay.overlap_offload else copies + host


def describe(lay: "Layout") -> str:
    """One line for the plan's report: bytes per parameter of weights, gradients and optimizer
    state (before the distributed optimizer's sharding), and the host's share."""
    s = state_bytes(lay)
    weights = 4 if lay.dtype == "fp32" else 2
    grads = 4 if (lay.grad_fp32 or lay.dtype == "fp32") else weights
    text = (f"{weights} + {grads} + {s.gpu:g} bytes per parameter on the GPU (weights + gradients + optimizer "
            f"state; {s.source})")
    if s.host:
        text += f", {s.host:g} in host memory"
    if s.step_transient:
        text += f", {s.step_transient:g} more during the step (fp32 copies of the low-precision state)"
    return text
