"""GPU check of ``checkpoint.init_from = "hf:PATH"`` through a compiled train.py.

Two halves, so the GPU machine needs neither pydantic nor the compiler:

``prepare`` (here, on the CPU machine, from the repository root)::

    .venv/bin/python bench/convert/init_from_gpu.py prepare

writes ``.device/init_from/`` (ignored by git, about 0.5 MB; carry it to the GPU machine):

* ``hf/``: a tiny random Hugging Face Qwen3 (``dlmspec.backends.convert.tiny``; 2 layers, hidden 64,
  head_dim 24 != hidden / heads, qk-norm, vocabulary 100), then taught the pattern below for
  60 Adam steps on the CPU, so its loss (about 0.02) is far below a random initialisation's
  (about ln 128 = 4.85);
* ``data/periodic_text_document.{bin,idx}``: 64 documents of 64 tokens repeating one random
  32-token pattern, so every training sample (32 tokens + 1, starting at a multiple of 32 in
  the document stream, whatever the shuffle) is the same sequence;
* ``tp1/`` and ``tp2/``: ``dlmspec compile`` of a spec with the model's dimensions, the AR
  objective (causal attention), fp32, 3 steps of 2 sequences, ``log_interval = 1`` and
  ``checkpoint.init_from = "hf:.device/init_from/hf"`` (TP 1 on one GPU; TP 2 on two, which
  pads the vocabulary to 256 and reshards the converted checkpoint);
* ``reference.json``: the Hugging Face model's loss on that sequence, computed here in fp32
  over the run's padded vocabulary (megatron's padding rows are zero, so the padded columns
  are logits of 0): the loss the run's first step must log.

``run`` (on the GPU machine, from the repository root; nothing is compiled there; it needs
torch, megatron-core and transformers, the runtime extra)::

    python3 bench/convert/init_from_gpu.py run [--tp 1] [--tp 2]

(with the device tool: ``run(command="python3 bench/convert/init_from_gpu.py run",
carry=[".device/init_from"])`` on one H200; ``--tp 1 --tp 2`` on two.)

launches the compiled ``launch.sh`` three times per TP:

A. fresh: rank 0 converts the folder into ``<save>/init_from_hf``; the start record says
   ``weights.from = "init_from"``, ``cache = "converted"``; the iteration-1 loss (the initial
   weights' loss, logged before the first update changes them) equals the reference;
B. relaunch: the checkpoint A saved at its end wins (``weights.from = "resume"``), nothing is
   converted (the cache marker is unchanged);
C. A's checkpoints removed, the cache kept: ``init_from`` again, ``cache = "reused"``, and the
   same first loss as A.

It writes one JSON (``$OUT/init_from_gpu.json`` when ``OUT`` is set, else
``OUT/init_from_gpu.json``) with each launch's exit code, seconds, start record
``weights`` and losses, each check's outcome and ``all_ok``, and each launch's console output
under ``init_from_gpu_logs/`` beside it; exit code 0 when every check passed. About 1.5 minutes of GPU time at TP 1 (three launches of ~20-30 s; the conversion runs
on the CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = Path(".device") / "init_from"  # relative: the spec's paths are read from the repository root
SEQ, PERIOD, DOCS, DOC_LEN, STEPS, TEACH_STEPS = 32, 32, 64, 64, 3, 60
TOL_REFERENCE = 2e-3  # fp32 on the GPU vs fp32 on the CPU, mean cross entropy over 64 tokens
TOL_RELAUNCH = 1e-5


def _spec(dims, tp: int) -> dict:
    """The spec: the tiny model's dimensions, AR, fp32, 3 steps, init_from the HF folder."""
    name = f"init-from-tp{tp}"
    run = f"{WORK}/runs/tp{tp}"
    return {
        "name": name,
        "model": {
            "num_layers": dims.num_layers, "hidden_size": dims.hidden_size, "ffn_hidden_size": dims.ffn_hidden_size,
            "num_attention_heads": dims.num_attention_heads, "num_query_groups": dims.num_query_groups,
            "kv_channels": dims.kv_channels, "vocab_size": dims.vocab_size, "make_vocab_size_divisible_by": 128,
            "max_position_embeddings": dims.max_position_embeddings, "rotary_base": dims.rotary_base,
            "layernorm_epsilon": dims.norm_epsilon, "qk_layernorm": dims.qk_layernorm,
            "add_qkv_bias": dims.add_qkv_bias, "untie_embeddings_and_output_weights": not dims.tied,
            "transformer_impl": "local",
        },
        "objective": {"kind": "ar"},
        "kernels": {"cross_entropy": "megatron"},  # GPTModel's logits + megatron's cross entropy, as verify_gpu.py
        "parallel": {"tensor_model_parallel_size": tp},
        "precision": {"dtype": "fp32"},
        "train": {"micro_batch_size": 1, "global_batch_size": 2, "seq_length": SEQ, "train_iters": STEPS,
                  "lr": 1e-4, "min_lr": 1e-5, "lr_warmup_iters": 0, "lr_decay_style": "constant", "seed": 1234},
        "data": {"train": [f"{WORK}/data/periodic_text_document"], "split": "100,0,0", "num_workers": 0,
                 "tokenizer": {"type": "NullTokenizer", "vocab_size": dims.vocab_size - 1}},
        "checkpoint": {"init_from": f"hf:{WORK}/hf", "save": f"{run}/ckpt", "save_interval": 1000},
        "cluster": {"gpu": "h200", "gpus_per_node": tp, "nodes": 1},
        "logging": {"run_dir": run, "log_interval": 1},
    }


def prepare(tps: list[int]) -> None:
    """Model, data, compiled directories and reference losses under ``.device/init_from``."""
    import numpy as np
    import tomli_w
    import torch
    import torch.nn.functional as F
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from dlmspec.backends.convert import dims_from_hf_config
    from dlmspec.backends.convert.hf_io import read_hf_config
    from dlmspec.backends.convert.tiny import make_tiny_hf

    work = REPO / WORK
    if work.exists():
        shutil.rmtree(work)
    src, reference = make_tiny_hf("qwen3", work / "hf", seed=11)
    dims = dims_from_hf_config(read_hf_config(src))
    pattern = torch.randint(0, dims.vocab_size - 1, (PERIOD,), generator=torch.Generator().manual_seed(5))
    sample = torch.cat([pattern, pattern[:1]])  # every training sample: SEQ inputs and their next tokens
    # Teach the random model the sequence (CPU, seconds), so its loss is far below a random
    # initialisation's (about ln(padded vocabulary)) as well as exactly known.
    reference.train()
    optimizer = torch.optim.Adam(reference.parameters(), lr=3e-3)
    for _ in range(TEACH_STEPS):
        optimizer.zero_grad()
        out = reference(input_ids=sample[None, :-1]).logits[0]
        F.cross_entropy(out.float(), sample[1:]).backward()
        optimizer.step()
    reference.eval()
    reference.save_pretrained(src)
    (work / "data").mkdir(parents=True)
    prefix = work / "data" / "periodic_text_document"
    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.int32)
    for _ in range(DOCS):
        builder.add_document(pattern.repeat(DOC_LEN // PERIOD), [DOC_LEN])
    builder.finalize(str(prefix) + ".idx")

    with torch.no_grad():
        logits = reference(input_ids=sample[None, :-1]).logits.float()[0]  # [SEQ, vocab]
    out = {"pattern": pattern.tolist(), "seq_length": SEQ, "family": "qwen3", "dims": dims.to_dict(), "tp": {}}
    for tp in tps:
        spec_path = work / f"spec_tp{tp}.toml"
        spec_path.write_text(tomli_w.dumps(_spec(dims, tp)))
        cmd = [sys.executable, "-m", "dlmspec.cli", "compile", str(spec_path.relative_to(REPO)), "-o",
               str(WORK / f"tp{tp}"), "--force"]
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"compile failed:\n{result.stdout}\n{result.stderr}")
        lock = (work / f"tp{tp}" / "spec.lock.toml").read_text()
        padded = next(int(line.split("=")[1]) for line in lock.splitlines() if line.startswith("padded_vocab_size"))
        padded_logits = F.pad(logits, (0, padded - dims.vocab_size))  # megatron's zero padding rows
        loss = float(F.cross_entropy(padded_logits, sample[1:]))
        out["tp"][str(tp)] = {"padded_vocab_size": padded, "reference_loss": loss,
                              "uniform_loss": math.log(padded)}
        print(f"tp{tp}: compiled into {WORK}/tp{tp}; reference first loss {loss:.6f} (padded vocabulary {padded})")
    (work / "reference.json").write_text(json.dumps(out, indent=2) + "\n")


# ------------------------------------------------------------------------------------------ run


def _launch(tp: int, tag: str, limit: int, logs: Path) -> dict:
    """Run ``tp{tp}/launch.sh``; its metrics.jsonl records and exit code."""
    run_dir = REPO / WORK / "runs" / f"tp{tp}"
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()
    t0 = time.time()
    with open(logs / f"tp{tp}_{tag}.log", "w") as log:
        proc = subprocess.run(["timeout", "-s", "KILL", str(limit), "bash", str(WORK / f"tp{tp}" / "launch.sh")],
                              cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "DLMSPEC_PYTHON": os.environ.get("DLMSPEC_PYTHON", sys.executable)})
    sys.path.insert(0, str(REPO / "bench"))
    import common  # bench/common.py: read_metrics

    records = common.read_metrics(metrics)
    start = (common.events(records, "start") or [{}])[0]
    losses = {r["iteration"]: r["loss"] for r in common.events(records, "train")}
    return {"tag": tag, "exit_code": proc.returncode, "seconds": round(time.time() - t0, 1),
            "weights": start.get("weights"), "iteration_at_start": start.get("iteration"), "losses": losses,
            "log_tail": (logs / f"tp{tp}_{tag}.log").read_text()[-1500:]}


def run(tps: list[int], limit: int, out: Path) -> int:
    """Launches A, B, C per TP and the checks; returns the exit code."""
    import torch

    ref = json.loads((REPO / WORK / "reference.json").read_text())
    logs = out.parent / "init_from_gpu_logs"
    logs.mkdir(parents=True, exist_ok=True)
    report = {"command": "python3 bench/convert/init_from_gpu.py run " + " ".join(f"--tp {t}" for t in tps),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "torch": torch.__version__, "tol_reference": TOL_REFERENCE, "runs": [], "checks": []}

    def check(name: str, ok: bool, detail: object) -> None:
        report["checks"].append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    for tp in tps:
        if torch.cuda.device_count() < tp:
            check(f"tp{tp}: GPUs", False, f"needs {tp}, found {torch.cuda.device_count()}")
            continue
        expected = ref["tp"][str(tp)]["reference_loss"]
        run_dir = REPO / WORK / "runs" / f"tp{tp}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cache = run_dir / "ckpt" / "init_from_hf"
        marker = cache / "dlmspec_init_from.json"

        a = _launch(tp, "A", limit, logs)
        report["runs"].append({"tp": tp, **a})
        w = a["weights"] or {}
        check(f"tp{tp} A: exit 0", a["exit_code"] == 0, a["exit_code"])
        check(f"tp{tp} A: weights from init_from, converted", (w.get("from"), w.get("cache")) == ("init_from", "converted"),
              {k: w.get(k) for k in ("from", "cache", "reason", "convert_seconds", "load_seconds")})
        first = a["losses"].get(1)
        check(f"tp{tp} A: first loss equals the HF model's", first is not None and abs(first - expected) <= TOL_REFERENCE,
              {"first_loss": first, "reference": expected, "uniform_loss": ref["tp"][str(tp)]["uniform_loss"],
               "abs_diff": None if first is None else abs(first - expected)})
        uniform = ref["tp"][str(tp)]["uniform_loss"]
        check(f"tp{tp} A: first loss far below a random initialisation's", first is not None and first < 0.25 * uniform,
              {"first_loss": first, "ln_padded_vocab": uniform})
        check(f"tp{tp} A: cache marker written", marker.is_file(), str(marker))
        marker_mtime = marker.stat().st_mtime_ns if marker.is_file() else None

        b = _launch(tp, "B", limit, logs)
        report["runs"].append({"tp": tp, **b})
        w = b["weights"] or {}
        check(f"tp{tp} B: relaunch resumes (resume wins over init_from)",
              b["exit_code"] == 0 and w.get("from") == "resume" and b["iteration_at_start"] == STEPS,
              {"exit_code": b["exit_code"], "from": w.get("from"), "iteration_at_start": b["iteration_at_start"]})
        check(f"tp{tp} B: nothing converted", marker.is_file() and marker.stat().st_mtime_ns == marker_mtime, str(marker))

        for entry in (run_dir / "ckpt").iterdir() if (run_dir / "ckpt").is_dir() else ():
            if entry.name == "latest" or entry.name.startswith("iter_"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        c = _launch(tp, "C", limit, logs)
        report["runs"].append({"tp": tp, **c})
        w = c["weights"] or {}
        check(f"tp{tp} C: init_from again, cache reused",
              c["exit_code"] == 0 and (w.get("from"), w.get("cache")) == ("init_from", "reused"),
              {"exit_code": c["exit_code"], "from": w.get("from"), "cache": w.get("cache")})
        again = c["losses"].get(1)
        check(f"tp{tp} C: same first loss as A", first is not None and again is not None
              and abs(again - first) <= TOL_RELAUNCH, {"A": first, "C": again})

    report["all_ok"] = bool(report["checks"]) and all(c["ok"] for c in report["checks"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}; all_ok = {report['all_ok']}")
    return 0 if report["all_ok"] else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="CPU machine: model, data, compiled directories, reference losses")
    p.add_argument("--tp", type=int, action="append", help="TP sizes to compile (default: 1 and 2)")
    r = sub.add_parser("run", help="GPU machine: launches A, B, C per TP and the checks")
    r.add_argument("--tp", type=int, action="append", help="TP sizes to run (default: 1)")
    r.add_argument("--limit", type=int, default=150, help="seconds per launch")
    r.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.chdir(REPO)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if args.step == "prepare":
        prepare(sorted(set(args.tp or [1, 2])))
        return 0
    out = args.out or (Path(os.environ["OUT"]) / "init_from_gpu.json" if os.environ.get("OUT")
                       else REPO / "bench" / "results" / "init_from_gpu.json")
    return run(sorted(set(args.tp or [1])), args.limit, out)


if __name__ == "__main__":
    sys.exit(main())
