"""Rules of masks: masked diffusion's [MASK] token (a row of the padded embedding, distinct from the
end-of-document and pad ids, a special or reserved id of the tokenizer, and, for a preset whose
[MASK] is a token of its own published tokenizer, that token of the spec's tokenizer), and the
attention masks a run needs against the attention backend that runs them (the table of
:mod:`dlmspec.attention`: rule ``attention-backend-masks``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from dlmspec import objectives
from dlmspec.attention import BACKENDS, MASK_KINDS, backends_running, choose_backend, refused_kinds
from dlmspec.check.registry import Context, Finding, Fix, rule
from dlmspec.check.tokenizer import tokenizer_eod, tokenizer_ids, tokenizer_pad
from dlmspec.resolve import padded_vocab_size, sft_attention_mask
from dlmspec.spec.presets import MASK_TOKEN_IDS


@dataclass(frozen=True)
class PublishedMask:
    """The [MASK] token a preset's publication defines in its own tokenizer (the id is
    :data:`~dlmspec.spec.presets.MASK_TOKEN_IDS`'s): its text, which tokenizer has it (with the
    source), the folder the bundled spec reads it from, and how to fetch that folder."""

    token: str
    tokenizer: str
    folder: str
    fetch: str


#: Presets whose [MASK] is a special token of a tokenizer the publication ships (docs/recipes.md,
#: "MegaDLMs' tokenizer"): the spec's tokenizer must have it (rule mask-token-published).
PUBLISHED_MASKS: dict[str, PublishedMask] = {
    "megadlms-1.7b": PublishedMask(
        token="<|mask_token|>",
        tokenizer="MegaDLMs' own GPT-NeoX variant (JinjieNi/MegaDLMs@bdf7545 "
        "megatron/training/tokenizer/gptneox_tokenizer/tokenizer_config.json:206-207: 50,289 ids)",
        folder=".models/MegaDLMs/megatron/training/tokenizer/gptneox_tokenizer",
        fetch="git clone --filter=blob:none --sparse https://github.com/JinjieNi/MegaDLMs .models/MegaDLMs; "
        "git -C .models/MegaDLMs sparse-checkout set megatron/training/tokenizer/gptneox_tokenizer "
        "(docs/recipes.md)",
    ),
}

#: Hub tokenizers whose size is known without their files (one more than the largest id):
#: EleutherAI/gpt-neox-20b's tokenizer.json ends at id 50276 (docs/recipes.md, "MegaDLMs' tokenizer").
HUB_TOKENIZER_SIZES: dict[str, int] = {"EleutherAI/gpt-neox-20b": 50277}

#: Types that emit ids 0..vocab_size with EOD = vocab_size (megatron-core NullTokenizer; Megatron-LM
#: _NullMultimodalTokenizer is the same for text).
NULL_TYPES = ("NullTokenizer", "NullMultimodalTokenizer")


def free_mask_ids(ctx: Context, *taken: int | None) -> list[int]:
    """Ids [MASK] may take that no tokenizer of the spec emits: rows of the padded embedding at or
    past ``model.vocab_size`` (and past every id a NullTokenizer emits), other than the
    end-of-document id, the spec's [MASK] id and ``taken`` (a pad id), ascending."""
    r, m, tok = ctx.r, ctx.spec.model, ctx.spec.data.tokenizer
    start = m.vocab_size
    if tok.type in NULL_TYPES and tok.vocab_size is not None:
        start = max(start, tok.vocab_size + 1)
    refused = {tokenizer_eod(ctx), r.mask_token_id, *taken}
    return [i for i in range(start, min(r.padded_vocab_size, start + 8)) if i not in refused]


def mask_fix(ctx: Context, *taken: int | None) -> Fix:
    """The fix of a [MASK] id a rule refuses: the first of :func:`free_mask_ids`, else a new row
    (``model.vocab_size`` one larger, [MASK] the row it adds)."""
    free = free_mask_ids(ctx, *taken)
    if free:
        return Fix({"objective.mask_token_id": free[0]})
    m, tok = ctx.spec.model, ctx.spec.data.tokenizer
    row = m.vocab_size
    if tok.type in NULL_TYPES and tok.vocab_size is not None:
        row = max(row, tok.vocab_size + 1)
    while row in (tokenizer_eod(ctx), *taken):
        row += 1
    return Fix({"model.vocab_size": row + 1, "objective.mask_token_id": row})


@rule(
    "mask-token-range",
    "error",
    "LLaDA (Nie et al. 2025, eq. 3): [MASK] is a token the model embeds; the embedding has "
    "padded_vocab_size rows (Megatron-LM _vocab_size_with_padding)",
    "the [MASK] id is a row of the padded embedding",
)
def _mask_range(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    if r.mask_token_id is None or r.mask_token_id < r.padded_vocab_size:
        return
    if ctx.spec.objective.mask_token_id is not None:
        fix = mask_fix(ctx)
        hint = (f"use an id below {r.padded_vocab_size}: {fix.text()} (a padded slot), or the tokenizer's "
                "reserved mask id")
    else:
        grown = padded_vocab_size(m.vocab_size + 1, m.make_vocab_size_divisible_by, r.tp)
        fix = Fix({"model.vocab_size": m.vocab_size + 1})
        hint = (
            f"vocab_size {m.vocab_size} is already a multiple of the padding, so no free slot is left "
            f"for [MASK]: set model.vocab_size = {m.vocab_size + 1} (pads to {grown}), or "
            "objective.mask_token_id = the tokenizer's reserved mask id"
        )
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {r.mask_token_id} is outside the embedding (padded vocabulary: {r.padded_vocab_size} rows)",
        hint,
        value=r.mask_token_id,
        fix=fix,
    )


@rule(
    "mask-token-distinct",
    "error",
    "LLaDA (Nie et al. 2025, sec. 2.1): [MASK] is a reserved token that never occurs in the data; "
    "megatron-core NullTokenizer emits ids 0..vocab_size (EOD = vocab_size)",
    "the [MASK] id is neither the end-of-document id nor an id the NullTokenizer emits",
)
def _mask_distinct(ctx: Context) -> Iterator[Finding]:
    r, m, tok = ctx.r, ctx.spec.model, ctx.spec.data.tokenizer
    mask = r.mask_token_id
    if mask is None or mask >= r.padded_vocab_size:
        return  # mask-token-range
    fix = mask_fix(ctx)
    grows = "model.vocab_size" in fix.set
    free = (f"{fix.text()} (a new row of the embedding)" if grows else
            f"{fix.text()} (a padded slot no tokenizer id reaches)")
    eod = tokenizer_eod(ctx)
    if mask == eod:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is also the end-of-document id, so every EOD in the data would read as a masked position",
            f"use another id: {free}",
            value=mask,
            fix=fix,
        )
    elif tok.type in NULL_TYPES and tok.vocab_size is not None and mask < tok.vocab_size:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is an ordinary token of {tok.type}(vocab_size = {tok.vocab_size}), which emits "
            f"ids 0..{tok.vocab_size}: the data would contain it",
            f"use an id above {tok.vocab_size}: {free}; or data.tokenizer.vocab_size < {mask}",
            value=mask,
            fix=fix,
        )


@rule(
    "mask-token-not-pad",
    "error",
    "LLaDA (Nie et al. 2025, sec. 2.1): [MASK] is a reserved token; padding written with the "
    "tokenizer's pad id (SFT batches, megatron-core GPTDataset's pad_token_id) would read as [MASK]",
    "the [MASK] id is not the pad id of the tokenizer (a local Hugging Face tokenizer's pad_token)",
    scope="paths",
)
def _mask_not_pad(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    mask = r.mask_token_id
    eod = tokenizer_eod(ctx)
    if mask is None or mask >= r.padded_vocab_size or mask == eod:
        return  # mask-token-range, mask-token-distinct
    pad = tokenizer_pad(ctx)
    if pad is None or pad[1] != mask:
        return
    token, _, source = pad
    fix = mask_fix(ctx, pad[1])
    hint = (f"{fix.text()} (a new row of the embedding)" if "model.vocab_size" in fix.set else
            f"{fix.text()} (a padded slot of the embedding)")
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is also the tokenizer's pad id ({token!r}, {source}), so a padded position "
        "would be indistinguishable from a masked one",
        f"use another id: {hint}",
        value=mask,
        fix=fix,
    )


@rule(
    "mask-token-ignored",
    "warning",
    "dlmspec.resolve (mask_token_id is used only by the mdm objective)",
    "objective.mask_token_id is only given for mdm",
)
def _mask_ignored(ctx: Context) -> Iterator[Finding]:
    kind = ctx.spec.objective.kind
    if not objectives.get(kind).diffusion and ctx.spec.objective.mask_token_id is not None:
        yield Finding("objective.mask_token_id", f"has no effect with the {kind!r} objective",
                      "remove mask_token_id, or set objective.kind = 'mdm'",
                      fix=Fix(unset=("objective.mask_token_id",)))


@rule(
    "mask-token-ordinary",
    "warning",
    "LLaDA (Nie et al. 2025, sec. 2.1) and MDLM: [MASK] is a reserved token (LLaDA's <|mdm_mask|> is a special "
    "token of its tokenizer); an id that text tokenizes to makes that text read as masked positions",
    "the [MASK] id is a special or reserved id of the tokenizer (its files read: tokenizer.json, GPT-2 vocab.json)",
    scope="paths",
)
def _mask_ordinary(ctx: Context) -> Iterator[Finding]:
    r, m = ctx.r, ctx.spec.model
    mask = r.mask_token_id
    eod = tokenizer_eod(ctx)
    if mask is None or mask >= r.padded_vocab_size or mask == eod:
        return  # mask-token-range, mask-token-distinct
    if mask >= m.vocab_size:
        return  # a padded row: no tokenizer that fits the model emits it (tokenizer-vocab)
    ids = tokenizer_ids(ctx)
    if ids is None or mask >= ids.size or mask in ids.special:
        return
    if mask in ids.added:
        what = f"{ids.added[mask]!r}, an added token that is not special"
    else:
        text = ids.token(mask)
        what = (f"{text!r}, an ordinary token" if text is not None else "an ordinary token")
    pad = tokenizer_pad(ctx)
    taken = {eod, pad[1] if pad else None}
    named = [i for i, t in sorted(ids.special.items()) if "mask" in t.lower() and i < r.padded_vocab_size
             and i not in taken]
    free = [i for i in range(ids.size, min(r.padded_vocab_size, ids.size + 3)) if i not in taken]
    if named:
        fix = Fix({"objective.mask_token_id": named[0]})
        why = f"the tokenizer's {ids.special[named[0]]!r}"
    elif free:
        fix = Fix({"objective.mask_token_id": free[0]})
        why = "a row of the embedding beyond the tokenizer's ids"
    else:
        grown = max(m.vocab_size, ids.size)
        fix = Fix({"model.vocab_size": grown + 1, "objective.mask_token_id": grown})
        why = "a new row for [MASK]"
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is {what} of the tokenizer ({ids.file}): text containing it would read as masked "
        "positions (published diffusion LMs use a special or reserved id)",
        f"use a special or reserved id: {fix.text().removeprefix('set ')} ({why})",
        value=mask,
        fix=fix,
    )


@rule(
    "mask-token-published",
    "warning",
    "MegaDLMs (JinjieNi/MegaDLMs@bdf7545 examples/dlm_training/dlm_pretrain_1.7b.sh:52,111: --mask-token 50277 "
    "is <|mask_token|> of the tokenizer folder the script passes as --tokenizer-model)",
    "a preset's published [MASK] id is that mask token of the spec's tokenizer (its files, or a hub tokenizer of "
    "known size)",
    scope="paths",
)
def _mask_published(ctx: Context) -> Iterator[Finding]:
    """Silent where the tokenizer cannot be read here (a hub name of unknown size, a missing
    folder), for a [MASK] id that is not the preset's published one (the user's own padded row),
    and for an ordinary token (mask-token-ordinary)."""
    r, m, tok = ctx.r, ctx.spec.model, ctx.spec.data.tokenizer
    published = PUBLISHED_MASKS.get(m.preset or "")
    mask = r.mask_token_id
    if published is None or mask is None or mask != MASK_TOKEN_IDS.get(m.preset or "") or mask >= r.padded_vocab_size:
        return  # not a published [MASK]; mask-token-range
    ids = tokenizer_ids(ctx)
    if ids is not None:
        if mask in ids.special and ids.special[mask] == published.token:
            return
        if mask < ids.size and mask not in ids.special:
            return  # an ordinary or added token: mask-token-ordinary
        what = (f"{ids.special[mask]!r}, a special token that is not {published.token}" if mask in ids.special
                else f"not a token of the tokenizer ({ids.file}: {ids.size:,} ids, 0 .. {ids.size - 1})")
    elif tok.type == "HuggingFaceTokenizer" and tok.model in HUB_TOKENIZER_SIZES and not _local(tok.model):
        size = HUB_TOKENIZER_SIZES[tok.model]
        if mask < size:
            return
        what = f"not a token of the tokenizer ({tok.model} on the Hugging Face hub: {size:,} ids, 0 .. {size - 1})"
    else:
        return
    fix = Fix({"data.tokenizer.model": published.folder})
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is {what}: {m.preset}'s [MASK] is {published.token} of {published.tokenizer}; data "
        "prepared with this tokenizer never holds it, and generation or a Hugging Face export has no mask token",
        f"{fix.text()} (the publication's tokenizer, fetched with: {published.fetch}), and prepare the data with it",
        value=mask,
        fix=fix,
    )


def _local(path: str) -> bool:
    """Whether ``path`` names something on this machine (a folder shadows a hub name)."""
    try:
        return os.path.exists(path)
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# Attention masks and the backend that runs them (dlmspec.attention's table).


def attention_mask_needs(ctx: Context) -> dict[str, str]:
    """The attention mask kinds (:data:`dlmspec.attention.MASK_KINDS`) the run applies, each
    with the ``"key = value"`` that asks for it: the layer's pattern
    (``objective.attention_mask``), key padding for variable-length MDM sequences cut one by one,
    document masks (``data.reset_attention_mask``, SFT packing or partly supervised SFT padding)."""
    o, r = ctx.spec.objective, ctx.r
    needs = {r.attention_mask: f"objective.attention_mask = {r.attention_mask!r}"}
    if objectives.get(o.kind).masked_variable_length_prob(o) > 0:
        needs["key_padding"] = f"objective.variable_length_prob = {o.variable_length_prob!r}"
    if objectives.get(o.kind).block_diffusion:
        needs["mask_mod"] = f"objective.kind = {o.kind!r}"
    if ctx.spec.data.reset_attention_mask:
        needs["document"] = "data.reset_attention_mask = true"
    sft = sft_attention_mask(ctx.spec)
    if sft is not None:
        needs.setdefault("document", sft)
    return {k: needs[k] for k in MASK_KINDS if k in needs}


def attention_backend_of(ctx: Context, kinds: list[str]) -> str:
    """The backend that runs the attention: ``te`` on the Transformer Engine path, else the local
    path's choice of ``model.attention_backend`` (:func:`dlmspec.attention.choose_backend`)."""
    if ctx.r.transformer_impl == "transformer_engine":
        return "te"
    return choose_backend(ctx.spec.model.attention_backend, kinds, context_parallel=ctx.r.cp > 1,
                          dropout=ctx.spec.model.attention_dropout > 0)


#: How a spec chooses each backend.
_BACKEND_SETTING = {
    "sdpa": {"model.attention_backend": "sdpa"},
    "flex": {"model.attention_backend": "flex"},
    "te": {"model.transformer_impl": "transformer_engine"},
}


@rule(
    "attention-backend-masks",
    "error",
    "dlmspec.attention.BACKENDS (backends/megatron/attention.py SDPACoreAttention and FlexCoreAttention declare "
    "their mask kinds from it; FlexCoreAttention refuses context parallelism and attention dropout, "
    "layers.build_layer_spec refuses a local attention_backend on Transformer Engine layers)",
    "the attention backend model.attention_backend names runs every attention mask of the run, on its layers",
    scope="runtime",
)
def _attention_backend_masks(ctx: Context) -> Iterator[Finding]:
    """Reports only a backend the spec names (``model.attention_backend``); the default paths'
    refusals (Transformer Engine with block-causal or document masks, context parallelism with
    masks) have their own rules (runtime-block-causal-te, runtime-document-mask-te,
    cp-attention-mask, sft-attention-mask), which read the same table."""
    named = ctx.spec.model.attention_backend
    if named is None:
        return
    needs = attention_mask_needs(ctx)
    kinds = list(needs)
    cp, dropout = ctx.r.cp > 1, ctx.spec.model.attention_dropout > 0
    if named in ("sdpa", "flex") and ctx.r.transformer_impl == "transformer_engine":
        fix = Fix({"model.transformer_impl": "local"})
        yield Finding("model.attention_backend",
                      f"attention_backend = {named!r} is a core attention of the local layers, and the layers are "
                      "Transformer Engine's (which run TE's own attention)",
                      f"{fix.text()}, or remove model.attention_backend", fix=fix)
        return
    backend = attention_backend_of(ctx, kinds)
    refused = refused_kinds(backend, kinds, context_parallel=cp, dropout=dropout)
    if not refused:
        return
    running = [b for b in backends_running(kinds, context_parallel=cp, dropout=dropout)]
    why = []
    for k in refused:
        if k == "dropout":
            why.append(f"attention dropout (model.attention_dropout = {ctx.spec.model.attention_dropout!r})")
        else:
            why.append(f"{k} masks ({needs[k]})" + (" under context parallelism" if cp else ""))
    key = "model.attention_dropout" if refused == ["dropout"] else "model.attention_backend"
    if running:
        fix = Fix(_BACKEND_SETTING[running[0]])
        hint = (f"{fix.text()} (runs them: {', '.join(running)}; docs/attention.md)"
                + (", or parallel.context_parallel_size = 1" if cp else ""))
    elif cp:
        fix = Fix({"parallel.context_parallel_size": 1})
        hint = f"{fix.text()}: no attention backend runs {', '.join(refused)} under context parallelism"
    else:
        fix = None
        hint = "no attention backend runs them together (docs/attention.md)"
    yield Finding(key, f"the {BACKENDS[backend].name} attention backend (attention_backend = {named!r}) does not "
                  f"run {' and '.join(why)}", hint,
                  value=getattr(ctx.spec.model, key.split('.')[1]), fix=fix)
