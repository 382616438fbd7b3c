"""The sampler and the ELBO against a tiny megatron-core GPTModel on CPU (backends/generate/models.py):
the key-padding mask and position ids of left-padded prompts reach the model as it takes them."""

from __future__ import annotations

import pytest
import torch

from cpu_world_kit import megatron_cpu_world

VOCAB, MASK, EOS = 64, 63, 62


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        torch.manual_seed(0)
        config = TransformerConfig(
            num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
            kv_channels=8, normalization="RMSNorm", add_bias_linear=False, hidden_dropout=0.0,
            attention_dropout=0.0, use_cpu_initialization=True, bias_activation_fusion=False,
            bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
        )
        (model,) = build_model(
            config, layer_spec=build_layer_spec(attention="bidirectional", qk_layernorm=False, use_transformer_engine=False),
            vocab_size=VOCAB, max_sequence_length=64, position_embedding_type="rope",
        )
        model.eval()
        yield model


def test_left_padded_prompts_generate_what_they_generate_alone(gpt):
    from dlmspec.backends.generate.config import GenerateConfig
    from dlmspec.backends.generate.models import gpt_logits_fn
    from dlmspec.backends.generate.sampler import generate

    logits_fn = gpt_logits_fn(gpt)
    cfg = GenerateConfig(gen_length=8, steps=4, block_length=4, mask_token_id=MASK, eos_token_id=EOS)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    batched = generate(logits_fn, prompts, cfg)
    alone = [generate(logits_fn, [p], cfg).generated[0] for p in prompts]
    assert batched.generated == alone
    assert not bool((batched.sequences == MASK).any())
    # the padding is hidden from attention: a padded row's logits at its real positions are the
    # prompt's alone
    padded = torch.tensor([[0, 0, 0, 0, 11, 12]])
    mask = torch.tensor([[False] * 4 + [True] * 2])
    assert torch.allclose(logits_fn(padded, mask)[0, 4:], logits_fn(torch.tensor([[11, 12]]))[0], atol=1e-5)


def test_elbo_of_a_gptmodel_is_finite_and_reproducible(gpt):
    from dlmspec.backends.generate.likelihood import elbo_nll
    from dlmspec.backends.generate.models import gpt_logits_fn

    logits_fn = gpt_logits_fn(gpt)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    target = torch.tensor([[False, False, True, True, True, True, True, True]])
    a = elbo_nll(logits_fn, tokens, mask_token_id=MASK, generator=torch.Generator().manual_seed(0),
                 target_mask=target, num_samples=8, samples_per_forward=4)
    b = elbo_nll(logits_fn, tokens, mask_token_id=MASK, generator=torch.Generator().manual_seed(0),
                 target_mask=target, num_samples=8, samples_per_forward=8)
    assert torch.isfinite(a.nll).all() and float(a.stderr[0]) > 0
    # an untrained model is near uniform: about log(VOCAB) nats per token
    assert abs(float(a.nll_per_token[0]) - torch.log(torch.tensor(float(VOCAB)))) < 1.5
    assert torch.allclose(a.samples, b.samples, atol=1e-4)  # the batching of samples changes no draw
