"""Compare the planner with GPU measurements, fit its constants, write the docs table.

Reads every ``bench/calibration/<path>/<gpu>/*.json`` that holds calibration runs, plans each run's spec,
reports planned vs measured peak allocated memory and step time (and Megatron-LM's theoretical
memory formula on the same configuration), fits the constants of
:mod:`dlmspec.plan.calibration` by least squares, and writes the tables into
``docs/planner-methods.md`` between ``<!-- calibration:begin -->`` and ``<!-- calibration:end -->``.

Measurement files: a JSON list of runs, or an object with ``"runs": [...]`` (other keys such
as ``"command"`` and ``"device"`` are kept as provenance). A run is::

    {
      "name": "demo-tp2-sp",                   # a bench/plan/matrix.json name, or any label
      "base": "specs/demo-dlm.toml",           # spec file (relative to the repository root) ...
      "overrides": ["cluster.gpus_per_node=2", ...],   # ... and its --set values
      "spec": {...},                           # ... or instead a whole spec (e.g. spec.lock.toml as a dict)
      "impl": "local+sdpa",                    # layer path the runtime reported (optional)
      "peak_allocated_bytes": 14123456789,     # torch.cuda.max_memory_allocated(), max over ranks
      "step_seconds": 0.0612,                  # median step time over the measured steps
      "peak_reserved_bytes": 15000000000,      # optional
      "host_launch_us": 7.1                    # optional: the host's launch speed the runtime logged
    }                                          # (metrics.jsonl event host_launch; run_matrix.sh's mean)

A file's ``"date"`` (ISO date, or date and time) orders measurements: the newest measurement of a
configuration (its ``name``) is the one of the largest ``(date, file name)``.

``peak_mem_gib`` (the runtime's metrics.jsonl field, GiB) is accepted for
``peak_allocated_bytes`` and ``step_time_s`` for ``step_seconds``; a run with only ``name``
takes ``base``/``overrides`` from ``bench/plan/matrix.json``. Runs without both measurements
(e.g. ``"error": ...``) are listed and skipped.

The fit (relative errors, so small and large runs weigh alike):

* memory: ``measured = static + activation_scale * activations + allocated_overhead_bytes``,
  where ``activations`` are the plan's activation, logits and transient terms and ``static``
  the rest; two unknowns, linear least squares (overhead clamped at >= 0).
* host speed: a run whose record has ``host_launch_us`` is planned with it
  (``cluster.host_launch_us``), so its host terms scale by ``host_launch_us * 1e-6 /
  host_launch_seconds``; the others are planned on the typical host. With measured values the
  typical host (``Calibration.host_launch_seconds``) becomes their median first, then the fit
  runs: ``seconds_per_kernel / host_launch_seconds`` is the ratio the fit determines.
* time: ``measured = sum_i c_i x_i + fixed``, ``x`` = the plan's features at 100% of every peak
  (GEMM at the bf16 peak, the TE path's fp8 GEMMs at the fp8 peak, attention, element-wise bytes, host kernel launches, NVLink transfers, host syncs,
  Megatron-FSDP host operations, calls of torch.compile'd functions, the fused linear cross
  entropy's chunk-loop launches, 1)
  and ``fixed`` what is not linear in a fitted constant (latencies, the GPU's per-kernel floor,
  network transfers, the exposed data-parallel communication); ``c`` = (1/gemm_efficiency,
  1/fp8_gemm_efficiency, 1/attention_efficiency, 1/memory_efficiency, seconds_per_kernel, 1/nvlink_efficiency,
  host_sync_seconds, fsdp_seconds_per_op, seconds_per_compiled_call, seconds_per_fused_ce_kernel,
  step_overhead_seconds), non-negative least squares with a weak pull
  (weight ``--prior``) towards the current constants, so a constant no run exercises keeps its
  value. A microbatch takes max(GPU time, host launch time) (:mod:`dlmspec.plan.time`), so the
  features are those of the side each run's slowest rank is on; the fit is repeated, each round
  re-deciding the sides with the constants of the last, until no run changes side (at most
  :data:`MAX_ROUNDS` rounds).

Layer paths: the fit above is the local path's (records whose ``impl``, or the path the planner infers
from their spec, is not ``transformer_engine``). Transformer Engine records (``bench/devbox/gpu/te_calibration.sh``'s
``calibration_te_h200.json``) get a fit of their own (:func:`fit_te`): the same memory and
time fits, pulled towards the constants the TE path is planned with now (the local path's until a TE
calibration is committed), plus ``allocator_reserve_fraction`` from their ``peak_reserved_bytes``
(:func:`fit_reserve`). Records marked ``"held_out": true`` are left out of every fit and reported
against it. The TE table goes between ``<!-- te-calibration:begin -->`` and ``<!-- te-calibration:end -->``
of the docs. The constants themselves are written by ``bench/calibration/fit.py --write`` (into the
calibration data's fit.json, from which ``python -m dlmspec.generated`` writes calibration.py),
after which the planner plans the TE path with them and its provenance says "calibrated". A results
folder with TE records only, or ``--te-only``, leaves the local section as it is.

Leave-one-out errors (refit without the run, predict it) are reported next to the in-sample
ones; the step-time target is reported over every record, over the newest measurement of each
configuration, and as the median of each configuration's measurements against the median of its
plans (:func:`by_configuration`, with the spread of the repeated measurements).

Usage::

    .venv/bin/python bench/plan/calibrate.py                # table into docs/planner-methods.md
    .venv/bin/python bench/plan/calibrate.py --plan-only    # planned values of matrix.json
    .venv/bin/python bench/plan/calibrate.py --te-only      # the TE path only (its table)
    .venv/bin/python bench/plan/calibrate.py --results DIR --docs FILE
    .venv/bin/python bench/calibration/fit.py --write       # the constants (fit.json), then
    .venv/bin/python -m dlmspec.generated                   # ... calibration.py from them
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dlmspec.errors import SpecError  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402
from dlmspec.plan import make_plan  # noqa: E402
from dlmspec.plan.calibration import DEFAULT_CALIBRATION, Calibration  # noqa: E402
from dlmspec.plan.megatron_formula import megatron_estimate  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402
from dlmspec.spec.models import Spec  # noqa: E402

GiB = 1024**3
RESULTS = ROOT / "bench" / "calibration"
MATRIX = ROOT / "bench" / "plan" / "matrix.json"
DOCS = ROOT / "docs" / "planner-methods.md"
BEGIN, END = "<!-- calibration:begin -->", "<!-- calibration:end -->"

#: Activation-like allocated terms (scaled by activation_scale).
ACT_TERMS = ("activations", "embedding_output_activations", "loss_logits", "backward_transient")
#: Time features and the constant each one's coefficient maps to.
TIME_FEATURES = ("gemm", "gemm_fp8", "attention", "elementwise", "kernels", "nvlink", "syncs", "fsdp_ops", "compiled_calls",
                 "fused_ce_kernels", "const")
#: Rounds of the time fit (each re-decides which runs are launch-bound).
MAX_ROUNDS = 12


@dataclass
class Run:
    """One measured run, planned."""

    name: str
    gpus: int
    impl: str | None
    resolved: Any
    measured_bytes: float
    measured_seconds: float
    source: str
    host_launch_us: float | None = None
    order: tuple[str, str] = ("", "")
    held_out: bool = False
    measured_reserved_bytes: float | None = None


def _matrix() -> dict[str, dict]:
    if not MATRIX.exists():
        return {}
    return {e["name"]: e for e in json.loads(MATRIX.read_text(encoding="utf-8"))}


#: The cross entropy of a record whose recorded ``spec`` has no ``[kernels]`` table: such a spec
#: predates the table, when the runtime always ran megatron-core's vocab-parallel cross entropy
#: (``base`` + ``overrides`` records and matrix entries say what they ran).
RECORD_CROSS_ENTROPY = "megatron"
#: The RoPE path of a recorded ``spec`` without ``kernels.apply_rope_fusion``: such a spec
#: predates the key (default on since), when the local path ran megatron-core's unfused RoPE.
RECORD_ROPE_FUSION = False
#: ``kernels.qkv_fusion`` and ``kernels.compiled_norm`` of a recorded ``spec`` without them: such a
#: spec predates the keys (default on since), when the local path ran megatron-core's modules.
RECORD_LOCAL_KERNELS = {"qkv_fusion": False, "compiled_norm": False}
#: The fused linear cross entropy's backend in the Transformer Engine records (``"impl":
#: "transformer_engine"``) whose overrides do not set ``kernels.fused_linear_impl`` and that do not
#: record ``fused_linear_backend`` (``bench/gpu/te_calibration.py`` reads it from each log now): Liger Kernel
#: did not import beside TE on the GPU machine, so ``"auto"`` fell back to PyTorch row chunks
#: (each run's log: ``cross entropy fused_linear (torch)``, bench/results/gpu_runs_h200_te_repeats_fp8_agreement/calibration/). They are
#: planned as they ran.
TE_RECORD_FUSED_LINEAR_IMPL = "torch"


def _resolve_run(rec: dict, matrix: dict[str, dict]):
    """The resolved spec a record ran: its ``spec`` (``kernels.cross_entropy`` =
    :data:`RECORD_CROSS_ENTROPY` when it has no ``[kernels]`` table, ``apply_rope_fusion`` =
    :data:`RECORD_ROPE_FUSION` and :data:`RECORD_LOCAL_KERNELS` when the table lacks them), or
    ``base`` + ``overrides`` (a matrix entry's when the record names one; a TE record's
    ``kernels.fused_linear_impl`` = its ``fused_linear_backend``, else
    :data:`TE_RECORD_FUSED_LINEAR_IMPL`, unless it sets one); with
    the record's ``host_launch_us`` as ``cluster.host_launch_us``."""
    host = rec.get("host_launch_us")
    if "spec" in rec:
        data = dict(rec["spec"])
        if "kernels" in Spec.model_fields and "kernels" not in data:
            data["kernels"] = {"cross_entropy": RECORD_CROSS_ENTROPY}
        if "kernels" in data:
            # Recorded specs predate [kernels] apply_rope_fusion, qkv_fusion and compiled_norm.
            data["kernels"] = {"apply_rope_fusion": RECORD_ROPE_FUSION, **RECORD_LOCAL_KERNELS, **data["kernels"]}
        if host:
            data["cluster"] = {**data.get("cluster", {}), "host_launch_us": float(host)}
        return resolve(Spec.model_validate(data))
    entry = matrix.get(rec.get("name", ""), {})
    base = rec.get("base") or entry.get("base")
    overrides = rec.get("overrides", entry.get("overrides"))
    if base is None or overrides is None:
        raise ValueError("no spec: give 'spec', or 'base' and 'overrides', or a name from bench/plan/matrix.json")
    overrides = list(overrides)
    if rec.get("impl") == "transformer_engine" and not any(o.startswith("kernels.fused_linear_impl=") for o in overrides):
        backend = rec.get("fused_linear_backend", TE_RECORD_FUSED_LINEAR_IMPL)
        overrides.append(f"kernels.fused_linear_impl={backend!r}")
    if host:
        overrides.append(f"cluster.host_launch_us={float(host)!r}")
    return resolve(load(ROOT / base, overrides).spec)


def read_runs(results: Path) -> tuple[list[Run], list[str]]:
    """Every measured run under ``results`` (its ``*.json`` files at any depth, except
    ``manifest.json`` and ``fit.json``) and a note per skipped record."""
    return read_runs_files(sorted(p for p in Path(results).rglob("*.json") if p.name not in ("manifest.json", "fit.json")))


def read_runs_files(paths: list[Path]) -> tuple[list[Run], list[str]]:
    """Every measured run of the files ``paths`` (in that order) and a note per skipped record."""
    matrix = _matrix()
    runs, skipped = [], []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            skipped.append(f"{path.name}: unreadable ({exc})")
            continue
        records = data.get("runs") if isinstance(data, dict) else data
        if not isinstance(records, list):
            continue
        order = (str(data.get("date", "")) if isinstance(data, dict) else "", path.name)
        for rec in records:
            if not isinstance(rec, dict) or "name" not in rec:
                continue  # not a calibration run (e.g. the conversion check's per-family records)
            name = str(rec["name"])
            mem = rec.get("peak_allocated_bytes")
            if mem is None and rec.get("peak_mem_gib") is not None:
                mem = float(rec["peak_mem_gib"]) * GiB
            sec = rec.get("step_seconds", rec.get("step_time_s"))
            if mem is None or sec is None:
                skipped.append(f"{path.name}: {name}: no measurement ({rec.get('error', 'missing keys')})")
                continue
            try:
                resolved = _resolve_run(rec, matrix)
            except (SpecError, ValueError) as exc:
                skipped.append(f"{path.name}: {name}: {str(exc).splitlines()[0]}")
                continue
            host = rec.get("host_launch_us")
            reserved = rec.get("peak_reserved_bytes")
            runs.append(Run(name, int(rec.get("gpus", resolved.world_size)), rec.get("impl"), resolved,
                            float(mem), float(sec), path.name, float(host) if host else None, order,
                            bool(rec.get("held_out", False)), float(reserved) if reserved else None))
    return runs, skipped


def measured_range(runs: list[Run], impl: str = "local+sdpa") -> dict[str, Any]:
    """What the runs of layer path ``impl`` (the path each run reported, else the one the planner
    infers) covered, as the fields of :class:`dlmspec.plan.calibration.MeasuredRange`
    (``tests/unit/plan/test_plan_provenance.py`` compares the committed ``LOCAL_MEASURED`` with it)."""
    from dlmspec.plan.shape import layout, model_shape, transformer_impl

    runs = [r for r in runs if (r.impl or transformer_impl(r.resolved)[0]) == impl]
    shapes = [(model_shape(r.resolved), layout(r.resolved, r.impl), r.resolved.gpu.id) for r in runs]

    def span(values):
        values = list(values)
        return (min(values), max(values))

    return {
        "gpus": tuple(sorted({g for _, _, g in shapes})),
        "world_size": span(lay.world for _, lay, _ in shapes),
        "parameters": span(s.total_params for s, _, _ in shapes),
        "micro_batch": span(lay.micro_batch for _, lay, _ in shapes),
        "seq_length": span(lay.seq for _, lay, _ in shapes),
        "tokens_per_microbatch": span(lay.micro_batch * lay.seq for _, lay, _ in shapes),
        "fp8": tuple(sorted({lay.fp8 for _, lay, _ in shapes})),
        "fp8_recipes": tuple(sorted({lay.fp8_recipe for _, lay, _ in shapes if lay.fp8})),
        "num_experts": tuple(sorted({s.num_experts for s, _, _ in shapes if s.num_experts})),
        "rope_fusion": tuple(sorted({lay.rope_fusion for s, lay, _ in shapes if s.rope})),
        "parallel_max": {k: max(getattr(lay, k) for _, lay, _ in shapes) for k in ("tp", "pp", "cp", "ep")},
        "runs": len(runs),
    }


def path_of(run: Run) -> str:
    """The layer path a run took: the one its record reports (``impl``), else the one the planner
    infers from its spec (:func:`dlmspec.plan.shape.transformer_impl`)."""
    from dlmspec.plan.shape import transformer_impl

    return run.impl or transformer_impl(run.resolved)[0]


def _plan(run: Run, calib: Calibration):
    return make_plan(run.resolved, calib, impl=run.impl)


def memory_parts(run: Run, calib: Calibration) -> tuple[float, float]:
    """(static bytes, activation bytes at scale 1) of the run's peak stage."""
    bare = calib.with_values(activation_scale=1.0, allocated_overhead_bytes=0.0)
    peak = _plan(run, bare).memory.peak
    act = sum(peak.breakdown[k] for k in ACT_TERMS)
    return peak.peak_allocated_bytes - act, act


def fit_memory(runs: list[Run], calib: Calibration) -> tuple[float, float]:
    """(activation_scale, allocated_overhead_bytes) by least squares on relative errors."""
    if not runs:
        return calib.activation_scale, calib.allocated_overhead_bytes
    parts = [memory_parts(r, calib) for r in runs]
    m = np.array([r.measured_bytes for r in runs])
    static = np.array([p[0] for p in parts])
    act = np.array([p[1] for p in parts])
    a = np.stack([act / m, 1.0 / m], axis=1)
    y = (m - static) / m
    if len(runs) >= 2 and np.ptp(act / m) > 0:
        (scale, over), *_ = np.linalg.lstsq(a, y, rcond=None)
    else:
        scale, over = calib.activation_scale, calib.allocated_overhead_bytes
    if over < 0:
        over = 0.0
        scale = float(np.dot(a[:, 0], y) / max(np.dot(a[:, 0], a[:, 0]), 1e-30))
    return float(max(scale, 0.0)), float(over)


#: Time constants the fit sets, in :data:`TIME_FEATURES` order (``const`` ->
#: step_overhead_seconds); the efficiencies enter as ``1/e = 1 + z`` with ``z >= 0``, so no
#: fitted efficiency exceeds 1.
TIME_CONSTANTS = ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency", "memory_efficiency", "seconds_per_kernel",
                  "nvlink_efficiency", "host_sync_seconds", "fsdp_seconds_per_op", "seconds_per_compiled_call",
                  "seconds_per_fused_ce_kernel", "step_overhead_seconds")
EFFICIENCIES = {"gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency", "memory_efficiency", "nvlink_efficiency"}


def _time_z(calib: Calibration) -> np.ndarray:
    """The fit's unknowns for ``calib``: ``1/e - 1`` for efficiencies, the constant otherwise."""
    return np.array([1 / getattr(calib, n) - 1 if n in EFFICIENCIES else getattr(calib, n) for n in TIME_CONSTANTS])


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares, Lawson and Hanson (1974), ch. 23."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
        w = a.T @ (b - a @ x)
    return x


def fit_time(runs: list[Run], calib: Calibration, prior_weight: float) -> Calibration:
    """One round of the time fit (see the module docstring) with the sides (launch- or
    GPU-bound) and fixed terms of ``calib``; returns a new Calibration."""
    if not runs:
        return calib
    z0 = _time_z(calib)
    scale = np.where(z0 > 0, z0, 0.05)  # unknowns relative to the current values (conditioning)
    rows, target = [], []
    for r in runs:
        f = _plan(r, calib).time.features
        x = np.array([f[k] for k in TIME_FEATURES])
        known = f["fixed"] + sum(x[i] for i, n in enumerate(TIME_CONSTANTS) if n in EFFICIENCIES)
        rows.append(x * scale / r.measured_seconds)
        target.append((r.measured_seconds - known) / r.measured_seconds)
    a = np.vstack([np.array(rows), prior_weight * np.eye(len(TIME_FEATURES))])
    b = np.concatenate([np.array(target), prior_weight * z0 / scale])
    z = nnls(a, b) * scale
    used = np.array(rows).any(axis=0)  # a constant no run exercises keeps its value exactly
    values = {n: (1 / (1 + z[i]) if n in EFFICIENCIES else float(max(z[i], 1e-12)))
              for i, n in enumerate(TIME_CONSTANTS) if used[i]}
    return calib.with_values(**values)


def time_cost(runs: list[Run], calib: Calibration) -> float:
    """Sum of squared relative step-time errors of ``runs`` under ``calib``."""
    return float(sum(((_plan(r, calib).time.step_seconds - r.measured_seconds) / r.measured_seconds) ** 2
                     for r in runs))


def _sides(runs: list[Run], calib: Calibration) -> tuple[bool, ...]:
    """Whether each run's slowest rank is launch-bound under ``calib`` (its GEMM feature is 0
    while its GPU-side work is not)."""
    out = []
    for r in runs:
        f = _plan(r, calib).time.features
        out.append(f["gemm"] == 0.0)
    return tuple(out)


def typical_host(runs: list[Run], calib: Calibration) -> Calibration:
    """``calib`` with ``host_launch_seconds`` = the median ``host_launch_us`` of the runs that
    recorded one (unchanged when none did): the typical host the host constants are fitted for."""
    values = sorted(r.host_launch_us for r in runs if r.host_launch_us)
    if not values:
        return calib
    return calib.with_values(host_launch_seconds=float(np.median(values)) * 1e-6)


def newest(runs: list[Run]) -> list[int]:
    """Indices of the newest measurement of each configuration (largest ``(date, file name)``
    per run name), in ``runs`` order."""
    best: dict[str, int] = {}
    for i, r in enumerate(runs):
        j = best.get(r.name)
        if j is None or r.order >= runs[j].order:
            best[r.name] = i
    return sorted(best.values())


def leave_configuration_out(runs: list[Run], default: Calibration, prior_weight: float) -> list[float]:
    """Planned step seconds of every run by a fit without any measurement of its configuration
    (run name): how the planner does on a configuration it was never calibrated on."""
    out = [0.0] * len(runs)
    for name in dict.fromkeys(r.name for r in runs):
        rest = [r for r in runs if r.name != name]
        c = fit(rest, default, prior_weight) if len(rest) >= 2 else default
        for i, r in enumerate(runs):
            if r.name == name:
                out[i] = _plan(r, c).time.step_seconds
    return out


def by_configuration(runs: list[Run], planned: list[float]) -> list[tuple[str, int, float, float, float, float]]:
    """Per configuration (run name): ``(name, measurements, median measured seconds, median
    planned seconds, relative error of the medians, spread)``, in first-seen order. ``spread`` is
    ``(max - min) / median`` of the measured step times (0 with one measurement): how far repeated
    measurements of one configuration disagree with each other. The medians are the comparison
    that process-to-process host noise (``bench/results/host_variance_h200x2.json``:
    fresh processes of one launch-bound workload differ by 17-20%) affects least."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(r.name, []).append(i)
    out = []
    for name, idx in groups.items():
        meas = [runs[i].measured_seconds for i in idx]
        med_m, med_p = float(np.median(meas)), float(np.median([planned[i] for i in idx]))
        spread = (max(meas) - min(meas)) / med_m if len(meas) > 1 else 0.0
        out.append((name, len(idx), med_m, med_p, _err(med_p, med_m), spread))
    return out


def fit(runs: list[Run], calib: Calibration, prior_weight: float) -> Calibration:
    """Both fits. The time fit is repeated, each round with the sides (launch-bound or
    GPU-bound) and fixed terms of the last round's constants, until no run changes side (at
    most :data:`MAX_ROUNDS` rounds). It starts twice - from ``calib``'s sides and from every run
    GPU-bound (a tenth of ``calib``'s host time per launch for the first round) - since a
    start on one side can settle where it began; the round with the smallest squared relative
    error wins."""
    calib = typical_host(runs, calib)
    scale, over = fit_memory(runs, calib)
    base = calib.with_values(activation_scale=scale, allocated_overhead_bytes=over)
    best = (time_cost(runs, base), base)
    for start in (base, base.with_values(seconds_per_kernel=base.seconds_per_kernel / 10)):
        out = start
        sides = _sides(runs, out)
        for i in range(MAX_ROUNDS):
            out = fit_time(runs, out, prior_weight)
            cost = time_cost(runs, out)
            if cost < best[0]:
                best = (cost, out)
            new = _sides(runs, out)
            if new == sides and i >= 1:
                break
            sides = new
    return best[1]


def _err(planned: float, measured: float) -> float:
    return (planned - measured) / measured


def table(runs: list[Run], default: Calibration, fitted: Calibration, prior_weight: float,
          skipped: list[str], sources: list[str]) -> str:
    """The markdown of the calibration section."""
    lines = [BEGIN, "", "Generated by `bench/plan/calibrate.py` from " + (", ".join(f"`{s}`" for s in sources) or "no files") + ".", ""]
    if not runs:
        lines += ["No measurements yet: run the matrix of `bench/plan/matrix.json` on the GPUs "
                  "(see *Calibration* above), then rerun `bench/plan/calibrate.py`. Until then, the planned "
                  "peak allocated memory of each matrix run (uncalibrated constants) next to Megatron-LM's "
                  "theoretical formula:", ""]
        lines += _planned_matrix_table()
        lines += [f"- skipped: {s}" for s in skipped]
        lines += ["", END]
        return "\n".join(lines)
    loo_mem, loo_time = [], []
    for i in range(len(runs)):
        rest = runs[:i] + runs[i + 1:]
        c = fit(rest, default, prior_weight) if len(rest) >= 2 else default
        p = _plan(runs[i], c)
        loo_mem.append(_err(p.peak_allocated_bytes, runs[i].measured_bytes))
        loo_time.append(_err(p.time.step_seconds, runs[i].measured_seconds))
    lines += [
        "| run | GPUs | layers | measured peak GiB | planned GiB | error | LOO error | uncalibrated error "
        "| Megatron-LM formula GiB | its error | host us/launch | measured step s | planned s | error | LOO error "
        "| uncalibrated error |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mem_errs, time_errs, planned_s = [], [], []
    for i, r in enumerate(runs):
        p, p0 = _plan(r, fitted), _plan(r, default)
        meg = megatron_estimate(p.shape, p.layout).total_bytes
        em, et = _err(p.peak_allocated_bytes, r.measured_bytes), _err(p.time.step_seconds, r.measured_seconds)
        mem_errs.append(em)
        time_errs.append(et)
        planned_s.append(p.time.step_seconds)
        lines.append(
            f"| {r.name} | {r.gpus} | {p.runtime['modelled_as']} | {r.measured_bytes / GiB:.2f} | "
            f"{p.peak_allocated_bytes / GiB:.2f} | {em:+.1%} | {loo_mem[i]:+.1%} | "
            f"{_err(p0.peak_allocated_bytes, r.measured_bytes):+.1%} | {meg / GiB:.2f} | {_err(meg, r.measured_bytes):+.1%} | "
            f"{_host_cell(r, fitted)} | {r.measured_seconds:.4f} | {p.time.step_seconds:.4f} | {et:+.1%} | {loo_time[i]:+.1%} | "
            f"{_err(p0.time.step_seconds, r.measured_seconds):+.1%} |"
        )
    within_m = sum(abs(e) <= 0.05 for e in mem_errs)
    within_t = sum(abs(e) <= 0.15 for e in time_errs)
    latest = newest(runs)
    measured_host = sum(1 for r in runs if r.host_launch_us)
    lines += [
        "",
        f"Memory within 5%: {within_m}/{len(runs)} (max |error| {max(abs(e) for e in mem_errs):.1%}, "
        f"leave-one-out {max(abs(e) for e in loo_mem):.1%}). Step time within 15%: {within_t}/{len(runs)} "
        f"(max |error| {max(abs(e) for e in time_errs):.1%}, leave-one-out {max(abs(e) for e in loo_time):.1%}).",
        "",
        f"Newest measurement of each of the {len(latest)} configurations: memory within 5% "
        f"{sum(abs(mem_errs[i]) <= 0.05 for i in latest)}/{len(latest)}, step time within 15% "
        f"{sum(abs(time_errs[i]) <= 0.15 for i in latest)}/{len(latest)} (max |error| "
        f"{max(abs(time_errs[i]) for i in latest):.1%}, leave-one-out {max(abs(loo_time[i]) for i in latest):.1%}).",
        "",
        *_configuration_lines(by_configuration(runs, planned_s),
                              by_configuration(runs, leave_configuration_out(runs, default, prior_weight))),
        "",
        f"Host launch speed: {measured_host} of {len(runs)} records measured it (`host_launch_us`); the others are "
        f"planned on the typical host, {fitted.host_launch_seconds * 1e6:.2f} us per launch (marked `-`).",
        "",
        "| constant | before | fitted |",
        "|---|---:|---:|",
    ]
    for key, value in fitted.to_dict().items():
        before = default.to_dict()[key]
        if before != value:
            lines.append(f"| `{key}` | {before:.4g} | {value:.4g} |")
    if skipped:
        lines += ["", "Skipped records:", ""] + [f"- {s}" for s in skipped]
    lines += ["", END]
    return "\n".join(lines)


def _configuration_lines(configs: list[tuple[str, int, float, float, float, float]],
                         held_out: list[tuple[str, int, float, float, float, float]]) -> list[str]:
    """The table's per-configuration summary (:func:`by_configuration`): how many medians are
    within 15% (in-sample, and fitted without the configuration: :func:`leave_configuration_out`),
    the misses, and the measurements' own spread."""
    def count(cs):
        within = sum(abs(c[4]) <= 0.15 for c in cs)
        misses = ", ".join(f"`{n}` {e:+.1%} ({k} measurements)" for n, k, _, _, e, _ in cs if abs(e) > 0.15)
        return f"{within}/{len(cs)}" + (f" (misses: {misses})" if misses else "")
    repeated = [c for c in configs if c[1] > 1]
    spreads = sorted(c[5] for c in repeated)
    line = (f"Median of each configuration's measurements against the median of its plans: step time within "
            f"15% {count(configs)}; fitted without the configuration's measurements {count(held_out)} "
            f"(max |error| {max(abs(c[4]) for c in held_out):.1%}).")
    if repeated:
        line += (f" The {len(repeated)} configurations measured more than once differ from themselves by "
                 f"{spreads[len(spreads) // 2]:.0%} (median of (max - min) / median), up to {spreads[-1]:.0%}.")
    return [line]


def _host_cell(run: Run, calib: Calibration) -> str:
    """The table's host launch cell: the run's measured value, or ``- (typical)``."""
    return f"{run.host_launch_us:.2f}" if run.host_launch_us else "-"


def _planned_matrix_table() -> list[str]:
    """Planned vs Megatron-LM formula for every runnable matrix entry (no measurements)."""
    out = ["| run | GPUs | layers | planned peak allocated GiB | Megatron-LM formula GiB | ratio | planned step s |",
           "|---|---:|---|---:|---:|---:|---:|"]
    for name, e in _matrix().items():
        if not e.get("runtime_supported", True) or e.get("errors"):
            continue
        p = make_plan(resolve(load(ROOT / e["base"], e["overrides"]).spec))
        meg = megatron_estimate(p.shape, p.layout).total_bytes
        out.append(f"| {name} | {e['gpus']} | {p.runtime['modelled_as']} | {p.peak_allocated_bytes / GiB:.2f} | "
                   f"{meg / GiB:.2f} | {meg / p.peak_allocated_bytes:.2f} | {p.time.step_seconds:.4f} |")
    return out


def write_docs(section: str, docs: Path, begin: str = BEGIN, end: str = END,
               heading: str = "Calibration results") -> None:
    """Replace the section of ``docs`` between ``begin`` and ``end`` (append it under ``heading``
    when the markers are missing)."""
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Planner\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + section + "\n"
    docs.write_text(text, encoding="utf-8")


# --- the Transformer Engine path --------------------------------------------------------
TE = "transformer_engine"
TE_BEGIN, TE_END = "<!-- te-calibration:begin -->", "<!-- te-calibration:end -->"


def planned_reserved(plan) -> float:
    """A plan's peak reserved bytes: peak allocated plus its ``allocator_reserve`` term (what
    ``torch.cuda.max_memory_reserved()`` adds; the CUDA context and NCCL are outside both)."""
    return plan.peak_allocated_bytes + plan.memory.peak.breakdown["allocator_reserve"]


def fit_reserve(runs: list[Run], calib: Calibration) -> float:
    """``allocator_reserve_fraction`` from the runs that recorded peak reserved memory: least squares
    on relative errors of ``planned allocated * (1 + f)`` against measured reserved (clamped at >= 0;
    ``calib``'s value when no run recorded it)."""
    pairs = [(_plan(r, calib).peak_allocated_bytes, r.measured_reserved_bytes) for r in runs if r.measured_reserved_bytes]
    if not pairs:
        return calib.allocator_reserve_fraction
    x = np.array([a / m for a, m in pairs])
    return float(max(np.dot(x, np.ones_like(x)) / np.dot(x, x) - 1.0, 0.0))


def fit_te(runs: list[Run], start: Calibration, prior_weight: float) -> Calibration:
    """The TE path's constants from its non-held-out runs: :func:`fit` (memory, then time, pulled
    towards ``start``, the constants the TE path is planned with now), then :func:`fit_reserve`."""
    fitted = fit(runs, start, prior_weight) if len(runs) >= 2 else start
    return fitted.with_values(allocator_reserve_fraction=fit_reserve(runs, fitted))


def te_table(runs: list[Run], before: Calibration, fitted: Calibration, sources: list[str]) -> str:
    """The markdown of the TE calibration section: per record planned (fitted) against measured peak
    allocated, peak reserved and step time, the error with the constants before the fit, and the
    median of each configuration's records against its plan, fitted and held-out configurations
    counted apart (held-out records are not in the fit)."""
    lines = [TE_BEGIN, "", "Generated by `bench/plan/calibrate.py` from the Transformer Engine records of "
             + ", ".join(f"`{s}`" for s in sources) + " (`\"impl\": \"transformer_engine\"`); held-out records are "
             "not in the fit.", "",
             "| run | held out | measured allocated GiB | planned GiB | error | before | measured reserved GiB "
             "| planned GiB | error | measured step s | planned s | error | before |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    groups: dict[str, list[tuple[float, float, float, bool]]] = {}
    for r in runs:
        p, p0 = _plan(r, fitted), _plan(r, before)
        em, et = _err(p.peak_allocated_bytes, r.measured_bytes), _err(p.time.step_seconds, r.measured_seconds)
        res = r.measured_reserved_bytes
        er = _err(planned_reserved(p), res) if res else None
        groups.setdefault(r.name, []).append((r.measured_bytes, r.measured_seconds, p.peak_allocated_bytes, r.held_out))
        lines.append(
            f"| {r.name} | {'held out' if r.held_out else ''} | {r.measured_bytes / GiB:.2f} | "
            f"{p.peak_allocated_bytes / GiB:.2f} | {em:+.1%} | {_err(p0.peak_allocated_bytes, r.measured_bytes):+.1%} | "
            + (f"{res / GiB:.2f} | {planned_reserved(p) / GiB:.2f} | {er:+.1%} | " if res else "- | - | - | ")
            + f"{r.measured_seconds:.4f} | {p.time.step_seconds:.4f} | {et:+.1%} | "
            f"{_err(p0.time.step_seconds, r.measured_seconds):+.1%} |")
    summary = []
    for held in (False, True):
        names = [n for n, g in groups.items() if g[0][3] == held]
        if not names:
            continue
        mem_ok = time_ok = 0
        for n in names:
            r0 = next(r for r in runs if r.name == n)
            p = _plan(r0, fitted)
            mem_ok += abs(_err(p.peak_allocated_bytes, float(np.median([g[0] for g in groups[n]])))) <= 0.05
            time_ok += abs(_err(p.time.step_seconds, float(np.median([g[1] for g in groups[n]])))) <= 0.15
        summary.append(f"{'held-out' if held else 'fitted'} configurations (median of their records): peak allocated "
                       f"within 5% {mem_ok}/{len(names)}, step time within 15% {time_ok}/{len(names)}")
    text = "; ".join(summary)
    lines += ["", text[:1].upper() + text[1:] + ".", "", "| constant | before | fitted |", "|---|---:|---:|"]
    from dlmspec.plan.calibration import TE_FITTED_NAMES

    for key in TE_FITTED_NAMES:
        if getattr(before, key) != getattr(fitted, key):
            lines.append(f"| `{key}` | {getattr(before, key):.4g} | {getattr(fitted, key):.4g} |")
    lines += ["", TE_END]
    return "\n".join(lines)


def plan_only() -> int:
    """Print the planned peak and step time of each matrix entry (sizing the GPU runs)."""
    rows = 0
    for name, e in _matrix().items():
        try:
            r = resolve(load(ROOT / e["base"], e["overrides"]).spec)
            p = make_plan(r)
        except SpecError as exc:
            print(f"{name:32s} spec error: {str(exc).splitlines()[0]}")
            continue
        print(f"{name:32s} {e['gpus']} GPU  {p.runtime['modelled_as']:18s} peak allocated {p.peak_allocated_bytes / GiB:7.2f} GiB  "
              f"step {p.time.step_seconds * 1000:8.1f} ms  x {r.train_iters} steps = {p.time.to_train_seconds:6.1f} s")
        rows += 1
    return 0 if rows else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(RESULTS), help="directory of measurement JSON files")
    parser.add_argument("--docs", default=str(DOCS), help="markdown file to write the tables into")
    parser.add_argument("--prior", type=float, default=0.1, help="weight of the pull towards the current constants")
    parser.add_argument("--plan-only", action="store_true", help="print planned values of bench/plan/matrix.json")
    parser.add_argument("--te-only", action="store_true",
                        help="fit and report the Transformer Engine path only (the local table stays as it is)")
    args = parser.parse_args(argv)
    if args.plan_only:
        return plan_only()
    every, skipped = read_runs(Path(args.results))
    te_runs = [r for r in every if path_of(r) == TE]
    # the local path's fit, on its own records (held-out ones, if a file marks any, are not fitted)
    runs = [] if args.te_only else [r for r in every if path_of(r) != TE and not r.held_out]
    if args.te_only and not te_runs:
        print(f"--te-only: no Transformer Engine record (\"impl\": \"transformer_engine\") in {args.results}",
              file=sys.stderr)
        return 1
    if runs or not te_runs:
        sources = sorted({r.source for r in runs})
        fitted = fit(runs, DEFAULT_CALIBRATION, args.prior) if len(runs) >= 2 else DEFAULT_CALIBRATION
        section = table(runs, DEFAULT_CALIBRATION, fitted, args.prior, skipped, sources)
        write_docs(section, Path(args.docs))
        print(section)
    if not runs and not te_runs:
        print(f"no measured runs in {args.results}", file=sys.stderr)
        return 1
    if te_runs:
        from dlmspec.plan.provenance import calibration_for

        before = calibration_for(TE)[0]  # the committed constants the TE path is planned with now
        fit_runs = [r for r in te_runs if not r.held_out]
        te_sources = sorted({r.source for r in te_runs})
        te_fitted = fit_te(fit_runs, before, args.prior)
        section = te_table(te_runs, before, te_fitted, te_sources)
        write_docs(section, Path(args.docs), TE_BEGIN, TE_END, "Transformer Engine calibration results")
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
