"""FlexAttention core attention against SDPA on CPU (backends/megatron/attention.py FlexCoreAttention):
outputs and gradients through the core-attention modules, for the masks both run."""

from types import SimpleNamespace

import pytest
import torch

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron import masks
from dlmspec.backends.megatron.attention import FlexCoreAttention, SDPACoreAttention, takes_key_padding
from dlmspec.backends.megatron.data import document_attention_mask
from dlmspec.backends.megatron.sft import segment_attention_mask


def _config(heads=4, groups=2, kv=16, dropout=0.0, cp=1):
    return TransformerConfig(num_layers=1, hidden_size=heads * kv, num_attention_heads=heads, num_query_groups=groups,
                             kv_channels=kv, attention_dropout=dropout, use_cpu_initialization=True,
                             context_parallel_size=cp)


def _pg():
    return SimpleNamespace(tp=SimpleNamespace(size=lambda: 1))


def _pair(mode="bidirectional", block_size=None, heads=4, groups=2):
    kw = dict(layer_number=1, attn_mask_type=AttnMaskType.no_mask, attention_type="self", pg_collection=_pg(),
              mode=mode, block_size=block_size)
    return (SDPACoreAttention(config=_config(heads, groups), **kw),
            FlexCoreAttention(config=_config(heads, groups), **kw))


def _qkv(s, b, heads, groups, hn=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(s, b, h, hn, generator=g, dtype=torch.float32).requires_grad_(True)  # noqa: E731
    return make(heads), make(groups), make(groups)


def _run(module, q, k, v, mask):
    """Output and (dq, dk, dv) of a weighted sum of the output (a fixed random cotangent)."""
    out = module(q, k, v, mask)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    return out.detach(), grads


def _assert_same(sdpa, flex, q, k, v, mask_sdpa, mask_flex=None):
    out_s, g_s = _run(sdpa, q, k, v, mask_sdpa)
    out_f, g_f = _run(flex, q, k, v, mask_sdpa if mask_flex is None else mask_flex)
    torch.testing.assert_close(out_f, out_s, atol=2e-5, rtol=1e-4)
    for name, a, b in zip("qkv", g_f, g_s):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2)])
def test_flex_equals_sdpa_bidirectional_outputs_and_gradients(heads, groups):
    sdpa, flex = _pair(heads=heads, groups=groups)
    _assert_same(sdpa, flex, *_qkv(40, 2, heads, groups), None)


def test_flex_equals_sdpa_causal_outputs_and_gradients():
    sdpa, flex = _pair("causal")
    _assert_same(sdpa, flex, *_qkv(37, 2, 4, 2), None)


@pytest.mark.parametrize("block", [1, 4, 16])
def test_flex_equals_sdpa_block_causal_outputs_and_gradients(block):
    sdpa, flex = _pair("block_causal", block_size=block)
    _assert_same(sdpa, flex, *_qkv(48, 2, 4, 2), None)


def test_flex_equals_sdpa_document_mask_tensor_outputs_and_gradients():
    """The data pipeline's dense document mask ([b, 1, s, s], True = hidden), as the stage passes it."""
    tokens = torch.tensor([[5, 6, 0, 7, 8, 9, 0, 1, 2, 3, 4, 0, 5, 6, 7, 8],
                           [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 0, 5, 6]])
    dense = document_attention_mask(tokens, eod_id=0)
    sdpa, flex = _pair()
    _assert_same(sdpa, flex, *_qkv(16, 2, 4, 2), dense)


def test_flex_equals_sdpa_packed_segments_outputs_and_gradients():
    """SFT packing's segments: the dense tensor to SDPA, the segment ids (no s x s tensor) to Flex."""
    seg = torch.tensor([[0] * 7 + [1] * 9 + [2] * 8, [0] * 20 + [1] * 4])
    dense = segment_attention_mask(seg)
    sdpa, flex = _pair("causal")
    _assert_same(sdpa, flex, *_qkv(24, 2, 4, 2), dense, masks.Document(seg))


def test_flex_equals_sdpa_key_padding_with_block_causal():
    padded = torch.zeros(2, 32, dtype=torch.bool)
    padded[0, 20:] = True
    sdpa, flex = _pair("block_causal", block_size=8)
    _assert_same(sdpa, flex, *_qkv(32, 2, 4, 2), padded.view(2, 1, 1, 32), masks.KeyPadding(padded))


def test_flex_equals_sdpa_block_diffusion_mask_function():
    """A mask function with a block length (block diffusion's x_t ⊕ x_0 mask, 2L = 32): the same
    object to both modules, SDPA lowering it to a dense tensor, Flex to a BlockMask."""
    mask = masks.block_diffusion(16, 4)
    sdpa, flex = _pair()
    _assert_same(sdpa, flex, *_qkv(32, 2, 4, 2), mask)


def test_block_diffusion_mask_equals_paper_definition():
    """BD3-LM (Arriola et al. 2025): x_t block i sees x_t block i and x_0 blocks < i; x_0 block i
    sees x_0 blocks <= i; x_0 never sees x_t."""
    n, bs = 12, 4
    ref = torch.zeros(2 * n, 2 * n, dtype=torch.bool)
    for q in range(2 * n):
        for k in range(2 * n):
            qb, kb = (q % n) // bs, (k % n) // bs
            if q < n and k < n:
                ref[q, k] = qb == kb
            elif q < n <= k:
                ref[q, k] = kb < qb
            elif q >= n and k >= n:
                ref[q, k] = kb <= qb
    got = masks.block_diffusion(n, bs).allowed(2 * n, 2 * n)[0, 0]
    assert torch.equal(got, ref)


def test_block_mask_of_structural_mask_is_cached_per_shape():
    masks.clear_block_mask_cache()
    a = masks.BlockCausal(8).block_mask(64, 64, "cpu")
    assert masks.BlockCausal(8).block_mask(64, 64, "cpu") is a
    assert masks.BlockCausal(8).block_mask(32, 32, "cpu") is not a
    assert masks.BlockCausal(4).block_mask(64, 64, "cpu") is not a


def test_mask_objects_lower_to_sdpa_and_te_forms():
    assert masks.Bidirectional().sdpa(8, 8) == (None, False)
    assert masks.Causal().sdpa(8, 8) == (None, True)
    assert masks.Causal().te() == ("causal", None)
    padded = torch.zeros(2, 8, dtype=torch.bool)
    padded[1, 5:] = True
    kind, tensor = (masks.Causal() & masks.KeyPadding(padded)).te()
    assert kind == "padding_causal" and tensor.shape == (2, 1, 1, 8) and bool(tensor[1, 0, 0, 6])
    with pytest.raises(ValueError, match="block_causal mask"):
        masks.BlockCausal(4).te()
    with pytest.raises(ValueError, match="use the local layers"):
        masks.block_diffusion(8, 4).te()
    # megatron's convention round-trips
    dense = masks.BlockCausal(2).dense(6)
    assert torch.equal(masks.from_megatron(dense).dense(6), dense)


def test_flex_refuses_context_parallelism_and_dropout():
    kw = dict(layer_number=1, attn_mask_type=AttnMaskType.no_mask, attention_type="self", pg_collection=_pg())
    with pytest.raises(ValueError, match="no context parallelism"):
        FlexCoreAttention(config=_config(cp=2), cp_comm_type="all_gather", **kw)
    with pytest.raises(ValueError, match="no attention dropout"):
        FlexCoreAttention(config=_config(dropout=0.1), **kw)


def test_flex_takes_key_padding_and_declares_every_mask_kind():
    from dlmspec.attention import MASK_KINDS

    assert takes_key_padding(FlexCoreAttention)
    assert FlexCoreAttention.mask_kinds == frozenset(MASK_KINDS)
    assert "mask_mod" in SDPACoreAttention.mask_kinds
