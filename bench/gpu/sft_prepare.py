"""The inputs of ``bench/demos/sft_demo.sh``, made here on the CPU machine from the offline data kit
(``../shared/data``; the GPU machine does not see it): carry ``.data/`` and ``.device/sft-demo/`` along.

1. The demo's pre-training data and GPT-2 tokenizer (``bench/gpu/prepare.py demo_inputs``).
2. The demo's conversation set, through the path a user takes: ``bench/sft_conversations.py --run``
   writes ``.data/sft/{train,heldout}.jsonl`` from the Python-docs corpus (a paragraph and the
   instruction to quote its first sentence; held out: the validation documents) and runs
   ``dlmspec data prepare --sft`` (ChatML, ``--seq-length 512``) into
   ``.data/demo-sft-train_text_document`` and ``.data/demo-sft-heldout_text_document``. Existing
   datasets are kept.
3. ``specs/demo-dlm.toml`` and ``specs/demo-dlm-sft.toml`` compiled into ``.device/sft-demo/base``
   and ``.device/sft-demo/sft`` with run and checkpoint folders under ``runs/bench-sft-demo/``
   (the SFT run starts from the base run's checkpoints).

Usage: ``python bench/gpu/sft_prepare.py [--max-conversations N] [--pad-eos-tokens N [--variant NAME]]``

``--variant NAME`` compiles only a second SFT run, into ``.device/sft-demo/NAME`` with its run and
checkpoint folders under ``runs/bench-sft-demo/NAME`` (from the same base checkpoints), so that two
SFT settings can be fine-tuned side by side.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prepare import ROOT, compile_spec, demo_inputs  # noqa: E402

TRAIN, HELDOUT = ".data/demo-sft-train_text_document", ".data/demo-sft-heldout_text_document"
RUNS = "runs/bench-sft-demo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-conversations", type=int, default=None, help="cap each split (a quick CPU check)")
    parser.add_argument("--pad-eos-tokens", type=int, default=None,
                        help="stage.sft.pad_eos_tokens for the SFT run (unset: the spec's, every padding EOS "
                        "for mdm; an earlier GPU run's tuned demo then answered with EOS at once)")
    parser.add_argument("--variant", default=None,
                        help="compile only this SFT variant, into .device/sft-demo/VARIANT (run folder runs/bench-sft-demo/VARIANT)")
    args = parser.parse_args()
    for line in demo_inputs():
        print(line)
    if all((ROOT / (prefix + ext)).is_file() for prefix in (TRAIN, HELDOUT)
           for ext in (".bin", ".idx", "_response.bin", "_response.idx", ".dlmspec.json")):
        print(f"kept {TRAIN}, {HELDOUT}")
    else:
        # the conversations through the user's path: bench/sft_conversations.py writes the JSONL and
        # runs `dlmspec data prepare --sft` (ChatML, --seq-length 512) on it
        cmd = [sys.executable, str(ROOT / "bench" / "sft_conversations.py"), "--run"]
        if args.max_conversations:
            cmd += ["--max-train", str(args.max_conversations), "--max-heldout", str(args.max_conversations)]
        subprocess.run(cmd, check=True, cwd=ROOT)
    out = ROOT / ".device" / "sft-demo"
    name = args.variant or "sft"
    if args.variant:
        compile_spec("specs/demo-dlm-sft.toml", out / name, [
            f'logging.run_dir="{RUNS}/{name}"', f'logging.tensorboard_dir="{RUNS}/{name}/tensorboard"',
            f'checkpoint.save="{RUNS}/{name}/checkpoints"', f'checkpoint.init_from="mcore:{RUNS}/base/checkpoints"']
            + ([f"stage.sft.pad_eos_tokens={args.pad_eos_tokens}"] if args.pad_eos_tokens is not None else []))
        print(f"compiled -> {out.relative_to(ROOT)}/{name}")
        return
    compile_spec("specs/demo-dlm.toml", out / "base", [
        f'logging.run_dir="{RUNS}/base"', f'logging.tensorboard_dir="{RUNS}/base/tensorboard"',
        f'checkpoint.save="{RUNS}/base/checkpoints"'])
    compile_spec("specs/demo-dlm-sft.toml", out / "sft", [
        f'logging.run_dir="{RUNS}/sft"', f'logging.tensorboard_dir="{RUNS}/sft/tensorboard"',
        f'checkpoint.save="{RUNS}/sft/checkpoints"', f'checkpoint.init_from="mcore:{RUNS}/base/checkpoints"']
        + ([f"stage.sft.pad_eos_tokens={args.pad_eos_tokens}"] if args.pad_eos_tokens is not None else []))
    print(f"compiled -> {out.relative_to(ROOT)}/base, {out.relative_to(ROOT)}/sft")


if __name__ == "__main__":
    main()
