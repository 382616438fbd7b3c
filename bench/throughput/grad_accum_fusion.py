"""``[kernels] gradient_accumulation_fusion`` on against off, on the Transformer Engine path of the
demo spec (bench/throughput/demo-dlm-te.toml: specs/demo-dlm.toml's model and batch, TE layers,
mock data), one GPU, one command::

    PYTHONUNBUFFERED=1 python3 bench/throughput/grad_accum_fusion.py      # JSON into $OUT (else bench/results)
    python3 bench/throughput/grad_accum_fusion.py --dry-run              # the jobs' commands only

It adds two compiled variants to bench/throughput/run.py (``te-gaf-off``: the fusion false;
``te-gaf-on``: true) and runs run.py's megatron side with them, alternating, at the demo's micro
batch 32 and seq 512 (each job a fresh process: compile, then train.py under torchrun; 3 warm-up +
10 timed steps). Then it writes ``grad_accum_fusion_<date>.json``: whether APEX's
``fused_weight_gradient_mlp_cuda`` and Transformer Engine import on this machine (``true`` fuses
the Transformer Engine linears either way, and the output layer too only with APEX: the JSON's
``on_fuses`` says which), each variant's best median step time and tokens/s, and ``speedup`` =
off's median step time / on's. run.py's own results file and log sit beside it.
The MFU/TFLOP columns of run.py's file count the ``--preset``'s model, not the demo's: compare
step times.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as throughput  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "bench" / "throughput" / "demo-dlm-te.toml"
VARIANTS = {
    "te-gaf-off": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                 "kernels.gradient_accumulation_fusion": False},
                   "what": "demo spec, Transformer Engine layers, gradient_accumulation_fusion = false"},
    "te-gaf-on": {"precision": "bf16", "sets": {"model.transformer_impl": "transformer_engine",
                                                "kernels.gradient_accumulation_fusion": True},
                  "what": "demo spec, Transformer Engine layers, gradient_accumulation_fusion = true "
                          "(TE linears; the output layer too when APEX imports)"},
}


def imports(python: str) -> Dict[str, bool]:
    """Whether APEX's kernel and Transformer Engine import (this interpreter; ``--python`` is
    checked by run.py's own import check)."""
    out = {}
    for name in ("fused_weight_gradient_mlp_cuda", "transformer_engine"):
        try:
            __import__(name)
            out[name] = True
        except Exception:  # noqa: BLE001 - any import failure means the kernel is not usable
            out[name] = False
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="results directory (default: $OUT, else bench/results)")
    p.add_argument("--micro-batch-sizes", default="32", help="comma-separated (the demo's: 32)")
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    throughput.MEGATRON_VARIANTS.update(VARIANTS)
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    forwarded = ["--sides", "megatron", "--megatron-variants", ",".join(VARIANTS), "--megatron-spec", str(SPEC),
                 "--megatron-micro-batch-sizes", args.micro_batch_sizes, "--seq-length", str(args.seq_length),
                 "--warmup", str(args.warmup), "--steps", str(args.steps), "--budget-s", str(args.budget_s),
                 "--out", str(out_dir), "--python", args.python, "--tag", "grad-accum-fusion",
                 "--no-fusion-fallback"]
    if args.dry_run:
        return throughput.main(forwarded + ["--dry-run"])
    started = time.time()
    code = throughput.main(forwarded)
    results_files = sorted(out_dir.glob("throughput_*_grad-accum-fusion*.json"), key=lambda q: q.stat().st_mtime)
    summary: Dict[str, Any] = {"command": "python3 bench/throughput/grad_accum_fusion.py", "spec": str(SPEC.relative_to(ROOT)),
                               "imports": imports(args.python), "run_py_exit": code, "variants": {}}
    summary["on_fuses"] = ("TE linears and the output layer" if summary["imports"]["fused_weight_gradient_mlp_cuda"]
                           else "TE linears only (no APEX: the output layer unfused)")
    if results_files and results_files[-1].stat().st_mtime >= started:
        data = json.loads(results_files[-1].read_text())
        summary["results_file"] = results_files[-1].name
        best = data.get("megatron", {}).get("best_by_variant") or {}
        for name in VARIANTS:
            row = best.get(name)
            summary["variants"][name] = None if not row else {
                k: row.get(k) for k in ("micro_batch_size", "median_step_time_s", "tokens_per_s", "peak_mem_gib")}
        attempts = data.get("megatron", {}).get("attempts", [])
        summary["failures"] = [{k: a.get(k) for k in ("variant", "micro_batch_size", "status", "error")}
                               for a in attempts if a.get("status") not in (None, "ok")]
        off, on = summary["variants"].get("te-gaf-off"), summary["variants"].get("te-gaf-on")
        if off and on and off.get("median_step_time_s") and on.get("median_step_time_s"):
            summary["speedup"] = off["median_step_time_s"] / on["median_step_time_s"]
    path = out_dir / ("grad_accum_fusion_" + time.strftime("%Y-%m-%d_%H%M%S") + ".json")
    path.write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
