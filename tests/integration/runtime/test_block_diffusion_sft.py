"""Block-diffusion SFT through the SFT stage's forward step (backends/megatron/sft.py
SftForwardStep): prompts stay clean and weigh nothing, responses are noised block by block, the
model gets x_t (+) x_0 with the position ids repeated and the block-diffusion mask, and the loss is
each response's mean (``"sequence"``)."""

from __future__ import annotations

import torch

from dlmspec.backends.megatron.microbatches import MicrobatchItem
from dlmspec.backends.megatron.objectives.bd3lm import BlockDiffusionObjective
from dlmspec.backends.megatron.rng import TRAIN_STREAM
from dlmspec.backends.megatron.sft import SftConfig, SftDataset, SftForwardStep

EOD, MASK = 1, 99
CONVERSATIONS = [([5, 6, 7, 8, 9, 10, 11, EOD], [0, 0, 0, 1, 1, 1, 1, 1]),
                 ([20, 21, 22, 23, 24, EOD], [0, 0, 1, 1, 1, 1])]


def _batch(config: SftConfig = SftConfig()):
    import numpy as np

    ds = SftDataset([(np.array(t), np.array(r)) for t, r in CONVERSATIONS], seq_length=8, eod_id=EOD,
                    autoregressive=False, config=config)
    rows = [ds.sample(k) for k in range(2)]
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def _step(objective) -> SftForwardStep:
    return SftForwardStep(objective, seed=3, data_parallel_rank=0, eod_id=EOD, device=torch.device("cpu"),
                          loss_normalization="sequence")


def test_block_diffusion_sft_keeps_prompts_clean_and_noises_responses_per_block() -> None:
    batch = _batch()
    prompt = batch["loss_mask"] == 0
    step = _step(BlockDiffusionObjective(MASK, block_size=4))
    seen_masked = torch.zeros(2, 8, dtype=torch.bool)
    for iteration in range(30):
        ob, position_ids, mask = step.prepare(MicrobatchItem(TRAIN_STREAM, iteration, 0, batch))
        assert ob.input_ids.shape == (2, 16) and torch.equal(ob.input_ids[:, 8:], batch["tokens"])
        xt = ob.input_ids[:, :8]
        assert torch.equal(xt[prompt], batch["tokens"][prompt]) and not ob.loss_weights[:, :8][prompt].any()
        assert torch.equal(position_ids, batch["position_ids"].repeat(1, 2))
        assert mask.name == "block_diffusion(n=8, block=4)"
        # "sequence": each row's weights divided by its response length
        assert torch.equal(ob.num_tokens, torch.tensor(2, dtype=torch.int))
        seen_masked |= ob.masked[:, :8]
    assert torch.equal(seen_masked, ~prompt)  # every response token is masked at some draw, no prompt token


def test_packed_conversations_are_refused_by_the_forward_step() -> None:
    import pytest

    batch = _batch(SftConfig(packed_sequence=True))
    batch["segment_ids"][0, 4:] = 1  # two conversations in row 0
    with pytest.raises(ValueError, match="packed_sequence = false"):
        _step(BlockDiffusionObjective(MASK, block_size=4)).prepare(MicrobatchItem(TRAIN_STREAM, 0, 0, batch))
