"""SFT samples (backends/megatron/sft.py) from datasets of the on-disk contract: padding and
packing, over-long conversations counted, segments that never attend each other, the response
dataset checked at start."""

from __future__ import annotations

import pytest
import torch

from dlmspec.backends.megatron.sft import (
    SftConfig,
    SftDataset,
    needs_attention_mask,
    segment_attention_mask,
    sft_data_problems,
)
from sft_files import EOD, write_sft

CONVERSATIONS = [([5, 6, 7], [8, 9]), ([10], [11, 12, 13]), ([1] * 20, [2])]


@pytest.fixture()
def prefix(tmp_path):
    return write_sft(str(tmp_path / "chat_text_document"), CONVERSATIONS)


def _ds(prefix, config, ar=False, seq=12):
    return SftDataset.from_prefixes([prefix], seq_length=seq, eod_id=EOD, autoregressive=ar, config=config)


def test_padding_supervises_the_response_and_the_padding_eos(prefix) -> None:
    ds = _ds(prefix, SftConfig())
    s = ds.sample(0)
    assert s["tokens"].tolist() == [5, 6, 7, 8, 9] + [EOD] * 7
    assert s["loss_mask"].tolist() == [0, 0, 0] + [1] * 9  # prompt never, response + EOD + all padding
    assert ds.stats.skipped_over_long == 1 and ds.stats.samples == 2
    # pad_eos_tokens = 1: one padding EOS supervised, the rest its own segment (hidden from the conversation)
    s = _ds(prefix, SftConfig(pad_eos_tokens=1)).sample(0)
    assert s["loss_mask"].tolist() == [0, 0, 0, 1, 1, 1, 1] + [0] * 5
    assert s["segment_ids"].tolist() == [0] * 7 + [1] * 5


def test_ar_labels_are_the_next_tokens_supervised_on_the_response_only(prefix) -> None:
    s = _ds(prefix, SftConfig(pad_eos_tokens=0), ar=True).sample(0)
    assert s["tokens"].tolist() == [5, 6, 7, 8, 9] + [EOD] * 7
    assert s["labels"].tolist() == [6, 7, 8, 9] + [EOD] * 8
    # predicting 8 (from 7), 9 and the EOD; nothing after
    assert s["loss_mask"].tolist() == [0, 0, 1, 1, 1] + [0] * 7


def test_over_long_truncated_is_counted(prefix) -> None:
    ds = _ds(prefix, SftConfig(over_long="truncate"))
    assert ds.stats.truncated_over_long == 1 and ds.stats.skipped_over_long == 0 and ds.stats.samples == 3
    assert ds.sample(2)["loss_mask"].sum() == 0  # the prompt fills the sample: nothing supervised
    with pytest.raises(ValueError, match="no conversation fits"):
        _ds(prefix, SftConfig(), seq=2)


def test_packing_keeps_conversations_apart(prefix) -> None:
    ds = _ds(prefix, SftConfig(packed_sequence=True))
    assert ds.stats.samples == 1
    s = ds.sample(0)
    seg, pos = s["segment_ids"], s["position_ids"]
    assert sorted(set(seg.tolist())) == [0, 1, 2]  # two conversations and the tail padding
    for k in (0, 1):  # each conversation's positions start at 0
        assert pos[seg == k].tolist() == list(range(int((seg == k).sum())))
    assert s["loss_mask"][seg == 2].sum() == 0  # the tail padding is never supervised
    mask = segment_attention_mask(seg.unsqueeze(0))[0, 0]
    assert mask.shape == (12, 12)
    same = seg.unsqueeze(0) == seg.unsqueeze(1)
    assert torch.equal(~mask, same)  # a query attends exactly its own conversation's keys
    # and a model's output at one conversation does not change when the other one does
    q = torch.randn(1, 1, 12, 4)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=~mask)
    q2 = q.clone()
    q2[..., seg == 1, :] = torch.randn_like(q2[..., seg == 1, :])
    out2 = torch.nn.functional.scaled_dot_product_attention(q2, q2, q2, attn_mask=~mask)
    assert torch.allclose(out[..., seg == 0, :], out2[..., seg == 0, :])
    assert needs_attention_mask(SftConfig(packed_sequence=True), "ar")
    assert not needs_attention_mask(SftConfig(), "mdm") and needs_attention_mask(SftConfig(pad_eos_tokens=0), "mdm")


def test_ar_packing_never_predicts_across_conversations(prefix) -> None:
    ds = _ds(prefix, SftConfig(packed_sequence=True, mask_prompt=False), ar=True)
    s = ds.sample(0)
    seg = s["segment_ids"]
    boundary = torch.nonzero(seg[1:] != seg[:-1]).flatten()
    assert len(boundary) and all(s["loss_mask"][int(i)] == 0 for i in boundary)


def test_epochs_cover_every_sample_in_a_new_order(prefix) -> None:
    ds = SftDataset.from_prefixes([prefix], seq_length=12, eod_id=EOD, autoregressive=False, config=SftConfig(),
                                  num_samples=6)
    rows = [tuple(ds[i]["tokens"].tolist()) for i in range(6)]
    assert len(set(rows)) == 2 and sorted(rows[:2]) == sorted(rows[2:4])


def test_response_dataset_is_checked(tmp_path, prefix) -> None:
    assert sft_data_problems([prefix]) == []
    bare = str(tmp_path / "bare_text_document")
    write_sft(bare, CONVERSATIONS)
    for suffix in (".bin", ".idx"):
        (tmp_path / f"bare_text_document_response{suffix}").unlink()
    [problem] = sft_data_problems([bare])
    assert "response masks" in problem and "dlmspec data prepare --sft" in problem
    other = str(tmp_path / "other_text_document")
    write_sft(other, CONVERSATIONS[:2])
    for suffix in (".bin", ".idx"):
        (tmp_path / f"other_text_document_response{suffix}").replace(tmp_path / f"bare_text_document_response{suffix}")
    [problem] = sft_data_problems([bare])
    assert "differ" in problem


def test_several_prefixes_and_a_split_carve_out(tmp_path, prefix) -> None:
    other = write_sft(str(tmp_path / "other_text_document"), [([3], [4]), ([30, 31], [32])])
    from dlmspec.backends.megatron.sft import Conversations

    both = Conversations(prefixes=[prefix, other])
    assert both.lengths.tolist() == [6, 5, 22, 3, 4]
    assert both[3][0].tolist() == [3, 4, EOD] and both[3][1].tolist() == [False, True, True]
    head = Conversations(prefixes=[prefix, other], split=(0.0, 0.5))  # the first half of each prefix's documents
    tail = Conversations(prefixes=[prefix, other], split=(0.5, 1.0))
    assert head.lengths.tolist() == [6, 5, 3] and tail.lengths.tolist() == [22, 4]  # round(1.5) = 2, round(1) = 1
