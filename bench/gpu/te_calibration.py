"""The planner's Transformer Engine calibration runs, one at a time on one GPU.

Compiles every entry of ``bench/plan/te_matrix.json`` (``bench/plan/te_matrix.py``) into
``.device/tecal/NAME`` (run directory ``.device/runs/tecal/NAME``), checks in each train.py the
keywords its overrides must produce (:func:`check_flags`) and, with ``--dry``, runs its ``build_configs()``
(megatron-core's config checks, no CUDA; on the GPU each launch.sh's ``train.py --check`` does it). Without ``--dry`` the runs then go one after the other (timing needs the GPU
alone), in the matrix's order, within ``--budget-s`` seconds in all: each launch is killed (its
process group and every process below it) at its own limit, start-up allowance + 3x its planned
steps, cut to what is left of the budget; a run is not started with less than ``--min-start-s`` left.
When every entry has run and time is left, the cheapest runs (by their measured wall time) are
repeated while one more fits.

Each run's record (``bench/plan/calibrate.py``'s format): ``name``, ``base``, ``overrides``, ``impl``
(``transformer_engine``), ``held_out``, ``repeat``, ``peak_allocated_bytes`` and ``peak_reserved_bytes``
(the largest ``peak_mem_gib`` / ``peak_reserved_gib`` of the run's metrics.jsonl train records:
``torch.cuda.max_memory_allocated()`` / ``max_memory_reserved()``, max over ranks,
backends/megatron/metrics.py), ``step_seconds`` (median ``step_time_s`` of the iterations after
the entry's ``warmup_steps``, one step per record), ``step_times``, ``tokens_per_s``, ``host_launch_us`` (mean of the
run's host_launch events), ``exit_code``, ``wall_s``, ``limit_s``, ``killed_at_limit``, ``command``.

    python3 bench/gpu/te_calibration.py --dry                 # CPU: compile, check the flags
    python3 bench/gpu/te_calibration.py OUT [--budget-s 420]  # GPU: the same, then run them

``OUT/calibration_te_h200.json`` gets the runs, date, device, versions and commands; ``OUT/NAME.log``
each launch's console (``NAME.rN.log`` for repeat N). Exit code 0 when every entry compiled (and,
without ``--dry``, at least one run was measured), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "bench" / "plan"))

from compiled_runs import call_train_py, compile_in_process, flags_wrong, kill_tree, versions  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402  (bench/common.py: read_metrics)

MATRIX = ROOT / "bench" / "plan" / "te_matrix.json"
DEST = ".device/tecal"
RUNS = ".device/runs/tecal"
RESULT = "calibration_te_h200.json"
#: Start-up allowance of a launch before its first step (imports, model build, TE's and cuDNN's
#: first kernels: an earlier GPU run's two runs of 10 steps took 76 s each, ~65 s of it before the first step,
#: bench/results/gpu_runs_h200_te_install_and_calibration.json).
STARTUP_S = 90.0
#: ``--profile``: the steps torch.profiler records (``[logging] profile_step_start .. profile_step_end - 1``),
#: after the warm-up and before the last step.
PROFILE_STEPS = (6, 8)


def profile_entry(entry: Dict[str, Any]) -> Dict[str, Any]:
    """The entry with ``[logging] profile`` on for :data:`PROFILE_STEPS` (``--profile``), named
    ``NAME-profile`` (a run directory of its own): its step time is not a calibration point."""
    start, end = PROFILE_STEPS
    return {**entry, "name": entry["name"] + "-profile", "held_out": False,
            "overrides": entry["overrides"] + ["logging.profile=true", f"logging.profile_step_start={start}",
                                               f"logging.profile_step_end={end}"]}


def run_overrides(name: str, runs: Optional[str] = None) -> List[str]:
    """The ``--set`` values beyond the entry's that only place the run (run, tensorboard and
    checkpoint directories of its own under ``runs``: no run resumes from another)."""
    run = f"{runs or RUNS}/{name}"
    return [f'logging.run_dir="{run}"', f'logging.tensorboard_dir="{run}/tensorboard"', f'checkpoint.save="{run}/ckpt"']


def compile_entry(entry: Dict[str, Any], dest: Path, runs: Optional[str] = None) -> tuple[int, str]:
    """``dlmspec compile`` of one entry into ``dest/NAME`` (in this process); (exit code, output)."""
    return compile_in_process(entry["base"], dest / entry["name"], entry["overrides"] + run_overrides(entry["name"], runs))


def wanted_flags(entry: Dict[str, Any]) -> Dict[str, Any]:
    """What train.py must say for an entry's overrides: keyword -> literal value (``None``: absent)."""
    sets = {}
    for item in entry["overrides"]:
        key, _, value = item.partition("=")
        sets[key] = json.loads(value) if value[:1] in '"[-0123456789tf' else value
    want: Dict[str, Any] = {"use_transformer_engine": True,
                            "micro_batch_size": sets["train.micro_batch_size"],
                            "global_batch_size": sets["train.global_batch_size"],
                            "seq_length": sets["train.seq_length"]}
    fp8 = sets.get("precision.fp8", "none")
    want["fp8"] = None if fp8 == "none" else fp8
    if fp8 != "none":
        want["fp8_recipe"] = sets.get("precision.fp8_recipe", "delayed")
    gran = sets.get("recompute.granularity")
    if gran:
        want["recompute_granularity"] = gran
    if gran == "selective":
        want["recompute_modules"] = sets["recompute.modules"]
    if gran == "full":
        want["recompute_method"] = sets["recompute.method"]
        want["recompute_num_layers"] = sets["recompute.num_layers"]
    if "model.num_experts" in sets:
        want["num_moe_experts"] = sets["model.num_experts"]
        want["moe_grouped_gemm"] = sets.get("model.moe_grouped_gemm", False)
        want["moe_router_topk"] = sets["model.moe_router_topk"]
    return want


def check_flags(entry: Dict[str, Any], text: str) -> List[str]:
    """What the entry's train.py says wrongly (``["keyword: want X, got Y", ...]``; [] = right)."""
    return flags_wrong(wanted_flags(entry), text)


def build_configs(train_py: Path) -> Optional[str]:
    """Run the compiled file's ``build_configs()`` (megatron-core's config checks, no CUDA); ``None``
    when it builds, else the error."""
    try:
        call_train_py(train_py, f"tecal_{train_py.parent.name.replace('-', '_')}", "build_configs")
    except Exception as exc:  # reported, not raised: the matrix goes on
        return f"{type(exc).__name__}: {exc}"
    return None


def planned(entry: Dict[str, Any]) -> Dict[str, float]:
    """The committed planner's step seconds and peak allocated / reserved bytes of an entry
    (``bench/plan/te_holdout.py``'s :func:`plan_numbers`)."""
    from te_holdout import plan_numbers

    return plan_numbers(entry)


def summarize(metrics: Path, warmup: int) -> Dict[str, Any]:
    """The measurement of one run from its metrics.jsonl ({} when it logged no train record; no
    ``step_seconds`` when it logged none after ``warmup``; :func:`common.read_metrics`: a line that
    is not a JSON object, as a killed run's cut last line, is skipped)."""
    records = common.read_metrics(metrics)
    train = [r for r in common.events(records, "train") if r.get("step_time_s")]
    if not train:
        return {}
    steady = [r for r in train if r["iteration"] > warmup]
    host = [r["host_launch_us"] for r in common.events(records, "host_launch") if r.get("host_launch_us")]
    out = {"peak_allocated_bytes": int(max(r["peak_mem_gib"] for r in train) * 2**30),
           "peak_reserved_bytes": int(max(r.get("peak_reserved_gib", 0.0) for r in train) * 2**30),
           "step_times": {str(r["iteration"]): round(r["step_time_s"], 5) for r in train},
           "steps_measured": len(steady), "losses": [round(r["loss"], 4) for r in train]}
    if steady:  # warm-up steps alone are no step time (the run died or was killed early)
        out["step_seconds"] = statistics.median(r["step_time_s"] for r in steady)
        out["tokens_per_s"] = statistics.median(r["tokens_per_s"] for r in steady)
    if host:
        out["host_launch_us"] = statistics.mean(host)
    return out


def fused_linear_backend(log: Path) -> Optional[str]:
    """The fused linear cross entropy's backend a run took (``"liger"`` or ``"torch"``), from the
    runtime's start-up line ``cross entropy fused_linear (X)`` in its log; None when absent."""
    try:
        match = re.search(r"cross entropy fused_linear \((\w+)\)", log.read_text(errors="replace"))
    except OSError:
        return None
    return match.group(1) if match else None


def launch(dirpath: Path, log: Path, limit: float) -> Dict[str, Any]:
    """Run ``dirpath/launch.sh`` from the repository root, killed (its process group and every
    process below it: torchrun starts its workers in sessions of their own) after ``limit`` s."""
    rel = dirpath.relative_to(ROOT) if dirpath.is_relative_to(ROOT) else dirpath
    cmd = ["bash", str(rel / "launch.sh")]
    t0 = time.time()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        killed = False
        while proc.poll() is None:
            if time.time() - t0 > limit:
                killed = True
                kill_tree(proc.pid)
                proc.wait()
                break
            time.sleep(0.5)
    return {"exit_code": proc.returncode, "wall_s": round(time.time() - t0, 1), "limit_s": round(limit, 1),
            "killed_at_limit": killed, "command": shlex.join(cmd)}


def compile_all(entries: List[Dict[str, Any]], dest: Path, check: Any, *, build: bool,
                runs: Optional[str] = None) -> tuple[bool, List[Dict[str, Any]]]:
    """Compile each entry into ``dest/NAME`` (run directories under ``runs``), check its train.py
    with ``check(entry, text)`` (the wrong keywords) and, with ``build``, run its ``build_configs()``
    (on the GPU machine launch.sh's ``train.py --check`` does it; the driver keeps CUDA and megatron
    out); prints a line per entry with its plan. Returns (every entry right, the entries to run)."""
    ok, compiled = True, []
    for entry in entries:
        code, text = compile_entry(entry, dest, runs)
        if code != 0:
            ok = False
            print(f"{entry['name']}: refused (exit {code}):\n{text[-3000:]}", flush=True)
            continue
        wrong = check(entry, (dest / entry["name"] / "train.py").read_text())
        built = build_configs(dest / entry["name"] / "train.py") if build else None
        ok = ok and not wrong and not built
        plan = planned(entry)
        print(f"{entry['name']}: compiled{' (held out)' if entry['held_out'] else ''} ({entry['steps']} steps); "
              f"planned step {plan['step_seconds']:.3f} s, allocated {plan['peak_allocated_bytes'] / 2**30:.1f} GiB, "
              f"reserved {plan['peak_reserved_bytes'] / 2**30:.1f} GiB" + (f"; flags wrong: {wrong}" if wrong else "")
              + (f"; build_configs: {built}" if built else ""), flush=True)
        if not wrong and not built:
            compiled.append(entry)
    return ok, compiled


def run_all(entries: List[Dict[str, Any]], dest: Path, out: Path, *, budget_s: float, t_start: float,
            min_start_s: float, repeats: int, impl: str = "transformer_engine", runs: Optional[str] = None,
            tag: str = "te_calibration") -> List[Dict[str, Any]]:
    """Run the compiled entries one at a time within the budget, then repeat the cheapest ones;
    returns a record per launch (or per entry left out). ``impl``: the layer path the records name;
    ``runs``: the run directories' parent, as compiled (default :data:`RUNS`); ``tag``: the progress
    lines' prefix."""
    runs = runs or RUNS
    records: List[Dict[str, Any]] = []
    walls: Dict[str, float] = {}

    def one(entry: Dict[str, Any], repeat: int) -> Optional[Dict[str, Any]]:
        left = t_start + budget_s - time.time()
        name = entry["name"]
        if left < min_start_s:
            return None
        limit = min(left, STARTUP_S + 3 * entry["steps"] * planned(entry)["step_seconds"])
        subprocess.run(["rm", "-rf", str(ROOT / runs / name)], check=False)
        rtag = f".r{repeat}" if repeat else ""
        rec = {"name": name, "base": entry["base"], "overrides": entry["overrides"], "impl": impl,
               "held_out": entry["held_out"], "repeat": repeat, "gpus": 1}
        rec.update(launch(dest / name, out / f"{name}{rtag}.log", limit))
        backend = fused_linear_backend(out / f"{name}{rtag}.log")
        if backend:  # what calibrate.py plans the record with (the spec's "auto" depends on the machine)
            rec["fused_linear_backend"] = backend
        rec.update(summarize(ROOT / runs / name / "metrics.jsonl", entry["warmup_steps"]))
        if "step_seconds" not in rec:
            rec["error"] = (f"killed at its limit ({rec['limit_s']} s) before a step after warm-up was logged"
                            if rec["killed_at_limit"] else
                            f"exit code {rec['exit_code']} before a step after warm-up was logged (see {name}{rtag}.log)")
        subprocess.run(["rm", "-rf", str(ROOT / runs / name / "ckpt")], check=False)
        summary = ROOT / runs / name / "profile" / "summary_rank0.json"
        if summary.is_file():  # --profile: the kernel-time summary comes back (the trace stays: tens of MB)
            (out / f"{name}{rtag}.profile_summary.json").write_bytes(summary.read_bytes())
            rec["profile_summary"] = f"{name}{rtag}.profile_summary.json"
        walls[name] = rec["wall_s"]
        print(f"{tag}: {name}{rtag}: exit {rec['exit_code']} in {rec['wall_s']} s (limit {rec['limit_s']} s); "
              f"step {rec.get('step_seconds', float('nan')):.4f} s, allocated "
              f"{rec.get('peak_allocated_bytes', 0) / 2**30:.1f} GiB, reserved {rec.get('peak_reserved_bytes', 0) / 2**30:.1f} GiB"
              + (f"; {rec['error']}" if "error" in rec else ""), flush=True)
        return rec

    for entry in entries:
        rec = one(entry, 0)
        records.append(rec or {"name": entry["name"], "held_out": entry["held_out"], "impl": impl,
                               "error": "not run: budget spent"})
    measured = [e for e in entries if e["name"] in walls and any(r["name"] == e["name"] and "step_seconds" in r
                                                                     for r in records)]
    for repeat in range(1, repeats + 1):
        for entry in sorted(measured, key=lambda e: walls[e["name"]]):
            if t_start + budget_s - time.time() < walls[entry["name"]] + 10:
                break
            rec = one(entry, repeat)
            if rec:
                records.append(rec)
    return records


def only_entries(parser: argparse.ArgumentParser, entries: List[Dict[str, Any]], only: Optional[str]) -> List[Dict[str, Any]]:
    """The entries ``--only`` names (comma-separated; all when ``None``), in the matrix's order; an
    unknown name is a usage error (exit 2) that lists the known ones."""
    if not only:
        return entries
    names = [n for n in only.split(",") if n]
    unknown = [n for n in names if n not in {e["name"] for e in entries}]
    if unknown:
        parser.error(f"--only: unknown entr(y/ies) {unknown}; known: {', '.join(e['name'] for e in entries)}")
    return [e for e in entries if e["name"] in names]


def write_result(path: Path, result: Dict[str, Any], ok: bool, tag: str) -> int:
    """Write a driver's result (its ``runs`` the launch records) to ``path`` and say how many were
    measured; the exit code: 0 when ``ok`` (every entry compiled) and a run was measured, else 1."""
    path.write_text(json.dumps(result, indent=1) + "\n")
    measured = sum("step_seconds" in r for r in result["runs"])
    print(f"{tag}: {measured}/{len(result['runs'])} launches measured in {result['wall_s']} s; {path}")
    return 0 if ok and measured else 1


def driver_parser(description: str, *, dest: str, budget_s: float, min_start_s: float,
                  repeats: int) -> argparse.ArgumentParser:
    """The arguments every calibration driver takes (OUT or ``--dry``, ``--dest``, ``--only``,
    ``--no-build``, ``--budget-s``, ``--min-start-s``, ``--repeats``) with the driver's defaults."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("out", nargs="?", help="results folder ($OUT); not with --dry")
    p.add_argument("--dry", action="store_true", help="compile and check only (CPU)")
    p.add_argument("--dest", default=dest, help=f"compiled configurations (default {dest})")
    p.add_argument("--only", default=None, help="comma-separated entry names")
    p.add_argument("--no-build", action="store_true", help="--dry without build_configs() (no megatron-core import)")
    p.add_argument("--budget-s", type=float, default=budget_s,
                   help=f"all the runs within this many seconds (default {budget_s:g})")
    p.add_argument("--min-start-s", type=float, default=min_start_s,
                   help=f"no run starts with less time left (default {min_start_s:g})")
    p.add_argument("--repeats", type=int, default=repeats,
                   help=f"repeats of the cheapest runs when time is left (default {repeats})")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = driver_parser(__doc__.split("\n\n")[0], dest=DEST, budget_s=420, min_start_s=45, repeats=1)
    p.add_argument("--profile", action="store_true",
                   help=f"run the entries with torch.profiler on steps {PROFILE_STEPS[0]}..{PROFILE_STEPS[1] - 1} "
                   "(NAME-profile; OUT gets profile_te_h200.json and each run's kernel-time summary), not a calibration")
    args = p.parse_args(argv)
    if not args.dry and not args.out:
        p.error("give OUT (the results folder), or --dry")
    entries = json.loads(MATRIX.read_text())
    entries = only_entries(p, entries, args.only)
    if args.profile:
        entries = [profile_entry(e) for e in entries]
    result_name = "profile_te_h200.json" if args.profile else RESULT
    t_start = time.time()
    os.chdir(ROOT)
    dest = (ROOT / args.dest).resolve()
    ok, compiled = compile_all(entries, dest, check_flags, build=args.dry and not args.no_build)
    if args.dry:
        print(f"te_calibration --dry: {len(entries)} entr(y/ies) {'all right' if ok else 'NOT all right'} "
              f"({time.time() - t_start:.1f}s)")
        return 0 if ok else 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records = run_all(compiled, dest, out, budget_s=args.budget_s, t_start=t_start, min_start_s=args.min_start_s,
                      repeats=args.repeats)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    found = versions()
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "device": f"one GPU: {found.get('gpu')}",
        "transformer_impl": "transformer_engine",
        "description": (f"the planner's Transformer Engine calibration (bench/plan/te_matrix.json), one run at a "
                        f"time on one H200, each entry's steps of one microbatch each, median step time after its "
                        "warmup_steps; peak allocated / reserved = torch.cuda.max_memory_allocated / "
                        "max_memory_reserved (metrics.jsonl peak_mem_gib / peak_reserved_gib)"),
        "commit": commit or None, "versions": found,
        "commands": {"device": f"bash bench/devbox/gpu/te_calibration.sh $OUT  (python3 bench/gpu/te_calibration.py $OUT "
                               f"--budget-s {args.budget_s:g} --repeats {args.repeats})",
                     "ingest (CPU machine)": "python bench/calibration/run.py --ingest RESULT (a calibration result), then python bench/calibration/fit.py --write && python -m dlmspec.generated",
                     "compare with the committed predictions": "python3 bench/plan/te_holdout.py compare "
                     f"bench/plan/te_holdout_predictions.json $OUT/{RESULT} OUT.json"},
        "wall_s": round(time.time() - t_start, 1),
        "runs": records,
    }
    if args.profile:
        result["description"] = ("where the step time goes - the entries run with torch.profiler on steps "
                                 f"{PROFILE_STEPS[0]}..{PROFILE_STEPS[1] - 1} ([logging] profile); NAME-profile."
                                 "profile_summary.json is the runtime's kernel-time summary "
                                 "(backends/megatron/profiling.py); the step times are not calibration points")
        result["commands"] = {"device": "bash bench/devbox/gpu/te_calibration.sh $OUT --profile --only NAME"}
    return write_result(out / result_name, result, ok, "te_calibration")


if __name__ == "__main__":
    raise SystemExit(main())
