"""The tokenizer side of ``dlmspec data prepare --sft``: a token's id in the vocabulary
(:func:`vocab_token_id`), tokenizing content as text, never as special tokens
(:func:`text_tokenize`), the Hugging Face tokenizer a chat template needs, and the ids of the chat
special tokens the vocabulary lacks (:func:`assign_special_ids`: from ``--first-new-token-id``
upwards, never the mask or pad id, at most :data:`MAX_TOKEN_ID`).
"""

from __future__ import annotations

import os
from typing import Any, Optional

from dlmspec.data.errors import DataPrepareError

#: The largest token id megatron-core's indexed datasets store (``DType.optimal_dtype``: int32).
MAX_TOKEN_ID = 2**31 - 1


def vocab_token_id(tokenizer: Any, token: str) -> Optional[int]:
    """The id of ``token`` as one entry of ``tokenizer``'s vocabulary, or None when it has none.

    Works for dlmspec's GPT-2 BPE (the ``tokenizers`` object under it) and megatron-core's
    Hugging Face tokenizer (the ``transformers`` tokenizer under it); other types answer None (a
    template token then gets a new id).
    """
    inner = getattr(tokenizer, "_tokenizer", None)
    hf = getattr(inner, "tokenizer", None)
    if hf is not None and hasattr(hf, "get_vocab"):
        found = hf.get_vocab().get(token)
        return None if found is None else int(found)
    if inner is not None and hasattr(inner, "token_to_id"):
        found = inner.token_to_id(token)
        return None if found is None else int(found)
    return None


def text_tokenize(tokenizer: Any) -> Any:
    """``tokenize(text) -> ids`` for the text of a conversation, special-token strings inside it
    tokenized as text: megatron-core's Hugging Face tokenizer maps ``<|endoftext|>`` in a text to
    its id, so the ``transformers`` tokenizer under it is called with ``split_special_tokens=True``
    (a user's ``<|im_end|>`` cannot end a turn); other types already tokenize text as text."""
    hf = getattr(getattr(tokenizer, "_tokenizer", None), "tokenizer", None)
    if hf is not None and hasattr(hf, "encode"):
        return lambda text: hf.encode(text, add_special_tokens=False, split_special_tokens=True)
    return tokenizer.tokenize


def _require_hf(tokenizer_type: str, tokenizer_model: Optional[str]) -> None:
    """Refuse ``--chat-template tokenizer`` for a tokenizer type without a ``chat_template``."""
    if tokenizer_type != "HuggingFaceTokenizer" or not tokenizer_model:
        raise DataPrepareError(
            f"--chat-template tokenizer: uses the Hugging Face tokenizer's own chat_template, and "
            f"--tokenizer-type {tokenizer_type} has none; pass --tokenizer-type HuggingFaceTokenizer "
            "--tokenizer-model DIR (a tokenizer with a chat_template), or a built-in template: "
            "--chat-template chatml"
        )


def _hf_tokenizer(tokenizer_type: str, tokenizer_model: Optional[str]) -> Any:
    """The ``transformers`` tokenizer for ``--chat-template tokenizer`` (its ``chat_template``)."""
    _require_hf(tokenizer_type, tokenizer_model)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.expanduser(tokenizer_model), trust_remote_code=False)
    except ImportError:
        raise DataPrepareError(
            "--chat-template tokenizer needs the transformers package (pip install transformers)"
        ) from None
    except Exception as exc:  # noqa: BLE001  (transformers raises many kinds on a bad folder)
        if "trust_remote_code" in str(exc):
            from dlmspec.tokenizers import remote_code_refusal

            raise DataPrepareError(remote_code_refusal(tokenizer_type, tokenizer_model)) from None
        raise DataPrepareError(
            f"--tokenizer-model {tokenizer_model}: cannot load it with transformers' AutoTokenizer "
            f"({str(exc)[:300]}); pass a local tokenizer folder"
        ) from None


def assign_special_ids(
    specials: tuple[str, ...],
    tokenizer: Any,
    vocab_size: int,
    first_new: Optional[int],
    mask_id: Optional[int],
    pad_id: Optional[int],
    eod_id: int,
) -> tuple[dict[str, int], dict[str, int]]:
    """Ids of a template's special tokens: ``(new, in_vocab)``.

    A token the vocabulary has keeps its id (``in_vocab``); the others get ids from ``first_new``
    (default ``vocab_size + 1``) upwards, in the template's order (``new``).

    Raises:
        DataPrepareError: ``first_new`` below ``vocab_size`` (it would reuse a token's id); a new
            id, or a template token's id, equal to ``--mask-token-id`` or ``--pad-token-id``
            (pad may equal EOD, which pads SFT samples by design).
    """
    in_vocab: dict[str, int] = {}
    missing: list[str] = []
    for token in specials:
        found = vocab_token_id(tokenizer, token)
        if found is None:
            missing.append(token)
        else:
            in_vocab[token] = found
    start = vocab_size + 1 if first_new is None else int(first_new)
    if missing and start < vocab_size:
        raise DataPrepareError(
            f"--first-new-token-id {start}: below the vocabulary size {vocab_size}, so the new chat "
            f"tokens ({', '.join(missing)}) would take ids of existing tokens; pass "
            f"--first-new-token-id {vocab_size + 1} (the default: {vocab_size} stays free for [MASK])"
        )
    new = {token: start + i for i, token in enumerate(missing)}
    end = start + len(missing)  # the first id after the new ones
    if end > MAX_TOKEN_ID + 1:
        raise DataPrepareError(
            f"--first-new-token-id {start}: the new chat tokens' ids would pass {MAX_TOKEN_ID:,}, the largest "
            f"id an indexed dataset holds (int32); pass --first-new-token-id {vocab_size + 1} (the default)"
        )
    for flag, value in (("--mask-token-id", mask_id), ("--pad-token-id", pad_id)):
        if value is None:
            continue
        hit = next((t for t, i in new.items() if i == value), None)
        if hit is not None:
            raise DataPrepareError(
                f"{flag} {value}: the chat token {hit} would get id {value} too (new chat tokens "
                f"take ids {start}..{end - 1} from --first-new-token-id); pass --first-new-token-id "
                f"{max(value + 1, vocab_size)} to put them after it, or another {flag}"
            )
        hit = next((t for t, i in in_vocab.items() if i == value), None)
        if hit is not None and not (flag == "--pad-token-id" and value == eod_id):
            raise DataPrepareError(
                f"{flag} {value}: is the id of the template's token {hit} in the vocabulary; the "
                f"model could not tell them apart; pass another {flag}, e.g. {flag} {end}"
            )
        if flag == "--mask-token-id" and value == eod_id:
            raise DataPrepareError(
                f"--mask-token-id {value}: is the EOD id, which ends every SFT sample and is "
                f"supervised; pass another, e.g. --mask-token-id {vocab_size if start > vocab_size else end}"
            )
    return new, in_vocab
