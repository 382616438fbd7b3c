"""Phases of a run whose steps cost more than its steady ones, stated beside the plan's peak.

Attention annealing (``objective.attention_anneal_iters = K``, :mod:`dlmspec.objectives.attention_anneal`):
the steps ``k < K - 1`` (``min(K - 1, train_iters)`` of them, :func:`annealed_steps`) run with the
annealed causal mask; from step ``K - 1`` on attention is full and maskless, which is what the
plan's peak and step time describe. Each annealed micro-batch draws one ``s x s`` mask per GPU
(``backends/megatron/masks.py`` ``annealed_causal`` / ``AnnealedCausal``):

* the draw: ``U ~ U(0, 1)^{s x s}`` in float32 (4 bytes per entry) and ``opened = U < r`` (bool, 1):
  :data:`ANNEAL_DRAW_BYTES` = 5 bytes per entry while both exist (the uniforms are freed on return);
* held through the micro-batch's forward and backward (the batch keeps the mask object):
  ``opened`` (1 byte per entry) and, on SDPA, the dense ``[1, 1, s, s]`` bool tensor
  ``AnnealedCausal.allowed`` builds once for all layers (1 more); FlexAttention keeps a
  ``BlockMask`` of ``(s / 128)^2`` tile entries instead (not counted):
  :data:`ANNEAL_HELD_BYTES`.

The extra bytes at the peak are bounded by the micro-batch being drawn plus the others in flight
holding theirs: ``s^2 (ANNEAL_DRAW_BYTES + held (in_flight - 1))`` (one micro-batch in flight:
``5 s^2``). FLOPs do not change (the opened keys reach every tile: attention computes all ``s``
keys, as full attention does); the kernel does: SDPA runs masked (its memory-efficient kernel, not
flash / cuDNN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlmspec.objectives.attention_anneal import annealed_steps
from dlmspec.plan.pipeline_stages import in_flight
from dlmspec.plan.shape import Layout, ModelShape, input_length

#: Bytes per mask entry at the draw: the float32 uniforms and the bool ``opened`` (masks.py ``annealed_causal``).
ANNEAL_DRAW_BYTES = 5
#: Bytes per mask entry a micro-batch holds through its forward and backward, by attention backend:
#: ``opened`` (1), plus SDPA's dense bool tensor (``AnnealedCausal.allowed``, 1).
ANNEAL_HELD_BYTES = {"sdpa": 2, "flex": 1}


@dataclass(frozen=True)
class Phase:
    """A stretch of training whose memory exceeds the steady steps' (what the plan's peak is).

    Attributes:
        name: what runs differently (``"attention annealing"``).
        steps: how many steps (from step 0).
        during: the steps in words (``"during the first 999 steps"``).
        extra_bytes: bytes per GPU on top of the plan's peak during those steps.
        peak_bytes: the plan's peak plus ``extra_bytes``.
        fits: whether ``peak_bytes`` fits the GPU.
        note: how the bytes are counted and what else changes.
        step_seconds: the step time during the phase where the time model has its kernel
            (attention annealing on SDPA: the masked, memory-efficient kernel,
            :data:`~dlmspec.plan.time.ATTENTION_BACKEND_SPEED` ``"efficient"``); None where it has
            none (FlexAttention).
    """

    name: str
    steps: int
    during: str
    extra_bytes: float
    peak_bytes: float
    fits: bool
    note: str
    step_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``plan --json`` ``phases[]``; bytes as integers)."""
        return {"name": self.name, "steps": self.steps, "during": self.during,
                "extra_bytes": int(round(self.extra_bytes)), "peak_bytes": int(round(self.peak_bytes)),
                "fits": self.fits, "note": self.note, "step_seconds": self.step_seconds}


def anneal_extra_bytes(shape: ModelShape, lay: Layout, stage: int = 0) -> float:
    """Bytes per GPU the annealed mask adds on rank ``stage`` during the annealing steps (the
    module docstring): ``s^2 (ANNEAL_DRAW_BYTES + held (in_flight - 1))``, ``s`` the input length
    (annealing refuses context parallelism), ``held`` :data:`ANNEAL_HELD_BYTES` of the run's
    attention backend. 0 without annealing."""
    if not annealed_steps(shape.attention_anneal_iters, lay.train_iters):
        return 0.0
    s = input_length(shape, lay)
    held = ANNEAL_HELD_BYTES.get(shape.anneal_backend, ANNEAL_HELD_BYTES["sdpa"])
    flight = max(1.0, in_flight(lay, stage))
    return float(s) * s * (ANNEAL_DRAW_BYTES + held * (flight - 1))


def plan_phases(shape: ModelShape, lay: Layout, peak_bytes: float, peak_stage: int, capacity: float,
                gpu: Any = None, calib: Any = None) -> list[Phase]:
    """The run's costlier phases (empty for most runs): attention annealing's first steps. With
    ``gpu`` (and ``calib``, the plan's calibration), the phase's step time on SDPA's masked kernel
    (:attr:`Phase.step_seconds`)."""
    phases = []
    steps = annealed_steps(shape.attention_anneal_iters, lay.train_iters)
    if steps:
        extra = anneal_extra_bytes(shape, lay, peak_stage)
        s = input_length(shape, lay)
        backend = shape.anneal_backend or "sdpa"
        kernel = ("SDPA runs masked (memory-efficient kernel, not flash / cuDNN)" if backend == "sdpa"
                  else "FlexAttention builds a BlockMask per micro-batch")
        step = None
        if gpu is not None and backend == "sdpa":
            from dataclasses import replace

            from dlmspec.plan.time import time_plan

            masked = replace(lay, sdpa_backend="efficient")
            step = time_plan(shape, masked, gpu, calib, all_stages=False).step_seconds if calib else None
        phases.append(Phase(
            name="attention annealing", steps=steps, during=f"during the first {steps:,} steps",
            extra_bytes=extra, peak_bytes=peak_bytes + extra, fits=peak_bytes + extra <= capacity,
            note=(f"one {s:,} x {s:,} mask draw per micro-batch: {ANNEAL_DRAW_BYTES} bytes per entry at the draw "
                  f"(float32 uniforms + bool), {ANNEAL_HELD_BYTES.get(backend, 2)} held per micro-batch in flight "
                  f"({backend}); {kernel}; FLOPs unchanged"),
            step_seconds=step,
        ))
    return phases
