"""Rules of masked diffusion's [MASK] token: a row of the padded embedding, distinct from the
end-of-document and pad ids, and a special or reserved id of the tokenizer."""

from __future__ import annotations

from typing import Iterator

from dlmspec.check.registry import Context, Finding, rule
from dlmspec.check.tokenizer import tokenizer_eod, tokenizer_ids, tokenizer_pad
from dlmspec.resolve import padded_vocab_size


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
        first_free = f" ({m.vocab_size} is the first padded slot)" if m.vocab_size < r.padded_vocab_size else ""
        hint = f"use an id below {r.padded_vocab_size}{first_free}, or the tokenizer's reserved mask id"
    else:
        grown = padded_vocab_size(m.vocab_size + 1, m.make_vocab_size_divisible_by, r.tp)
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
    free = f"e.g. {m.vocab_size} (the first padded slot)" if m.vocab_size < r.padded_vocab_size else \
        "a reserved token the tokenizer never emits"
    eod = tokenizer_eod(ctx)
    if mask == eod:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is also the end-of-document id, so every EOD in the data would read as a masked position",
            f"use another objective.mask_token_id, {free}",
            value=mask,
        )
    elif tok.type == "NullTokenizer" and tok.vocab_size is not None and mask < tok.vocab_size:
        yield Finding(
            "objective.mask_token_id",
            f"[MASK] id {mask} is an ordinary token of NullTokenizer(vocab_size = {tok.vocab_size}), which emits "
            f"ids 0..{tok.vocab_size}: the data would contain it",
            f"use objective.mask_token_id > {tok.vocab_size}, or data.tokenizer.vocab_size < {mask}",
            value=mask,
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
    free = [i for i in range(m.vocab_size, min(r.padded_vocab_size, m.vocab_size + 3)) if i not in (mask, eod)]
    hint = (f"e.g. {free[0]} (a padded slot of the embedding)" if free else
            "a reserved token the tokenizer never emits")
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is also the tokenizer's pad id ({token!r}, {source}), so a padded position "
        "would be indistinguishable from a masked one",
        f"use another objective.mask_token_id, {hint}",
        value=mask,
    )


@rule(
    "mask-token-ignored",
    "warning",
    "dlmspec.resolve (mask_token_id is used only by the mdm objective)",
    "objective.mask_token_id is only given for mdm",
)
def _mask_ignored(ctx: Context) -> Iterator[Finding]:
    if ctx.spec.objective.kind == "ar" and ctx.spec.objective.mask_token_id is not None:
        yield Finding("objective.mask_token_id", "has no effect with the 'ar' objective",
                      "remove mask_token_id, or set objective.kind = 'mdm'")


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
        fix = f"objective.mask_token_id = {named[0]} (the tokenizer's {ids.special[named[0]]!r})"
    elif free:
        fix = f"objective.mask_token_id = {free[0]} (a row of the embedding beyond the tokenizer's ids)"
    else:
        grown = max(m.vocab_size, ids.size)
        fix = f"model.vocab_size = {grown + 1} and objective.mask_token_id = {grown} (a new row for [MASK])"
    yield Finding(
        "objective.mask_token_id",
        f"[MASK] id {mask} is {what} of the tokenizer ({ids.file}): text containing it would read as masked "
        "positions (published diffusion LMs use a special or reserved id)",
        f"use a special or reserved id: {fix}",
        value=mask,
    )
