"""Helpers shared by tests (moved from test_validate_rule_cases.py): BASE, CASES, MASK_RULE."""

from __future__ import annotations

from typing import Any
from spec_kit import spec_dict


#: A valid data-parallel spec: 8 GPUs, vocab 1000 (padded 1024, [MASK] = 1000), head dim 32.
BASE: dict[str, Any] = spec_dict()


# (rule, changes that break it, key named, changes the hint suggests, text of the hint)
CASES: list[tuple[str, dict[str, Any], str, dict[str, Any], str]] = [
    ("seed-range", {"train.seed": -1}, "train.seed", {"train.seed": 1234}, "seed = 1234"),
    ("seed-range", {"train.seed": 2**32}, "train.seed", {"train.seed": 1234}, "seed = 1234"),
    # each pipeline stage seeds numpy with seed + 100 * its rank
    ("seed-range", {"train.seed": 2**32 - 100, "parallel.pipeline_model_parallel_size": 2}, "train.seed",
     {"train.seed": 1234}, "seed = 1234"),
    ("eod-id-range", {"data.tokenizer.eod_id": 1000}, "data.tokenizer.eod_id", {"data.tokenizer.eod_id": 999},
     "eod_id = 999"),
    ("eod-id-range", {"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/tok", "eod_id": 5000}},
     "data.tokenizer.eod_id", {"data.tokenizer.eod_id": 999}, "eod_id = 999"),
    ("rotary-dims", {"model.kv_channels": 63}, "model.kv_channels", {"model.kv_channels": 64}, "kv_channels = 64"),
    # head dimension 256 / 8 = 32: 0.1% of it rotates no dimension; 9.375% rotates 3 (odd)
    ("rotary-dims", {"model.rotary_percent": 0.001}, "model.rotary_percent", {"model.rotary_percent": 0.25},
     "rotary_percent = 0.25"),
    ("rotary-dims", {"model.rotary_percent": 0.09375}, "model.rotary_percent", {"model.rotary_percent": 0.25},
     "rotary_percent = 0.25"),
    # derived head dimension 200 / 8 = 25
    ("rotary-dims", {"model.hidden_size": 200}, "model.kv_channels", {"model.kv_channels": 26}, "kv_channels = 26"),
    ("rotary-dims", {"model.kv_channels": 63, "model.rotary_percent": 0.5}, "model.kv_channels",
     {"model.kv_channels": 64}, "kv_channels = 64"),
    # 13 * 0.25 and 14 * 0.25 both give 3 dimensions
    ("rotary-dims", {"model.kv_channels": 13, "model.rotary_percent": 0.25}, "model.kv_channels",
     {"model.kv_channels": 14, "model.rotary_percent": 1.0}, "kv_channels = 14 and rotary_percent = 1.0"),
    ("train-length-overflow", {"train.train_iters": 2**62}, "train.train_iters",
     {"train.train_iters": (2**63 - 1) // (64 * 512)}, f"train_iters <= {(2**63 - 1) // (64 * 512):,}"),
    ("train-length-overflow", {"train.train_iters": None, "train.train_tokens": 2**63 - 1}, "train.train_tokens",
     {"train.train_tokens": (2**63 - 1) // (64 * 512) * 64 * 512}, f"train_tokens <= {(2**63 - 1) // (64 * 512) * 64 * 512:,}"),
    ("train-length-implausible", {"train.train_iters": 10**11}, "train.train_iters",
     {"train.train_iters": -(-10**12 // (64 * 512))}, f"train_iters = {-(-10**12 // (64 * 512))}"),
    ("train-length-implausible", {"train.train_iters": None, "train.train_tokens": 10**16}, "train.train_tokens",
     {"train.train_tokens": 10**12}, "train_tokens = 1000000000000"),
    ("float32-range", {"train.lr": 1e39, "train.min_lr": 0.0}, "train.lr", {"train.lr": 3e-4}, "lr = 0.0003"),
    ("float32-range", {"model.init_method_std": 1e300}, "model.init_method_std", {"model.init_method_std": 0.02},
     "init_method_std = 0.02"),
    ("lr-implausible", {"train.lr": 1e18}, "train.lr", {"train.lr": 3e-4}, "lr = 0.0003"),
    ("lr-implausible", {"train.lr": 2.0, "train.min_lr": 1.5}, "train.lr",
     {"train.lr": 3e-4, "train.min_lr": 3e-5}, "lr = 0.0003 and min_lr = 3e-05"),
    ("num-workers-range", {"data.num_workers": 10**6}, "data.num_workers", {"data.num_workers": 2},
     "num_workers = 2"),
    ("num-workers-implausible", {"data.num_workers": 200}, "data.num_workers", {"data.num_workers": 2},
     "num_workers = 2"),
    ("world-size-range", {"cluster.nodes": 2**28}, "cluster.nodes", {"cluster.nodes": 1}, "nodes = 1"),
    ("blank-value", {"name": "  "}, "name", {"name": "t"}, "name = "),
    ("blank-value", {"data.mock": False, "data.train": ["  "]}, "data.train", {"data.train": ["data/x_text_document"]},
     "PREFIX"),
    ("blank-value", {"data.mock": False, "data.valid": [{"prefix": ""}], "data.train": ["d"]}, "data.valid",
     {"data.valid": ["d"]}, "PREFIX"),
    ("blank-value", {"data.tokenizer": {"type": "HuggingFaceTokenizer", "model": " "}}, "data.tokenizer.model",
     {"data.tokenizer.model": "org/tok"}, "data.tokenizer.model"),
    ("blank-value", {"data.tokenizer": {"type": "GPT2BPETokenizer", "vocab_file": "", "merge_file": "m.txt"},
                     "model.vocab_size": 50257}, "data.tokenizer.vocab_file",
     {"data.tokenizer.vocab_file": "v.json"}, "set data.tokenizer.vocab_file"),
    ("blank-value", {"data.tokenizer": {"type": "NullTokenizer", "vocab_size": 999, "model": ""}},
     "data.tokenizer.model", {"data.tokenizer.model": None}, "remove data.tokenizer.model"),
    ("blank-value", {"checkpoint.save": ""}, "checkpoint.save", {"checkpoint.save": None}, "remove"),
    ("blank-value", {"checkpoint.load": " \t"}, "checkpoint.load", {"checkpoint.load": None}, "remove"),
    ("blank-value", {"logging.run_dir": ""}, "logging.run_dir", {"logging.run_dir": None}, "remove"),
    ("blank-value", {"logging.tensorboard_dir": " "}, "logging.tensorboard_dir", {"logging.tensorboard_dir": None},
     "remove"),
    ("blank-value", {"logging.wandb_project": ""}, "logging.wandb_project", {"logging.wandb_project": None}, "remove"),
    ("blank-value", {"stage.sft": {"prompt_key": " "}}, "stage.sft.prompt_key", {"stage.sft.prompt_key": "prompt"},
     'prompt_key = "prompt"'),
]


#: Tested on tokenizer files below (its cases need files).
MASK_RULE = "mask-token-ordinary"
