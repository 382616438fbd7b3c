"""Rules of the tokenizer (its files, its ids against the embedding, the end-of-document id),
and what the rules of :mod:`dlmspec.check.mask` read from a tokenizer's files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator

from dlmspec.names import TOKENIZER_NEEDS  # noqa: F401 - the rule's table, read here by its old name
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.resolve import (
    FILE_FACT_TYPES,
    GPT2_VOCAB_SIZE,
    TOKENIZER_KEYS,
    TOKENIZER_READS,
    gpt2_eod_id,
)
from dlmspec.tokenizers import BERT_ADDED_TOKENS, BERT_SPECIAL_TOKENS, GPT2_EOD_TOKEN, read_bert_vocab, read_json


@rule(
    "tokenizer-files",
    "error",
    "Megatron-LM build_tokenizer (each tokenizer type reads its own files)",
    "the tokenizer type's files (or vocab_size) are set",
)
def _tokenizer_files(ctx: Context) -> Iterator[Finding]:
    tok = ctx.spec.data.tokenizer
    for key in TOKENIZER_NEEDS[tok.type]:
        if getattr(tok, key) is None:
            hint = {
                "model": "set data.tokenizer.model to a tokenizer.json, a folder or a .model file",
                "vocab_file": "set data.tokenizer.vocab_file (GPT-2 vocab.json, BERT vocab.txt)",
                "merge_file": "set data.tokenizer.merge_file (GPT-2 merges.txt)",
                "vocab_size": f"set data.tokenizer.vocab_size, e.g. vocab_size = {ctx.spec.model.vocab_size - 1}",
            }[key]
            # the files are the user's to name; NullTokenizer's size follows from the model's
            fix = Fix({"data.tokenizer.vocab_size": ctx.spec.model.vocab_size - 1}) if key == "vocab_size" else None
            yield Finding(f"data.tokenizer.{key}", f"{tok.type} needs {key}", hint, fix=fix)


@rule(
    "tokenizer-keys-ignored",
    "warning",
    "Megatron-LM build_tokenizer (dlmspec.tokenizers.build_tokenizer): each tokenizer type reads its own keys "
    "(NullTokenizer vocab_size, GPT2BPETokenizer vocab_file and merge_file, the others model); the embedding's "
    "size is model.vocab_size",
    "data.tokenizer sets only keys its type reads",
)
def _tokenizer_ignored(ctx: Context) -> Iterator[Finding]:
    """Keys written in the spec itself or by ``--set``; a key a parent file (``extends``) wrote is
    left alone: the child cannot remove it (TOML has no null), so the warning would have no fix."""
    tok = ctx.spec.data.tokenizer
    parents = set(list(ctx.loaded.files)[1:]) if ctx.loaded is not None else set()
    for key in TOKENIZER_KEYS:
        value = getattr(tok, key)
        if value is None or key in TOKENIZER_READS[tok.type] or (isinstance(value, str) and not value.strip()):
            continue  # read, unset, or blank (blank-value)
        origin = ctx.loaded.origins.get(f"data.tokenizer.{key}", (None, None))[0] if ctx.loaded is not None else None
        if origin in parents:
            continue
        fix = Fix(unset=(f"data.tokenizer.{key}",))
        what = (" (the size of a NullTokenizer; the embedding's is model.vocab_size)" if key == "vocab_size"
                else "")
        yield Finding(f"data.tokenizer.{key}", f"has no effect: {tok.type} does not read it{what}",
                      f"{fix.text()} (left from another tokenizer type?)", fix=fix)


@rule(
    "tokenizer-vocab",
    "error",
    "megatron.core.tokenizers.text.libraries.null_tokenizer.NullTokenizer (vocab_size + 1 ids, eod last); "
    "GPT-2 BPE has 50257 ids; Megatron-LM _BertWordPieceTokenizer (vocab.txt + [BOS], [EOS]), "
    "SentencePiece (its pieces), megatron-core TikTokenizer (vocab_size)",
    "every tokenizer id is a row of model.vocab_size",
)
def _tokenizer_vocab(ctx: Context) -> Iterator[Finding]:
    tok, vocab = ctx.spec.data.tokenizer, ctx.spec.model.vocab_size
    if tok.type == "NullTokenizer" and tok.vocab_size is not None and tok.vocab_size + 1 > vocab:
        fix = Fix({"model.vocab_size": tok.vocab_size + 1})
        yield Finding(
            "model.vocab_size",
            f"NullTokenizer(vocab_size = {tok.vocab_size}) emits ids up to {tok.vocab_size} (its eod), "
            "beyond the embedding",
            f"use model.vocab_size = {tok.vocab_size + 1} (or more), or data.tokenizer.vocab_size <= {vocab - 1}",
            fix=fix,
        )
    elif tok.type == "GPT2BPETokenizer" and (ctx.r.tokenizer_size() or 0) > vocab:
        size = ctx.r.tokenizer_size()
        yield Finding("model.vocab_size", f"GPT-2's BPE emits {size} ids, more than the embedding has",
                      f"use model.vocab_size = {size}", fix=Fix({"model.vocab_size": size}))
    elif tok.type in FILE_FACT_TYPES:
        facts = ctx.r.tokenizer_facts
        if facts is not None and facts.size is not None and (ctx.r.tokenizer_size() or 0) > vocab:
            yield Finding("model.vocab_size",
                          f"{tok.type} has {facts.size} ids ({facts.source}), more than the embedding's {vocab}: "
                          "its largest ids would index past the embedding",
                          f"use model.vocab_size = {facts.size}", fix=Fix({"model.vocab_size": facts.size}))


@rule(
    "eod-id-tokenizer",
    "error",
    "megatron-core GPT2BPETokenizer (eod = <|endoftext|> of vocab.json) and NullTokenizer (eod = vocab_size); "
    "Megatron-LM _BertWordPieceTokenizer (eod = [EOS]), _GPTSentencePieceTokenizer and _Llama2Tokenizer (eod = the "
    "model's eos), megatron-core TikTokenizer (eod = </s> = 2); dlmspec data prepare --append-eod appends the tokenizer's own eod",
    "data.tokenizer.eod_id, where set, is the tokenizer's own end-of-document id",
)
def _eod_tokenizer(ctx: Context) -> Iterator[Finding]:
    """GPT-2's BPE and megatron-core's NullTokenizer fix their end-of-document id (the data holds
    it: ``data prepare --append-eod`` appends it); an ``eod_id`` left from another tokenizer (the
    reported case: gpt-neox's 0 on GPT-2's BPE, where 0 is ``!``) would make the runtime take an
    ordinary token for the document end. Other types keep theirs in files not read here."""
    tok = ctx.spec.data.tokenizer
    if tok.eod_id is None:
        return
    if tok.type == "GPT2BPETokenizer":
        own, what = gpt2_eod_id(tok.vocab_file), f"GPT-2's BPE ({GPT2_EOD_TOKEN})"
    elif tok.type == "NullTokenizer" and tok.vocab_size is not None:
        own, what = tok.vocab_size, f"NullTokenizer(vocab_size = {tok.vocab_size})"
    elif tok.type in FILE_FACT_TYPES:
        facts = ctx.r.tokenizer_facts
        if facts is None or facts.eod is None:
            return
        own, what = facts.eod, f"{tok.type} ({facts.source})"
    else:
        return
    if tok.eod_id != own:
        yield Finding("data.tokenizer.eod_id",
                      f"is not the end-of-document id of {what}, which is {own}: the data holds {own} at each "
                      f"document's end, and the run would take token {tok.eod_id} for it",
                      f"set data.tokenizer.eod_id = {own}", fix=Fix({"data.tokenizer.eod_id": own}))


@rule(
    "eod-id-range",
    "error",
    "dlmspec.backends.megatron.data.DatasetTokenizer (eod_id in [0, model.vocab_size), checked when train.py starts): "
    "the data holds the end-of-document id as a token of the vocabulary",
    "data.tokenizer.eod_id is a token of the vocabulary (below model.vocab_size)",
)
def _eod_range(ctx: Context) -> Iterator[Finding]:
    tok, vocab = ctx.spec.data.tokenizer, ctx.spec.model.vocab_size
    if tok.eod_id is None or tok.eod_id < vocab:
        return
    if tok.type == "NullTokenizer" and tok.vocab_size is not None and tok.vocab_size < vocab:
        example = tok.vocab_size
    elif tok.type == "GPT2BPETokenizer" and vocab >= GPT2_VOCAB_SIZE:
        example = GPT2_VOCAB_SIZE - 1
    else:
        example = vocab - 1
    if example == ctx.r.mask_token_id:
        example -= 1
    yield Finding(
        "data.tokenizer.eod_id",
        f"outside the vocabulary: model.vocab_size = {vocab} has ids 0..{vocab - 1}, so no document of this "
        "vocabulary can end with it, and train.py stops at start-up",
        f"use the id `dlmspec data prepare --append-eod` wrote (the tokenizer's end-of-document token), "
        f"e.g. eod_id = {example}, or raise model.vocab_size",
        fix=Fix({"data.tokenizer.eod_id": example}),
    )


def tokenizer_eod(ctx: Context) -> int | None:
    """The end-of-document id the data holds, when the spec says it: ``data.tokenizer.eod_id``,
    NullTokenizer's ``vocab_size`` (megatron-core NullTokenizer), GPT-2 BPE's ``<|endoftext|>``
    (50256), the EOD the files of a :data:`FILE_FACT_TYPES` tokenizer hold. Read from the resolved
    spec (``ctx.r.eod``, :func:`dlmspec.resolve.eod_choice`, which read the files once); ``None``
    for the other tokenizers (a Hugging Face one's EOS is the runtime's to check) and where the
    id is unknown."""
    tok, eod = ctx.spec.data.tokenizer, ctx.r.eod
    if eod is None or not eod.known:
        return None
    if tok.eod_id is not None or tok.type == "GPT2BPETokenizer" or tok.type in FILE_FACT_TYPES:
        return eod.value
    if tok.type == "NullTokenizer" and tok.vocab_size is not None:
        return eod.value
    return None


def tokenizer_pad(ctx: Context) -> tuple[str, int, str] | None:
    """``(token, id, file)`` of the tokenizer's pad token, when this machine can tell: a local
    Hugging Face tokenizer folder (``data.tokenizer.model``) whose ``tokenizer_config.json``
    (else ``special_tokens_map.json``) names a ``pad_token``, with its id from
    ``tokenizer_config.json``'s ``added_tokens_decoder`` (where Hugging Face lists special tokens)
    or else ``tokenizer.json`` (``added_tokens``, then ``model.vocab``). None otherwise: the spec
    has no pad key, GPT-2 BPE, megatron-core's NullTokenizer and TikTokenizer have no pad token.
    BERT WordPiece types: ``[PAD]`` of ``vocab.txt``; SentencePiece types: the model's pad piece
    (:func:`dlmspec.resolve.spec_tokenizer_facts`)."""
    tok = ctx.spec.data.tokenizer
    if tok.type in FILE_FACT_TYPES:  # BERT's [PAD], a SentencePiece model's pad piece
        facts = ctx.r.tokenizer_facts
        if facts is None or facts.pad is None:
            return None
        name = "[PAD]" if tok.type.startswith("BertWordPiece") else "pad piece"
        return name, facts.pad, facts.source
    if tok.type not in ("HuggingFaceTokenizer", "MultimodalTokenizer") or not tok.model:
        return None
    try:
        if not os.path.isdir(tok.model):
            return None
    except (OSError, ValueError):
        return None
    config = read_json(os.path.join(tok.model, "tokenizer_config.json"))
    config = config if isinstance(config, dict) else {}
    pad = config.get("pad_token")
    source = "tokenizer_config.json"
    if pad is None:
        special = read_json(os.path.join(tok.model, "special_tokens_map.json"))
        pad = special.get("pad_token") if isinstance(special, dict) else None
        source = "special_tokens_map.json"
    if isinstance(pad, dict):
        pad = pad.get("content")
    if not isinstance(pad, str):
        return None
    decoder = config.get("added_tokens_decoder")
    for key, entry in (decoder.items() if isinstance(decoder, dict) else ()):
        if isinstance(entry, dict) and entry.get("content") == pad and str(key).isdigit():
            return pad, int(key), os.path.join(tok.model, source)
    data = read_json(os.path.join(tok.model, "tokenizer.json"))  # megabytes: only when needed
    if not isinstance(data, dict):
        return None
    for entry in data.get("added_tokens") or []:
        if isinstance(entry, dict) and entry.get("content") == pad and isinstance(entry.get("id"), int):
            return pad, entry["id"], os.path.join(tok.model, source)
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data.get("model"), dict) else None
    if isinstance(vocab, dict) and isinstance(vocab.get(pad), int):
        return pad, vocab[pad], os.path.join(tok.model, source)
    return None


@dataclass(frozen=True)
class TokenizerIds:
    """What a tokenizer's files say about its ids: ``size`` (one more than its largest id),
    ``special`` ids -> token, ``added`` non-special added ids -> token, ``token(id)`` the text of
    an ordinary id (None when unknown) and the file read."""

    file: str
    size: int
    special: dict[int, str]
    added: dict[int, str]
    token: Callable[[int], str | None]


def tokenizer_ids(ctx: Context) -> TokenizerIds | None:
    """The ids of the spec's tokenizer, when this machine can tell: a local Hugging Face
    ``tokenizer.json`` (``data.tokenizer.model``, a folder or the file: ``added_tokens`` with
    their ``special`` flag, ``model.vocab`` a dict or Unigram's list), or GPT-2 BPE's
    ``vocab.json`` (``<|endoftext|>`` its one special token; GPT-2's own layout when the file
    cannot be read), or a BERT ``vocab.txt`` (:func:`_bert_ids`). None otherwise (hub ids,
    SentencePiece, TikToken, NullTokenizer)."""
    tok = ctx.spec.data.tokenizer
    if tok.type.startswith("BertWordPiece"):
        return _bert_ids(tok.vocab_file)
    if tok.type == "GPT2BPETokenizer":
        vocab = read_json(tok.vocab_file) if tok.vocab_file else None
        if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()) or not vocab:
            names = {GPT2_VOCAB_SIZE - 1: GPT2_EOD_TOKEN}
            return TokenizerIds("GPT-2 BPE", GPT2_VOCAB_SIZE, names, {}, lambda i: None)
        by_id = {v: k for k, v in vocab.items()}
        special = {v: k for k, v in vocab.items() if k == GPT2_EOD_TOKEN}
        return TokenizerIds(str(tok.vocab_file), max(by_id) + 1, special, {}, by_id.get)
    if tok.type != "HuggingFaceTokenizer" or not tok.model:
        return None
    try:
        path = os.path.join(tok.model, "tokenizer.json") if os.path.isdir(tok.model) else tok.model
    except (OSError, ValueError):
        return None
    if not path.endswith(".json"):
        return None
    data = read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    special: dict[int, str] = {}
    added: dict[int, str] = {}
    for entry in data.get("added_tokens") or [] if isinstance(data, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and isinstance(entry.get("content"), str):
            (special if entry.get("special") else added)[entry["id"]] = entry["content"]
    if isinstance(vocab, dict):
        ids = [v for v in vocab.values() if isinstance(v, int)]

        def token(i: int) -> str | None:
            return next((k for k, v in vocab.items() if v == i), None)
    elif isinstance(vocab, list):  # Unigram: [token, score] per id
        ids = [len(vocab) - 1] if vocab else []

        def token(i: int) -> str | None:
            entry = vocab[i] if 0 <= i < len(vocab) else None
            return entry[0] if isinstance(entry, list) and entry and isinstance(entry[0], str) else None
    else:
        return None
    size = max([*ids, *special, *added], default=-1) + 1
    return TokenizerIds(path, size, special, added, token)


def _bert_ids(vocab_file: str | None) -> TokenizerIds | None:
    """The ids of a BERT ``vocab.txt`` as Megatron-LM's ``_BertWordPieceTokenizer`` has them:
    special ``[PAD] [UNK] [CLS] [SEP] [MASK]``, ``[unused*]`` (BERT's reserved slots) and the
    appended ``[BOS] [EOS]``. None when the file cannot be read."""
    if not vocab_file:
        return None
    try:
        if not os.path.isfile(vocab_file):
            return None
        vocab = read_bert_vocab(vocab_file)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    names = set(BERT_SPECIAL_TOKENS) | set(BERT_ADDED_TOKENS)
    special = {i: t for t, i in vocab.items() if t in names or (t.startswith("[unused") and t.endswith("]"))}
    by_id = {i: t for t, i in vocab.items()}
    return TokenizerIds(str(vocab_file), max(by_id) + 1, special, {}, by_id.get)
