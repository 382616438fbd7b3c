"""Tokens per second per worker of ``dlmspec data prepare``, against the Hugging Face ``datasets``
``map`` of the same GPT-2 tokenizer, on the same machine and the same input, side by side in one
run.

Both sides tokenize the ``text`` field of the same JSONL file with GPT-2's byte-level BPE (the
``vocab.json`` / ``merges.txt`` of the shared data kit): ``dlmspec data prepare --tokenizer-type
GPT2BPETokenizer`` (the ``tokenizers`` library's ``ByteLevelBPETokenizer``, written to a Megatron
``.bin``/``.idx``) and ``datasets.load_dataset("json", ...).map(tokenize, batched=True,
num_proc=W)`` with ``transformers.GPT2TokenizerFast`` (written to Arrow, as a HF pipeline does).
Each runs in its own subprocess with ``TOKENIZERS_PARALLELISM=false`` and ``RAYON_NUM_THREADS=1``
so that a "worker" is one core on both sides. The timed part is the tokenizing and writing: for
dlmspec the ``elapsed_s`` of its ``--json`` summary (startup and the megatron-core import left
out; the whole command's wall time is recorded too), for ``datasets`` the ``map`` call (the
``load_dataset`` JSON-to-Arrow conversion is timed apart). Both token counts are recorded, and
must agree (dlmspec without ``--append-eod``).

Megatron-LM's ``tools/preprocess_data.py`` is not compared: Megatron-LM (the repository, not
megatron-core) cannot be installed here (no network), so this is the comparison the issue allows.

Usage (from the repository root; about 4 minutes on 2 shared cores with the defaults: each run is a
subprocess that imports megatron-core or datasets)::

    python bench/data/prepare_throughput.py --out bench/results/data_prepare_throughput_cpu.json
    python bench/data/prepare_throughput.py --dry   # a 20-document input, workers 1, prints the JSON
"""

from __future__ import annotations

import argparse
import datetime as dt
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

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
if not SHARED.exists():
    SHARED = Path("/work/shared/data")
CORPUS = SHARED / "corpus" / "pydocs-train.jsonl"
GPT2 = SHARED / "tokenizers" / "gpt2"

#: One core per worker on both sides (the Rust tokenizers otherwise use a thread pool).
ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}

HF_SIDE = r"""
import json, sys, time, os
args = json.loads(sys.argv[1])
t0 = time.perf_counter()
import datasets
from transformers import GPT2TokenizerFast
datasets.disable_progress_bars()
tok = GPT2TokenizerFast.from_pretrained(args["folder"])  # vocab.json + merges.txt
assert tok("hello world")["input_ids"] == [31373, 995], "GPT-2 tokenizer not loaded"
t1 = time.perf_counter()
ds = datasets.load_dataset("json", data_files=args["input"], split="train", cache_dir=args["cache"])
t2 = time.perf_counter()
def tokenize(batch):
    return {"input_ids": tok(batch["text"])["input_ids"]}
out = ds.map(tokenize, batched=True, num_proc=args["workers"] if args["workers"] > 1 else None,
             remove_columns=ds.column_names, cache_file_name=os.path.join(args["cache"], "tokenized.arrow"))
t3 = time.perf_counter()
tokens = sum(len(x) for x in out.data.column("input_ids").to_pylist())
print(json.dumps({"tokens": tokens, "documents": len(out), "import_s": t1 - t0, "load_dataset_s": t2 - t1,
                  "map_s": t3 - t2, "datasets": datasets.__version__,
                  "transformers": __import__("transformers").__version__}))
"""


def cpu_info() -> dict[str, Any]:
    """The CPU model, core counts and the CPUs this process may use."""
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {"model": model, "cpu_count": os.cpu_count(), "usable_cpus": usable, "loadavg_at_start": load}


def make_input(folder: Path, documents: int | None) -> Path:
    """The first ``documents`` lines of the shared corpus (all of it when None)."""
    path = folder / "input.jsonl"
    with CORPUS.open("rb") as src, path.open("wb") as dst:
        for i, line in enumerate(src):
            if documents is not None and i >= documents:
                break
            dst.write(line)
    return path


def run_dlmspec(input_path: Path, folder: Path, workers: int) -> dict[str, Any]:
    """``dlmspec data prepare`` in a subprocess; its ``--json`` summary's counts and time."""
    prefix = folder / f"dlmspec-w{workers}"
    cmd = [sys.executable, "-m", "dlmspec.cli", "data", "prepare", "--input", str(input_path),
           "--output-prefix", str(prefix), "--tokenizer-type", "GPT2BPETokenizer",
           "--vocab-file", str(GPT2 / "vocab.json"), "--merge-file", str(GPT2 / "merges.txt"),
           "--workers", str(workers), "--no-progress", "--json", "--force"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"dlmspec data prepare failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)["result"]
    seconds = result["elapsed_s"]
    return {"tool": "dlmspec data prepare", "workers": workers, "tokens": result["tokens"],
            "documents": result["documents"], "seconds": seconds, "command_wall_s": round(wall, 3),
            "tokens_per_s": round(result["tokens"] / seconds, 1),
            "tokens_per_s_per_worker": round(result["tokens"] / seconds / workers, 1),
            "timed": "tokenize + write .bin/.idx (the --json summary's elapsed_s)",
            "command": shlex.join(cmd)}


def run_hf(input_path: Path, folder: Path, workers: int) -> dict[str, Any]:
    """``datasets`` ``map`` of ``GPT2TokenizerFast`` in a subprocess (a fresh cache folder)."""
    cache = folder / f"hf-cache-w{workers}"
    cache.mkdir()
    args = {"input": str(input_path), "folder": str(GPT2), "workers": workers, "cache": str(cache)}
    cmd = [sys.executable, "-c", HF_SIDE, json.dumps(args)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True,
                          env={**os.environ, **ENV, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the datasets map failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    seconds = result["map_s"]
    return {"tool": "datasets.Dataset.map (GPT2TokenizerFast, batched)", "workers": workers,
            "tokens": result["tokens"], "documents": result["documents"], "seconds": round(seconds, 3),
            "load_dataset_s": round(result["load_dataset_s"], 3), "command_wall_s": round(wall, 3),
            "tokens_per_s": round(result["tokens"] / seconds, 1),
            "tokens_per_s_per_worker": round(result["tokens"] / seconds / workers, 1),
            "timed": "the map call: tokenize + write Arrow (load_dataset apart)",
            "versions": {"datasets": result["datasets"], "transformers": result["transformers"]},
            "command": "python -c HF_SIDE (bench/data/prepare_throughput.py) " + shlex.quote(json.dumps(args))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300,
                        help="first N documents of the shared corpus (default 300: 4 MB, 1.3M GPT-2 tokens; "
                        "0: all of it, 11 MB)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to run (default 1 2)")
    parser.add_argument("--out", default=None, help="write the JSON here (default: print it)")
    parser.add_argument("--dry", action="store_true", help="20 documents, workers 1: a quick end-to-end check")
    args = parser.parse_args(argv)
    if args.dry:
        args.documents, args.workers = 20, [1]
    args.documents = args.documents or None
    started = dt.datetime.now(dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="prepare-throughput-") as tmp:
        folder = Path(tmp)
        input_path = make_input(folder, args.documents)
        runs = []
        for workers in args.workers:  # alternate the two sides so that load changes hit both
            runs.append(run_dlmspec(input_path, folder, workers))
            runs.append(run_hf(input_path, folder, workers))
        size = input_path.stat().st_size
    for workers in args.workers:
        pair = [r for r in runs if r["workers"] == workers]
        if pair[0]["tokens"] != pair[1]["tokens"]:
            raise SystemExit(f"token counts differ at {workers} workers: {pair[0]['tokens']} vs {pair[1]['tokens']}")
    ratio = {str(w): round(next(r for r in runs if r["workers"] == w and r["tool"].startswith("dlmspec"))
                           ["tokens_per_s"] / next(r for r in runs if r["workers"] == w and r["tool"].startswith("datasets"))
                           ["tokens_per_s"], 3) for w in args.workers}
    body = {
        "benchmark": "data prepare throughput (tokens/s per worker), dlmspec vs the HF datasets map",
        "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["prepare_throughput.py", *argv]),
        "date": started.isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "python": platform.python_version(),
        "input": {"path": f"first {args.documents} documents of {CORPUS}" if args.documents else str(CORPUS),
                  "bytes": size, "documents": runs[0]["documents"]},
        "tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": str(GPT2 / "vocab.json"),
                      "merge_file": str(GPT2 / "merges.txt")},
        "env": ENV,
        "runs": runs,
        "dlmspec_over_hf_tokens_per_s": ratio,
        "megatron_lm_preprocess_data": "not run: Megatron-LM's tools/preprocess_data.py needs the Megatron-LM "
                                       "repository, which cannot be installed on this machine (no network; only "
                                       "megatron-core is installed), so the comparison is the HF datasets map",
        "note": "2 CPU cores shared with other jobs: the figures vary with their load (loadavg_at_start)",
    }
    text = json.dumps(body, indent=2) + "\n"
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
