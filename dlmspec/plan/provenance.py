"""Where a plan's numbers come from: the layer path, the calibration, and what was measured.

A plan is counted from shapes, but its step time and a few memory terms scale with constants
fitted on GPU runs of one layer path (:data:`dlmspec.plan.calibration.CALIBRATED_PATHS`). This
module says, for a plan, which path it models, which constants it used (and whether they were
fitted on that path: a path without a calibration of its own - the Transformer Engine path until
its runs are fitted by ``bench/calibration/fit.py --write`` - is planned with the local path's
constants, marked "uncalibrated"), which of its dimensions lie outside what the
calibration runs covered (:class:`~dlmspec.plan.calibration.MeasuredRange`), and, for
``transformer_impl = "auto"``, what it plans on each path the runtime may take.
"""

from __future__ import annotations

from typing import Any

import math

from dlmspec.plan.calibration import (CALIBRATED_PATHS, FITTED_FROM_BY_PATH, PUBLIC_FITTED_FROM, PUBLIC_MEASURED,
                                      PUBLIC_POINTS, Calibration, MeasuredRange)
from dlmspec.plan.shape import Layout, ModelShape

#: The layer path whose constants stand in for a path without a calibration.
FALLBACK_PATH = "local+sdpa"

#: Where a user reads about the calibration runs (named in messages; the runs themselves are the
#: repository's bench/calibration/ data, from which dlmspec/plan/calibration.py is generated).
CALIBRATION_DOCS = "docs/planner-methods.md"


def calibration_for(impl: str) -> tuple[Calibration, MeasuredRange, bool]:
    """The constants to plan layer path ``impl`` with.

    Returns:
        ``(calibration, measured, calibrated)``: the path's own fitted constants and range when
        :data:`~dlmspec.plan.calibration.CALIBRATED_PATHS` has them (``calibrated`` true), else
        the local path's (``calibrated`` false: every number of such a plan is uncalibrated).
    """
    if impl in CALIBRATED_PATHS:
        calib, measured = CALIBRATED_PATHS[impl]
        return calib, measured, True
    calib, measured = CALIBRATED_PATHS[FALLBACK_PATH]
    return calib, measured, False


def _span(pair: tuple[int, int], fmt: str = "{:,}") -> str:
    lo, hi = pair
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}-{fmt.format(hi)}"


def outside_measured(shape: ModelShape, lay: Layout, gpu_id: str, measured: MeasuredRange) -> list[dict[str, Any]]:
    """The plan's dimensions outside what the calibration runs covered, one dict each:
    ``{"key": spec key, "value": the plan's, "measured": the runs' range in words}``, in the
    order sizes, micro batch, sequence, GPU, GPU count, fp8, fp8 recipe, fp8 attention, MoE, fused
    RoPE, parallel sizes. Empty when
    every dimension is inside its range (each dimension is checked on its own)."""
    out: list[dict[str, Any]] = []

    def add(key: str, value: Any, text: str) -> None:
        out.append({"key": key, "value": value, "measured": text})

    lo, hi = measured.parameters
    if not lo <= shape.total_params <= hi:
        add("model (parameters)", shape.total_params, f"{lo / 1e6:,.0f}M-{hi / 1e6:,.0f}M parameters")
    if not measured.micro_batch[0] <= lay.micro_batch <= measured.micro_batch[1]:
        add("train.micro_batch_size", lay.micro_batch, f"micro batch {_span(measured.micro_batch)}")
    if not measured.seq_length[0] <= lay.seq <= measured.seq_length[1]:
        add("train.seq_length", lay.seq, f"sequence {_span(measured.seq_length)}")
    tokens = lay.micro_batch * lay.seq
    if not measured.tokens_per_microbatch[0] <= tokens <= measured.tokens_per_microbatch[1]:
        add("train.micro_batch_size * train.seq_length", tokens,
            f"{_span(measured.tokens_per_microbatch)} tokens per microbatch")
    if gpu_id not in measured.gpus:
        add("cluster.gpu", gpu_id, f"GPU {', '.join(measured.gpus)}")
    if not measured.world_size[0] <= lay.world <= measured.world_size[1]:
        span = _span(measured.world_size)
        add("cluster (GPUs)", lay.world, f"{span} GPU" if span == "1" else f"{span} GPUs")
    if lay.fp8 not in measured.fp8:
        add("precision.fp8", lay.fp8, "fp8 runs" if True in measured.fp8 else "bf16 only (no fp8 run)")
    elif lay.fp8 and lay.fp8_recipe not in measured.fp8_recipes:
        add("precision.fp8_recipe", lay.fp8_recipe,
            f"fp8 recipes {' and '.join(measured.fp8_recipes)}" if measured.fp8_recipes else "no fp8 recipe")
    if lay.fp8_attention:  # no calibration run has had fp8 attention (bench/results: none)
        add("precision.fp8_dot_product_attention", True, "bf16 attention only (no fp8-attention run)")
    if shape.is_moe and shape.num_experts not in measured.num_experts:
        add("model.num_experts", shape.num_experts,
            f"{'/'.join(map(str, measured.num_experts))} experts" if measured.num_experts else "no MoE run")
    if shape.rope and lay.rope_fusion not in measured.rope_fusion:
        add("kernels.apply_rope_fusion", lay.rope_fusion,
            ("unfused RoPE only" if measured.rope_fusion == (False,) else "fused RoPE only")
            if measured.rope_fusion else "no run with rotary embeddings")
    keys = {"tp": "parallel.tensor_model_parallel_size", "pp": "parallel.pipeline_model_parallel_size",
            "cp": "parallel.context_parallel_size", "ep": "parallel.expert_model_parallel_size"}
    for name, key in keys.items():
        if getattr(lay, name) > measured.parallel_max.get(name, 1):
            add(key, getattr(lay, name), f"{name.upper()} up to {measured.parallel_max.get(name, 1)}")
    return out


#: The layer path whose multi-GPU constants are fitted on the public points.
PUBLIC_PATH = "transformer_engine"


def _ratio(a: float, b: float) -> str:
    r = a / b
    return "the same" if abs(r - 1) < 0.005 else (f"{r:.2g}x" if r >= 1 else f"1/{1 / r:.2g}")


def nearest_public_points(shape: ModelShape, lay: Layout, gpu_id: str, k: int = 2) -> list[dict[str, Any]]:
    """The ``k`` public calibration points (:data:`~dlmspec.plan.calibration.PUBLIC_POINTS`) nearest
    to a plan, and how far it is from each: distance = |log GPU-count ratio| + |log parameter ratio|
    + |log TP ratio| + |log PP ratio| + |log EP ratio| + |log CP ratio| + 1 for another GPU model
    (so each doubling of a size counts log 2). Each entry: ``name``, ``gpu``, ``gpus``,
    ``parameters``, ``tp``, ``pp``, ``cp``, ``ep``, ``precision`` and ``how_far`` in words (the plan
    against the point: GPU count and parameter ratios, the parallel sizes that differ)."""
    if not PUBLIC_POINTS:
        return []

    def dist(pt: dict[str, Any]) -> float:
        d = abs(math.log(lay.world / pt["gpus"])) + abs(math.log(max(1, shape.total_params) / pt["parameters"]))
        for key in ("tp", "pp", "ep", "cp"):
            d += abs(math.log(getattr(lay, key) / pt[key]))
        return d + (0.0 if pt["gpu"] == gpu_id else 1.0)

    out = []
    for pt in sorted(PUBLIC_POINTS, key=lambda pt: (dist(pt), pt["name"]))[:k]:
        far = [f"{_ratio(lay.world, pt['gpus'])} the GPUs ({lay.world:,} vs {pt['gpus']:,})",
               f"{_ratio(shape.total_params, pt['parameters'])} the parameters ({shape.total_params / 1e9:,.1f}B vs "
               f"{pt['parameters'] / 1e9:,.1f}B)"]
        far += [f"{key.upper()} {getattr(lay, key)} vs {pt[key]}" for key in ("tp", "pp", "cp", "ep")
                if getattr(lay, key) != pt[key]]
        if pt["gpu"] != gpu_id:
            far.append(f"GPU {gpu_id} vs {pt['gpu']}")
        out.append({**pt, "how_far": ", ".join(far)})
    return out


def public_info(shape: ModelShape, lay: Layout, gpu_id: str) -> dict[str, Any] | None:
    """The ``provenance.public_points`` object of a Transformer Engine plan: where its multi-GPU
    constants come from (``fitted_from``), the nearest public calibration points and how far the
    plan is from them (:func:`nearest_public_points`), the dimensions outside what those points
    covered (``outside``: :func:`outside_measured` against
    :data:`~dlmspec.plan.calibration.PUBLIC_MEASURED`, GPU count and parallel sizes only: model
    sizes and batches are the one-GPU calibration's business) and a one-line ``text``. None for the
    local path or before any public fit."""
    if lay.impl != PUBLIC_PATH or PUBLIC_MEASURED is None or not PUBLIC_POINTS:
        return None
    near = nearest_public_points(shape, lay, gpu_id)
    keep = ("cluster (GPUs)", "cluster.gpu", "parallel.")
    outside = [e for e in outside_measured(shape, lay, gpu_id, PUBLIC_MEASURED) if e["key"].startswith(keep)]
    text = (f"multi-GPU constants fitted on {PUBLIC_MEASURED.runs} public measurements "
            f"({PUBLIC_MEASURED.world_size[0]}-{PUBLIC_MEASURED.world_size[1]} GPUs, "
            f"{', '.join(PUBLIC_MEASURED.gpus)}); nearest: "
            + "; ".join(f"{n['name']} ({n['how_far']})" for n in near))
    if outside:
        text += "; outside them: " + "; ".join(f"{e['key']} = {e['value']!r} (measured: {e['measured']})" for e in outside)
    return {"fitted_from": PUBLIC_FITTED_FROM, "nearest": near, "outside": outside, "text": text}


def outside_text(entries: list[dict[str, Any]], measured_range: str) -> str:
    """The warning line of :func:`outside_measured`'s entries (empty string when there are none)."""
    if not entries:
        return ""
    def value(e: dict[str, Any]) -> str:
        v = e["value"]
        return f"{v / 1e9:.2f}B" if e["key"] == "model (parameters)" else repr(v)

    parts = [f"{e['key']} = {value(e)} (measured: {e['measured']})" for e in entries]
    return (f"outside what the calibration runs measured ({measured_range}; each dimension on its own): "
            + "; ".join(parts) + " - the plan extrapolates there")


def paths_text(paths: list[dict[str, Any]]) -> str:
    """One line per layer path of a ``transformer_impl = "auto"`` plan (:func:`path_summary`)."""
    lines = []
    for p in paths:
        lines.append(f"  {p['where']}: {p['layer_path']}, peak {p['peak_bytes'] / 1024**3:,.1f} GiB "
                     f"({'fits' if p['fits'] else 'DOES NOT FIT'}), {p['step_seconds']:.4g} s per step, "
                     f"{p['tokens_per_second']:,.0f} tokens/s ({p['calibration']}"
                     + (f"; outside its runs: {', '.join(p['outside_measured'])}" if p.get("outside_measured") else "")
                     + ")")
    return 'transformer_impl = "auto" plans both layer paths:\n' + "\n".join(lines)


def calibration_text(impl: str, calibrated: bool, custom: bool) -> str:
    """One line naming the constants a plan of layer path ``impl`` used."""
    if custom:
        return f"{impl}: constants passed to make_plan (not dlmspec/plan/calibration.py's defaults)"
    _, measured, _ = calibration_for(impl)
    source = (f"calibrated on {measured.runs} {FALLBACK_PATH if not calibrated else impl} "
              f"runs on {', '.join(measured.gpus)} ({CALIBRATION_DOCS})")
    if calibrated:
        return f"{impl}: {source}"
    return (f"UNCALIBRATED for {impl}: no {impl} calibration run yet; planned with the {FALLBACK_PATH} constants "
            f"({source}), so its memory and step time can be off")


def calibration_info(impl: str, *, custom: bool = False) -> dict[str, Any]:
    """The ``provenance.calibration`` object of a plan (or a search, a sweep member) of layer path
    ``impl``: ``status``, ``fitted_on``, ``constants``, ``fitted_from`` and its one-line ``text``."""
    _, _, calibrated = calibration_for(impl)
    fitted_on = FALLBACK_PATH if not calibrated else impl
    return {
        "status": "custom" if custom else ("calibrated" if calibrated else "uncalibrated"),
        "fitted_on": fitted_on,
        "constants": "make_plan(calibration=...)" if custom else "dlmspec/plan/calibration.py",
        "fitted_from": FITTED_FROM_BY_PATH.get(fitted_on),
        "text": calibration_text(impl, calibrated, custom),
    }


def provenance(plan: Any, *, custom: bool = False, paths: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``provenance`` object of :meth:`dlmspec.plan.Plan.to_dict` (keys in docs/planner.md).

    Args:
        plan: the :class:`dlmspec.plan.Plan` (typed ``Any``: this module is imported by it).
        custom: the caller passed its own :class:`Calibration` (then nothing is said about a
            fitted range but the path).
        paths: :func:`path_summary` of each layer path the runtime may take (``auto``), or None.
    """
    impl = plan.layout.impl
    _, measured, calibrated = calibration_for(impl)
    return {
        "layer_path": impl,
        "calibration": calibration_info(impl, custom=custom),
        "outside_measured": outside_measured(plan.shape, plan.layout, plan.gpu.id, measured),
        "measured_range": f"{measured.runs} {FALLBACK_PATH if not calibrated else impl} runs ({CALIBRATION_DOCS})",
        "paths": paths,
        "public_points": None if custom else public_info(plan.shape, plan.layout, plan.gpu.id),
    }


def path_summary(plan: Any, where: str) -> dict[str, Any]:
    """What one layer path plans (``where`` says when the runtime takes it): peak memory,
    whether it fits, step time, tokens/s, whether its constants were fitted on that path, and the
    keys of the dimensions outside that path's calibration runs (:func:`outside_measured`)."""
    _, measured, calibrated = calibration_for(plan.layout.impl)
    return {
        "where": where,
        "layer_path": plan.layout.impl,
        "calibration": "calibrated" if calibrated else "uncalibrated",
        "outside_measured": [e["key"] for e in outside_measured(plan.shape, plan.layout, plan.gpu.id, measured)],
        "peak_bytes": int(round(plan.peak_bytes)),
        "peak_allocated_bytes": int(round(plan.peak_allocated_bytes)),
        "fits": plan.fits,
        "step_seconds": plan.time.step_seconds,
        "tokens_per_second": plan.time.tokens_per_second,
    }


__all__ = ["calibration_for", "calibration_info", "nearest_public_points", "outside_measured", "outside_text", "paths_text",
           "provenance", "path_summary", "public_info"]
