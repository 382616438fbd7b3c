"""Compile everything a GPU session runs, here on the CPU machine, into ``.device/`` (ignored by git,
carried to the GPU machine by the device tool).

* ``.device/plan/NAME/``: one compiled directory per entry of ``bench/plan/matrix.json`` (the
  planner's calibration matrix), with the entry's ``--set`` overrides plus a run directory and a
  checkpoint directory of its own, so runs never resume from each other.
* ``.device/demo/``: ``specs/demo-dlm.toml`` compiled as it is, and ``.device/demo-ref/``, the
  same in run and checkpoint directories of its own (the uninterrupted run of ``demo_resume.sh``).
* What the demo spec reads, in ``.data/`` (ignored by git; carry it to the GPU machine):
  :func:`demo_inputs` makes it from the offline kit beside the checkout (``../shared/data``),
  since neither machine reaches the Hugging Face Hub that README's commands read: GPT-2's
  ``vocab.json``/``merges.txt`` copied to the spec's tokenizer paths (where ``hf download
  openai-community/gpt2`` puts them) and the Python docs corpus prepared into the spec's data
  prefixes (the corpus every benchmark of the demo in ``bench/results/`` ran on). Existing
  datasets are kept; a tokenizer file that differs from the kit's is replaced.

``--max-iters N`` shortens each entry to at most N steps (``train.train_iters`` and
``train.eval_interval``; the matrix's 50-step demo runs log every 5 steps, so 40 leaves six steady
intervals after iteration 10, what ``run_matrix.sh`` takes the median of).

Usage: ``.venv/bin/python bench/gpu/prepare.py [--gpus 1|2] [--max-iters N] [--matrix FILE] [NAME ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from dlmspec.data.outputs import dataset_prefix
from dlmspec.data.prepare import prepare

ROOT = Path(__file__).resolve().parents[2]
DLMSPEC = [sys.executable, "-m", "dlmspec.cli"]
#: The offline data kit (a GPT-2 tokenizer and the Python docs corpus) beside the checkout.
SHARED = ROOT.parent / "shared" / "data"
DEMO = ROOT / "specs" / "demo-dlm.toml"
#: The kit's corpus file for each of the demo's data splits.
DEMO_CORPUS = {"train": "pydocs-train.jsonl", "valid": "pydocs-valid.jsonl"}
#: The kit's file for each of the demo's tokenizer keys.
DEMO_TOKENIZER = {"vocab_file": "vocab.json", "merge_file": "merges.txt"}


def demo_inputs(root: Path = ROOT, shared: Path = SHARED, spec: Path = DEMO,
                workers: int | None = None) -> list[str]:
    """Make what ``spec`` (the demo) reads, under ``root``, from the kit in ``shared``; returns a
    line per thing done ([] when all was there).

    The tokenizer files go to the spec's ``data.tokenizer.vocab_file`` / ``merge_file`` (copied
    when missing or different); each ``data.train`` / ``data.valid`` prefix not yet on disk is
    prepared from the kit's corpus with ``dlmspec data prepare``'s body (GPT-2 BPE,
    ``--append-eod``, as the spec's header shows for the public sources). Raises SystemExit when
    the kit is missing, DataPrepareError when preparing fails.
    """
    data = tomllib.loads(spec.read_text(encoding="utf-8"))["data"]
    if not (shared / "tokenizers" / "gpt2").is_dir() and (shared / "data" / "tokenizers" / "gpt2").is_dir():
        shared = shared / "data"  # the folder above the kit (--shared /work/shared)
    kit_tokenizer = shared / "tokenizers" / "gpt2"
    if not kit_tokenizer.is_dir():
        raise SystemExit(f"error: the offline data kit is not at {shared} (it needs tokenizers/gpt2 and corpus/); "
                         "pass its folder with --shared DIR, e.g. --shared /work/shared/data")
    done: list[str] = []
    paths = {}
    for key, name in DEMO_TOKENIZER.items():
        src, dst = kit_tokenizer / name, root / data["tokenizer"][key]
        paths[key] = dst
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            done.append(f"copied {src} -> {dst}")
    suffix = "_text_document"
    for split, corpus in DEMO_CORPUS.items():
        for entry in data[split]:
            prefix = entry["prefix"] if isinstance(entry, dict) else entry
            if not prefix.endswith(suffix):
                raise SystemExit(f"{spec}: data.{split} prefix {prefix!r} is not NAME{suffix}")
            if all((root / (prefix + ext)).is_file() for ext in (".bin", ".idx")):
                continue
            out = root / prefix[: -len(suffix)]
            result = prepare(shared / "corpus" / corpus, out, tokenizer_type="GPT2BPETokenizer",
                             vocab_file=str(paths["vocab_file"]), merge_file=str(paths["merge_file"]),
                             append_eod=True, workers=workers or max(1, (os.cpu_count() or 2) - 1))
            assert dataset_prefix(str(out), "text") == str(root / prefix)
            done.append(f"prepared {shared / 'corpus' / corpus} -> {root / prefix}.{{bin,idx}} "
                        f"({result.documents:,} documents, {result.tokens:,} tokens)")
    return done


def compile_spec(base: str, out: Path, overrides: list[str]) -> None:
    """Run ``dlmspec compile base -o out --force --set ...``; raise on failure."""
    cmd = DLMSPEC + ["compile", base, "-o", str(out), "--force"]
    for item in overrides:
        cmd += ["--set", item]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"compile failed for {out}:\n{result.stdout}\n{result.stderr}")


def shorten(overrides: list[str], max_iters: int) -> list[str]:
    """``--set`` values that cut an entry to at most ``max_iters`` steps: its last
    ``train.train_iters`` (and ``train.eval_interval``) override, capped."""
    iters = evals = None
    for item in overrides:
        key, _, value = item.partition("=")
        if key == "train.train_iters":
            iters = int(value)
        elif key == "train.eval_interval":
            evals = int(value)
    out = []
    if iters is None or iters > max_iters:
        out.append(f"train.train_iters={max_iters}")
    if evals is not None and evals > max_iters:
        out.append(f"train.eval_interval={max_iters}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=None, help="only matrix entries for this many GPUs")
    parser.add_argument("--demo", action="store_true", help="also compile the demo into .device/demo")
    parser.add_argument("--profile", default=None, metavar="A:B",
                        help="compile the chosen entries into .device/profile/NAME-profile instead, with "
                             "[logging] profile over steps A..B-1 on every rank")
    parser.add_argument("--max-iters", type=int, default=None, metavar="N",
                        help="at most N training steps per entry (train_iters and eval_interval)")
    parser.add_argument("--matrix", default="bench/plan/matrix.json",
                        help="the entries' file (default: the calibration matrix; bench/plan/holdout.json "
                             "holds configurations kept out of the calibration)")
    parser.add_argument("names", nargs="*", help="matrix entries (default: all runnable ones)")
    args = parser.parse_args()
    matrix = json.loads((ROOT / args.matrix).read_text())
    chosen = []
    for entry in matrix:
        if args.names and entry["name"] not in args.names:
            continue
        if args.gpus and entry["gpus"] != args.gpus:
            continue
        if entry.get("errors"):
            print(f"skip {entry['name']}: {entry['errors']}")
            continue
        chosen.append(entry)
    if args.demo or any("data.mock=true" not in entry["overrides"] for entry in chosen):
        for line in demo_inputs():
            print(line)
    root = ROOT / ".device" / ("profile" if args.profile else "plan")
    for entry in chosen:
        name = entry["name"] + ("-profile" if args.profile else "")
        out = root / name
        if out.exists():
            shutil.rmtree(out)
        run_dir = f".device/runs/{name}"
        extra = []
        if args.profile:
            start, end = args.profile.split(":")
            ranks = list(range(entry["gpus"]))
            extra = ["logging.profile=true", f"logging.profile_step_start={start}",
                     f"logging.profile_step_end={end}", f"logging.profile_ranks={ranks}"]
        if args.max_iters:
            extra += shorten(entry["overrides"], args.max_iters)
        compile_spec(entry["base"], out, entry["overrides"] + extra + [
            f'logging.run_dir="{run_dir}"', f'logging.tensorboard_dir="{run_dir}/tensorboard"',
            f'checkpoint.save="{run_dir}/ckpt"', "checkpoint.save_at_end=false"])
        print(f"compiled {entry['name']} ({entry['gpus']} GPU) -> {out.relative_to(ROOT)}")
    if args.demo:
        out = ROOT / ".device" / "demo"
        if out.exists():
            shutil.rmtree(out)
        compile_spec("specs/demo-dlm.toml", out, [])
        print(f"compiled the demo -> {out.relative_to(ROOT)}")
        # The same demo in run and checkpoint directories of its own: the uninterrupted run
        # that bench/devbox/gpu/demo_resume.sh compares a stopped-and-resumed run with.
        ref = ROOT / ".device" / "demo-ref"
        if ref.exists():
            shutil.rmtree(ref)
        compile_spec("specs/demo-dlm.toml", ref, [
            'logging.run_dir="runs/demo-ref"', 'logging.tensorboard_dir="runs/demo-ref/tensorboard"',
            'checkpoint.save="runs/demo-ref/checkpoints"'])
        print(f"compiled the uninterrupted reference demo -> {ref.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
