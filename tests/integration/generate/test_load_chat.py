"""An SFT run's chat tokens (ids beyond the tokenizer's vocabulary) in load_model's logits and
decoding: a tuned model can end its turn with <|im_end|>, and its outputs decode."""

from __future__ import annotations

import torch

from dlmspec.backends.generate.load import LoadedModel, chat_tokens, logits_columns
from dlmspec.data.record import write_record


def test_chat_tokens_come_from_the_training_data_record(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_record("d_text_document", sft={"special_tokens": {"<|im_start|>": 12, "<|im_end|>": 13}})
    record = {"data.train": ["1.0", "d_text_document"]}
    assert chat_tokens(record) == {12: "<|im_start|>", 13: "<|im_end|>"}
    assert chat_tokens({"data.train": ["missing_text_document"]}) == {}
    write_record("p_text_document", documents=3)
    assert chat_tokens({"data.train": ["p_text_document"]}) == {}


def test_logits_keep_chat_columns_and_block_the_rest():
    base = lambda tokens, attention_mask=None: torch.zeros(*tokens.shape, 16)  # noqa: E731
    fn, width = logits_columns(base, 10, {12: "<|im_start|>", 13: "<|im_end|>"})
    out = fn(torch.zeros(2, 3, dtype=torch.long))
    assert width == 14 and out.shape == (2, 3, 14)
    assert torch.isinf(out[..., 10]).all() and torch.isinf(out[..., 11]).all()  # the mask, padding
    assert (out[..., 12:] == 0).all() and (out[..., :10] == 0).all()
    fn, width = logits_columns(base, 10, {})
    assert width == 10 and fn(torch.zeros(1, 1, dtype=torch.long)).shape == (1, 1, 10)


class _Tok:
    def detokenize(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


def test_decode_maps_chat_ids_and_marks_unknown_ones():
    m = LoadedModel(logits_fn=None, kind="mdm", mask_token_id=10, eos_token_id=9, pad_token_id=9, vocab_size=14,
                    tokenizer=_Tok(), tokenizer_error=None, record={"model.vocab_size": 10}, generate_table=None,
                    source="dlmspec", path="x", iteration=1, device=torch.device("cpu"), model=None,
                    chat_tokens={12: "<|im_start|>", 13: "<|im_end|>"})
    assert m.decode([12, 0, 1, 13, 10, 2]) == "<|im_start|>ab<|im_end|><id:10>c"
