"""Memory stays flat: ``dlmspec data prepare`` on a ``.jsonl.gz`` input several times larger than
an RSS-growth limit this script sets, its resident memory sampled over the run.

The input is the shared corpus (``pydocs-train.jsonl``, 11 MB) repeated: every document's UTF-8
bytes written as space-separated ids for the ``NullTokenizer`` (vocabulary 256, the corpus as a
byte-level tokenizer sees it), so that tokenizing is quick enough for hundreds of MB to go through
in a few minutes on a shared 2-core machine; the reading (gzip decompression, bounded lines), the
worker pool, the writer and the shards are the same code as for any tokenizer. The run has
``--workers 2`` and ``--shard-size`` (so shards are opened, committed and recorded as they fill).

The prepare runs in a subprocess; psutil samples the RSS of it and its worker processes every
0.1 s. The baseline is the RSS at the first sample after the first temporary shard file exists
(imports done, tokenizer built, the pool started): growth = peak - baseline, of the whole process
tree and of the parent alone. The result: input sizes (compressed and not), the limit, peak RSS,
RSS at 10 %, 50 % and 90 % of the run's time, and the run's own summary (documents, tokens, shards).

Usage (from the repository root; about 4 minutes on 2 shared cores with the defaults, 40 s of it the
imports under load)::

    python bench/data/prepare_memory.py --out bench/results/data_prepare_memory_cpu.json
    python bench/data/prepare_memory.py --dry    # 3 MB of input, a quick end-to-end check
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
if not SHARED.exists():
    SHARED = Path("/work/shared/data")
CORPUS = SHARED / "corpus" / "pydocs-train.jsonl"
MB = 1_000_000


def make_input(path: Path, target_bytes: int) -> dict[str, Any]:
    """Write ``path`` (.jsonl.gz): the corpus as byte ids, repeated until ``target_bytes`` of JSONL
    (uncompressed) are written. Returns its sizes and document count."""
    lines = []
    with CORPUS.open(encoding="utf-8") as src:
        for line in src:
            text = json.loads(line)["text"]
            lines.append((json.dumps({"text": " ".join(map(str, text.encode("utf-8")))}) + "\n").encode())
    block = b"".join(lines)
    written = documents = 0
    with gzip.open(path, "wb", compresslevel=1) as out:
        while written < target_bytes:
            out.write(block)
            written += len(block)
            documents += len(lines)
    return {"path": str(path), "bytes_compressed": path.stat().st_size, "bytes_uncompressed": written,
            "documents": documents, "made_from": f"{CORPUS} as UTF-8 byte ids, repeated"}


def tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(RSS of ``proc`` and its descendants, RSS of ``proc`` alone), bytes."""
    try:
        own = proc.memory_info().rss
    except psutil.Error:
        return 0, 0
    total = own
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total, own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input-mb", type=float, default=600, help="uncompressed input, MB (default 600)")
    parser.add_argument("--limit-mb", type=float, default=50, help="RSS growth limit, MB (default 50)")
    parser.add_argument("--shard-size", default="20M", help="--shard-size of the run (default 20M tokens)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    parser.add_argument("--dry", action="store_true", help="3 MB of input: a quick end-to-end check")
    args = parser.parse_args(argv)
    if args.dry:
        args.input_mb, args.shard_size = 3, "200k"
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="prepare-memory-") as tmp:
        folder = Path(tmp)
        t0 = time.perf_counter()
        made = make_input(folder / "big.jsonl.gz", int(args.input_mb * MB))
        made["make_s"] = round(time.perf_counter() - t0, 1)
        out = folder / "out"
        cmd = [sys.executable, "-m", "dlmspec.cli", "data", "prepare", "--input", made["path"],
               "--output-prefix", str(out / "big"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
               "--workers", str(args.workers), "--shard-size", str(args.shard_size), "--no-progress", "--json"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        handle = psutil.Process(proc.pid)
        samples: list[tuple[float, int, int]] = []
        baseline_at = None
        while proc.poll() is None:
            now = time.perf_counter() - start
            total, own = tree_rss(handle)
            if total:
                samples.append((now, total, own))
            if baseline_at is None and out.exists() and any(".tmp-" in p.name for p in out.iterdir()):
                baseline_at = len(samples)  # the next sample: the run is writing
            time.sleep(0.1)
        stdout, stderr = proc.communicate()
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"data prepare failed ({proc.returncode}):\n{stderr[-3000:]}")
        summary = json.loads(stdout)["result"]
    if baseline_at is None or baseline_at >= len(samples):
        raise SystemExit("the run ended before a sample after its start of writing; give a larger --input-mb")
    run = samples[baseline_at:]
    base_total, base_own = run[0][1], run[0][2]
    peak_total, peak_own = max(s[1] for s in run), max(s[2] for s in run)
    t_first, t_last = run[0][0], run[-1][0]

    def at(fraction: float) -> dict[str, float]:
        when = t_first + fraction * (t_last - t_first)
        sample = min(run, key=lambda s: abs(s[0] - when))
        return {"t_s": round(sample[0], 2), "rss_tree_mb": round(sample[1] / MB, 1), "rss_parent_mb": round(sample[2] / MB, 1)}

    growth = (peak_total - base_total) / MB
    body = {
        "benchmark": "data prepare memory on an input several times larger than an RSS growth limit",
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["prepare_memory.py", *argv]),
        "prepare_command": shlex.join(cmd),
        "date": started.isoformat(timespec="seconds"),
        "cpu": {"model": next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                               if l.startswith("model name")), platform.processor()),
                "usable_cpus": len(os.sched_getaffinity(0)), "loadavg_at_start": os.getloadavg()},
        "python": platform.python_version(),
        "input": made,
        "limit_rss_growth_mb": args.limit_mb,
        "input_over_limit": round(made["bytes_uncompressed"] / MB / args.limit_mb, 1),
        "compressed_input_over_limit": round(made["bytes_compressed"] / MB / args.limit_mb, 1),
        "rss_baseline_mb": {"tree": round(base_total / MB, 1), "parent": round(base_own / MB, 1), "t_s": round(t_first, 2)},
        "rss_peak_mb": {"tree": round(peak_total / MB, 1), "parent": round(peak_own / MB, 1)},
        "rss_growth_mb": {"tree": round(growth, 1), "parent": round((peak_own - base_own) / MB, 1)},
        "rss_at": {"10%": at(0.1), "50%": at(0.5), "90%": at(0.9)},
        "within_limit": growth <= args.limit_mb,
        "samples": len(run),
        "sample_interval_s": 0.1,
        "wall_s": round(wall, 1),
        "run": {k: summary[k] for k in ("documents", "tokens", "elapsed_s", "tokens_per_s", "workers", "shard_size")}
        | {"shards": len(summary["shards"])},
        "how": "RSS of the prepare process and its workers (psutil), every 0.1 s; baseline: the first sample "
               "after its first temporary shard file exists (imports done, pool started). The tree's RSS counts "
               "pages the forked workers share with the parent once per process, so its level is high; its "
               "growth is what the limit is about",
    }
    text = json.dumps(body, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0 if body["within_limit"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
