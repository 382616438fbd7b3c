"""A small valid spec as TOML text (two GPUs, mock data, NullTokenizer of 1000 ids, vocabulary 1025),
built by the spec factory (tests/kits/spec_kit.py), that tests extend with their own tables or edit
line by line (``SMALL_SPEC.replace('name = "t"', ...)``)."""

from spec_kit import spec_toml

#: What the small spec changes in spec_kit.DEFAULT (``spec_file(folder, SMALL, ...)`` writes it).
SMALL = {
    "model": {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 128, "num_attention_heads": 4,
              "vocab_size": 1025, "max_position_embeddings": 128},
    "train": {"global_batch_size": 8, "seq_length": 64, "train_iters": 10, "eval_interval": 5},
    "data.tokenizer.vocab_size": 1000,
    "cluster.gpus_per_node": 2,
}

SMALL_SPEC = spec_toml(SMALL)
