"""ConversionError for missing/unexpected/wrongly shaped tensors and unknown families."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dlmspec.backends.convert import ConversionError, ModelDims, hf_to_mcore, mcore_to_hf
from dlmspec.backends.convert.hf_config import dims_from_hf_config
from dlmspec.backends.convert.state_dict import hf_to_mcore_state_dict, mcore_to_hf_state_dict
from dlmspec.backends.convert.tiny import make_tiny_hf


@pytest.fixture()
def llama(tmp_path):
    src, _ = make_tiny_hf("llama", tmp_path / "hf")
    return src


def _edit(src, fn):
    path = src / "model.safetensors"
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path), metadata={"format": "pt"})


def test_missing_tensor(llama, tmp_path):
    _edit(llama, lambda s: s.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ConversionError, match=r"missing tensor 'model\.layers\.1\.self_attn\.k_proj\.weight' \(expected shape \(32, 64\)\)") as err:
        hf_to_mcore(llama, tmp_path / "out")
    assert err.value.tensor == "model.layers.1.self_attn.k_proj.weight"
    assert not (tmp_path / "out").exists()


def test_unexpected_tensor(llama, tmp_path):
    _edit(llama, lambda s: s.__setitem__("model.layers.2.self_attn.q_proj.weight", torch.zeros(64, 64)))
    with pytest.raises(ConversionError, match=r"unexpected tensor 'model\.layers\.2\.self_attn\.q_proj\.weight'") as err:
        hf_to_mcore(llama, tmp_path / "out")
    assert err.value.tensor == "model.layers.2.self_attn.q_proj.weight"


def test_wrong_shape_against_target_config(llama, tmp_path):
    _edit(llama, lambda s: s.__setitem__("model.layers.0.mlp.up_proj.weight", torch.zeros(95, 64)))
    with pytest.raises(ConversionError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape \(95, 64\), expected \(96, 64\)") as err:
        hf_to_mcore(llama, tmp_path / "out")
    assert err.value.expected == (96, 64)


def test_shape_disagreeing_with_given_dims(llama, tmp_path):
    dims = dims_from_hf_config(json.loads((llama / "config.json").read_text()))
    wider = dataclasses.replace(dims, ffn_hidden_size=128)
    with pytest.raises(ConversionError, match=r"'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \(96, 64\), expected \(128, 64\)"):
        hf_to_mcore(llama, tmp_path / "out", dims=wider)


def test_unknown_family(llama, tmp_path):
    cfg = json.loads((llama / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (llama / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="unknown model family.*gpt_neox") as err:
        hf_to_mcore(llama, tmp_path / "out")
    assert err.value.tensor == "model_type"
    with pytest.raises(ConversionError, match="unknown model family 'gpt2'"):
        ModelDims(family="gpt2", num_layers=1, hidden_size=8, ffn_hidden_size=8, num_attention_heads=2,
                  num_query_groups=2, kv_channels=4, vocab_size=8, padded_vocab_size=8)


def test_unsupported_config_features_are_named():
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
            "intermediate_size": 96, "vocab_size": 10}
    with pytest.raises(ConversionError, match="attention_bias") as err:
        dims_from_hf_config({**base, "attention_bias": True})
    assert err.value.tensor == "attention_bias"
    with pytest.raises(ConversionError, match="rope scaling type 'yarn'"):
        dims_from_hf_config({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                      "original_max_position_embeddings": 32}})
    with pytest.raises(ConversionError, match="every layer must be MoE"):
        dims_from_hf_config({"model_type": "qwen3_moe", "mlp_only_layers": [0], "num_hidden_layers": 2})
    with pytest.raises(ConversionError, match="block_type='sequential'"):
        dims_from_hf_config({"model_type": "llada", "block_type": "sequential", "d_model": 8, "n_heads": 2,
                             "n_layers": 1, "vocab_size": 8})


def test_tied_checkpoint_with_a_different_lm_head(tmp_path):
    src, _ = make_tiny_hf("qwen2", tmp_path / "hf")  # tied
    _edit(src, lambda s: s.__setitem__("lm_head.weight", torch.zeros(100, 64)))
    with pytest.raises(ConversionError, match="tied model, but 'lm_head.weight' differs") as err:
        hf_to_mcore(src, tmp_path / "out")
    assert err.value.tensor == "lm_head.weight"


def test_megatron_side_errors(llama, tmp_path):
    dims = dims_from_hf_config(json.loads((llama / "config.json").read_text()))
    state = hf_to_mcore_state_dict(load_file(str(llama / "model.safetensors")), dims)
    broken = dict(state)
    del broken["decoder.layers.1.mlp.linear_fc2.weight"]
    with pytest.raises(ConversionError, match=r"missing tensor 'decoder\.layers\.1\.mlp\.linear_fc2\.weight' \(expected shape \(64, 96\)\)"):
        mcore_to_hf_state_dict(broken, dims)
    broken = dict(state, **{"decoder.layers.0.self_attention.linear_qkv.weight": torch.zeros(127, 64)})
    with pytest.raises(ConversionError, match=r"linear_qkv\.weight' has shape \(127, 64\), expected \(128, 64\)"):
        mcore_to_hf_state_dict(broken, dims)
    # a dist checkpoint read with dims that disagree with what is stored
    hf_to_mcore(llama, tmp_path / "mcore")
    with pytest.raises(ConversionError, match=r"linear_qkv\.weight' has global shape \(2, 128, 64\).*expected \(2, 192, 64\)"):
        mcore_to_hf(tmp_path / "mcore", tmp_path / "back", dims=dataclasses.replace(dims, num_query_groups=4))
    with pytest.raises(ConversionError, match="missing tensor 'decoder.layers.self_attention.linear_qkv.bias'"):
        mcore_to_hf(tmp_path / "mcore", tmp_path / "back", dims=dataclasses.replace(dims, add_qkv_bias=True))
    assert not (tmp_path / "back").exists()
