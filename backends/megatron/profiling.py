"""Kernel-level profile of a window of training steps (``[logging] profile``).

Megatron-LM's ``--profile --use-pytorch-profiler --profile-step-start A --profile-step-end B
--profile-ranks R`` records steps ``A .. B-1`` with ``torch.profiler`` on the listed ranks; the
runtime does the same and, besides the Chrome trace, writes a summary that answers "where does
the step time go" without opening the trace:

* ``<run_dir>/profile/trace_rank<r>.json.gz``: the trace (open in Perfetto / chrome://tracing);
* ``<run_dir>/profile/summary_rank<r>.json``: GPU kernel time per category (matmul, attention,
  norm, elementwise, communication, optimizer, loss, copy, other) and the top kernels, all per
  profiled step, plus the GPU-idle share of the wall time (time with no kernel running, i.e.
  host-bound launches, synchronisations or communication waits not overlapped).

Kernel categories come from kernel names (:data:`CATEGORIES`, first match wins); they are a
reading aid, not an exact attribution (a cuBLAS kernel inside the loss counts as matmul).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

#: ``(category, regular expression on the kernel name)``, tried in order.
CATEGORIES: Tuple[Tuple[str, str], ...] = (
    ("communication", r"nccl|allreduce|all_gather|reduce_scatter|AllGather|ReduceScatter|SendRecv|alltoall"),
    ("attention", r"flash|fmha|attention|attn|cudnn_generated|sdpa"),
    ("loss", r"cross_entropy|liger|log_softmax|nll_loss|softmax"),
    ("optimizer", r"multi_tensor|adam|Adam|l2norm|scale_kernel"),
    ("norm", r"rms_norm|layer_norm|RMSNorm|LayerNorm|rmsnorm|layernorm"),
    ("matmul", r"gemm|Gemm|GEMM|cutlass|xmma|nvjet|cublas|sm90_|sm100_|wgmma|matmul"),
    ("copy", r"[Mm]emcpy|[Mm]emset|copy_|CatArrayBatched|transpose|permute"),
    ("reduction", r"reduce_kernel|Reduce"),
    ("elementwise", r"elementwise|vectorized|unrolled|triton_|silu|mul_|add_|fill"),
)


#: CUDA runtime/driver calls in which the host waits for the GPU: stream/device/event
#: synchronisation and the copies that block (a device-to-host ``cudaMemcpyAsync`` into pageable
#: memory returns only when the copy is done - ``tensor.item()``, ``.tolist()``, ``.cpu()``).
HOST_WAIT_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                   "cudaMemcpy", "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")
#: CUDA runtime/driver calls that launch a kernel (eager ATen kernels go through
#: ``cudaLaunchKernel``, Triton/inductor kernels through ``cuLaunchKernel``, NCCL's through
#: ``cudaLaunchKernelExC``/``cuLaunchKernelEx``).
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel")


def host_summary(events: List[Dict[str, Any]], steps: int, wall_ms: float, top: int = 8) -> Dict[str, Any]:
    """Where the host's time goes, from the CUDA runtime/driver events of a trace.

    Args:
        events: the trace's ``traceEvents``.
        steps: training steps they cover (figures are per step).
        wall_ms: wall milliseconds per step.
        top: how many runtime calls to list by total time.

    Returns:
        ``{"launches_per_step": kernel launches (:data:`LAUNCH_CALLS`),
        "wait_ms_per_step": milliseconds the host spent in :data:`HOST_WAIT_CALLS` (waiting for
        its GPU - and, through a collective, for the other ranks), "waits_per_step" (calls of them;
        a non-blocking host-to-device ``cudaMemcpyAsync`` counts too, at microseconds),
        "active_ms_per_step": wall minus waiting (Python, dispatch, launches; the profiler's own
        per-op cost included), "active_us_per_launch": that per launch (what the planner's
        ``seconds_per_kernel`` stands for, here with the profiler's overhead), "runtime_calls":
        [{name, ms_per_step, calls_per_step}] the ``top`` calls by time}``.
    """
    calls: Dict[str, List[float]] = {}
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in ("cuda_runtime", "cuda_driver"):
            continue
        stats = calls.setdefault(ev.get("name", "?"), [0.0, 0])
        stats[0] += float(ev.get("dur", 0.0))
        stats[1] += 1
    steps = max(1, steps)
    launches = sum(calls[n][1] for n in LAUNCH_CALLS if n in calls) / steps
    wait_ms = sum(calls[n][0] for n in HOST_WAIT_CALLS if n in calls) / 1000.0 / steps
    waits = sum(calls[n][1] for n in HOST_WAIT_CALLS if n in calls) / steps
    active_ms = max(0.0, wall_ms - wait_ms)
    ranked = sorted(calls.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "launches_per_step": launches,
        "wait_ms_per_step": wait_ms,
        "waits_per_step": waits,
        "active_ms_per_step": active_ms,
        "active_us_per_launch": 1000.0 * active_ms / launches if launches else None,
        "runtime_calls": [{"name": n, "ms_per_step": d / 1000.0 / steps, "calls_per_step": c / steps}
                          for n, (d, c) in ranked],
    }


def kernel_category(name: str) -> str:
    """Category of a CUDA kernel by its name (:data:`CATEGORIES`), ``"other"`` if none matches."""
    for category, pattern in CATEGORIES:
        if re.search(pattern, name):
            return category
    return "other"


def _merged_busy_us(intervals: List[Tuple[float, float]]) -> float:
    """Length of the union of ``[start, end)`` intervals (microseconds)."""
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def summarize_trace(trace_path: str, steps: int, wall_s: float, top: int = 25) -> Dict[str, Any]:
    """Summarise the GPU kernels of a Chrome trace written by ``torch.profiler``.

    Args:
        trace_path: ``.json`` or ``.json.gz`` trace.
        steps: Training steps the trace covers (the figures are divided by it).
        wall_s: Wall time of those steps in seconds (host clock, synchronised at both ends).
        top: How many kernels to list.

    Returns:
        ``{"steps", "wall_ms_per_step", "gpu_busy_ms_per_step", "gpu_idle_share",
        "kernel_ms_per_step" (sum over kernels; can exceed busy time when streams overlap),
        "kernels_per_step" (launches, memcpy/memset included),
        "categories": {name: ms per step}, "top_kernels": [{name, category, ms_per_step,
        calls_per_step}], "host": :func:`host_summary`}``; times in milliseconds per step.
    """
    opener = gzip.open if trace_path.endswith(".gz") else open
    with opener(trace_path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    per_kernel: Dict[str, List[float]] = {}
    intervals: List[Tuple[float, float]] = []
    for ev in events:
        if ev.get("ph") != "X" or ev.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        dur = float(ev.get("dur", 0.0))
        start = float(ev.get("ts", 0.0))
        intervals.append((start, start + dur))
        stats = per_kernel.setdefault(ev.get("name", "?"), [0.0, 0])
        stats[0] += dur
        stats[1] += 1
    steps = max(1, steps)
    categories: Dict[str, float] = {}
    for name, (dur, _) in per_kernel.items():
        cat = kernel_category(name)
        categories[cat] = categories.get(cat, 0.0) + dur / 1000.0 / steps
    busy_ms = _merged_busy_us(intervals) / 1000.0 / steps
    wall_ms = 1000.0 * wall_s / steps
    ranked = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps,
        "wall_ms_per_step": wall_ms,
        "gpu_busy_ms_per_step": busy_ms,
        "gpu_idle_share": max(0.0, 1.0 - busy_ms / wall_ms) if wall_ms > 0 else None,
        "kernel_ms_per_step": sum(categories.values()),
        "kernels_per_step": sum(calls for _, calls in per_kernel.values()) / steps,
        "categories": dict(sorted(categories.items(), key=lambda kv: -kv[1])),
        "top_kernels": [
            {"name": name[:200], "category": kernel_category(name), "ms_per_step": dur / 1000.0 / steps,
             "calls_per_step": calls / steps}
            for name, (dur, calls) in ranked
        ],
        "host": host_summary(events, steps, wall_ms),
    }


class StepProfiler:
    """Profile training steps ``[start, end)`` on the chosen ranks, then write trace and summary.

    Call :meth:`before_step` with the number of steps completed before each step and
    :meth:`after_step` after it; outside the window both do nothing.

    Args:
        run_dir: The run's directory; files go to ``<run_dir>/profile/``.
        start: First profiled step (steps completed before it, as in Megatron-LM's
            ``--profile-step-start``).
        end: Profiling stops before this step (``--profile-step-end``); ``end > start``.
        ranks: Global ranks that profile (``--profile-ranks``).
        rank: This process's global rank.

    Raises:
        ValueError: If ``end <= start``.
    """

    def __init__(self, run_dir: str, start: int, end: int, ranks: Sequence[int], rank: int) -> None:
        if end <= start:
            raise ValueError(f"profile_step_end ({end}) must exceed profile_step_start ({start})")
        self.dir = os.path.join(run_dir, "profile")
        self.start, self.end = start, end
        self.enabled = rank in set(ranks)
        self.rank = rank
        self._prof: Optional[torch.profiler.profile] = None
        self._t0 = 0.0
        self.summary: Optional[Dict[str, Any]] = None

    def _sync(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def before_step(self, iteration: int) -> None:
        """Start recording when ``iteration == start``."""
        if not self.enabled or iteration != self.start or self._prof is not None:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._sync()
        self._prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def after_step(self, iteration: int) -> Optional[Dict[str, Any]]:
        """Stop and write the files when ``iteration`` (steps completed) reaches ``end``.

        Returns:
            The summary (:func:`summarize_trace`) when this call wrote it, else ``None``.
        """
        if self._prof is None or iteration < self.end:
            return None
        self._sync()
        wall = time.perf_counter() - self._t0
        self._prof.__exit__(None, None, None)
        prof, self._prof = self._prof, None
        os.makedirs(self.dir, exist_ok=True)
        raw = os.path.join(self.dir, f"trace_rank{self.rank}.json")
        prof.export_chrome_trace(raw)
        summary = summarize_trace(raw, steps=self.end - self.start, wall_s=wall)
        summary.update(rank=self.rank, step_start=self.start, step_end=self.end)
        with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        with open(os.path.join(self.dir, f"summary_rank{self.rank}.json"), "w") as fh:
            json.dump(summary, fh, indent=1)
        self.summary = summary
        return summary


def format_summary(summary: Dict[str, Any]) -> str:
    """One log line: wall and busy ms per step, idle share, the largest categories."""
    cats = ", ".join(f"{k} {v:.0f}" for k, v in list(summary["categories"].items())[:6])
    idle = summary.get("gpu_idle_share")
    return (f"profile steps {summary['step_start']}-{summary['step_end'] - 1} (rank {summary['rank']}): "
            f"{summary['wall_ms_per_step']:.0f} ms/step wall, GPU busy {summary['gpu_busy_ms_per_step']:.0f} ms"
            f" (idle {100 * (idle or 0):.0f}%); kernels ms/step: {cats}" + _host_line(summary.get("host")))


def _host_line(host: Optional[Dict[str, Any]]) -> str:
    if not host or not host.get("launches_per_step"):
        return ""
    return (f"; host: {host['launches_per_step']:.0f} launches, waiting {host['wait_ms_per_step']:.0f} ms"
            f" in {host['waits_per_step']:.0f} syncs, {host['active_us_per_launch']:.1f} us active per launch")
