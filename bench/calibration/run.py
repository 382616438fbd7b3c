"""The calibration suite: measure the planner's calibration configurations on a GPU, then add the
measurements to the calibration data the planner's constants are generated from.

    python bench/calibration/run.py --path transformer_engine           # run bench/plan/te_matrix.json (one GPU)
    python bench/calibration/run.py --path local+sdpa --part 1/2         # the one-GPU half of bench/plan/matrix.json
    python bench/calibration/run.py --path transformer_engine --only te-bf16-mb4,te-fp8-mb8 --budget-s 900
    python bench/calibration/run.py --dry                                # print the commands and the result path
    python bench/calibration/run.py --ingest bench/results/calibration/<date>-h100-te-matrix.json
    python bench/calibration/fit.py --write && python -m dlmspec.generated   # refit, regenerate calibration.py

Measuring: ``bench/gpu/te_calibration.py`` (``--path transformer_engine``: ``bench/plan/te_matrix.json``)
or ``bench/gpu/local_calibration.py`` (``--path local+sdpa``: the one-GPU entries of
``bench/plan/matrix.json``, on the local layers, mock data) compiles each entry of the matrix with
dlmspec, checks its train.py, runs the entries one at a time through their compiled launch scripts
within ``--budget-s`` and records per run the peak allocated / reserved memory and the median step
time (the record format of ``bench/calibration/build.py``). The result (``bench/schema.py``) goes to
``bench/results/calibration/<date>-<gpu>-<name>.json``; its ``values`` are that file (``date``, ``runs``).

Ingesting (``--ingest RESULT``): writes the result's runs as a new data file
``bench/calibration/<path>/<gpu>/<date>-<name>.json`` and lists it in ``manifest.json`` (the refit and
the regeneration are the two commands above). The local path's two-GPU entries have no launcher here:
their committed runs were measured with the development machine's drivers of the day.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

ROOT = common.ROOT


class LayerPath(NamedTuple):
    """What measures one layer path's matrix and where its runs go."""

    driver: Path      #: the driver script (bench/gpu/)
    result: str       #: the file the driver writes into its OUT folder
    name: str         #: the result's default name
    folder: str       #: the data folder under bench/calibration/


PATHS = {"transformer_engine": LayerPath(ROOT / "bench" / "gpu" / "te_calibration.py", "calibration_te_h200.json",
                                         "te-matrix", "te"),
         "local+sdpa": LayerPath(ROOT / "bench" / "gpu" / "local_calibration.py", "calibration_local.json",
                                 "local-matrix", "local")}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--path", choices=sorted(PATHS), default="transformer_engine", help="layer path to measure")
    p.add_argument("--only", default=None, help="comma-separated matrix entries (default all)")
    p.add_argument("--part", default=None, metavar="K/N", help="--path local+sdpa: the K-th of N slices of the entries")
    p.add_argument("--budget-s", type=float, default=1800, help="all runs within this many seconds")
    p.add_argument("--repeats", type=int, default=1, help="repeats of the cheapest runs when time is left")
    p.add_argument("--ingest", default=None, metavar="RESULT", help="add a calibration result's runs to bench/calibration/")
    p.add_argument("--data", default=str(ROOT / "bench" / "calibration"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def ingest(result_path: Path, data: Path) -> int:
    """Write the runs of a calibration result into ``data/<path>/<gpu>/`` and the manifest."""
    sys.path.insert(0, str(ROOT))
    from bench.calibration.build import check_runs_file
    from dlmspec.files import FileRefused, write_atomic
    from schema import ResultInvalid, read_result

    try:
        result = read_result(result_path)
    except (FileRefused, ResultInvalid, ValueError) as exc:
        print(f"error: --ingest {result_path}: {exc}", file=sys.stderr)
        return 2
    if result["suite"] != "calibration" or result["status"] not in ("ok", "partial") or not result["values"].get("runs"):
        print(f"error: --ingest {result_path}: suite {result['suite']!r}, status {result['status']!r}: a calibration "
              "result with measured runs is needed", file=sys.stderr)
        return 2
    layer_path = result["values"].get("layer_path", "transformer_engine")
    gpu = result["hardware"]["gpu"]
    folder = f"{PATHS[layer_path].folder}/{gpu}"
    (data / folder).mkdir(parents=True, exist_ok=True)
    dest = data / folder / f"{result['date']}-{result['name']}.json"
    if dest.exists():
        print(f"error: --ingest: {dest} exists already (nothing overwritten)", file=sys.stderr)
        return 2
    write_atomic(dest, json.dumps({"date": result["values"].get("date", result["date"]), "source": str(result_path),
                                   "command": result["command"], "versions": result["versions"],
                                   "hardware": result["hardware"], "runs": result["values"]["runs"]}, indent=1) + "\n")
    check_runs_file(dest)
    man = json.loads((data / "manifest.json").read_text())
    entry = next((e for e in man["paths"] if e["layer_path"] == layer_path and e["gpu"] == gpu), None)
    if entry is None:
        entry = {"layer_path": layer_path, "gpu": gpu, "dir": folder, "runs": [], "fit": f"{folder}/fit.json"}
        man["paths"].append(entry)
    entry["runs"] = sorted(set(entry["runs"]) | {dest.name})
    write_atomic(data / "manifest.json", json.dumps(man, indent=1) + "\n")
    print(f"wrote {dest} and listed it in {data / 'manifest.json'}; next: python bench/calibration/fit.py --write "
          "&& python -m dlmspec.generated")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    if args.ingest:
        return ingest(Path(args.ingest), Path(args.data))
    if args.part and args.path != "local+sdpa":
        print(f"error: --part {args.part}: only --path local+sdpa runs its matrix in parts (the Transformer Engine "
              "matrix fits one call); use --only NAME,... to pick entries", file=sys.stderr)
        return 2
    name = (args.name or PATHS[args.path].name + (f"-part{args.part.replace('/', 'of')}" if args.part else "")).lower()
    slurm = common.maybe_slurm(args, raw, "calibration")
    if slurm is not None:
        return slurm
    work = common.work_dir(args, "calibration")
    cmd = [args.python, str(PATHS[args.path].driver), str(work / "out"), "--dest", str(work / "compiled"), "--budget-s",
           f"{args.budget_s:g}", "--repeats", str(args.repeats)] + (["--only", args.only] if args.only else []) \
        + (["--part", args.part] if args.part else [])
    steps = [("measure", cmd, {})]
    if args.dry:
        return common.print_dry(steps, work, common.planned_path(args, "calibration", name))
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    status, record = common.run_steps(steps, work, work / "calibration.log", args.budget_s + 600)
    out = work / "out" / PATHS[args.path].result
    values = {"layer_path": args.path, "steps": record}
    if out.exists():
        values.update(json.loads(out.read_text()))
    measured = [r for r in values.get("runs", []) if "step_seconds" in r]
    status = "ok" if status == "ok" and measured else ("partial" if measured else "failed")
    common.finish(args, "calibration", name, [sys.executable, str(Path(__file__).resolve()), *raw], values, status)
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
