"""Tiny SFT datasets of the on-disk contract (``PREFIX_text_document`` + ``_response`` + record),
written with megatron-core's ``IndexedDatasetBuilder`` for the SFT tests."""

from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from dlmspec.data.record import write_record

EOD = 0


def write_sft(prefix: str, conversations: Sequence[Tuple[Sequence[int], Sequence[int]]], *,
              chat_template: str = "plain", max_length=None, special_tokens=None, vocab_size: int = 100,
              eod: int = EOD) -> str:
    """Write ``(prompt ids, response ids)`` pairs as one document each (prompt, response, EOD; the
    response and the EOD supervised); returns ``prefix``."""
    tokens = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    resp = IndexedDatasetBuilder(prefix + "_response.bin", dtype=np.uint8)
    n_prompt = n_resp = 0
    for prompt, response in conversations:
        ids = list(prompt) + list(response) + [eod]
        mask = [0] * len(prompt) + [1] * (len(response) + 1)
        tokens.add_item(torch.tensor(ids, dtype=torch.int64))
        tokens.end_document()
        resp.add_item(torch.tensor(mask, dtype=torch.int64))
        resp.end_document()
        n_prompt += len(prompt)
        n_resp += len(response) + 1
    tokens.finalize(prefix + ".idx")
    resp.finalize(prefix + "_response.idx")
    write_record(prefix, tokenizer={"type": "NullTokenizer", "vocab_size": vocab_size, "eod_id": eod, "files": {}},
                 documents=len(conversations), tokens=n_prompt + n_resp,
                 sft={"format": "prompt_response", "chat_template": chat_template, "chat_template_sha256": "0" * 64,
                      "response_prefix": prefix.rsplit("/", 1)[-1] + "_response",
                      "special_tokens": dict(special_tokens or {}), "special_tokens_in_vocab": {}, "eod_id": eod,
                      "max_length": max_length, "rows": {"read": len(conversations), "written": len(conversations),
                                                         "skipped": 0},
                      "bad_rows": {}, "response_tokens": n_resp, "prompt_tokens": n_prompt})
    return prefix
