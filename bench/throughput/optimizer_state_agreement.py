"""Loss agreement of the optimizer-state options with the fp32-state baseline: Qwen3-1.7B-architecture
masked-diffusion LM at sequence 4096, 200 steps each, the same seed, through the throughput harness's
compiled variants (bench/throughput/run.py :data:`MEGATRON_VARIANTS`), then
bench/throughput/loss_agreement.py on each variant's metrics.jsonl against the baseline's, with the
baseline rerun as the noise floor (the tolerance is the larger of loss_agreement's relative tolerance
and that floor).

    python bench/throughput/optimizer_state_agreement.py                 # on one GPU (H100 or H200)
    python bench/throughput/optimizer_state_agreement.py --dry           # CPU: compile every job, print the commands
    python bench/throughput/optimizer_state_agreement.py --layers local  # the local-layer variants against local-bf16

Jobs (``--layers te``, the default): ``te-bf16`` (baseline), ``te-bf16`` again (noise floor),
``te-bf16-precision-aware``, ``te-bf16-bf16-states``, ``te-bf16-bf16-grads``, ``te-bf16-cpu-offload``;
``--layers local``: ``local-bf16`` twice, ``local-bf16-bf16-states``, ``local-bf16-cpu-offload``
(Transformer Engine installed: megatron-core 0.16.1's precision-aware optimizer needs it on any
layers). Each runs ``--micro-batch-size`` (default 4) for ``--steps`` (default 200) iterations, no
warm-up, log interval 1. The result JSON (``<out>/throughput/<date>-<gpu>-optimizer-state-agreement-<layers>.json``,
default ``bench/results``) holds each variant's ``loss_agreement.check_files`` verdict, the
harness's throughput results beside it, and the commands. Exit 0 when every variant agrees, 1 when one does not, 2 on unreadable or
missing metrics.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loss_agreement  # noqa: E402
from run import MEGATRON_VARIANTS, job_name  # noqa: E402

HERE = Path(__file__).resolve().parent
VARIANTS: Dict[str, List[str]] = {
    "te": ["te-bf16-precision-aware", "te-bf16-bf16-states", "te-bf16-bf16-grads", "te-bf16-cpu-offload"],
    "local": ["local-bf16-bf16-states", "local-bf16-cpu-offload"],
}
BASELINE = {"te": "te-bf16", "local": "local-bf16"}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", choices=sorted(VARIANTS), default="te")
    p.add_argument("--variants", default=None, help="comma-separated variants (default: all of --layers)")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--rtol", type=float, default=loss_agreement.DEFAULT_RTOL)
    p.add_argument("--work-dir", default="/tmp/dlmspec-optimizer-state")
    p.add_argument("--out", default=None, help="results root (default bench/results)")
    p.add_argument("--timeout-s", type=float, default=1200.0, help="limit of one job")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--dry", action="store_true", help="compile every job and print the commands (CPU)")
    args = p.parse_args(argv)
    args.variants = args.variants.split(",") if args.variants else VARIANTS[args.layers]
    unknown = [v for v in args.variants if v not in MEGATRON_VARIANTS]
    if unknown:
        p.error(f"unknown variants {', '.join(unknown)} (bench/throughput/run.py MEGATRON_VARIANTS)")
    return args


def harness_command(args: argparse.Namespace, variants: List[str], work: Path, name: str) -> List[str]:
    """bench/throughput/run.py for ``variants`` at one micro batch, ``--steps`` logged steps, megatron only."""
    cmd = [args.python, str(HERE / "run.py"), "--sides", "megatron", "--megatron-variants", ",".join(variants),
           "--megatron-micro-batch-sizes", str(args.micro_batch_size), "--warmup", "0", "--steps", str(args.steps),
           "--seed", str(args.seed), "--work-dir", str(work), "--timeout-s", str(args.timeout_s),
           "--budget-s", str(args.timeout_s * (len(variants) + 1)), "--name", name, "--python", args.python]
    if args.out:
        cmd += ["--out", args.out]
    if args.dry:
        cmd += ["--dry", "--skip-import-check"]  # no GPU or Transformer Engine here: compile and check keywords only
    return cmd


def metrics(work: Path, variant: str, mbs: int) -> Path:
    """Where the harness leaves a compiled variant's metrics.jsonl (its run directory)."""
    return work / job_name("megatron", variant, mbs) / "metrics.jsonl"


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    base = BASELINE[args.layers]
    work = Path(args.work_dir)
    name = f"optimizer-state-agreement-{args.layers}"
    runs = [(work / "main", [base, *args.variants], name), (work / "noise", [base], name + "-noise")]
    codes = []
    for run_work, variants, run_name in runs:
        cmd = harness_command(args, variants, run_work, run_name)
        print(f"# {run_name}: {shlex.join(cmd)}", flush=True)
        codes.append(subprocess.call(cmd))
    mbs = args.micro_batch_size
    if args.dry:
        for variant in args.variants:
            print(f"# agreement: {shlex.join([args.python, str(HERE / 'loss_agreement.py'), str(metrics(work / 'main', base, mbs)), str(metrics(work / 'main', variant, mbs)), '--steps', str(args.steps), '--noise', str(metrics(work / 'noise', base, mbs))])}")
        return max(codes)
    verdicts: Dict[str, Any] = {}
    worst = 0
    for variant in args.variants:
        try:
            verdicts[variant] = loss_agreement.check_files(
                metrics(work / "main", base, mbs), metrics(work / "main", variant, mbs), steps=args.steps,
                rtol=args.rtol, noise=[metrics(work / "noise", base, mbs)])
            worst = max(worst, 0 if verdicts[variant]["agree"] else 1)
        except loss_agreement.MetricsError as exc:
            verdicts[variant] = {"error": str(exc)}
            worst = 2
        print(f"{variant}: {json.dumps(verdicts[variant].get('agree', verdicts[variant].get('error')))}")
    out = Path(args.out or HERE.parent / "results") / "throughput" / f"{name}.agreement.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"baseline": base, "micro_batch_size": mbs, "steps": args.steps, "seed": args.seed,
                               "harness_exit_codes": codes, "verdicts": verdicts,
                               "commands": [shlex.join(harness_command(args, v, w, n)) for w, v, n in runs]},
                              indent=2) + "\n", encoding="utf-8")
    print(f"result: {out}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
