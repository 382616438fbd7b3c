"""Layout tests written from megatron's documented layout, not from the converter's reshapes."""

from __future__ import annotations

import pytest
import torch

from dlmspec.backends.convert import ConversionError, layout
from dlmspec.backends.convert.dims import ModelDims, padded_vocab_size


def _tagged_qkv(H, G, d, hidden=3):
    """q, k, v whose every row says (kind, head, row-in-head): kind 0=q, 1=k, 2=v."""
    def rows(kind, heads):
        return torch.tensor([[kind, h, r] for h in range(heads) for r in range(d)], dtype=torch.float32)
    q, k, v = rows(0, H), rows(1, G), rows(2, G)
    pad = hidden - 3
    if pad:
        q, k, v = (torch.cat([t, torch.zeros(t.shape[0], pad)], 1) for t in (q, k, v))
    return q, k, v


def _documented_order(H, G, d):
    """megatron: for group g: the H/G query heads of g, then k_g, then v_g; d rows each."""
    order = []
    per = H // G
    for g in range(G):
        for h in range(g * per, (g + 1) * per):
            order += [(0, h, r) for r in range(d)]
        order += [(1, g, r) for r in range(d)]
        order += [(2, g, r) for r in range(d)]
    return order


@pytest.mark.parametrize("H,G,d", [(4, 4, 3), (8, 2, 5), (6, 1, 2), (16, 8, 128)], ids=["mha", "gqa", "mqa", "qwen3-1024"])
def test_fused_qkv_row_order(H, G, d):
    q, k, v = _tagged_qkv(H, G, d)
    fused = layout.fuse_qkv(q, k, v, H, G, d)
    got = [tuple(int(x) for x in row[:3]) for row in fused]
    assert got == _documented_order(H, G, d)
    back = layout.split_qkv(fused, H, G, d)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))


def test_qwen3_heads_wider_than_hidden_over_heads():
    """Qwen3-0.6B-like attention: 16 heads of 128 on hidden 1024 (16*128 = 2048 != 1024)."""
    H, G, d, hidden = 16, 8, 128, 1024
    dims = ModelDims(family="qwen3", num_layers=1, hidden_size=hidden, ffn_hidden_size=3072,
                     num_attention_heads=H, num_query_groups=G, kv_channels=d, vocab_size=10,
                     padded_vocab_size=128, qk_layernorm=True)
    assert (dims.q_rows, dims.kv_rows, dims.qkv_rows) == (2048, 1024, 4096)
    q = torch.randn(H * d, hidden)
    k = torch.randn(G * d, hidden)
    v = torch.randn(G * d, hidden)
    fused = layout.fuse_qkv(q, k, v, H, G, d)
    assert fused.shape == (4096, hidden)
    # group 3 occupies rows [3*(2+2)*128, 4*(2+2)*128): q heads 6 and 7, then k_3, v_3
    block = fused[3 * 512:4 * 512]
    assert torch.equal(block[:256], q[6 * 128:8 * 128])
    assert torch.equal(block[256:384], k[3 * 128:4 * 128])
    assert torch.equal(block[384:], v[3 * 128:4 * 128])
    bias = layout.fuse_qkv(torch.arange(H * d, dtype=torch.float32), torch.arange(G * d) + 1e4, torch.arange(G * d) + 2e4, H, G, d)
    assert bias[512 + 256] == 1e4 + 128  # k bias of group 1 starts after group 1's two q heads


def test_fc1_is_gate_then_up_and_tp_ranks_hold_their_own_halves():
    f, h, tp = 6, 2, 3
    gate = torch.arange(f * h, dtype=torch.float32).reshape(f, h)
    up = -1 - torch.arange(f * h, dtype=torch.float32).reshape(f, h)
    fc1 = layout.fuse_gate_up(gate, up)
    assert torch.equal(fc1[:f], gate) and torch.equal(fc1[f:], up)
    shards = layout.tp_split(fc1, layout.GATED_COLUMN, tp, "fc1")
    for r, shard in enumerate(shards):
        rows = f // tp
        assert torch.equal(shard, torch.cat([gate[r * rows:(r + 1) * rows], up[r * rows:(r + 1) * rows]]))
        assert (shard[:rows] >= 0).all() and (shard[rows:] < 0).all()  # [gate_r; up_r]
    assert torch.equal(layout.tp_merge(shards, layout.GATED_COLUMN), fc1)


def test_tp_kinds_follow_megatron_parallel_linears():
    assert layout.tp_kind("decoder.layers.0.self_attention.linear_qkv.weight") == layout.COLUMN
    assert layout.tp_kind("decoder.layers.0.self_attention.linear_qkv.bias") == layout.COLUMN
    assert layout.tp_kind("decoder.layers.0.self_attention.linear_proj.weight") == layout.ROW
    assert layout.tp_kind("decoder.layers.0.mlp.linear_fc1.weight") == layout.GATED_COLUMN
    assert layout.tp_kind("decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight") == layout.GATED_COLUMN
    assert layout.tp_kind("decoder.layers.0.mlp.shared_experts.linear_fc2.weight") == layout.ROW
    assert layout.tp_kind("decoder.layers.0.mlp.router.weight") == layout.REPLICATED
    assert layout.tp_kind("decoder.layers.0.self_attention.q_layernorm.weight") == layout.REPLICATED
    assert layout.tp_kind("embedding.word_embeddings.weight") == layout.COLUMN
    assert layout.tp_kind("output_layer.weight") == layout.COLUMN


def test_qkv_tp_split_gives_whole_groups_per_rank():
    H, G, d, tp = 8, 4, 2, 2
    q, k, v = _tagged_qkv(H, G, d)
    shards = layout.tp_split(layout.fuse_qkv(q, k, v, H, G, d), layout.COLUMN, tp, "qkv")
    for r, shard in enumerate(shards):
        groups = {int(row[1]) for row in shard if int(row[0]) > 0}
        assert groups == {2 * r, 2 * r + 1}
        heads = {int(row[1]) for row in shard if int(row[0]) == 0}
        assert heads == set(range(4 * r, 4 * r + 4))


def test_row_split_and_state_dict_round_trip():
    sd = {
        "decoder.layers.0.self_attention.linear_proj.weight": torch.randn(4, 8),
        "decoder.layers.0.mlp.linear_fc1.weight": torch.randn(12, 4),
        "decoder.layers.0.input_layernorm.weight": torch.randn(4),
        "decoder.layers.0.mlp.linear_fc1._extra_state": None,
    }
    shards = layout.shard_state_dict(sd, 2)
    assert shards[1]["decoder.layers.0.self_attention.linear_proj.weight"].shape == (4, 4)
    assert torch.equal(shards[1]["decoder.layers.0.self_attention.linear_proj.weight"],
                       sd["decoder.layers.0.self_attention.linear_proj.weight"][:, 4:])
    merged = layout.merge_state_dicts(shards)
    for k, v in sd.items():
        assert (merged[k] is None) if v is None else torch.equal(merged[k], v)


def test_tp_errors_name_the_tensor():
    with pytest.raises(ConversionError, match="linear_proj.*not divisible by TP=3"):
        layout.tp_split(torch.zeros(4, 8), layout.ROW, 3, "linear_proj")
    shards = layout.shard_state_dict({"decoder.final_layernorm.weight": torch.ones(4)}, 2)
    shards[1]["decoder.final_layernorm.weight"] = torch.zeros(4)
    with pytest.raises(ConversionError, match="final_layernorm.*differs between rank 0 and rank 1"):
        layout.merge_state_dicts(shards)


def test_vocab_padding():
    assert padded_vocab_size(151936, 128, 1) == 151936
    assert padded_vocab_size(151937, 128, 1) == 152064
    assert padded_vocab_size(100, 128, 2) == 256
    assert padded_vocab_size(126464, 128, 8) == 126976
    t = torch.randn(100, 4)
    p = layout.pad_vocab(t, 128)
    assert p.shape == (128, 4) and torch.equal(p[:100], t) and not p[100:].any()
    assert torch.equal(layout.unpad_vocab(p, 100), t)
    with pytest.raises(ConversionError, match="more than padded_vocab_size=64"):
        layout.pad_vocab(t, 64, "model.embed_tokens.weight")
