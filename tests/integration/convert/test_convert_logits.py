"""Logit equivalence on CPU: the HF model vs megatron-core's GPTModel (local spec, fp32,
world size 1, gloo) built with the converted weights and loaded from the dist checkpoint."""

from __future__ import annotations

import pytest
import torch

from dlmspec.backends.convert import ConversionError, hf_to_mcore, verify
from dlmspec.backends.convert.api import megatron_checkpoint_logits
from dlmspec.backends.convert.mcore_model import MOE_CPU_REASON
from dlmspec.backends.convert.tiny import make_tiny_hf

DENSE = ["llama", "mistral", "qwen2", "qwen3", "llada", "dream"]
ATOL = 1e-4


@pytest.mark.parametrize("family", DENSE)
def test_megatron_logits_match_hf(family, tmp_path):
    src, reference = make_tiny_hf(family, tmp_path / "hf")
    hf_to_mcore(src, tmp_path / "mcore")
    tokens = torch.randint(0, 100, (2, 11), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        expected = reference(input_ids=tokens).logits
    got = megatron_checkpoint_logits(tmp_path / "mcore", tokens)
    assert got.shape == expected.shape == (2, 11, 100)
    assert torch.allclose(got, expected, atol=ATOL, rtol=0), float((got - expected).abs().max())
    # the public verify() agrees (it builds its own reference from the HF files)
    result = verify(src, tmp_path / "mcore", atol=ATOL)
    assert result.ok and result.max_abs_diff <= ATOL


def test_a_wrong_layout_is_caught(tmp_path):
    """Swapping the two query groups' k heads in the megatron checkpoint must break the logits."""
    from dlmspec.backends.convert import mcore_io

    src, _ = make_tiny_hf("llama", tmp_path / "hf")
    dims = hf_to_mcore(src, tmp_path / "mcore")
    state, dims = mcore_io.load_mcore_checkpoint(tmp_path / "mcore")
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    qkv = state[name].clone()
    rows = (dims.heads_per_group + 2) * dims.kv_channels
    k0 = slice(dims.heads_per_group * dims.kv_channels, (dims.heads_per_group + 1) * dims.kv_channels)
    k1 = slice(rows + k0.start, rows + k0.stop)
    qkv[k0], qkv[k1] = state[name][k1], state[name][k0]
    state[name] = qkv
    mcore_io.save_mcore_checkpoint(tmp_path / "bad", state, dims)
    result = verify(src, tmp_path / "bad", atol=ATOL)
    assert not result.ok and result.max_abs_diff > 1e-3


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_moe_logits_need_a_gpu(family, tmp_path):
    """On CPU, verify() refuses MoE with the exact megatron reason, then the test is skipped."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only check; MoE logits on GPU are bench/convert/verify_gpu.py")
    src, _ = make_tiny_hf(family, tmp_path / "hf")
    hf_to_mcore(src, tmp_path / "mcore")
    with pytest.raises(ConversionError, match="Router.gating"):
        verify(src, tmp_path / "mcore")
    pytest.skip(MOE_CPU_REASON + "; covered by bench/convert/verify_gpu.py")
