"""Variable-length MDM sequences on the Transformer Engine path (issue 21): the TE core attention
takes the objective's ``[b, 1, 1, s]`` key-padding mask as TE's ``padding`` mask type.

Transformer Engine does not install on this CPU machine, so its ``DotProductAttention`` is stood in
by a class that records what megatron-core's ``TEDotProductAttention.forward`` would hand TE; the
numbers themselves are compared with the local path on the H200 (bench/gpu/te_matrix.sh).
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
