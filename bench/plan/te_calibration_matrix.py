"""The planner's Transformer Engine calibration matrix: bench/plan/te_matrix.json.

Nine configurations of the Qwen3-1.7B-architecture masked-diffusion LM at sequence 4096 on one H200,
all on ``model.transformer_impl = "transformer_engine"``: bf16 and fp8 (``precision.fp8 = "hybrid"``
with the delayed and the current per-tensor, ``tensorwise``, recipes), micro batches 4..16, selective
and full recomputation, and one small MoE (8 experts, top-2, grouped GEMM) that fits the GPU. Each
step is one microbatch (``global_batch_size = micro_batch_size``), so a step is short and a run fits
the session's budget; mock data (``MockGPTDataset``, ``NullTokenizer``), so nothing but the compiled
directory is carried to the GPU machine.

Three entries are ``held_out``: their plans are committed before the run
(``bench/plan/te_holdout.py predict``) and ``bench/plan/calibrate.py`` leaves them out of the TE fit,
reporting them against the fitted constants instead (out of sample). The entries are in the order
``bench/devbox/gpu/te_calibration.sh`` runs them: what a short budget must not miss first (the issue's two
configurations, then the three held out), the two longest runs (micro batch 16) last.

The format is ``bench/plan/matrix.json``'s plus ``transformer_impl``, ``held_out``, ``note``, ``steps`` and
``warmup_steps`` (the steps the median step time leaves out).

    .venv/bin/python bench/plan/te_calibration_matrix.py   # writes bench/plan/te_matrix.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "plan" / "te_matrix.json"
BASE = "specs/demo-dlm.toml"
#: Steps per run: one microbatch each; the median is over the steps after :data:`WARMUP_STEPS`.
STEPS = 10
#: Steps left out of the median (TE's first fp8 steps, cuDNN's plan search, the allocator's growth).
WARMUP_STEPS = 3

#: Mock data, logged every step, no evaluation or checkpoint, one microbatch per step.
COMMON = [
    "data.mock=true", "data.train=[]", "data.valid=[]", 'data.tokenizer.type="NullTokenizer"',
    f"train.train_iters={STEPS}", "train.lr_warmup_iters=2", f"train.eval_interval={STEPS}", "train.eval_iters=1",
    "logging.log_interval=1", "checkpoint.save_interval=1000", "checkpoint.save_at_end=false",
    "objective.variable_length_prob=0.0", 'model.transformer_impl="transformer_engine"',
]
#: The Qwen3-1.7B architecture at sequence 4096 with untied embeddings (2.03B parameters): the benchmark's
#: throughput configuration (tests/unit/plan/test_plan_provenance.py QWEN3_TE).
QWEN = [
    'model.preset="qwen3-1.7b"', "model.num_layers=28", "model.hidden_size=2048", "model.ffn_hidden_size=6144",
    "model.num_attention_heads=16", "model.num_query_groups=8", "model.kv_channels=128", "model.vocab_size=151936",
    "model.max_position_embeddings=4096", "model.untie_embeddings_and_output_weights=true",
    "data.tokenizer.vocab_size=151934", "objective.mask_token_id=151935", "train.seq_length=4096",
]
FP8_DELAYED = ['precision.fp8="hybrid"', 'precision.fp8_recipe="delayed"']
FP8_TENSORWISE = ['precision.fp8="hybrid"', 'precision.fp8_recipe="tensorwise"']
SELECTIVE = ['recompute.granularity="selective"', 'recompute.modules=["core_attn", "mlp"]']
FULL = ['recompute.granularity="full"', 'recompute.method="uniform"', "recompute.num_layers=1"]
#: A small MoE that fits one H200: every layer 8 experts of 1,536 (a quarter of the dense MLP), top-2,
#: grouped GEMM, no token dropping (EP = 1: the alltoall dispatcher moves nothing between GPUs).
MOE = ["model.num_experts=8", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1536",
       "model.moe_grouped_gemm=true"]


def mb(n: int) -> list[str]:
    """One microbatch of ``n`` sequences per step."""
    return [f"train.micro_batch_size={n}", f"train.global_batch_size={n}"]


#: name -> (overrides beyond COMMON + QWEN, held out, note).
CONFIGS: dict[str, tuple[list[str], bool, str]] = {
    "te-bf16-mb8": (mb(8), False, "bf16, the issue's 40.9k tokens/s configuration (one microbatch per step here)"),
    "te-fp8-delayed-mb8": (mb(8) + FP8_DELAYED, False, "fp8 delayed scaling, the issue's 50.6k tokens/s configuration"),
    "te-bf16-mb12": (mb(12) + ["cluster.allow_memory_overflow=true"], True,
                     "held out: the configuration the planner calls 'does not fit' (143 GiB planned; it ran at 127.6 GiB "
                     "allocated with 4 microbatches per step): allow_memory_overflow lets it compile"),
    "te-fp8-tensorwise-mb8": (mb(8) + FP8_TENSORWISE, True, "held out: fp8 current per-tensor scaling"),
    "te-fp8-delayed-mb12-selective": (mb(12) + FP8_DELAYED + SELECTIVE, True,
                                      "held out: fp8 delayed with selective recomputation"),
    "te-moe-e8-top2-mb4": (mb(4) + MOE, False, "MoE: 8 experts, top-2, grouped GEMM, bf16"),
    "te-bf16-mb4": (mb(4), False, "bf16, the smallest micro batch (the cheapest run: repeated first)"),
    "te-fp8-tensorwise-mb16-full": (mb(16) + FP8_TENSORWISE + FULL, False,
                                    "fp8 current per-tensor scaling, full recomputation of every layer"),
    "te-bf16-mb16-selective": (mb(16) + SELECTIVE, False, "selective recomputation of core_attn and mlp"),
}


def entries() -> list[dict]:
    """The matrix entries, in run order."""
    return [{"name": name, "gpus": 1, "base": BASE, "transformer_impl": "transformer_engine", "held_out": held,
             "note": note, "steps": STEPS, "warmup_steps": WARMUP_STEPS, "overrides": COMMON + QWEN + extra}
            for name, (extra, held, note) in CONFIGS.items()]


def main() -> int:
    OUT.write_text(json.dumps(entries(), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(CONFIGS)} configurations, "
          f"{sum(h for _, h, _ in CONFIGS.values())} held out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
