"""CPU tests of layer-spec selection, vocabulary padding and the MFU FLOP count."""

import pytest

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.spec_utils import ModuleSpec

from dlmspec.backends.megatron.attention import SDPACoreAttention
from dlmspec.backends.megatron.layers import (
    BACKEND_LOCAL_SDPA,
    build_layer_spec,
    layer_spec_attention,
    layer_spec_backend,
    pad_vocab_size,
    transformer_engine_available,
)
from dlmspec.backends.megatron.metrics import model_flops_per_token

no_te = pytest.mark.skipif(transformer_engine_available(), reason="transformer_engine is installed here")


@no_te
@pytest.mark.parametrize(
    "attention,mask_type",
    [("bidirectional", AttnMaskType.no_mask), ("causal", AttnMaskType.causal), ("block_causal", AttnMaskType.arbitrary)],
)
def test_local_spec_uses_sdpa_core_attention(attention, mask_type):
    spec = build_layer_spec(attention=attention, block_size=16 if attention == "block_causal" else None)
    assert layer_spec_backend(spec) == BACKEND_LOCAL_SDPA == "local+sdpa"
    assert layer_spec_attention(spec) == attention
    core = spec.submodules.self_attention.submodules.core_attention
    assert isinstance(core, ModuleSpec) and core.module is SDPACoreAttention
    assert core.params["mode"] == attention
    assert spec.submodules.self_attention.params["attn_mask_type"] == mask_type


@no_te
def test_default_picks_local_path_without_transformer_engine():
    assert layer_spec_backend(build_layer_spec()) == "local+sdpa"
    with pytest.raises(ValueError, match="transformer_engine"):
        build_layer_spec(use_transformer_engine=True)


def test_qk_layernorm_and_moe_layers():
    spec = build_layer_spec(qk_layernorm=True, use_transformer_engine=False)
    assert spec.submodules.self_attention.submodules.q_layernorm is not IdentityOp
    plain = build_layer_spec(qk_layernorm=False, use_transformer_engine=False)
    assert plain.submodules.self_attention.submodules.q_layernorm is IdentityOp
    moe = build_layer_spec(num_experts=8, use_transformer_engine=False)
    assert moe.submodules.mlp.module is MoELayer
    with pytest.raises(ValueError, match="grouped"):
        build_layer_spec(num_experts=8, moe_grouped_gemm=True, use_transformer_engine=False)


def test_spec_builds_are_independent():
    a = build_layer_spec(attention="causal", use_transformer_engine=False)
    b = build_layer_spec(attention="bidirectional", use_transformer_engine=False)
    assert layer_spec_attention(a) == "causal" and layer_spec_attention(b) == "bidirectional"


def test_invalid_spec_arguments():
    with pytest.raises(ValueError):
        build_layer_spec(attention="sliding")
    with pytest.raises(ValueError):
        build_layer_spec(attention="block_causal")
    with pytest.raises(ValueError):
        build_layer_spec(normalization="BatchNorm")


def test_pad_vocab_size():
    assert pad_vocab_size(151936) == 151936
    assert pad_vocab_size(151669) == 151680  # 1185 * 128
    assert pad_vocab_size(50277, tensor_model_parallel_size=2) == 50432
    assert pad_vocab_size(32001) == 32128
    with pytest.raises(ValueError):
        pad_vocab_size(0)


QWEN3 = dict(
    num_layers=28, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=16,
    num_query_groups=8, kv_channels=128, vocab_size=151936, seq_length=4096,
)


def test_flops_per_token_by_hand_for_qwen3_1_7b():
    h, hq, hkv, f, L, V, s = 2048, 2048, 1024, 6144, 28, 151936, 4096
    n_matmul = L * (h * hq + 2 * h * hkv + hq * h + 3 * h * f) + h * V
    bidir = 6 * n_matmul + 12 * L * s * hq
    assert model_flops_per_token(**QWEN3) == bidir
    causal = model_flops_per_token(**QWEN3, attention="causal")
    assert causal == 6 * n_matmul + 6 * L * s * hq
    # Block causal lies between, and block = s is bidirectional.
    blk = model_flops_per_token(**QWEN3, attention="block_causal", block_size=512)
    assert causal < blk < bidir
    assert model_flops_per_token(**QWEN3, attention="block_causal", block_size=4096) == bidir


def test_flops_agree_with_an_independent_mfu_measurement():
    # A run elsewhere (megatron-core local spec + SDPA, Qwen3-1.7B shape, MDM,
    # seq 4096, one H100/H200) reported 26k tokens/s at 34.6% MFU of 989 TFLOP/s,
    # i.e. about 13.16 GFLOP per token.
    implied = 0.346 * 989e12 / 26_000
    assert abs(model_flops_per_token(**QWEN3) / implied - 1) < 0.01


def test_moe_flops_count_routed_and_shared_experts():
    dense = dict(QWEN3, num_layers=2)
    moe = model_flops_per_token(
        **dense, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=1024,
        moe_shared_expert_intermediate_size=512,
    )
    base = model_flops_per_token(**dict(dense, ffn_hidden_size=0))
    mlp = 2 * 3 * 2048 * 1024 + 3 * 2048 * 512 + 2048 * 8
    assert moe == base + 6 * 2 * mlp
    with pytest.raises(ValueError):
        model_flops_per_token(**QWEN3, attention="block_causal")


def test_attention_masks_are_refused_on_the_transformer_engine_path():
    from dlmspec.backends.megatron.data import DataConfig
    from dlmspec.backends.megatron.checks import check_masks_supported
    from dlmspec.backends.megatron.config import ObjectiveConfig

    data = DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True)
    check_masks_supported("local+sdpa", ObjectiveConfig(variable_length_prob=0.01), data)
    check_masks_supported("transformer_engine", ObjectiveConfig(variable_length_prob=0.0), data)
    with pytest.raises(ValueError, match="variable_length_prob"):
        check_masks_supported("transformer_engine", ObjectiveConfig(variable_length_prob=0.01), data)
    doc = DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True, reset_attention_mask=True)
    with pytest.raises(ValueError, match="reset_attention_mask"):
        check_masks_supported("transformer_engine", ObjectiveConfig(kind="ar"), doc)
