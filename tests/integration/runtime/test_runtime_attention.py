"""CPU tests of the SDPA core attention (backends/megatron/attention.py)."""

import inspect
import math
from types import SimpleNamespace

import pytest
import torch

from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron.attention import SDPACoreAttention, block_causal_allowed


def _config(heads=4, groups=2, kv=8, dropout=0.0, sequence_parallel=False, **extra):
    return TransformerConfig(
        num_layers=1, hidden_size=heads * kv, num_attention_heads=heads, num_query_groups=groups,
        kv_channels=kv, attention_dropout=dropout, use_cpu_initialization=True,
        sequence_parallel=sequence_parallel, **extra,
    )


def _tp(size):
    return SimpleNamespace(tp=SimpleNamespace(size=lambda: size))


def _module(mode="bidirectional", block_size=None, tp=1, **cfg):
    return SDPACoreAttention(
        config=_config(**cfg), layer_number=1, attn_mask_type=AttnMaskType.no_mask,
        attention_type="self", pg_collection=_tp(tp), mode=mode, block_size=block_size,
    )


def _qkv(sq, b, heads, groups, hn, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sq, b, heads, hn, generator=g, dtype=dtype)
    k = torch.randn(sq, b, groups, hn, generator=g, dtype=dtype)
    v = torch.randn(sq, b, groups, hn, generator=g, dtype=dtype)
    return q, k, v


def _reference(q, k, v, allowed=None, scale=None):
    """softmax(Q K^T * scale + mask) V, head by head, in megatron layout."""
    sq, b, heads, hn = q.shape
    groups = k.shape[2]
    rep = heads // groups
    scale = scale if scale is not None else 1.0 / math.sqrt(hn)
    out = torch.empty(sq, b, heads, hn, dtype=q.dtype)
    for bi in range(b):
        for h in range(heads):
            qh, kh, vh = q[:, bi, h], k[:, bi, h // rep], v[:, bi, h // rep]
            scores = qh @ kh.T * scale
            if allowed is not None:
                a = allowed[bi] if allowed.dim() == 3 else allowed
                scores = scores.masked_fill(~a, float("-inf"))
            out[:, bi, h] = torch.softmax(scores, dim=-1) @ vh
    return out.reshape(sq, b, heads * hn)


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (4, 1)])
def test_bidirectional_matches_reference(heads, groups):
    attn = _module(heads=heads, groups=groups)
    q, k, v = _qkv(12, 3, heads, groups, 8)
    out = attn(q, k, v, None)
    assert out.shape == (12, 3, heads * 8)
    torch.testing.assert_close(out, _reference(q, k, v))


def test_causal_matches_reference():
    attn = _module(mode="causal")
    q, k, v = _qkv(10, 2, 4, 2, 8)
    allowed = torch.tril(torch.ones(10, 10, dtype=torch.bool))
    torch.testing.assert_close(attn(q, k, v, None), _reference(q, k, v, allowed))


def test_block_causal_matches_reference():
    attn = _module(mode="block_causal", block_size=4)
    q, k, v = _qkv(10, 2, 4, 2, 8)
    allowed = block_causal_allowed(10, 4)
    assert allowed[1, 3] and not allowed[1, 4] and allowed[9, 0] and allowed[4, 7]
    torch.testing.assert_close(attn(q, k, v, None), _reference(q, k, v, allowed))


def test_block_causal_pattern_limits():
    assert torch.equal(block_causal_allowed(6, 1), torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    assert bool(block_causal_allowed(6, 6).all())
    with pytest.raises(ValueError):
        block_causal_allowed(6, 0)


def test_key_padding_mask_in_megatron_convention():
    attn = _module(heads=4, groups=2)
    q, k, v = _qkv(9, 2, 4, 2, 8)
    lengths = torch.tensor([9, 5])
    beyond = torch.arange(9).unsqueeze(0) >= lengths.unsqueeze(1)  # True = not attended
    out = attn(q, k, v, beyond.view(2, 1, 1, 9))
    allowed = (~beyond).unsqueeze(1).expand(2, 9, 9)
    torch.testing.assert_close(out, _reference(q, k, v, allowed))
    # The first 5 positions of sequence 1 equal attention over a length-5 sequence.
    short = attn(q[:5, 1:2], k[:5, 1:2], v[:5, 1:2], None)
    torch.testing.assert_close(out[:5, 1:2], short)


def test_causal_with_document_mask_and_no_nan_rows():
    attn = _module(mode="causal")
    q, k, v = _qkv(8, 1, 4, 2, 8)
    doc = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    masked = (doc.unsqueeze(0) != doc.unsqueeze(1)).view(1, 1, 8, 8)
    # A key-padding mask that removes every key of document 2 except nothing for its queries.
    padding = (torch.arange(8) >= 5).view(1, 1, 1, 8)
    out = attn(q, k, v, masked | padding)
    assert torch.isfinite(out).all()
    allowed = (~masked[0, 0]) & torch.tril(torch.ones(8, 8, dtype=torch.bool))
    torch.testing.assert_close(out[:5], _reference(q, k, v, allowed)[:5])


def test_softmax_scale_is_honoured():
    attn = SDPACoreAttention(
        config=_config(), layer_number=1, attn_mask_type=AttnMaskType.no_mask, attention_type="self",
        softmax_scale=0.05, pg_collection=_tp(1),
    )
    q, k, v = _qkv(6, 1, 4, 2, 8)
    torch.testing.assert_close(attn(q, k, v, None), _reference(q, k, v, scale=0.05))


def test_tensor_parallel_partition_sizes():
    attn = _module(heads=8, groups=4, kv=16, tp=2)
    assert attn.num_attention_heads_per_partition == 4
    assert attn.num_query_groups_per_partition == 2
    assert attn.hidden_size_per_partition == 64
    q, k, v = _qkv(5, 2, 4, 2, 16)  # one partition's heads
    out = attn(q, k, v, None)
    assert out.shape == (5, 2, 64)
    torch.testing.assert_close(out, _reference(q, k, v))


def test_bf16_flash_path_shapes():
    attn = _module(heads=4, groups=2)
    q, k, v = _qkv(16, 2, 4, 2, 8, dtype=torch.bfloat16)
    out = attn(q, k, v, None)
    assert out.dtype == torch.bfloat16 and out.shape == (16, 2, 32)
    torch.testing.assert_close(out.double(), _reference(q.double(), k.double(), v.double()), atol=2e-2, rtol=2e-2)


def test_attention_dropout_only_in_training():
    # On CPU the dropout draws come from torch's default generator (megatron's
    # CUDA RNG tracker is only forked for CUDA tensors).
    attn = _module(dropout=0.5)
    q, k, v = _qkv(8, 2, 4, 2, 8)
    attn.eval()
    torch.testing.assert_close(attn(q, k, v, None), _reference(q, k, v))
    attn.train()
    torch.manual_seed(0)
    dropped = attn(q, k, v, None)
    assert not torch.allclose(dropped, _reference(q, k, v))


def test_forward_signature_matches_megatron_dot_product_attention():
    ours = inspect.signature(SDPACoreAttention.forward).parameters
    theirs = inspect.signature(DotProductAttention.forward).parameters
    assert list(ours) == list(theirs)
    for name in theirs:
        assert ours[name].default == theirs[name].default, name
    init_ours = inspect.signature(SDPACoreAttention.__init__).parameters
    for name in inspect.signature(DotProductAttention.__init__).parameters:
        assert name in init_ours, name


def test_unsupported_inputs_raise():
    attn = _module()
    q, k, v = _qkv(4, 1, 4, 2, 8)
    with pytest.raises(NotImplementedError):
        attn(q, k, v, None, packed_seq_params=object())
    with pytest.raises(NotImplementedError):
        attn(q, k, v, None, attention_bias=torch.zeros(1))
    with pytest.raises(ValueError):
        attn(q, k, v, torch.zeros(1, 1, 1, 4))  # float mask
    with pytest.raises(ValueError):
        _module(mode="sliding")
    with pytest.raises(ValueError):
        _module(mode="block_causal")


def test_auto_backend_prefers_cudnn_on_hopper_and_keeps_pytorch_order_elsewhere(monkeypatch):
    from dlmspec.backends.megatron import attention

    attention.auto_sdpa_backend.cache_clear()
    try:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        assert attention.auto_sdpa_backend(torch.device("cuda", 0)) == "cudnn"
        attention.auto_sdpa_backend.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        assert attention.auto_sdpa_backend(torch.device("cuda", 0)) == "auto"
        assert attention.auto_sdpa_backend(torch.device("cpu")) == "auto"
    finally:
        attention.auto_sdpa_backend.cache_clear()
