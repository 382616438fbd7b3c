"""The tokenizer's values: the keys each type reads, the padded vocabulary, its facts read from
its files, and the end-of-document id. The tokenizer files are read here, once per
:func:`dlmspec.resolve.resolve` (:class:`~dlmspec.resolve.Resolved` keeps the results)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlmspec.names import FILE_FACT_TYPES, TOKENIZER_READS  # noqa: F401 - read here by their old name
from dlmspec.tokenizers import TokenizerFacts, hf_special_token, read_json, tokenizer_facts

if TYPE_CHECKING:
    from dlmspec.spec.models import Spec


#: The ``data.tokenizer`` keys that name files or a size, in the order a spec lists them.
TOKENIZER_KEYS = ("model", "vocab_file", "merge_file", "vocab_size")

#: Ids of Megatron's GPT2BPETokenizer (GPT-2's byte-level BPE: 50,256 merges + <|endoftext|>).
GPT2_VOCAB_SIZE = 50257


def padded_vocab_size(vocab_size: int, divisible_by: int, tensor_parallel: int) -> int:
    """Vocabulary padded to a multiple of ``divisible_by * tensor_parallel``, as Megatron-LM's
    ``_vocab_size_with_padding`` (megatron/training/tokenizer/tokenizer.py) does."""
    multiple = divisible_by * tensor_parallel
    return int(math.ceil(vocab_size / multiple) * multiple)


@dataclass(frozen=True)
class EodChoice:
    """The end-of-document id train.py passes to the runtime.

    Attributes:
        value: the id.
        source: where it comes from, for a comment in train.py.
        known: False when the id could not be told and ``value`` only fills the place.
    """

    value: int
    source: str
    known: bool = True


#: GPT-2's end-of-document token and its id in the GPT-2 BPE vocabulary (Radford et al. 2019,
#: encoder.json; ``dlmspec.tokenizers.GPT2_EOD_TOKEN``).
GPT2_EOD = ("<|endoftext|>", 50256)


def _hf_eos_id(folder: str) -> tuple[str, int] | None:
    """``(token, id)`` of the EOS token of a local Hugging Face tokenizer folder
    (:func:`dlmspec.tokenizers.hf_special_token` of ``eos_token``)."""
    return hf_special_token(folder, "eos_token")


def gpt2_eod_id(vocab_file: str | None) -> int:
    """GPT-2 BPE's ``<|endoftext|>`` id: from ``vocab_file`` when it is readable JSON, else 50256."""
    vocab = read_json(vocab_file) if vocab_file else None
    value = vocab.get(GPT2_EOD[0]) if isinstance(vocab, dict) else None
    return value if isinstance(value, int) else GPT2_EOD[1]


def spec_tokenizer_facts(spec: Spec) -> TokenizerFacts | None:
    """:func:`dlmspec.tokenizers.tokenizer_facts` of the spec's ``[data.tokenizer]``."""
    tok = spec.data.tokenizer
    return tokenizer_facts(tok.type, tokenizer_model=tok.model, vocab_file=tok.vocab_file,
                           vocab_size=tok.vocab_size)


def eod_choice(spec: Spec) -> EodChoice:
    """The end-of-document id of the spec's tokenizer: ``data.tokenizer.eod_id`` when set;
    else GPT2BPETokenizer's ``<|endoftext|>`` (from ``vocab_file`` when readable, else 50256);
    NullTokenizer's ``vocab_size`` (megatron-core ``NullTokenizer``: EOD = vocab_size); a local
    Hugging Face folder's EOS token (:func:`_hf_eos_id`). Otherwise (a hub name, SentencePiece,
    TikToken) it is unknown: ``model.vocab_size - 1`` fills the place, ``known`` is False, and
    the ``eod-id-unknown`` rule (:mod:`dlmspec.check.runtime`) reports it."""
    tok = spec.data.tokenizer
    if tok.eod_id is not None:
        return EodChoice(tok.eod_id, "data.tokenizer.eod_id")
    if tok.type == "GPT2BPETokenizer":
        return EodChoice(gpt2_eod_id(tok.vocab_file), f"{GPT2_EOD[0]} of the GPT-2 BPE vocabulary")
    if tok.type == "NullTokenizer":
        value = tok.vocab_size if tok.vocab_size is not None else spec.model.vocab_size - 1
        return EodChoice(value, "NullTokenizer: EOD = its vocab_size (megatron-core NullTokenizer)")
    if tok.type in ("HuggingFaceTokenizer", "MultimodalTokenizer") and tok.model and os.path.isdir(tok.model):
        found = _hf_eos_id(tok.model)
        if found is not None:
            return EodChoice(found[1], f"eos token {found[0]!r} of {tok.model}")
    facts = spec_tokenizer_facts(spec)
    if facts is not None and facts.eod is not None:
        return EodChoice(facts.eod, f"{tok.type}'s EOD, from {facts.source}")
    return EodChoice(spec.model.vocab_size - 1, "unknown at compile time; nothing in this run reads it", known=False)


def eod_used_by(spec: Spec) -> list[str]:
    """The spec keys that make the runtime read the end-of-document id (sorted)."""
    d = spec.data
    flags = {"data.mock": d.mock, "data.reset_attention_mask": d.reset_attention_mask,
             "data.reset_position_ids": d.reset_position_ids, "data.eod_mask_loss": d.eod_mask_loss}
    return sorted(k for k, on in flags.items() if on)
