"""The planner: per-GPU memory, step time and MFU of a resolved spec, before it is queued.

``spec -> Resolved -> plan``: :func:`make_plan` turns a :class:`~dlmspec.resolve.Resolved`
into a :class:`Plan` - a memory breakdown per pipeline stage (:mod:`dlmspec.plan.memory`),
FLOPs (:mod:`dlmspec.plan.compute`) and a step-time breakdown (:mod:`dlmspec.plan.time`) -
whose :meth:`Plan.to_dict` is the stable JSON of ``dlmspec plan --json`` and of the compiled
``plan.json``. :func:`memory_fits` says what would make a spec that does not fit fit (the
``memory-fits`` rule of :mod:`dlmspec.check.memory` reports it); :func:`dlmspec.plan.search.search`
enumerates the layouts that fit. Constants that are measured rather than counted live in
:mod:`dlmspec.plan.calibration`.

Nothing here imports torch: a plan takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlmspec.gpus import GPU, GiB
from dlmspec.layout import batch_divides, expert_world_divides, world_divides
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, Calibration
from dlmspec.plan.compute import model_flops_per_token
from dlmspec.plan.memory import ALLOCATED_TERMS, RESERVED_TERMS, MemoryPlan, memory_plan
from dlmspec.plan.phases import Phase, plan_phases
from dlmspec.plan.provenance import calibration_for, path_summary, provenance
from dlmspec.plan.shape import (Layout, ModelShape, attention_path, cross_entropy_path, kernels_path, layout, model_shape,
                                pipeline_fits,
                                relayout, transformer_impl)
from dlmspec.plan.sft import SftPlan, sft_plan
from dlmspec.plan.rl import RLPlan, rl_plan
from dlmspec.plan.time import TimePlan, time_plan
from dlmspec.resolve import Resolved

__all__ = [
    "Plan",
    "PlanError",
    "make_plan",
    "plan_layout",
    "memory_fits",
    "fastest_micro_batch",
    "model_flops_per_token",
    "Calibration",
    "DEFAULT_CALIBRATION",
    "SCHEMA",
]

#: ``schema`` value of :meth:`Plan.to_dict`; bumped when a key changes meaning or disappears.
SCHEMA = "dlmspec.plan/1"

#: Fraction of the GPU's memory above which the ``memory-headroom`` rule warns (allocator
#: fragmentation and unmodelled workspaces can still push a spec that close over the edge).
HEADROOM_WARNING = 0.95

#: Layout fields -> spec keys (``--set`` lines and advice).
SPEC_KEYS = {
    "tp": "parallel.tensor_model_parallel_size",
    "pp": "parallel.pipeline_model_parallel_size",
    "vpp": "parallel.virtual_pipeline_model_parallel_size",
    "cp": "parallel.context_parallel_size",
    "ep": "parallel.expert_model_parallel_size",
    "etp": "parallel.expert_tensor_parallel_size",
    "sp": "parallel.sequence_parallel",
    "micro_batch": "train.micro_batch_size",
    "recompute": "recompute.granularity",
    "recompute_method": "recompute.method",
    "recompute_layers": "recompute.num_layers",
    "distributed_optimizer": "parallel.use_distributed_optimizer",
    "recompute_modules": "recompute.modules",
    "precision_aware": "train.use_precision_aware_optimizer",
    "exp_avg_dtype": "train.exp_avg_dtype",
    "exp_avg_sq_dtype": "train.exp_avg_sq_dtype",
    "cpu_offload": "train.optimizer_cpu_offload",
}


class PlanError(ValueError):
    """The spec cannot be planned (e.g. its GPU is not in the catalog); the message says why."""


@dataclass
class Plan:
    """Memory, time and throughput of one resolved spec on its cluster.

    Attributes:
        name: the spec's ``name``.
        shape, layout: the plain-number views the models read (:mod:`dlmspec.plan.shape`).
        gpu: the catalog GPU.
        memory: per-stage memory (:class:`~dlmspec.plan.memory.MemoryPlan`).
        time: step time and throughput (:class:`~dlmspec.plan.time.TimePlan`).
        runtime: the layer implementation the run takes (``transformer_impl``) and the one the
            models assume (``modelled_as``).
        calibration: the constants used.
        provenance: the layer path, the calibration and the dimensions outside what its runs
            measured (:func:`dlmspec.plan.provenance.provenance`; :func:`make_plan` sets it with
            both paths' summaries for ``transformer_impl = "auto"``, else computed on demand).
        sft: an SFT stage's token counts (:mod:`dlmspec.plan.sft`), None for other stages.
        rl: an RL stage's rollout counts and times (:mod:`dlmspec.plan.rl`), None for other stages.
    """

    name: str
    shape: ModelShape
    layout: Layout
    gpu: GPU
    memory: MemoryPlan
    time: TimePlan
    runtime: dict[str, str]
    calibration: Calibration = field(default=DEFAULT_CALIBRATION)
    provenance: dict[str, Any] | None = None
    sft: SftPlan | None = None
    rl: RLPlan | None = None

    @property
    def peak_bytes(self) -> float:
        """Peak per-GPU memory including CUDA context, NCCL and allocator reserve, bytes."""
        return self.memory.peak.peak_bytes

    @property
    def peak_allocated_bytes(self) -> float:
        """Peak of ``torch.cuda.max_memory_allocated()`` the plan predicts, bytes."""
        return self.memory.peak.peak_allocated_bytes

    @property
    def phases(self) -> list[Phase]:
        """Stretches of training costlier than the steady steps the peak describes (attention
        annealing's first steps: :mod:`dlmspec.plan.phases`); empty for most runs."""
        return plan_phases(self.shape, self.layout, self.peak_bytes, self.memory.peak.stage, self.gpu.memory_bytes,
                           self.gpu, self.calibration)

    @property
    def fits(self) -> bool:
        """Whether :attr:`peak_bytes` is at most the GPU's memory."""
        return self.peak_bytes <= self.gpu.memory_bytes

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON object of ``dlmspec plan --json`` (keys documented in
        ``docs/planner.md``; bytes as integers, seconds and rates as floats)."""
        lay, peak, t = self.layout, self.memory.peak, self.time
        lt = self.memory.layer_terms
        allocated = peak.peak_allocated_bytes
        return {
            "schema": SCHEMA,
            "name": self.name,
            "gpu": {"id": self.gpu.id, "name": self.gpu.name, "memory_bytes": self.gpu.memory_bytes},
            "layout": {
                "world_size": lay.world,
                "tensor_model_parallel_size": lay.tp,
                "pipeline_model_parallel_size": lay.pp,
                "virtual_pipeline_model_parallel_size": lay.vpp if lay.vpp > 1 else None,
                "context_parallel_size": lay.cp,
                "expert_model_parallel_size": lay.ep,
                "expert_tensor_parallel_size": lay.etp,
                "data_parallel_size": lay.dp,
                "expert_data_parallel_size": lay.expert_dp,
                "sequence_parallel": lay.sp,
                "micro_batch_size": lay.micro_batch,
                "global_batch_size": lay.global_batch,
                "seq_length": lay.seq,
                "num_microbatches": lay.num_microbatches,
                "recompute_granularity": lay.recompute,
                "recompute_method": lay.recompute_method if lay.recompute == "full" else None,
                "recompute_num_layers": lay.recompute_layers if lay.recompute == "full" else None,
                "recompute_modules": list(lay.recompute_modules) if lay.recompute == "selective" else None,
                "use_distributed_optimizer": lay.distributed_optimizer,
                "fsdp": lay.fsdp,
                "grad_reduce_in_fp32": lay.grad_fp32,
                "dtype": lay.dtype,
                "fp8": lay.fp8,
                "fp8_recipe": lay.fp8_recipe or None,
            },
            "parameters": {
                "total": self.shape.total_params,
                "active": self.shape.active_params,
                "total_padded_vocab": self.shape.padded_total_params,
                "on_peak_gpu": int(round(sum(peak.params))),
            },
            "memory": {
                "peak_bytes": int(round(peak.peak_bytes)),
                "peak_allocated_bytes": int(round(allocated)),
                "reserved_overhead_bytes": int(round(peak.peak_bytes - allocated)),
                "capacity_bytes": self.gpu.memory_bytes,
                "fits": self.fits,
                "headroom_bytes": int(round(self.gpu.memory_bytes - peak.peak_bytes)),
                "peak_stage": peak.stage,
                "peak_phase": peak.phase,
                "breakdown": {k: int(round(peak.breakdown[k]))
                              for k in ALLOCATED_TERMS + peak.stage_terms + RESERVED_TERMS},
                "allocated_terms": list(ALLOCATED_TERMS + peak.stage_terms),
                "reserved_terms": list(RESERVED_TERMS),
                "activation_per_layer": {
                    "dense": {k: int(round(v)) for k, v in lt.dense_kept.items()},
                    "moe": {k: int(round(v)) for k, v in lt.moe_kept.items()} if lt.moe_kept else None,
                },
                "per_stage": [s.to_dict() for s in self.memory.stages],
            },
            "flops": {
                "model_per_token": t.flops.model_per_token,
                "model_per_step": t.flops.model_per_step,
                "hardware_per_step": t.flops.hardware_per_step,
                "recompute_per_step": t.flops.recompute_per_step,
            },
            "time": {
                "step_seconds": t.step_seconds,
                "breakdown_seconds": {k: t.breakdown[k] for k in t.breakdown},  # TIME_TERMS, then the stage's
                "slowest_stage": t.slowest_stage,
                "train_iters": lay.train_iters,
                "to_train_seconds": t.to_train_seconds,
                "host_launch_us": (lay.host_launch_seconds or self.calibration.host_launch_seconds) * 1e6,
                "host_launch_source": "spec" if lay.host_launch_seconds else "calibration",
            },
            "throughput": {
                "tokens_per_second": t.tokens_per_second,
                "model_tflops_per_gpu": t.model_tflops_per_gpu,
                "hardware_tflops_per_gpu": t.hardware_tflops_per_gpu,
            },
            "mfu": t.mfu,
            "gpu_hours": t.gpu_hours,
            "runtime": dict(self.runtime),
            "calibration": self.calibration.to_dict(),
            "provenance": self.provenance if self.provenance is not None else provenance(self),
            "sft": self.sft.to_dict() if self.sft is not None else None,
            **({"rl": self.rl.to_dict()} if self.rl is not None else {}),
            **({"phases": [p.to_dict() for p in phases]} if (phases := self.phases) else {}),
        }


def plan_layout(
    name: str,
    shape: ModelShape,
    lay: Layout,
    gpu: GPU,
    runtime: dict[str, str],
    calib: Calibration = DEFAULT_CALIBRATION,
    *,
    all_stages: bool = True,
) -> Plan:
    """Plan an explicit (shape, layout) pair - what :func:`make_plan` and the search share."""
    return Plan(
        name=name,
        shape=shape,
        layout=lay,
        gpu=gpu,
        memory=memory_plan(shape, lay, calib, all_stages=all_stages),
        time=time_plan(shape, lay, gpu, calib, all_stages=all_stages),
        runtime=runtime,
        calibration=calib,
    )


def make_plan(resolved: Resolved, calibration: Calibration | None = None, *, impl: str | None = None) -> Plan:
    """Plan a resolved spec.

    Args:
        resolved: from :func:`dlmspec.resolve.resolve` (ideally a spec that passed
            :func:`dlmspec.check.issues_for` without errors; a spec that breaks divisibility rules is planned
            with the clamped values ``resolve`` derives).
        calibration: constants (default :data:`DEFAULT_CALIBRATION`).
        impl: ``"transformer_engine"`` or ``"local+sdpa"`` to model that layer path instead of
            the one :func:`dlmspec.plan.shape.transformer_impl` infers (calibration runs pass
            the path the runtime reported).

    Raises:
        PlanError: ``cluster.gpu`` is not in the catalog, or ``impl`` is not a known path.
    """
    if resolved.gpu is None:
        raise PlanError(f"cluster.gpu = {resolved.spec.cluster.gpu!r} is not in the GPU catalog (dlmspec show --gpus)")
    if impl is not None and impl not in ("transformer_engine", "local+sdpa"):
        raise PlanError(f"impl must be 'transformer_engine' or 'local+sdpa', not {impl!r}")
    modelled, description = transformer_impl(resolved)
    if impl is not None and impl != modelled:
        modelled, description = impl, f"{impl} (requested for this plan)"
    custom = calibration is not None
    if calibration is None:
        calibration = calibration_for(modelled)[0]
    lay = layout(resolved, modelled)
    shape = model_shape(resolved)
    runtime = {
        "transformer_impl": description,
        "spec_transformer_impl": resolved.spec.model.transformer_impl,
        "modelled_as": modelled,
        "cross_entropy": cross_entropy_path(lay),
        "attention": attention_path(lay, resolved.gpu.compute_capability, shape),
        "kernels": kernels_path(shape, lay),
        "host_launch": host_launch_path(lay, calibration or DEFAULT_CALIBRATION),
    }
    if lay.precision_aware or lay.cpu_offload:  # [train] optimizer-state options (only then: plan.json stays as it was)
        from dlmspec.plan.optimizer_state import describe

        runtime["optimizer_state"] = describe(lay)
    plan = plan_layout(
        resolved.spec.name,
        shape,
        lay,
        resolved.gpu,
        runtime,
        calibration or DEFAULT_CALIBRATION,
    )
    hint = compiled_kernels_hint(plan)
    if hint:
        plan.runtime["kernels_hint"] = hint
    paths = None
    if impl is None and resolved.transformer_impl == "auto":
        # The runtime takes Transformer Engine where it imports, else the local layers: plan both.
        te_calib = calibration if custom else calibration_for("transformer_engine")[0]
        te = plan_layout(resolved.spec.name, shape, layout(resolved, "transformer_engine"), resolved.gpu,
                         {**runtime, "modelled_as": "transformer_engine"}, te_calib)
        paths = [path_summary(te, "where Transformer Engine imports on the cluster"),
                 path_summary(plan, "where it does not (the tables)")]
    plan.provenance = provenance(plan, custom=custom, paths=paths)
    plan.sft = sft_plan(resolved, plan.time.tokens_per_second, plan.time.step_seconds, lay.global_batch * lay.seq)
    plan.rl = rl_plan(plan, init_from=bool(resolved.spec.checkpoint.init_from))
    return plan


def compiled_kernels_hint(plan: "Plan") -> str | None:
    """A line for a launch-bound plan (host time per microbatch above the GPU's on the slowest
    rank) whose ``torch.compile``'d functions add host time: the ``kernels.qkv_fusion=false
    kernels.compiled_norm=false`` alternative with its planned step time, when that is faster
    (``demo-mdm-b32-s512-defaults`` 0.1141 s against 0.0963 s without them,
    ``bench/calibration/local/h200/matrix-host-launch-2026-11-30-b.json``). None otherwise."""
    from dataclasses import replace

    from dlmspec.plan.time import time_plan

    lay, t = plan.layout, plan.time
    if lay.impl == "transformer_engine" or not (lay.qkv_fusion or lay.compiled_norm):
        return None
    if t.features.get("gemm", 1.0) != 0.0 or t.features.get("compiled_calls", 0.0) <= 0.0:
        return None  # GPU-bound, or no compiled call on the host's path
    off = time_plan(plan.shape, replace(lay, qkv_fusion=False, compiled_norm=False), plan.gpu, plan.calibration)
    if off.step_seconds >= t.step_seconds:
        return None
    return (f"launch-bound: the host's time per microbatch exceeds the GPU's, and the torch.compile'd kernels add "
            f"host time; --set kernels.qkv_fusion=false --set kernels.compiled_norm=false plans "
            f"{off.step_seconds:.4f} s per step against {t.step_seconds:.4f} s")


def host_launch_path(lay: Layout, calib: Calibration) -> str:
    """One line naming the host launch speed the time model used: the spec's
    ``cluster.host_launch_us`` or the calibration's typical host."""
    if lay.host_launch_seconds:
        return (f"{lay.host_launch_seconds * 1e6:.2f} us per eager kernel launch (cluster.host_launch_us; host time "
                f"x{lay.host_launch_seconds / calib.host_launch_seconds:.2f} of the typical host)")
    return (f"{calib.host_launch_seconds * 1e6:.2f} us per eager kernel launch (the calibration's typical host; "
            "cluster.host_launch_us scales the host time for another host; the host_launch_us a run logs in "
            "metrics.jsonl is a noisy measure of it, docs/planner.md)")


def gib_text(n: float) -> str:
    """``n`` bytes as ``"12.3 GiB"`` (the planner's messages)."""
    return f"{n / GiB:.1f} GiB"


def set_args(changes: dict[str, Any]) -> list[str]:
    """``--set key=value`` arguments that select the layout ``changes`` (layout field ->
    value; see :data:`SPEC_KEYS`)."""
    out = []
    for fieldname, value in changes.items():
        key = SPEC_KEYS[fieldname]
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (list, tuple)):  # a TOML array of strings (recompute.modules)
            text = "[" + ",".join(f'"{v}"' for v in value) + "]"
        elif isinstance(value, str):
            text = value
        else:
            text = str(value)
        out.append(f"--set {key}={text}")
    return out


def _replan(plan: Plan, **change: Any) -> Plan:
    """``plan`` planned again with layout ``change`` (:func:`~dlmspec.plan.shape.relayout`'s
    keywords), with the same GPU, runtime and calibration."""
    shape, new = relayout(plan.shape, plan.layout, **change)
    return plan_layout(plan.name, shape, new, plan.gpu, plan.runtime, plan.calibration)


def _alternatives(plan: Plan) -> list[dict[str, Any]]:
    """Single changes (and one combination) that reduce memory, in the order they cost
    throughput least: distributed optimizer, selective then full recomputation, a smaller
    micro batch (each smaller one that divides ``global_batch / dp``, largest first:
    :func:`memory_fits` keeps the largest that fits), more TP (with sequence parallelism), more
    PP, more CP, more EP."""
    s, lay = plan.shape, plan.layout
    alts: list[dict[str, Any]] = []
    if not lay.distributed_optimizer and lay.fsdp == "none" and lay.dp * lay.cp > 1:
        alts.append({"distributed_optimizer": True})
    if lay.recompute == "none":
        alts.append({"recompute": "selective"})
    if lay.recompute != "full":
        alts.append({"recompute": "full", "recompute_method": "uniform", "recompute_layers": 1})
    per_replica = lay.global_batch // max(lay.dp, 1)
    alts.extend({"micro_batch": m} for m in range(lay.micro_batch - 1, 0, -1) if per_replica % m == 0)
    world = lay.world
    tp2 = lay.tp * 2
    if (tp2 <= lay.gpus_per_node and s.heads % tp2 == 0 and (s.groups % tp2 == 0 or tp2 % s.groups == 0)
            and world_divides(world, tp2, lay.pp, lay.cp) and s.ffn % tp2 == 0):
        alts.append({"tp": tp2, "sp": True})
    pp2 = lay.pp * 2
    fits = s.num_layers % pp2 == 0 if lay.pipeline_split is None else pipeline_fits(s, lay, pp2, lay.vpp)
    if fits and world_divides(world, lay.tp, pp2, lay.cp):
        alts.append({"pp": pp2})
    cp2 = lay.cp * 2
    if lay.seq % (2 * cp2) == 0 and world_divides(world, lay.tp, lay.pp, cp2) and lay.seq >= 4096:
        alts.append({"cp": cp2})
    if s.is_moe:
        ep2 = lay.ep * 2
        if s.num_experts % ep2 == 0 and expert_world_divides(world, lay.etp, ep2, lay.pp):
            alts.append({"ep": ep2})
    if lay.recompute != "full" and lay.micro_batch > 1:
        alts.append({"recompute": "full", "recompute_method": "uniform", "recompute_layers": 1, "micro_batch": 1})
    return alts


def memory_fits(plan: Plan) -> tuple[bool, list[str]]:
    """Whether the plan's peak fits the GPU, and what would make it fit.

    Returns:
        ``(fits, advice)``. When it does not fit, ``advice`` lists the single changes
        (:func:`_alternatives`; of the smaller micro batches only the largest that fits) whose
        re-planned peak fits, each as ``--set`` arguments with the
        new peak and throughput (and, for a smaller micro batch, the microbatches per step of the
        same global batch), fastest first; or, when none does, one line saying so and
        pointing at ``dlmspec plan --search``. Each change also keeps the batch arithmetic valid
        (``global_batch_size`` divisible by ``micro_batch_size * dp``); a change that breaks it is
        skipped. Empty advice when it fits.
    """
    if plan.fits:
        return True, []
    options = []
    micro_batch_found = False  # the largest smaller micro batch that fits is enough advice
    for change in _alternatives(plan):
        if set(change) == {"micro_batch"} and micro_batch_found:
            continue
        alt = _replan(plan, **change)
        new = alt.layout
        if not batch_divides(new.global_batch, new.micro_batch, new.dp):
            continue
        if alt.fits:
            options.append((alt.time.tokens_per_second, alt.peak_bytes, change, new))
            micro_batch_found = micro_batch_found or set(change) == {"micro_batch"}
    if not options:
        return False, [
            f"no single change (recomputation, a smaller micro batch, distributed optimizer, 2x TP/PP/CP/EP) brings the "
            f"peak under {gib_text(plan.gpu.memory_bytes)}; run `dlmspec plan SPEC --search` for layouts that fit, "
            "or use more GPUs"
        ]
    options.sort(key=lambda o: (-o[0], o[1], sorted(o[2].items())))

    def steps(change: dict[str, Any], new: Any) -> str:
        # a smaller micro batch keeps the global batch: say how many microbatches a step then takes
        return f"{new.num_microbatches} microbatches per step; " if "micro_batch" in change else ""

    return False, [
        f"{' '.join(set_args(change))} ({steps(change, new)}peak {gib_text(peak)}, {tps:,.0f} tokens/s)"
        for tps, peak, change, new in options
    ]


def fastest_micro_batch(plan: Plan, limit_bytes: float, largest: int = 64) -> Plan | None:
    """The plan of ``plan``'s layout at the micro batch with the most planned tokens/s whose peak
    is at most ``limit_bytes`` per GPU: each micro batch up to ``largest`` that divides the
    global batch per data-parallel replica (so the batch arithmetic stays valid; the other
    layout keys unchanged). Ties go to the smaller micro batch. None when none fits."""
    per_replica = plan.layout.global_batch // max(plan.layout.dp, 1)
    best: Plan | None = None
    for m in range(1, min(per_replica, largest) + 1):
        if per_replica % m:
            continue
        alt = _replan(plan, micro_batch=m)
        if alt.peak_bytes <= limit_bytes and (best is None or alt.time.tokens_per_second > best.time.tokens_per_second):
            best = alt
    return best
