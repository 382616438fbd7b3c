"""Block-by-block sampling of a block-diffusion model on a tiny megatron-core GPTModel on CPU
(backends/generate/block_diffusion.py): the exact KV cache of the clean prefix gives the tokens
(and the logits) that recomputing ``[prefix, block]`` under the block-causal mask gives, the
prompt is kept, every block is decoded, and the NELBO forward repeats RoPE for the two halves."""

from __future__ import annotations

import pytest
import torch

from cpu_world_kit import megatron_cpu_world

VOCAB, MASK = 64, 63


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    from megatron.core.transformer.transformer_config import TransformerConfig

    from dlmspec.backends.megatron.layers import build_layer_spec, build_model

    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        torch.manual_seed(0)
        config = TransformerConfig(
            num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, num_query_groups=2,
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


def test_the_cached_sampler_gives_the_tokens_of_recomputing_the_prefix(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_generate

    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [20, 21, 22, 23, 24, 25, 26, 27]])
    args = dict(gen_length=12, block_size=4, steps_per_block=2, mask_token_id=MASK, vocab_size=MASK)
    recomputed = bd3_generate(gpt, prompt, cache=False, **args)
    cached = bd3_generate(gpt, prompt, cache=True, **args)
    assert torch.equal(cached, recomputed)
    assert torch.equal(cached[:, :8], prompt) and not bool((cached == MASK).any()) and cached.shape == (2, 20)


def test_a_cached_step_has_the_logits_of_the_block_causal_recompute(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import GPTBlockCache, prefix_block_mask

    seq = torch.randint(0, 60, (1, 12), generator=torch.Generator().manual_seed(1))
    block = torch.tensor([[MASK, 3, MASK, 4]])
    with torch.no_grad():
        full = gpt(torch.cat([seq, block], dim=1), torch.arange(16).unsqueeze(0), prefix_block_mask(12, 4))[:, 12:]
        with GPTBlockCache(gpt) as kv:
            for start in range(0, 12, 4):
                kv.append(seq[:, start:start + 4], start)
            cached = kv.step(block, 12)
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)
    # leaving the cache restores the model: a plain forward is the bidirectional one again
    with torch.no_grad():
        again = gpt(torch.cat([seq, block], dim=1), torch.arange(16).unsqueeze(0), prefix_block_mask(12, 4))[:, 12:]
    torch.testing.assert_close(again, full)


def test_the_nelbo_forward_repeats_positions_for_the_clean_half(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_forward
    from dlmspec.backends.megatron.masks import BlockCausal, block_diffusion

    tokens = torch.randint(0, 60, (1, 8), generator=torch.Generator().manual_seed(2))
    logits = bd3_forward(gpt)(torch.cat([tokens, tokens], dim=1), torch.arange(8).repeat(2).unsqueeze(0),
                             block_diffusion(8, 4))
    # a clean block's logits under the block-causal x_0 half equal the prefix computed alone
    with torch.no_grad():
        alone = gpt(tokens, torch.arange(8).unsqueeze(0), BlockCausal(4))
    torch.testing.assert_close(logits[:, 8:], alone.float(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs,match", [(dict(gen_length=6), "whole blocks"), (dict(steps_per_block=5), "steps_per_block")])
def test_lengths_that_are_not_whole_blocks_are_refused(gpt, kwargs, match) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_generate

    args = dict(gen_length=8, block_size=4, steps_per_block=2, mask_token_id=MASK)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        bd3_generate(gpt, torch.zeros(1, 4, dtype=torch.long), **args)


def _loaded(gpt):
    from types import SimpleNamespace

    return SimpleNamespace(model=gpt, record={"objective.block_size": 4}, mask_token_id=MASK, vocab_size=MASK,
                           device=torch.device("cpu"), decode=lambda ids: " ".join(map(str, ids)))


def test_dlmspec_generate_samples_a_block_diffusion_model_with_its_cache(gpt) -> None:
    from types import SimpleNamespace

    from dlmspec.backends.generate.block_diffusion import bd3_generate
    from dlmspec.cli.generate import _run_block_diffusion

    config = SimpleNamespace(gen_length=8, steps=4, seed=0, temperature=0.0)
    prompts = [{"prompt_ids": [5, 6, 7, 8]}, {"prompt_ids": [9, 10, 11, 12, 13, 14, 15, 16]}]
    out = _run_block_diffusion(_loaded(gpt), prompts, [p["prompt_ids"] for p in prompts], config, batch_size=2)
    assert [len(o["ids"]) for o in out["outputs"]] == [8, 8] and out["generated_tokens"] == 16
    alone = bd3_generate(gpt, torch.tensor([[5, 6, 7, 8]]), gen_length=8, block_size=4, steps_per_block=2,
                         mask_token_id=MASK, cache=False, vocab_size=MASK)
    assert out["outputs"][0]["ids"] == alone[0, 4:].tolist()


def test_dlmspec_generate_refuses_a_prompt_that_is_not_whole_blocks(gpt) -> None:
    from types import SimpleNamespace

    from dlmspec.cli.generate import _run_block_diffusion
    from dlmspec.errors import SpecError

    config = SimpleNamespace(gen_length=8, steps=4, seed=0, temperature=0.0)
    with pytest.raises(SpecError) as caught:
        _run_block_diffusion(_loaded(gpt), [{"prompt_ids": [5, 6, 7]}], [[5, 6, 7]], config, batch_size=1)
    assert "blocks of 4" in str(caught.value.issues[0]) and "prepend EOS" in str(caught.value.issues[0])


def test_dlmspec_eval_scores_a_block_diffusion_model_with_its_nelbo(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_forward
    from dlmspec.backends.generate.likelihood import bd3_nelbo
    from dlmspec.cli.generate import score_dataset

    model = _loaded(gpt)
    model.kind, model.noise_schedule = "bd3lm", None
    windows = torch.randint(0, 60, (3, 8), generator=torch.Generator().manual_seed(4))
    got = score_dataset(model, windows, estimators=["count"], num_samples=4, samples_per_forward=2, eps=1e-3, seed=7,
                        batch_size=2, show_progress=False)["elbo"]["bd3"]
    from dlmspec.backends.generate.likelihood import merge_elbo_results

    g = torch.Generator().manual_seed(7)  # the library, batch after batch on one generator
    parts = [bd3_nelbo(bd3_forward(gpt), b, block_size=4, mask_token_id=MASK, generator=g, num_samples=4,
                       samples_per_forward=2) for b in (windows[:2], windows[2:])]
    want = merge_elbo_results(parts).total()
    assert got["num_tokens"] == 24 and got["estimator"] == "bd3" and got["stderr_per_token"] > 0
    assert got["nll_per_token"] == pytest.approx(want["nll_per_token"], rel=1e-6)


def test_a_continuation_is_scored_by_the_nelbo_of_the_left_padded_sequence(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_continuation_nll, bd3_forward
    from dlmspec.backends.generate.likelihood import bd3_nelbo

    context, continuation = [5, 6, 7], [8, 9, 10, 11, 12]  # 8 tokens: whole blocks after no padding ...
    got = bd3_continuation_nll(gpt, context[1:], continuation, block_size=4, mask_token_id=MASK, pad_token_id=62,
                               generator=torch.Generator().manual_seed(3), num_samples=6, samples_per_forward=3)
    # ... 7 tokens: one pad in front, only the continuation scored
    seq = torch.tensor([[62, 6, 7, 8, 9, 10, 11, 12]])
    target = torch.tensor([[False, False, False, True, True, True, True, True]])
    want = bd3_nelbo(bd3_forward(gpt), seq, block_size=4, mask_token_id=MASK, generator=torch.Generator().manual_seed(3),
                     target_mask=target, num_samples=6, samples_per_forward=3)
    assert got[2] == 5 and got[0] == pytest.approx(float(want.nll[0])) and got[1] == pytest.approx(float(want.stderr[0]))
    assert got[0] > 0


def _wrapper_class():
    from megatron.core.transformer.module import Float16Module

    class _Wrapper(Float16Module):
        """megatron-core's ``Float16Module`` around the model, as ``load_model`` returns every model,
        without its cast to half precision (a float32 comparison): it keeps the model as ``.module``
        and forwards to it (``megatron.core.utils.unwrap_model`` unwraps it)."""

        def __init__(self, module):
            torch.nn.Module.__init__(self)
            self.module = module

        def forward(self, *args, **kwargs):
            return self.module(*args, **kwargs)

    return _Wrapper


def test_a_wrapped_model_samples_and_scores_as_the_bare_one(gpt) -> None:
    from dlmspec.backends.generate.block_diffusion import bd3_forward, bd3_generate
    from dlmspec.backends.megatron.masks import block_diffusion

    wrapped = _wrapper_class()(gpt)
    prompt = torch.tensor([[5, 6, 7, 8]])
    args = dict(gen_length=8, block_size=4, steps_per_block=2, mask_token_id=MASK, vocab_size=MASK)
    assert torch.equal(bd3_generate(wrapped, prompt, cache=True, **args), bd3_generate(gpt, prompt, cache=False, **args))
    tokens = torch.randint(0, 60, (1, 8), generator=torch.Generator().manual_seed(3))
    inputs, positions = torch.cat([tokens, tokens], dim=1), torch.arange(8).repeat(2).unsqueeze(0)
    torch.testing.assert_close(bd3_forward(wrapped)(inputs, positions, block_diffusion(8, 4)),
                               bd3_forward(gpt)(inputs, positions, block_diffusion(8, 4)))
