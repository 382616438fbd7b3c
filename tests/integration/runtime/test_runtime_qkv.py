"""dlmspec.backends.megatron.qkv and .norms: the fused QKV path and the compiled norms compute megatron-core's
layer (values and gradients), on CPU (the compiled kernels once through inductor's CPU backend)."""

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron import qkv
from dlmspec.backends.megatron.layers import CompiledLocalNorm, LocalNorm, build_layer_spec, build_model, layer_spec_fusions
from dlmspec.backends.megatron.norms import CompiledLayerNorm, CompiledRMSNorm, layer_norm_reference, rms_norm_reference

SEQ, VOCAB = 16, 96


def _freqs(s, d, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(s, dtype=torch.float32), inv)
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


def _megatron_qkv(mixed, q_norm, k_norm, freqs, groups, per_group, hn):
    """megatron-core's SelfAttention.get_query_key_value_tensors + apply_rotary_pos_emb, unfused."""
    s, b = mixed.shape[:2]
    x = mixed.view(s, b, groups, (per_group + 2) * hn)
    q, k, v = torch.split(x, [per_group * hn, hn, hn], dim=3)
    q = q.reshape(s, b, -1, hn)
    q, k = q_norm(q), k_norm(k)
    return rope_utils._apply_rotary_pos_emb_bshd(q, freqs), rope_utils._apply_rotary_pos_emb_bshd(k, freqs), v


@pytest.mark.parametrize("compiled", [False, True])
def test_qkv_norm_rope_equals_megatron_values_and_gradients(compiled):
    torch.manual_seed(0)
    s, b, groups, per_group, hn = 8, 2, 2, 3, 16
    mixed = torch.randn(s, b, groups * (per_group + 2) * hn, requires_grad=True)
    q_norm, k_norm = torch.nn.RMSNorm(hn, eps=1e-6), torch.nn.RMSNorm(hn, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.uniform_(0.5, 1.5)
        k_norm.weight.uniform_(0.5, 1.5)
    freqs = _freqs(s, hn)
    ours = qkv.qkv_norm_rope(mixed, q_norm.weight, k_norm.weight, freqs, groups, per_group, hn, 1e-6, 1e-6,
                             compiled=compiled)
    ref_mixed = mixed.detach().clone().requires_grad_()
    theirs = _megatron_qkv(ref_mixed, q_norm, k_norm, freqs, groups, per_group, hn)
    grads = [torch.randn_like(t) for t in theirs]
    for a, c in zip(ours, theirs):
        assert a.shape == c.shape
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)
        assert a.permute(1, 2, 0, 3).is_contiguous()  # [b, h, s, d] in memory for SDPA/cuDNN
    weights = [mixed, q_norm.weight, k_norm.weight]
    ours_grad = torch.autograd.grad(ours, weights, grads)
    theirs_grad = torch.autograd.grad(theirs, [ref_mixed, q_norm.weight, k_norm.weight], grads)
    for a, c in zip(ours_grad, theirs_grad):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-4)


def test_qkv_without_norm_or_rope_is_the_plain_split():
    s, b, groups, per_group, hn = 4, 1, 1, 2, 8
    mixed = torch.randn(s, b, groups * (per_group + 2) * hn, dtype=torch.bfloat16)
    q, k, v = qkv.qkv_norm_rope(mixed, None, None, None, groups, per_group, hn)
    x = mixed.view(s, b, groups, -1)
    assert torch.equal(q, x[..., : per_group * hn].reshape(s, b, -1, hn))
    assert torch.equal(k, x[..., per_group * hn: (per_group + 1) * hn])
    assert torch.equal(v, x[..., (per_group + 1) * hn:])


@pytest.mark.parametrize("compiled", [False, True])
def test_norm_references_equal_torch(compiled):
    torch.manual_seed(1)
    x = torch.randn(6, 3, 32, requires_grad=True)
    w, bias = torch.rand(32) + 0.5, torch.randn(32)
    rms = torch.compile(rms_norm_reference, dynamic=False) if compiled else rms_norm_reference
    ln = torch.compile(layer_norm_reference, dynamic=False) if compiled else layer_norm_reference
    torch.testing.assert_close(rms(x, w, 1e-5), torch.nn.functional.rms_norm(x, (32,), w, 1e-5))
    torch.testing.assert_close(ln(x, w, bias, 1e-5), torch.nn.functional.layer_norm(x, (32,), w, bias, 1e-5),
                               rtol=1e-5, atol=1e-5)
    g = torch.randn_like(x)
    ours = torch.autograd.grad(rms(x, w, 1e-5), x, g)[0]
    theirs = torch.autograd.grad(torch.nn.functional.rms_norm(x, (32,), w, 1e-5), x, g)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    xb = x.detach().bfloat16()
    torch.testing.assert_close(rms_norm_reference(xb, w.bfloat16(), 1e-5),
                               torch.nn.functional.rms_norm(xb, (32,), w.bfloat16(), 1e-5), rtol=0.01, atol=0.01)


def _config(**extra):
    base = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True, layernorm_epsilon=1e-6,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, qk_layernorm=True,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False,
    )
    base.update(extra)
    return TransformerConfig(**base)


def test_spec_selects_fused_attention_and_compiled_norms():
    spec = build_layer_spec(qk_layernorm=True, use_transformer_engine=False, qkv_fusion=True, compiled_norm=True)
    attn = spec.submodules.self_attention
    assert attn.module is qkv.FusedQKVSelfAttention
    assert attn.submodules.q_layernorm is CompiledLocalNorm and spec.submodules.input_layernorm is CompiledLocalNorm
    plain = build_layer_spec(qk_layernorm=True, use_transformer_engine=False)
    assert plain.submodules.self_attention.module is not qkv.FusedQKVSelfAttention
    assert plain.submodules.input_layernorm is LocalNorm
    assert layer_spec_fusions(spec) == {"qkv_fusion": True, "compiled_norm": True}
    assert layer_spec_fusions(plain) == {"qkv_fusion": False, "compiled_norm": False}
    norm = CompiledLocalNorm(_config(), 64, eps=1e-6)
    assert isinstance(norm, CompiledRMSNorm) and isinstance(norm, torch.nn.RMSNorm)
    assert isinstance(CompiledLocalNorm(_config(normalization="LayerNorm"), 64), CompiledLayerNorm)


@pytest.mark.parametrize("recompute", [None, "selective"])
def test_fused_model_equals_megatron_model(tmp_path_factory, monkeypatch, recompute):
    """Same weights, same batch: GPTModel with FusedQKVSelfAttention (run eagerly on CPU) gives
    megatron-core's logits and gradients; the fast path is taken, not megatron's forward."""
    monkeypatch.setattr(qkv, "REQUIRE_CUDA", False)
    taken = []
    monkeypatch.setattr(qkv.FusedQKVSelfAttention, "fast_path_reason",
                        lambda self, *a, _orig=qkv.FusedQKVSelfAttention.fast_path_reason: taken.append(_orig(self, *a)) or taken[-1])
    checkpointed = []

    def no_rng_checkpoint(self, q, k, v, mask, **kwargs):  # megatron's checkpoint asks CUDA for RNG state
        checkpointed.append(type(self))
        return self.core_attention(q, k, v, mask, **kwargs)

    monkeypatch.setattr(qkv.SelfAttention, "_checkpointed_attention_forward", no_rng_checkpoint)
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        extra = {"recompute_granularity": recompute} if recompute else {}
        models = []
        for fused in (False, True):
            torch.manual_seed(0)
            spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False,
                                    qkv_fusion=fused, compiled_norm=fused)
            (model,) = build_model(_config(**extra), layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                                   position_embedding_type="rope", rotary_base=10000)
            models.append(model)
        ref, fused = models
        assert ref.state_dict().keys() == fused.state_dict().keys()
        fused.load_state_dict(ref.state_dict())
        g = torch.Generator().manual_seed(3)
        tokens = torch.randint(0, VOCAB, (2, SEQ), generator=g)
        position_ids = torch.arange(SEQ).expand(2, SEQ)
        outs = []
        for model in (ref, fused):
            model.zero_grad()
            logits = model(tokens, position_ids, attention_mask=None)
            logits.float().pow(2).mean().backward()
            outs.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    assert taken and all(reason is None for reason in taken)
    assert checkpointed.count(qkv.FusedQKVSelfAttention) == (2 if recompute else 0)  # one per layer
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-4)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_fast_path_declines_what_it_does_not_cover(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(qkv, "REQUIRE_CUDA", False)
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        spec = build_layer_spec(attention="bidirectional", qk_layernorm=True, use_transformer_engine=False,
                                qkv_fusion=True)
        (model,) = build_model(_config(normalization="LayerNorm"), layer_spec=spec, vocab_size=VOCAB,
                               max_sequence_length=SEQ, position_embedding_type="rope", rotary_base=10000)
        attn = model.decoder.layers[0].self_attention
        hidden = torch.zeros(SEQ, 1, 64)
        freqs = _freqs(SEQ, 16)
        assert attn.fast_path_reason(hidden, None, None, (freqs, freqs), None, None, None) == "q/k norm is not RMSNorm"
        assert attn.fast_path_reason(hidden, None, None, (freqs, freqs), None, None, object()) == "packed sequences"
        assert attn.fast_path_reason(hidden, None, None, (freqs[..., :8], freqs[..., :8]), None, None, None) is not None
        (rms_model,) = build_model(_config(), layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                                   position_embedding_type="rope", rotary_base=10000)
        rms_attn = rms_model.decoder.layers[0].self_attention
        half = freqs[..., :8]
        assert rms_attn.fast_path_reason(hidden, None, None, (half, half), None, None, None) == "partial rotary dimension"
        assert rms_attn.fast_path_reason(hidden, None, None, (freqs, freqs), None, None, None) is None
    monkeypatch.setattr(qkv, "REQUIRE_CUDA", True)
    assert attn.fast_path_reason(hidden, None, None, None, None, None, None) == "not a CUDA tensor"
