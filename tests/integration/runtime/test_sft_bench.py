"""bench/gpu/sft_eval.py on CPU: both models are scored on the same inputs (fixed
masks), a sample's score is its SFT loss, the intervals are the normal 95% ones, and the
conversations are a paragraph and its first sentence."""

from __future__ import annotations

import math

import torch

from bench_scripts import load_script
from dlmspec.backends.megatron.objective import MaskedDiffusionObjective
from dlmspec.backends.megatron.sft import SftConfig, SftDataset, SftForwardStep
from sft_files import EOD

evaluation = load_script("bench/gpu/sft_eval.py", "sft_eval")


class Recorder(torch.nn.Module):
    """A stand-in model: records its inputs and returns a fixed cross entropy per position."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.value, self.inputs = value, []

    def forward(self, input_ids, position_ids, attention_mask, labels=None):
        self.inputs.append(input_ids.clone())
        return torch.full(input_ids.shape, self.value)


def test_both_models_see_the_same_masks_and_score_the_sft_loss() -> None:
    docs = [(torch.tensor([5, 6, 7, 8, EOD]).numpy(), torch.tensor([0, 0, 1, 1, 1]).numpy())] * 5
    ds = SftDataset(docs, seq_length=8, eod_id=EOD, autoregressive=False, config=SftConfig())
    feed = evaluation.batches(ds, 5, 2)
    assert [b["tokens"].shape[0] for b in feed] == [2, 2, 1]
    step = SftForwardStep(MaskedDiffusionObjective(99), seed=3, data_parallel_rank=0, eod_id=EOD,
                          device=torch.device("cpu"), loss_normalization="sequence")
    a, b = Recorder(1.0), Recorder(2.0)
    sa, sb = evaluation.score(a, step, feed, 3, EOD), evaluation.score(b, step, feed, 3, EOD)
    assert len(a.inputs) == 9 and all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    assert any(not torch.equal(a.inputs[0], x) for x in a.inputs[1:3])  # draws differ from each other
    # constant CE c: a sample's loss is c * mean over draws of (masked / t) / response length
    assert all(math.isclose(y, 2 * x) for x, y in zip(sa["sft"], sb["sft"]))
    assert all(math.isclose(y, 2 * x) for x, y in zip(sa["answer"], sb["answer"]))
    # the answer: positions 2..4 (two tokens and the EOD), not the three padding EOS after it
    keep = evaluation.answer_mask(feed[0]["tokens"], feed[0]["loss_mask"], EOD)
    assert keep[0].tolist() == [False, False, True, True, True, False, False, False]
    ob, _, _ = step.prepare(evaluation.MicrobatchItem(evaluation.VALID_STREAM, 0, 0, feed[0]))
    t = ob.mask_ratio[0]
    want = (ob.masked[0] & keep[0]).sum() / t / 3
    one = evaluation.score(Recorder(1.0), step, feed[:1], 1, EOD)["answer"][0]
    assert math.isclose(one, float(want), rel_tol=1e-5)


def test_interval() -> None:
    out = evaluation.interval([1.0, 2.0, 3.0, 4.0])
    assert out["mean"] == 2.5 and out["n"] == 4
    half = 1.96 * math.sqrt(5 / 3) / 2
    assert math.isclose(out["ci95"][0], 2.5 - half) and math.isclose(out["ci95"][1], 2.5 + half)


