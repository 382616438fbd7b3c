"""The sampling suite: generation tokens/s of ``dlmspec``'s sampler on megatron-core against the
LLaDA-style Hugging Face loop (a full forward per step over the canvas), on a model trained in the
same run.

    python bench/sampling/run.py --gpus 1 --batches 1,8                 # train the demo briefly, then time
    python bench/sampling/run.py --ckpt runs/demo-dlm/checkpoints/iter_0000300   # time a trained checkpoint
    python bench/sampling/run.py --dry                                   # print the commands (CPU)

Steps (each a process started in the work directory, outside the checkout, with the installed dlmspec):

1. ``dlmspec compile SPEC`` (default ``specs/demo-dlm.toml``) with mock data (random tokens,
   ``NullTokenizer``), ``--train-iters`` iterations and a checkpoint at the end, then the compiled
   ``launch.sh`` (its ``train.py --check`` pass, then torchrun on ``--gpus`` GPUs). Left out with
   ``--ckpt``.
2. ``--prompts`` prompts of ``--prompt-tokens`` random ids (seed 0), as ``dlmspec generate`` reads them.
3. ``bench/sampling/generate_demo.py speed``: per batch size of ``--batches`` and per decoding rule
   (low-confidence, threshold 0.9), one warm-up and one timed generation of ``--gen-length`` tokens in
   ``--steps`` steps, blocks of ``--block-length``, each side (tokens/s = batch x gen_length / seconds),
   and the logit differences of the HF model against megatron-core (bidirectional and stock causal).

The result (``bench/schema.py``) goes to ``bench/results/sampling/<date>-<gpu>-<name>.json``; its
``values`` are the speed step's JSON plus the training settings.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402

ROOT = common.ROOT
SPEEDER = ROOT / "bench" / "sampling" / "generate_demo.py"
#: Mock data in place of the demo's corpus: the demo's GPT-2 vocabulary size, random tokens.
MOCK = ["data.mock=true", "data.train=[]", "data.valid=[]", 'data.tokenizer={type="NullTokenizer", vocab_size=50256}']


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common(p, precision=None)
    p.add_argument("--spec", default=str(ROOT / "specs" / "demo-dlm.toml"), help="the model to train (default the demo)")
    p.add_argument("--ckpt", default=None, help="time this checkpoint instead of training one")
    p.add_argument("--train-iters", type=int, default=100, help="iterations of the brief training (default 100)")
    p.add_argument("--batches", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--gen-length", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout-s", type=float, default=540, help="limit of each step (default 540)")
    args = p.parse_args(argv)
    try:
        args.batch_list = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        p.error(f"--batches {args.batches!r}: comma-separated integers, e.g. 1,8")
    if not args.batch_list or min(args.batch_list) < 1:
        p.error(f"--batches {args.batches!r}: batch sizes >= 1, e.g. 1,8")
    if args.train_iters < 1 or args.gen_length < 1 or args.steps < 1 or args.block_length < 1 or args.prompts < 1:
        p.error("--train-iters, --gen-length, --steps, --block-length and --prompts must be >= 1")
    if args.gen_length % args.block_length or (args.steps * args.block_length) % args.gen_length:
        p.error(f"--gen-length {args.gen_length} must be a multiple of --block-length {args.block_length}, and "
                "--steps split evenly over the blocks (e.g. --gen-length 128 --steps 128 --block-length 32)")
    if args.name and not all(c.isalnum() or c in "._-" for c in args.name):
        p.error("--name may hold letters, digits, '.', '_' and '-' only")
    return args


def plan(args: argparse.Namespace, work: Path) -> list[tuple[str, list[str], dict[str, str]]]:
    """``[(step, argv, extra env)]`` of the run."""
    steps = []
    ckpt = args.ckpt
    if ckpt is None:
        run_dir = work / "run"
        sets = MOCK + [f"train.train_iters={args.train_iters}", f"train.lr_warmup_iters={max(1, args.train_iters // 10)}",
                       f"train.eval_interval={args.train_iters}", "train.eval_iters=1",
                       f"checkpoint.save_interval={args.train_iters}", f'checkpoint.save="{run_dir}/checkpoints"',
                       f'logging.run_dir="{run_dir}"', f'logging.tensorboard_dir="{run_dir}/tensorboard"',
                       f"cluster.gpus_per_node={args.gpus}"]
        if args.gpu:
            sets.append(f'cluster.gpu="{args.gpu}"')
        compiled = work / "compiled"
        steps.append(("compile", [args.python, "-m", "dlmspec.cli", "compile", str(Path(args.spec).resolve()), "-o",
                                  str(compiled), "--force"] + [a for s in sets for a in ("--set", s)], {}))
        steps.append(("train", ["bash", str(compiled / "launch.sh")], {"DLMSPEC_PYTHON": args.python}))
        ckpt = str(run_dir / "checkpoints" / f"iter_{args.train_iters:07d}")
    steps.append(("speed", [args.python, str(SPEEDER), "speed", "--ckpt", str(ckpt), "--prompts", str(work / "prompts.jsonl"),
                            "--device", args.device, "--gen-length", str(args.gen_length), "--steps", str(args.steps),
                            "--block-length", str(args.block_length), "--batches", ",".join(map(str, args.batch_list)),
                            "--out", str(work / "speed.json")], {}))
    return steps


def write_prompts(path: Path, n: int, tokens: int, vocab: int = 50256) -> None:
    """``n`` prompts of ``tokens`` random ids below ``vocab`` (seed 0), one JSON object a line."""
    rng = random.Random(0)
    path.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(vocab) for _ in range(tokens)]}) + "\n"
                            for _ in range(n)))


def result_name(args: argparse.Namespace) -> str:
    model = Path(args.spec).stem if args.ckpt is None else "checkpoint"
    return (args.name or f"{model}-gen{args.gen_length}-b{'-'.join(map(str, args.batch_list))}").lower()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raw = list(sys.argv[1:] if argv is None else argv)
    slurm = common.maybe_slurm(args, raw, "sampling")
    if slurm is not None:
        return slurm
    work = common.work_dir(args, "sampling")
    steps = plan(args, work)
    if args.dry:
        for name, cmd, extra in steps:
            env = " ".join(f"{k}={v}" for k, v in extra.items())
            print(f"{name}: {(env + ' ') if env else ''}{common.show(cmd, work)}")
        print(f"result: {common.planned_path(args, 'sampling', result_name(args))}")
        return 0
    problem = common.check_installed(args.python, work)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    write_prompts(work / "prompts.jsonl", args.prompts, args.prompt_tokens)
    log = work / "sampling.log"
    record = {"steps": {}, "settings": {k: getattr(args, k) for k in ("spec", "ckpt", "train_iters", "batch_list", "gen_length",
                                                                      "steps", "block_length", "prompts", "prompt_tokens")}}
    status = "ok"
    for name, cmd, extra in steps:
        print(f"sampling: {name}: {common.show(cmd)}", flush=True)
        with open(log, "ab") as out:
            try:
                proc = subprocess.run(cmd, cwd=str(work), env=common.child_env(extra), stdout=out, stderr=subprocess.STDOUT,
                                      timeout=args.timeout_s)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        record["steps"][name] = {"command": common.show(cmd), "returncode": code}
        if code != 0:
            status = "failed"
            tail = log.read_text(errors="replace").splitlines()[-30:]
            record["steps"][name]["log_tail"] = tail
            print("\n".join(tail), file=sys.stderr)
            break
    speed = work / "speed.json"
    if status == "ok" and speed.exists():
        record.update(json.loads(speed.read_text()))
    elif status == "ok":
        status = "failed"
    path = common.finish(args, "sampling", result_name(args), [sys.executable, str(Path(__file__).resolve()), *raw],
                         record, status)
    if log.exists():
        import shutil

        shutil.copyfile(log, path.with_suffix(".log"))
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
