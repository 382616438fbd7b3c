"""The throughput suite: dlmspec's megatron-core runtime against Hugging Face peers (plain
transformers, Liger Kernel, torch.compile, torchao fp8), side by side, in one invocation on one GPU
machine. Start it with an installed dlmspec (``pip install .`` or a wheel; the child jobs run outside
the checkout and import the installed package).

    python bench/throughput/run.py --model qwen3-1.7b --gpus 1 --precision bf16 --peers plain,liger
    python bench/throughput/run.py --dry        # print the commands and the result path (CPU)
    python bench/throughput/run.py --slurm      # the same as an sbatch job on one node

The result goes to ``bench/results/throughput/<date>-<gpu>-<name>.json`` (``--out`` for another
root) in the schema of ``bench/schema.py``: its ``values`` hold everything below. ``--precision
bf16`` runs the compiled ``local-bf16`` megatron variant, ``fp8`` the ``te-fp8`` one (Transformer
Engine), unless ``--megatron-variants`` names others.

For each micro batch of ``--megatron-micro-batch-sizes`` a fresh process runs
``bench/runtime/train_reference.py --preset qwen3-1.7b --objective mdm`` (the hand-written
reference of the compiled train.py: Qwen3-1.7B architecture, masked diffusion, bf16, local
layer spec with SDPA attention, megatron's distributed optimizer; mock data) for ``--warmup +
--steps`` iterations with ``--log-interval 1``; its ``metrics.jsonl`` gives one ``step_time_s``
per iteration. For each micro batch of ``--hf-micro-batch-sizes`` a fresh process runs
``bench/throughput/hf_baseline.py`` (see its docstring: transformers Qwen3, SDPA, bidirectional,
pure bf16 with fused AdamW, the same objective and masking RNG), timed with CUDA events. Jobs
alternate between the sides by micro batch (so a time budget that runs out leaves both sides
measured), and a side skips the micro batches above one that ran out of memory.

The peers: ``--peers`` (``--hf-impls``) picks hf_baseline.py's
``--impl`` rows (``plain``, ``liger``, ``liger-compile``, ``liger-compile-fp8``; micro batches per
impl with ``--hf-impl-micro-batch-sizes plain=6``) and ``--megatron-variants`` the megatron rows:
``reference`` (train_reference.py, as above) or a variant of :data:`MEGATRON_VARIANTS` (``te-bf16``,
``te-fp8``, ``te-fp8-tensorwise``, ``local-bf16``, ``local-bf16-flex``, and the optimizer-state ones:
``te-bf16-precision-aware``, ``te-bf16-bf16-states``, ``te-bf16-bf16-grads``, ``te-bf16-cpu-offload``,
``local-bf16-bf16-states``, ``local-bf16-cpu-offload``), for which the harness compiles
``bench/throughput/qwen3-1.7b-mdm.toml`` with ``--set`` overrides (``dlmspec compile``, not part
of the job's limit) and runs its train.py under torchrun as launch.sh does (without the
``--check`` pass). Each side's rows are taken in the order given, alternating sides. The JSON's
``ratios`` (:func:`peer_ratios`) holds TE fp8 / strongest HF bf16, TE fp8 / HF fp8 and bf16
megatron / fastest HF bf16 (each naming its two rows, with its target) and every
variant/impl pair; ``best_by_variant`` / ``best_by_impl`` the best micro batch of each row.
``--dry-run`` also compiles every compiled job and checks its train.py's keywords, and tries the
imports the chosen rows need with ``--python`` (``--skip-import-check`` to leave that out).

Both sides are summarised the same way (:func:`throughput_common.summarize`): median step time
of the timed steps, tokens/s (``micro_batch * nproc * seq / median``), model TFLOP/s per GPU from
the planner's :func:`dlmspec.flops.model_flops_per_token`, MFU against 989 TFLOP/s, and
peak ``torch.cuda.max_memory_allocated``. Each side's best is the fastest micro batch that
completed all its steps; ``ratio_tokens_per_s`` is megatron's best over HF's best.

Robustness: a per-job timeout (the job's process group is killed), a total ``--budget-s`` (jobs
that no longer fit are recorded as skipped), a failing job recorded with its status (``oom``,
``timeout``, ``error``) and the tail of its log instead of stopping the harness, the results
JSON rewritten after every job, ``PYTHONUNBUFFERED=1`` and the same ``PYTORCH_CUDA_ALLOC_CONF``
(default ``expandable_segments:True``, which megatron needs at micro batch 8) for every job. If
the first megatron job fails before its first step for a reason other than memory, it is retried
once with ``--no-fusion`` (megatron's torch.compile'd bias-SwiGLU fusion), which the later jobs
then keep.

Output: the result file (above), written when the harness ends (also when stopped by SIGTERM, with
status ``partial``), and beside it ``<same name>.log`` with every job's console output (their
tails); while it runs, ``progress.json`` in the work directory holds what was measured so far.
Child jobs run in the work directory (default ``/tmp/dlmspec-throughput``, refused inside the
checkout) with ``PYTHONPATH`` stripped of the checkout (:func:`common.child_env`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import common  # noqa: E402  (bench/common.py)
from throughput_common import (  # noqa: E402
    PEAK_TFLOPS,
    PRESET_SEQ_LENGTH,
    PRESETS,
    ROOT,
    best_attempt,
    flops_per_token,
    host_info,
    parse_int_list,
    summarize,
)

REFERENCE = ROOT / "bench" / "runtime" / "train_reference.py"
HF_BASELINE = ROOT / "bench" / "throughput" / "hf_baseline.py"
#: The spec of the compiled megatron jobs (``--megatron-variants`` other than ``reference``).
SPEC = ROOT / "bench" / "throughput" / "qwen3-1.7b-mdm.toml"

#: ``--hf-impls``: hf_baseline.py's ``--impl`` choices (its ``IMPLS``; a test keeps them equal)
#: and the precision of their GEMMs.
HF_IMPLS = {"plain": "bf16", "liger": "bf16", "liger-compile": "bf16", "liger-compile-fp8": "fp8"}
#: ``--megatron-variants``: ``reference`` is bench/runtime/train_reference.py (local layers, as
#: before); the others compile :data:`SPEC` with these ``--set`` overrides and run its train.py.
MEGATRON_VARIANTS: Dict[str, Dict[str, Any]] = {
    "reference": {"precision": "bf16", "sets": None,
                  "what": "bench/runtime/train_reference.py: local layer spec, SDPA, bf16"},
    "local-bf16": {"precision": "bf16", "sets": {"model.transformer_impl": "local"},
                   "what": "compiled spec, local layer spec, bf16"},
    "local-bf16-flex": {"precision": "bf16", "sets": {"model.transformer_impl": "local", "model.attention_backend": "flex"},
                        "what": "compiled spec, local layer spec, FlexAttention (model.attention_backend = 'flex'), bf16"},
    "te-bf16": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine"},
                "what": "compiled spec, Transformer Engine layers, bf16"},
    "te-fp8": {"precision": "fp8", "sets": {"model.transformer_impl": "transformer_engine", "precision.fp8": "hybrid"},
               "what": "compiled spec, Transformer Engine layers, precision.fp8 = 'hybrid' (the default recipe: delayed scaling)"},
    "te-fp8-tensorwise": {"precision": "fp8", "sets": {"model.transformer_impl": "transformer_engine",
                                                       "precision.fp8": "hybrid", "precision.fp8_recipe": "tensorwise"},
                          "what": "compiled spec, Transformer Engine layers, fp8 hybrid, current per-tensor scaling"},
    # Optimizer-state options ([train], dlmspec/plan/optimizer_state.py); their losses against te-bf16's / local-bf16's:
    # bench/throughput/optimizer_state_agreement.py
    "te-bf16-precision-aware": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                             "train.use_precision_aware_optimizer": True},
                                "what": "TE layers, bf16; precision-aware optimizer (TE FusedAdam, fp32 master as int16 "
                                        "remainders, fp32 moments)"},
    "te-bf16-bf16-states": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                         "train.use_precision_aware_optimizer": True,
                                                         "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16"},
                            "what": "TE layers, bf16; precision-aware optimizer with bf16 Adam moments"},
    "te-bf16-bf16-grads": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                        "train.use_precision_aware_optimizer": True,
                                                        "train.main_grads_dtype": "bf16",
                                                        "parallel.grad_reduce_in_fp32": False},
                           "what": "TE layers, bf16; precision-aware optimizer with bf16 main gradients"},
    "te-bf16-cpu-offload": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                         "train.use_precision_aware_optimizer": True,
                                                         "train.optimizer_cpu_offload": True},
                            "what": "TE layers, bf16; optimizer state in host memory (HybridDeviceOptimizer)"},
    "local-bf16-bf16-states": {"precision": "bf16", "sets": {"model.transformer_impl": "local",
                                                            "train.use_precision_aware_optimizer": True,
                                                            "train.exp_avg_dtype": "bf16", "train.exp_avg_sq_dtype": "bf16"},
                               "what": "local layers, bf16; precision-aware optimizer with bf16 moments (TE installed "
                                       "for its FusedAdam)"},
    "local-bf16-cpu-offload": {"precision": "bf16", "sets": {"model.transformer_impl": "local",
                                                            "train.use_precision_aware_optimizer": True,
                                                            "train.optimizer_cpu_offload": True},
                               "what": "local layers, bf16; optimizer state in host memory (TE importable)"},
}
#: The targets the ratios are compared with.
TARGET_MFU = 0.50
TARGET_RATIO = 1.4
OOM_MARKERS = ("OutOfMemoryError", "CUDA out of memory", "out of memory")
LOG_TAIL_BYTES = 200_000


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Pass options through with '=': --megatron-arg=--no-fusion --hf-arg=--fp32-master")
    p.add_argument("--out", default=None, help="results root (default bench/results): the result goes to "
                   "<out>/throughput/<date>-<gpu>-<name>.json")
    p.add_argument("--model", dest="preset", choices=sorted(PRESETS), default=None,
                   help="model of both sides (qwen3-1.7b; tiny: CPU checks); same as --preset")
    p.add_argument("--gpus", dest="nproc", type=int, default=None, help="GPUs of the megatron side (same as --nproc)")
    p.add_argument("--precision", choices=["bf16", "fp8"], default="bf16",
                   help="megatron variant when --megatron-variants is not given: bf16 = local-bf16, fp8 = te-fp8")
    p.add_argument("--peers", dest="hf_impls", default=None, help="the HF peers (same as --hf-impls)")
    p.add_argument("--name", default=None, help="<name> of the result file (default <model>-<precision>-seq<N>)")
    p.add_argument("--gpu", default=None, help="GPU family in the result file name (default: nvidia-smi's)")
    p.add_argument("--dry", dest="dry_run", action="store_true", help="print the commands and the result path (same as --dry-run)")
    p.add_argument("--slurm", action="store_true", help="submit this launcher as an sbatch job on one node (--dry: print it)")
    p.add_argument("--sides", default="megatron,hf", help="megatron, hf or both")
    p.add_argument("--megatron-micro-batch-sizes", default="4,6,8")
    p.add_argument("--hf-micro-batch-sizes", default="4,6,8")
    p.add_argument("--hf-impls", default=None,
                   help=f"comma-separated hf_baseline.py --impl values, run in this order: {', '.join(HF_IMPLS)}")
    p.add_argument("--hf-impl-micro-batch-sizes", action="append", default=[], metavar="IMPL=LIST",
                   help="micro batches of one HF impl instead of --hf-micro-batch-sizes, e.g. plain=6 (repeatable)")
    p.add_argument("--megatron-variants", default=None,
                   help=f"comma-separated, run in this order: {', '.join(MEGATRON_VARIANTS)} "
                        "(reference = train_reference.py; the others compile --megatron-spec)")
    p.add_argument("--megatron-spec", default=str(SPEC), help="spec of the compiled megatron variants")
    p.add_argument("--skip-import-check", action="store_true", help="--dry-run: do not try the imports")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per job")
    p.add_argument("--steps", type=int, default=5, help="timed steps per job")
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model of both sides (tiny: CPU checks)")
    p.add_argument("--seq-length", type=int, default=None, help="default: the preset's (qwen3-1.7b: 4096)")
    p.add_argument("--hf-device", choices=["cuda", "auto"], default="cuda", help="auto lets the HF side fall back to CPU (tests)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--microbatches-per-step", type=int, default=1,
                   help="gradient accumulation on both sides: megatron global batch = N * micro batch * nproc, "
                        "HF --grad-accum N")
    p.add_argument("--nproc", type=int, default=None, help="GPUs for megatron (torchrun, data parallel); HF always uses one")
    p.add_argument("--timeout-s", type=float, default=180.0, help="limit of one job")
    p.add_argument("--budget-s", type=float, default=420.0, help="limit of the whole harness; jobs that would start with < 60 s left are skipped")
    p.add_argument("--alloc-conf", default="expandable_segments:True", help="PYTORCH_CUDA_ALLOC_CONF of every job ('' = leave as is)")
    p.add_argument("--megatron-arg", action="append", default=[], help="extra argument of train_reference.py (repeatable)")
    p.add_argument("--hf-arg", action="append", default=[], help="extra argument of hf_baseline.py (repeatable)")
    p.add_argument("--no-fusion-fallback", action="store_true", help="do not retry a failing megatron job with --no-fusion")
    p.add_argument("--work-dir", default="/tmp/dlmspec-throughput", help="run directories and per-job files")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--tag", default="", help="suffix of the output file names")
    p.add_argument("--dry-run", action="store_true", help="print the jobs' commands and exit")
    args = p.parse_args(argv)
    args.preset = args.preset or "qwen3-1.7b"
    args.nproc = 1 if args.nproc is None else args.nproc
    args.hf_impls = args.hf_impls or "plain"
    if args.megatron_variants is None:
        args.megatron_variants = "local-bf16" if args.precision == "bf16" else "te-fp8"
        if args.preset != "qwen3-1.7b":
            args.megatron_variants = "reference"
    wd = Path(args.work_dir).resolve()
    if wd == ROOT or ROOT in wd.parents:
        p.error(f"--work-dir {wd}: inside the checkout; child jobs started there import the checkout's dlmspec/ "
                "(no templates, no backends): give a directory outside it, e.g. /tmp/dlmspec-throughput")
    if args.name and not all(c.isalnum() or c in "._-" for c in args.name):
        p.error("--name may hold letters, digits, '.', '_' and '-' only")
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not args.sides or set(args.sides) - {"megatron", "hf"}:
        p.error("--sides takes megatron, hf or megatron,hf")
    try:
        args.megatron_mbs = sorted(set(parse_int_list(args.megatron_micro_batch_sizes)))
        args.hf_mbs = sorted(set(parse_int_list(args.hf_micro_batch_sizes)))
    except ValueError as exc:
        p.error(str(exc))
    args.seq_length = args.seq_length or PRESET_SEQ_LENGTH[args.preset]
    args.hf_impls = [s.strip() for s in args.hf_impls.split(",") if s.strip()]
    bad = [i for i in args.hf_impls if i not in HF_IMPLS]
    if bad or not args.hf_impls:
        p.error(f"--hf-impls {','.join(bad) or repr('')}: choose from {', '.join(HF_IMPLS)}, e.g. --hf-impls plain,liger")
    args.megatron_variants = [s.strip() for s in args.megatron_variants.split(",") if s.strip()]
    bad = [v for v in args.megatron_variants if v not in MEGATRON_VARIANTS]
    if bad or not args.megatron_variants:
        p.error(f"--megatron-variants {','.join(bad) or repr('')}: choose from {', '.join(MEGATRON_VARIANTS)}, "
                "e.g. --megatron-variants te-bf16,te-fp8")
    args.hf_impl_mbs = {}
    for item in args.hf_impl_micro_batch_sizes:
        impl, _, values = item.partition("=")
        if impl.strip() not in HF_IMPLS:
            p.error(f"--hf-impl-micro-batch-sizes {item!r}: IMPL=LIST with IMPL one of {', '.join(HF_IMPLS)}, e.g. plain=6")
        try:
            args.hf_impl_mbs[impl.strip()] = sorted(set(parse_int_list(values)))
        except ValueError as exc:
            p.error(f"--hf-impl-micro-batch-sizes {item!r}: {exc}")
    if any(v != "reference" for v in args.megatron_variants) and args.preset != "qwen3-1.7b":
        p.error(f"--megatron-variants {','.join(args.megatron_variants)}: the compiled variants use "
                f"{SPEC.name} (qwen3-1.7b); with --preset {args.preset} use --megatron-variants reference")
    if args.steps < 1 or args.warmup < 0 or args.nproc < 1 or args.seq_length < 2:
        p.error("need --steps >= 1, --warmup >= 0, --nproc >= 1")
    if args.tag and not all(c.isalnum() or c in "._-" for c in args.tag):
        p.error("--tag may hold letters, digits, '.', '_' and '-' only")
    return args


# --------------------------------------------------------------------------- jobs


def megatron_command(args: argparse.Namespace, mbs: int, run_dir: Path, extra: List[str]) -> List[str]:
    """The command of one megatron job (python, or torchrun for ``--nproc > 1``)."""
    launcher = [args.python, "-u"]
    if args.nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}"]
    return launcher + [
        str(REFERENCE), "--preset", args.preset, "--objective", "mdm", "--seq-length", str(args.seq_length),
        "--micro-batch-size", str(mbs), "--train-iters", str(args.warmup + args.steps), "--log-interval", "1",
        "--seed", str(args.seed), "--run-dir", str(run_dir),
        "--global-batch-size", str(args.microbatches_per_step * mbs * args.nproc),
    ] + extra


def compiled_sets(args: argparse.Namespace, variant: str, mbs: int, run_dir: Path) -> Dict[str, Any]:
    """The ``--set`` overrides of one compiled megatron job (:data:`MEGATRON_VARIANTS` plus the
    micro/global batch, ``warmup + steps`` iterations logged one by one, the seed, the GPUs and the
    run directory)."""
    return {**MEGATRON_VARIANTS[variant]["sets"],
            "train.micro_batch_size": mbs,
            "train.global_batch_size": args.microbatches_per_step * mbs * args.nproc,
            "train.seq_length": args.seq_length,
            "train.train_iters": args.warmup + args.steps,
            "train.seed": args.seed,
            "cluster.gpus_per_node": args.nproc,
            "logging.log_interval": 1,
            "logging.run_dir": str(run_dir)}


def compile_command(args: argparse.Namespace, variant: str, mbs: int, run_dir: Path, dest: Path) -> List[str]:
    """``dlmspec compile`` of one compiled megatron job into ``dest`` (this interpreter: the
    compiler needs no GPU)."""
    sets = compiled_sets(args, variant, mbs, run_dir)
    return [sys.executable, "-m", "dlmspec.cli", "compile", str(args.megatron_spec), "-o", str(dest), "--force"] + [
        a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]


def compiled_train_command(args: argparse.Namespace, dest: Path) -> List[str]:
    """The compiled train.py under torchrun, as launch.sh runs it (without its ``--check`` pass)."""
    return [args.python, "-u", "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc_per_node={args.nproc}", str(dest / "train.py")]


def hf_command(args: argparse.Namespace, mbs: int, json_path: Path, impl: str = "plain") -> List[str]:
    """The command of one HF job."""
    return [
        args.python, "-u", str(HF_BASELINE), "--preset", args.preset, "--seq-length", str(args.seq_length),
        "--micro-batch-sizes", str(mbs), "--warmup", str(args.warmup), "--steps", str(args.steps),
        "--seed", str(args.seed), "--device", args.hf_device, "--json", str(json_path),
        "--grad-accum", str(args.microbatches_per_step),
    ] + (["--impl", impl] if impl != "plain" else []) + list(args.hf_arg)


def job_name(side: str, impl: str, mbs: int) -> str:
    """``megatron_mb8`` / ``hf_mb8`` for the reference and plain jobs, else ``megatron-te-fp8_mb8``, ``hf-liger_mb12``."""
    default = "reference" if side == "megatron" else "plain"
    return f"{side}_mb{mbs}" if impl == default else f"{side}-{impl}_mb{mbs}"


def job_order(args: argparse.Namespace) -> List[tuple]:
    """``[(side, impl, micro_batch), ...]``: each side's jobs (variants / impls in the order given,
    each by increasing micro batch) taken alternately, megatron first, so a time budget that runs
    out leaves both sides measured (with one variant and one impl: alternating by micro batch)."""
    mega = [("megatron", v, mbs) for v in args.megatron_variants for mbs in args.megatron_mbs] \
        if "megatron" in args.sides else []
    hf = [("hf", i, mbs) for i in args.hf_impls for mbs in args.hf_impl_mbs.get(i, args.hf_mbs)] \
        if "hf" in args.sides else []
    jobs = []
    for k in range(max(len(mega), len(hf))):
        jobs += mega[k:k + 1] + hf[k:k + 1]
    return jobs


def child_env(args: argparse.Namespace) -> Dict[str, str]:
    """The jobs' environment: :func:`common.child_env` (``PYTHONPATH`` without the checkout,
    ``PYTHONUNBUFFERED=1``) and ``PYTORCH_CUDA_ALLOC_CONF``."""
    env = common.child_env()
    if args.alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = args.alloc_conf
    return env


#: Process group of the job running now (killed if the harness itself is stopped).
_CURRENT_GROUP: List[int] = []


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(cmd: List[str], *, log_path: Path, timeout_s: float, env: Dict[str, str],
                cwd: Optional[Path] = None) -> Dict[str, Any]:
    """Run ``cmd`` in a process group of its own (same session, so whoever stops the harness's
    session stops it too) with output to ``log_path``, in ``cwd`` (default: the log's directory,
    the work directory, outside the checkout).

    Returns:
        ``{"returncode": int | None, "timed_out": bool, "seconds": float}``; on timeout the whole
        process group (torchrun workers, data-loader workers) is killed with SIGKILL.
    """
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(cwd or log_path.parent),
                                process_group=0)
        _CURRENT_GROUP[:] = [proc.pid]
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        finally:
            _CURRENT_GROUP.clear()
        _kill_group(proc.pid)  # leftovers (data-loader workers) of a job that exited
    return {"returncode": proc.returncode, "timed_out": timed_out, "seconds": time.perf_counter() - t0}


def log_tail(path: Path, limit: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")


def _looks_oom(text: str) -> bool:
    return any(marker in text for marker in OOM_MARKERS)


def read_megatron_metrics(path: Path) -> Dict[str, Any]:
    """``{"start": dict | None, "train": [records by iteration], "exit": dict | None}`` of a
    runtime ``metrics.jsonl`` (:func:`common.read_metrics`: a missing file has none, unparseable
    lines are skipped; the last ``start`` and ``exit`` records; later records of an iteration win)."""
    rows = common.read_metrics(path)
    by_iter = {r["iteration"]: r for r in common.events(rows, "train") if isinstance(r.get("iteration"), int)}
    return {"start": common.last(rows, "start"), "train": [by_iter[i] for i in sorted(by_iter)],
            "exit": common.last(rows, "exit")}


def megatron_attempt(args: argparse.Namespace, mbs: int, proc: Dict[str, Any], metrics: Dict[str, Any],
                     log_path: Path, flops: float) -> Dict[str, Any]:
    """Summarise one megatron job: status, timed steps, throughput, memory, losses."""
    train = metrics["train"]
    timed = [r for r in train if r["iteration"] > args.warmup]
    times = [float(r["step_time_s"]) for r in timed if r.get("step_time_s")]
    attempt: Dict[str, Any] = {
        "micro_batch_size": mbs,
        "global_batch_size": args.microbatches_per_step * mbs * args.nproc,
        "warmup_steps": args.warmup,
        "timed_steps": len(times),
        "step_times_s": times,
        "warmup_step_times_s": [float(r["step_time_s"]) for r in train if r["iteration"] <= args.warmup],
        "losses": [r.get("loss") for r in train],
        "grad_norms": [r.get("grad_norm") for r in train],
        "tokens_per_step": args.microbatches_per_step * mbs * args.nproc * args.seq_length,
        "returncode": proc["returncode"],
        "seconds": proc["seconds"],
    }
    if train:
        attempt["peak_mem_gib"] = max(float(r.get("peak_mem_gib") or 0.0) for r in train)
        attempt["peak_reserved_gib"] = max(float(r.get("peak_reserved_gib") or 0.0) for r in train)
        attempt["runtime_reported"] = {k: train[-1].get(k) for k in ("tokens_per_s", "tflops_per_gpu", "mfu")}
    if metrics["start"]:
        attempt["runtime_model_flops_per_token"] = metrics["start"].get("model_flops_per_token")
        attempt["parameters"] = metrics["start"].get("params_on_logging_rank")
        attempt["layer_spec"] = metrics["start"].get("layer_spec")
    if times:
        attempt.update(summarize(times, tokens_per_step=attempt["tokens_per_step"], flops_per_token=flops,
                                 num_gpus=args.nproc, peak_tflops=PEAK_TFLOPS))
    tail = log_tail(log_path)
    if proc["timed_out"]:
        attempt["status"] = "timeout"
    elif proc["returncode"] != 0:
        attempt["status"] = "oom" if _looks_oom(log_tail(log_path, 20000)) else "error"
    elif len(times) < args.steps:
        attempt["status"] = "error"
        attempt["error"] = f"only {len(times)} of {args.steps} timed steps in metrics.jsonl"
    else:
        attempt["status"] = "ok"
    if attempt["status"] != "ok":
        attempt["error_tail"] = tail
    return attempt


def hf_attempt(args: argparse.Namespace, mbs: int, proc: Dict[str, Any], json_path: Path, log_path: Path) -> Dict[str, Any]:
    """Summarise one HF job from the JSON hf_baseline.py wrote (or from its log if it wrote none)."""
    report: Dict[str, Any] = {}
    try:
        report = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass
    attempts = report.get("attempts") or []
    attempt: Dict[str, Any] = dict(attempts[0]) if attempts else {"micro_batch_size": mbs}
    attempt.update(returncode=proc["returncode"], seconds=proc["seconds"])
    for key in ("bidirectional_check", "parameters", "versions", "setup", "impl_setup", "flops_per_token", "flops_source"):
        if key in report:
            attempt[key] = report[key]
    if proc["timed_out"]:
        attempt["status"] = "timeout"
    elif not attempts:
        if report.get("status") in ("bidirectional_check_failed", "build_failed"):
            attempt["status"] = report["status"]
        else:
            attempt["status"] = "oom" if _looks_oom(log_tail(log_path, 20000)) else "error"
        if report.get("error"):
            attempt["error"] = report["error"]
    if attempt.get("status") != "ok":
        attempt["error_tail"] = log_tail(log_path)
    return attempt


# --------------------------------------------------------------------------- output


def _version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def gpu_info() -> Dict[str, Any]:
    """``nvidia-smi`` name, memory and driver of each GPU (no CUDA context in this process)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return {"nvidia_smi": [line.strip() for line in out.stdout.splitlines() if line.strip()] or out.stderr.strip()}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"nvidia_smi": f"unavailable: {exc}"}


def _write_json(path: Path, data: Dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _side_summary(attempts: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    best = best_attempt(attempts)
    if best is None:
        return None
    return {k: best.get(k) for k in ("micro_batch_size", "median_step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                                     "peak_mem_gib", "peak_reserved_gib")}


#: The targets (one H200, same run): TE fp8 >= 1.4x the strongest HF bf16 loop and ahead of
#: the HF fp8 peer; bf16 (either megatron path) >= 1.1x the fastest HF bf16 loop.
TARGET_FP8_OVER_HF_BF16 = 1.4
TARGET_FP8_OVER_HF_FP8 = 1.0
TARGET_BF16_OVER_HF_BF16 = 1.1


def _fastest(best: Dict[str, Optional[Dict[str, Any]]], keys: List[str]) -> Optional[tuple]:
    """``(key, summary)`` with the most tokens/s among ``keys`` of ``best`` (``None`` if none ran)."""
    have = [(k, best[k]) for k in keys if best.get(k)]
    return max(have, key=lambda kv: kv[1]["tokens_per_s"]) if have else None


def peer_ratios(results: Dict[str, Any]) -> Dict[str, Any]:
    """The ratios from the best micro batch of each megatron variant and HF impl.

    Returns ``{"by_pair": {"VARIANT/IMPL": ratio}, "te_fp8_over_strongest_hf_bf16",
    "te_fp8_over_hf_fp8", "megatron_bf16_over_fastest_hf_bf16"}``; each named ratio is a dict
    ``{"ratio", "megatron", "hf", "target", "met"}`` naming the two rows it divides (the fastest
    megatron fp8 / bf16 variant; the fastest HF bf16 impl, which is the strongest; the HF fp8
    impl), or ``None`` when a side has no such row.
    """
    mb = results["megatron"].get("best_by_variant") or {}
    hb = results["hf"].get("best_by_impl") or {}
    prec_m = {v: MEGATRON_VARIANTS[v]["precision"] for v in mb}
    prec_h = {i: HF_IMPLS[i] for i in hb}
    out: Dict[str, Any] = {"by_pair": {f"{v}/{i}": mb[v]["tokens_per_s"] / hb[i]["tokens_per_s"]
                                       for v in mb for i in hb if mb[v] and hb[i]}}

    def ratio(m_keys, h_keys, target):
        m, h = _fastest(mb, m_keys), _fastest(hb, h_keys)
        if not (m and h):
            return None
        r = m[1]["tokens_per_s"] / h[1]["tokens_per_s"]
        return {"ratio": r, "megatron": m[0], "hf": h[0], "megatron_tokens_per_s": m[1]["tokens_per_s"],
                "hf_tokens_per_s": h[1]["tokens_per_s"], "target": target, "met": r >= target}

    te_fp8 = [v for v in mb if v.startswith("te-") and prec_m[v] == "fp8"]
    bf16_m = [v for v in mb if prec_m[v] == "bf16"]
    bf16_h = [i for i in hb if prec_h[i] == "bf16"]
    fp8_h = [i for i in hb if prec_h[i] == "fp8"]
    out["te_fp8_over_strongest_hf_bf16"] = ratio(te_fp8, bf16_h, TARGET_FP8_OVER_HF_BF16)
    out["te_fp8_over_hf_fp8"] = ratio(te_fp8, fp8_h, TARGET_FP8_OVER_HF_FP8)
    out["megatron_bf16_over_fastest_hf_bf16"] = ratio(bf16_m, bf16_h, TARGET_BF16_OVER_HF_BF16)
    return out


def finish(results: Dict[str, Any]) -> None:
    """Fill the best attempt of each side, of each megatron variant and HF impl, the ratios
    (:func:`peer_ratios`) and the targets."""
    m = results["megatron"]["best"] = _side_summary(results["megatron"]["attempts"])
    h = results["hf"]["best"] = _side_summary(results["hf"]["attempts"])
    for side, key, default in (("megatron", "variant", "reference"), ("hf", "impl", "plain")):
        names = list(dict.fromkeys(a.get(key, default) for a in results[side]["attempts"]))
        results[side][f"best_by_{key}"] = {
            n: _side_summary([a for a in results[side]["attempts"] if a.get(key, default) == n]) for n in names}
    results["ratios"] = peer_ratios(results)
    ratio = (m["tokens_per_s"] / h["tokens_per_s"]) if (m and h) else None
    results["ratio_tokens_per_s"] = ratio
    ok = {side: {a["micro_batch_size"]: a["tokens_per_s"] for a in results[side]["attempts"] if a.get("status") == "ok"}
          for side in ("megatron", "hf")}  # one variant / impl per side: with several, the last of each micro batch
    results["ratio_at_equal_micro_batch"] = {
        str(mbs): ok["megatron"][mbs] / ok["hf"][mbs] for mbs in sorted(set(ok["megatron"]) & set(ok["hf"]))
    }
    results["targets"] = {
        "megatron_mfu_at_least": TARGET_MFU,
        "ratio_at_least": TARGET_RATIO,
        "megatron_mfu_met": (m["mfu"] >= TARGET_MFU) if m else None,
        "ratio_met": (ratio >= TARGET_RATIO) if ratio is not None else None,
    }


def compile_job(args: argparse.Namespace, variant: str, mbs: int, run_dir: Path, dest: Path) -> Dict[str, Any]:
    """Compile one megatron job's spec into ``dest``: ``{"command", "returncode", "output"}``."""
    cmd = compile_command(args, variant, mbs, run_dir, dest)
    try:
        work = Path(args.work_dir)
        work.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(work), env=child_env(args))
        return {"command": shlex.join(cmd), "returncode": proc.returncode, "output": (proc.stdout + proc.stderr)[-3000:]}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"command": shlex.join(cmd), "returncode": None, "output": f"{type(exc).__name__}: {exc}"}


def run_job(args: argparse.Namespace, side: str, mbs: int, name: str, *, timeout: float, env: Dict[str, str], work: Path,
            megatron_extra: List[str], flops: float, combined_log: Path, elapsed: float, impl: Optional[str] = None) -> tuple:
    """Run one job and summarise it; appends its console output to ``combined_log``. ``impl``: the
    megatron variant or the HF impl (default: ``reference`` / ``plain``). A compiled megatron variant
    is compiled first (its compile time is not part of the job's limit).

    Returns:
        ``(attempt, number of train records the megatron runtime logged)``.
    """
    impl = impl or ("reference" if side == "megatron" else "plain")
    log_path = work / f"{name}.log"
    compiled = None
    if side == "megatron":
        run_dir = work / name
        shutil.rmtree(run_dir, ignore_errors=True)  # metrics.jsonl is appended to
        if impl == "reference":
            cmd = megatron_command(args, mbs, run_dir, megatron_extra)
        else:
            dest = work / f"{name}.compiled"
            compiled = compile_job(args, impl, mbs, run_dir, dest)
            cmd = compiled_train_command(args, dest)
            # what the compiled launch.sh exports before torchrun
            env = {**env, "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
                   "TORCH_NCCL_AVOID_RECORD_STREAMS": env.get("TORCH_NCCL_AVOID_RECORD_STREAMS", "1")}
    else:
        hf_json = work / f"{name}.json"
        hf_json.unlink(missing_ok=True)
        cmd = hf_command(args, mbs, hf_json, impl)
    if compiled is not None and compiled["returncode"] != 0:
        attempt = {"micro_batch_size": mbs, "status": "compile_failed", "returncode": compiled["returncode"],
                   "seconds": 0.0, "error_tail": compiled["output"]}
        proc = {"returncode": compiled["returncode"], "seconds": 0.0}
        steps_seen = 0
        log_path.write_text(compiled["output"], encoding="utf-8")
    else:
        print(f"throughput: [{elapsed:5.0f} s] {name}: {shlex.join(cmd)}", flush=True)
        proc = run_process(cmd, log_path=log_path, timeout_s=timeout, env=env)
        steps_seen = 0
        if side == "megatron":
            metrics = read_megatron_metrics(run_dir / "metrics.jsonl")
            steps_seen = len(metrics["train"])
            attempt = megatron_attempt(args, mbs, proc, metrics, log_path, flops)
        else:
            attempt = hf_attempt(args, mbs, proc, hf_json, log_path)
    attempt["variant" if side == "megatron" else "impl"] = impl
    attempt["precision"] = (MEGATRON_VARIANTS[impl] if side == "megatron" else {"precision": HF_IMPLS[impl]})["precision"]
    if compiled is not None:
        attempt["compile_command"] = compiled["command"]
    attempt["command"] = shlex.join(cmd)
    with open(combined_log, "ab") as combined:
        combined.write(f"\n===== {name} ({attempt['status']}, exit {proc['returncode']}, {proc['seconds']:.0f} s): "
                       f"{shlex.join(cmd)}\n".encode())
        data = log_path.read_bytes() if log_path.exists() else b""
        if len(data) > LOG_TAIL_BYTES:
            combined.write(f"[... first {len(data) - LOG_TAIL_BYTES} bytes cut ...]\n".encode())
        combined.write(data[-LOG_TAIL_BYTES:])
    return attempt, steps_seen


#: What ``--dry-run`` tries to import with ``--python`` (module -> who needs it).
IMPORTS = {
    "torch": "both sides",
    "transformers": "hf",
    "megatron.core": "megatron",
    "transformer_engine.pytorch": "megatron te-* variants",
    "dlmspec.cli": "compiling the megatron variants",
    "liger_kernel.transformers": "hf liger* impls (imports triton)",
    "torchao.float8": "hf liger-compile-fp8",
}
_IMPORT_PROBE = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
out = {}
for name in sys.argv[2:]:
    try:
        importlib.import_module(name)
        out[name] = "ok"
    except BaseException as exc:
        out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
if "liger_kernel.transformers" in out:  # the exact import path hf_baseline.py takes for --impl liger*
    try:
        import hf_baseline
        hf_baseline.load_liger()
        out["hf_baseline.load_liger()"] = "ok"
    except BaseException as exc:
        out["hf_baseline.load_liger()"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    try:  # the masked-row loss wiring on CPU, with the pure-torch stand-in of Liger's function
        import torch
        from throughput_common import TINY
        from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
        torch.manual_seed(0)
        model = hf_baseline.build_model(TINY, 16, device=torch.device("cpu"), param_dtype=torch.float32)
        obj = MaskedDiffusionObjective(TINY["mask_token_id"], eps=1e-3, loss_weighting="llada", variable_length_prob=0.0)
        ob = obj.prepare({"tokens": torch.randint(0, TINY["tokenizer_vocab"], (2, 16))}, torch.Generator().manual_seed(1))
        with torch.no_grad():
            plain = float(hf_baseline.plain_loss(model, ob))
            diffs = {r: abs(float(hf_baseline.make_flce_loss(hf_baseline.torch_fused_linear_cross_entropy, r)(model, ob)) - plain) / plain
                     for r in hf_baseline.FLCE_REDUCTIONS}
        out["masked-row loss (stand-in) = plain loss"] = ("ok" if max(diffs.values()) < 1e-5 else "MISMATCH") + ": relative difference " + ", ".join(f"{r} {d:.1e}" for r, d in diffs.items())
    except BaseException as exc:
        out["masked-row loss (stand-in) = plain loss"] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(out))
"""


def needed_imports(args: argparse.Namespace) -> List[str]:
    """The :data:`IMPORTS` the chosen sides, variants and impls need."""
    mega = "megatron" in args.sides
    hf = "hf" in args.sides
    want = {"torch": True, "transformers": hf, "megatron.core": mega,
            # the te-* layers, and the precision-aware optimizer on any layers (megatron-core reads TE's version)
            "transformer_engine.pytorch": mega and any(
                v.startswith("te-") or (MEGATRON_VARIANTS.get(v, {}).get("sets") or {}).get("train.use_precision_aware_optimizer")
                for v in args.megatron_variants),
            "dlmspec.cli": mega and any(v != "reference" for v in args.megatron_variants),
            "liger_kernel.transformers": hf and any(i != "plain" for i in args.hf_impls),
            "torchao.float8": hf and any(i.endswith("-fp8") for i in args.hf_impls)}
    return [m for m in IMPORTS if want[m]]


def import_check(python: str, modules: List[str], cwd: Optional[Path] = None) -> Dict[str, str]:
    """``{module: "ok" | "Error: message"}`` for ``modules`` (and hf_baseline's Liger loader when
    Liger is among them), tried by ``python`` in a fresh process (an ``"error"`` key if it could not run)."""
    try:
        proc = subprocess.run([python, "-c", _IMPORT_PROBE, str(HF_BASELINE.parent), *modules], capture_output=True,
                              text=True, timeout=300, cwd=str(cwd or Path(tempfile.gettempdir())), env=common.child_env())
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def train_py_keywords(text: str) -> Dict[str, Any]:
    """The literal keyword arguments of every call in a compiled train.py (last one wins):
    bench/gpu/compiled_runs.py's, which the TE matrix and calibration use too."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
    from compiled_runs import train_py_keywords as keywords

    return keywords(text)


def expected_keywords(args: argparse.Namespace, variant: str, mbs: int, run_dir: Path) -> Dict[str, Any]:
    """What a compiled variant's train.py must say (``None``: keyword absent)."""
    sets = MEGATRON_VARIANTS[variant]["sets"]
    return {"use_transformer_engine": sets["model.transformer_impl"] == "transformer_engine",
            "fp8": sets.get("precision.fp8"),
            "micro_batch_size": mbs,
            "global_batch_size": args.microbatches_per_step * mbs * args.nproc,
            "seq_length": args.seq_length,
            "train_iters": args.warmup + args.steps,
            "run_dir": str(run_dir),
            "use_precision_aware_optimizer": sets.get("train.use_precision_aware_optimizer"),
            "optimizer_cpu_offload": sets.get("train.optimizer_cpu_offload")}


def dry_run(args: argparse.Namespace, jobs: List[tuple], work: Path, megatron_extra: List[str]) -> int:
    """Print every job's command; compile each compiled megatron job and check its train.py's
    keywords (:func:`expected_keywords`); try the imports (:func:`import_check`; with a liger impl
    also the masked-row loss through the pure-torch stand-in of Liger's function against the plain
    loss, on a tiny CPU model) unless ``--skip-import-check``. Exit code 2 when a module the chosen
    sides and peers need does not import (each named with how to get it:
    :func:`common.missing_peers`; e.g. Liger without Triton on a CPU machine: ``--peers plain``),
    else 1 when a compile, a keyword check or that loss check failed, else 0."""
    print("# env: PYTHONUNBUFFERED=1" + (f" PYTORCH_CUDA_ALLOC_CONF={args.alloc_conf}" if args.alloc_conf else ""))
    failed = 0
    for side, impl, mbs in jobs:
        name = job_name(side, impl, mbs)
        label = f"{name.rsplit('_mb', 1)[0]} mb{mbs}"
        if side == "megatron" and impl == "reference":
            cmd = megatron_command(args, mbs, work / name, megatron_extra)
        elif side == "megatron":
            dest = work / f"{name}.compiled"
            compiled = compile_job(args, impl, mbs, work / name, dest)
            cmd = compiled_train_command(args, dest)
            if compiled["returncode"] != 0:
                failed += 1
                print(f"# {label}: compile FAILED (exit {compiled['returncode']}): {compiled['command']}\n{compiled['output']}")
            else:
                got = train_py_keywords((dest / "train.py").read_text(encoding="utf-8"))
                wrong = [f"{k}: want {v!r}, got {got.get(k)!r}"
                         for k, v in expected_keywords(args, impl, mbs, work / name).items() if got.get(k) != v]
                failed += bool(wrong)
                print(f"# {label}: compiled ({compiled['command']}); train.py "
                      + ("keywords " + "; ".join(wrong) if wrong else "keywords as expected"))
        else:
            cmd = hf_command(args, mbs, work / f"{name}.json", impl)
        print(f"{label}: {shlex.join(cmd)}")
    missing: List[str] = []
    if not args.skip_import_check:
        checked = import_check(args.python, needed_imports(args))
        wiring = checked.get("masked-row loss (stand-in) = plain loss")
        failed += wiring is not None and not wiring.startswith("ok")
        for module, status in checked.items():
            print(f"# {'' if ' ' in module else 'import '}{module} ({IMPORTS.get(module, 'hf liger* impls')}): {status}")
        missing = common.missing_peers(checked, IMPORTS)
    print(f"result: {result_path(args)}")
    if missing:
        return common.report_missing(missing, args.python)
    return 1 if failed else 0


def result_name(args: argparse.Namespace) -> str:
    """``--name``, else ``<model>-<precision>-seq<N>[-<gpus>gpu]``."""
    if args.name:
        return args.name.lower()
    return f"{args.preset}-{args.precision}-seq{args.seq_length}" + (f"-{args.nproc}gpu" if args.nproc > 1 else "")


def result_path(args: argparse.Namespace) -> Path:
    """Where the result will be written (today's date, UTC)."""
    gpu = args.gpu or ("cpu" if args.dry_run else common.hardware(0)["gpu"])
    return common.result_path(Path(args.out) if args.out else common.RESULTS, "throughput", common.utc_today(), gpu,
                              result_name(args))


def write_result(args: argparse.Namespace, results: Dict[str, Any], status: str, combined_log: Path) -> Path:
    """The schema'd result file (``bench/schema.py``; ``values`` = the harness's results) and the
    jobs' combined log beside it."""
    result = common.Result(
        suite="throughput", name=result_name(args), command=[str(c) for c in results["command"]],
        versions=common.versions(("triton",)), hardware=common.hardware(args.nproc, args.gpu), values=results,
        status=status)
    path = common.write_result(result, Path(args.out) if args.out else common.RESULTS)
    if combined_log.exists():
        import shutil

        shutil.copyfile(combined_log, path.with_suffix(".log"))
    print(f"result: {path}", flush=True)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    work = Path(args.work_dir)
    env = child_env(args)
    jobs = job_order(args)
    megatron_extra = list(args.megatron_arg)

    slurm = common.maybe_slurm(args, list(sys.argv[1:] if argv is None else argv), "throughput")
    if slurm is not None:
        return slurm
    if args.dry_run:
        return dry_run(args, jobs, work, megatron_extra)

    t_begin = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    if "megatron" in args.sides and any(v != "reference" for v in args.megatron_variants):
        problem = common.check_installed(sys.executable, work)
        if problem:
            print(f"error: the compiled megatron variants need an installed dlmspec: {problem}", file=sys.stderr)
            return 2
    json_path, combined_log = work / "progress.json", work / "jobs.log"
    combined_log.unlink(missing_ok=True)
    arch = PRESETS[args.preset]
    flops = flops_per_token(arch, args.seq_length)
    argv_list = [sys.executable] + (sys.argv if argv is None else [sys.argv[0]] + list(argv))
    results: Dict[str, Any] = {
        "benchmark": "throughput: dlmspec's megatron-core runtime vs Hugging Face peers",
        "date": time.strftime("%Y-%m-%d"),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": argv_list,
        "command_line": shlex.join(argv_list),
        "host": {**host_info(), **gpu_info(), "PYTORCH_CUDA_ALLOC_CONF": env.get("PYTORCH_CUDA_ALLOC_CONF")},
        "versions": {name: _version(name) for name in ("torch", "transformers", "megatron-core", "numpy",
                                                       "transformer-engine", "liger-kernel", "torchao", "triton")},
        "settings": {
            "model": f"{args.preset} preset of bench/runtime/train_reference.py (qwen3-1.7b: Qwen3-1.7B architecture, "
                     "28 layers, hidden 2048, ffn 6144, 16 heads, 8 KV groups, head dim 128, vocab 151936, untied), "
                     "masked diffusion (LLaDA, variable_length_prob 0.01), bidirectional attention",
            "preset": args.preset,
            "architecture": arch,
            "seq_length": args.seq_length,
            "warmup_steps": args.warmup,
            "timed_steps": args.steps,
            "seed": args.seed,
            "nproc_megatron": args.nproc,
            "megatron_micro_batch_sizes": args.megatron_mbs,
            "hf_micro_batch_sizes": args.hf_mbs,
            "hf_impls": args.hf_impls,
            "hf_impl_micro_batch_sizes": args.hf_impl_mbs,
            "megatron_variants": {v: MEGATRON_VARIANTS[v]["what"] for v in args.megatron_variants},
            "megatron_spec": str(Path(args.megatron_spec).resolve().relative_to(ROOT)
                                 if Path(args.megatron_spec).resolve().is_relative_to(ROOT) else args.megatron_spec),
            "jobs": [job_name(*job) for job in jobs],
            "megatron_extra_args": megatron_extra,
            "hf_extra_args": args.hf_arg,
            "timeout_s": args.timeout_s,
            "budget_s": args.budget_s,
            "megatron": "bench/runtime/train_reference.py (bf16, local layer spec + SDPA, distributed optimizer with fp32 "
                        "main weights, mock data), one microbatch per DP rank per step; step time = runtime's "
                        "metrics.jsonl step_time_s (wall clock between CUDA-synchronised log points, log interval 1)",
            "hf": "bench/throughput/hf_baseline.py (transformers Qwen3ForCausalLM, sdpa, bidirectional, pure bf16 + "
                  "fused AdamW unless --hf-arg=--fp32-master, random tokens); step time from CUDA events",
        },
        **flops,
        "peak_tflops_per_gpu": PEAK_TFLOPS,
        "megatron": {"attempts": [], "best": None},
        "hf": {"attempts": [], "best": None},
        "ratio_tokens_per_s": None,
        "status": "running",
    }
    missing: Dict[Any, str] = {}  # checked only for this interpreter (another --python may have other packages)
    same_python = os.path.realpath(args.python) == os.path.realpath(sys.executable)
    if same_python and "megatron" in args.sides and not _importable("megatron.core"):
        missing["megatron"] = "megatron.core"
    if same_python and "hf" in args.sides and not _importable("transformers"):
        missing["hf"] = "transformers"
    if same_python and "megatron" in args.sides and not _importable("transformer_engine"):
        for variant in args.megatron_variants:
            if variant.startswith("te-"):
                missing[("megatron", variant)] = "transformer_engine"
    if same_python and "hf" in args.sides:
        for impl in args.hf_impls:
            standin = "--liger-standin" in args.hf_arg  # CPU checks: no Liger, no Triton needed
            need = [m for m in (("liger_kernel", "triton") if impl != "plain" and not standin else ())
                    + (("torchao",) if impl.endswith("-fp8") else ()) if not _importable(m)]
            if need:
                missing[("hf", impl)] = " and ".join(need)
    _write_json(json_path, results)
    print(f"throughput: {len(jobs)} jobs, results -> {json_path}", flush=True)

    def stop(signum, frame):  # the harness is being stopped: end the job, keep what was measured
        if _CURRENT_GROUP:
            _kill_group(_CURRENT_GROUP[0])
        finish(results)
        results["status"] = f"interrupted by {signal.Signals(signum).name}"
        _write_json(json_path, results)
        write_result(args, results, "partial", combined_log)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    oom_from: Dict[tuple, int] = {}
    fallback_tried = args.no_fusion_fallback or "--no-fusion" in megatron_extra
    for side, impl, mbs in jobs:
        left = args.budget_s - (time.perf_counter() - t_begin)
        attempts = results[side]["attempts"]
        label = {("variant" if side == "megatron" else "impl"): impl,
                 "precision": (MEGATRON_VARIANTS[impl] if side == "megatron" else {"precision": HF_IMPLS[impl]})["precision"]}
        if (side, impl) in missing or side in missing:
            what = missing.get((side, impl)) or missing[side]
            attempts.append({"micro_batch_size": mbs, "status": "error", **label,
                             "error": f"{what} is not importable by {args.python} (PYTHONPATH={os.environ.get('PYTHONPATH')})"})
            _write_json(json_path, results)
            continue
        if (side, impl) in oom_from:
            attempts.append({"micro_batch_size": mbs, "status": "skipped", **label,
                             "error": f"micro batch {oom_from[(side, impl)]} ran out of memory"})
            _write_json(json_path, results)
            continue
        if left < 60:
            attempts.append({"micro_batch_size": mbs, "status": "skipped", **label, "error": f"time budget: {left:.0f} s left"})
            _write_json(json_path, results)
            continue
        timeout = min(args.timeout_s, left)
        tries = 0
        while True:
            tries += 1
            name = job_name(side, impl, mbs) + (f"_try{tries}" if tries > 1 else "")
            try:
                attempt, steps_seen = run_job(args, side, mbs, name, timeout=timeout, env=env, work=work,
                                              megatron_extra=megatron_extra, flops=flops["flops_per_token"],
                                              combined_log=combined_log, elapsed=time.perf_counter() - t_begin, impl=impl)
            except Exception as exc:  # noqa: BLE001 - a harness bug must not lose the other jobs
                attempt, steps_seen = {"micro_batch_size": mbs, "status": "error", "returncode": None, "seconds": 0.0,
                                       **label, "error": f"harness: {type(exc).__name__}: {exc}",
                                       "error_tail": traceback.format_exc()[-3000:]}, 0
            retry = (side == "megatron" and impl == "reference" and not fallback_tried and attempt["status"] == "error"
                     and steps_seen == 0 and attempt.get("returncode") not in (None, 0)
                     and (args.budget_s - (time.perf_counter() - t_begin)) > 90)
            if retry:
                fallback_tried = True
                megatron_extra = megatron_extra + ["--no-fusion"]
                attempt["retried_with"] = "--no-fusion"
                attempts.append(attempt)
                results["settings"]["megatron_extra_args"] = megatron_extra
                results["settings"]["fusion_fallback"] = "megatron job failed before its first step; retried with --no-fusion"
                timeout = min(args.timeout_s, args.budget_s - (time.perf_counter() - t_begin))
                continue
            break
        attempts.append(attempt)
        if attempt["status"] == "oom":
            oom_from[(side, impl)] = mbs
        if attempt["status"] == "ok":
            print(f"throughput: {name}: {attempt['median_step_time_s'] * 1000:.0f} ms/step, {attempt['tokens_per_s']:,.0f} tok/s, "
                  f"{attempt['tflops_per_gpu']:.1f} TFLOP/s/GPU, MFU {100 * attempt['mfu']:.1f}%, "
                  f"peak {attempt.get('peak_mem_gib') or 0:.1f} GiB", flush=True)
        else:
            tail = (attempt.get("error_tail") or attempt.get("error") or "").strip().splitlines()[-12:]
            print(f"throughput: {name}: {attempt['status']} (exit {attempt.get('returncode')}, {attempt.get('seconds', 0):.0f} s)\n    "
                  + "\n    ".join(tail), flush=True)
        finish(results)
        _write_json(json_path, results)

    finish(results)
    results["status"] = "done"
    results["seconds"] = time.perf_counter() - t_begin
    _write_json(json_path, results)
    m, h = results["megatron"]["best"], results["hf"]["best"]
    for label, best in (("megatron", m), ("hf", h)):
        if best:
            print(f"throughput: best {label}: micro batch {best['micro_batch_size']}, {best['tokens_per_s']:,.0f} tok/s, "
                  f"{best['tflops_per_gpu']:.1f} TFLOP/s/GPU, MFU {100 * best['mfu']:.1f}%, peak {best['peak_mem_gib'] or 0:.1f} GiB")
        else:
            print(f"throughput: best {label}: none completed")
    for side, key in (("megatron", "variant"), ("hf", "impl")):
        by = results[side][f"best_by_{key}"]
        if len(by) > 1 or (by and next(iter(by)) not in ("reference", "plain")):
            for name, best in by.items():
                print(f"throughput:   {side} {name}: " + (
                    f"micro batch {best['micro_batch_size']}, {best['tokens_per_s']:,.0f} tok/s, MFU {100 * best['mfu']:.1f}%, "
                    f"peak {best['peak_mem_gib'] or 0:.1f} GiB allocated, {best.get('peak_reserved_gib') or 0:.1f} GiB reserved"
                    if best else "none completed"))
    for key, r in results["ratios"].items():
        if key != "by_pair" and r:
            print(f"throughput: {key}: {r['megatron']} / {r['hf']} = {r['ratio']:.3f} (target >= {r['target']}: "
                  f"{'met' if r['met'] else 'not met'})")
    if results["ratio_tokens_per_s"] is not None:
        print(f"throughput: megatron / HF tokens/s = {results['ratio_tokens_per_s']:.3f} (target >= {TARGET_RATIO})")
    every = [a for side in ("megatron", "hf") for a in results[side]["attempts"]]
    status = "ok" if every and all(a.get("status") == "ok" for a in every) else ("partial" if (m or h) else "failed")
    write_result(args, results, status, combined_log)
    print(f"throughput: done in {results['seconds']:.0f} s", flush=True)
    return 0 if (m or h) else 1


if __name__ == "__main__":
    sys.exit(main())
