"""Run the whole hostile-file corpus (tests/hostile/hostile_corpus.py) and write a result JSON.

    python bench/hostile/run_corpus.py --out bench/results/hostile_corpus_base.json

Every case (every surface dlmspec reads besides the spec loader, every hostile class) runs
through tests/hostile/hostile_driver.py: its commands as subprocesses of this interpreter's venv
(``dlmspec`` console script, ``python`` for ``train.py --check``) under a 2 GiB address-space
limit and a 20 s timeout, in a folder of its own, judged on eight verdicts (no traceback, exit
code 0 or 2, no hang, memory, no file changed outside the outputs, no code run, no secret leaked,
no raw terminal escapes). The JSON holds the command line, the versions (dlmspec, git commit,
Python, torch, platform), the date, per-case verdicts and failures, and totals per surface, class
and verdict. ``--only SURFACE`` or ``--match TEXT`` run a part; ``--keep`` keeps every case folder.
Needs the offline data kit (GPT-2 tokenizer) and the dev extras (torch, megatron-core).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "hostile"), str(ROOT / "tests" / "kits")]

from hostile_corpus import SURFACES, all_cases, build_base  # noqa: E402
from hostile_driver import MEMORY_BYTES, TIMEOUT_S, dumps, run_cases, strip_for_json, summary  # noqa: E402


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": str(os.cpu_count())}
    try:
        out["git_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        out["git_dirty"] = str(bool(dirty))
    except OSError:
        pass
    for name in ("dlmspec", "torch", "megatron-core", "transformers", "tokenizers", "jinja2", "pydantic"):
        try:
            from importlib.metadata import version

            out[name] = version(name)
        except Exception:  # noqa: BLE001
            out[name] = "absent"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="Result JSON to write.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the corpus (secrets, garbage bytes).")
    parser.add_argument("--jobs", type=int, default=2, help="Cases run at once.")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="Seconds per command.")
    parser.add_argument("--memory", type=int, default=MEMORY_BYTES, help="Address-space cap per command (bytes).")
    parser.add_argument("--work", help="Folder for the base material and the cases (default: a temporary one).")
    parser.add_argument("--only", action="append", choices=SURFACES, help="Run only this surface (repeatable).")
    parser.add_argument("--match", help="Run only cases whose id holds this text.")
    parser.add_argument("--no-checkpoints", action="store_true", help="Skip the cases that need torch checkpoints.")
    parser.add_argument("--keep", action="store_true", help="Keep every case folder (failed ones are always kept).")
    args = parser.parse_args(argv)

    found_versions = versions()  # before the run: the code the cases ran against
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="dlmspec-hostile-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base = build_base(work / "base", checkpoints=not args.no_checkpoints, seed=args.seed)
    base_s = time.monotonic() - started
    cases = all_cases(base, args.seed, checkpoints=not args.no_checkpoints)
    if args.only:
        cases = [c for c in cases if c.surface in args.only]
    if args.match:
        cases = [c for c in cases if args.match in c.id]
    print(f"hostile corpus: {len(cases)} cases, base built in {base_s:.0f} s, work folder {work}", file=sys.stderr)

    def report(record: dict) -> None:
        status = "ok  " if record["ok"] else "FAIL"
        why = "" if record["ok"] else "  " + "; ".join(record["failures"])[:300]
        print(f"{status} {record['id']} ({record.get('wall_s', 0):.1f} s){why}", file=sys.stderr, flush=True)

    records = run_cases(cases, work / "run", base, jobs=args.jobs, timeout=args.timeout, memory=args.memory,
                        keep=args.keep, report=report)
    total_s = time.monotonic() - started
    result = {
        "what": "hostile-file corpus: every case's verdicts (tests/hostile/hostile_driver.py)",
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else " ".join(["run_corpus.py", *argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": found_versions,
        "settings": {"seed": args.seed, "jobs": args.jobs, "timeout_s": args.timeout, "memory_bytes": args.memory,
                     "checkpoints": not args.no_checkpoints, "only": args.only, "match": args.match},
        "seconds": {"base": round(base_s, 1), "total": round(total_s, 1)},
        "totals": summary(records),
        "cases": strip_for_json(records),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(dumps(result) + "\n", encoding="utf-8")
    totals = result["totals"]
    print(f"hostile corpus: {totals['cases']} cases in {total_s:.0f} s: {totals['passed']} passed, "
          f"{totals['failed']} failed; result in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
