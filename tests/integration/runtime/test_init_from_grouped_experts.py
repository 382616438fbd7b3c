"""``checkpoint.init_from`` of a Hugging Face MoE into grouped-GEMM experts (te-moe of
bench/gpu/te_matrix.py), on CPU.

Transformer Engine's grouped experts (``TEGroupedMLP`` / ``TEGroupedLinear``, megatron-core
0.16.1 ``extensions/transformer_engine.py`` ``_sharded_state_dict_grouped``) give the same
checkpoint keys as ``SequentialMLP``, but name the ``_extra_state`` ShardedObject of expert
``i > 0`` ``linear_fc1._extra_state<i>`` (expert 0: ``linear_fc1._extra_state``). TE cannot be
installed here, so ``SequentialMLP.sharded_state_dict`` is renamed the same way: the ShardedObjects
(one checkpoint key, one shard per layer and expert) are TE's. The loader used to drop only the
names ending in ``_extra_state``, so it asked for experts 1..E-1's objects without expert 0's and
megatron's access check failed ("Invalid access pattern: N ShardedObject are missing").
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import unwrap_model

from dlmspec.backends.convert import dims_from_hf_config, hf_to_mcore
from dlmspec.backends.convert.hf_io import SafetensorsReader, read_hf_config
from dlmspec.backends.convert.mcore_model import transformer_config_kwargs
from dlmspec.backends.convert.tiny import make_tiny_hf
from dlmspec.backends.megatron import init_from as init_mod
from dlmspec.backends.megatron.init_from import initialize_from, is_extra_state
from dlmspec.backends.megatron.layers import build_layer_spec, build_model


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    src, _ = make_tiny_hf("qwen3_moe", tmp_path_factory.mktemp("hf") / "qwen3_moe", seed=5)
    return src


def _te_grouped_names(original):
    """``SequentialMLP.sharded_state_dict`` with ``_extra_state`` named as TEGroupedMLP names it."""
    pattern = re.compile(r"^(.*)local_experts\.(\d+)\.(linear_fc[12])\._extra_state$")

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        out = {}
        for k, v in original(self, prefix, sharded_offsets, metadata).items():
            m = pattern.match(k)
            if m:
                head, e, fc = m.group(1), int(m.group(2)), m.group(3)
                k = f"{head}{fc}._extra_state{'' if e == 0 else e}"
            out[k] = v
        return out

    return sharded_state_dict


def _moe_run(src: Path):
    dims = dims_from_hf_config(read_hf_config(src))
    config = TransformerConfig(**transformer_config_kwargs(dims, params_dtype=torch.float32),
                               calculate_per_token_loss=True)
    model_kwargs = dict(vocab_size=dims.padded_vocab_size, max_sequence_length=128, position_embedding_type="rope",
                        rotary_base=int(dims.rotary_base), rotary_percent=1.0,
                        share_embeddings_and_output_weights=dims.tied)
    spec = build_layer_spec(attention="causal", qk_layernorm=dims.qk_layernorm, normalization="RMSNorm",
                            use_transformer_engine=False, num_experts=dims.num_experts)
    torch.manual_seed(0)
    model = build_model(config, layer_spec=spec, ddp_config=DistributedDataParallelConfig(), **model_kwargs)
    return dims, config, model_kwargs, model


def test_extra_state_names():
    assert is_extra_state("decoder.layers.0.mlp.experts.linear_fc1._extra_state")
    assert is_extra_state("decoder.layers.0.mlp.experts.linear_fc1._extra_state3")
    assert not is_extra_state("decoder.layers.0.mlp.experts.linear_fc1.weight1")
    assert not is_extra_state("decoder.layers.0.mlp.experts.linear_fc1._extra_state.weight")


def test_hf_moe_loads_into_grouped_expert_names(tiny_moe, tmp_path, monkeypatch):
    monkeypatch.setattr(init_mod, "run_converter", lambda src, dst, dims: hf_to_mcore(src, dst, dims=dims))
    monkeypatch.setattr(SequentialMLP, "sharded_state_dict", _te_grouped_names(SequentialMLP.sharded_state_dict))
    dims, config, model_kwargs, model = _moe_run(tiny_moe)
    names = unwrap_model(model[0]).sharded_state_dict()
    assert "decoder.layers.0.mlp.experts.linear_fc1._extra_state1" in names  # TE's naming is in place
    got = initialize_from(f"hf:{tiny_moe}", model=model, cache_dir=str(tmp_path / "init_from_hf"),
                          transformer_config=config, model_kwargs=model_kwargs)
    assert got.cache == "converted"
    hf = SafetensorsReader(tiny_moe)
    params = dict(unwrap_model(model[0]).named_parameters())
    for layer in range(dims.num_layers):
        for e in range(dims.num_experts):
            ours = f"decoder.layers.{layer}.mlp.experts.local_experts.{e}."
            theirs = f"model.layers.{layer}.mlp.experts.{e}."
            fc1 = torch.cat([hf[theirs + "gate_proj.weight"], hf[theirs + "up_proj.weight"]]).float()
            assert torch.equal(params[ours + "linear_fc1.weight"].detach(), fc1), (layer, e)
            assert torch.equal(params[ours + "linear_fc2.weight"].detach(),
                               hf[theirs + "down_proj.weight"].float()), (layer, e)
