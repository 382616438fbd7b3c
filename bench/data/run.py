"""The data-preparation suite: ``dlmspec data prepare`` tokens/s per worker against a Hugging Face
``datasets`` ``map`` of the same tokenizer and input (``prepare_throughput.py``), and its peak memory
on a large input (``prepare_memory.py``). CPU only.

    python bench/data/run.py                       # both, defaults (about 5 minutes on 2 cores)
    python bench/data/run.py --documents 100 --workers 1 2 4
    python bench/data/run.py --dry                 # print the commands and the result path

Both workers read the GPT-2 tokenizer and the corpus of the offline data kit (``../shared/data`` or
``$DLMSPEC_SHARED_DATA``). The result (``bench/schema.py``) goes to
``bench/results/data/<date>-cpu-<name>.json``, ``values`` = ``{"throughput": ..., "memory": ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

HERE = Path(__file__).resolve().parent


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, gpus=0, precision=None)
    p.add_argument("--documents", type=int, default=300, help="documents of the throughput input (default 300)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts (default 1 2)")
    p.add_argument("--input-mb", type=float, default=600, help="input of the memory run, MB (default 600)")
    p.add_argument("--parts", default="throughput,memory", help="throughput, memory or both")
    p.add_argument("--timeout-s", type=float, default=1800)
    args = p.parse_args(argv)
    args.part_list = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not args.part_list or set(args.part_list) - {"throughput", "memory"}:
        p.error(f"--parts {args.parts!r}: throughput, memory or throughput,memory")
    if args.documents < 1 or min(args.workers) < 1 or args.input_mb <= 0:
        p.error("--documents, --workers and --input-mb must be positive")
    return args


def plan(args, work: Path):
    steps = []
    if "throughput" in args.part_list:
        steps.append(("throughput", [args.python, str(HERE / "prepare_throughput.py"), "--documents", str(args.documents),
                                     "--workers", *map(str, args.workers), "--out", str(work / "throughput.json")], {}))
    if "memory" in args.part_list:
        steps.append(("memory", [args.python, str(HERE / "prepare_memory.py"), "--input-mb", f"{args.input_mb:g}",
                                 "--out", str(work / "memory.json")], {}))
    return steps


def main(argv=None) -> int:
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    args.gpu = args.gpu or "cpu"
    name = (args.name or f"prepare-{'-'.join(args.part_list)}").lower()
    slurm = common.maybe_slurm(args, raw, "data")
    if slurm is not None:
        return slurm
    work = common.work_dir(args, "data")
    steps = plan(args, work)
    if args.dry:
        return common.print_dry(steps, work, common.planned_path(args, "data", name))
    status, record = common.run_steps(steps, work, work / "data.log", args.timeout_s)
    values = {"steps": record}
    for part in args.part_list:
        f = work / f"{part}.json"
        if f.exists():
            values[part] = json.loads(f.read_text())
    common.finish(args, "data", name, [sys.executable, str(Path(__file__).resolve()), *raw], values, status)
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
