"""The planner's local-path calibration runs, one at a time on one GPU.

Compiles the one-GPU entries of ``bench/plan/matrix.json`` (``bench/plan/matrix.py``: the demo and
Qwen3-1.7B-architecture shapes the local path's constants were fitted on, on an H200) into
``.device/localcal/NAME`` (run directory ``.device/runs/localcal/NAME``), each cut to ``--max-iters``
steps (default 40: the entries log every 5 steps, so 40 leaves six intervals after the
``WARMUP_STEPS``), checks in each train.py the keywords its overrides must produce
(:func:`check_flags`) and, with ``--dry``, runs its ``build_configs()`` (megatron-core's config checks,
no CUDA). Without ``--dry`` the runs go one after the other within ``--budget-s`` seconds
(``te_calibration.run_all``: each launch killed at its own limit, the cheapest repeated when time is left).
The entries use mock data (``data.mock``): nothing to carry but the wheels.

Each run's record is ``te_calibration.py``'s (``bench/plan/calibrate.py``'s format) with ``impl``
``local+sdpa``. ``OUT/calibration_local.json`` gets the runs, date, device, versions and commands;
``OUT/NAME.log`` each launch's console.

    python3 bench/gpu/local_calibration.py --dry                      # CPU: compile, check the flags
    python3 bench/gpu/local_calibration.py OUT [--budget-s 480] [--only A,B]   # GPU

The one-GPU matrix is ~19 runs of 45-70 s (start-up included) on an H200, more than one 10-minute call
of the development machine: ``--part 1/2`` and ``--part 2/2`` run the two halves (in the matrix's order).
Exit code 0 when every entry compiled (and, without ``--dry``, at least one run was measured), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT / "bench" / "plan"))

from compiled_runs import flags_wrong, versions  # noqa: E402
from prepare import shorten  # noqa: E402  (bench/gpu/prepare.py)
from te_calibration import compile_all, driver_parser, only_entries, run_all, write_result  # noqa: E402

MATRIX = ROOT / "bench" / "plan" / "matrix.json"
DEST = ".device/localcal"
RUNS = ".device/runs/localcal"
RESULT = "calibration_local.json"
IMPL = "local+sdpa"
#: The override that keeps an entry on the local layers (the matrix's spec says "auto").
LOCAL = 'model.transformer_impl="local"'
#: Steps left out of the median: the runtime's first steps (torch.compile'd regions, cuDNN's plans);
#: ``bench/plan/calibrate.py``'s H200 runs took the median of the intervals after iteration 10.
WARMUP_STEPS = 10
MAX_ITERS = 40


def matrix_entries(max_iters: int = MAX_ITERS, matrix: Path = MATRIX) -> List[Dict[str, Any]]:
    """The matrix's one-GPU entries the runtime supports, cut to ``max_iters`` steps, on the local
    layers (:data:`LOCAL` unless the entry names its path), in the fields
    ``te_calibration.run_all`` reads (``steps``, ``warmup_steps``, ``held_out``: none is held out)."""
    out = []
    for entry in json.loads(matrix.read_text()):
        if entry.get("gpus", 1) != 1 or not entry.get("runtime_supported", True):
            continue
        overrides = entry["overrides"] + shorten(entry["overrides"], max_iters)
        if not any(o.startswith("model.transformer_impl=") for o in overrides):
            overrides.append(LOCAL)  # not "auto": the local layers also where Transformer Engine imports
        steps = next(int(o.partition("=")[2]) for o in reversed(overrides) if o.startswith("train.train_iters="))
        out.append({"name": entry["name"], "base": entry["base"], "overrides": overrides, "steps": steps,
                    "warmup_steps": min(WARMUP_STEPS, steps - 1), "held_out": False})
    return out


def part_of(entries: List[Dict[str, Any]], part: str) -> List[Dict[str, Any]]:
    """``part`` ``"K/N"``: the K-th of N consecutive, near-equal slices of ``entries`` (1-based).

    Raises:
        ValueError: not ``K/N`` with ``1 <= K <= N``.
    """
    k, _, n = part.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"--part {part!r}: write K/N with 1 <= K <= N, e.g. 1/2")
    k, n = int(k), int(n)
    size, extra = divmod(len(entries), n)
    start = (k - 1) * size + min(k - 1, extra)
    return entries[start:start + size + (k <= extra)]


def wanted_flags(entry: Dict[str, Any]) -> Dict[str, Any]:
    """What train.py must say for an entry: the local layers (no Transformer Engine) and the batch
    and sequence its overrides set (keyword -> literal value)."""
    want: Dict[str, Any] = {"use_transformer_engine": False}
    names = {"train.micro_batch_size": "micro_batch_size", "train.global_batch_size": "global_batch_size",
             "train.seq_length": "seq_length", "train.train_iters": "train_iters"}
    for item in entry["overrides"]:
        key, _, value = item.partition("=")
        if key in names:
            want[names[key]] = int(value)
    return want


def check_flags(entry: Dict[str, Any], text: str) -> List[str]:
    """What the entry's train.py says wrongly (``["keyword: want X, got Y", ...]``; [] = right)."""
    return flags_wrong(wanted_flags(entry), text)


def main(argv: Optional[List[str]] = None) -> int:
    p = driver_parser(__doc__.split("\n\n")[0], dest=DEST, budget_s=480, min_start_s=40, repeats=0)
    p.add_argument("--part", default=None, metavar="K/N", help="the K-th of N slices of the entries (after --only)")
    p.add_argument("--max-iters", type=int, default=MAX_ITERS, help=f"steps per run at most (default {MAX_ITERS})")
    args = p.parse_args(argv)
    if not args.dry and not args.out:
        p.error("give OUT (the results folder), or --dry")
    if args.max_iters <= WARMUP_STEPS:
        p.error(f"--max-iters {args.max_iters}: more than the {WARMUP_STEPS} warm-up steps are needed, e.g. {MAX_ITERS}")
    entries = matrix_entries(args.max_iters)
    entries = only_entries(p, entries, args.only)
    if args.part:
        try:
            entries = part_of(entries, args.part)
        except ValueError as exc:
            p.error(str(exc))
    t_start = time.time()
    os.chdir(ROOT)
    dest = (ROOT / args.dest).resolve()
    ok, compiled = compile_all(entries, dest, check_flags, build=args.dry and not args.no_build, runs=RUNS)
    if args.dry:
        print(f"local_calibration --dry: {len(entries)} entr(y/ies) {'all right' if ok else 'NOT all right'} "
              f"({time.time() - t_start:.1f}s)")
        return 0 if ok else 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records = run_all(compiled, dest, out, budget_s=args.budget_s, t_start=t_start, min_start_s=args.min_start_s,
                      repeats=args.repeats, impl=IMPL, runs=RUNS, tag="local_calibration")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    found = versions()
    chosen = " ".join(f"--{k} {v}" for k, v in (("only", args.only), ("part", args.part)) if v)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "device": f"one GPU: {found.get('gpu')}",
        "transformer_impl": "local",
        "description": ("the planner's local-path calibration (bench/plan/matrix.json, one-GPU entries, mock data), one "
                        f"run at a time, at most {args.max_iters} steps each, median step_time_s of the logged intervals "
                        f"after iteration {WARMUP_STEPS}; peak allocated / reserved = torch.cuda.max_memory_allocated / "
                        "max_memory_reserved (metrics.jsonl peak_mem_gib / peak_reserved_gib)"),
        "commit": commit or None, "versions": found,
        "commands": {"device": f"python3 bench/gpu/local_calibration.py $OUT --budget-s {args.budget_s:g} --max-iters "
                               f"{args.max_iters} --repeats {args.repeats} {chosen}".strip(),
                     "ingest (CPU machine)": "python bench/calibration/run.py --ingest RESULT (a calibration result), "
                                             "then python bench/calibration/fit.py --write && python -m dlmspec.generated"},
        "wall_s": round(time.time() - t_start, 1),
        "runs": records,
    }
    return write_result(out / RESULT, result, ok, "local_calibration")


if __name__ == "__main__":
    raise SystemExit(main())
