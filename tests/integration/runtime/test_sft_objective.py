"""The SFT loss on hand-made batches (backends/megatron/sft.py SftForwardStep): prompt tokens are
never masked and never in the loss, and the loss equals LLaDA's SFT formula (diffusion: masked
response tokens weighted 1/t, each response's mean, then the mean over responses) and the AR
next-token loss on response tokens."""

from __future__ import annotations

import torch

from dlmspec.backends.megatron.microbatches import MicrobatchItem
from dlmspec.backends.megatron.objective import AutoregressiveObjective, MaskedDiffusionObjective, reduce_loss
from dlmspec.backends.megatron.rng import TRAIN_STREAM, masking_generator
from dlmspec.backends.megatron.sft import SftConfig, SftDataset, SftForwardStep
from sft_files import EOD

MASK = 99
CONVERSATIONS = [(torch.tensor([5, 6, 7, 8, 9, EOD]), torch.tensor([0, 0, 0, 1, 1, 1])),
                 (torch.tensor([10, 11, 12, 13, EOD]), torch.tensor([0, 1, 1, 1, 1]))]


def _batch(ar: bool, config: SftConfig = SftConfig()):
    ds = SftDataset([(t.numpy(), r.numpy()) for t, r in CONVERSATIONS], seq_length=8, eod_id=EOD,
                    autoregressive=ar, config=config)
    rows = [ds.sample(k) for k in range(2)]
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def _step(objective, normalization: str) -> SftForwardStep:
    return SftForwardStep(objective, seed=7, data_parallel_rank=0, eod_id=EOD, device=torch.device("cpu"),
                          loss_normalization=normalization)


def test_diffusion_sft_never_masks_the_prompt_and_matches_the_formula() -> None:
    batch = _batch(ar=False)
    objective = MaskedDiffusionObjective(MASK, eps=1e-3)
    step = _step(objective, "sequence")
    prompt = batch["loss_mask"] == 0
    for iteration in range(20):  # many draws: the prompt is never masked, never weighted
        ob, _, attention_mask = step.prepare(MicrobatchItem(TRAIN_STREAM, iteration, 0, batch))
        assert attention_mask is None  # every padding EOS supervised: dense
        assert torch.equal(ob.input_ids[prompt], batch["tokens"][prompt])
        assert not ob.masked[prompt].any() and (ob.loss_weights[prompt] == 0).all()
    # the formula, with the draws replayed: u [b], then the per-token uniforms [b, s]
    g = masking_generator(7, 19, 0, 0, stream=TRAIN_STREAM, device=torch.device("cpu"))
    t = 1e-3 + (1 - 1e-3) * torch.rand(2, generator=g)
    masked = (torch.rand(2, 8, generator=g) < t.unsqueeze(1)) & ~prompt
    assert torch.equal(masked, ob.masked)
    ce = torch.rand(2, 8) * 5
    loss_sum, num_tokens, _ = reduce_loss(ce, ob)
    response_length = (~prompt).sum(dim=1)  # response + EOD + the padding EOS: 5 and 7
    assert response_length.tolist() == [5, 7]
    per_row = [(ce[j][masked[j]] / t[j]).sum() / response_length[j] for j in range(2)]
    assert int(num_tokens) == 2
    assert torch.allclose(loss_sum / num_tokens, sum(per_row) / 2)


def test_ar_sft_loss_is_the_next_token_loss_on_response_tokens() -> None:
    batch = _batch(ar=True, config=SftConfig(pad_eos_tokens=0))
    ob, _, attention_mask = _step(AutoregressiveObjective(), "global_token").prepare(
        MicrobatchItem(TRAIN_STREAM, 0, 0, batch))
    assert attention_mask is None
    assert torch.equal(ob.input_ids, batch["tokens"])
    # row 0 predicts 8, 9, EOD (from 7, 8, 9); row 1 predicts 11, 12, 13, EOD
    assert ob.loss_weights.tolist() == [[0, 0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    assert ob.labels[0, 2:5].tolist() == [8, 9, EOD] and ob.labels[1, :4].tolist() == [11, 12, 13, EOD]
    ce = torch.rand(2, 8)
    loss_sum, num_tokens, _ = reduce_loss(ce, ob)
    assert int(num_tokens) == 7
    assert torch.allclose(loss_sum / num_tokens, (ce * ob.loss_weights).sum() / 7)


def test_packed_diffusion_batch_carries_the_segment_mask() -> None:
    ds = SftDataset([(t.numpy(), r.numpy()) for t, r in CONVERSATIONS], seq_length=12, eod_id=EOD,
                    autoregressive=False, config=SftConfig(packed_sequence=True))
    batch = {k: v.unsqueeze(0) for k, v in ds.sample(0).items()}
    ob, position_ids, mask = _step(MaskedDiffusionObjective(MASK), "sequence").prepare(
        MicrobatchItem(TRAIN_STREAM, 0, 0, batch))
    seg = batch["segment_ids"][0]
    assert mask is not None and torch.equal(~mask[0, 0], seg.unsqueeze(0) == seg.unsqueeze(1))
    assert torch.equal(position_ids, batch["position_ids"])
    assert not ob.masked[batch["loss_mask"] == 0].any()
