"""The failing examples of the SFT rules that read files (dlmspec/check/sft.py): a spec change of
test_validate_compile_agree.BASE and the files beside it (an SFT dataset record, empty data and
response-mask files). Shared by test_sft_rules, test_validate_compile_agree and test_remedies_validate."""

from __future__ import annotations

import json
from typing import Any

#: The data prefix of agree.BASE.
PREFIX = "data/x_text_document"


def record_text(**sft: Any) -> str:
    """A dataset record (dlmspec/data/record.py layout) whose "sft" section is ``sft`` over defaults
    that agree with agree.BASE (NullTokenizer of 999: EOD 999, [MASK] 1000, padded vocab 1024)."""
    section = {"format": "prompt_response", "chat_template": "chatml", "chat_template_sha256": "0" * 64,
               "response_prefix": "x_text_document_response", "special_tokens": {}, "special_tokens_in_vocab": {},
               "eod_id": 999, "max_length": None, "rows": {"read": 1, "written": 1, "skipped": 0}, "bad_rows": {},
               "response_tokens": 1, "prompt_tokens": 1}
    section.update(sft)
    return json.dumps({"schema": "dlmspec.dataset", "version": 1, "documents": 1, "tokens": 2, "sft": section})


def sft_files(response: bool = True, **sft: Any) -> dict[str, str]:
    """The files of an SFT example: the data (empty .bin/.idx), its record and (``response``) its
    response-mask dataset."""
    files = {PREFIX + ".bin": "", PREFIX + ".idx": "", PREFIX + ".dlmspec.json": record_text(**sft)}
    if response:
        files |= {PREFIX + "_response.bin": "", PREFIX + "_response.idx": ""}
    return files


SFT = {"stage.kind": "sft"}

#: rule -> (changes to agree.BASE, files, the key reported): the rules that read files.
FILE_EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {
    "sft-response-missing": (SFT, sft_files(response=False), "data.train"),
    "sft-template": (SFT, sft_files(chat_template="plain"), "stage.sft.chat_template"),
    "sft-special-token-ids": (SFT, sft_files(special_tokens={"<|im_start|>": 1000}), "objective.mask_token_id"),
    "sft-eod": ({**SFT, "data.tokenizer": {"type": "HuggingFaceTokenizer", "model": "org/name", "eod_id": 999}},
                sft_files(eod_id=5), "data.tokenizer.eod_id"),
    "sft-max-length": (SFT, sft_files(max_length=1024), "train.seq_length"),
    "sft-prompt-too-long": (SFT, sft_files(max_prompt_tokens=600), "train.seq_length"),
}


