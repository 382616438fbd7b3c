"""Write the GPU calibration matrix of the planner: bench/plan/matrix.json.

Each entry is a run the GPU runner executes: a base spec plus ``--set`` overrides, the GPU
count, and whether this checkout's runtime can run it (the ``runtime`` rules of :mod:`dlmspec.check`)
with any validator error. Runs are sized to take ~15 s on one H200 with start-up (50 steps, 30 for Qwen3-1.7B; mock data, so
no files are needed). The runner records, per run, the measured peak
``torch.cuda.max_memory_allocated()`` (max over ranks) and the median step time, in
``bench/results/*.json`` (format: ``bench/plan/calibrate.py``'s docstring), which
``calibrate.py`` compares with the plan.

Usage::

    .venv/bin/python bench/plan/matrix.py            # writes bench/plan/matrix.json
    .venv/bin/python bench/plan/matrix.py --print    # also prints the compile commands

How the runner uses an entry (``name``, ``base``, ``overrides``)::

    dlmspec compile BASE -o runs/plan-NAME --set K=V ...     # for each override
    bash runs/plan-NAME/launch.sh                            # NPROC = gpus
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dlmspec.check import find  # noqa: E402
from dlmspec.spec.load import load  # noqa: E402
from dlmspec.resolve import resolve  # noqa: E402

DEMO = "specs/demo-dlm.toml"
OUT = ROOT / "bench" / "plan" / "matrix.json"

#: Mock data (MockGPTDataset, NullTokenizer of the demo's GPT-2 vocabulary), 50 short steps,
#: no evaluation or checkpoint inside the measured window.
COMMON = [
    "data.mock=true",
    "data.train=[]",
    "data.valid=[]",
    'data.tokenizer.type="NullTokenizer"',
    "data.tokenizer.vocab_size=50256",
    "train.train_iters=50",
    "train.lr_warmup_iters=5",
    "train.eval_interval=50",
    "train.eval_iters=1",
    "logging.log_interval=5",
    "checkpoint.save_interval=1000",
    # Deterministic peaks: the MDM mask path (a truncated sequence) is taken in a random subset of
    # steps; it is measured on purpose by demo-mdm-b32-s512-varlen only.
    "objective.variable_length_prob=0.0",
    # The runs measured before [kernels] existed took megatron's logits + cross entropy; the
    # fused linear cross entropy (the TP = 1 default since) has entries of its own (-fusedce).
    'kernels.cross_entropy="megatron"',
    # The attention kernel the runs took: every run was made with sdpa_backend "auto" when it
    # still meant PyTorch's order, and torch 2.11 (cuDNN 9.19) on an H200 puts cuDNN first
    # (check_prefer_cudnn_attention): the profiles of demo-pp2, demo-moe-ep2, demo-mdm-mb4-x8 and
    # demo-mdm-mha (bench/results/profile_h200x2_2026-11-30.json) hold only cuDNN attention
    # kernels, no flash ones. "cudnn" selects the same kernels (it also makes q, k, v dense first).
    'kernels.sdpa_backend="cudnn"',
    # Every run was measured before [kernels] qkv_fusion and compiled_norm existed (default on
    # since, local path): megatron-core's QKV split / q-k norm / RoPE and its norms, as they ran.
    "kernels.qkv_fusion=false",
    "kernels.compiled_norm=false",
]
#: Runs compiled after [kernels] apply_rope_fusion existed (default on): fused RoPE. Every other
#: run was measured with megatron-core's unfused RoPE and pins apply_rope_fusion=false.
FUSED_ROPE_RUNS = {"demo-cp2", "demo-cp2-ar", "demo-fsdp"}
#: Runs with every [kernels] default of this checkout (fused RoPE, qkv_fusion, compiled_norm,
#: cuDNN attention through "auto", the fused linear cross entropy at TP = 1): the kernels' effect
#: on time and memory as users get it.
DEFAULT_KERNELS = [
    'kernels.cross_entropy="auto"',
    'kernels.sdpa_backend="auto"',
    "kernels.apply_rope_fusion=true",
    "kernels.qkv_fusion=true",
    "kernels.compiled_norm=true",
]
FUSED_CE = ['kernels.cross_entropy="fused_linear"']

#: Qwen3-1.7B's architecture (explicit keys: the demo's explicit dimensions override a preset) on
#: the same mock data (vocabulary 151936 = NullTokenizer 151934 + EOD + [MASK]; tied embeddings).
QWEN = [
    'model.preset="qwen3-1.7b"',
    "model.num_layers=28",
    "model.hidden_size=2048",
    "model.ffn_hidden_size=6144",
    "model.num_attention_heads=16",
    "model.num_query_groups=8",
    "model.kv_channels=128",
    "model.vocab_size=151936",
    "model.max_position_embeddings=4096",
    "model.untie_embeddings_and_output_weights=false",
    "data.tokenizer.vocab_size=151934",  # NullTokenizer: ids 0..151933, EOD 151934
    "objective.mask_token_id=151935",  # 151936 is a multiple of 128: [MASK] takes the last row
]

ONE_GPU: list[tuple[str, list[str]]] = [
    ("demo-mdm-b32-s512", []),
    ("demo-mdm-b8-s2048", ["train.micro_batch_size=8", "train.global_batch_size=8", "train.seq_length=2048",
                           "model.max_position_embeddings=2048"]),
    ("demo-mdm-b4-s4096", ["train.micro_batch_size=4", "train.global_batch_size=4", "train.seq_length=4096",
                           "model.max_position_embeddings=4096"]),
    ("demo-mdm-b32-s512-selective", ["recompute.granularity=\"selective\""]),
    ("demo-mdm-b32-s512-full", ['recompute.granularity="full"', 'recompute.method="uniform"', "recompute.num_layers=1"]),
    # LLaDA's 1% truncated sequences: 27% of 32-sequence microbatches hold one, so 50 steps
    # take the masked SDPA path (additive mask, repeated k/v) almost surely.
    ("demo-mdm-b32-s512-varlen", ["objective.variable_length_prob=0.01"]),
    ("demo-ar-b32-s512", ['objective.kind="ar"']),
    ("demo-mdm-mb4-x8", ["train.micro_batch_size=4", "train.global_batch_size=32"]),
    ("demo-mdm-h1024", ["model.hidden_size=1024", "model.ffn_hidden_size=2816", "model.num_attention_heads=16",
                        "model.num_query_groups=4"]),
    ("demo-mdm-mha", ["model.num_query_groups=12"]),
    ("demo-mdm-gelu", ['model.activation="gelu"', "model.ffn_hidden_size=3072"]),
    ("demo-mdm-dropout", ["model.hidden_dropout=0.1", "model.attention_dropout=0.1"]),
    ("demo-moe-e8-top2", ["model.num_experts=8", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1024",
                          "train.micro_batch_size=16", "train.global_batch_size=16"]),
    ("qwen3-1.7b-mdm-b4-s2048", QWEN + ["train.micro_batch_size=4", "train.global_batch_size=4",
                                        "train.seq_length=2048", "train.train_iters=30", "train.eval_interval=30"]),
    ("demo-mdm-b32-s512-fusedce", FUSED_CE),
    ("qwen3-1.7b-mdm-b4-s2048-fusedce", QWEN + ["train.micro_batch_size=4", "train.global_batch_size=4",
                                                "train.seq_length=2048", "train.train_iters=30",
                                                "train.eval_interval=30"] + FUSED_CE),
    ("demo-mdm-b32-s512-defaults", DEFAULT_KERNELS),
    ("qwen3-1.7b-mdm-b4-s2048-defaults", QWEN + ["train.micro_batch_size=4", "train.global_batch_size=4",
                                                 "train.seq_length=2048", "train.train_iters=30",
                                                 "train.eval_interval=30"] + DEFAULT_KERNELS),
    ("qwen3-1.7b-ar-b4-s2048-full", QWEN + ['objective.kind="ar"',
                                            'recompute.granularity="full"', 'recompute.method="uniform"',
                                            "recompute.num_layers=1", "train.micro_batch_size=4",
                                            "train.global_batch_size=4", "train.seq_length=2048",
                                            "train.train_iters=30", "train.eval_interval=30"]),
]

TWO = ["cluster.gpus_per_node=2"]
TWO_GPU: list[tuple[str, list[str]]] = [
    ("demo-tp2-sp", TWO + ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true"]),
    ("demo-pp2", TWO + ["parallel.pipeline_model_parallel_size=2", "train.micro_batch_size=4",
                        "train.global_batch_size=32"]),
    # Context parallelism on the local layers (no Transformer Engine): SDPA attention all-gathers
    # keys and values over the CP group (backends/megatron/attention.py); MDM bidirectional and
    # AR causal (zig-zag query chunks against key prefixes, masked kernel).
    ("demo-cp2", TWO + ["parallel.context_parallel_size=2", 'parallel.cp_comm_type="allgather"',
                        "train.micro_batch_size=8", "train.global_batch_size=8",
                        "train.seq_length=2048", "model.max_position_embeddings=2048"]),
    ("demo-cp2-ar", TWO + ["parallel.context_parallel_size=2", 'parallel.cp_comm_type="allgather"',
                           'objective.kind="ar"', "train.micro_batch_size=8", "train.global_batch_size=8",
                           "train.seq_length=2048", "model.max_position_embeddings=2048"]),
    ("demo-moe-ep2", TWO + ["model.num_experts=8", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=1024",
                            "parallel.expert_model_parallel_size=2", "train.micro_batch_size=16",
                            "train.global_batch_size=32"]),
    ("demo-dp2-distopt", TWO + ["train.global_batch_size=64", "parallel.use_distributed_optimizer=true"]),
    ("demo-dp2-no-distopt", TWO + ["train.global_batch_size=64", "parallel.use_distributed_optimizer=false"]),
    # Megatron-FSDP at DP 2 (backends/megatron/fsdp.py): weights, gradients and optimizer state
    # sharded (ZeRO-3), the same batch as the demo-dp2-* runs.
    ("demo-fsdp", TWO + ["train.global_batch_size=64", 'parallel.fsdp="megatron"',
                         'parallel.data_parallel_sharding_strategy="optim_grads_params"']),
    ("qwen3-1.7b-tp2-sp", TWO + QWEN + ["parallel.tensor_model_parallel_size=2", "parallel.sequence_parallel=true",
                                        "train.micro_batch_size=4", "train.global_batch_size=4",
                                        "train.seq_length=2048", "train.train_iters=30", "train.eval_interval=30"]),
]


def _status(overrides: list[str]) -> tuple[bool, list[str], str]:
    """(runtime supports it, validator/runtime errors, planned transformer path)."""
    from dlmspec.plan.shape import transformer_impl

    loaded = load(ROOT / DEMO, overrides)
    resolved = resolve(loaded.spec)
    errors = [f"{i.rule}: {i.key}: {i.message}" for i in find(("spec",), loaded, resolved) if i.severity == "error"]
    unsupported = [f"{i.key}: {i.message}" for i in find(("runtime",), loaded, resolved)]
    needs_te = transformer_impl(resolved)[0] == "transformer_engine"
    notes = "needs transformer_engine on the GPU machine" if needs_te else ""
    return not unsupported, errors + unsupported, notes


def build() -> list[dict]:
    """The matrix entries (deterministic order)."""
    entries = []
    for gpus, group in ((1, ONE_GPU), (2, TWO_GPU)):
        for name, extra in group:
            rope = "true" if name in FUSED_ROPE_RUNS else "false"
            overrides = COMMON + [f"kernels.apply_rope_fusion={rope}"] + extra
            supported, errors, notes = _status(overrides)
            entries.append({
                "name": name,
                "gpus": gpus,
                "base": DEMO,
                "overrides": overrides,
                "runtime_supported": supported,
                "errors": errors,
                "notes": notes,
            })
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the compile command of each entry")
    parser.add_argument("--output", default=str(OUT), help="where to write the matrix (JSON)")
    args = parser.parse_args(argv)
    entries = build()
    Path(args.output).write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")
    one = sum(1 for e in entries if e["gpus"] == 1)
    two = len(entries) - one
    print(f"wrote {args.output}: {one} one-GPU and {two} two-GPU runs")
    for e in entries:
        flag = "" if e["runtime_supported"] and not e["errors"] else "  [NOT RUNNABLE: " + "; ".join(e["errors"]) + "]"
        note = f"  ({e['notes']})" if e["notes"] else ""
        print(f"  {e['gpus']} GPU  {e['name']}{note}{flag}")
        if args.print:
            sets = " ".join(f"--set '{o}'" for o in e["overrides"])
            print(f"      dlmspec compile {e['base']} -o runs/plan-{e['name']} {sets}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
