"""Rules of the SFT stage (``stage.kind = "sft"``, backends/megatron/sft.py): its data against
the spec (the dataset record ``PREFIX.dlmspec.json`` that ``dlmspec data prepare --sft``
writes, and the response-mask dataset beside it: scope ``paths``, files on this machine), the
attention masks packing needs (scope ``runtime``), and pre-training settings SFT does not apply.
Starting from trained weights is ``finetune-from-scratch`` (:mod:`dlmspec.check.stage`)."""

from __future__ import annotations

import os
from typing import Any, Iterator

from dlmspec import objectives
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.data.record import RecordError, read_record
from dlmspec.resolve import sft_attention_mask, sft_section
from dlmspec.wording import count

#: The response-mask dataset beside ``PREFIX`` (backends/megatron/sft.py ``RESPONSE_SUFFIX``).
RESPONSE_SUFFIX = "_response"
#: Response ``.bin`` files up to this size are read for the longest prompt when the record does not
#: give it (``max_prompt_tokens``); larger ones are not scanned.
PROMPT_SCAN_BYTES = 256 * 2**20


def _prefixes(ctx: Context) -> list[tuple[str, str]]:
    """``(key, prefix)`` of the SFT data on this machine (both ``.bin`` and ``.idx`` present)."""
    d = ctx.spec.data
    if ctx.spec.stage.kind != "sft" or d.mock:
        return []
    return [(f"data.{key}", e.prefix) for key in ("train", "valid") for e in getattr(d, key)
            if os.path.isfile(e.prefix + ".bin") and os.path.isfile(e.prefix + ".idx")]


def _records(ctx: Context) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(key, prefix, record's "sft" section)`` of each SFT prefix with a readable record."""
    for key, prefix in _prefixes(ctx):
        try:
            record = read_record(prefix)
        except RecordError:
            continue  # the data rules report an unreadable record
        if record is not None and isinstance(record.get("sft"), dict):
            yield key, prefix, record["sft"]


def _is_int(value: Any) -> bool:
    """``value`` is a whole number as a record writes one (an ``int``, not a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _fix_or(fix: Fix | None, otherwise: str) -> str:
    """A hint: ``"<the fix>, or <otherwise>"`` when there is a fix, else ``otherwise`` alone."""
    return f"{fix.text()}, or {otherwise}" if fix else otherwise


def _seq_length_fix(ctx: Context, length: int) -> Fix | None:
    """``train.seq_length = length`` when the model's positions reach it (``model.max_position_embeddings``),
    else ``None``."""
    return Fix({"train.seq_length": length}) if length <= ctx.spec.model.max_position_embeddings else None


@rule(
    "sft-response-missing",
    "error",
    "backends/megatron/sft.py sft_data_problems (an SFT sample's loss mask is read from PREFIX_response)",
    "the SFT data has its response-mask dataset (PREFIX_response.bin/.idx) beside it",
    scope="paths",
    fix="prepare the data with `dlmspec data prepare --sft`, which writes PREFIX_response beside PREFIX",
)
def _response_missing(ctx: Context) -> Iterator[Finding]:
    for key, prefix in _prefixes(ctx):
        resp = prefix + RESPONSE_SUFFIX
        if not (os.path.isfile(resp + ".bin") and os.path.isfile(resp + ".idx")):
            yield Finding(key, f"{prefix!r} has no response masks ({resp}.bin/.idx): it is pre-training data, "
                          "or its SFT preparation did not finish; the SFT stage refuses it at start-up",
                          value=prefix)


@rule(
    "sft-template",
    "error",
    "the dataset record's sft.chat_template (dlmspec/data/record.py, written by `dlmspec data prepare --sft`)",
    "stage.sft.chat_template is the template the data was rendered with",
    scope="paths",
)
def _template(ctx: Context) -> Iterator[Finding]:
    want = sft_section(ctx.spec).chat_template
    for key, prefix, sft in _records(ctx):
        used = sft.get("chat_template")
        if isinstance(used, str) and used != want:
            fix = Fix({"stage.sft.chat_template": used})
            yield Finding("stage.sft.chat_template", f"{prefix!r} was rendered with the {used!r} template "
                          f"(its record), not {want!r}: the model would be tuned on one chat format and "
                          "prompted with another", f"{fix.text()}, or prepare the data again with "
                          f"--chat-template {want}", fix=fix)
            return


@rule(
    "sft-special-token-ids",
    "error",
    "megatron-core GPTModel embedding (ids below the padded vocabulary); the mdm objective's [MASK] "
    "(objective.mask_token_id) is an input no data token may share",
    "the chat special tokens the data gave new ids lie inside the padded vocabulary and are not [MASK]",
    scope="paths",
)
def _special_ids(ctx: Context) -> Iterator[Finding]:
    padded, mask = ctx.r.padded_vocab_size, ctx.r.mask_token_id
    for key, prefix, sft in _records(ctx):
        tokens = sft.get("special_tokens") or {}
        ids = {name: v for name, v in tokens.items() if _is_int(v)}
        if mask is not None and objectives.get(ctx.spec.objective.kind).diffusion:
            clash = sorted(name for name, v in ids.items() if v == mask)
            if clash:
                taken = set(ids.values()) | {ctx.r.eod.value}
                free = next((i for i in range(ctx.spec.model.vocab_size, padded) if i not in taken), None)
                fix = Fix({"objective.mask_token_id": free}) if free is not None else None
                yield Finding("objective.mask_token_id", f"{prefix!r} gives {', '.join(clash)} the id {mask}, "
                              "which is [MASK]: the model could not tell that token from a masked one",
                              (f"{fix.text()} (a padded slot no data token uses), or prepare the data again "
                               "with --mask-token-id") if fix else "prepare the data again with --mask-token-id",
                              value=mask, fix=fix)
        beyond = sorted((v, name) for name, v in ids.items() if v >= padded)
        if beyond:
            need = beyond[-1][0] + 1
            fix = Fix({"model.vocab_size": need})
            yield Finding("model.vocab_size", f"{prefix!r} gives {', '.join(n for _, n in beyond)} ids up to "
                          f"{need - 1}, outside the padded vocabulary ({padded} embeddings)",
                          f"{fix.text()} (a model started from checkpoint.init_from must have that many "
                          "embeddings), or prepare the data again with --first-new-token-id inside "
                          f"[{ctx.spec.model.vocab_size}, {padded})", fix=fix)


@rule(
    "sft-eod",
    "error",
    "backends/megatron/sft.py SftDataset (pads with DataConfig.eod_id; the record's sft.eod_id ends every "
    "conversation)",
    "the end-of-document id of the run is the one the SFT data was written with",
    scope="paths",
)
def _eod(ctx: Context) -> Iterator[Finding]:
    eod = ctx.r.eod
    if not eod.known:
        return
    for key, prefix, sft in _records(ctx):
        used = sft.get("eod_id")
        if _is_int(used) and used != eod.value:
            again = "prepare the data again with this spec's tokenizer"
            # a written eod_id may be the mistake; a tokenizer's own EOD means the data is another tokenizer's
            fix = Fix({"data.tokenizer.eod_id": used}) if ctx.is_set("data.tokenizer.eod_id") else None
            yield Finding("data.tokenizer.eod_id", f"{prefix!r} ends its conversations with id {used} (its record), "
                          f"the run pads with {eod.value} ({eod.source}): padding would not read as the end of a "
                          "response", _fix_or(fix, again), value=eod.value, fix=fix)
            return


@rule(
    "sft-max-length",
    "warning",
    "the dataset record's sft.max_length (`dlmspec data prepare --sft --seq-length`)",
    "the data was prepared for sequences no longer than train.seq_length",
    scope="paths",
)
def _max_length(ctx: Context) -> Iterator[Finding]:
    seq = ctx.spec.train.seq_length
    for key, prefix, sft in _records(ctx):
        length = sft.get("max_length")
        if _is_int(length) and length > seq:
            over = sft_section(ctx.spec).over_long
            fix = _seq_length_fix(ctx, length)
            yield Finding("train.seq_length", f"{prefix!r} was prepared for conversations of up to {length} tokens "
                          f"(its record); those longer than {seq} are {'skipped' if over == 'skip' else 'truncated'} "
                          "(stage.sft.over_long; the runtime counts them at start)",
                          _fix_or(fix, f"prepare the data again with --seq-length {seq}"), value=seq, fix=fix)
            return


def longest_prompt(prefix: str, record_sft: dict[str, Any] | None = None) -> tuple[int, int] | None:
    """``(longest prompt, conversations with no response token)`` of an SFT dataset: a
    conversation's prompt is its tokens before its first response token (the whole
    conversation when it has none).

    The record's ``max_prompt_tokens`` when it gives it; else read from ``PREFIX_response``
    (``.idx`` lengths, ``.bin`` flags; not when the ``.bin`` is over :data:`PROMPT_SCAN_BYTES`).

    Returns:
        The pair, or ``None`` when unknown (files missing, unreadable or too large).
    """
    import numpy as np  # here, not at the top: validate's start-up path stays free of numpy

    from dlmspec.data.index import check_index

    if record_sft and isinstance(record_sft.get("max_prompt_tokens"), int):
        return int(record_sft["max_prompt_tokens"]), 0
    resp = prefix + RESPONSE_SUFFIX
    try:
        if os.path.getsize(resp + ".bin") > PROMPT_SCAN_BYTES:
            return None
        # regular files only, every entry consistent (dlmspec.data.index); FileRefused is a ValueError
        lengths = check_index(resp).sequence_lengths.astype(np.int64)
        flags = np.fromfile(resp + ".bin", dtype=np.uint8)
    except (OSError, ValueError, IndexError):
        return None
    if len(lengths) == 0 or int(lengths.sum()) != len(flags):
        return None
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ones = np.flatnonzero(flags)
    first = np.full(len(lengths), -1, dtype=np.int64)
    if len(ones):
        doc = np.searchsorted(starts, ones, side="right") - 1
        docs, at = np.unique(doc, return_index=True)
        first[docs] = ones[at] - starts[docs]
    prompts = np.where(first >= 0, first, lengths)
    return int(prompts.max()), int((first < 0).sum())


@rule(
    "sft-prompt-too-long",
    "warning",
    "backends/megatron/sft.py SftDataset (a sample holds train.seq_length tokens from the conversation's start)",
    "every prompt of the SFT data leaves room for its response in train.seq_length",
    scope="paths",
)
def _prompt_too_long(ctx: Context) -> Iterator[Finding]:
    seq = ctx.spec.train.seq_length
    records = {prefix: sft for _, prefix, sft in _records(ctx)}
    for key, prefix in _prefixes(ctx):
        found = longest_prompt(prefix, records.get(prefix))
        if found is None or found[0] < seq:
            continue
        longest, none = found
        need = -(-(longest + 1) // 64) * 64
        fix = _seq_length_fix(ctx, need)
        yield Finding("train.seq_length", f"{prefix!r} has a prompt of {longest} tokens: a conversation whose prompt "
                      f"fills the {seq} positions of a sample has no response token in it (skipped as over-long, or "
                      "truncated to a sample with nothing to learn)"
                      + (f"; {count(none, 'conversation has')} no response token at all" if none else ""),
                      _fix_or(fix, f"drop such conversations when preparing the data (--seq-length {seq})"),
                      value=seq, fix=fix)
        return


@rule(
    "sft-attention-mask",
    "error",
    "backends/megatron/sft.py SftStage.setup (packed conversations and partly supervised diffusion padding pass "
    "an attention mask, which the Transformer Engine layers ignore and context parallelism cannot take)",
    "SFT batches with attention masks run on the local layers, without context parallelism",
    scope="runtime",
)
def _attention_mask(ctx: Context) -> Iterator[Finding]:
    why = sft_attention_mask(ctx.spec)
    if why is None:
        return
    packed = sft_section(ctx.spec).packed_sequence
    if ctx.r.transformer_impl == "transformer_engine":
        fix = Fix({"model.transformer_impl": "auto"})
        yield Finding("model.transformer_impl", f"{why} passes an attention mask (conversations must not attend each "
                      "other), which the Transformer Engine layers ignore: the runtime refuses it at start-up",
                      f"{fix.text()} (the local layers), or "
                      + ("stage.sft.packed_sequence = false" if packed else "remove stage.sft.pad_eos_tokens"),
                      fix=fix)
    if ctx.r.cp > 1:
        fix = Fix({"stage.sft.packed_sequence": False}) if packed else Fix(unset=("stage.sft.pad_eos_tokens",))
        yield Finding("parallel.context_parallel_size", f"{why} passes an attention mask, which context parallelism "
                      "cannot take: the runtime refuses it at start-up",
                      f"{fix.text()}, or set parallel.context_parallel_size = 1", fix=fix)


@rule(
    "sft-variable-length",
    "warning",
    "backends/megatron/sft.py SftStage.setup (SFT cuts nothing: a response's length is its own)",
    "objective.variable_length_prob is 0 for an SFT stage",
    fix="set objective.variable_length_prob = 0.0",
    fix_keys=Fix({"objective.variable_length_prob": 0.0}),
)
def _variable_length(ctx: Context) -> Iterator[Finding]:
    o = ctx.spec.objective
    if ctx.spec.stage.kind == "sft" and objectives.get(o.kind).variable_length_prob(o) > 0:
        yield Finding("objective.variable_length_prob", "has no effect in SFT: samples are conversations padded or "
                      "packed to train.seq_length, never cut to a random length")


@rule(
    "sft-pad-eos-packed",
    "warning",
    "backends/megatron/sft.py SftDataset (a pack's tail padding belongs to no conversation and is never supervised)",
    "stage.sft.pad_eos_tokens is unset when conversations are packed",
    fix="remove stage.sft.pad_eos_tokens",
    fix_keys=Fix(unset=("stage.sft.pad_eos_tokens",)),
)
def _pad_eos_packed(ctx: Context) -> Iterator[Finding]:
    sft = ctx.spec.stage.sft
    if ctx.spec.stage.kind == "sft" and sft is not None and sft.packed_sequence and sft.pad_eos_tokens is not None:
        yield Finding("stage.sft.pad_eos_tokens", "has no effect with packed_sequence = true: packing leaves no "
                      "padding after a conversation (each conversation's own EOD is supervised, the pack's tail "
                      "padding never)")


@rule(
    "sft-mock-data",
    "error",
    "backends/megatron/sft.py sft_start_checks (SFT samples are conversations with response masks; megatron's "
    "MockGPTDataset has neither)",
    "an SFT stage reads conversation data, not data.mock",
    fix="set data.mock = false and data.train to `dlmspec data prepare --sft` output",
    fix_keys=Fix({"data.mock": False}),
)
def _mock(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.stage.kind == "sft" and ctx.spec.data.mock:
        yield Finding("data.mock", "an SFT stage trains on conversations and their response masks, which mock data "
                      "does not have: the runtime refuses it at start-up")


#: Pre-training data settings the SFT stage does not read (it builds its own segments and positions).
_PRETRAINING_DATA = {
    "data.reset_attention_mask": "packed conversations never attend each other (stage.sft.packed_sequence)",
    "data.reset_position_ids": "each packed conversation's positions start at 0",
    "data.eod_mask_loss": "the response mask says which tokens carry loss, each conversation's final EOD included",
}


@rule(
    "sft-pretraining-data",
    "warning",
    "backends/megatron/sft.py SftDataset (segments, positions and loss masks of its own; data.train blends are "
    "concatenated)",
    "an SFT stage sets no pre-training data option it ignores (document masks, position resets, EOD loss masking, "
    "blend weights)",
)
def _pretraining_data(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.stage.kind != "sft":
        return
    d = ctx.spec.data
    for key, why in _PRETRAINING_DATA.items():
        if getattr(d, key.split(".")[1]):
            fix = Fix({key: False})
            yield Finding(key, f"has no effect in SFT: {why}", fix.text(), fix=fix)
    for split in ("train", "valid"):
        entries = getattr(d, split)
        if len({e.weight for e in entries}) > 1:
            fix = Fix({f"data.{split}": [e.prefix for e in entries]})
            yield Finding(f"data.{split}", "SFT takes every conversation of every prefix once per epoch: the weights "
                          "are not applied", f"{fix.text()} (weight 1 each), or prepare one dataset of the mix",
                          value=[e.weight for e in entries], fix=fix)
