"""HF -> megatron-core dist checkpoint -> HF round trips, through real files, per family."""

from __future__ import annotations

import json

import pytest
import torch

from dlmspec.backends.convert import ModelDims, hf_to_mcore, mcore_to_hf
from dlmspec.backends.convert.dims import FAMILIES
from dlmspec.backends.convert.hf_io import SafetensorsReader
from dlmspec.backends.convert.mcore_io import read_sidecar
from dlmspec.backends.convert.tiny import make_tiny_hf


def _assert_identical(a_dir, b_dir):
    a, b = SafetensorsReader(a_dir), SafetensorsReader(b_dir)
    assert sorted(a) == sorted(b)
    for name in a:
        ta, tb = a[name], b[name]
        assert ta.dtype == tb.dtype, name
        assert torch.equal(ta, tb), name


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_bit_identical(family, tmp_path):
    src, _ = make_tiny_hf(family, tmp_path / "hf")
    dims = hf_to_mcore(src, tmp_path / "mcore")
    assert dims.family == family
    # the dist checkpoint is a real one: megatron's files plus our sidecar
    names = {p.name for p in (tmp_path / "mcore").iterdir()}
    assert {"metadata.json", ".metadata", "common.pt", "dlmspec_convert.json"} <= names
    assert ModelDims.from_dict(read_sidecar(tmp_path / "mcore")["dims"]) == dims
    mcore_to_hf(tmp_path / "mcore", tmp_path / "back")
    _assert_identical(src, tmp_path / "back")
    cfg_in = json.loads((src / "config.json").read_text())
    cfg_out = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg_out["model_type"] == cfg_in["model_type"]


def test_family_specific_dims(tmp_path):
    """The derived dims carry what each family is known for."""
    seen = {}
    for family in ("qwen2", "qwen3", "qwen3_moe", "mixtral", "mistral"):
        src, _ = make_tiny_hf(family, tmp_path / family)
        from dlmspec.backends.convert.hf_config import dims_from_hf_config
        from dlmspec.backends.convert.hf_io import read_hf_config

        seen[family] = dims_from_hf_config(read_hf_config(src))
    assert seen["qwen2"].add_qkv_bias and seen["qwen2"].tied
    assert seen["qwen3"].qk_layernorm and seen["qwen3"].kv_channels == 24  # != 64 / 4
    assert seen["qwen3_moe"].num_experts == 4 and seen["qwen3_moe"].moe_ffn_hidden_size == 32
    assert seen["mixtral"].moe_router_topk == 2 and seen["mixtral"].moe_ffn_hidden_size == 48
    assert seen["mistral"].num_query_groups == 1
    assert seen["qwen3"].rotary_base == 1e6 and seen["qwen3"].padded_vocab_size == 128


def test_hf_output_loads_with_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    src, ref = make_tiny_hf("qwen3", tmp_path / "hf")
    hf_to_mcore(src, tmp_path / "mcore")
    mcore_to_hf(tmp_path / "mcore", tmp_path / "back")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "back", dtype=torch.float32).eval()
    ids = torch.randint(0, 100, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_sharded_hf_checkpoint_round_trip_and_bf16(tmp_path):
    """Sharded safetensors with an index, bf16 storage, per-layer dist layout."""
    src, ref = make_tiny_hf("llama", tmp_path / "hf")
    # re-save sharded and in bf16 through our own writer (forces several shards)
    from dlmspec.backends.convert.hf_io import read_hf_config, write_hf_checkpoint

    state = {k: v for k, v in SafetensorsReader(src).items()}
    write_hf_checkpoint(tmp_path / "sharded", state, read_hf_config(src), dtype=torch.bfloat16,
                        max_shard_bytes=20_000)
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    hf_to_mcore(tmp_path / "sharded", tmp_path / "mcore", layer_layout="per_layer")
    mcore_to_hf(tmp_path / "mcore", tmp_path / "back", max_shard_bytes=20_000)
    _assert_identical(tmp_path / "sharded", tmp_path / "back")
    assert SafetensorsReader(tmp_path / "back")["model.norm.weight"].dtype == torch.bfloat16


def test_existing_destination_is_refused_and_nothing_half_written(tmp_path):
    from dlmspec.backends.convert import ConversionError

    src, _ = make_tiny_hf("llama", tmp_path / "hf")
    (tmp_path / "mcore").mkdir()
    with pytest.raises(ConversionError, match="already exists"):
        hf_to_mcore(src, tmp_path / "mcore")
    assert list((tmp_path / "mcore").iterdir()) == []
    # a failing conversion leaves no temporary directory behind
    (src / "model.safetensors").unlink()
    with pytest.raises(ConversionError):
        hf_to_mcore(src, tmp_path / "other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "mcore"]


def test_reads_a_dlmspec_run_directory(tmp_path):
    """A run's checkpoint root (``latest`` naming ``iter_*``) resolves to the dist checkpoint."""
    src, _ = make_tiny_hf("llama", tmp_path / "hf")
    hf_to_mcore(src, tmp_path / "run" / "iter_0000010")
    (tmp_path / "run" / "latest").write_text("iter_0000010\n")
    mcore_to_hf(tmp_path / "run", tmp_path / "back")
    _assert_identical(src, tmp_path / "back")
