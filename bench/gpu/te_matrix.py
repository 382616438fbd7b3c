"""The Transformer Engine path of the compiled demo, configuration by configuration (issue 21).

Each configuration is ``specs/demo-dlm.toml`` with ``--set`` overrides (:data:`CONFIGS`), 40 steps
logged every step, in run and checkpoint directories of its own (``runs/te/NAME``): bf16 on the
local layers (the reference, and again for the noise floor), bf16 on Transformer Engine (its
fused layer-norm + linear modules), fp8 with delayed, current per-tensor (``tensorwise``) and
blockwise scaling, selective and full recomputation, variable-length sequences
(``objective.variable_length_prob = 0.5``, TE's padding mask) against the same on the local
layers, and a save at step 20 killed and resumed to step 40 against the uninterrupted TE run.

    python3 bench/gpu/te_matrix.py --dry [--dest DIR] [--only A,B]   # CPU: compile, check the flags
    python3 bench/gpu/te_matrix.py OUT [--dest DIR] [--budget-s S]    # GPU: the same, then run them

``--dry`` (no GPU needed) makes the demo's data from the offline kit when missing
(bench/gpu/prepare.py ``demo_inputs``), compiles every configuration into ``--dest`` (default
``.device/te``), checks in each train.py the keywords its overrides must produce (:func:`check_flags`)
and runs its ``build_configs()`` and ``build_run()`` (megatron-core's config checks). Without
``--dry`` the configurations then run (several at once on the one GPU; each launch is killed at
the budget) and ``OUT/NAME.json`` records per configuration: the command, the flags, the exit
code, the per-step losses, peak allocated / reserved memory, and the comparison of its first 40 losses with its reference
(:func:`agreement`); ``OUT/te_matrix.json`` the summary, the versions and the noise criterion;
``OUT/te-bf16.json`` also the TE layer spec's modules. When ``.whl/mc19/`` holds a megatron-core
wheel, its config fields go to ``OUT/mcore_fields.json`` (bench/gpu/mcore_fields.py).
Exit code 0 when every configuration compiled (and ran), 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "throughput"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

SPEC = "specs/demo-dlm.toml"
#: The configurations' run directories (``logging.run_dir = "runs/te/NAME"``).
RUNS = ROOT / "runs" / "te"
STEPS = 40
#: What every configuration sets: 40 steps logged one by one, no evaluation, no checkpoint.
COMMON = {"train.train_iters": STEPS, "train.lr_warmup_iters": 10, "train.eval_interval": 1000,
          "logging.log_interval": 1, "checkpoint.save_at_end": False, "checkpoint.save_interval": 1000}
TE = {"model.transformer_impl": "transformer_engine", "objective.variable_length_prob": 0.0}
FP8 = {**TE, "precision.fp8": "hybrid"}

#: name -> (overrides, reference run, what train.py must say: keyword -> value).
CONFIGS: Dict[str, tuple] = {
    "local-bf16": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.0}, None,
                   {"use_transformer_engine": False, "variable_length_prob": 0.0}),
    "local-bf16-again": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.0}, None,
                         {"use_transformer_engine": False}),
    "te-bf16": (TE, "local-bf16", {"use_transformer_engine": True, "fp8": None, "variable_length_prob": 0.0}),
    "te-fp8-delayed": ({**FP8, "precision.fp8_recipe": "delayed"}, "local-bf16",
                       {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "delayed"}),
    "te-fp8-tensorwise": ({**FP8, "precision.fp8_recipe": "tensorwise"}, "local-bf16",
                          {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "tensorwise"}),
    "te-fp8-blockwise": ({**FP8, "precision.fp8_recipe": "blockwise"}, "local-bf16",
                         {"use_transformer_engine": True, "fp8": "hybrid", "fp8_recipe": "blockwise"}),
    "te-recompute-selective": ({**TE, "recompute.granularity": "selective", "recompute.modules": ["core_attn", "mlp"]},
                               "local-bf16", {"use_transformer_engine": True, "recompute_granularity": "selective",
                                              "recompute_modules": ["core_attn", "mlp"]}),
    "te-recompute-full": ({**TE, "recompute.granularity": "full", "recompute.method": "uniform",
                           "recompute.num_layers": 1}, "local-bf16",
                          {"use_transformer_engine": True, "recompute_granularity": "full",
                           "recompute_method": "uniform", "recompute_num_layers": 1}),
    "local-varlen": ({"model.transformer_impl": "local", "objective.variable_length_prob": 0.5}, None,
                     {"use_transformer_engine": False, "variable_length_prob": 0.5}),
    "te-varlen": ({**TE, "objective.variable_length_prob": 0.5}, "local-varlen",
                  {"use_transformer_engine": True, "variable_length_prob": 0.5}),
    "te-resume": ({**TE, "checkpoint.save_interval": 20}, "te-bf16",
                  {"use_transformer_engine": True, "save_interval": 20}),
}
RESUME_AT = 20

#: bf16 keeps 8 significant bits: 5 units of its rounding (bench/throughput/loss_agreement.py).
BF16_RTOL = 5 * 2.0 ** -8
#: fp8 (e4m3) GEMM inputs keep 4 significant bits against bf16's 8: 4x the bf16 tolerance, set
#: before any fp8 run was measured.
FP8_RTOL = 4 * BF16_RTOL
CRITERION = (f"the first {STEPS} losses agree with the reference run's (same seed) when every relative difference "
             "|a - b| / max(|a|, |b|) is at most max(rtol, noise floor); noise floor = the largest relative "
             "difference between local-bf16 and local-bf16-again (the same command run twice); rtol = "
             f"{BF16_RTOL:.4g} (5 bf16 units) for bf16 runs and {FP8_RTOL:.4g} (4x that) for fp8 runs. te-resume "
             f"compares steps {RESUME_AT + 1}..{STEPS} (after the resume) with te-bf16.")


def overrides(name: str) -> List[str]:
    """The ``--set`` strings of a configuration (TOML values)."""
    run = f"runs/te/{name}"
    sets = {**COMMON, **CONFIGS[name][0], "logging.run_dir": run, "logging.tensorboard_dir": f"{run}/tensorboard",
            "checkpoint.save": f"{run}/checkpoints"}
    return [f"{k}={json.dumps(v)}" for k, v in sets.items()]


def compile_config(name: str, dest: Path) -> tuple[int, str]:
    """``dlmspec compile`` of one configuration into ``dest/name`` (in this process); (exit code, output)."""
    from dlmspec.cli import main as dlmspec

    argv = ["compile", SPEC, "-o", str(dest / name), "--force"] + [a for s in overrides(name) for a in ("--set", s)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = dlmspec(argv)
        except SystemExit as exc:  # typer's standalone mode
            code = int(exc.code or 0)
    return int(code or 0), buf.getvalue()


def train_py_keywords(text: str) -> Dict[str, Any]:
    """The literal keyword arguments of every call in a train.py (last one wins per name)."""
    out: Dict[str, Any] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg:
                    try:
                        out[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        pass
    return out


def check_flags(name: str, text: str) -> List[str]:
    """What the configuration's train.py says wrongly: ``["keyword: want X, got Y", ...]`` ([] = right).
    A keyword wanted as ``None`` must be absent (e.g. no ``fp8`` without fp8)."""
    got = train_py_keywords(text)
    wrong = []
    for key, want in CONFIGS[name][2].items():
        have = got.get(key)
        if have != want:
            wrong.append(f"{key}: want {want!r}, got {have!r}")
    return wrong


def build_objects(train_py: Path) -> Optional[str]:
    """Run the compiled file's ``build_configs()`` and ``build_run()`` (megatron-core's config checks,
    no CUDA); ``None`` when both build, else the error."""
    spec = importlib.util.spec_from_file_location(f"te_matrix_{train_py.parent.name.replace('-', '_')}", train_py)
    module = importlib.util.module_from_spec(spec)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec.loader.exec_module(module)
            module.build_configs()
            module.build_run()
    except Exception as exc:  # reported, not raised: the matrix goes on
        return f"{type(exc).__name__}: {exc}"
    return None


def agreement(a: Dict[int, float], b: Dict[int, float], *, rtol: float, floor: float = 0.0,
              first: int = 1, last: int = STEPS) -> Dict[str, Any]:
    """Compare two ``{iteration: loss}`` curves over iterations ``first..last``.

    Returns:
        ``compared`` (iterations in both), ``missing`` (in ``first..last`` but not in both),
        ``max_abs_diff``, ``max_rel_diff`` (``|a - b| / max(|a|, |b|)``), ``worst_iteration``,
        ``tolerance`` (``max(rtol, floor)``), ``finite`` and ``agree`` (complete, finite, within it).
    """
    steps = range(first, last + 1)
    both = [i for i in steps if i in a and i in b]
    finite = all(math.isfinite(a[i]) and math.isfinite(b[i]) for i in both)
    abs_d = {i: abs(a[i] - b[i]) for i in both}
    rel_d = {i: abs_d[i] / max(abs(a[i]), abs(b[i]), 1e-30) for i in both}
    worst = max(rel_d, key=rel_d.get) if rel_d else None
    tol = max(rtol, floor)
    return {"compared": len(both), "missing": [i for i in steps if i not in both],
            "max_abs_diff": max(abs_d.values()) if abs_d else None,
            "max_rel_diff": rel_d[worst] if worst is not None else None, "worst_iteration": worst,
            "tolerance": tol, "finite": finite,
            "agree": bool(both) and len(both) == len(steps) and finite and rel_d[worst] <= tol}


def metric(name: str, key: str = "loss") -> Dict[int, float]:
    """The run's ``{iteration: key}`` of its train records (runs/te/NAME/metrics.jsonl; {} when
    there is none; a resumed run's last record per iteration)."""
    from loss_agreement import MetricsError, read_losses

    try:
        return read_losses(RUNS / name / "metrics.jsonl", key=key)
    except MetricsError:
        return {}


def losses(name: str) -> Dict[int, float]:
    """The run's ``{iteration: loss}`` (:func:`metric`)."""
    return metric(name)


def descendants(pid: int) -> List[int]:
    """The ids of every process below ``pid`` (children first), read from ``/proc``."""
    children: Dict[int, List[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children.get(p, [])
    return out


class Lanes:
    """Launches of compiled configurations, at most ``width`` at once, each killed (with its process
    group) at the deadline."""

    def __init__(self, dest: Path, out: Path, deadline: float, width: int) -> None:
        self.dest, self.out, self.deadline, self.width = dest, out, deadline, width
        self.running: Dict[str, tuple] = {}
        self.done: Dict[str, Dict[str, Any]] = {}

    def start(self, name: str, tag: str = "") -> subprocess.Popen:
        log = open(self.out / f"{name}{tag}.log", "w")
        path = self.dest / name / "launch.sh"
        cmd = ["bash", str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.running[name + tag] = (proc, time.time(), log, cmd)
        return proc

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a launch's process group and every process below it: torchrun starts its
        workers in sessions of their own (torch.distributed.elastic's subprocess handler), which a
        signal to the group alone would leave running."""
        proc = self.running[key][0]
        for pid in descendants(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def poll(self) -> None:
        for key, (proc, t0, log, cmd) in list(self.running.items()):
            if proc.poll() is None and time.time() > self.deadline:
                self.kill(key)
                proc.wait()
            if proc.poll() is not None:
                log.close()
                self.done[key] = {"exit": proc.returncode, "wall_s": round(time.time() - t0, 1), "command": shlex.join(cmd),
                                  "killed_at_deadline": time.time() > self.deadline}
                del self.running[key]

    def wait_slot(self) -> None:
        while len(self.running) >= self.width:
            self.poll()
            time.sleep(0.5)


class Resume:
    """The resume check, stepped by the launch loop: launch ``te-resume``, SIGKILL it (its process
    group) once ``latest`` names step 20's checkpoint, then launch it again to the end."""

    def __init__(self, lanes: Lanes, name: str = "te-resume") -> None:
        self.lanes, self.name, self.phase = lanes, name, 0
        self.latest = RUNS / name / "checkpoints" / "latest"
        self.info: Dict[str, Any] = {"killed_after": None, "launch1_last_iteration": None}

    def step(self) -> bool:
        """Advance; True while the check is not finished."""
        key1, key2 = self.name + ".launch1", self.name + ".launch2"
        if self.phase == 0:
            self.lanes.start(self.name, ".launch1")
            self.phase = 1
        elif self.phase == 1:
            if key1 in self.lanes.running:
                if self.latest.is_file() and self.latest.read_text().strip() == f"iter_{RESUME_AT:07d}":
                    self.info["killed_after"] = self.latest.read_text().strip()
                    self.lanes.kill(key1)
            else:
                first = losses(self.name)
                self.info["launch1_last_iteration"] = max(first) if first else None
                if time.time() < self.lanes.deadline:
                    self.lanes.start(self.name, ".launch2")
                self.phase = 2
        elif self.phase == 2 and key2 not in self.lanes.running:
            self.phase = 3
        return self.phase < 3


def run_matrix(results: Dict[str, Dict[str, Any]], dest: Path, out: Path, *, deadline: float, width: int) -> float:
    """Launch every compiled configuration of ``results`` (``dest/NAME/launch.sh``, from the
    repository root), compare the losses, write ``out/NAME.json``; the rows of ``results`` get
    ``launches``, ``losses``, ``agreement`` (and ``resume``, ``layer_modules``). Returns the noise floor."""
    runnable = [n for n in results if results[n]["compile_exit"] == 0]
    lanes = Lanes(dest, out, deadline, width)
    for n in runnable:
        subprocess.run(["rm", "-rf", str(RUNS / n)], check=False)
    order = [n for n in runnable if n != "te-resume"]
    if order:  # the first builds megatron-core's index cache beside the data; the others once it trains
        lanes.start(order[0])
        metrics = RUNS / order[0] / "metrics.jsonl"
        while order[0] in lanes.running and not (metrics.is_file() and '"train"' in metrics.read_text()):
            lanes.poll()
            time.sleep(0.5)
    resume = Resume(lanes) if "te-resume" in runnable else None
    if resume:
        lanes.width += 1  # the resume's two launches hold a lane of their own
    pending = order[1:]
    while pending or lanes.running or (resume and resume.phase < 3):
        lanes.poll()
        if resume and resume.phase < 3:
            resume.step()
        if pending and time.time() >= deadline:  # not started: recorded with no launches
            for n in pending:
                results[n]["skipped_at_deadline"] = True
            pending = []
        if pending and len(lanes.running) < lanes.width:
            lanes.start(pending.pop(0))
        time.sleep(0.3)
    resume_info = resume.info if resume else None

    curves = {n: losses(n) for n in runnable}
    floor = 0.0
    if "local-bf16" in curves and "local-bf16-again" in curves:
        noise = agreement(curves["local-bf16"], curves["local-bf16-again"], rtol=BF16_RTOL)
        floor = noise["max_rel_diff"] or 0.0
        results["local-bf16-again"]["noise_floor"] = noise
    for n in runnable:
        row = results[n]
        row["launches"] = {key: v for key, v in lanes.done.items() if key.split(".launch")[0] == n}
        row["losses"] = {str(i): v for i, v in sorted(curves[n].items())}
        row["memory_gib"] = {k: max(metric(n, k).values(), default=None) for k in ("peak_mem_gib", "peak_reserved_gib")}
        times = sorted(v for i, v in metric(n, "step_time_s").items() if i > 10)
        row["median_step_time_s"] = times[len(times) // 2] if times else None  # lanes share the GPU: not a speed
        ref = CONFIGS[n][1]
        if ref and ref in curves:
            fp8 = CONFIGS[n][0].get("precision.fp8", "none") != "none"
            first = RESUME_AT + 1 if n == "te-resume" else 1
            row["agreement"] = {"against": ref, "rtol": FP8_RTOL if fp8 else BF16_RTOL, "noise_floor": floor,
                                **agreement(curves[n], curves[ref], rtol=FP8_RTOL if fp8 else BF16_RTOL,
                                            floor=floor, first=first)}
        if n == "te-resume":
            row["resume"] = resume_info
        if n == "te-bf16":
            row["layer_modules"] = layer_modules(dest / n / "train.py")
        subprocess.run(["rm", "-rf", str(RUNS / n / "checkpoints")], check=False)
        (out / f"{n}.json").write_text(json.dumps(row, indent=1) + "\n")
    return floor


def layer_modules(train_py: Path) -> Dict[str, Any]:
    """The TE layer spec's modules (TE's fused layer-norm + linear, the key-padding attention)."""
    spec = importlib.util.spec_from_file_location("te_matrix_layers", train_py)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        layer = module.build_layer()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    attn = layer.submodules.self_attention.submodules

    def name(m: Any) -> str:
        m = getattr(m, "module", m)
        return getattr(m, "__name__", type(m).__name__)

    return {"linear_qkv": name(attn.linear_qkv), "input_layernorm": name(layer.submodules.input_layernorm),
            "core_attention": name(attn.core_attention), "linear_fc1": name(layer.submodules.mlp.submodules.linear_fc1),
            "pre_mlp_layernorm": name(layer.submodules.pre_mlp_layernorm),
            "fused_layernorm_linear": name(attn.linear_qkv) == "TELayerNormColumnParallelLinear"
            and name(layer.submodules.input_layernorm) == "IdentityOp"}


def versions() -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for mod in ("torch", "megatron.core", "transformer_engine", "dlmspec"):
        try:
            m = __import__(mod, fromlist=["x"])
            out[mod] = getattr(m, "__version__", None) or str(getattr(m, "__file__", ""))
        except Exception as exc:
            out[mod] = f"not importable: {type(exc).__name__}"
    with contextlib.suppress(Exception):
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="results folder ($OUT); not with --dry")
    p.add_argument("--dry", action="store_true", help="compile and check only (CPU)")
    p.add_argument("--dest", default=".device/te", help="compiled configurations (default .device/te)")
    p.add_argument("--only", default=None, help="comma-separated configuration names")
    p.add_argument("--budget-s", type=float, default=450, help="kill every launch after this many seconds")
    p.add_argument("--lanes", type=int, default=4, help="launches at once on the GPU")
    p.add_argument("--no-data", action="store_true", help="--dry without making the demo's data (.data)")
    args = p.parse_args(argv)
    if not args.dry and not args.out:
        p.error("give OUT (the results folder), or --dry")
    names = list(CONFIGS) if not args.only else [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--only: unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    t_start = time.time()
    os.chdir(ROOT)
    dest = (ROOT / args.dest).resolve()
    out = Path(args.out).resolve() if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    if not args.no_data and not (ROOT / ".data" / "demo-train_text_document.bin").is_file():
        try:
            from prepare import demo_inputs

            for line in demo_inputs():
                print(line)
        except SystemExit as exc:
            print(f"te_matrix: the demo's data is missing and cannot be made here ({exc}); carry .data", file=sys.stderr)
            return 1
    results: Dict[str, Dict[str, Any]] = {}
    for name in names:
        code, text = compile_config(name, dest)
        row: Dict[str, Any] = {"config": name, "spec": SPEC, "overrides": overrides(name),
                               "reference": CONFIGS[name][1], "compile_exit": code}
        if code != 0:
            row["compile_output"] = text[-4000:]
        else:
            train_py = dest / name / "train.py"
            row["flags_wrong"] = check_flags(name, train_py.read_text())
            row["build_error"] = build_objects(train_py)
        results[name] = row
        state = "compiled" if code == 0 else f"refused (exit {code})"
        print(f"{name}: {state}" + (f"; flags wrong: {row.get('flags_wrong')}" if row.get("flags_wrong") else "")
              + (f"; build: {row['build_error']}" if row.get("build_error") else ""), flush=True)
    ok = all(r["compile_exit"] == 0 and not r.get("flags_wrong") and not r.get("build_error") for r in results.values())
    if args.dry:
        print(f"te_matrix --dry: {len(results)} configuration(s) {'all right' if ok else 'NOT all right'} "
              f"({time.time() - t_start:.1f}s)")
        return 0 if ok else 1

    run_matrix(results, dest, out, deadline=t_start + args.budget_s, width=args.lanes)
    wheel = sorted((ROOT / ".whl" / "mc19").glob("megatron_core-*.whl"))
    if wheel:
        subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "mcore_fields.py"), str(wheel[-1]),
                        str(out / "mcore_fields.json")], check=False)
    summary = {
        "benchmark": "issue 21: the compiled demo (specs/demo-dlm.toml) on the Transformer Engine path, 40 steps per "
                     "configuration, against the local-path bf16 loss of the same seed",
        "command": "bash bench/gpu/te_matrix.sh $OUT  (python3 bench/gpu/te_matrix.py $OUT --budget-s "
                   f"{args.budget_s:g} --lanes {args.lanes})",
        "date": time.strftime("%Y-%m-%d"), "versions": versions(), "criterion": CRITERION,
        "noise_floor": results.get("local-bf16-again", {}).get("noise_floor", {}).get("max_rel_diff"),
        "wall_s": round(time.time() - t_start, 1),
        "configs": {n: {"compile_exit": r["compile_exit"], "flags_wrong": r.get("flags_wrong"),
                        "exits": {k: v["exit"] for k, v in r.get("launches", {}).items()},
                        "steps_logged": len(r.get("losses", {})),
                        "agreement": {k: r["agreement"][k] for k in ("against", "agree", "max_abs_diff", "max_rel_diff",
                                                                      "worst_iteration", "tolerance")}
                        if "agreement" in r else None}
                    for n, r in results.items()},
    }
    (out / "te_matrix.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["configs"], indent=1))
    ran = all(r.get("launches") and all(v["exit"] == 0 for k, v in r["launches"].items() if not k.endswith(".launch1"))
              for r in results.values() if r["compile_exit"] == 0)
    return 0 if ok and ran else 1


if __name__ == "__main__":
    raise SystemExit(main())
