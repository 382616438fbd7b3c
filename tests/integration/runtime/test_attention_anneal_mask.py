"""Attention annealing at run time (backends/megatron/masks.py annealed_causal, the mdm objective's
set_iteration): the mask at the first, a middle and the last annealing step equals the one built by
hand as DiffuLLaMA's get_anneal_attn_mask does (causal OR uniforms below the step's ratio), full
attention after; the objective's batch is the batch without annealing plus that mask; SDPA and
FlexAttention apply it alike (outputs and gradients) and as a dense reference does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from dlmspec.backends.megatron import masks
from dlmspec.backends.megatron.attention import FlexCoreAttention, SDPACoreAttention
from dlmspec.backends.megatron.objectives.base import ObjectiveRng
from dlmspec.backends.megatron.objectives.mdm import MaskedDiffusionObjective

S, K = 24, 10  # sequence length, annealing steps


def _by_hand(s: int, ratio: float, seed: int) -> torch.Tensor:
    """DiffuLLaMA's get_anneal_attn_mask (HKUNLP/DiffuLLaMA trainer.py): causal OR bernoulli(ratio),
    here with the uniforms of a generator of ``seed`` (True = attended)."""
    u = torch.rand(s, s, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    causal = torch.arange(s).unsqueeze(0) <= torch.arange(s).unsqueeze(1)
    return causal | (u < ratio)


@pytest.mark.parametrize("step", [0, K // 2, K - 2])
def test_the_mask_at_an_annealing_step_is_causal_or_the_uniforms_below_the_steps_ratio(step) -> None:
    ratio = (step + 1) / K
    mask = masks.annealed_causal(S, ratio, torch.Generator().manual_seed(3))
    allowed = mask.allowed(S, S)[0, 0]
    torch.testing.assert_close(allowed, _by_hand(S, ratio, 3))
    lower = torch.ones(S, S, dtype=torch.bool).tril()
    assert bool(allowed[lower].all())  # the causal part is always attended
    above = allowed[~lower].float().mean().item()
    assert abs(above - ratio) < 0.15  # about r of the keys above the diagonal (276 of them)


def test_from_the_last_annealing_step_on_there_is_no_mask() -> None:
    objective = MaskedDiffusionObjective(5, attention_anneal_iters=K)
    for step in (K - 1, K, 10 * K):
        objective.set_iteration(step)
        ob = objective.prepare({"tokens": torch.randint(0, 5, (2, S))}, torch.Generator().manual_seed(0))
        assert ob.attention_mask is None and objective.attention_anneal_ratio == 1.0


@pytest.mark.parametrize("step", [0, K // 2])
def test_the_objectives_batch_is_the_unannealed_batch_plus_the_steps_mask(step) -> None:
    tokens = torch.randint(0, 5, (3, S), generator=torch.Generator().manual_seed(1))
    plain = MaskedDiffusionObjective(5)
    annealed = MaskedDiffusionObjective(5, attention_anneal_iters=K)
    annealed.set_iteration(step)
    a = plain.prepare({"tokens": tokens}, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    b = annealed.prepare({"tokens": tokens}, g)
    for name in ("input_ids", "labels", "loss_weights", "masked", "num_tokens"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name))
    # the mask's uniforms are the generator's next s x s draws after the batch's own
    g2 = torch.Generator().manual_seed(9)
    torch.rand(3, generator=g2), torch.rand(3, S, generator=g2)
    u = torch.rand(S, S, generator=g2)
    causal = torch.arange(S).unsqueeze(0) <= torch.arange(S).unsqueeze(1)
    torch.testing.assert_close(b.attention_mask.allowed(S, S)[0, 0], causal | (u < (step + 1) / K))


def test_a_cut_sequence_keeps_its_key_padding_under_annealing() -> None:
    objective = MaskedDiffusionObjective(5, attention_anneal_iters=K, variable_length_prob=1.0)
    ob = objective.prepare({"tokens": torch.randint(0, 5, (2, S))}, ObjectiveRng(torch.Generator().manual_seed(4)))
    assert set(ob.attention_mask.kinds) == {"key_padding", "mask_mod"}
    allowed = ob.attention_mask.allowed(S, S)  # [b, 1, s, s]
    for row, length in enumerate(ob.lengths.tolist()):
        assert not bool(allowed[row, 0, :, length:].any())


def _config():
    return TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                             attention_dropout=0.0, use_cpu_initialization=True)


def _module(cls):
    return cls(config=_config(), layer_number=1, attn_mask_type=AttnMaskType.no_mask, attention_type="self",
               pg_collection=SimpleNamespace(tp=SimpleNamespace(size=lambda: 1)), mode="bidirectional")


def _reference(q, k, v, allowed):
    """Dense attention with the allowed matrix ``[s, s]`` (GQA groups repeated)."""
    qh, kh, vh = (x.permute(1, 2, 0, 3) for x in (q, k, v))  # [b, h, s, d]
    kh, vh = kh.repeat_interleave(2, dim=1), vh.repeat_interleave(2, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) / qh.shape[-1] ** 0.5
    out = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ vh
    return out.permute(2, 0, 1, 3).reshape(q.shape[0], q.shape[1], -1)


@pytest.mark.parametrize("step", [0, K // 2, K - 2])
def test_sdpa_and_flex_attention_apply_the_annealed_mask_as_a_dense_reference(step) -> None:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(S, 2, 4, 16, generator=g).requires_grad_(True)
    k = torch.randn(S, 2, 2, 16, generator=g).requires_grad_(True)
    v = torch.randn(S, 2, 2, 16, generator=g).requires_grad_(True)
    ratio = (step + 1) / K
    mask = masks.annealed_causal(S, ratio, torch.Generator().manual_seed(5))
    want = _reference(q, k, v, _by_hand(S, ratio, 5))
    w = torch.randn(want.shape, generator=g)
    want_grads = torch.autograd.grad((want * w).sum(), (q, k, v))
    for cls in (SDPACoreAttention, FlexCoreAttention):
        out = _module(cls)(q, k, v, mask)
        torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
        for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), want_grads):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_the_layers_of_one_forward_share_one_block_mask() -> None:
    mask = masks.annealed_causal(S, 0.5, torch.Generator().manual_seed(0))
    assert mask.block_mask(S, S, "cpu") is mask.block_mask(S, S, "cpu")
    assert mask.allowed(S, S) is mask.allowed(S, S)


def test_an_annealed_mask_of_another_length_or_a_full_ratio_is_refused_or_absent() -> None:
    mask = masks.annealed_causal(S, 0.5, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="24 positions for 12 queries"):
        mask.allowed(12, 12)
    assert masks.annealed_causal(S, 1.0) is None
    with pytest.raises(ValueError, match="square bool"):
        masks.AnnealedCausal(torch.zeros(3, 4, dtype=torch.bool))
