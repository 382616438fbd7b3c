"""A tiny megatron-core GPTModel whose layers run FlexAttention (model.attention_backend = "flex")
equals the same model on SDPA: loss and every parameter's gradient, with the document and
variable-length masks the objective forward step passes (CPU, float32)."""

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron.attention import FlexCoreAttention, SDPACoreAttention
from dlmspec.backends.megatron.layers import (
    BACKEND_LOCAL_SDPA,
    build_layer_spec,
    build_model,
    layer_spec_attention_backend,
    layer_spec_backend,
    layer_spec_takes_key_padding,
)
from dlmspec.backends.megatron.microbatches import MicrobatchItem
from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
from dlmspec.backends.megatron.rng import TRAIN_STREAM
from dlmspec.backends.megatron.stage import ObjectiveForwardStep

VOCAB, SEQ, EOD, MASK = 128, 32, 127, 126


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield


def _config():
    return TransformerConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False,
        calculate_per_token_loss=True,
    )


def _model(backend, attention="bidirectional", block_size=None):
    torch.manual_seed(0)
    spec = build_layer_spec(attention=attention, block_size=block_size, qk_layernorm=True,
                            use_transformer_engine=False, attention_backend=backend)
    return build_model(_config(), layer_spec=spec, vocab_size=VOCAB, max_sequence_length=SEQ,
                       position_embedding_type="rope", rotary_base=10000)[0]


def _loss_and_grads(model, attention):
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 100, (2, SEQ), generator=g)
    tokens[:, 10] = EOD
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, dims=1), "loss_mask": torch.ones(2, SEQ),
             "position_ids": torch.arange(SEQ).expand(2, SEQ).clone()}
    step = ObjectiveForwardStep(MaskedDiffusionObjective(MASK, variable_length_prob=1.0), seed=7,
                                data_parallel_rank=0, eod_id=EOD, device=torch.device("cpu"),
                                reset_attention_mask=True)
    item = MicrobatchItem(TRAIN_STREAM, 0, 0, batch)
    _, _, mask = step.prepare(item)
    assert mask is not None and mask.shape == (2, 1, SEQ, SEQ)
    output, loss_func = step(iter([item]), model)
    loss, tokens_counted, _ = loss_func(output)
    model.zero_grad()
    (loss / tokens_counted).backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("attention,block_size", [("bidirectional", None), ("block_causal", 8)])
def test_flex_model_equals_sdpa_model_loss_and_gradients(attention, block_size):
    sdpa, flex = _model("sdpa", attention, block_size), _model("flex", attention, block_size)
    flex.load_state_dict(sdpa.state_dict())
    loss_s, grads_s = _loss_and_grads(sdpa, attention)
    loss_f, grads_f = _loss_and_grads(flex, attention)
    torch.testing.assert_close(loss_f, loss_s, atol=1e-4, rtol=1e-5)
    assert grads_s.keys() == grads_f.keys() and grads_s
    for name in grads_s:
        torch.testing.assert_close(grads_f[name], grads_s[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_layer_spec_names_its_attention_backend():
    flex = build_layer_spec(attention="causal", use_transformer_engine=False, attention_backend="flex")
    sdpa = build_layer_spec(attention="causal", use_transformer_engine=False)
    core = lambda spec: spec.submodules.self_attention.submodules.core_attention.module  # noqa: E731
    assert core(flex) is FlexCoreAttention and core(sdpa) is SDPACoreAttention
    assert layer_spec_attention_backend(flex) == "flex" and layer_spec_attention_backend(sdpa) == "sdpa"
    assert layer_spec_backend(flex) == BACKEND_LOCAL_SDPA and layer_spec_takes_key_padding(flex)
    assert core(build_layer_spec(use_transformer_engine=False, attention_backend="auto")) is SDPACoreAttention
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        build_layer_spec(use_transformer_engine=False, attention_backend="cudnn")


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_mask_object_passes_through_gptmodel_as_its_dense_tensor_does(backend):
    """megatron-core's GPTModel hands attention_mask to the core attention untouched: a Document
    mask object (segment ids, no s x s tensor) gives the logits of its dense megatron form."""
    from dlmspec.backends.megatron import masks

    model = _model(backend)
    seg = torch.tensor([[0] * 12 + [1] * 20, [0] * 30 + [1] * 2])
    tokens = torch.randint(0, 100, (2, SEQ), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(SEQ).expand(2, SEQ)
    with torch.no_grad():
        by_object = model(tokens, pos, masks.Document(seg))
        by_tensor = model(tokens, pos, masks.Document(seg).dense(SEQ))
        unmasked = model(tokens, pos, None)
    torch.testing.assert_close(by_object, by_tensor, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(by_object, unmasked, atol=1e-3)
