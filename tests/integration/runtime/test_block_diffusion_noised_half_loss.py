"""Block diffusion without an AR loss scores only the x_t half: after the objective's prepare_model
the decoder of a tiny megatron-core GPTModel hands L rows, not 2L, to the output layer, and the loss
and every parameter's gradient equal those of the full 2L output with the clean half weighted 0, on
megatron's cross entropy and on the fused output projection; an AR loss or sequence parallelism keeps
the full output."""

from types import SimpleNamespace

import pytest
import torch

from cpu_world_kit import megatron_cpu_world
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron.layers import build_layer_spec, build_model
from dlmspec.backends.megatron.microbatches import MicrobatchItem
from dlmspec.backends.megatron.objectives.bd3lm import (BlockDiffusionObjective, NoisedHalfMask, _pass_noised_half,
                                                        repeat_rotary_halves)
from dlmspec.backends.megatron.rng import TRAIN_STREAM
from dlmspec.backends.megatron.stage import ObjectiveForwardStep

VOCAB, SEQ, EOD, MASK, BLOCK = 128, 32, 127, 126, 8


@pytest.fixture(scope="module", autouse=True)
def cpu_megatron(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp, megatron_cpu_world(tmp_path_factory, mp):
        yield


def _model():
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        kv_channels=16, normalization="RMSNorm", gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, calculate_per_token_loss=True)
    spec = build_layer_spec(attention="bidirectional", use_transformer_engine=False, attention_backend="flex")
    return build_model(config, layer_spec=spec, vocab_size=VOCAB, max_sequence_length=2 * SEQ,
                       position_embedding_type="rope", rotary_base=10000)[0]


def _loss_and_grads(model, objective, *, fused: bool):
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 100, (2, SEQ), generator=g)
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, dims=1), "loss_mask": torch.ones(2, SEQ),
             "position_ids": torch.arange(SEQ).expand(2, SEQ).clone()}
    step = ObjectiveForwardStep(objective, seed=7, data_parallel_rank=0, eod_id=EOD, device=torch.device("cpu"))
    if fused:
        step.use_fused_linear_cross_entropy([model], "torch")
    item = MicrobatchItem(TRAIN_STREAM, 0, 0, batch)
    output, loss_func = step(iter([item]), model)
    loss, counted, _ = loss_func(output)
    model.zero_grad()
    (loss / counted).backward()
    return output.shape, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fused", [False, True])
def test_scoring_the_noised_half_only_gives_the_full_outputs_loss_and_gradients(fused) -> None:
    full_model, half_model = _model(), _model()
    half_model.load_state_dict(full_model.state_dict())
    full = BlockDiffusionObjective(MASK, block_size=BLOCK)
    repeat_rotary_halves(full_model)  # what prepare_model does besides, without the decoder's hook
    half = BlockDiffusionObjective(MASK, block_size=BLOCK)
    half.prepare_model([half_model])
    assert half.noised_half_loss and not full.noised_half_loss
    shape_f, loss_f, grads_f = _loss_and_grads(full_model, full, fused=fused)
    shape_h, loss_h, grads_h = _loss_and_grads(half_model, half, fused=fused)
    assert shape_f[:2] == (2, 2 * SEQ) and shape_h[:2] == (2, SEQ)  # L rows reach the output layer, not 2L
    torch.testing.assert_close(loss_h, loss_f, atol=1e-5, rtol=1e-5)
    assert grads_f.keys() == grads_h.keys() and grads_f
    for name in grads_f:
        torch.testing.assert_close(grads_h[name], grads_f[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_an_ar_loss_keeps_the_clean_halfs_output() -> None:
    model = _model()
    objective = BlockDiffusionObjective(MASK, block_size=BLOCK, ar_loss_weight=0.5)
    objective.prepare_model([model])
    assert not objective.noised_half_loss
    ob = objective.prepare({"tokens": torch.randint(0, 100, (2, SEQ))}, torch.Generator().manual_seed(0))
    assert ob.labels.shape == (2, 2 * SEQ) and not isinstance(ob.attention_mask, NoisedHalfMask)


def test_sequence_parallelism_keeps_the_full_output() -> None:
    decoder = torch.nn.Linear(2, 2)
    assert not _pass_noised_half(SimpleNamespace(decoder=decoder, config=SimpleNamespace(sequence_parallel=True)))
    assert not decoder._forward_hooks
