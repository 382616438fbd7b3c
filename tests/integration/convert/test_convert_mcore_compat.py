"""The dist checkpoints are the ones megatron-core's own GPTModel.sharded_state_dict() reads
and writes (local layer spec, default metadata), and TP shards match megatron's sharding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dlmspec.backends.convert import layout
from dlmspec.backends.convert.dims import ModelDims
from dlmspec.backends.convert.families import expected_mcore_shapes
from dlmspec.backends.convert.mcore_io import (
    _save_strategy,
    _without_psutil_ok,
    load_mcore_checkpoint,
    process_group,
    save_mcore_checkpoint,
)
from dlmspec.backends.convert.mcore_model import build_gpt_model

DENSE = ModelDims(family="qwen3", num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
                  num_query_groups=2, kv_channels=24, vocab_size=100, padded_vocab_size=128,
                  qk_layernorm=True, add_qkv_bias=True)
MOE = ModelDims(family="qwen3_moe", num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
                num_query_groups=2, kv_channels=16, vocab_size=100, padded_vocab_size=128, qk_layernorm=True,
                num_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2, shared_expert_ffn_hidden_size=48)


@pytest.fixture(scope="module")
def megatron():
    from megatron.core import parallel_state

    with process_group():
        parallel_state.initialize_model_parallel(1, 1)
        try:
            yield
        finally:
            parallel_state.destroy_model_parallel()


def _params(model):
    return {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}


def _random_model(dims, seed):
    torch.manual_seed(seed)
    model = build_gpt_model(dims)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


CASES = [
    ("dense", DENSE, "stacked"),
    ("dense-tied", dataclasses.replace(DENSE, tied=True, add_qkv_bias=False, qk_layernorm=False), "stacked"),
    ("moe-shared-expert", MOE, "stacked"),
    ("dense-per-layer", DENSE, "per_layer"),
]


@pytest.mark.parametrize("case,dims,layer_layout", CASES, ids=[c[0] for c in CASES])
def test_megatron_loads_our_checkpoint(megatron, tmp_path, case, dims, layer_layout):
    from megatron.core import dist_checkpointing

    source = _random_model(dims, seed=1)
    state = _params(source)
    assert set(state) == set(expected_mcore_shapes(dims))  # our names are GPTModel's names
    save_mcore_checkpoint(tmp_path / "ckpt", state, dims, layer_layout=layer_layout)

    target = _random_model(dims, seed=2)
    metadata = {"non_homogeneous_layers": True} if layer_layout == "per_layer" else None
    loaded = dist_checkpointing.load(target.sharded_state_dict(metadata=metadata), str(tmp_path / "ckpt"))
    target.load_state_dict(loaded)
    for name, value in _params(target).items():
        assert torch.equal(value, state[name]), name


@pytest.mark.parametrize("dims", [DENSE, MOE], ids=["dense", "moe"])
def test_we_read_a_checkpoint_megatron_wrote(megatron, tmp_path, dims):
    from megatron.core import dist_checkpointing

    source = _random_model(dims, seed=3)
    (tmp_path / "ckpt").mkdir()
    with _without_psutil_ok():
        dist_checkpointing.save({"model": source.sharded_state_dict()}, str(tmp_path / "ckpt"),
                                sharded_strategy=_save_strategy())
    state, read_dims = load_mcore_checkpoint(tmp_path / "ckpt", dims)
    assert read_dims == dims
    expected = _params(source)
    assert set(state) == set(expected)
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


class _FakeTPGroup:
    """Rank ``r`` of a TP group of size ``n``, for building megatron's per-rank ShardedTensors."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


def _region(full, sub):
    """The part of the global tensor ``full`` that ShardedTensor ``sub`` says it holds."""
    sizes = (1,) * sub.prepend_axis_num + tuple(sub.data.shape)
    assert tuple(full.shape) == tuple(sub.global_shape)
    return full[tuple(slice(o, o + n) for o, n in zip(sub.global_offset, sizes))].reshape(sub.data.shape)


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_shards_sit_where_megatron_puts_them(megatron, tp):
    """For every TP rank, wrap layout.tp_split's shard in the ShardedTensors megatron builds for
    that rank (make_tp_sharded_tensor_for_checkpoint, and apply_swiglu_sharded_factory for fc1,
    exactly as ColumnParallelLinear/RowParallelLinear/MLP.sharded_state_dict do): each piece's
    data must equal the region of the global checkpoint tensor megatron assigns it."""
    import torch.distributed as dist
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
    from megatron.core.utils import make_tp_sharded_tensor_for_checkpoint

    dims = dataclasses.replace(DENSE, num_query_groups=4)
    state = _params(_random_model(dims, seed=4))
    L = dims.num_layers
    checked = 0
    for suffix, axis in (("self_attention.linear_qkv.weight", 0), ("self_attention.linear_qkv.bias", 0),
                         ("self_attention.linear_proj.weight", 1), ("mlp.linear_fc1.weight", 0),
                         ("mlp.linear_fc2.weight", 1)):
        stacked = torch.stack([state[f"decoder.layers.{i}.{suffix}"] for i in range(L)])
        for i in range(L):
            shards = layout.tp_split(state[f"decoder.layers.{i}.{suffix}"], layout.tp_kind(suffix), tp, suffix)
            for rank in range(tp):
                sh = make_tp_sharded_tensor_for_checkpoint(shards[rank], f"decoder.layers.{suffix}", axis,
                                                           prepend_offsets=((0, i, L),),
                                                           tp_group=_FakeTPGroup(rank, tp),
                                                           dp_cp_group=dist.group.WORLD)
                pieces = [sh]
                if suffix.startswith("mlp.linear_fc1"):
                    pieces = apply_swiglu_sharded_factory(sh, ((0, i, L),)).build()
                    assert len(pieces) == 2
                for piece in pieces:
                    assert torch.equal(piece.data, _region(stacked, piece)), (suffix, i, rank)
                    checked += 1
    emb = state["embedding.word_embeddings.weight"]
    for rank, shard in enumerate(layout.tp_split(emb, layout.COLUMN, tp)):
        sh = make_tp_sharded_tensor_for_checkpoint(shard, "embedding.word_embeddings.weight", 0,
                                                   tp_group=_FakeTPGroup(rank, tp), dp_cp_group=dist.group.WORLD)
        assert torch.equal(sh.data, _region(emb, sh))
    assert checked == L * tp * 6
