"""Hand-written reference of the train.py that `dlmspec compile` renders.

It builds megatron-core's config objects explicitly, then calls
dlmspec.backends.megatron.training.train().  Launch with torchrun for several GPUs:

    torchrun --nproc-per-node 8 bench/runtime/train_reference.py --preset qwen3-1.7b

or plainly for one process:

    python bench/runtime/train_reference.py --preset demo --train-iters 200

The command-line flags only exist so the same file serves GPU tests; a compiled
train.py writes every value as a literal.  On one H200, Qwen3-1.7B at seq 4096
fits micro batch 4 as is and micro batch 8 only with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (bench/results/runtime_qwen3_1.7b_h200.json).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

# The installed dlmspec first (its backends and templates are mapped in by package-dir; the checkout's
# dlmspec/ folder has neither); the checkout only when no dlmspec is installed (an editable install).
import importlib.util  # noqa: E402

if importlib.util.find_spec("dlmspec") is None:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron.config import (
    CheckpointConfig,
    KernelConfig,
    LoggingConfig,
    ObjectiveConfig,
    RunConfig,
    ScheduleConfig,
)
from dlmspec.backends.megatron.data import DataConfig
from dlmspec.backends.megatron.layers import build_layer_spec
from dlmspec.backends.megatron.training import train

# Model sizes.  Token ids: the tokenizer has `tokenizer_vocab` ids, documents
# end with `eod_id`, the MDM mask token is the first unused id and the
# embedding has `padded_vocab` rows (a multiple of 128).
PRESETS = {
    "tiny": dict(
        num_layers=2, hidden_size=128, ffn_hidden_size=384, num_attention_heads=4,
        num_query_groups=2, kv_channels=32, tokenizer_vocab=1000, eod_id=999,
        mask_token_id=1000, padded_vocab=1024, rotary_base=10000, seq_length=128,
    ),
    "demo": dict(
        num_layers=8, hidden_size=512, ffn_hidden_size=1536, num_attention_heads=8,
        num_query_groups=4, kv_channels=64, tokenizer_vocab=32000, eod_id=31999,
        mask_token_id=32000, padded_vocab=32128, rotary_base=10000, seq_length=512,
    ),
    # Qwen3-1.7B architecture (Qwen/Qwen3-1.7B config.json): untied embeddings,
    # RMSNorm, SwiGLU, QK-norm, GQA 16/8 with head dim 128, RoPE base 1e6.
    "qwen3-1.7b": dict(
        num_layers=28, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16,
        num_query_groups=8, kv_channels=128, tokenizer_vocab=151669, eod_id=151643,
        mask_token_id=151669, padded_vocab=151936, rotary_base=1000000, seq_length=4096,
    ),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    p.add_argument("--objective", choices=["mdm", "ar"], default="mdm")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--global-batch-size", type=int, default=None, help="default: one microbatch per DP rank")
    p.add_argument("--seq-length", type=int, default=None, help="default: the preset's")
    p.add_argument("--train-iters", type=int, default=100)
    p.add_argument("--stop-at-iteration", type=int, default=None)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--data-prefix", action="append", default=None, help="indexed dataset prefix (repeatable); default: mock data")
    p.add_argument("--save-dir", default=None)
    p.add_argument("--save-interval", type=int, default=None)
    p.add_argument("--run-dir", default="runs/reference")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--profile-steps", default=None, metavar="A:B",
                   help="torch.profiler over steps A..B-1 on rank 0 (summary in <run-dir>/profile/)")
    p.add_argument("--eval-interval", type=int, default=None)
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none")
    p.add_argument("--no-fusion", action="store_true", help="disable megatron's torch.compile'd bias-SwiGLU / bias-dropout-add")
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--pipeline-parallel", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--cross-entropy", choices=["megatron", "fused_linear"], default="megatron",
                   help="[kernels] cross_entropy (fused_linear: output projection + CE on the masked rows only)")
    p.add_argument("--fused-linear-impl", choices=["auto", "liger", "torch"], default="auto")
    p.add_argument("--ce-fusion", action="store_true", help="megatron-core's fused cross entropy (megatron path)")
    p.add_argument("--rope-fusion", action="store_true", help="fused RoPE (backends/megatron/rope.py, torch.compile)")
    p.add_argument("--qkv-fusion", action="store_true",
                   help="[kernels] qkv_fusion: split + q/k RMSNorm + RoPE in one compiled kernel (backends/megatron/qkv.py)")
    p.add_argument("--compiled-norm", action="store_true",
                   help="[kernels] compiled_norm: torch.compile'd RMSNorm (backends/megatron/norms.py)")
    p.add_argument("--sdpa-backend", choices=["auto", "flash", "cudnn", "efficient"], default="auto")
    p.add_argument("--grad-reduce-in-bf16", action="store_true", help="reduce gradients in bf16 (default fp32)")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="overlap the distributed optimizer's parameter all-gather with the next forward")
    return p.parse_args()


def main():
    args = parse_args()
    model = PRESETS[args.preset]
    seq_length = args.seq_length or model["seq_length"]
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    data_parallel_size = world_size // (args.tensor_parallel * args.pipeline_parallel)
    global_batch_size = args.global_batch_size or args.micro_batch_size * data_parallel_size
    fused = not args.no_fusion

    transformer_config = TransformerConfig(
        # architecture
        num_layers=model["num_layers"],
        hidden_size=model["hidden_size"],
        ffn_hidden_size=model["ffn_hidden_size"],
        num_attention_heads=model["num_attention_heads"],
        num_query_groups=model["num_query_groups"],
        kv_channels=model["kv_channels"],
        normalization="RMSNorm",
        layernorm_epsilon=1e-6,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=0.02,
        # precision
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        # parallelism
        tensor_model_parallel_size=args.tensor_parallel,
        pipeline_model_parallel_size=args.pipeline_parallel,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        sequence_parallel=args.tensor_parallel > 1,
        # kernels available without Transformer Engine / Apex
        bias_activation_fusion=fused,
        bias_dropout_fusion=fused,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # loss: normalise by the tokens of the whole global batch (LLaDA)
        calculate_per_token_loss=True,
        cross_entropy_loss_fusion=args.ce_fusion,
        cross_entropy_fusion_impl="native",
        # activation recomputation
        recompute_granularity=None if args.recompute == "none" else args.recompute,
        recompute_method="uniform" if args.recompute == "full" else None,
        recompute_num_layers=1 if args.recompute == "full" else None,
    )

    layer_spec = build_layer_spec(
        attention="bidirectional" if args.objective == "mdm" else "causal",
        num_experts=None,
        moe_grouped_gemm=False,
        qk_layernorm=True,
        normalization="RMSNorm",
        sdpa_backend=args.sdpa_backend,
        qkv_fusion=args.qkv_fusion,
        compiled_norm=args.compiled_norm,
    )

    model_kwargs = dict(
        vocab_size=model["padded_vocab"],
        max_sequence_length=seq_length,
        position_embedding_type="rope",
        rotary_base=model["rotary_base"],
        rotary_percent=1.0,
        share_embeddings_and_output_weights=False,
    )

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
        overlap_grad_reduce=data_parallel_size > 1,
        overlap_param_gather=args.overlap_param_gather and data_parallel_size > 1,
        use_distributed_optimizer=True,
        check_for_nan_in_grad=True,
        bucket_size=None,
    )

    optimizer_config = OptimizerConfig(
        optimizer="adam",
        lr=args.lr,
        min_lr=args.lr / 10,
        weight_decay=0.1,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_eps=1e-8,
        clip_grad=1.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        use_distributed_optimizer=True,
    )

    run = RunConfig(
        objective=ObjectiveConfig(
            kind=args.objective,
            mask_token_id=model["mask_token_id"],
            eps=1e-3,
            loss_weighting="llada",
            variable_length_prob=0.01,
        ),
        data=DataConfig(
            seq_length=seq_length,
            vocab_size=model["tokenizer_vocab"],
            eod_id=model["eod_id"],
            pad_id=None,
            mock=args.data_prefix is None,
            blend=[(prefix, 1.0) for prefix in args.data_prefix] if args.data_prefix else None,
            valid_blend=None,
            split="98,2,0",
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            num_workers=2,
        ),
        schedule=ScheduleConfig(
            micro_batch_size=args.micro_batch_size,
            global_batch_size=global_batch_size,
            train_iters=args.train_iters,
            lr_warmup_iters=min(100, args.train_iters // 10),
            lr_decay_style="cosine",
            eval_interval=args.eval_interval,
            eval_iters=4,
            stop_at_iteration=args.stop_at_iteration,
        ),
        checkpoint=CheckpointConfig(
            save_dir=args.save_dir,
            save_interval=args.save_interval,
            resume=True,
            save_at_end=True,
            exit_signals=("SIGTERM", "SIGUSR1"),
            signal_exit_code=85,
            optimizer_sharding="dp_reshardable",
        ),
        logging=LoggingConfig(
            run_dir=args.run_dir,
            log_interval=args.log_interval,
            tensorboard=True,
            console="auto",
            peak_tflops_per_gpu=989.0,
            profile=args.profile_steps is not None,
            profile_step_start=int(args.profile_steps.split(":")[0]) if args.profile_steps else 10,
            profile_step_end=int(args.profile_steps.split(":")[1]) if args.profile_steps else 12,
        ),
        seed=args.seed,
        kernels=KernelConfig(cross_entropy=args.cross_entropy, fused_linear_impl=args.fused_linear_impl,
                             apply_rope_fusion=args.rope_fusion),
        name=f"reference-{args.preset}-{args.objective}",
    )

    result = train(
        run,
        transformer_config=transformer_config,
        layer_spec=layer_spec,
        model_kwargs=model_kwargs,
        ddp_config=ddp_config,
        optimizer_config=optimizer_config,
        tensor_model_parallel_size=args.tensor_parallel,
        pipeline_model_parallel_size=args.pipeline_parallel,
        virtual_pipeline_model_parallel_size=None,
        context_parallel_size=1,
        expert_model_parallel_size=1,
        expert_tensor_parallel_size=None,
    )
    print(f"finished: {result}", flush=True)


if __name__ == "__main__":
    main()
