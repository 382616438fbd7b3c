"""GPU logit check of the HF -> megatron-core converter at TP=1 and TP=2, every family.

Run on a machine with >= 2 GPUs (not run in CI; the CPU tests cover the dense families at
TP=1 with megatron's local spec)::

    python bench/convert/verify_gpu.py --out /tmp/convert_verify_gpu.json

What it does:

1. ``prepare`` (this process, CPU): for every family writes a tiny random HF checkpoint
   (``dlmspec.backends.convert.tiny``), converts it with ``hf_to_mcore`` (vocabulary padded for the
   largest TP), and stores the fp32 reference logits of the ``transformers`` model on fixed
   tokens.
2. ``worker`` (``torchrun --nproc_per_node TP``, once per TP): builds megatron's GPTModel on
   CUDA with ``tensor_model_parallel_size=TP`` for each layer spec available (``local``, and
   ``te`` when Transformer Engine imports), loads the converted checkpoint the way the runtime
   does (``dist_checkpointing.load(model.sharded_state_dict(), path)``), runs the tokens with
   causal attention, all-gathers the vocabulary-parallel logits and compares them with the
   reference. MoE families run here (megatron's router cannot run on CPU).
3. Writes one JSON: per family, TP and spec, the max absolute logit difference and pass/fail
   at ``--atol``, plus any error text.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dlmspec.backends.convert.dims import FAMILIES  # noqa: E402

BATCH, SEQ = 2, 16


def prepare(work: Path, families: list[str], max_tp: int) -> None:
    """Tiny checkpoints, conversions and reference logits under ``work``."""
    from dlmspec.backends.convert import hf_to_mcore
    from dlmspec.backends.convert.tiny import make_tiny_hf

    for family in families:
        src, reference = make_tiny_hf(family, work / "hf" / family, seed=11)
        hf_to_mcore(src, work / "mcore" / family, tp=max_tp, overwrite=True)
        tokens = torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            logits = reference(input_ids=tokens).logits.float()
        torch.save({"tokens": tokens, "logits": logits}, work / f"ref_{family}.pt")


def _specs() -> list[str]:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return ["local"]
    return ["local", "te"]


def worker(work: Path, families: list[str], atol: float) -> None:
    """One torchrun rank: load each converted checkpoint at this TP and compare logits."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from dlmspec.backends.convert.dims import ModelDims
    from dlmspec.backends.convert.mcore_io import read_sidecar
    from dlmspec.backends.convert.mcore_model import build_gpt_model

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    tp = dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
    model_parallel_cuda_manual_seed(1234)
    results = []
    for family in families:
        ckpt = work / "mcore" / family
        dims = ModelDims.from_dict(read_sidecar(ckpt)["dims"])
        ref = torch.load(work / f"ref_{family}.pt")
        for spec in _specs():
            row = {"family": family, "tp": tp, "spec": spec}
            t0 = time.time()
            try:
                model = build_gpt_model(dims, spec=spec, tp=tp, params_dtype=torch.float32, cpu=False).cuda()
                loaded = dist_checkpointing.load(model.sharded_state_dict(), str(ckpt))
                model.load_state_dict(loaded, strict=True)
                model.eval()
                tokens = ref["tokens"].cuda()
                pos = torch.arange(SEQ, device="cuda").unsqueeze(0).expand(BATCH, SEQ)
                with torch.no_grad():
                    local = model(tokens, pos, None).float()  # [b, s, padded_vocab / tp]
                parts = [torch.empty_like(local) for _ in range(tp)]
                dist.all_gather(parts, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
                logits = torch.cat(parts, dim=-1)[..., : dims.vocab_size].cpu()
                diff = float((logits - ref["logits"]).abs().max())
                row.update(max_abs_diff=diff, ok=diff <= atol)
            except Exception as exc:  # recorded per row; the run goes on with the next one
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
            row["seconds"] = round(time.time() - t0, 2)
            results.append(row)
    if dist.get_rank() == 0:
        (work / f"result_tp{tp}.json").write_text(json.dumps(results, indent=2))
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "convert_verify_gpu.json")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--atol", type=float, default=1e-3)
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="convert_verify_"))
    if args.worker:
        worker(work, args.families, args.atol)
        return 0
    if torch.cuda.device_count() < max(args.tp):
        print(f"need {max(args.tp)} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    prepare(work, args.families, max(args.tp))
    report = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "atol": args.atol,
        "batch": BATCH,
        "seq": SEQ,
        "specs": _specs(),
        "runs": [],
    }
    for tp in args.tp:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={tp}",
               str(Path(__file__).resolve()), "--worker", "--work", str(work), "--atol", str(args.atol),
               "--families", *args.families]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        result = work / f"result_tp{tp}.json"
        if proc.returncode != 0 or not result.is_file():
            report["runs"].append({"tp": tp, "ok": False, "error": f"torchrun exited {proc.returncode}",
                                   "stderr_tail": proc.stderr[-4000:]})
            continue
        report["runs"].extend(json.loads(result.read_text()))
    report["all_ok"] = bool(report["runs"]) and all(r.get("ok") for r in report["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "runs"}, indent=2))
    for r in report["runs"]:
        print(r.get("family", "-"), f"tp={r['tp']}", r.get("spec", "-"), r.get("max_abs_diff", r.get("error")))
    return 0 if report["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
