"""The planner against public measurements: predicted against published tokens/s per GPU.

The data set is ``bench/calibration/public/``: per source a points file (schema
``dlmspec-public-points/1``: the source's URL, repository, commit and paths; per point its
configuration, measured values, the source's release, repeats in other releases, what the source
leaves unstated and how the point is used) and ``models.json`` (per model family its dlmspec
``[model]`` keys and where the architecture comes from). ``docs/planner-methods.md``, *Public
points*, describes them.

Per point :func:`point_spec` builds the spec its configuration stands for (a pre-training
``objective.kind = "ar"`` run on the Transformer Engine path, megatron's mock data, the published
parallel layout, precision and batch), :func:`predict` plans it with :func:`dlmspec.plan.make_plan`
and compares the plan's tokens/s per GPU with the measured value. :func:`split` is the committed
rule that divides the points into calibration and held-out sets before anything is fitted
(whole model families held out: the largest family of each model series). Points the planner
cannot express are kept in the data with ``use = "excluded"`` and their reason, and listed by the
benchmark as refused.

    .venv/bin/python bench/plan/public_points.py                    # the table, held-out errors
    .venv/bin/python bench/plan/public_points.py --out bench/results/plan/public_points.json

CPU only; a plan takes milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "calibration" / "public"
POINTS_SCHEMA = "dlmspec-public-points/1"
MODELS_FILE = "models.json"
#: ``precision`` of a point -> ``[precision]`` keys (Transformer Engine recipes: FP8-CS is
#: current scaling, ``Float8CurrentScaling`` = dlmspec's ``tensorwise``; NeMo 24.07's fp8 is delayed
#: scaling; MXFP8 is Blackwell's block-scaled recipe; FP8 blockwise is the 128x128 / 1x128 recipe).
PRECISIONS: dict[str, dict[str, str]] = {
    "bf16": {"dtype": "bf16"},
    "fp8-cs": {"dtype": "bf16", "fp8": "hybrid", "fp8_recipe": "tensorwise"},
    "fp8-delayed": {"dtype": "bf16", "fp8": "hybrid", "fp8_recipe": "delayed"},
    "mxfp8": {"dtype": "bf16", "fp8": "e4m3", "fp8_recipe": "mxfp8"},
    "fp8-blockwise": {"dtype": "bf16", "fp8": "e4m3", "fp8_recipe": "blockwise"},
}
#: The target on the held-out points: median absolute error at most 15%, none over 25%.
TARGET_MEDIAN, TARGET_MAX = 0.15, 0.25


class PublicDataError(ValueError):
    """Public-point data that breaks the format: ``file``, ``key``, ``value``, ``why``."""

    def __init__(self, file: Path | str, key: str, value: Any, why: str) -> None:
        self.file, self.key, self.value, self.why = str(file), key, value, why
        super().__init__(f"{file}: {key} = {value!r}: {why}")


def _read(path: Path) -> Any:
    from dlmspec.files import FileRefused, read_json

    try:
        return read_json(path)
    except FileRefused as exc:
        raise PublicDataError(path, "<file>", None, str(exc)) from None
    except (ValueError, OSError) as exc:
        raise PublicDataError(path, "<file>", None, f"not readable JSON ({exc})") from None


@dataclass(frozen=True)
class Point:
    """One published measurement with its configuration (fields of the points file)."""

    name: str
    family: str
    series: str
    system: str
    gpu: str | None
    gpus: int
    gpus_per_node: int
    precision: str
    release: str
    config: dict[str, Any]
    tokens_per_second_per_gpu: float
    model_tflops_per_gpu: float | None
    use: str
    why_excluded: str | None
    assumptions: tuple[str, ...]
    source_file: str
    source: dict[str, Any]
    planned_num_layers: int | None = None
    planned_not_to_fit_why: str | None = None
    moe: bool = False
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def parallel_text(self) -> str:
        c = self.config
        parts = [f"TP{c['tp']}", f"PP{c['pp']}"]
        if c.get("vpp"):
            parts.append(f"VP{c['vpp']}")
        if c.get("cp", 1) > 1:
            parts.append(f"CP{c['cp']}")
        if c.get("ep", 1) > 1:
            parts.append(f"EP{c['ep']}")
        if c.get("fsdp"):
            parts.append("FSDP")
        return " ".join(parts)


POINT_KEYS = ("name", "family", "system", "gpus", "gpus_per_node", "precision", "release", "config", "measured", "use")
CONFIG_KEYS = ("global_batch_size", "micro_batch_size", "seq_length", "tp", "pp", "cp", "ep")


def read_models(data: Path | None = None) -> dict[str, Any]:
    """``models.json``: ``families`` (name -> ``model``, ``series``, ``source``, ``moe``) and
    ``excluded`` (name -> why)."""
    data = DATA if data is None else data
    path = data / MODELS_FILE
    doc = _read(path)
    if not isinstance(doc, dict) or doc.get("schema") != POINTS_SCHEMA or not isinstance(doc.get("families"), dict):
        raise PublicDataError(path, "schema", doc.get("schema") if isinstance(doc, dict) else doc,
                              f"expected {POINTS_SCHEMA!r} with a 'families' object")
    for name, fam in doc["families"].items():
        if not isinstance(fam, dict) or not isinstance(fam.get("model"), dict) or not isinstance(fam.get("series"), str):
            raise PublicDataError(path, f"families.{name}", fam, "an object with 'model' ([model] keys) and 'series'")
    return doc


def point_files(data: Path | None = None) -> list[Path]:
    """The points files of ``data`` (every ``*.json`` but ``models.json`` and ``fit.json``), sorted."""
    data = DATA if data is None else data
    return sorted(p for p in data.glob("*.json") if p.name not in (MODELS_FILE, "fit.json"))


def read_points(data: Path | None = None) -> list[Point]:
    """Every point of every points file, checked (:class:`PublicDataError` on a broken one)."""
    data = DATA if data is None else data
    models = read_models(data)
    fams = models["families"]
    out: list[Point] = []
    seen: set[str] = set()
    for path in point_files(data):
        doc = _read(path)
        if not isinstance(doc, dict) or doc.get("schema") != POINTS_SCHEMA:
            raise PublicDataError(path, "schema", doc.get("schema") if isinstance(doc, dict) else doc,
                                  f"expected {POINTS_SCHEMA!r}")
        src = doc.get("source")
        if not isinstance(src, dict) or not all(isinstance(src.get(k), str) for k in ("url", "repository", "commit")):
            raise PublicDataError(path, "source", src, "an object with 'url', 'repository' and 'commit'")
        for i, p in enumerate(doc.get("points") or []):
            where = f"points[{i}]"
            if not isinstance(p, dict) or any(k not in p for k in POINT_KEYS):
                raise PublicDataError(path, where, p if not isinstance(p, dict) else sorted(p),
                                      f"a point has {', '.join(POINT_KEYS)}")
            if p["name"] in seen:
                raise PublicDataError(path, f"{where}.name", p["name"], "point names are unique across files")
            seen.add(p["name"])
            c = p["config"]
            for k in CONFIG_KEYS:
                v = c.get(k)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise PublicDataError(path, f"{where}.config.{k}", v, "a positive integer")
            tps = p["measured"].get("tokens_per_second_per_gpu")
            if isinstance(tps, bool) or not isinstance(tps, (int, float)) or not tps > 0:
                raise PublicDataError(path, f"{where}.measured.tokens_per_second_per_gpu", tps, "a positive number")
            kind = c.get("moe_token_dispatcher_type")
            if kind is not None and kind not in ("alltoall", "allgather", "flex"):
                raise PublicDataError(path, f"{where}.config.moe_token_dispatcher_type", kind,
                                      "'alltoall', 'allgather' or 'flex' (megatron-core moe_token_dispatcher_type)")
            if kind == "flex" and c.get("moe_flex_dispatcher_backend") not in ("deepep", "hybridep"):
                raise PublicDataError(path, f"{where}.config.moe_flex_dispatcher_backend",
                                      c.get("moe_flex_dispatcher_backend"),
                                      "a flex dispatcher names its backend: 'deepep' or 'hybridep'")
            if p["use"] not in ("used", "excluded"):
                raise PublicDataError(path, f"{where}.use", p["use"], "'used' or 'excluded'")
            if p["use"] == "excluded" and not p.get("why_excluded"):
                raise PublicDataError(path, f"{where}.why_excluded", None, "an excluded point says why")
            nofit = p.get("planned_not_to_fit_why")
            if nofit is not None and (not isinstance(nofit, str) or len(nofit.split()) < 5):
                raise PublicDataError(path, f"{where}.planned_not_to_fit_why", nofit,
                                      "a sentence saying why the plan of a run that fit says it does not")
            fam = fams.get(p["family"])
            if p["use"] == "used" and fam is None:
                raise PublicDataError(path, f"{where}.family", p["family"], f"a family of {MODELS_FILE}")
            if p["use"] == "used" and p["precision"] not in PRECISIONS:
                raise PublicDataError(path, f"{where}.precision", p["precision"], f"one of {', '.join(PRECISIONS)}")
            out.append(Point(
                name=p["name"], family=p["family"], series=(fam or {}).get("series", p["family"]), system=p["system"],
                gpu=p.get("gpu"), gpus=p["gpus"], gpus_per_node=p["gpus_per_node"], precision=p["precision"],
                release=p["release"], config=dict(c), tokens_per_second_per_gpu=float(tps),
                model_tflops_per_gpu=p["measured"].get("model_tflops_per_gpu"), use=p["use"],
                why_excluded=p.get("why_excluded"), assumptions=tuple(p.get("assumptions", ())),
                source_file=f"bench/calibration/public/{path.name}", source=src,
                planned_num_layers=p.get("planned_num_layers"),
                planned_not_to_fit_why=p.get("planned_not_to_fit_why"), moe=bool((fam or {}).get("moe")),
                model=dict((fam or {}).get("model", {}))))
    return out


def family_parameters(points: list[Point]) -> dict[str, int]:
    """Total parameters of each family of ``points`` (``dlmspec.params`` of its ``[model]`` keys)."""
    from dlmspec.plan.provenance import calibration_for

    out: dict[str, int] = {}
    for p in points:
        if p.family in out or p.use != "used":
            continue
        plan = _make_plan(p, calibration=calibration_for("transformer_engine")[0])
        out[p.family] = int(plan.shape.total_params)
    return out


def split(points: list[Point]) -> tuple[list[Point], list[Point]]:
    """(calibration, held out): the committed rule, decided before any fitting and blind to the
    measured values. Whole model families are held out: in each model series (``models.json``'s
    ``series``: llama2, llama3, gpt3, nemotron, qwen3) the family with the most parameters, so the
    held-out set tests the planner where it extrapolates (larger models, more GPUs) from the
    smaller members of the same series. Excluded points are in neither set."""
    used = [p for p in points if p.use == "used"]
    params = family_parameters(used)
    largest: dict[str, str] = {}
    for fam, n in sorted(params.items()):
        series = next(p.series for p in used if p.family == fam)
        if series not in largest or n > params[largest[series]]:
            largest[series] = fam
    held = set(largest.values())
    return [p for p in used if p.family not in held], [p for p in used if p.family in held]


def point_spec(p: Point) -> dict[str, Any]:
    """The spec (as a TOML-ready dict) of a point's configuration. Stated choices where the source
    is silent (each point's ``assumptions`` say which apply): the Transformer Engine path, the
    distributed optimizer with overlapped gradient reduce-scatter and parameter all-gather
    (megatron-core's defaults in both recipes' collections), sequence parallelism with TP > 1,
    megatron-core FSDP (``optim_grads_params``) where the table's FSDP column is set (the parameter
    all-gather's overlap off where the point's ``overlap_param_gather`` is false), full block
    recompute where the recipe sets ``recompute_num_layers``, autoregressive pre-training
    (``objective.kind = "ar"``: causal attention), no recompute otherwise."""
    c = p.config
    model = dict(p.model)
    model["transformer_impl"] = "transformer_engine"
    if p.planned_num_layers:
        model["num_layers"] = p.planned_num_layers
    vocab = model.get("vocab_size")
    if vocab is None:
        from dlmspec.spec.presets import PRESETS

        vocab = PRESETS[model["preset"]]["vocab_size"]
    parallel: dict[str, Any] = {
        "tensor_model_parallel_size": c["tp"], "pipeline_model_parallel_size": c["pp"],
        "context_parallel_size": c.get("cp", 1), "sequence_parallel": c["tp"] > 1,
        "use_distributed_optimizer": True, "overlap_grad_reduce": True, "overlap_param_gather": True,
    }
    if c.get("vpp") and c["vpp"] > 1 and c["pp"] > 1:
        parallel["virtual_pipeline_model_parallel_size"] = c["vpp"]
    for key in ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"):
        if c.get(key):
            parallel[key] = True  # the recipe's uneven split (megatron-core TransformerConfig)
    if c.get("ep", 1) > 1:
        parallel["expert_model_parallel_size"] = c["ep"]
    if c.get("etp"):
        parallel["expert_tensor_parallel_size"] = c["etp"]
    if c.get("overlap_param_gather") is False:
        parallel["overlap_param_gather"] = False  # the recipe turned it off
    if "grad_reduce_in_fp32" in c:
        parallel["grad_reduce_in_fp32"] = bool(c["grad_reduce_in_fp32"])
    if c.get("fsdp"):
        parallel["fsdp"] = "megatron"
        parallel["data_parallel_sharding_strategy"] = "optim_grads_params"
    spec: dict[str, Any] = {
        "name": p.name.replace(".", "-"),
        "model": model,
        "objective": {"kind": "ar"},
        "parallel": parallel,
        "precision": dict(PRECISIONS[p.precision]),
        "train": {"micro_batch_size": c["micro_batch_size"], "global_batch_size": c["global_batch_size"],
                  "seq_length": c["seq_length"], "train_iters": 100},
        "data": {"mock": True, "tokenizer": {"type": "NullTokenizer", "vocab_size": vocab - 1}},
        # The configuration ran, so it fit: the memory rule's own advice for a measured run. Whether
        # the plan agrees is reported per point (Prediction.fits), not a refusal.
        "cluster": {"gpu": p.gpu, "gpus_per_node": p.gpus_per_node, "nodes": p.gpus // p.gpus_per_node,
                    "allow_memory_overflow": True},
    }
    if c.get("recompute_num_layers"):
        spec["recompute"] = {"granularity": "full", "method": "block", "num_layers": c["recompute_num_layers"]}
    return spec


def _make_plan(p: Point, calibration=None):
    """The plan of a point (:func:`point_spec`), on ``calibration`` (default: the committed
    constants of the Transformer Engine path)."""
    import dataclasses

    import tomli_w

    from dlmspec.plan import make_plan
    from dlmspec.plan.time import time_plan
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load_text

    loaded = load_text(tomli_w.dumps(point_spec(p)), name=f"{p.name}.toml")
    plan = make_plan(resolve(loaded.spec), calibration=calibration)
    changes: dict[str, Any] = {}
    if p.config.get("tp_comm_overlap") and p.config["tp"] > 1:
        # The recipe overlapped TP communication with userbuffers, which dlmspec does not compile:
        # the time model is asked for that layout (dlmspec.plan.shape.Layout.tp_comm_overlap).
        changes["tp_comm_overlap"] = True
    if p.config.get("moe_a2a_overlap") and p.config.get("ep", 1) > 1:
        changes["moe_a2a_overlap"] = True  # recipe moe_a2a_overlap (Layout.moe_a2a_overlap)
    if p.config.get("moe_token_dispatcher_type") == "flex" and p.config.get("ep", 1) > 1:
        # The recipe dispatched with DeepEP / HybridEP (megatron-core "flex"), which dlmspec does not
        # compile: the time model is asked for that layout (Layout.moe_flex_dispatcher).
        changes["moe_flex_dispatcher"] = p.config["moe_flex_dispatcher_backend"]
    if p.config.get("fp8_param_gather") and plan.layout.fp8:
        # The recipe kept fp8 primary weights (megatron-core fp8_param_gather), which dlmspec does
        # not compile: the memory model is asked for that layout (Layout.fp8_param_gather).
        changes["fp8_param_gather"] = True
    fitted = read_fit() if calibration is None else None
    if fitted:
        changes["host_launch_seconds"] = fitted["public_host_launch_seconds"]
    if changes:
        plan.layout = dataclasses.replace(plan.layout, **changes)
        plan.time = time_plan(plan.shape, plan.layout, plan.gpu, plan.calibration)
        if changes.get("fp8_param_gather"):
            from dlmspec.plan.memory import memory_plan

            plan.memory = memory_plan(plan.shape, plan.layout, plan.calibration)
    return plan


#: What :func:`fit` fits on the calibration split: the Transformer Engine path's communication
#: constants (its one-GPU calibration runs never communicated) -> (least, largest) searched.
FITTED_CONSTANTS = {
    "nvlink_efficiency": (0.2, 0.95),
    "network_efficiency": (0.2, 0.95),
    "tp_overlap_exposed_fraction": (0.0, 1.0),
}
#: The public systems' host launch time (``cluster.host_launch_us``, which no source states), fitted
#: with them as the benchmark's assumption about those hosts, searched in this range (seconds).
HOST_LAUNCH_RANGE = (2e-6, 2e-5)
#: ``Calibration.gpu_compute_scale`` of a GPU without a calibration run of its own, searched here.
GPU_SCALE_RANGE = (0.5, 1.3)
#: GPUs with a calibration run of their own (bench/calibration/<path>/<gpu>/): never scaled.
CALIBRATED_GPUS = ("h200",)
FIT_SCHEMA = "dlmspec-calibration-fit/1"


def read_fit(data: Path | None = None) -> dict[str, Any] | None:
    """``fit.json`` of the public points (None before the first fit)."""
    data = DATA if data is None else data
    path = data / "fit.json"
    if not path.is_file():
        return None
    doc = _read(path)
    if not isinstance(doc, dict) or doc.get("schema") != FIT_SCHEMA or not isinstance(doc.get("constants"), dict):
        raise PublicDataError(path, "schema", doc.get("schema") if isinstance(doc, dict) else doc,
                              f"expected {FIT_SCHEMA!r} with 'constants'")
    for k, v in doc["constants"].items():
        lo, hi = FITTED_CONSTANTS.get(k, (None, None))
        if lo is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
            raise PublicDataError(path, f"constants.{k}", v, f"one of {', '.join(FITTED_CONSTANTS)}, in its range")
    scales = doc.get("gpu_compute_scale")
    if not isinstance(scales, dict) or any(
            k in CALIBRATED_GPUS or isinstance(v, bool) or not isinstance(v, (int, float))
            or not GPU_SCALE_RANGE[0] <= v <= GPU_SCALE_RANGE[1] for k, v in scales.items()):
        raise PublicDataError(path, "gpu_compute_scale", scales,
                              f"GPU id -> a number in {GPU_SCALE_RANGE}, no GPU of {CALIBRATED_GPUS}")
    host = doc.get("public_host_launch_seconds")
    if isinstance(host, bool) or not isinstance(host, (int, float)) or not HOST_LAUNCH_RANGE[0] <= host <= HOST_LAUNCH_RANGE[1]:
        raise PublicDataError(path, "public_host_launch_seconds", host, f"seconds in {HOST_LAUNCH_RANGE}")
    return doc


def _retime(plan, calib, host: float | None):
    """``plan``'s time on ``calib`` and host launch time ``host`` (seconds; None: as planned)."""
    import dataclasses

    from dlmspec.plan.time import time_plan

    lay = plan.layout if host is None else dataclasses.replace(plan.layout, host_launch_seconds=host)
    return time_plan(plan.shape, lay, plan.gpu, calib)


def fit(points: list[Point] | None = None, *, rounds: int = 4) -> dict[str, Any]:
    """Fit :data:`FITTED_CONSTANTS` and the public hosts' launch time on the calibration split
    (:func:`split`; the held-out points are not read): coordinate search over a 41-point grid per
    constant, ``rounds`` sweeps, minimising the mean absolute log error of tokens/s per GPU.
    Deterministic. Returns ``fit.json``'s object."""
    import math

    from dlmspec.plan.calibration import DEFAULT_CALIBRATION, TE_FITTED

    points = read_points() if points is None else points
    cal, held = split(points)
    # Start from the TE path's one-GPU constants, not from an earlier public fit (a refit is then
    # the same search from the same start: deterministic).
    base = DEFAULT_CALIBRATION.with_values(**(TE_FITTED or {}))
    plans = []
    for p in cal:
        try:
            if validation_errors(p):
                continue  # refused by dlmspec validate: not fitted (predict() reports it)
            plans.append((p, _make_plan(p, calibration=base)))
        except Exception:  # noqa: BLE001 - a point that does not plan is not fitted (predict() reports it)
            continue
    values = {k: getattr(base, k) for k in FITTED_CONSTANTS}
    gpus = sorted({p.gpu for p, _ in plans if p.gpu not in CALIBRATED_GPUS})
    values.update({f"gpu:{g}": 1.0 for g in gpus})
    host = base.host_launch_seconds
    ranges = dict(FITTED_CONSTANTS, **{f"gpu:{g}": GPU_SCALE_RANGE for g in gpus})

    def calibration(vals: dict[str, float]):
        scale = {k[4:]: v for k, v in vals.items() if k.startswith("gpu:")}
        return base.with_values(gpu_compute_scale=scale, **{k: v for k, v in vals.items() if not k.startswith("gpu:")})

    def loss(vals: dict[str, float], host_s: float) -> float:
        calib = calibration(vals)
        errs = []
        for p, plan in plans:
            t = _retime(plan, calib, host_s)
            errs.append(abs(math.log(t.tokens_per_second / plan.layout.world / p.tokens_per_second_per_gpu)))
        return sum(errs) / len(errs)

    best = loss(values, host)
    for _ in range(rounds):
        for key, (lo, hi) in list(ranges.items()) + [("host", HOST_LAUNCH_RANGE)]:
            for i in range(41):
                v = lo + (hi - lo) * i / 40
                trial = dict(values)
                h = host
                if key == "host":
                    h = v
                else:
                    trial[key] = v
                score = loss(trial, h)
                if score < best - 1e-12:
                    best, values, host = score, trial, h
    return {
        "schema": FIT_SCHEMA, "layer_path": "transformer_engine", "gpu": "public",
        "what": ("The Transformer Engine path's communication constants fitted on the calibration split of the "
                 "public measurements (bench/plan/public_points.py fit: coordinate search minimising the mean "
                 "absolute log error of tokens/s per GPU); public_host_launch_seconds is the benchmark's fitted "
                 "assumption about the public systems' hosts (cluster.host_launch_us), not a planner constant."),
        "files": [f"bench/calibration/public/{f.name}" for f in point_files()],
        "calibration_points": [p.name for p, _ in plans],
        "held_out_points": [p.name for p in held],
        "mean_abs_log_error": round(best, 4),
        "constants": {k: round(v, 4) for k, v in values.items() if not k.startswith("gpu:")},
        "gpu_compute_scale": {k[4:]: round(v, 4) for k, v in values.items() if k.startswith("gpu:")},
        "public_host_launch_seconds": float(f"{host:.4g}"),
    }


@dataclass
class Prediction:
    """One point planned: ``error`` = predicted / measured - 1 (tokens/s per GPU); ``refused``:
    why the spec does not validate or plan (then no prediction)."""

    point: Point
    held_out: bool
    predicted_tokens_per_second_per_gpu: float | None = None
    step_seconds: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    peak_gib: float | None = None
    fits: bool | None = None
    refused: str | None = None

    @property
    def error(self) -> float | None:
        if self.predicted_tokens_per_second_per_gpu is None:
            return None
        return self.predicted_tokens_per_second_per_gpu / self.point.tokens_per_second_per_gpu - 1.0

    def to_dict(self) -> dict[str, Any]:
        p = self.point
        return {
            "name": p.name, "family": p.family, "system": p.system, "gpus": p.gpus, "precision": p.precision,
            "parallel": p.parallel_text, "held_out": self.held_out, "source": p.source_file, "release": p.release,
            "measured_tokens_per_second_per_gpu": p.tokens_per_second_per_gpu,
            "predicted_tokens_per_second_per_gpu": self.predicted_tokens_per_second_per_gpu,
            "error": self.error, "step_seconds": self.step_seconds, "peak_gib": self.peak_gib, "fits": self.fits,
            "breakdown_seconds": self.breakdown, "refused": self.refused, "assumptions": list(p.assumptions),
        }


def validation_errors(p: Point) -> list[str]:
    """What ``dlmspec validate`` refuses in a point's spec (its errors, one line each)."""
    import tomli_w

    from dlmspec.check.registry import issues_for
    from dlmspec.resolve import resolve
    from dlmspec.spec.load import load_text

    loaded = load_text(tomli_w.dumps(point_spec(p)), name=f"{p.name}.toml")
    return [f"{i.key}: {' '.join(i.message.split())}" for i in issues_for("validate", loaded, resolve(loaded.spec))
            if i.severity == "error"]


def predict(points: list[Point] | None = None) -> list[Prediction]:
    """Plan every used point (calibration and held out); a spec that does not validate or plan is
    recorded as refused with the planner's message."""
    from dlmspec.errors import SpecError
    from dlmspec.plan import PlanError

    points = read_points() if points is None else points
    read_fit()  # a broken fit.json is a data error (PublicDataError), not a refused point
    _, held = split(points)
    held_names = {p.name for p in held}
    out = []
    for p in points:
        if p.use != "used":
            continue
        pred = Prediction(point=p, held_out=p.name in held_names)
        try:
            errors = validation_errors(p)
            if errors:
                pred.refused = "dlmspec validate: " + "; ".join(errors)
                out.append(pred)
                continue
            plan = _make_plan(p)
        except (SpecError, PlanError, ValueError) as exc:
            pred.refused = " ".join(str(exc).split())[:400]
            out.append(pred)
            continue
        pred.step_seconds = plan.time.step_seconds
        pred.predicted_tokens_per_second_per_gpu = plan.time.tokens_per_second / plan.layout.world
        pred.breakdown = {k: round(v, 6) for k, v in plan.time.breakdown.items() if v}
        pred.peak_gib = plan.peak_bytes / 2**30
        pred.fits = plan.fits
        out.append(pred)
    return out


def summary(preds: list[Prediction]) -> dict[str, Any]:
    """Median and largest absolute error of the held-out and the calibration points (planned ones)."""
    def stats(items: list[Prediction]) -> dict[str, Any]:
        errs = [abs(x.error) for x in items if x.error is not None]
        if not errs:
            return {"points": 0}
        worst = max((x for x in items if x.error is not None), key=lambda x: abs(x.error))
        return {"points": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                "worst": worst.point.name, "signed_median_error": statistics.median(x.error for x in items if x.error is not None)}

    held = [x for x in preds if x.held_out]
    cal = [x for x in preds if not x.held_out]
    return {"held_out": stats(held), "calibration": stats(cal),
            "refused": [{"name": x.point.name, "why": x.refused} for x in preds if x.refused],
            "planned_not_to_fit": [{"name": x.point.name, "peak_gib": round(x.peak_gib, 1),
                                    "why": x.point.planned_not_to_fit_why} for x in preds if x.fits is False],
            "target": {"median_abs_error": TARGET_MEDIAN, "max_abs_error": TARGET_MAX}}


def table(preds: list[Prediction], excluded: list[Point]) -> str:
    """The printed table: one line per point, held-out marked, then the summary and the exclusions."""
    lines = [f"{'point':58s} {'set':4s} {'GPUs':>5s} {'prec':13s} {'layout':22s} {'measured':>9s} {'planned':>9s} {'error':>7s}"]
    for x in sorted(preds, key=lambda x: (not x.held_out, x.point.gpus, x.point.name)):
        p = x.point
        planned = f"{x.predicted_tokens_per_second_per_gpu:9,.0f}" if x.predicted_tokens_per_second_per_gpu else "  refused"
        err = f"{x.error:+7.1%}" if x.error is not None else ""
        lines.append(f"{p.name:58s} {'held' if x.held_out else 'cal':4s} {p.gpus:5d} {p.precision:13s} "
                     f"{p.parallel_text:22s} {p.tokens_per_second_per_gpu:9,.0f} {planned} {err}")
    s = summary(preds)
    for key in ("held_out", "calibration"):
        st = s[key]
        if st.get("points"):
            lines.append(f"{key}: {st['points']} points, median |error| {st['median_abs_error']:.1%}, "
                         f"max {st['max_abs_error']:.1%} ({st['worst']}), signed median {st['signed_median_error']:+.1%}")
    lines.append(f"target on held-out points: median <= {TARGET_MEDIAN:.0%}, none over {TARGET_MAX:.0%}")
    nofit = s["planned_not_to_fit"]
    if nofit:
        lines.append(f"planned NOT to fit though they ran: {len(nofit)} of {len(preds)} points ("
                     + ", ".join(f"{r['name']} {r['peak_gib']:.0f} GiB" for r in nofit) + ")")
    for r in s["refused"]:
        lines.append(f"refused: {r['name']}: {r['why']}")
    for p in excluded:
        lines.append(f"excluded: {p.name}: {p.why_excluded}")
    return "\n".join(lines)


def result(preds: list[Prediction], points: list[Point]) -> dict[str, Any]:
    """The result file's object (bench/results/plan/)."""
    import subprocess

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"what": "dlmspec plan against public measured tokens/s per GPU (bench/plan/public_points.py)",
            "command": "python bench/plan/public_points.py --out bench/results/plan/public_points.json",
            "commit": commit, "summary": summary(preds),
            "points": [x.to_dict() for x in preds],
            "excluded": [{"name": p.name, "why": p.why_excluded} for p in points if p.use == "excluded"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the result JSON here (e.g. bench/results/plan/public_points.json)")
    ap.add_argument("--fit", action="store_true", help="fit the constants on the calibration split and print them")
    ap.add_argument("--write", action="store_true", help="with --fit: write bench/calibration/public/fit.json "
                    "(then python -m dlmspec.generated regenerates dlmspec/plan/calibration.py)")
    args = ap.parse_args(argv)
    try:
        return _run(args)
    except PublicDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.fit:
        result_fit = fit()
        text = json.dumps(result_fit, indent=1) + "\n"
        if args.write:
            from dlmspec.files import write_atomic

            write_atomic(DATA / "fit.json", text.encode())
            print(f"wrote {DATA / 'fit.json'}")
        print(text)
        return 0
    points = read_points()
    preds = predict(points)
    print(table(preds, [p for p in points if p.use == "excluded"]))
    if args.out:
        from dlmspec.files import write_atomic

        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.out, (json.dumps(result(preds, points), indent=1) + "\n").encode())
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
