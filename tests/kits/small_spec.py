"""A small valid spec (two GPUs, mock data, NullTokenizer) that tests extend with their own
tables: tests/render/test_slurm.py, tests/test_secrets.py."""

SMALL_SPEC = """
name = "t"
[model]
num_layers = 2
hidden_size = 64
ffn_hidden_size = 128
num_attention_heads = 4
vocab_size = 1025
max_position_embeddings = 128
[train]
global_batch_size = 8
seq_length = 64
train_iters = 10
eval_interval = 5
[data]
mock = true
[data.tokenizer]
type = "NullTokenizer"
vocab_size = 1000
[cluster]
gpu = "h100"
gpus_per_node = 2
nodes = 1
"""
