"""Helpers shared by tests (moved from test_validate_compile_agree.py): BASE, FAILING, SPEC_EXAMPLES, TIGHT, TOO_BIG, merged, spec_rule_examples."""

from __future__ import annotations

import copy
from typing import Any
import validate_kit
import rule_cases_kit
from spec_kit import spec_dict


#: What :data:`BASE` changes in spec_kit.DEFAULT (data from files, a tensorboard folder):
#: ``spec_file(folder, AGREE, changes)`` writes BASE with ``changes``.
AGREE: dict[str, Any] = {
    "data": {"tokenizer": {"type": "NullTokenizer", "vocab_size": 999}, "train": ["data/x_text_document"]},
    "logging": {"tensorboard_dir": "runs/t/tensorboard"},
}

#: A small valid spec (8 GPUs, data parallel): the failing examples change it.
BASE: dict[str, Any] = spec_dict(AGREE)


#: A peak of about 105 GiB per GPU on H100s (80 GiB): the memory rule's example.
TOO_BIG = {"train.seq_length": 262144, "model.max_position_embeddings": 262144, "train.micro_batch_size": 8}


#: A peak of 99.5% of an H100's memory: the headroom rule's example.
TIGHT = {"train.seq_length": 196608, "model.max_position_embeddings": 196608, "train.micro_batch_size": 8}


#: A block-diffusion spec that validates (the base of the bd3lm rules' examples).
BD3 = {"objective.kind": "bd3lm", "objective.block_size": 16, "model.transformer_impl": "local",
       "model.attention_backend": "flex"}

#: A masked-diffusion spec adapting an AR checkpoint with attention annealing that validates.
from validate_kit import ANNEAL  # noqa: E402 (one definition of the annealing settings)

#: (changes to BASE, the rule and key that refuse it): the rules of the runtime, SLURM, memory
#: and the end-of-document id, and a schema error beside a rule error.
FAILING: list[tuple[dict[str, Any], str, str]] = [
    ({k: v for k, v in BD3.items() if k != "objective.block_size"}, "bd3lm-needs-block-size", "objective.block_size"),
    ({**BD3, "objective.block_size": 24}, "bd3lm-block-divides-seq", "objective.block_size"),
    ({**BD3, "objective.noise_clip_min": 0.8, "objective.noise_clip_max": 0.3}, "bd3lm-noise-clip-order",
     "objective.noise_clip_min"),
    ({"objective.ar_loss_weight": 0.5}, "bd3lm-keys-ignored", "objective.ar_loss_weight"),
    ({**BD3, "objective.shift": True}, "bd3lm-mdm-keys-ignored", "objective.shift"),
    ({**BD3, "objective.variable_length_prob": 0.01}, "bd3lm-variable-length", "objective.variable_length_prob"),
    ({**BD3, "objective.attention_mask": "block_causal"}, "bd3lm-attention-mask", "objective.attention_mask"),
    ({"objective.kind": "bd3lm", "objective.block_size": 16, "model.transformer_impl": "transformer_engine"},
     "bd3lm-transformer-engine", "model.transformer_impl"),
    ({**BD3, "parallel.context_parallel_size": 2}, "bd3lm-context-parallel", "parallel.context_parallel_size"),
    ({**BD3, "parallel.pipeline_model_parallel_size": 2}, "bd3lm-pipeline", "parallel.pipeline_model_parallel_size"),
    ({**BD3, "data.reset_attention_mask": True}, "bd3lm-document-mask", "data.reset_attention_mask"),
    ({**BD3, "model.attention_backend": "sdpa"}, "bd3lm-dense-sdpa", "model.attention_backend"),
    ({**BD3, "stage.kind": "sft", "stage.sft": {"packed_sequence": True}}, "bd3lm-sft-packed",
     "stage.sft.packed_sequence"),
    ({**BD3, "objective.block_size_schedule": [[0, 4], [50, 48]]}, "bd3lm-block-schedule",
     "objective.block_size_schedule"),
    ({**ANNEAL, "objective.kind": "ar"}, "attention-anneal-objective", "objective.attention_anneal_iters"),
    ({**ANNEAL, "objective.attention_anneal_iters": 500}, "attention-anneal-iters", "objective.attention_anneal_iters"),
    ({**ANNEAL, "checkpoint.init_from": None}, "attention-anneal-init-from", "objective.attention_anneal_iters"),
    ({**ANNEAL, "model.transformer_impl": "transformer_engine", "model.attention_backend": None},
     "attention-anneal-transformer-engine", "model.transformer_impl"),
    ({**ANNEAL, "parallel.context_parallel_size": 2}, "attention-anneal-context-parallel",
     "parallel.context_parallel_size"),
    ({**ANNEAL, "data.reset_attention_mask": True}, "attention-anneal-document-mask", "data.reset_attention_mask"),
    ({**ANNEAL, "stage.kind": "sft"}, "attention-anneal-stage", "objective.attention_anneal_iters"),
    ({"generate.block_length": 30}, "generate-settings", "generate.block_length"),
    ({"stage.kind": "rl"}, "rl-table-missing", "stage.rl.prompts"),
    ({"eval.generation": {"prompts": "p.jsonl", "every": 70}, "data.tokenizer": {"type": "HuggingFaceTokenizer",
      "model": "org/name"}}, "eval-generation-every", "eval.generation.every"),
    ({"eval.generation": {"prompts": "p.jsonl"}, "parallel.pipeline_model_parallel_size": 2,
      "data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}}, "eval-generation-layout",
     "parallel.pipeline_model_parallel_size"),
    ({"stage.kind": "sft", "objective.variable_length_prob": 0.01}, "sft-variable-length",
     "objective.variable_length_prob"),
    ({"stage.kind": "sft", "stage.sft": {"packed_sequence": True, "pad_eos_tokens": 2}}, "sft-pad-eos-packed",
     "stage.sft.pad_eos_tokens"),
    ({"stage.kind": "sft", "stage.sft": {"packed_sequence": True}, "model.transformer_impl": "transformer_engine"},
     "sft-attention-mask", "model.transformer_impl"),
    ({"stage.kind": "sft", "data.mock": True}, "sft-mock-data", "data.mock"),
    ({"stage.kind": "sft", "data.eod_mask_loss": True}, "sft-pretraining-data", "data.eod_mask_loss"),
    ({"checkpoint.async_save": True}, "runtime-async-save", "checkpoint.async_save"),
    ({"parallel.fsdp": "torch"}, "runtime-torch-fsdp", "parallel.fsdp"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.use_distributed_optimizer": False},
     "runtime-fsdp-distributed-optimizer", "parallel.use_distributed_optimizer"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.pipeline_model_parallel_size": 2},
     "runtime-fsdp-pipeline", "parallel.pipeline_model_parallel_size"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "fused_linear"}, "runtime-fsdp-fused-ce",
     "kernels.cross_entropy"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "checkpoint.init_from": "mcore:runs/b/ckpt"},
     "runtime-fsdp-init-from", "checkpoint.init_from"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "parallel.data_parallel_sharding_strategy": "optim",
      "train.use_precision_aware_optimizer": True}, "optimizer-state-fsdp", "parallel.fsdp"),
    ({"parallel.fsdp": "megatron", "kernels.cross_entropy": "megatron", "precision.fp8": "hybrid",
      "model.transformer_impl": "transformer_engine"}, "runtime-fsdp-fp8", "precision.fp8"),
    ({"precision.fp8_dot_product_attention": True, "model.transformer_impl": "transformer_engine"}, "fp8-attention",
     "precision.fp8_dot_product_attention"),
    ({"model.num_experts": 8, "model.moe_grouped_gemm": True, "model.transformer_impl": "local"},
     "runtime-grouped-gemm-local", "model.moe_grouped_gemm"),
    ({"kernels.gradient_accumulation_fusion": True, "model.transformer_impl": "local"},
     "runtime-gradient-accumulation-fusion", "kernels.gradient_accumulation_fusion"),
    ({"objective.attention_mask": "block_causal", "objective.block_size": 32,
      "model.transformer_impl": "transformer_engine"}, "runtime-block-causal-te", "objective.attention_mask"),
    ({"model.attention_backend": "flex", "parallel.context_parallel_size": 2, "parallel.cp_comm_type": "allgather"},
     "attention-backend-masks", "model.attention_backend"),
    ({"logging.tensorboard_dir": "tb"}, "runtime-tensorboard-dir", "logging.tensorboard_dir"),
    ({"data.reset_attention_mask": True, "model.transformer_impl": "transformer_engine"},
     "runtime-document-mask-te", "data.reset_attention_mask"),
    ({"objective.variable_length_prob": 0.01, "objective.variable_length": "micro_batch",
      "parallel.pipeline_model_parallel_size": 2}, "runtime-variable-length-pipeline", "objective.variable_length"),
    (TOO_BIG, "memory-fits", "cluster.gpu"),
    (TIGHT, "memory-headroom", "cluster.gpu"),
    ({"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name"}, "data.eod_mask_loss": True},
     "eod-id-unknown", "data.tokenizer.eod_id"),
    ({"cluster.slurm": {"partition": "bad name!"}}, "slurm-value", "cluster.slurm.partition"),
    ({"cluster.slurm": {"time": "4h"}}, "slurm-time", "cluster.slurm.time"),
    ({"cluster.slurm": {"signal_seconds_before_end": 70000}}, "slurm-signal", "cluster.slurm.signal_seconds_before_end"),
    ({"cluster.slurm": {"env": {"MASTER_PORT": "1"}}}, "slurm-env", "cluster.slurm.env.MASTER_PORT"),
    ({"cluster.slurm": {"env": {"HF_TOKEN": "x"}}}, "slurm-secret", "cluster.slurm.env.HF_TOKEN"),
    ({"cluster.slurm": {"container_mounts": ["/a:/a"]}}, "slurm-container", "cluster.slurm.container_mounts"),
    ({"train.lr": "fast", "parallel.tensor_model_parallel_size": 3}, "tp-divides-heads",
     "parallel.tensor_model_parallel_size"),
]


def spec_rule_examples() -> dict[str, tuple[dict[str, Any], str]]:
    """One example per rule of the spec and paths scopes: the first case of the rule tests
    (tests/unit/check/test_validate.py, test_validate_rule_cases.py) as spec data, and the key it names."""
    examples: dict[str, tuple[dict[str, Any], str]] = {}
    for rule, changes, key in validate_kit.CASES:
        examples.setdefault(rule, (merged(validate_kit.BASE, changes), key))
    for rule, changes, key, *_ in rule_cases_kit.CASES:
        examples.setdefault(rule, (merged(rule_cases_kit.BASE, changes), key))
    # [MASK] on an ordinary token of GPT-2's BPE (its layout when vocab.json cannot be read)
    examples["mask-token-ordinary"] = (merged(validate_kit.BASE, {
        "data.tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "v.json", "merge_file": "m.txt"},
        "model.vocab_size": 50304, "objective.mask_token_id": 100}), "objective.mask_token_id")
    return examples


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with dotted-key ``changes``; a value of None deletes the key (as the rule tests'
    ``make``)."""
    data = copy.deepcopy(base)
    for key, value in changes.items():
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return data


SPEC_EXAMPLES = spec_rule_examples()
