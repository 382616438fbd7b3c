"""The fast-sampling suite: block KV caches and parallel decoding of ``dlmspec generate`` against the
peers' loop and Fast-dLLM's own implementation, on a task model trained in the same run, with
held-out accuracy.

    python bench/sampling/fast_sampling.py --gpus 1                 # everything, one GPU, ~9 minutes
    python bench/sampling/fast_sampling.py --dry                    # print the plan; exit 2 if something is missing

The model measured (``--stage sft``, the default) is the one that learns the task: masked diffusion
pre-trained on the task text scores about 1 % held-out, the same model after SFT in LLaDA's layout
(prompt never masked, answer and the EODs after it masked) 62 %, in the CPU study of
``bench/sampling/task_learnability.py`` (``bench/results/sampling/task-learnability-cpu/``). So the run
pre-trains ``--spec`` briefly, tunes it with ``--sft-spec`` from that checkpoint and scores the tuned
model on the held-out prompts rendered with its chat template. The model part starts as the RL chain's
(``bench/devbox/gpu/task_rl.sh``, 96-98 % on one H100 within its budget): pre-training 400 iterations,
SFT ``--sft-iters`` (900) on rows of the SFT spec's ``train.seq_length`` (24: the rendered prompt and 8
tokens, the answer and the EODs after it). The suite then measures on a longer canvas (``--gen-length``
32 in blocks of 8, so the caches have blocks to reuse), and a model tuned on 8 positions does not answer
there: the 24 masked positions it never saw change its answer (on one H100: 94.5 % on its own 8 positions,
0.4 % on 32, ``bench/results/sampling/2026-12-07-h100-fast-*-sft-canvas8.md``; on CPU, 11.8 % against
3.0 %, ``bench/results/sampling/task-learnability-cpu/2026-12-07-*``). So a second SFT stage,
``--sft-canvas-iters`` (300), goes on from the first one's last checkpoint on rows of the measured canvas
(the prompt and ``--gen-length`` positions: 48 tokens), scored at ``--gen-length`` (in the CPU study 200
such steps took the score on 32 positions from 3.0 % to 23.4 %, where rows of 32 positions from the start
reached 3.6 % in 1,000). Each stage saves and scores its checkpoints every ``--sft-every`` (100; the
canvas stage at least three times), and the model measured is the canvas stage's checkpoint with the
highest validation score (``bench/sampling/rl_chain.py`` ``best_checkpoint``; the first stage's when the
canvas stage left none). ``--stage pretrain`` measures the pre-trained model on the raw prompts instead.

Steps (each a process started in the work directory, outside the checkout, with the installed dlmspec;
each prints progress with UTC timestamps; each worker rewrites its partial result under ``--out``
after every configuration, so a run stopped by its time limit still returns what it measured):

1. ``task``: ``dlmspec task make addition-padded --digits 3`` (prompts, answers, the pre-training text,
   the SFT pairs; ``--test`` held-out prompts, at least 500).
2. ``data-sft-train`` / ``data-sft-validation`` (``--stage sft``; in the background: :data:`BACKGROUND`
   says which step waits for each): ``dlmspec data prepare --sft`` of the SFT pairs with the SFT spec's chat template,
   ``--sft-seq-length`` tokens a row (default the SFT spec's ``train.seq_length``, 24: the rendered
   prompt, about 16, the answer and the EODs after it).
   ``data-sft-canvas-train`` / ``-validation``: the same pairs in rows of the measured canvas
   (``--sft-seq-length`` - the SFT spec's ``[generate] gen_length`` + ``--gen-length``: 48).
3. ``data-train`` / ``data-validation``: ``dlmspec data prepare`` of the task's pre-training text with
   GPT-2's BPE (``--tokenizer-dir``), end-of-document appended (it ends each answer).
4. ``render`` (``--stage sft``): the held-out and validation prompts rendered with the chat template
   (``fast_measure.py render``) into ``WORK/task-chat/``.
5. ``compile`` + ``train``: ``--spec`` (default ``specs/task-addition-dlm.toml``) on the task text, with
   ``model.qk_layernorm = false`` (LLaDA's modelling code, which Fast-dLLM runs, has no q/k norm),
   ``--train-iters`` iterations (``--stage sft``: 500), stopped by SIGTERM after ``--train-timeout-s``
   (the runtime saves a checkpoint on it).
6. ``compile-sft`` + ``train-sft`` (``--stage sft``): ``--sft-spec`` (default
   ``specs/task-addition-dlm-sft.toml``) from the pre-trained checkpoint (``checkpoint.init_from``),
   ``--sft-iters`` iterations (900), the same q/k-norm setting, stopped after ``--sft-timeout-s``;
   a checkpoint saved and scored every ``--sft-every`` iterations.
   ``compile-sft-canvas`` + ``train-sft-canvas`` (``--sft-canvas-iters`` > 0 and a canvas longer than
   the rows): the same spec from that run's last checkpoint on the canvas-long rows
   (``data-sft-canvas-*``, tokenised in the background), ``[generate]`` set to the measurement's
   ``gen_length`` / ``steps`` / ``block_length`` so that its scores are on the measured canvas, stopped
   after ``--sft-canvas-timeout-s``; its best scored checkpoint is measured.
7. ``peer-install``: the transformers Fast-dLLM pins (4.49.0) and its tokenizers/huggingface-hub,
   from ``--peer-wheels``, into ``--peer-site`` (only the peers' process puts it on its path).
8. ``measure-dlmspec``: ``fast_measure.py dlmspec`` on the scored model (dlmspec's sampler: no cache with low-confidence
   and threshold decoding, prefix and dual cache with threshold and factor decoding) and the LLaDA
   export of the model.
9. ``measure-peers``: ``fast_measure.py peers`` (the LLaDA ``generate.py``-style Hugging Face loop and
   Fast-dLLM's own no-cache, prefix-cache and dual-cache functions, ``--fast-dllm``, on the export).
10. ``report``: accuracy (exact match, Wilson 95 %), agreement, the targets beside the measured ratios,
   the table for docs/generate.md.

The result (``bench/schema.py``) goes to ``<out>/sampling/<date>-<gpu>-<name>.json`` with the table
beside it (``.md``) and the log (``.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import fast_kit  # noqa: E402
import rl_chain  # noqa: E402

ROOT = common.ROOT
MEASURE = ROOT / "bench" / "sampling" / "fast_measure.py"
#: Fast-dLLM's files the peers' process needs (bench/devbox/fetch_fast_dllm.sh writes them).
FAST_DLLM_FILES = ("COMMIT", "llada/generate.py", "llada/model/__init__.py", "llada/model/configuration_llada.py",
                   "llada/model/modeling_llada.py")
#: The wheels of the transformers Fast-dLLM's requirements.txt pins, and the two packages whose
#: versions that transformers checks at import.
PEER_WHEELS = ("transformers-4.49.0-", "tokenizers-0.21.", "huggingface_hub-0.")
FETCH = "bash bench/devbox/fetch_fast_dllm.sh"
Step = Tuple[str, List[str], Dict[str, str]]
#: Steps started in the background, and the step that waits for each (the SFT rows are tokenised in
#: one process, during the pre-training; the validation text beside the training text).
BACKGROUND = {"data-sft-train": "compile-sft", "data-sft-validation": "compile-sft", "data-validation": "compile",
              "data-sft-canvas-train": "compile-sft-canvas", "data-sft-canvas-validation": "compile-sft-canvas"}
#: Positions the SFT spec's rows generate when its ``[generate] gen_length`` is not written in it (the
#: task specs' 8: the answer and the EODs after it).
SFT_GEN_LENGTH_DEFAULT = 8
#: The training steps and the run folder each leaves its checkpoints in.
RUNS = {"train": "run", "train-sft": "run-sft", "train-sft-canvas": "run-sft-canvas"}
#: Pre-training iterations before the SFT stage when ``--train-iters`` is not given (the RL chain's:
#: ~85 s on one H100 with start-up, bench/results/rl/).
PRETRAIN_ITERS_BEFORE_SFT = 400
#: Seconds a training stopped by its time limit gets between SIGTERM (the runtime saves a checkpoint)
#: and SIGKILL.
STOP_GRACE_S = 45.0


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--spec", default=str(ROOT / "specs" / "task-addition-dlm.toml"),
                   help="the task model's pre-training spec")
    p.add_argument("--stage", choices=("sft", "pretrain"), default="sft",
                   help="the model measured: sft (default: pre-training, then SFT in LLaDA's layout from its "
                   "checkpoint, scored on prompts in its chat template) or pretrain (the pre-trained model, raw prompts)")
    p.add_argument("--sft-spec", default=str(ROOT / "specs" / "task-addition-dlm-sft.toml"),
                   help="the SFT stage's spec (--stage sft; it starts from the pre-trained checkpoint)")
    p.add_argument("--sft-iters", type=int, default=900,
                   help="iterations of the SFT stage (default 900: 74 %% on the validation prompts on an H100, 94.5 %% at "
                   "1,200, bench/results/sampling/2026-12-07-h100-fast-*-sft-canvas8-logs.tgz)")
    p.add_argument("--sft-every", type=int, default=100,
                   help="the SFT stage's save and scoring interval (default 100): its best scored checkpoint is measured")
    p.add_argument("--sft-seq-length", type=int, default=None,
                   help="tokens of an SFT row (default the SFT spec's train.seq_length, else 24: the rendered prompt, "
                   "~16, the answer and the EODs after it)")
    p.add_argument("--sft-canvas-iters", type=int, default=300,
                   help="iterations of a second SFT stage on rows as long as the measured canvas (the rendered prompt "
                   "and --gen-length positions), from the first stage's last checkpoint (default 300; 0: none). A "
                   "model tuned on 8 positions does not answer on 32: the masked positions it never saw change its "
                   "answer (bench/results/sampling/task-learnability-cpu/, *-canvas-*.json)")
    p.add_argument("--sft-canvas-timeout-s", type=float, default=95.0,
                   help="the second SFT stage's time limit (default 95: on an H100 an SFT run started in ~41 s, then "
                   "~0.075 s an iteration, ~1 s a scoring and ~2.5 s a save, and exited in ~6 s)")
    p.add_argument("--chat-template", default=None,
                   help="the SFT chat template (default the SFT spec's [stage.sft] chat_template, else plain)")
    p.add_argument("--train-timeout-s", type=float, default=None,
                   help="stop the pre-training (SIGTERM: it saves a checkpoint) after this many seconds "
                   "(default 115 with --stage sft, else only the budget: 400 iterations took 101-110 s with a 55 s start-up on an H100, bench/results/sampling/2026-12-07-h100-fast-*.md)")
    p.add_argument("--sft-timeout-s", type=float, default=150.0,
                   help="the same for the SFT stage (default 150: on an H100 1,200 iterations and 12 scorings took 165 s; "
                   "900 iterations, 9 scorings and 3 saves come to ~130 s at the timings of --sft-canvas-timeout-s)")
    p.add_argument("--task", default="addition-padded",
                   help="dlmspec task make's task (default addition-padded: fixed width, the learnable variant)")
    p.add_argument("--task-args", default="--digits 3",
                   help="more arguments of dlmspec task make, one string (default '--digits 3')")
    p.add_argument("--test", type=int, default=512, help="held-out prompts made and scored (default 512, at least 500)")
    p.add_argument("--train-iters", type=int, default=None, help="iterations of the training (default the spec's)")
    p.add_argument("--ckpt", default=None, help="measure this checkpoint; skip task data preparation and training "
                   "(--task-dir must then hold the task)")
    p.add_argument("--task-dir", default=None, help="an existing task folder (default: made in the work directory)")
    p.add_argument("--data-workers", type=int, default=8, help="tokenizer processes of data prepare (default 8)")
    p.add_argument("--batches", default="1,8,32")
    p.add_argument("--gen-length", type=int, default=32,
                   help="generated tokens (default 32: the answer, at most 7 tokens, in the first of 4 blocks)")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--block-length", type=int, default=8)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--factor", type=float, default=1.0)
    p.add_argument("--cache-refresh", type=int, default=None, help="dlmspec's cache_refresh (default the sampler's)")
    p.add_argument("--repeats", type=int, default=3, help="timed generations per batch (the median is kept)")
    p.add_argument("--eval-batch", type=int, default=128)
    p.add_argument("--dlmspec-set", action="append", default=[], metavar="KEY=JSON",
                   help="another [generate] key for every dlmspec configuration")
    p.add_argument("--only", default="", help="comma-separated configuration names (default all)")
    p.add_argument("--with-compile", action="store_true", help="also dlmspec with [generate] compile = true (CUDA "
                   "graphs): none/low_confidence, prefix/threshold, dual/threshold, after all the others")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget-s", type=float, default=545, help="wall-clock budget of the whole run (default 545)")
    p.add_argument("--measure-reserve-s", type=float, default=115,
                   help="seconds kept for the measurements: the steps before them (training) are stopped when they "
                   "would eat into it (default 115; both measurements took 90-115 s on an H100; the report has 30 s more)")
    p.add_argument("--fast-dllm", default=str(ROOT / ".bench-peers" / "fast-dllm"), help="Fast-dLLM's files")
    p.add_argument("--peer-wheels", default=str(ROOT / ".bench-peers" / "wheels"), help="transformers 4.49.0 & co.")
    p.add_argument("--peer-site", default=None, help="where the peer wheels are installed (default WORK/peer-site)")
    p.add_argument("--tokenizer-dir", default=str(ROOT / ".bench-data" / "gpt2"), help="GPT-2's vocab.json, merges.txt")
    args = p.parse_args(argv)
    try:
        args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches {args.batches!r}: comma-separated integers, e.g. 1,8,32")
    if not args.batch_list or min(args.batch_list) < 1:
        p.error(f"--batches {args.batches!r}: batch sizes >= 1, e.g. 1,8,32")
    if args.test < 500:
        p.error(f"--test {args.test}: at least 500 held-out prompts (the accuracy's interval needs them), e.g. --test 512")
    if min(args.gen_length, args.steps, args.block_length, args.repeats, args.eval_batch) < 1:
        p.error("--gen-length, --steps, --block-length, --repeats and --eval-batch must be >= 1")
    if args.gen_length % args.block_length or args.steps % (args.gen_length // args.block_length):
        p.error(f"--gen-length {args.gen_length} must be a multiple of --block-length {args.block_length}, and --steps "
                "split evenly over the blocks (e.g. --gen-length 32 --steps 32 --block-length 8)")
    if args.ckpt and not args.task_dir:
        p.error("--ckpt needs --task-dir (the task folder the checkpoint was trained on)")
    if args.sft_canvas_iters < 0:
        p.error(f"--sft-canvas-iters {args.sft_canvas_iters}: 0 (no second SFT stage) or more, e.g. 300")
    if min(args.sft_iters, args.sft_every, args.sft_seq_length if args.sft_seq_length is not None else 1) < 1:
        p.error("--sft-iters, --sft-every and --sft-seq-length must be >= 1, e.g. --sft-iters 900 --sft-every 100 "
                "--sft-seq-length 24")
    if args.stage == "sft" and args.ckpt is None:
        if args.train_iters is None:
            args.train_iters = PRETRAIN_ITERS_BEFORE_SFT
        if args.train_timeout_s is None:
            args.train_timeout_s = 115.0
        if args.sft_seq_length is None:
            length = spec_table(args.sft_spec, "train", "seq_length")
            args.sft_seq_length = length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else 24
        sft_gen = spec_table(args.sft_spec, "generate", "gen_length")
        args.sft_gen_length = sft_gen if isinstance(sft_gen, int) and not isinstance(sft_gen, bool) and sft_gen > 0 \
            else SFT_GEN_LENGTH_DEFAULT
        # the measured canvas: the rows' prompt part (seq_length - the positions they generate) + gen_length
        args.sft_canvas_seq_length = args.sft_seq_length - args.sft_gen_length + args.gen_length
        if args.sft_canvas_seq_length == args.sft_seq_length:
            args.sft_canvas_iters = 0  # the first stage's rows are the measured canvas already
        if args.chat_template is None:
            stage = spec_table(args.sft_spec, "stage", "sft")
            template = stage.get("chat_template") if isinstance(stage, dict) else None
            args.chat_template = template if isinstance(template, str) and template else "plain"
    if args.name and not all(c.isalnum() or c in "._-" for c in args.name):
        p.error("--name may hold letters, digits, '.', '_' and '-' only")
    try:
        fast_kit.configs_of("dlmspec", [x for x in args.only.split(",") if x])
    except ValueError as exc:
        p.error(f"--only: {exc}")
    return args


def measure_flags(args: argparse.Namespace) -> List[str]:
    flags = ["--device", args.device, "--gen-length", str(args.gen_length), "--steps", str(args.steps),
             "--block-length", str(args.block_length), "--threshold", str(args.threshold), "--factor", str(args.factor),
             "--batches", ",".join(map(str, args.batch_list)), "--repeats", str(args.repeats),
             "--eval-prompts", str(args.test), "--eval-batch", str(args.eval_batch)]
    if args.cache_refresh is not None:
        flags += ["--cache-refresh", str(args.cache_refresh)]
    if args.only:
        flags += ["--only", args.only]
    return flags


def plan(args: argparse.Namespace, work: Path, out: Path) -> List[Step]:
    """``[(step, argv, extra env)]`` of the run (the workers' ``--deadline`` is added when they start)."""
    py, cli = args.python, [args.python, "-m", "dlmspec.cli"]
    tok = Path(args.tokenizer_dir).resolve()
    task_dir = Path(args.task_dir).resolve() if args.task_dir else work / "task"
    steps: List[Step] = []
    ckpt = args.ckpt
    measured_task_dir = task_dir
    sft = args.stage == "sft" and ckpt is None
    tokenizer_flags = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(tok / "vocab.json"),
                       "--merge-file", str(tok / "merges.txt")]
    if ckpt is None:
        if not args.task_dir:
            # --force: the work directory is this launcher's own (a rerun on a warm machine replaces its files)
            steps.append(("task", cli + ["task", "make", args.task, "--out", str(task_dir), "--seed", "0",
                                         "--test", str(args.test), "--force"] + args.task_args.split(), {}))
        if sft:  # LLaDA's SFT layout: the prompt in the chat template, the answer and the EODs after it
            lengths = [("sft", args.sft_seq_length)] + ([("sft-canvas", args.sft_canvas_seq_length)]
                                                        if args.sft_canvas_iters else [])
            for kind, length in lengths:
                for split in ("train", "validation"):
                    steps.append((f"data-{kind}-{split}", cli + [
                        "data", "prepare", "--sft", "--chat-template", args.chat_template,
                        "--input", str(task_dir / f"sft-{split}.jsonl"),
                        "--output-prefix", str(work / "data" / f"task-{kind}-{split}"),
                        *tokenizer_flags, "--seq-length", str(length), "--force"], {}))
        for split in ("train", "validation"):
            steps.append((f"data-{split}", cli + [
                "data", "prepare", "--input", str(task_dir / f"pretrain-{split}.jsonl"),
                "--output-prefix", str(work / "data" / f"task-{split}"), "--tokenizer-type", "GPT2BPETokenizer",
                "--vocab-file", str(tok / "vocab.json"), "--merge-file", str(tok / "merges.txt"), "--append-eod",
                "--workers", str(args.data_workers if split == "train" else 1), "--force"], {}))
        if sft:
            measured_task_dir = work / "task-chat"
            steps.append(("render", [py, str(MEASURE), "render", "--template", args.chat_template, "--task-dir",
                                     str(task_dir), "--out", str(measured_task_dir)], {}))
        run_dir = work / "run"
        sets = [f'data.train=[{{prefix="{work}/data/task-train_text_document", weight=1.0}}]',
                f'data.valid=[{{prefix="{work}/data/task-validation_text_document", weight=1.0}}]',
                f'data.tokenizer={{type="GPT2BPETokenizer", vocab_file="{tok}/vocab.json", merge_file="{tok}/merges.txt"}}',
                "model.qk_layernorm=false", f'checkpoint.save="{run_dir}/checkpoints"',
                f'logging.run_dir="{run_dir}"', f'logging.tensorboard_dir="{run_dir}/tensorboard"',
                f"cluster.gpus_per_node={args.gpus}"]
        if spec_table(args.spec, "eval", "generation") is not None:  # scored on the validation split, once, at the end
            sets += [f'eval.generation.prompts="{task_dir}/validation.jsonl"', "eval.generation.max_prompts=200"]
        iters = args.train_iters or spec_table(args.spec, "train", "train_iters")
        if args.train_iters:
            sets += [f"train.train_iters={iters}", f"train.lr_warmup_iters={max(1, iters // 10)}"]
        if isinstance(iters, int) and iters > 0:  # a checkpoint half-way too: a training stopped by the time limit still leaves a model to measure
            sets += [f"checkpoint.save_interval={max(1, iters // 2)}", f"train.eval_interval={iters}"]
        if args.gpu:
            sets.append(f'cluster.gpu="{args.gpu}"')
        compiled = work / "compiled"
        steps.append(("compile", cli + ["compile", str(Path(args.spec).resolve()), "-o", str(compiled), "--force"]
                      + [a for s in sets for a in ("--set", s)], {}))
        steps.append(("train", ["bash", str(compiled / "launch.sh")], {"DLMSPEC_PYTHON": py}))
        ckpt = str(run_dir / "checkpoints")  # the latest checkpoint of the run
        if sft:
            def sft_stage(stage: str, init: Path, seq_length: int, iters: int, every: int, save_every: int,
                          more: List[str]) -> Path:
                """The compile and train steps of SFT stage ``stage`` (its rows ``data/task-STAGE-*``,
                started from ``init``'s latest checkpoint, run folder ``RUNS["train-STAGE"]``, scored
                every ``every`` and saved every ``save_every`` iterations); returns the run folder."""
                run = work / RUNS[f"train-{stage}"]
                stage_sets = [f'data.train=[{{prefix="{work}/data/task-{stage}-train_text_document", weight=1.0}}]',
                              f'data.valid=[{{prefix="{work}/data/task-{stage}-validation_text_document", weight=1.0}}]',
                              sets[2], "model.qk_layernorm=false", f'checkpoint.init_from="mcore:{init}/checkpoints"',
                              f'checkpoint.save="{run}/checkpoints"', f'logging.run_dir="{run}"',
                              f'logging.tensorboard_dir="{run}/tensorboard"', f"cluster.gpus_per_node={args.gpus}",
                              f"train.seq_length={seq_length}", f"train.train_iters={iters}",
                              f"checkpoint.save_interval={save_every}", f"train.eval_interval={every}", *more]
                if spec_table(args.sft_spec, "eval", "generation") is not None:  # validation prompts in the template
                    stage_sets += [f'eval.generation.prompts="{measured_task_dir}/validation.jsonl"',
                                   "eval.generation.max_prompts=200"]
                if args.gpu:
                    stage_sets.append(f'cluster.gpu="{args.gpu}"')
                compiled_stage = work / f"compiled-{stage}"
                steps.append((f"compile-{stage}", cli + ["compile", str(Path(args.sft_spec).resolve()), "-o",
                                                         str(compiled_stage), "--force"]
                              + [a for s in stage_sets for a in ("--set", s)], {}))
                steps.append((f"train-{stage}", ["bash", str(compiled_stage / "launch.sh")], {"DLMSPEC_PYTHON": py}))
                return run

            # followed by the canvas stage, the first stage hands on its last checkpoint: saved three times
            # (a save costs ~2.5 s on an H100), not at every score
            canvas = bool(args.sft_canvas_iters)
            sft_dir = sft_stage("sft", run_dir, args.sft_seq_length, args.sft_iters, args.sft_every,
                                max(1, args.sft_iters // 3) if canvas else args.sft_every, [])
            ckpt = str(sft_dir / "checkpoints")
            if args.sft_canvas_iters:  # the second stage: rows as long as the measured canvas, scored on it
                n = args.sft_canvas_iters
                every = max(1, min(args.sft_every, n // 3))
                canvas_dir = sft_stage("sft-canvas", sft_dir, args.sft_canvas_seq_length, n, every, every,
                                       [f"train.lr_warmup_iters={max(1, n // 10)}", f"generate.gen_length={args.gen_length}",
                                        f"generate.steps={args.steps}", f"generate.block_length={args.block_length}"])
                ckpt = str(canvas_dir / "checkpoints")
    site = Path(args.peer_site) if args.peer_site else work / "peer-site"
    steps.append(("peer-install", [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                   "--no-cache-dir", "--upgrade", "--target", str(site), "--find-links",
                                   str(Path(args.peer_wheels).resolve()), "transformers==4.49.0", "tokenizers<0.22",
                                   "huggingface-hub<1.0"], {}))
    flags = measure_flags(args)
    llada = work / "llada-hf"
    sets_d = [a for s in args.dlmspec_set for a in ("--dlmspec-set", s)]
    steps.append(("measure-dlmspec", [py, str(MEASURE), "dlmspec", "--work", str(work), "--partial",
                                      str(out / "fast-sampling-dlmspec.json"), "--ckpt", ckpt, "--task-dir",
                                      str(measured_task_dir), "--llada-out", str(llada)] + flags + sets_d
                  + (["--with-compile"] if args.with_compile else []), {}))
    steps.append(("measure-peers", [py, str(MEASURE), "peers", "--work", str(work), "--partial",
                                    str(out / "fast-sampling-peers.json"), "--llada", str(llada), "--fast-dllm",
                                    str(Path(args.fast_dllm).resolve())] + flags,
                  # the pinned transformers first on the path, only in this process
                  {"PYTHONPATH": os.pathsep.join(x for x in (str(site), common.child_env().get("PYTHONPATH", "")) if x)}))
    return steps


def spec_table(spec: str, table: str, key: str) -> Any:
    """``[table] key`` as written in the spec file (``None`` when absent or unreadable: compile then
    says why)."""
    import tomllib

    try:
        with open(spec, "rb") as f:
            section = tomllib.load(f).get(table, {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return section.get(key) if isinstance(section, dict) else None


def trained_checkpoint(work: Path, run: str = "run") -> bool:
    """Whether the run ``work/run`` left a checkpoint (``iter_*/dlmspec.json``) to measure or start from."""
    return any((work / run / "checkpoints").glob("iter_*/dlmspec.json"))


def with_measured_checkpoint(cmd: List[str], work: Path, record: Dict[str, Any]) -> List[str]:
    """``cmd`` (``fast_measure.py dlmspec ... --ckpt DIR``) with ``--ckpt`` the last SFT stage's checkpoint
    of the highest validation accuracy (:func:`rl_chain.best_checkpoint`, as the RL chain scores its SFT
    checkpoints): the canvas stage's when it left a scored checkpoint, else the first stage's; the choice
    and every candidate go to ``record["measured-model"]``."""
    runs = [r for r in (RUNS["train-sft-canvas"], RUNS["train-sft"]) if (work / r).is_dir()] or [RUNS["train-sft"]]
    for run in runs:  # the first with a scored checkpoint, else the last tried
        choice = {"run": run, **rl_chain.best_checkpoint(work / run)}
        if choice["iteration"] is not None:
            break
    record["measured-model"] = choice
    out = list(cmd)
    if "--ckpt" in out:
        out[out.index("--ckpt") + 1] = choice["checkpoint"]
    print(f"measured model: {choice['checkpoint']} ({choice['rule']}; validation accuracy {choice['accuracy']})",
          flush=True)
    return out


#: ``(cmd, cwd, env, log, limit, grace) -> (exit code, stopped by the limit)``: SIGTERM at the limit
#: (a training saves a checkpoint on it), SIGKILL ``grace`` seconds later (bench/common.py).
run_step = common.run_limited


def task_cli_available(python: str) -> Optional[str]:
    """``None`` when ``python -m dlmspec.cli task make --help`` works (the task generator is
    installed), else why not."""
    try:
        proc = subprocess.run([python, "-m", "dlmspec.cli", "task", "make", "--help"], capture_output=True, text=True,
                              timeout=120, cwd="/", env=common.child_env())
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{python} did not start: {exc}"
    if proc.returncode != 0:
        return "this dlmspec has no `dlmspec task make` (the task generator): install a dlmspec that has it"
    return None


def missing(args: argparse.Namespace, probe: Callable[[str], Optional[str]] = task_cli_available) -> List[Tuple[str, str]]:
    """``[(what is missing, the command that gets it)]`` for the run (empty: everything is present)."""
    out: List[Tuple[str, str]] = []
    fd = Path(args.fast_dllm)
    for name in FAST_DLLM_FILES:
        if not (fd / name).is_file():
            out.append((f"Fast-dLLM's {name} under {fd}", FETCH))
    wheels = Path(args.peer_wheels)
    present = [p.name for p in wheels.glob("*.whl")] if wheels.is_dir() else []
    for prefix in PEER_WHEELS:
        if not any(n.startswith(prefix) for n in present):
            out.append((f"the wheel {prefix}* under {wheels}", FETCH))
    tok = Path(args.tokenizer_dir)
    if args.ckpt is None:
        for name in ("vocab.json", "merges.txt"):
            if not (tok / name).is_file():
                out.append((f"GPT-2's {name} under {tok}", FETCH))
        if not Path(args.spec).is_file():
            out.append((f"the spec {args.spec}", "a dlmspec checkout with specs/task-addition-dlm.toml, or --spec FILE"))
        if args.stage == "sft" and not Path(args.sft_spec).is_file():
            out.append((f"the SFT spec {args.sft_spec}", "a dlmspec checkout with specs/task-addition-dlm-sft.toml, "
                        "or --sft-spec FILE (or --stage pretrain)"))
        if not args.task_dir:
            why = probe(args.python)
            if why:
                out.append((why, "pip install a dlmspec with the task generator (bench/devbox/fetch_wheels.sh builds its wheel)"))
    elif args.task_dir and not (Path(args.task_dir) / "test.jsonl").is_file():
        out.append((f"the held-out prompts {args.task_dir}/test.jsonl", "dlmspec task make addition --out DIR"))
    return out


def result_name(args: argparse.Namespace) -> str:
    model = (Path(args.sft_spec if args.stage == "sft" else args.spec).stem) if args.ckpt is None else "checkpoint"
    return (args.name or f"fast-{model}-gen{args.gen_length}-b{'-'.join(map(str, args.batch_list))}").lower()


def settings(args: argparse.Namespace) -> Dict[str, Any]:
    sft = args.stage == "sft" and args.ckpt is None
    return {"spec": str(args.spec), "stage": args.stage if args.ckpt is None else "checkpoint",
            "sft_spec": str(args.sft_spec) if sft else None, "sft_iters": args.sft_iters if sft else None,
            "sft_seq_length": args.sft_seq_length if sft else None, "sft_every": args.sft_every if sft else None,
            "sft_canvas_iters": args.sft_canvas_iters if sft else None,
            "sft_canvas_seq_length": args.sft_canvas_seq_length if sft and args.sft_canvas_iters else None,
            "sft_canvas_timeout_s": args.sft_canvas_timeout_s if sft and args.sft_canvas_iters else None,
            "measured_checkpoint": "the last SFT stage's checkpoint with the highest validation accuracy (the canvas "
            "stage's, else the first stage's; rl_chain.py best_checkpoint)" if sft else None, "chat_template": args.chat_template if sft else None,
            "scored_model": ("SFT (LLaDA's layout) from the pre-trained checkpoint, then on rows of the measured canvas; "
                             "held-out prompts in its chat template" if sft and args.sft_canvas_iters else
                             "SFT (LLaDA's layout) from the pre-trained checkpoint; held-out prompts in its chat template"
                             if sft else "pre-trained on the task text; raw held-out prompts" if args.ckpt is None
                             else "the given checkpoint"),
            "train_timeout_s": args.train_timeout_s, "sft_timeout_s": args.sft_timeout_s if sft else None,
            "task": args.task, "task_args": args.task_args, "held_out": args.test,
            "train_iters": args.train_iters, "batches": args.batch_list, "gen_length": args.gen_length,
            "steps": args.steps, "block_length": args.block_length, "threshold": args.threshold, "factor": args.factor,
            "cache_refresh": args.cache_refresh, "repeats": args.repeats, "eval_batch": args.eval_batch,
            "temperature": 0.0, "eos_early_exit": False, "dlmspec_set": args.dlmspec_set,
            "with_compile": args.with_compile,
            "tokens_counted": "batch x gen_length (every implementation decodes every position)"}


def _missing_parts(entry: Optional[Dict[str, Any]], batches: List[int]) -> List[str]:
    """What a configuration's result lacks (empty: complete)."""
    if not entry:
        return ["not run"]
    if entry.get("skipped"):
        return [f"skipped: {entry['skipped']}"]
    out = [f"timing b{b}" for b in batches if str(b) not in entry.get("timing", {})]
    if not entry.get("accuracy"):
        out.append("accuracy")
    return out + list(entry.get("cut", [])) + list(entry.get("errors", []))


def _wait_background(background: Dict[str, Tuple[subprocess.Popen, float, Any, Path]], record: Dict[str, Any],
                     until: float, log: Path, t0: float) -> List[str]:
    """Wait (until the epoch second ``until``) for the background steps, append their logs to ``log``
    and record each; returns the names of those that failed or did not finish."""
    failed = []
    for name, (proc, start, fh, bg_log) in background.items():
        try:
            code: Optional[int] = proc.wait(timeout=max(1.0, until - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            record[name]["note"] = "killed: not done before the training's share of the budget ended"
        fh.close()
        record[name].update(returncode=code, seconds=round(time.time() - start, 1))
        with open(log, "ab") as out:
            out.write(f"\n===== {name} (background): {record[name]['command']}\n".encode())
            out.write(bg_log.read_bytes())
        print(fast_kit.stamp(t0, f"{name}: exit {code} after {record[name]['seconds']:.0f}s"), flush=True)
        if code != 0:
            record[name]["log_tail"] = bg_log.read_text(errors="replace").splitlines()[-25:]
            failed.append(name)
    return failed


def main(argv: Optional[List[str]] = None, probe: Callable[[str], Optional[str]] = task_cli_available) -> int:
    t0 = time.time()
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    slurm = common.maybe_slurm(args, raw, "sampling")
    if slurm is not None:
        return slurm
    work = common.work_dir(args, "fast-sampling")
    out = common.results_root(args)
    steps = plan(args, work, out)
    lacking = missing(args, probe)
    if args.dry:
        common.print_dry(steps + [("report", [args.python, str(MEASURE), "report", "--work", str(work), "..."], {})], work,
                         common.planned_path(args, "sampling", result_name(args)))
        for what, how in lacking:
            print(f"missing: {what}; get it with: {how}", file=sys.stderr)
        return 2 if lacking else 0
    if lacking:
        for what, how in lacking:
            print(f"error: missing {what}; get it with: {how}", file=sys.stderr)
        return 2
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    log = work / "fast-sampling.log"
    deadline = t0 + args.budget_s
    record: Dict[str, Any] = {}
    status = "ok"
    reserve_report = 30.0
    background: Dict[str, Tuple[subprocess.Popen, float, Any, Path]] = {}
    for name, cmd, extra in steps:
        now = time.time()
        left = deadline - now - reserve_report
        if name in BACKGROUND:  # its own log; waited for before AFTER_BACKGROUND
            bg_log = work / f"{name}.log"
            fh = open(bg_log, "wb")
            print(fast_kit.stamp(t0, f"{name} (background): {common.show(cmd)}"), flush=True)
            background[name] = (subprocess.Popen(cmd, cwd=str(work), env=common.child_env(dict(extra)), stdout=fh,
                                                 stderr=subprocess.STDOUT), time.time(), fh, bg_log)
            record[name] = {"command": common.show(cmd), "background": True}
            continue
        waited = {b: background.pop(b) for b in [b for b in background if BACKGROUND[b] == name]}
        if waited:
            failed = _wait_background(waited, record, deadline - reserve_report - args.measure_reserve_s, log, t0)
            if failed:
                status = "failed"
                print(fast_kit.stamp(t0, f"{', '.join(failed)} failed: {name} needs its output"), flush=True)
                break
        if left < 15:
            record[name] = {"command": common.show(cmd), "returncode": None, "skipped": "out of time"}
            status = "partial"
            print(fast_kit.stamp(t0, f"{name}: skipped, {left:.0f}s left"), flush=True)
            continue
        env = dict(extra)
        if not name.startswith("measure-") and name != "peer-install":
            left -= args.measure_reserve_s
            if left < 15:
                record[name] = {"command": common.show(cmd), "returncode": None, "skipped": "out of time"}
                status = "failed"
                print(fast_kit.stamp(t0, f"{name}: no time left before the measurement's reserve"), flush=True)
                break
        if name == "measure-dlmspec":
            left = left * 0.55 if "measure-peers" in [s[0] for s in steps] else left
            if args.stage == "sft" and args.ckpt is None:
                cmd = with_measured_checkpoint(cmd, work, record)
        if name.startswith("measure-"):
            cmd = cmd + ["--deadline", f"{now + left - 25:.0f}"]
        grace = 5.0
        own_limit = {"train": args.train_timeout_s, "train-sft": args.sft_timeout_s if args.stage == "sft" else None,
                     "train-sft-canvas": args.sft_canvas_timeout_s}
        if own_limit.get(name) is not None and own_limit[name] < left - STOP_GRACE_S:
            left, grace = own_limit[name], STOP_GRACE_S  # stopped by SIGTERM: the runtime saves a checkpoint
        elif name in own_limit:
            left, grace = max(15.0, left - STOP_GRACE_S), STOP_GRACE_S
        print(fast_kit.stamp(t0, f"{name}: {common.show(cmd)} (limit {left:.0f}s)"), flush=True)
        start = time.time()
        with open(log, "ab") as fh:
            fh.write(f"\n===== {name}: {common.show(cmd)}\n".encode())
            fh.flush()
            code, stopped = run_step(cmd, work, common.child_env(env), fh, left, grace)
        record[name] = {"command": common.show(cmd), "returncode": code, "seconds": round(time.time() - start, 1)}
        if stopped:
            record[name]["stopped_at_s"] = round(left)
        print(fast_kit.stamp(t0, f"{name}: exit {code}{' (stopped by its limit)' if stopped else ''} after "
                                 f"{time.time() - start:.0f}s"), flush=True)
        if code != 0:
            record[name]["log_tail"] = log.read_text(errors="replace").splitlines()[-25:]
            print("\n".join(record[name]["log_tail"]), file=sys.stderr, flush=True)
            run = RUNS.get(name)
            if run and trained_checkpoint(work, run):
                status = "partial"  # stopped by its limit after a checkpoint: go on from / measure that one
                record[name]["note"] = "stopped before its last iteration; its latest checkpoint is used"
                continue
            if not name.startswith("measure-"):
                status = "failed"
                break
            status = "partial"
    for name, (proc, _, fh, _) in background.items():  # a run stopped early: no tokeniser left behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        fh.close()
    values: Dict[str, Any] = {"steps": record, "settings": settings(args)}
    partials = [str(out / "fast-sampling-dlmspec.json"), str(out / "fast-sampling-peers.json")]
    report_json, planned = work / "report.json", common.planned_path(args, "sampling", result_name(args))
    rep = [args.python, str(MEASURE), "report", "--work", str(work), "--partials", *partials,
           "--settings", json.dumps(settings(args)), "--out", str(report_json), "--table", str(planned.with_suffix(".md"))]
    planned.parent.mkdir(parents=True, exist_ok=True)
    try:
        code = subprocess.run(rep, cwd=str(work), env=common.child_env(), timeout=max(30.0, deadline + 20 - time.time())
                              ).returncode
    except subprocess.TimeoutExpired:
        code = None
    record["report"] = {"command": common.show(rep[:5] + ["..."]), "returncode": code}
    if code == 0 and report_json.exists():
        values.update(json.loads(report_json.read_text()))
    elif status == "ok":
        status = "partial"
    # what the run did not measure: a configuration skipped, cut by the deadline, failed, or unscored
    values["incomplete"] = {c.name: _missing_parts(values.get("configs", {}).get(c.name), args.batch_list)
                            for c in (fast_kit.ALL_CONFIGS if args.with_compile else fast_kit.CONFIGS)
                            if (not args.only or c.name in args.only.split(","))}
    values["incomplete"] = {k: v for k, v in values["incomplete"].items() if v}
    if values["incomplete"] and status == "ok":
        status = "partial"
    path = common.finish(args, "sampling", result_name(args), [sys.executable, str(Path(__file__).resolve()), *raw],
                         values, status, notes="fast sampling: block caches and parallel decoding, task model, "
                         "held-out accuracy (bench/sampling/fast_sampling.py)")
    if log.exists():
        import shutil

        shutil.copyfile(log, path.with_suffix(".log"))
    print(fast_kit.stamp(t0, f"done: {status}; {path}"), flush=True)
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
