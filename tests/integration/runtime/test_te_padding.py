"""Variable-length MDM sequences on the Transformer Engine path: the TE core attention
takes the objective's ``[b, 1, 1, s]`` key-padding mask as TE's ``padding`` mask type.

Transformer Engine does not install on this CPU machine, so its ``DotProductAttention`` is stood in
by a class that records what megatron-core's ``TEDotProductAttention.forward`` would hand TE; the
numbers themselves are compared with the local path on the H200 (bench/devbox/gpu/te_matrix.sh).
"""

from __future__ import annotations

import copy

import pytest
import torch

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.spec_utils import ModuleSpec

from dlmspec.backends.megatron import layers
from dlmspec.backends.megatron.attention import te_mask_type, with_key_padding
from dlmspec.backends.megatron.checks import check_masks_supported
from dlmspec.backends.megatron.config import ObjectiveConfig
from dlmspec.backends.megatron.data import DataConfig


class FakeTEAttention(torch.nn.Module):
    """Records the mask type and mask megatron-core's TE attention wrapper passes on."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.calls = []

    def forward(self, query, key, value, attention_mask, attn_mask_type, attention_bias=None,
                packed_seq_params=None, **kwargs):
        self.calls.append((attn_mask_type, attention_mask))
        return torch.full_like(query.flatten(2), float("nan"))  # what TE may leave at padded queries


FakeTEAttention.__module__ = "megatron.core.extensions.transformer_engine"


def _qkv(s=6, b=2):
    q = torch.zeros(s, b, 4, 8)
    return q, torch.zeros(s, b, 2, 8), torch.zeros(s, b, 2, 8)


def test_mask_type_per_call():
    mask = torch.zeros(2, 1, 1, 6, dtype=torch.bool)
    assert te_mask_type(AttnMaskType.no_mask, None) is AttnMaskType.no_mask
    assert te_mask_type(AttnMaskType.causal, None) is AttnMaskType.causal
    assert te_mask_type(AttnMaskType.no_mask, mask) is AttnMaskType.padding
    assert te_mask_type(AttnMaskType.causal, mask) is AttnMaskType.padding_causal
    with pytest.raises(ValueError, match="key-padding"):
        te_mask_type(AttnMaskType.no_mask, torch.zeros(2, 1, 6, 6, dtype=torch.bool))  # a document mask
    with pytest.raises(ValueError, match="bool"):
        te_mask_type(AttnMaskType.no_mask, torch.zeros(2, 1, 1, 6))
    with pytest.raises(ValueError, match="arbitrary"):
        te_mask_type(AttnMaskType.arbitrary, mask)


def test_wrapper_hands_te_the_padding_mask():
    cls = with_key_padding(FakeTEAttention)
    assert issubclass(cls, FakeTEAttention) and with_key_padding(FakeTEAttention) is cls  # one class per base
    attn = cls()
    q, k, v = _qkv()
    lengths = torch.tensor([6, 3])
    beyond = torch.arange(6).unsqueeze(0) >= lengths.unsqueeze(1)  # the objective's mask, True = not attended
    q.requires_grad_(True)
    out = attn(q, k, v, beyond.view(2, 1, 1, 6), AttnMaskType.no_mask)
    assert out.shape == (6, 2, 32)
    # padded queries come back as zeros (nothing reads them, but a NaN there times a zero loss weight is NaN)
    assert torch.equal(out[3:, 1], torch.zeros(3, 32))
    assert torch.isnan(out[:3, 1]).all() and torch.isnan(out[:, 0]).all()
    attn(q, k, v, None, AttnMaskType.no_mask)  # a micro-batch with nothing cut: TE's fastest kernels
    (t1, m1), (t2, m2) = attn.calls
    assert t1 is AttnMaskType.padding and torch.equal(m1, beyond.view(2, 1, 1, 6))
    assert t2 is AttnMaskType.no_mask and m2 is None


def _fake_te_spec(**kwargs):
    spec = copy.deepcopy(layers.get_gpt_layer_local_spec(qk_layernorm=kwargs.get("qk_layernorm", False)))
    spec.submodules.self_attention.submodules.core_attention = ModuleSpec(module=FakeTEAttention)
    return spec


@pytest.fixture
def fake_te(monkeypatch):
    monkeypatch.setattr(layers, "transformer_engine_available", lambda: True)
    monkeypatch.setattr(layers, "get_gpt_layer_with_transformer_engine_spec", _fake_te_spec)


def test_te_layer_spec_takes_variable_length(fake_te):
    spec = layers.build_layer_spec(attention="bidirectional", use_transformer_engine=True)
    core = spec.submodules.self_attention.submodules.core_attention
    assert core.module is with_key_padding(FakeTEAttention)
    assert layers.layer_spec_backend(spec) == layers.BACKEND_TRANSFORMER_ENGINE
    assert layers.layer_spec_attention(spec) == "bidirectional"
    data = DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True)
    check_masks_supported(spec, ObjectiveConfig(variable_length_prob=0.5), data)  # runs on TE now
    doc = DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True, reset_attention_mask=True)
    with pytest.raises(ValueError, match="reset_attention_mask"):  # a document mask is not key padding
        check_masks_supported(spec, ObjectiveConfig(kind="ar"), doc)


def test_plain_te_attention_still_refuses_variable_length():
    """A TE layer spec whose attention drops masks (megatron-core's own) keeps the refusal."""
    data = DataConfig(seq_length=8, vocab_size=10, eod_id=9, mock=True)
    spec = _fake_te_spec()
    with pytest.raises(ValueError, match="variable_length_prob"):
        check_masks_supported(spec, ObjectiveConfig(variable_length_prob=0.5), data)
    with pytest.raises(ValueError, match="variable_length_prob"):
        check_masks_supported("transformer_engine", ObjectiveConfig(variable_length_prob=0.5), data)
    check_masks_supported(spec, ObjectiveConfig(variable_length_prob=0.5, variable_length="micro_batch"), data)


class EmulatedTEAttention(torch.nn.Module):
    """TE's self-attention semantics in sbhd, in float64: ``padding`` takes row ``r``'s length from the
    mask (its ``cu_seqlens``: the keys not masked) and attends its first ``L_r`` queries to its first
    ``L_r`` keys, leaving the padded queries unwritten (NaN here); ``no_mask`` attends everything."""

    def forward(self, query, key, value, attention_mask, attn_mask_type, attention_bias=None, packed_seq_params=None):
        s, b, heads, hn = query.shape
        rep = heads // key.shape[2]
        k, v = key.repeat_interleave(rep, dim=2), value.repeat_interleave(rep, dim=2)
        out = torch.full_like(query, float("nan"))
        lengths = [s] * b
        if attn_mask_type is AttnMaskType.padding:
            lengths = (~attention_mask.view(b, s)).sum(dim=1).tolist()
        for r, n in enumerate(lengths):
            q_, k_, v_ = (t[:n, r].transpose(0, 1) for t in (query, k, v))  # [heads, n, hn]
            weights = torch.softmax(q_ @ k_.transpose(1, 2) / hn ** 0.5, dim=-1)
            out[:n, r] = (weights @ v_).transpose(0, 1)
        return out.reshape(s, b, heads * hn)


def test_te_padding_equals_the_local_path_where_the_loss_reads():
    """Outputs (and gradients) at every row's valid positions match the local path's SDPA attention
    with the same key-padding mask; padded queries are 0 on TE (the local path lets them attend)."""
    from types import SimpleNamespace

    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.attention import SDPACoreAttention

    s, b, heads, groups, hn = 8, 3, 4, 2, 16
    config = TransformerConfig(num_layers=1, hidden_size=heads * hn, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=hn, attention_dropout=0.0,
                               use_cpu_initialization=True)
    local = SDPACoreAttention(config=config, layer_number=1, attn_mask_type=AttnMaskType.no_mask,
                              attention_type="self", pg_collection=SimpleNamespace(tp=SimpleNamespace(size=lambda: 1)))
    te = with_key_padding(EmulatedTEAttention)()
    g = torch.Generator().manual_seed(0)
    qkv = [torch.randn(s, b, n, hn, generator=g, dtype=torch.float64, requires_grad=True) for n in (heads, groups, groups)]
    lengths = torch.tensor([8, 5, 1])
    beyond = (torch.arange(s).unsqueeze(0) >= lengths.unsqueeze(1)).view(b, 1, 1, s)
    valid = ~beyond.view(b, s).t().unsqueeze(-1)  # [s, b, 1]
    out_local = local(*qkv, beyond, AttnMaskType.no_mask)
    grads_local = torch.autograd.grad((out_local * valid).sum(), qkv)
    out_te = te(*qkv, beyond, AttnMaskType.no_mask)
    grads_te = torch.autograd.grad((out_te * valid).sum(), qkv)
    assert torch.allclose(torch.where(valid, out_te, 0), torch.where(valid, out_local, 0), atol=1e-12)
    assert torch.equal(torch.where(valid, 0, out_te), torch.zeros_like(out_te))  # padded queries: zeros, no NaN
    for a, c in zip(grads_te, grads_local):
        assert torch.isfinite(a).all() and torch.allclose(a, c, atol=1e-12)
