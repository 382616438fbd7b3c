"""The host's kernel-launch speed, measured next to a run's step time.

:func:`measure_host_launch` times tiny eager CUDA ops issued from a Python loop (the median host
seconds per launch); :func:`record_host_launch` runs it on every rank before and after the
training loop and logs one ``host_launch`` event, the quantity the planner's
``cluster.host_launch_us`` stands for. Method and why: docs/runtime.md, "Host launch speed".
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

#: Launches per repeat, repeats and warm-up launches of :func:`measure_host_launch`: 5 x 4,000 +
#: 200 launches take ~0.1-0.2 s at 5-10 us per launch (0.4 s at 20 us).
DEFAULT_LAUNCHES = 4000
DEFAULT_REPEATS = 5
DEFAULT_WARMUP = 200
#: Elements of the tensor each launch adds to (4 KB: a grid of a few blocks).
TENSOR_ELEMENTS = 1024


@dataclass(frozen=True)
class HostLaunch:
    """One measurement of :func:`measure_host_launch`.

    Attributes:
        seconds_per_launch: median over the repeats of (host seconds of the loop) / launches:
            what ``cluster.host_launch_us`` holds, in seconds.
        repeats_seconds_per_launch: the same for each repeat.
        launches: launches per repeat.
        gpu_drain_seconds: median wait in ``torch.cuda.synchronize()`` after a repeat's last
            launch (the GPU's backlog; near zero when the host is the slower side, as intended).
        device: ``torch.cuda.get_device_name()``.
    """

    seconds_per_launch: float
    repeats_seconds_per_launch: List[float]
    launches: int
    gpu_drain_seconds: float
    device: str

    def to_record(self) -> Dict[str, Any]:
        """metrics.jsonl values: ``host_launch_us`` (microseconds per launch) and the details."""
        return {
            "host_launch_us": self.seconds_per_launch * 1e6,
            "host_launch_repeats_us": [s * 1e6 for s in self.repeats_seconds_per_launch],
            "launches": self.launches,
            "gpu_drain_ms": self.gpu_drain_seconds * 1e3,
            "device": self.device,
        }


def measure_host_launch(
    launches: int = DEFAULT_LAUNCHES,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    device: Optional[torch.device] = None,
) -> Optional[HostLaunch]:
    """Host seconds per eager CUDA kernel launch on ``device`` (default: the current device).

    Each repeat synchronises, then issues ``launches`` out-of-place ``torch.add(x, 1.0)`` on a
    ``[1024]`` fp32 tensor from a Python loop (each result is the next input, so every launch
    allocates and frees through the caching allocator, as eager layer code does), reads
    ``time.perf_counter()`` after the last launch - host time only, nothing synchronised inside
    the loop - and then synchronises (that wait is ``gpu_drain_seconds``, not counted). The
    first ``warmup`` launches are not timed. Takes ``repeats * launches`` launches, well under
    0.5 s with the defaults.

    Args:
        launches: launches per timed repeat (>= 1).
        repeats: timed repeats (>= 1); the result is their median.
        warmup: untimed launches first (the kernel's first load, the allocator's first block).
        device: a CUDA device; default ``torch.cuda.current_device()``.

    Returns:
        :class:`HostLaunch`, or None when CUDA is not available (nothing to measure on a CPU run).

    Raises:
        ValueError: ``launches`` or ``repeats`` below 1.
    """
    if launches < 1 or repeats < 1:
        raise ValueError(f"launches and repeats must be >= 1, got {launches} and {repeats}")
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    x = torch.zeros(TENSOR_ELEMENTS, dtype=torch.float32, device=device)
    y = x
    for _ in range(warmup):
        y = torch.add(y, 1.0)
    torch.cuda.synchronize(device)
    per_launch, drains = [], []
    for _ in range(repeats):
        y = x
        t0 = time.perf_counter()
        for _ in range(launches):
            y = torch.add(y, 1.0)
        t1 = time.perf_counter()
        torch.cuda.synchronize(device)
        drains.append(time.perf_counter() - t1)
        per_launch.append((t1 - t0) / launches)
    del x, y
    return HostLaunch(
        seconds_per_launch=statistics.median(per_launch),
        repeats_seconds_per_launch=per_launch,
        launches=launches,
        gpu_drain_seconds=statistics.median(drains),
        device=torch.cuda.get_device_name(device),
    )


def record_host_launch(logger: Any, phase: str, iteration: int, **kwargs: Any) -> Optional[Dict[str, Any]]:
    """Measure the host launch speed on every rank at once and log one ``host_launch`` event.

    Every rank runs :func:`measure_host_launch` at the same moment (ranks of one host share its
    cores, as they do while training), then the values are combined over ranks with two
    ``all_reduce`` calls: ``host_launch_us`` is the mean over ranks (microseconds per launch),
    ``host_launch_us_max`` the slowest rank's. The logging rank writes
    ``{"event": "host_launch", "phase": phase, "iteration": iteration, "ranks": world, ...}``
    (its own measurement's details included) through ``logger.record``; other ranks' loggers
    are disabled and write nothing. Without CUDA nothing is measured or logged (on every rank,
    so no rank waits in a collective alone).

    Args:
        logger: a :class:`~dlmspec.backends.megatron.metrics.MetricsLogger` (anything with
            ``record(event, values)``).
        phase: ``"start"`` (before the training loop) or ``"end"`` (after it).
        iteration: the training iteration at the measurement.
        **kwargs: passed to :func:`measure_host_launch`.

    Returns:
        The values written (on every rank), or None without CUDA.
    """
    result = measure_host_launch(**kwargs)
    if result is None:
        return None
    values = result.to_record()
    world = 1
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        if world > 1:
            buf = torch.tensor([values["host_launch_us"]], dtype=torch.float64, device=torch.cuda.current_device())
            top = buf.clone()
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            values["host_launch_us_this_rank"] = values["host_launch_us"]
            values["host_launch_us"] = float(buf.item()) / world
            values["host_launch_us_max"] = float(top.item())
    if "host_launch_us_max" not in values:
        values["host_launch_us_max"] = values["host_launch_us"]
    record = {"phase": phase, "iteration": iteration, "ranks": world, **values}
    logger.record("host_launch", record)
    return record
